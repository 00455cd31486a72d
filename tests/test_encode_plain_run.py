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


def test_every_key_and_value_length_up_to_the_inline_copy_limit():
    # ks_copy moves 1-3 bytes one by one, 4-127 bytes in overlapping fixed-size pieces, and
    # calls memcpy past 128: every length, with distinct bytes so a misplaced piece shows
    recs = [(bytes(range(k)), bytes((7 * j + k) & 0xFF for j in range(v)), NOW + k)
            for k in (0, 1, 3, 4, 7, 8, 15, 16, 17, 31, 32, 33, 64, 65, 128, 129)
            for v in range(0, 140)]
    fast = _same_bytes(recs)
    assert [(r.key, r.value, r.timestamp) for r in _core.decode_batches(fast)] == recs
    assert CRC32C(fast[21:]) == struct.unpack(">I", fast[17:21])[0]


def test_record_lengths_of_one_two_and_three_byte_varints():
    # a record's length is written as two bytes, then moved when its varint has another size:
    # bodies under 64 bytes (1), 64..8191 (2) and 8192 on (3), side by side in one batch
    recs = [(b"k", b"v" * n, NOW) for n in (0, 50, 54, 55, 56, 57, 100, 8180, 8185, 8186, 8187, 9000, 3)]
    fast = _same_bytes(recs)
    out = _core.decode_batches(fast)
    assert [r.value for r in out] == [r[1] for r in recs]
    assert [r.offset for r in out] == list(range(len(recs)))
