"""LogSegment: Kafka's LogSegmentTest cases (facts §10 items 1-5) and the mapped write path."""
import os
import random

import pytest

from kstore import _core
from kstore.clock import MockTime
from kstore.errors import LogSegmentOffsetOverflowError
from segment_helpers import NOW, append, make_segment, read_all

def test_append_read_and_files(tmp_path):
    seg = make_segment(tmp_path, 40)
    append(seg, 40, [b"hello", b"there"])
    append(seg, 42, [b"little", b"bee"])
    assert [r.value for r in read_all(seg, 41)] == [b"there", b"little", b"bee"]
    assert [r.offset for r in read_all(seg, 43)] == [43]
    assert seg.read_next_offset() == 44
    seg.close()
    names = sorted(os.listdir(tmp_path))
    assert names == ["00000000000000000040.index", "00000000000000000040.log",
                     "00000000000000000040.timeindex"]
    assert os.path.getsize(tmp_path / "00000000000000000040.log") == seg.size


def test_recovery_with_corrupt_message(tmp_path):
    """Item 1: garbage from inside a random batch to EOF; exactly the earlier batches survive."""
    rnd = random.Random(11)
    for trial in range(10):
        d = tmp_path / str(trial)
        d.mkdir()
        seg = make_segment(d)
        positions = []
        for i in range(100):
            positions.append(seg.size)
            append(seg, i, [b"value-%d" % i])
        seg.close()
        victim = rnd.randrange(100)
        cut = positions[victim] + rnd.randrange(0, 20)
        path = d / "00000000000000000000.log"
        data = bytearray(path.read_bytes())
        garbage = os.urandom(len(data) - cut)
        data[cut:] = garbage
        path.write_bytes(bytes(data))
        seg = make_segment(d, exists=True)
        res = seg.recover()
        assert seg.size == positions[victim]
        assert res.truncated_bytes == len(data) - positions[victim]
        assert [r.offset for r in read_all(seg)] == list(range(victim))
        assert seg.read_next_offset() == victim
        seg.close()


@pytest.mark.parametrize("which", ["index", "timeindex"])
def test_recovery_fixes_corrupt_index(tmp_path, which):
    """Item 2: garbage indexes are rebuilt by recover()."""
    seg = make_segment(tmp_path)
    for i in range(100):
        append(seg, i, [(None, b"v%d" % i, NOW + i)])
    seg.close()
    path = tmp_path / f"00000000000000000000.{which}"
    size = path.stat().st_size
    path.write_bytes(os.urandom(size))
    seg = make_segment(tmp_path, exists=True)
    seg.recover()
    for i in range(100):
        assert read_all(seg, i)[0].offset == i
        assert seg.find_offset_by_timestamp(NOW + i, 0) == (i, NOW + i)
    seg.offset_index.sanity_check()
    seg.time_index.sanity_check()
    seg.close()


@pytest.mark.parametrize("base,largest", [(0, 1 << 31), (0, -(1 << 31)), (1, 0), (100, 10),
                                          (1 << 31, 0), (1 << 31, 1 << 32)])
def test_append_offset_overflow(tmp_path, base, largest):
    """Item 3: a largest offset outside [base, base + 2^31-1] raises."""
    seg = make_segment(tmp_path, base)
    seg.make_active()
    b = _core.BatchBuilder()
    b.build([(None, b"x")], 2, max(largest, 0), NOW, False, -(1 << 62), 1 << 62, False, 0)
    with pytest.raises(LogSegmentOffsetOverflowError):
        seg.append(b, largest, NOW, largest)
    assert seg.size == 0
    seg.close()


def test_create_with_init_file_size_clean_shutdown(tmp_path):
    """Item 4: a preallocated 512 MiB .log is trimmed on close; reopen gives the same size."""
    seg = make_segment(tmp_path, 40, {"preallocate": True, "segment.bytes": 512 << 20})
    seg.make_active()
    path = tmp_path / "00000000000000000040.log"
    assert path.stat().st_size == 512 << 20
    append(seg, 40, [b"hello", b"there"])
    size = seg.size
    seg.close()
    assert path.stat().st_size == size
    seg = make_segment(tmp_path, 40, {"preallocate": True, "segment.bytes": 512 << 20}, exists=True)
    assert seg.size == size
    assert [r.value for r in read_all(seg, 40)] == [b"hello", b"there"]
    seg.close()


def test_truncate_even_if_offset_points_to_a_gap(tmp_path):
    """Item 5: batches at 40 and 43; truncate_to(41) drops the batch at 43."""
    seg = make_segment(tmp_path, 40)
    append(seg, 40, [b"a"])
    append(seg, 43, [b"b"])
    seg.truncate_to(41)
    assert seg.read_next_offset() == 41
    assert [r.offset for r in read_all(seg, 40)] == [40]
    seg.close()


def test_truncate_to_resets_roll_state_and_replaces_the_file(tmp_path):
    # issue 12 defects 6 and 9: the cut is a new file renamed over the segment, never zeros
    # written into (or a shrink of) the file that readers have mapped
    t = MockTime(NOW)
    seg = make_segment(tmp_path, 0, time=t)
    append(seg, 0, [b"a" * 100])
    end = seg.size
    append(seg, 1, [b"b" * 100])
    full = seg.size
    path = str(tmp_path / "00000000000000000000.log")
    before = os.stat(path).st_ino
    held = memoryview(seg.mapping())             # a reader's view of the old file
    old_bytes = bytes(held[:full])
    t.advance(500)
    assert seg.truncate_to(1) == full - end
    assert seg.size == end
    assert os.stat(path).st_ino != before and os.path.getsize(path) == end
    assert bytes(held[:full]) == old_bytes       # the reader's pages are intact, batch 1 included
    held.release()
    assert open(path, "rb").read() == old_bytes[:end]
    assert sorted(os.listdir(tmp_path)) == ["00000000000000000000.index", "00000000000000000000.log",
                                            "00000000000000000000.timeindex"]
    assert [r.value for r in read_all(seg)] == [b"a" * 100]
    append(seg, 1, [b"c" * 100])
    assert [r.value for r in read_all(seg)] == [b"a" * 100, b"c" * 100]
    seg.truncate_to(0)
    assert seg.size == 0 and seg.created == NOW + 500
    seg.close()
    assert os.path.getsize(path) == 0


