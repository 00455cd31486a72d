"""A read-only log's refresh (kstore/ro_refresh.py): the partition directory listed again only
when its stamp says it may have changed, and every change the writer makes still seen by the
next refresh, exactly as a fresh read-only open sees it."""
import os
import shutil
import time

import pytest

import kstore
from kstore import ro_refresh
from kstore.errors import UnknownTopicError
from kstore.fileio import FileOps
from kstore.clock import MockTime
from kstore.manager import LogManager
from kstore.ro_refresh import DirWatch
from kstore.scheduler import MockScheduler

NOW = 1_700_000_000_000


class ListingOps(FileOps):
    def __init__(self):
        self.listings = 0

    def listdir(self, path):
        self.listings += 1
        return super().listdir(path)


def _settle():
    time.sleep(DirWatch.SLACK_NS / 1e9 * 2)


def _view(lg):
    """What a read-only log shows: its segments' bases, start, end and every record."""
    recs = [(r.offset, r.key, r.value) for c in lg.iter_chunks(lg.log_start_offset) for r in c]
    return [s.base_offset for s in lg.segments], lg.log_start_offset, lg.log_end_offset, recs


def test_a_listing_is_trusted_only_once_the_directory_settled(tmp_path, monkeypatch):
    d = str(tmp_path)
    w = DirWatch(FileOps(), d)
    assert not w.unchanged()                          # nothing trusted yet
    st = os.stat(d)
    newest = max(st.st_mtime_ns, st.st_ctime_ns)
    clock = [newest + DirWatch.SLACK_NS]              # not past the slack: a change could share the times
    real_ns = time.time_ns
    monkeypatch.setattr(ro_refresh.time, "time_ns", lambda: clock[0])
    before = w.before_listing()
    w.listed(before)
    assert not w.settled(before) and not w.unchanged()
    clock[0] = newest + DirWatch.SLACK_NS + 1
    before = w.before_listing()
    w.listed(before)
    assert w.settled(before) and w.unchanged()
    clock[0] -= 2                                     # the wall clock went back: no trust
    assert not w.unchanged()
    clock[0] += 2
    w.listed(w.before_listing())
    assert w.unchanged()
    open(os.path.join(d, "x"), "wb").close()          # any entry created, renamed or removed
    assert not w.unchanged()
    clock[0] = real_ns() + DirWatch.SLACK_NS + 1
    w.listed(w.before_listing())
    assert w.unchanged()
    os.rename(os.path.join(d, "x"), os.path.join(d, "y"))
    assert not w.unchanged()
    shutil.rmtree(d)
    with pytest.raises(UnknownTopicError, match="was deleted"):
        w.before_listing()
    # whole-second times (a coarse file system) need the coarse slack
    monkeypatch.setattr(w, "stamp", lambda: (1, 2, 10**18, 10**18, 4096, 2))
    clock[0] = 10**18 + DirWatch.SLACK_NS + 1
    assert not w.settled(w.before_listing())
    clock[0] = 10**18 + DirWatch.COARSE_SLACK_NS + 1
    assert w.settled(w.before_listing())


def _writer_log(path):
    return kstore.Log.open(path, {"segment.bytes": 2000, "index.interval.bytes": 300})


def _append(lg, n):
    for _ in range(n):
        o = lg.log_end_offset
        lg.append([(b"k%d" % (o % 5), b"%d;" % o * 20, NOW)])


@pytest.mark.parametrize("change", ["append", "roll", "retention", "truncate", "truncate_back",
                                    "reopen"])
def test_every_change_is_seen_by_the_refresh_after_a_trusted_listing(tmp_path, change):
    # the refresh that follows a trusted listing takes the fast path (no listing) while the
    # writer only appends; after any change to the segment list it lists, and shows exactly
    # what a fresh read-only open shows
    path = str(tmp_path / "t-0")
    lg = _writer_log(path)
    _append(lg, 60)
    ops = ListingOps()
    ro = kstore.Log.open(path, read_only=True, io=ops)
    list(ro.iter_chunks())                                    # every segment validated
    _settle()
    ro.refresh()
    ops.listings = 0
    ro.refresh()
    assert ops.listings == 0
    if change == "append":
        _append(lg, 1)
    elif change == "roll":
        lg.roll()
        _append(lg, 2)
    elif change == "retention":
        lg.delete_records(lg.segments[2].base_offset + 1)
        lg.delete_old_segments()
    elif change == "truncate":
        lg.truncate_to(lg.log_end_offset - 2)                 # inside the active segment: replaced
    elif change == "truncate_back":
        lg.truncate_to(lg.segments[-3].base_offset + 1)       # back into a rolled segment
        _append(lg, 4)
    else:
        lg.close()
        lg = _writer_log(path)
        _append(lg, 3)
    ro.refresh()
    assert (ops.listings == 0) == (change == "append")
    fresh = kstore.Log.open(path, read_only=True)
    assert _view(ro) == _view(fresh)
    assert ro.log_end_offset == lg.log_end_offset
    lg.close()


