"""Lazy segments: the load leaves the segments below the recovery point unstat'ed (size read on
first use, segment_reader._load_size), and every use of one gives what an eager open gave: exact
sizes, records and offsets, beside readers, rolls, truncation, retention and deletion, and the
same exceptions for a file that is gone, replaced by a symlink or too large."""
import os
import random
import threading

import pytest

import kstore
from kstore.errors import CorruptRecordError, OffsetOutOfRangeError, SegmentGoneError, UnusableFileError
from kstore.fileio import FileOps

from log_helpers import NOW
from thread_watchdog import run_threads

CFG = {"segment.bytes": 500, "retention.ms": -1}
N = 60                       # ~12 segments of ~5 records


class LogOps(FileOps):
    """Counts the stats and opens of each .log path."""

    def __init__(self):
        self.stats: dict[str, int] = {}
        self.opens: dict[str, int] = {}
        self._lock = threading.Lock()

    def getsize(self, path):
        with self._lock:
            self.stats[path] = self.stats.get(path, 0) + 1
        return super().getsize(path)

    def open(self, path, flags, mode=0o644):
        if path.endswith(".log"):
            with self._lock:
                self.opens[path] = self.opens.get(path, 0) + 1
        return super().open(path, flags, mode)


def _value(i):
    return b"value-%04d-" % i + b"x" * (i % 7)


def _crashed_log(d, n=N):
    """A log of n records over several segments, its writer gone without closing."""
    lg = kstore.Log.open(d, CFG, recovery_point=0, clean_shutdown=False)
    for i in range(n):
        lg.append([(b"k%d" % i, _value(i), NOW + i)])
    assert len(lg.segments) >= 8
    bases = [s.base_offset for s in lg.segments]
    sizes = [s.size for s in lg.segments]
    lg.close_handlers()
    return bases, sizes


def _reopen(d, rp, io=None, clean=False):
    return kstore.Log.open(d, CFG, recovery_point=rp, clean_shutdown=clean, io=io)


def test_load_stats_only_the_segments_it_recovers(tmp_path):
    d = str(tmp_path / "t-0")
    bases, sizes = _crashed_log(d)
    io = LogOps()
    lg = _reopen(d, bases[-2] + 1, io)        # recovery from the segment before the last
    try:
        segs = lg.segments
        lazy = segs[:-2]
        for s in lazy:
            assert s.view.size == -1
            assert io.stats.get(s.log_path, 0) == 0 and io.opens.get(s.log_path, 0) == 0
        assert [r.segment for r in lg.recovery_report] == [s.log_path for s in segs[-2:]]
        # first use: the file's length, exactly what the writer had (one stat each)
        assert [s.size for s in segs] == sizes
        assert lg.size == sum(sizes)
        assert [s.size for s in lazy] == [os.path.getsize(s.log_path) for s in lazy]
        assert all(io.stats.get(s.log_path, 0) == 1 for s in lazy)
        assert [s.view.size for s in segs] == sizes
        assert [r.offset for r in lg.read(0, 10 ** 6)] == list(range(N))
        assert [r.value for r in lg.read(0, 10 ** 6)] == [_value(i) for i in range(N)]
        assert lg.offset_for_timestamp(NOW + 7) == 7
    finally:
        lg.close()


def test_read_maps_a_lazy_segment_without_a_stat(tmp_path):
    d = str(tmp_path / "t-0")
    bases, sizes = _crashed_log(d)
    io = LogOps()
    lg = _reopen(d, bases[-1], io)
    try:
        seg = lg.segments[3]
        recs = lg.read(seg.base_offset, 1)
        assert [r.offset for r in recs] == [seg.base_offset]
        assert seg.view.size == sizes[3]             # the mapping's fstat gave it
        assert io.stats.get(seg.log_path, 0) == 0 and io.opens[seg.log_path] == 1
        # the time lookup's fast path skips no lazy segment (size -1 is not "empty")
        assert lg.offset_for_timestamp(NOW + bases[5]) == bases[5]
    finally:
        lg.close()


