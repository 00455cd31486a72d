"""OffsetIndex and TimeIndex: Kafka's OffsetIndexTest/TimeIndexTest cases, floor search against
numpy.searchsorted, preallocation, trimming, and files written by a broker."""
import errno
import os
import random
import struct

import numpy as np
import pytest

from kstore import _core
from kstore.errors import InvalidOffsetError, KStoreStateError
from kstore.fileio import FileOps
from kstore.index import CorruptIndexError
from kstore.offset_index import OffsetIndex
from kstore.time_index import TimeIndex

BASE = 45


@pytest.fixture
def oidx(tmp_path):
    idx = OffsetIndex(str(tmp_path / "00000000000000000045.index"), BASE, 30 * 8)
    yield idx
    idx.close_handler()


@pytest.fixture
def tidx(tmp_path):
    idx = TimeIndex(str(tmp_path / "00000000000000000045.timeindex"), BASE, 30 * 12)
    yield idx
    idx.close_handler()


def test_new_index_is_preallocated_rounded_down(tmp_path):
    p = str(tmp_path / "a.index")
    idx = OffsetIndex(p, 0, 1003)
    assert os.path.getsize(p) == 1000 and idx.max_entries == 125 and idx.entries == 0
    idx.close()
    assert os.path.getsize(p) == 0
    t = TimeIndex(str(tmp_path / "a.timeindex"), 0, 1003)
    assert os.path.getsize(t.path) == 996 and t.max_entries == 83
    t.close_handler()


def test_random_lookups(oidx):
    offsets = sorted(random.Random(1).sample(range(BASE, BASE + 10_000), 30))
    for i, off in enumerate(offsets):
        oidx.append(off, i * 7)
    for off, pos in zip(offsets, range(0, 300, 7)):
        assert oidx.lookup(off) == (off, pos)
    # between entries the floor is returned
    for probe in range(BASE, BASE + 10_000, 37):
        i = np.searchsorted(offsets, probe, side="right") - 1
        want = (BASE, 0) if i < 0 else (offsets[i], i * 7)
        assert oidx.lookup(probe) == want


def test_lookup_extremes(oidx):
    assert oidx.lookup(BASE) == (BASE, 0)          # empty index
    oidx.append(BASE + 10, 100)
    assert oidx.lookup(BASE) == (BASE, 0)          # below the first entry
    assert oidx.lookup(BASE + 9) == (BASE, 0)
    assert oidx.lookup(1 << 62) == (BASE + 10, 100)


def test_append_out_of_order_and_too_far(oidx):
    oidx.append(BASE + 51, 0)
    with pytest.raises(InvalidOffsetError):
        oidx.append(BASE + 50, 1)
    with pytest.raises(InvalidOffsetError):
        oidx.append(BASE + 51, 1)
    from kstore.errors import IndexOffsetOverflowError
    with pytest.raises(IndexOffsetOverflowError):
        oidx.append(BASE + (1 << 31), 2)


def test_full_index(oidx):
    for i in range(30):
        oidx.append(BASE + i, i)
    assert oidx.is_full()
    with pytest.raises(KStoreStateError, match="full index"):
        oidx.append(BASE + 30, 30)


def test_truncate(oidx):
    for i in range(10):
        oidx.append(BASE + i * 2, i * 10)
    oidx.truncate_to(BASE + 10)           # exact entry → removed
    assert oidx.entries == 5 and oidx.last_offset == BASE + 8
    oidx.truncate_to(BASE + 7)            # between → keep the floor
    assert oidx.entries == 4 and oidx.lookup(BASE + 100) == (BASE + 6, 30)
    oidx.truncate_to(BASE)
    assert oidx.entries == 0 and oidx.lookup(BASE + 100) == (BASE, 0)
    oidx.append(BASE + 1, 5)
    assert oidx.lookup(BASE + 3) == (BASE + 1, 5)


