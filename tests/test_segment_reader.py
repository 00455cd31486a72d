"""SegmentReader, LogSegment's read side: reads through the index, corruption reported with file and
position, timestamps, lazily opened indexes of a deleted segment."""
import os

import pytest

from kstore.errors import CorruptRecordError, SegmentGoneError

from segment_helpers import append, make_segment, read_all


def test_read_through_index_after_many_appends(tmp_path):
    seg = make_segment(tmp_path, 1000, {"index.interval.bytes": 100})
    for i in range(500):
        append(seg, 1000 + 2 * i, [b"x" * (i % 50), b"y"])
    assert seg.offset_index.entries > 10
    for probe in range(1000, 2000, 7):
        got = read_all(seg, probe)
        assert got[0].offset == probe
    seg.close()


def test_corrupt_batch_error_names_file_and_position(tmp_path):
    seg = make_segment(tmp_path)
    append(seg, 0, [b"first"])
    pos = seg.size
    append(seg, 1, [b"second"])
    seg.close()
    path = tmp_path / "00000000000000000000.log"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    seg = make_segment(tmp_path, exists=True)
    with pytest.raises(CorruptRecordError) as ei:
        read_all(seg)
    assert ei.value.path == str(path) and ei.value.position == pos
    assert "00000000000000000000.log" in str(ei.value) and f"position {pos}" in str(ei.value)
    seg.close()


def test_largest_timestamp_falls_back_to_mtime(tmp_path):
    seg = make_segment(tmp_path)
    append(seg, 0, [b"a"], magic=0)      # v0 has no timestamps
    seg.flush()
    mtime = os.stat(seg.log_path).st_mtime_ns // 1_000_000
    assert seg.largest_timestamp() == mtime
    seg.close()


def test_index_of_a_deleted_segment_is_segment_gone(tmp_path):
    """A reader that reaches a segment retention just deleted, before its lazy indexes were
    ever opened, got a new empty index created at the retired name (a stray sparse
    `.index.deleted` left in the partition), or a raw FileNotFoundError when the directory had
    moved (topic deletion). Now SegmentGoneError, and no file is created."""
    seg = make_segment(tmp_path)
    append(seg, 0, [b"a", b"b"])
    seg.close()
    seg = make_segment(tmp_path, exists=True)       # indexes not opened yet (lazy)
    seg.change_file_suffixes("", ".deleted")
    seg.delete()
    assert os.listdir(tmp_path) == []
    for name in ("offset_index", "time_index"):
        with pytest.raises(SegmentGoneError, match=r"00000000000000000000\.log\.deleted was deleted or closed"):
            getattr(seg, name)
    assert os.listdir(tmp_path) == []