def test_clean_open_reads_only_the_active_segment(tmp_path):
    d = str(tmp_path / "t-0")
    lg = kstore.Log.open(d, CFG, recovery_point=0, clean_shutdown=False)
    for i in range(N):
        lg.append([(None, _value(i), NOW + i)])
    sizes = [s.size for s in lg.segments]
    lg.close()
    io = LogOps()
    lg = _reopen(d, N, io, clean=True)
    try:
        assert [s.view.size for s in lg.segments[:-1]] == [-1] * (len(sizes) - 1)
        assert lg.log_end_offset == N and lg.size == sum(sizes)
    finally:
        lg.close()


def test_concurrent_first_uses_materialise_once(tmp_path, watchdog):
    watchdog(120)
    d = str(tmp_path / "t-0")
    bases, sizes = _crashed_log(d)
    for _round in range(5):
        io = LogOps()
        lg = _reopen(d, bases[-1], io)
        start = threading.Barrier(6)
        seen = []

        def user(k, lg=lg, start=start, seen=seen):
            start.wait(10)
            rng = random.Random(k)
            for _ in range(50):
                o = rng.randrange(N)
                if k % 2:
                    seen.append(lg.size)
                else:
                    r = lg.read(o, 1)
                    assert (r[0].offset, r[0].value) == (o, _value(o))
        ts = [threading.Thread(target=user, args=(k,), daemon=True) for k in range(6)]
        for t in ts:
            t.start()
        from thread_watchdog import join_all
        join_all(ts, 60)
        assert set(seen) == {sum(sizes)}
        assert all(io.stats.get(s.log_path, 0) <= 1 for s in lg.segments)
        assert [s.size for s in lg.segments] == sizes
        lg.close()


def test_retention_truncation_and_rolls_beside_readers_of_lazy_segments(tmp_path, watchdog):
    watchdog(120)
    d = str(tmp_path / "t-0")
    bases, sizes = _crashed_log(d)
    lg = _reopen(d, bases[-1])
    try:
        written = {i: _value(i) for i in range(N)}
        appended = [N]

        def reader(stop):
            rng = random.Random(1)
            while not stop.is_set():
                o = rng.randrange(appended[0])
                try:
                    recs = lg.read(o, 3)
                except OffsetOutOfRangeError:
                    assert o < lg.log_start_offset or o >= lg.log_end_offset
                    continue
                for r in recs:
                    assert r.value == written[r.offset]
                assert lg.size >= 0                      # never raises, never negative

        def writer(stop):
            i = N
            while not stop.is_set() and i < N + 300:
                written[i] = _value(i)
                lg.append([(None, written[i], NOW + i)])
                appended[0] = i + 1
                i += 1
            lg.delete_records(bases[4])                  # retention of lazy segments
            lg.delete_old_segments()
        run_threads(3, reader, reader, writer)
        assert lg.log_start_offset == bases[4]
        assert [r.offset for r in lg.read(bases[4], 10 ** 6)][:5] == list(range(bases[4], bases[4] + 5))
        # retention removed the files of the lazy segments it deleted
        for b in bases[:4]:
            assert not os.path.exists(os.path.join(d, f"{b:020d}.log"))
    finally:
        lg.close()


def test_truncate_into_a_lazy_segment(tmp_path):
    d = str(tmp_path / "t-0")
    bases, sizes = _crashed_log(d)
    lg = _reopen(d, bases[-1])
    try:
        cut = bases[5] + 2
        lg.truncate_to(cut)
        assert lg.log_end_offset == cut
        assert [r.offset for r in lg.read(0, 10 ** 6)] == list(range(cut))
        seg = lg.segments[-1]
        assert seg.base_offset == bases[5]
        assert os.path.getsize(seg.log_path) == seg.size < sizes[5]
        assert lg.size == sum(sizes[:5]) + seg.size
        lg.append([(None, b"after", NOW)])
        assert lg.read(cut, 1)[0].value == b"after"
    finally:
        lg.close()


def test_delete_settles_sizes_first(tmp_path):
    d = str(tmp_path / "t-0")
    bases, sizes = _crashed_log(d)
    lg = _reopen(d, bases[-1])
    segs = lg.segments
    lg.delete()
    # the deleted segments keep the sizes their files had, as an eager open's did
    assert [s.size for s in segs] == sizes
    assert not os.path.exists(d) or not any(n.endswith(".log") for n in os.listdir(d))