def test_reopen_and_trim(tmp_path):
    p = str(tmp_path / "00000000000000000045.index")
    idx = OffsetIndex(p, BASE, 800)
    for i in range(12):
        idx.append(BASE + i, i * 3)
    idx.close()
    assert os.path.getsize(p) == 96
    idx = OffsetIndex(p, BASE, 800)
    assert idx.entries == 12 and idx.is_full() and idx.last_offset == BASE + 11
    idx.resize(800)
    assert idx.max_entries == 100 and idx.entries == 12
    idx.append(BASE + 20, 99)
    assert idx.lookup(BASE + 25) == (BASE + 20, 99)
    idx.close_handler()


def test_last_offset_equal_to_base_is_sane(tmp_path):
    idx = OffsetIndex(str(tmp_path / "x.index"), 20, 800)
    idx.append(20, 0)
    idx.sanity_check()
    idx.close_handler()


def test_sanity_check_rejects_bad_files(tmp_path):
    p = str(tmp_path / "00000000000000000100.index")
    with open(p, "wb") as f:
        f.write(struct.pack(">ii", -5, 0))      # last offset 95 < base 100
    idx = OffsetIndex(p, 100, 800)
    with pytest.raises(CorruptIndexError):
        idx.sanity_check()
    idx.close_handler()
    with open(p, "wb") as f:
        f.write(b"\0" * 9)
    idx = OffsetIndex(p, 100, 800)
    with pytest.raises(CorruptIndexError, match="multiple of 8"):
        idx.sanity_check()
    idx.close_handler()


def test_broker_written_index_opens_as_is(tmp_path):
    """An index exactly as Kafka writes it (trimmed, big-endian) reads back unchanged."""
    p = str(tmp_path / "00000000000000368769.index")
    entries = [(1, 0), (3, 497), (6, 1407), (8, 1686)]     # the seed's example shape
    with open(p, "wb") as f:
        for rel, pos in entries:
            f.write(struct.pack(">ii", rel, pos))
    idx = OffsetIndex(p, 368769, 10 << 20)
    assert idx.entries == 4
    assert idx.lookup(368769 + 6) == (368775, 1407)
    assert idx.lookup(368769 + 7) == (368775, 1407)
    arr = idx.entries_array()
    assert arr.dtype == _core.OFFSET_DTYPE
    assert arr["relative_offset"].tolist() == [1, 3, 6, 8]
    assert arr["position"].tolist() == [0, 497, 1407, 1686]
    del arr
    idx.close_handler()


def test_floor_search_against_searchsorted(tmp_path):
    rnd = np.random.default_rng(7)
    for n in (1, 2, 5, 1000, 1025, 1500, 5000):
        rel = np.unique(rnd.integers(0, 1 << 30, n * 2))[:n].astype(np.int64)
        p = str(tmp_path / f"{n}.index")
        idx = OffsetIndex(p, 1000, n * 8)
        raw = np.zeros(len(rel), dtype=_core.OFFSET_DTYPE)
        raw["relative_offset"] = rel
        raw["position"] = np.arange(len(rel))
        idx.load_entries(raw)
        probes = np.concatenate([rel + 1000, rel + 999, rel + 1001, rnd.integers(0, 1 << 30, 500), [0, 999, 1 << 40]])
        for t in probes.tolist():
            i = int(np.searchsorted(rel + 1000, t, side="right")) - 1
            want = (1000, 0) if i < 0 else (int(rel[i]) + 1000, i)
            assert idx.lookup(t) == want, (n, t)
        idx.close_handler()


# -- time index --------------------------------------------------------------------------------
def test_time_index_lookup_and_empty(tidx):
    assert tidx.lookup(100) == (-1, BASE)
    assert tidx.last_entry == (-1, BASE)
    for i in range(10):
        tidx.maybe_append(100 + i * 10, BASE + i * 5)
    assert tidx.lookup(99) == (-1, BASE)                 # before the first entry
    assert tidx.lookup(100) == (100, BASE)
    assert tidx.lookup(125) == (120, BASE + 10)
    assert tidx.lookup(10_000) == (190, BASE + 45)


