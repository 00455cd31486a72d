"""ReadOnlySegment through a read-only Log: validation before mapping, lazily per segment, and
corruption inside a rolled segment."""
import collections
import os
import struct
import time

import pytest

from kstore import _core
from kstore.errors import CorruptRecordError
from kstore.fileio import FileOps
from kstore.ro_refresh import DirWatch

NOW = 1_700_000_000_000



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


class CountingOps(FileOps):
    """The reader's I/O, counted: bytes pread per file name suffix, listings, opens."""

    def __init__(self):
        self.reset()

    def reset(self):
        self.read = collections.Counter()
        self.listings = 0
        self.opens = 0
        self.closes = 0
        self.fstats = 0
        self.stat_paths = 0

    def pread(self, fd, n, offset):
        data = super().pread(fd, n, offset)
        self.read[os.readlink(f"/proc/self/fd/{fd}").rsplit(".", 1)[1]] += len(data)
        return data

    def listdir(self, path):
        self.listings += 1
        return super().listdir(path)

    def open(self, path, flags, mode=0o644):
        self.opens += 1
        return super().open(path, flags, mode)

    def close(self, fd):
        self.closes += 1
        return super().close(fd)

    def stat(self, fd):
        self.fstats += 1
        return super().stat(fd)

    def stat_path(self, path, follow_symlinks=False):
        self.stat_paths += 1
        return super().stat_path(path, follow_symlinks)


def _settle():
    """Wait until the partition directory's last change is older than DirWatch's slack, so the
    next refresh's listing is trusted (see kstore/ro_refresh.py)."""
    time.sleep(DirWatch.SLACK_NS / 1e9 * 2)


def _index_bytes(seg):
    return [idx.entries_array().tobytes() for idx in (seg.offset_index, seg.time_index)]


def _records(lg, start=0):
    return [(r.offset, r.key, r.value, r.timestamp) for c in lg.iter_chunks(start) for r in c]


def test_many_small_refreshes_equal_a_fresh_open_and_the_writers_index(open_log, log_dir):
    # one batch at a time, of every size (single records, a 1000-record batch of ~127 KB read
    # whole by its header's length, batches that cross the 4 KiB probe), index entries made
    # on most appends (index.interval.bytes 100) so that every refresh crosses some: the view
    # after each refresh holds exactly the writer's records, offsets and index entries (bytes)
    # (the view reads the index files once its data passes the last entry copied by its
    # config's index.interval.bytes: with the writer's config, as a read-only LogManager has,
    # it holds every entry after every refresh)
    cfg = {"segment.bytes": 64 << 20, "index.interval.bytes": 100}
    lg = open_log(cfg)
    lg.append([(b"k0", b"v0")])
    ro = open_log(cfg, path=log_dir, read_only=True)
    sizes = [1, 3, 1000, 1, 50, 7, 1000, 1, 1, 200] * 3
    o = 1
    for i, n in enumerate(sizes):
        lg.append([(b"%016d" % (o + j), b"v" * (100 + i), NOW + o + j) for j in range(n)])
        o += n
        ro.refresh()
        assert ro.log_end_offset == lg.log_end_offset == o
        w, r = lg.segments[-1], ro.segments[-1]
        assert r.size == w.size
        assert _index_bytes(r) == _index_bytes(w), i
        if i % 9 == 0:
            fresh = open_log(cfg, path=log_dir, read_only=True)
            assert _index_bytes(fresh.segments[-1]) == _index_bytes(r)
            assert _records(ro) == _records(fresh) == _records(lg)
    assert lg.segments[-1].offset_index.entries > 20
    assert [(x.offset, x.value) for x in ro.read(o - 1)] == [(o - 1, b"v" * (100 + len(sizes) - 1))]
    lo = o - 1000 - 1 - 1 - 200
    assert [x.offset for x in ro.read(lo, max_records=5)] == list(range(lo, lo + 5))


class CallCountingOps(CountingOps):
    """CountingOps, with the number of pread calls per file name suffix."""

    def reset(self):
        super().reset()
        self.calls = collections.Counter()

    def pread(self, fd, n, offset):
        self.calls[os.readlink(f"/proc/self/fd/{fd}").rsplit(".", 1)[1]] += 1
        return super().pread(fd, n, offset)