def test_a_lazy_segment_gone_from_disk_raises_segment_gone(tmp_path):
    d = str(tmp_path / "t-0")
    bases, _sizes = _crashed_log(d)
    lg = _reopen(d, bases[-1])
    try:
        seg = lg.segments[2]
        os.unlink(seg.log_path)
        with pytest.raises(SegmentGoneError, match=f"{bases[2]:020d}.log"):
            _ = seg.size
        with pytest.raises(SegmentGoneError):
            seg.mapping()
    finally:
        lg.close_handlers()


@pytest.mark.parametrize("lazy", [True, False])
def test_symlinked_lazy_segment_refused_as_eagerly(tmp_path, lazy):
    d = str(tmp_path / "t-0")
    bases, sizes = _crashed_log(d)
    victim = os.path.join(d, f"{bases[2]:020d}.log")
    os.rename(victim, str(tmp_path / "elsewhere.log"))
    os.symlink(str(tmp_path / "elsewhere.log"), victim)
    # lazy: below the recovery point; eager: recovered (the load opens it and refuses it)
    if lazy:
        lg = _reopen(d, bases[-1])
        try:
            with pytest.raises(UnusableFileError, match="symlink"):
                lg.read(bases[2], 1)
        finally:
            lg.close()
    else:
        with pytest.raises(UnusableFileError, match="symlink"):
            _reopen(d, 0)


def test_lazy_segment_above_2gib_refused_on_first_use(tmp_path):
    d = str(tmp_path / "t-0")
    bases, _sizes = _crashed_log(d)
    big = os.path.join(d, f"{bases[1]:020d}.log")
    os.truncate(big, (1 << 31) + 4096)            # sparse
    lg = _reopen(d, bases[-1])
    try:
        with pytest.raises(CorruptRecordError, match="larger than 2\\^31-1"):
            _ = lg.segments[1].size
        with pytest.raises(CorruptRecordError, match="larger than 2\\^31-1"):
            lg.read(bases[1], 1)
    finally:
        lg.close_handlers()
    # recovered (eager) it is refused at load, as before
    with pytest.raises(CorruptRecordError, match="larger than 2\\^31-1"):
        _reopen(d, 0)


# -- a LogManager's start-up: compaction and topic deletion of lazy segments -----------------
def _reopened_manager(tmp_path):
    from cleaner_helpers import NOW as T, mgr
    m, _t = mgr(tmp_path)
    m.create_topic("c", 1, {"cleanup.policy": "compact"})
    written = []
    for i in range(400):
        k, v = b"k%d" % (i % 17), b"v%d" % i
        written.append((m.append("c", k, v, partition=0, timestamp=T).offset, k, v))
    m.close()
    m, _t = mgr(tmp_path)
    return m, written


def test_compaction_swaps_lazy_segments(tmp_path):
    from cleaner_helpers import contents, latest
    m, written = _reopened_manager(tmp_path)
    with m:
        lg = m.log("c", 0)
        segs = lg.segments
        assert len(segs) > 5 and all(s.view.size == -1 for s in segs[:-1])   # clean start-up
        sizes_on_disk = [os.path.getsize(s.log_path) for s in segs[:-1]]
        stats = m.clean_now()
        assert len(stats) == 1 and stats[0].records_removed > 0
        # the swapped-out segments kept the sizes their files had
        assert [s.size for s in segs[:-1]] == sizes_on_disk
        got = contents(lg)
        assert {k: (off, v) for off, k, v in got} == {k: ov for k, ov in latest(written).items()}
        assert lg.size == sum(s.size for s in lg.segments)
        assert not [n for n in os.listdir(lg.dir) if n.endswith((".cleaned", ".swap"))]


def test_delete_topic_beside_readers_of_lazy_segments(tmp_path, watchdog):
    watchdog(120)
    m, written = _reopened_manager(tmp_path)
    with m:
        lg = m.log("c", 0)
        ready = threading.Event()

        def reader(stop):
            rng = random.Random(3)
            while not stop.is_set():
                o = rng.randrange(len(written))
                try:
                    recs = lg.read(o, 2)
                except (kstore.KStoreError, OSError) as e:
                    # the deletion closes the log: a read raises a kstore error, never crashes
                    assert lg.closed, e
                    return
                assert [(r.offset, r.key, r.value) for r in recs] == written[o:o + 2]
                ready.set()

        def deleter(stop):
            assert ready.wait(30)
            m.delete_topic("c")
        run_threads(2, reader, reader, deleter)
        assert "c" not in m.topics()