def test_compaction_and_topic_deletion_seen_after_a_trusted_listing(tmp_path):
    d = str(tmp_path)
    t = MockTime(NOW)
    m = LogManager(d, {"log.segment.bytes": "1200", "log.segment.delete.delay.ms": "0",
                       "log.retention.check.interval.ms": "1000000000"},
                   time=t, scheduler=MockScheduler(t))
    try:
        m.create_topic("c", 1, {"cleanup.policy": "compact"})
        lg = m.log("c", 0)
        for i in range(120):
            lg.append([(b"k%d" % (i % 7), b"v%d" % i, NOW)])
        ops = ListingOps()
        ro = kstore.Log.open(os.path.join(d, "c-0"), read_only=True, io=ops)
        before = _view(ro)
        _settle()
        ro.refresh()
        ops.listings = 0
        ro.refresh()
        assert ops.listings == 0
        m.clean_now()
        ro.refresh()
        assert ops.listings > 0
        after = _view(ro)
        assert after == _view(kstore.Log.open(os.path.join(d, "c-0"), read_only=True))
        assert len(after[3]) < len(before[3]) and after[2] == before[2] == 120
        _settle()
        ro.refresh()
        ro.refresh()
        m.delete_topic("c")
        with pytest.raises(UnknownTopicError, match="was deleted"):
            ro.refresh()
    finally:
        m.close()


class HoleOps(FileOps):
    """The listing after `hole_at` more listdir calls holds a .log name that does not exist
    between two real ones (as a listing racing the writer can hold a hole), once."""

    def __init__(self):
        self.hole_at = None
        self.name = None

    def listdir(self, path):
        names = super().listdir(path)
        if self.hole_at is not None:
            self.hole_at -= 1
            if self.hole_at < 0:
                self.hole_at = None
                names = names + [self.name]
        return names


def test_a_scan_attempt_thrown_away_keeps_no_descriptor(tmp_path, monkeypatch):
    """A refresh whose first scan attempt is thrown away (the listing after its validations,
    which made the new last segment and kept its .log open, disagrees with the first in the
    middle: listed again) and whose second one is published: once
    the log is closed, no descriptor and no kept-descriptor slot is left. Before, the thrown
    away attempt's new last segment kept its .log open for the process's life."""
    from kstore import segment_ro
    monkeypatch.setattr(DirWatch, "settled", lambda self, before: False)   # always list twice
    d = str(tmp_path / "t-0")
    fds = lambda: len(os.listdir("/proc/self/fd"))   # noqa: E731
    before = (fds(), segment_ro.KEPT.count)
    w = kstore.Log.open(d, {"segment.bytes": 300})
    for i in range(12):
        w.append([(b"k", b"v%d" % i + b"." * 60, NOW + i)])
    ops = HoleOps()
    ro = kstore.Log.open(d, read_only=True, io=ops)
    bases = [s.base_offset for s in ro.segments]
    assert len(bases) >= 3
    w.roll()
    w.append([(b"k", b"last", NOW + 20)])       # a new last segment for the refresh to make
    ops.name, ops.hole_at = "%020d.log" % (bases[0] + 1), 1     # in the check's listing
    ro.refresh()
    assert ops.hole_at is None                  # the hole was listed (and thrown away)
    assert [s.base_offset for s in ro.segments] == [s.base_offset for s in w.segments]
    assert [r.value for r in ro.read(w.log_end_offset - 1)] == [b"last"]
    ro.close()
    w.close()
    assert (fds(), segment_ro.KEPT.count) == before


class StartFileOps(FileOps):
    """Counts the stats and opens of a standalone log's start file."""

    def __init__(self):
        self.stats = self.opens = 0

    def stat_path(self, path, follow_symlinks=False):
        self.stats += path.endswith(".kstore-log-start")
        return super().stat_path(path, follow_symlinks)

    def open(self, path, flags, mode=0o644):
        self.opens += path.endswith(".kstore-log-start")
        return super().open(path, flags, mode)