def test_validating_a_rolled_segment_of_small_batches_reads_it_in_growing_windows(open_log, log_dir):
    # 4000 batches of ~150 bytes (600 KB) in a rolled segment: its first read validates it in
    # windows doubling from a page to 256 KiB, whether or not a window ends on a batch boundary.
    # Before, a window ending inside a batch was followed by one holding just that batch, then
    # a page again: a pread per page or so (333 here; one per batch for batches of 1 KiB), most
    # of a first read_committed walk's cost on a read-only log
    lg = open_log({"segment.bytes": 16 << 20})
    for i in range(4000):
        lg.append([(b"k%d" % i, b"v" * 80)])
    lg.roll()
    lg.append([(b"last", b"v")])
    lg.flush()
    size = lg.segments[0].size
    assert 4000 * 100 < size < 4000 * 200
    ops = CallCountingOps()
    ro = open_log(path=log_dir, read_only=True, io=ops)
    ops.reset()
    assert [r.offset for r in ro.read(3999, max_records=1)] == [3999]
    # 4, 8, ..., 128 KiB (252 KiB in 6 reads), then 256 KiB windows for the rest
    assert ops.calls["log"] <= 6 + -(-(size - (252 << 10)) // (128 << 10)) + 1
    assert ops.read["log"] >= size
    assert [r.offset for c in ro.iter_chunks() for r in c] == list(range(4001))


def test_a_refresh_reads_only_what_is_new(open_log, log_dir):
    # nothing new: no index byte read, one page of the .log's zero runway at most, and once the
    # directory has settled no listing; a new batch: its bytes and the new index entries only
    # (never the preallocated index files), and the same mapping (the runway is mapped)
    cfg = {"index.interval.bytes": 100}
    lg = open_log(cfg)
    for i in range(200):
        lg.append([(b"%016d" % i, b"v" * 100)])
    ops = CountingOps()
    ro = open_log(cfg, path=log_dir, read_only=True, io=ops)
    assert ro.log_end_offset == 200
    _settle()
    ro.refresh()                                   # lists: the listing is trusted from here
    m = ro.segments[-1].mapping()
    ops.reset()
    for _ in range(3):
        ro.refresh()
    # the .log alone, kept open since the open's refresh: the directory's stamp (one stat),
    # the kept descriptor's fstat and one probe of its runway (its length says nothing: it runs
    # past the data), each time; nothing opened or closed
    assert ops.listings == 0 and ops.opens == ops.closes == 0
    assert ops.stat_paths == 3 and ops.fstats == 3
    assert ops.read["index"] == ops.read["timeindex"] == 0 and ops.read["log"] == 3 * 4096
    lg.close()                                     # trimmed: the file's length says it all
    ops.reset()
    ro.refresh()
    assert ro.log_end_offset == 200 and ops.opens == 0 and sum(ops.read.values()) == 0
    lg = open_log(cfg)               # (its clean-shutdown marker, removed: the directory changed)
    _settle()
    ro.refresh()
    for i in range(200, 203):
        lg.append([(b"%016d" % i, b"v" * 100)])
        ops.reset()
        ro.refresh()
        assert ro.log_end_offset == i + 1
        assert ops.listings == 0
        assert ops.read["log"] <= 4096 + 2 * (lg.segments[-1].size - ro.segments[-1].size + 200)
        assert ops.read["index"] <= 64 * 8 and ops.read["timeindex"] <= 64 * 12
        assert ro.segments[-1].mapping() is m
    assert _index_bytes(ro.segments[-1]) == _index_bytes(lg.segments[-1])
    # a catch-up of many entries reads them in windows that double (at most twice what is
    # new), not the preallocated file
    for i in range(203, 2203):
        lg.append([(b"%016d" % i, b"v" * 100)])
    ops.reset()
    ro.refresh()
    n = lg.segments[-1].offset_index.entries
    assert ro.log_end_offset == 2203 and _index_bytes(ro.segments[-1]) == _index_bytes(lg.segments[-1])
    assert ops.read["index"] <= 2 * 8 * (n + 64) < lg.segments[-1].offset_index.length


def test_a_torn_big_batch_at_the_end_becomes_visible_when_whole(open_log, log_dir):
    # a 1000-record batch (~127 KB: read whole by its header's length) half copied in, the
    # rest still zeros: invisible, the index entry pointing at it ignored; whole: visible
    cfg = {"index.interval.bytes": 100}
    lg = open_log(cfg)
    lg.append([(b"k", b"v")])
    ro = open_log(cfg, path=log_dir, read_only=True)
    pos = lg.segments[-1].size
    lg.append([(b"%016d" % i, b"v" * 100) for i in range(1000)])
    path = lg.segments[-1].log_path
    with open(path, "r+b") as f:
        f.seek(pos + 60_000)
        whole = f.read(lg.segments[-1].size - pos - 60_000)
        f.seek(pos + 60_000)
        f.write(bytes(len(whole)))
    ro.refresh()
    assert ro.log_end_offset == 1 and ro.read(1) == [] and ro.segments[-1].size == pos
    assert ro.segments[-1].offset_index.entries == 0
    with open(path, "r+b") as f:
        f.seek(pos + 60_000)
        f.write(whole)
    ro.refresh()
    assert ro.log_end_offset == 1001
    assert [(r.offset, r.key) for r in ro.read(1, max_records=3)] == \
        [(1, b"%016d" % 0), (2, b"%016d" % 1), (3, b"%016d" % 2)]
    assert _index_bytes(ro.segments[-1]) == _index_bytes(lg.segments[-1])


def test_an_index_rewritten_under_the_view_is_copied_again(open_log, log_dir):
    # the writer's recovery rebuilt the active segment's index with other entries (a smaller
    # interval): the next entry in the file does not follow the last one copied, so the view
    # copies the index again from its start instead of keeping a stale prefix forever
    lg = open_log({"index.interval.bytes": 2000})
    for i in range(100):       # timestamps given: the time index must not depend on the clock
        lg.append([(b"%016d" % i, b"v" * 100, NOW + i)])
    ro = open_log({"index.interval.bytes": 300}, path=log_dir, read_only=True)
    assert ro.segments[-1].offset_index.entries == lg.segments[-1].offset_index.entries > 3
    lg.close()
    with open(os.path.join(log_dir, ".kstore-clean-shutdown"), "wb"):
        pass
    os.unlink(os.path.join(log_dir, "00000000000000000000.index"))  # rebuilt at the next open
    lg = open_log({"index.interval.bytes": 300}, path=log_dir)
    lg.append([(b"x", b"v" * 100, NOW + 100)])
    assert lg.segments[-1].offset_index.entries > 2 * ro.segments[-1].offset_index.entries
    ro.refresh()
    assert ro.log_end_offset == 101
    assert _index_bytes(ro.segments[-1]) == _index_bytes(lg.segments[-1])


def test_index_valid_prefix_and_copy_growth():
    from kstore._index_copy import extend_index_copy, index_valid_prefix

    def oe(*pairs):
        return b"".join(struct.pack(">ii", k, p) for k, p in pairs)

    def te(*pairs):
        return b"".join(struct.pack(">qi", t, k) for t, k in pairs)

    data = oe((1, 100), (5, 300), (9, 700), (12, 650), (20, 900))
    assert index_valid_prefix(data, 8, 1000, 50) == 3            # position going back
    assert index_valid_prefix(data, 8, 701, 50) == 3
    assert index_valid_prefix(data, 8, 700, 50) == 2             # position at the valid end
    assert index_valid_prefix(data, 8, 1000, 8) == 2             # offset past the valid data
    assert index_valid_prefix(data[8:], 8, 1000, 50, prev=data[:8]) == 2
    assert index_valid_prefix(data[8:], 8, 1000, 50, prev=oe((5, 10))) == 0   # not increasing
    assert index_valid_prefix(oe((0, 0)) + data, 8, 1000, 50) == 0            # zero padding
    assert index_valid_prefix(data + b"\1\2\3", 8, 1000, 50) == 3             # no partial entry
    tdata = te((10, 0), (10, 3), (15, 3), (14, 9), (20, 10))
    assert index_valid_prefix(tdata, 12, 1000, 50) == 3           # timestamp going back
    assert index_valid_prefix(tdata, 12, 1000, 2) == 1
    assert index_valid_prefix(te((0, 1)), 12, 1000, 50) == 0
    assert index_valid_prefix(tdata[12:], 12, 1000, 50, prev=te((11, 0))) == 0
    with pytest.raises(ValueError):
        index_valid_prefix(data, 10, 1000, 50)
    # growth: the same copy while it has room (written past its entries); a new one, the old
    # filled to its capacity first, when not
    c = extend_index_copy(None, 0, data[:16], 16)
    assert c.length == 16 and c.read(0, 16) == data[:16]
    c2 = extend_index_copy(c, 16, data[16:24], 8)
    assert c2 is not c and c2.read(0, 24) == data[:24] and c2.length >= 4096
    c3 = extend_index_copy(c2, 24, data[24:], 16)
    assert c3 is c2 and c3.read(0, 40) == data
    big = bytes(range(256)) * 32                                  # 8192 bytes
    c4 = extend_index_copy(c3, 40, big, len(big))
    assert c4 is not c3 and c4.read(0, 40 + len(big)) == data + big
    assert c3.read(0, c3.length) == (data + big)[:c3.length]      # the old copy filled up
    with pytest.raises(ValueError):
        extend_index_copy(c4, c4.length + 8, data, 8)
    with pytest.raises(TypeError):
        extend_index_copy(_core.Mapping.from_bytes(data), 8, data, 8)
