"""BatchBuilder's one-pass encoder for plain records (_record_input.plain_run): the bytes must be
exactly those of the general path (lists take it) at every varint-size boundary and for
timestamps of every digit count, and input that changes under the encoder is refused."""
import struct

import pytest

from kstore import _core
from batch_helpers import CRC32C, NOW, build


def _same_bytes(recs, **kw):
    fast = build(recs, **kw).getvalue()
    assert build([list(r) for r in recs], **kw).getvalue() == fast     # lists: general path
    return fast


@pytest.mark.parametrize("ts", [0, 1, (1 << 30) - 1, 1 << 30, (1 << 60) - 1, 1 << 60, (1 << 62) - 1])
def test_timestamps_of_every_digit_count(ts):
    recs = [(b"k", b"v", ts), (b"k", b"v", 0), (b"k", b"v", ts)]
    fast = _same_bytes(recs)
    assert struct.unpack(">qq", fast[27:43]) == (ts, ts)                # base and max timestamp
    assert [r.timestamp for r in _core.decode_batches(fast)] == [ts, 0, ts]


def test_varint_size_boundaries_of_lengths_deltas_and_offsets():
    sizes = [None, 0, 1, 63, 64, 65, 8191, 8192, 8193]
    recs = [(None if k is None else b"k" * k, None if v is None else b"v" * v, NOW + (i * 977) % 70000)
            for i, (k, v) in enumerate((k, v) for k in sizes for v in sizes)]
    recs += [(b"key%06d" % i, b"x" * (i % 200), NOW - i) for i in range(9000)]   # offset deltas > 2^13
    fast = _same_bytes(recs)
    out = _core.decode_batches(fast)
    assert [(r.key, r.value, r.timestamp) for r in out] == recs
    assert CRC32C(fast[21:]) == struct.unpack(">I", fast[17:21])[0]


def test_records_that_change_size_during_the_append_are_refused():
    recs = [(b"k", b"v", NOW)] * 10

    class Shrinking:
        def __iter__(self):
            del recs[5:]
            return iter(())
    recs[2] = (b"k", b"v", NOW, Shrinking())        # the general path iterates the headers
    with pytest.raises(RuntimeError, match="changed size"):
        build(recs)
    assert len(recs) == 5
    b = build(recs[:2])                              # the builder is still usable
    assert [r.offset for r in _core.decode_batches(b.getvalue())] == [0, 1]
