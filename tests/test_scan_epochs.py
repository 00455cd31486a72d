"""recover_scan(epochs=True): the leader epochs Kafka's LogSegment.recover assigns (v2 batches
whose partitionLeaderEpoch is >= 0 and above every earlier one's), found in the same nogil pass
that validates the batches: only batches the scan found valid count, whatever stops it, on one
thread or two."""
import random
import struct

import pytest

from kstore import _core

from batch_helpers import NOW, build


def _stamp(data: bytearray, epochs) -> None:
    """Write epochs[i] into the i-th v2 batch's partitionLeaderEpoch (outside the CRC)."""
    pos = i = 0
    while pos + 17 <= len(data) and i < len(epochs):
        size = struct.unpack_from(">i", data, pos + 8)[0] + 12
        if data[pos + 16] == 2:
            struct.pack_into(">i", data, pos + 12, epochs[i])
        i += 1
        pos += size


def _reference(data, valid):
    """The (epoch, base offset) starts of the v2 batches in data[:valid], parsed in Python."""
    out, top, pos = [], -1, 0
    while pos < valid:
        base, size, epoch = struct.unpack_from(">qii", data, pos)
        if data[pos + 16] == 2 and epoch > top:
            out.append((epoch, base))
            top = epoch
        pos += size + 12
    return out


def _scan(data, threads=1, **kw):
    m = _core.Mapping.from_bytes(bytes(data))
    try:
        return _core.recover_scan(m, len(data), 0, 4096, 1 << 17, (1 << 17) - 1, threads=threads, **kw)
    finally:
        m.close()


def _log(n_batches, per=1, magic_of=lambda i: 2, value=b"v" * 100):
    out, off = bytearray(), 0
    for i in range(n_batches):
        b = build([(b"k%015d" % j, value, NOW + i) for j in range(per)], magic=magic_of(i), base=off)
        out += b.getvalue()
        off = b.last_offset + 1
    return out


def test_epochs_of_many_batches_mixed_magic_and_skipped_epochs():
    """300 batches (v1 ones among them: their bytes 12..15 are a CRC, never an epoch), epochs
    -1, lower, equal and higher at random, over 8 starts (the C array grows several times):
    exactly the Python reference; epochs=False (the default) returns none."""
    rng = random.Random(20)
    data = _log(300, magic_of=lambda i: 1 if i % 17 == 5 else 2)
    epochs = [rng.choice([-1, -5, rng.randrange(0, 3 * i + 1), 3 * i]) for i in range(300)]
    _stamp(data, epochs)
    want = _reference(data, len(data))
    assert len(want) > 40
    res = _scan(data, epochs=True)
    assert res.valid_bytes == len(data) and res.epochs == res["epochs"] == want
    assert _scan(data).epochs == [] and _scan(data, epochs=False).epochs == []
    # the rest of the result does not depend on the flag
    plain = _scan(data)
    assert {k: v for k, v in plain.items() if k not in ("epochs", "offset_entries", "time_entries")} == \
        {k: v for k, v in res.items() if k not in ("epochs", "offset_entries", "time_entries")}
    assert plain.offset_entries.tobytes() == res.offset_entries.tobytes()


@pytest.mark.parametrize("damage", ["none", "crc_first_half", "crc_second_half", "crc_last",
                                    "torn_tail", "offset_order_last"])
@pytest.mark.parametrize("threads", [1, 2])
def test_epochs_stop_where_the_valid_batches_stop(damage, threads):
    """~9.7 MB (the two-thread CRC pass runs): an invalid batch and everything after it assign
    nothing, even when it carries a higher epoch; on two threads the same list as on one."""
    data = _log(200, per=400)
    assert len(data) >= 8 << 20
    _stamp(data, [i // 10 for i in range(200)])
    batch = len(data) // 200
    last = len(data) - batch
    if damage == "crc_first_half":
        _stamp(data, [i // 10 if i != 10 * 4 + 3 else 1000 for i in range(200)])
        data[batch * 43 + 100] ^= 1
    elif damage == "crc_second_half":
        data[batch * 150 + 100] ^= 1
    elif damage == "crc_last":
        struct.pack_into(">i", data, last + 12, 999)
        data[-10] ^= 0x40
    elif damage == "torn_tail":
        tail = _log(1, per=400)
        struct.pack_into(">q", tail, 0, 80_000)
        struct.pack_into(">i", tail, 12, 777)
        data += tail[:5000]
    elif damage == "offset_order_last":
        struct.pack_into(">q", data, last, 5)             # base offset: outside the CRC
        struct.pack_into(">i", data, last + 12, 999)
    res = _scan(data, threads, epochs=True)
    valid = {"none": len(data), "crc_first_half": batch * 43, "crc_second_half": batch * 150,
             "crc_last": last, "torn_tail": len(data) - 5000, "offset_order_last": last}[damage]
    assert res.valid_bytes == valid
    want = _reference(data, valid)
    assert res.epochs == want
    assert max(e for e, _ in want) < 777
    assert _scan(data, 1, epochs=True).epochs == want