def test_index_entries_follow_kafkas_interval_rule(tmp_path):
    """An entry (largest offset of the append, its start position) is added when more than
    index.interval.bytes were written since the last entry; the first append never gets one."""
    seg = make_segment(tmp_path, 0, {"index.interval.bytes": 100})
    sizes, positions = [], []
    for i in range(12):
        positions.append(seg.size)
        b = append(seg, 2 * i, [(None, b"x" * 40, NOW + i), (None, b"y", NOW + i)])
        sizes.append(b.size)
    expect, since = [], 0
    for i, (pos, size) in enumerate(zip(positions, sizes)):
        if since > 100:
            expect.append((2 * i + 1, pos))
            since = 0
        since += size
    assert [seg.offset_index.entry(n) for n in range(seg.offset_index.entries)] == expect
    assert [seg.time_index.entry(n) for n in range(seg.time_index.entries)] == \
        [(NOW + (off - 1) // 2, off) for off, _ in expect]
    seg.close()


def test_recovered_indexes_are_big_endian_on_disk(tmp_path):
    """The rebuilt .timeindex (with its final entry) has Kafka's byte layout."""
    import struct
    seg = make_segment(tmp_path, 0, {"index.interval.bytes": 50})
    for i in range(20):
        append(seg, i, [(None, b"x" * 40, NOW + i)])
    seg.close()
    seg = make_segment(tmp_path, 0, {"index.interval.bytes": 50}, exists=True)
    seg.recover()
    seg.close()
    raw = (tmp_path / "00000000000000000000.timeindex").read_bytes()
    entries = [struct.unpack(">qi", raw[i:i + 12]) for i in range(0, len(raw), 12)]
    assert entries[-1] == (NOW + 19, 19)
    assert all(NOW <= ts <= NOW + 19 and 0 <= rel <= 19 for ts, rel in entries)
    raw = (tmp_path / "00000000000000000000.index").read_bytes()
    offs = [struct.unpack(">ii", raw[i:i + 8]) for i in range(0, len(raw), 8)]
    assert offs and all(0 < rel < 20 and pos > 0 for rel, pos in offs)




# -- recover_scan's parallel CRC pass (issue 14) -------------------------------------------------
def _batches_bytes(n_batches, per=400, base=0):
    """n_batches v2 batches of `per` 100-byte records back to back (~48 KB each)."""
    out = bytearray()
    off = base
    for i in range(n_batches):
        b = _core.BatchBuilder()
        b.build([(b"k%015d" % j, bytes(100), NOW + i) for j in range(per)], 2, off, NOW, False,
                -(1 << 62), 1 << 62, False, 0)
        out += b.getvalue()
        off = b.last_offset + 1
    return out


def _scan(data, threads, **kw):
    m = _core.Mapping.from_bytes(bytes(data))
    try:
        return _core.recover_scan(m, len(data), 0, 4096, 1 << 17, (1 << 17) - 1, threads=threads, **kw)
    finally:
        m.close()


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        if k in ("offset_entries", "time_entries"):
            assert a[k].tobytes() == b[k].tobytes(), k
        else:
            assert a[k] == b[k], k


@pytest.mark.parametrize("damage", ["none", "zero_tail", "torn_tail", "crc_first_half",
                                    "crc_second_half", "crc_last", "garbage_tail",
                                    "offset_order_last", "upper_bound"])
def test_parallel_crc_scan_returns_the_one_thread_result(damage):
    """threads=2 (two halves hashed at once after a pass without CRCs) gives exactly the
    one-thread scan's result, every field and both indexes' bytes, whatever stops the scan."""
    data = _batches_bytes(200)                # ~9.7 MB: above PARALLEL_CRC_BYTES
    assert len(data) >= 8 << 20            # recover_scan hashes on two threads from 8 MiB
    batch = len(data) // 200
    kw = {}
    if damage == "zero_tail":
        data += bytes(3 << 20)
    elif damage == "torn_tail":
        data += _batches_bytes(1, base=80_000)[:5000]
    elif damage == "crc_first_half":
        data[batch * 10 + 100] ^= 1
    elif damage == "crc_second_half":
        data[batch * 150 + 100] ^= 1
    elif damage == "crc_last":
        data[-10] ^= 0x40
    elif damage == "garbage_tail":
        data += os.urandom(100_000)
    elif damage == "offset_order_last":
        data += _batches_bytes(1, base=5)          # offsets go back: stops there
    elif damage == "upper_bound":
        kw["upper_bound"] = 400 * 190
    one, two = _scan(data, 1, **kw), _scan(data, 2, **kw)
    _same(one, two)
    if damage in ("none", "zero_tail", "torn_tail", "garbage_tail", "offset_order_last"):
        assert one.valid_bytes == 200 * batch and one.next_offset == 80_000
    if damage == "crc_second_half":
        assert one.status == "crc" and one.valid_bytes == 150 * batch
    if damage == "crc_last":
        assert one.status == "crc" and one.valid_bytes == 199 * batch
    if damage == "upper_bound":
        assert one.status == "past_next" and one.valid_bytes == 190 * batch
