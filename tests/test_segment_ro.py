"""ReadOnlySegment through a read-only Log: validation before mapping, lazily per segment, and
corruption inside a rolled segment."""
import os

import pytest

from kstore import _core
from kstore.errors import CorruptRecordError



@pytest.mark.parametrize("value_size", [2000, 70_000, 300_000])
def test_read_only_open_sees_every_batch_past_the_first_pread_window(open_log, log_dir, value_size):
    # regression: the first read-only scan stopped at the first batch crossing its 64 KiB
    # pread window, so a fresh reader saw only a prefix of a big segment
    lg = open_log({"segment.bytes": 16 << 20})
    for i in range(40):
        lg.append([(b"k%d" % i, bytes([i]) * (value_size + 13 * i))])
    lg.flush()
    ro = open_log(path=log_dir, read_only=True)
    assert ro.log_end_offset == 40
    assert ro.segments[0].size == lg.segments[0].size
    assert [r.offset for c in ro.iter_chunks() for r in c] == list(range(40))


def test_read_only_open_validates_only_the_segments_it_reads(open_log, log_dir):
    # opening costs the same whatever the partition's size: the last segment is validated at
    # open, the others when a read first reaches them
    lg = open_log({"segment.bytes": 2000})
    for i in range(100):
        lg.append([(b"k%d" % i, b"v" * 100)])
    lg.flush()
    bases = [s.base_offset for s in lg.segments]
    assert len(bases) >= 6
    ro = open_log(path=log_dir, read_only=True)
    assert ro.log_end_offset == 100
    assert [s.ro_scanned for s in ro.segments] == [False] * (len(bases) - 1) + [True]
    mid = bases[3]
    recs = ro.read(mid + 1, max_records=2)
    assert [r.offset for r in recs] == [mid + 1, mid + 2]
    assert [i for i, s in enumerate(ro.segments) if s.ro_scanned] == [3, len(bases) - 1]
    assert [r.offset for c in ro.iter_chunks() for r in c] == list(range(100))
    assert all(s.ro_scanned for s in ro.segments)


def test_read_only_reader_raises_at_a_torn_batch_inside_a_rolled_segment(open_log, log_dir):
    # issue 12 defect 11. An unrecovered store (power loss) can leave a torn batch and zeros
    # before the end of a rolled segment; the writer's recovery cuts there and deletes every
    # later segment. The reader validating it late serves what comes before, raises
    # CorruptRecordError naming the file and position for a read that reaches it (it used to
    # skip to the next segment silently), and still reads later segments at their own offsets.
    lg = open_log({"segment.bytes": 2000})
    for i in range(60):
        lg.append([(b"k%d" % i, b"v" * 100)])
    s1 = lg.segments[1]
    last_batch_pos = _core.batch_headers(s1.mapping(), 0, s1.size)[-1][0]
    lg.close()
    seg1 = sorted(f for f in os.listdir(log_dir) if f.endswith(".log"))[1]
    base1 = int(seg1[:20])
    with open(os.path.join(log_dir, seg1), "r+b") as f:
        data = f.read()
        f.truncate(len(data) - 40)                          # the last batch is torn
        f.seek(0, 2)
        f.write(bytes(512))                                 # and preallocated zeros follow
    ro = open_log(path=log_dir, read_only=True)
    assert not ro.segments[1].ro_scanned
    nxt = ro.segments[2].base_offset
    assert base1 < nxt - 1
    assert [r.offset for r in ro.read(base1, max_records=nxt - 1 - base1)] == list(range(base1, nxt - 1))
    assert ro.segments[1].ro_scanned and ro.segments[1].size == last_batch_pos
    for start in (base1, nxt - 1):
        with pytest.raises(CorruptRecordError) as e:
            ro.read(start, max_bytes=1 << 20)
        assert e.value.path == os.path.join(log_dir, seg1)
        assert e.value.position == last_batch_pos
        assert str(e.value) == (f"CRC mismatch before the end of a rolled segment "
                                f"({os.path.join(log_dir, seg1)}, position {last_batch_pos})")
    assert [r.offset for r in ro.read(nxt, max_records=3)] == [nxt, nxt + 1, nxt + 2]
    with pytest.raises(CorruptRecordError):
        list(ro.iter_chunks())