def test_time_index_ignores_duplicates_rejects_regressions(tidx):
    tidx.maybe_append(100, BASE + 1)
    tidx.maybe_append(100, BASE + 2)     # same timestamp: ignored
    assert tidx.entries == 1
    with pytest.raises(InvalidOffsetError):
        tidx.maybe_append(99, BASE + 3)
    with pytest.raises(InvalidOffsetError):
        tidx.maybe_append(200, BASE)


def test_time_index_full_at_max_minus_one(tidx):
    for i in range(29):
        tidx.maybe_append(i + 1, BASE + i)
    assert tidx.entries == 29 and tidx.is_full()
    with pytest.raises(KStoreStateError):
        tidx.maybe_append(1000, BASE + 100)
    tidx.maybe_append(1000, BASE + 100, skip_full_check=True)   # the final entry at roll
    assert tidx.entries == 30 and tidx.last_entry == (1000, BASE + 100)


def test_time_index_truncate_compares_offsets(tidx):
    for i in range(10):
        tidx.maybe_append(100 + i, BASE + i * 10)
    tidx.truncate_to(BASE + 30)
    assert tidx.entries == 3 and tidx.last_entry == (102, BASE + 20)
    tidx.truncate_to(BASE + 15)
    assert tidx.entries == 2
    tidx.truncate_to(BASE)
    assert tidx.entries == 0 and tidx.last_entry == (-1, BASE)


def test_time_index_sanity_check(tmp_path):
    p = str(tmp_path / "00000000000000000000.timeindex")
    with open(p, "wb") as f:
        f.write(struct.pack(">qi", 200, 0) + struct.pack(">qi", 100, 5))
    t = TimeIndex(p, 0, 1200)
    with pytest.raises(CorruptIndexError, match="less than the first timestamp"):
        t.sanity_check()
    t.close_handler()


def test_time_floor_search_against_searchsorted(tmp_path):
    rnd = np.random.default_rng(3)
    ts = np.unique(rnd.integers(0, 1 << 40, 3000))
    p = str(tmp_path / "t.timeindex")
    t = TimeIndex(p, 0, len(ts) * 12 + 12)
    raw = np.zeros(len(ts), dtype=_core.TIME_DTYPE)
    raw["timestamp"] = ts
    raw["relative_offset"] = np.arange(len(ts))
    t.load_entries(raw)
    for probe in np.concatenate([ts, ts - 1, ts + 1, [0, 1 << 50]]).tolist():
        i = int(np.searchsorted(ts, probe, side="right")) - 1
        want = (-1, 0) if i < 0 else (int(ts[i]), i)
        assert t.lookup(probe) == want
    t.close_handler()


def test_views_survive_resize(tmp_path):
    idx = OffsetIndex(str(tmp_path / "v.index"), 0, 800)
    for i in range(5):
        idx.append(i, i)
    view = idx.entries_array()
    idx.resize(40)          # trims while the view is alive: the old mapping lives on
    assert view["position"].tolist() == [0, 1, 2, 3, 4]
    del view
    idx.close_handler()


# -- damaged or hostile lengths (issue 12, defect 19) ----------------------------------------------
def _small_log(path, **cfg):
    import kstore
    lg = kstore.Log.open(str(path), {"index.interval.bytes": 1, **cfg})
    for i in range(20):
        lg.append([(b"k%d" % i, b"v%d" % i)])
    lg.close()


def test_huge_sparse_index_is_rebuilt_without_reserving_it(tmp_path):
    """A 2 GiB sparse .index (truncate, never written) is neither fallocated nor trusted: a
    writable and a read-only open read in well under a second, and it is rebuilt to the data."""
    import time
    import kstore
    _small_log(tmp_path / "t-0")
    p = str(tmp_path / "t-0" / "00000000000000000000.index")
    good = open(p, "rb").read()
    assert len(good) == 19 * 8
    os.truncate(p, 2 << 30)
    t0 = time.monotonic()
    with kstore.Log.open(str(tmp_path / "t-0"), read_only=True) as ro:
        assert [r.value for r in ro.read(7, max_records=2)] == [b"v7", b"v8"]
    with kstore.Log.open(str(tmp_path / "t-0"), {"index.interval.bytes": 1}) as lg:
        assert [(r.offset, r.value) for r in lg.read(13, max_records=1)] == [(13, b"v13")]
        assert os.stat(p).st_blocks * 512 < 1 << 20      # nothing reserved for the 2 GiB
        assert lg.append([(b"k", b"v20")]).first_offset == 20
    assert time.monotonic() - t0 < 1.0
    assert open(p, "rb").read()[: len(good)] == good     # rebuilt from the .log, then closed
    assert os.path.getsize(p) == len(good) + 8             # and the append's entry (interval 1)