def test_readers_beside_a_standalone_writer_process_honour_its_delete_records(tmp_path, watchdog):
    """A standalone writer in another process moves its start (DeleteRecords inside a segment,
    saved in .kstore-log-start): a read-only Log's refresh, a fresh read-only open and a
    StoreReader's refresh all start there (before: at the segment's base, 0, returning the
    deleted records, until retention removed the segment)."""
    from kstore.errors import OffsetOutOfRangeError
    from kstore.reader import StoreReader
    from writer_process import WriterProcess
    watchdog(120)
    part = str(tmp_path / "store" / "t-0")
    w = WriterProcess(str(tmp_path / "mgr"), str(tmp_path))
    try:
        w.run(f"lg = kstore.Log.open({part!r})",
              "lg.append([(None, b'v%d' % i, NOW) for i in range(10)])")
        ro = kstore.Log.open(part, read_only=True)
        sr = StoreReader(str(tmp_path / "store"))
        assert (ro.log_start_offset, ro.log_end_offset) == (0, 10)
        assert sr.offsets("t", 0) == (0, 10)
        w.run("lg.delete_records(4)")
        ro.refresh()
        assert (ro.log_start_offset, ro.log_end_offset) == (4, 10)
        with pytest.raises(OffsetOutOfRangeError):
            ro.read(3)
        assert [r.value for r in ro.read(4)][:1] == [b"v4"]
        sr.refresh()
        assert sr.offsets("t", 0) == (4, 10)
        with kstore.Log.open(part, read_only=True) as fresh:
            assert (fresh.log_start_offset, fresh.log_end_offset) == (4, 10)
        w.run("lg.append([(None, b'w', NOW)])", "lg.delete_records(7)", "lg.close()")
        ro.refresh()
        sr.refresh()
        assert (ro.log_start_offset, ro.log_end_offset) == (7, 11) == sr.offsets("t", 0)
        ro.close()
        sr.close()
    finally:
        w.close()


def test_the_start_file_is_read_again_only_when_it_changed(tmp_path):
    """A read-only log's refresh costs what changed: with its directory unchanged it does not
    look at the start file; after a change it stats it, and reads it only if it is new."""
    d = str(tmp_path / "t-0")
    lg = _writer_log(d)
    _append(lg, 20)
    lg.delete_records(5)
    ops = StartFileOps()
    ro = kstore.Log.open(d, read_only=True, io=ops)
    assert ro.log_start_offset == 5 and ops.opens == 1
    _settle()
    ro.refresh()                       # lists again (the open's listing was not yet trusted)
    ops.stats = ops.opens = 0
    for _ in range(5):
        ro.refresh()
    assert (ops.stats, ops.opens) == (0, 0)
    _append(lg, 1)                     # the active segment grows: the directory does not change
    ro.refresh()
    assert (ops.stats, ops.opens, ro.log_end_offset) == (0, 0, 21)
    lg.delete_records(8)
    ro.refresh()
    assert (ops.opens, ro.log_start_offset) == (1, 8)
    lg.close()
    ro.close()


@pytest.mark.parametrize("after", [3, 80])
def test_a_kept_reader_follows_a_truncation_below_its_start(tmp_path, after):
    """A writer's truncation below the log start (Kafka's truncateFullyAndStartAt) is the one
    change that lowers a start: a kept read-only log shows what a fresh one shows, whether the
    appends since stay below the old start (3) or pass it (80); its start is never raised past
    what the writer's files say."""
    path = str(tmp_path / "t-0")
    lg = _writer_log(path)
    _append(lg, 60)
    start = lg.segments[2].base_offset + 1
    lg.delete_records(start)
    ro = kstore.Log.open(path, read_only=True)
    assert ro.log_start_offset == start
    lg.truncate_to(2)
    assert (lg.log_start_offset, lg.log_end_offset) == (2, 2)
    _append(lg, after)
    ro.refresh()
    fresh = kstore.Log.open(path, read_only=True)
    assert _view(ro) == _view(fresh)
    assert (ro.log_start_offset, ro.log_end_offset) == (2, 2 + after)
    fresh.close()
    ro.close()
    lg.close()


def test_a_kept_store_reader_follows_a_writer_process_truncating_below_the_start(tmp_path, watchdog):
    """The same through a StoreReader beside a LogManager in another process (its checkpoint
    lowered before the cut): after the writer truncates below the start and appends 80
    records, the kept log's next refresh shows exactly the writer's log (old code: from 32)."""
    from writer_process import WriterProcess
    watchdog(120)
    d = str(tmp_path / "store")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run("m.create_topic('t', 1, {'segment.bytes': 2000})", "lg = m.log('t', 0)",
              "for i in range(60): lg.append([(b'k', b'%d;' % i * 20, 1)])",
              "assert lg.delete_records(32) == 32")
        with kstore.StoreReader(d) as store:
            kept = store.log("t", 0)
            assert store.offsets("t", 0) == (32, 60)
            w.run("lg.truncate_to(2)",
                  "for i in range(80): lg.append([(b'k', b'new%d' % i, 1)])")
            store.refresh()
            assert store.log("t", 0) is kept
            assert store.offsets("t", 0) == (2, 82)
            got = [(r.offset, r.value) for r in kept.read(2, 1000)]
            assert got == [(2 + i, b"new%d" % i) for i in range(80)]
    finally:
        assert w.close() == 0
