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