@pytest.mark.parametrize("length, why", [(10 * 8 + 3, "not a multiple of 8"),
                                         (8 * 1024 + 8, "above segment.index.bytes")])
def test_index_of_impossible_length_is_not_trusted(tmp_path, length, why):
    """Kafka's sanity check: a length that is not a multiple of the entry size, or (kstore) above
    segment.index.bytes, is a corrupt index: rebuilt from the .log on first use."""
    p = str(tmp_path / "00000000000000000000.index")
    with open(p, "wb") as f:
        f.write(struct.pack(">ii", 1, 0) + b"\xff" * (length - 8))
    idx = OffsetIndex(p, 0, 8 * 1024)
    assert idx.entries == 0 and idx.mapping is None
    assert why in idx.entries_problem(1000)
    idx.rewrite(np.zeros(0, dtype=_core.OFFSET_DTYPE))
    assert idx.entries_problem(1000) is None and os.path.getsize(p) == 0
    idx.close_handler()


def test_empty_segment_read_past_keeps_its_empty_index(tmp_path):
    """An empty segment (compaction leaves them) keeps its 0-byte indexes when a read passes
    it: no growth to segment.index.bytes, no blocks pinned."""
    import kstore
    d = tmp_path / "t-0"
    lg = kstore.Log.open(str(d), {"index.interval.bytes": 1})
    for i in range(3):
        lg.append([(b"k", b"a%d" % i)])
    lg.roll()
    for i in range(3, 6):
        lg.append([(b"k", b"b%d" % i)])
    lg.roll()
    for i in range(6, 9):
        lg.append([(b"k", b"c%d" % i)])
    lg.close()
    # what the cleaner leaves when every record of a segment is superseded: empty files
    for suffix in (".log", ".index", ".timeindex"):
        os.truncate(str(d / ("00000000000000000003" + suffix)), 0)
    with kstore.Log.open(str(d)) as lg:
        assert [(r.offset, r.value) for r in lg.read(0, max_records=10)] == \
            [(0, b"a0"), (1, b"a1"), (2, b"a2"), (6, b"c6"), (7, b"c7"), (8, b"c8")]
        assert lg.offset_for_timestamp(0) == 0
        for suffix in (".index", ".timeindex"):
            st = os.stat(str(d / ("00000000000000000003" + suffix)))
            assert (st.st_size, st.st_blocks) == (0, 0), suffix


def test_a_reader_never_finds_a_closed_index_mapping_published(tmp_path, monkeypatch):
    """An index resized (a roll trims the old active segment's) or closed closed its mapping
    before unpublishing it: a reader thread scheduled in between found a closed mapping in the
    index state and Log.read raised a raw ValueError ("mapping is closed"; seen in
    test_concurrency's reader threads). The mapping is unpublished first, then closed."""
    import kstore
    from kstore.index import AbstractIndex
    lg = kstore.Log.open(str(tmp_path / "t-0"), {"index.interval.bytes": 1})
    try:
        for o in range(20):
            lg.append([(None, b"v%02d" % o)])
        seen = []
        plain = AbstractIndex._map

        def set_map(self, m):
            if m is None and self.state.map is not None and not seen:
                # the moment the old code left open: another thread reads now
                seen.append([(r.offset, r.value) for r in lg.read(15, max_records=2)])
            plain.fset(self, m)
        monkeypatch.setattr(AbstractIndex, "_map", property(plain.fget, set_map))
        lg.roll()
        monkeypatch.undo()
        assert seen == [[(15, b"v15"), (16, b"v16")]]
    finally:
        lg.close()


def test_a_reader_never_pairs_an_old_entry_count_with_a_rewritten_index(tmp_path, monkeypatch):
    """rewrite (an index rebuilt from its .log on first use) mapped the new, shorter file while
    the state still held the old entry count: a reader scheduled in between raised a raw
    ValueError ('N index entries do not fit a mapping of M bytes'). The count goes first."""
    import kstore
    from kstore.index import AbstractIndex
    lg = kstore.Log.open(str(tmp_path / "t-0"), {"index.interval.bytes": 1})
    try:
        for o in range(20):
            lg.append([(None, b"v%02d" % o)])
        idx = lg.active_segment.offset_index
        assert idx.entries >= 10
        kept = idx.entries_array()[:2].copy()
        seen = []
        plain = AbstractIndex._map

        def set_map(self, m):
            plain.fset(self, m)
            if m is not None and not seen:
                # the moment the new mapping is published: another thread reads now
                seen.append([(r.offset, r.value) for r in lg.read(15, max_records=2)])
        monkeypatch.setattr(AbstractIndex, "_map", property(plain.fget, set_map))
        idx.rewrite(kept)
        monkeypatch.undo()
        assert seen == [[(15, b"v15"), (16, b"v16")]]
        assert idx.entries == 2
    finally:
        lg.close()


class _AllocRecorder(FileOps):
    """Records how index blocks are reserved; zero_fill fails with ENOSPC while `full`."""

    def __init__(self):
        super().__init__()
        self.ops = []
        self.full = False

    def allocate(self, fd, offset, length):
        self.ops.append(("allocate", offset, length))
        return super().allocate(fd, offset, length)

    def zero_fill(self, fd, offset, length):
        if self.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.ops.append(("zero_fill", offset, length))
        return super().zero_fill(fd, offset, length)


@pytest.mark.parametrize("kind", ["offset", "time"])
def test_appends_reserve_blocks_past_the_entries_as_written_zeros(tmp_path, kind):
    """An append's blocks past the entries are written zeros (a store into a fallocated,
    unwritten extent through the mapping costs ~5 ms of CPU on ext4), 64 KiB at a time; the
    entries already there are only reserved (fallocate), never rewritten."""
    ops = _AllocRecorder()
    cls, es = (OffsetIndex, 8) if kind == "offset" else (TimeIndex, 12)
    p = str(tmp_path / f"00000000000000000045.{kind}")
    idx = cls(p, BASE, 1 << 20, io=ops)
    add = idx.append if kind == "offset" else idx.maybe_append
    step = 64 << 10
    for i in range(3):
        add(BASE + i, i * 10) if kind == "offset" else add(1000 + i, BASE + i)
    assert ops.ops == [("zero_fill", 0, step)]
    idx.close()                                   # trimmed to its 3 entries
    before = open(p, "rb").read()
    assert len(before) == 3 * es
    ops.ops.clear()
    idx = cls(p, BASE, 1 << 20, io=ops)
    idx.resize(1 << 20)                           # as make_active grows the active index back
    add = idx.append if kind == "offset" else idx.maybe_append
    add(BASE + 3, 30) if kind == "offset" else add(1003, BASE + 3)
    assert ops.ops == [("allocate", 0, 3 * es), ("zero_fill", 3 * es, step - 3 * es)]
    with open(p, "rb") as f:
        data = f.read(step + 16)
    assert data[:3 * es] == before and data[4 * es:] == bytes(len(data) - 4 * es)
    assert idx.entries == 4
    idx.close_handler()


def test_a_full_disk_at_an_index_append_fails_it_and_the_next_one_works(tmp_path):
    ops = _AllocRecorder()
    p = str(tmp_path / "00000000000000000045.index")
    idx = OffsetIndex(p, BASE, 1 << 20, io=ops)
    ops.full = True
    with pytest.raises(OSError) as e:
        idx.append(BASE + 1, 100)
    assert e.value.errno == errno.ENOSPC and idx.entries == 0
    ops.full = False
    idx.append(BASE + 1, 100)
    assert idx.entries == 1 and idx.lookup(BASE + 5) == (BASE + 1, 100)
    idx.close_handler()
