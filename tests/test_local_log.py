"""LocalLog: roll rules, flush and the recovery point, truncation, retention and DeleteRecords,
the writer's locks (Kafka's LocalLogTest and UnifiedLogTest cases)."""
import json
import os
import struct
import threading
import time as _time

import pytest

import kstore
from kstore import _core
from kstore.clock import MockTime
from kstore.errors import OffsetOutOfRangeError
from kstore.fileio import FileOps

from kstore.errors import LogDirLockedError
from kstore.manager import LogManager
from log_helpers import NOW, files, log_with_stale_index_entry, values
from thread_watchdog import join_all


def test_partition_directory_layout(open_log, log_dir):
    log = open_log({"segment.bytes": 200})
    for i in range(5):
        log.append([(b"k", b"x" * 100, NOW + i)])
    bases = [s.base_offset for s in log.segments]
    assert bases == [0, 1, 2, 3, 4]
    log.close()
    want = []
    for b in bases:
        want += [f"{b:020d}.index", f"{b:020d}.log", f"{b:020d}.timeindex"]
    assert files(log_dir) == sorted(want)



def test_segment_paths_are_kafka_names(open_log, log_dir):
    """A segment's three paths (built from one join at construction) are Kafka's names, also
    for a suffixed segment (a .swap, say)."""
    from kstore.fileio import FileOps
    from kstore.segment import LogSegment
    log = open_log({"segment.bytes": 200})
    log.append([(b"k", b"x" * 100, NOW)])
    log.append([(b"k", b"x" * 100, NOW)])
    seg = log.segments[-1]
    stem = os.path.join(log_dir, "00000000000000000001")
    assert (seg.log_path, seg.offset_index_path, seg.time_index_path) == (
        stem + ".log", stem + ".index", stem + ".timeindex")
    swap = LogSegment(log_dir, 7, log.config, io=FileOps(), time=MockTime(),
                      rng=log.rng, suffix=".swap")
    try:
        stem = os.path.join(log_dir, "00000000000000000007")
        assert (swap.log_path, swap.offset_index_path, swap.time_index_path) == (
            stem + ".log.swap", stem + ".index.swap", stem + ".timeindex.swap")
        assert os.path.getsize(swap.log_path) == 0 and swap.size == 0
    finally:
        swap.close_handlers()
        os.unlink(os.path.join(log_dir, "00000000000000000007.log.swap"))


def test_logs_share_one_jitter_source(open_log, tmp_path):
    """The roll jitter comes from one process-wide generator (Kafka: ThreadLocalRandom), not
    one seeded per log at open; each segment's jitter stays within [0, segment.jitter.ms)."""
    cfg = {"segment.ms": 3_600_000, "segment.jitter.ms": 1_000}
    a = open_log(cfg, path=str(tmp_path / "t-0"))
    b = open_log(cfg, path=str(tmp_path / "t-1"))
    assert a.rng is b.rng
    for lg in (a, b):
        for _ in range(3):
            lg.roll()
        assert all(0 <= s.roll_jitter_ms < 1_000 for s in lg.segments)


# -- roll -------------------------------------------------------------------------------------------
def test_size_based_roll(open_log):
    """testSizeBasedLogRoll: a segment holds what fits in segment.bytes."""
    probe = _core.BatchBuilder()
    probe.build([(None, b"x" * 100, NOW)], 2, 0, NOW, False, 0, 1 << 62, False, 0)
    size = probe.size
    log = open_log({"segment.bytes": size * 3})
    for _i in range(10):
        log.append([(None, b"x" * 100, NOW)])
    assert [s.base_offset for s in log.segments] == [0, 3, 6, 9]
    assert all(s.size == size * 3 for s in log.segments[:-1])


def test_time_based_roll_with_jitter(open_log):
    """testTimeBasedLogRollJitter: roll once the first batch is segment.ms - jitter old."""
    t = MockTime(NOW)
    log = open_log({"segment.ms": 3_600_000, "segment.jitter.ms": 1_800_000}, time=t)
    log.append([(None, b"a", t.milliseconds())])
    jitter = log.active_segment.roll_jitter_ms
    assert 0 <= jitter < 1_800_000
    t.advance(3_600_000 - jitter)            # exactly segment.ms - jitter: not yet
    log.append([(None, b"b", t.milliseconds())])
    assert len(log.segments) == 1
    t.advance(1)
    log.append([(None, b"c", t.milliseconds())])
    assert [s.base_offset for s in log.segments] == [0, 2]


def test_time_roll_uses_message_timestamps_not_wall_clock(open_log):
    t = MockTime(NOW)
    log = open_log({"segment.ms": 1000}, time=t)
    log.append([(None, b"a", 5_000)])
    t.advance(10_000)
    log.append([(None, b"b", 5_500)])        # only 500 ms after the first batch's timestamp
    assert len(log.segments) == 1
    log.append([(None, b"c", 6_001)])
    assert len(log.segments) == 2


def test_roll_when_offset_index_full(open_log):
    log = open_log({"segment.index.bytes": 8 * 3, "index.interval.bytes": 1})
    for _i in range(12):
        log.append([(None, b"x" * 20, NOW)])
    for s in log.segments[:-1]:
        assert s.offset_index.entries <= 3
    assert len(log.segments) > 2
    assert values(log) == [b"x" * 20] * 12


def test_should_roll_on_relative_offset_overflow(open_log):
    log = open_log()
    seg = log.active_segment
    assert seg.should_roll(10, NOW, (1 << 31), NOW)
    assert not seg.should_roll(10, NOW, (1 << 31) - 1, NOW)


def test_roll_segment_that_already_exists(open_log):
    """testRollSegmentThatAlreadyExists (KAFKA-6388)."""
    log = open_log()
    assert len(log.segments) == 1
    log.roll(0)                                  # empty active at 0: recreated, no error
    assert [s.base_offset for s in log.segments] == [0]
    log.append([(None, b"a", NOW)])
    log.roll(1)
    assert [s.base_offset for s in log.segments] == [0, 1]
    log.roll(1)                                  # again: the active one is empty → recreated
    assert [s.base_offset for s in log.segments] == [0, 1]
    log.append([(None, b"b", NOW)])
    # a requested base below the log end rolls at the log end (new base = max(expected, LEO))
    seg = log.roll(0)
    assert seg.base_offset == 2
    assert [s.base_offset for s in log.segments] == [0, 1, 2]
    assert values(log) == [b"a", b"b"]


def test_roll_trims_old_segment_files(open_log, log_dir):
    log = open_log({"segment.index.bytes": 4096, "index.interval.bytes": 1})
    for i in range(5):
        log.append([(None, b"x" * 10, NOW + i)])
    log.roll()
    old = log.segments[0]
    assert os.path.getsize(old.offset_index_path) == 8 * old.offset_index.entries
    assert os.path.getsize(old.time_index_path) == 12 * old.time_index.entries
    assert os.path.getsize(old.log_path) == old.size
    active = log.active_segment
    assert os.path.getsize(active.offset_index_path) == 4096
    assert os.path.getsize(active.time_index_path) == 4092


def test_index_resizing_at_truncation(open_log):
    """testIndexResizingAtTruncation: the truncated-into segment's indexes go back to max size."""
    log = open_log({"segment.index.bytes": 1200, "index.interval.bytes": 1, "segment.bytes": 1 << 20})
    for i in range(3):
        log.append([(None, b"x" * 20, NOW + i)])
    log.roll()
    for i in range(3):
        log.append([(None, b"y" * 20, NOW + 10 + i)])
    first = log.segments[0]
    assert first.offset_index.length == 8 * first.offset_index.entries
    log.truncate_to(2)
    assert len(log.segments) == 1
    assert first.offset_index.length == 1200 and first.time_index.length == 1200
    assert log.log_end_offset == 2
    log.append([(None, b"z", NOW + 20)])
    assert values(log) == [b"x" * 20, b"x" * 20, b"z"]


# -- flush / recovery point ------------------------------------------------------------------------
def test_flush_advances_recovery_point(open_log):
    log = open_log()
    log.append([(None, b"a"), (None, b"b")])
    assert log.recovery_point == 0
    log.flush()
    assert log.recovery_point == 2
    log.append([(None, b"c")])
    log.roll()
    assert log.recovery_point == 3      # roll flushes everything below the new segment


def test_flush_messages_triggers_flush(open_log):
    log = open_log({"flush.messages": 3})
    log.append([(None, b"a")])
    log.append([(None, b"b")])
    assert log.recovery_point == 0
    log.append([(None, b"c")])
    assert log.recovery_point == 3


# -- truncation, deletion, retention ----------------------------------------------------------------
def test_truncate_to_across_segments(open_log):
    log = open_log({"segment.bytes": 300})
    for i in range(20):
        log.append([(None, b"v%d" % i, NOW + i)])
    n = len(log.segments)
    assert not log.truncate_to(25)
    assert log.truncate_to(7)
    assert log.log_end_offset == 7 and len(log.segments) < n
    assert values(log) == [b"v%d" % i for i in range(7)]
    log.append([(None, b"again", NOW)])
    assert log.read(7)[0].value == b"again"
    log.truncate_to(0)
    assert log.log_end_offset == 0 and values(log) == []


def test_truncate_fully_and_start_at(open_log):
    log = open_log()
    log.append([(None, b"a")])
    log.truncate_fully_and_start_at(1000)
    assert (log.log_start_offset, log.log_end_offset) == (1000, 1000)
    log.append([(None, b"b")])
    assert log.read(1000)[0].value == b"b"
    assert log.segments[0].base_offset == 1000


def test_delete_records_and_persistence(open_log, log_dir):
    log = open_log({"segment.bytes": 300})
    for i in range(20):
        log.append([(None, b"v%d" % i, NOW + i)])
    n = len(log.segments)
    assert log.delete_records(9) == 9
    assert len(log.segments) < n
    assert log.segments[0].base_offset <= 9
    with pytest.raises(OffsetOutOfRangeError):
        log.read(8)
    assert log.read(9)[0].value == b"v9"
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records(21)
    log.close()
    log = open_log({"segment.bytes": 300})
    assert log.log_start_offset == 9


def _crash(log):
    """What a kill -9 leaves: nothing flushed or written at close, no clean-shutdown marker."""
    log.close_handlers()


def test_a_standalone_logs_start_survives_a_crash(open_log, log_dir):
    """A standalone log has no LogManager checkpoint: DeleteRecords and truncations save its
    start in the partition directory (.kstore-log-start, written atomically) when they move
    it, so a crash does not bring back the records below it (before: the start came back to
    the first segment's base, 0, after any unclean shutdown)."""
    path = os.path.join(log_dir, ".kstore-log-start")
    log = open_log()
    for i in range(10):
        log.append([(None, b"v%d" % i, NOW + i)])
    log.flush()
    assert log.delete_records(4) == 4
    assert open(path).read() == '{"version": 0, "log_start_offset": 4}'
    _crash(log)
    log = open_log()
    assert (log.log_start_offset, log.log_end_offset) == (4, 10)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(3)
    assert log.read(4)[0].value == b"v4"
    # a truncation below the start lowers it: saved too (else the reload would find its log
    # end below a stale start and drop everything appended since)
    log.truncate_to(2)
    assert (log.log_start_offset, log.log_end_offset) == (2, 2)
    log.append([(None, b"w2", NOW)])
    log.flush()
    _crash(log)
    log = open_log()
    assert [(r.offset, r.value) for r in log.read(2)] == [(2, b"w2")]
    log.truncate_fully_and_start_at(100)
    log.append([(None, b"x", NOW)])
    log.flush()
    _crash(log)
    log = open_log()
    assert (log.log_start_offset, log.log_end_offset) == (100, 101)
    assert open(path).read() == '{"version": 0, "log_start_offset": 100}'
    log.close()


@pytest.mark.parametrize("content", [b"garbage", b'{"version": 0, "log_start_offset": -3}',
                                     b'{"log_start_offset": "5"}', b"[5]", b"\xff\xfe",
                                     b'{"log_start_offset": 5}' + b" " * 5000])
def test_an_unreadable_log_start_file_is_ignored_with_a_warning(open_log, log_dir, content, caplog):
    """Bytes from disk are hostile: a start file that does not hold a start (torn, wrong type,
    negative, over 4 KiB) is ignored; the segments bound the start."""
    log = open_log()
    log.append([(None, b"v", NOW)] * 5)
    log.flush()
    _crash(log)
    with open(os.path.join(log_dir, ".kstore-log-start"), "wb") as f:
        f.write(content)
    with caplog.at_level("WARNING", logger="kstore"):
        log = open_log()
    assert (log.log_start_offset, log.log_end_offset) == (0, 5)
    assert "ignoring unreadable log start file" in caplog.text
    log.close()


def test_a_managed_open_drops_a_standalone_start_file(tmp_path):
    """Under a LogManager the log-start checkpoint rules: a start file left by an earlier
    standalone life of the partition is removed at the open, so a later standalone open after
    a crash cannot take a stale start from it."""
    d = tmp_path / "store"
    with kstore.Log.open(str(d / "t-0")) as log:
        log.append([(None, b"v", NOW)] * 5)
        log.delete_records(3)
    assert os.path.exists(d / "t-0" / ".kstore-log-start")
    with kstore.LogManager(str(d)) as m:
        assert m.log("t", 0).log_end_offset == 5
        assert not os.path.exists(d / "t-0" / ".kstore-log-start")


def test_delete_records_from_threads_saves_the_last_start(open_log, log_dir, watchdog):
    """Threads moving one standalone log's start at once: the saved start is the log's final
    one (each write holds the start it read under the flush lock, so writes land in order)."""
    import threading
    from thread_watchdog import join_all
    watchdog(60)
    log = open_log({"segment.bytes": 2000})
    for _ in range(40):
        log.append([(None, b"v", NOW)] * 10)

    def deleter(k):
        for _ in range(40):
            log.delete_records(min(log.log_end_offset, log.log_start_offset + k))
            log.append([(None, b"a", NOW)])
    ts = [threading.Thread(target=deleter, args=(k,), name=f"deleter-{k}") for k in (1, 2, 3)]
    for t in ts:
        t.start()
    join_all(ts, 50)
    saved = json.loads(open(os.path.join(log_dir, ".kstore-log-start")).read())
    assert saved == {"version": 0, "log_start_offset": log.log_start_offset}
    assert log.log_start_offset > 40


class _FlushGateOps(FileOps):
    """Holds the named thread's directory fsyncs (a flush's, after its segments' and before it
    takes the log lock; a DeleteRecords', after its lock) until go is set; entered: it waits."""

    def __init__(self, thread="flusher"):
        self.entered, self.go = threading.Event(), threading.Event()
        self.thread = thread
        self.atomic = threading.local()

    def write_atomic(self, path, data):
        self.atomic.on = True            # its directory fsync is not held
        try:
            return super().write_atomic(path, data)
        finally:
            self.atomic.on = False

    def fsync_dir(self, path):
        if threading.current_thread().name == self.thread and not self.go.is_set() \
                and not getattr(self.atomic, "on", False):
            self.entered.set()
            assert self.go.wait(30)
        return super().fsync_dir(path)


def test_a_truncation_below_the_first_segment_beside_a_flush(log_dir, watchdog):
    """truncate_to below the first segment's base (after retention or DeleteRecords removed
    segment 0) beside a flush: both finish, and the new start is saved (the truncation used
    to save it holding the log lock, waiting for the flush lock, which the flush held while
    it waited for the log lock: both threads hung)."""
    watchdog(60)
    ops = _FlushGateOps()
    log = kstore.Log.open(log_dir, {"segment.bytes": 2000}, io=ops)
    for _ in range(40):
        log.append([(None, b"v", NOW)] * 10)
    log.flush()
    cut = log.segments[2].base_offset
    assert log.delete_records(cut) == cut and log.segments[0].base_offset == cut
    n = len(log.segments)
    while len(log.segments) == n:                # a new segment: the flush fsyncs the dir
        log.append([(None, b"w", NOW)] * 10)
    flusher = threading.Thread(target=log.flush, name="flusher", daemon=True)
    flusher.start()
    assert ops.entered.wait(10)                  # holds _flush_lock, the log lock released
    truncator = threading.Thread(target=log.truncate_to, args=(5,), name="truncator", daemon=True)
    truncator.start()
    deadline = _time.monotonic() + 0.5
    while log.log_end_offset != 5 and _time.monotonic() < deadline:
        _time.sleep(0.005)
    ops.go.set()                    # the truncator waits for the flush lock (or did truncate)
    join_all([flusher, truncator], 10)
    assert (log.log_start_offset, log.log_end_offset) == (5, 5)
    assert json.loads(open(os.path.join(log_dir, ".kstore-log-start")).read())["log_start_offset"] == 5
    log.append([(None, b"x", NOW)])
    log.flush()
    log.close_handlers()                          # a crash: the saved start is what reopens
    with kstore.Log.open(log_dir) as log:
        assert (log.log_start_offset, log.log_end_offset) == (5, 6)
        assert [r.value for r in log.read(5)] == [b"x"]


def test_a_close_beside_a_delete_records_leaves_no_stale_start_for_the_next_writer(log_dir, watchdog):
    """close() while another thread's delete_records is past the log lock: the start is saved
    before close can write its marker and release the partition, so nothing is written into
    the directory after the next writer took it (the save used to come after the deletion's
    directory fsync, unlocked: it wrote the old log's start over the next writer's, whose
    reopen after a crash found its log end below that start and dropped every record)."""
    watchdog(60)
    ops = _FlushGateOps("deleter")
    log = kstore.Log.open(log_dir, {"segment.bytes": 2000}, io=ops)
    for _ in range(40):
        log.append([(None, b"v", NOW)] * 10)
    log.flush()
    cut = log.segments[2].base_offset
    deleter = threading.Thread(target=log.delete_records, args=(cut,), name="deleter", daemon=True)
    deleter.start()
    assert ops.entered.wait(10)                  # segments retired, the log lock released
    log.close()
    nxt = kstore.Log.open(log_dir)               # the next writer of the partition
    assert (nxt.log_start_offset, nxt.log_end_offset) == (cut, 400)
    assert nxt.truncate_to(5)                    # below the first segment: starts again at 5
    nxt.append([(None, b"n%d" % i, NOW) for i in range(3)])
    nxt.flush()
    ops.go.set()
    join_all([deleter], 10)
    nxt.close_handlers()                         # a crash of the next writer
    with kstore.Log.open(log_dir) as lg:
        assert (lg.log_start_offset, lg.log_end_offset) == (5, 8)
        assert values(lg) == [b"n0", b"n1", b"n2"]


def test_retention_by_size(open_log):
    """testCleanupSegmentsToMaintainSize in Log form."""
    log = open_log({"segment.bytes": 400, "retention.bytes": 1000}, time=MockTime(NOW + 100))
    for i in range(40):
        log.append([(None, b"x" * 50, NOW + i)])
    before = log.size
    seg_size = log.segments[0].size
    deleted = log.delete_old_segments()
    # Kafka's rule: delete oldest-first while (size - retention.bytes - segment size) >= 0
    assert deleted == (before - 1000) // seg_size
    assert log.size >= 1000 and log.size - seg_size < 1000
    assert log.log_start_offset == log.segments[0].base_offset
    assert values(log)[-1] == b"x" * 50


def test_retention_by_time_with_mock_clock(open_log):
    t = MockTime(NOW)
    log = open_log({"segment.bytes": 400, "retention.ms": 10_000}, time=t)
    for i in range(20):
        log.append([(None, b"x" * 50, NOW + i)])
    t.advance(5_000)
    assert log.delete_old_segments() == 0
    t.advance(6_000)
    # every segment is expired: the log rolls first, so an empty active segment remains at LEO
    deleted = log.delete_old_segments()
    assert deleted >= 2
    assert [s.base_offset for s in log.segments] == [20]
    assert log.log_start_offset == log.log_end_offset == 20
    log.append([(None, b"after", t.milliseconds())])
    assert values(log) == [b"after"]


def test_compact_policy_skips_time_and_size_retention(open_log):
    t = MockTime(NOW)
    log = open_log({"segment.bytes": 400, "retention.ms": 1, "retention.bytes": 1,
                    "cleanup.policy": "compact"}, time=t)
    for i in range(20):
        log.append([(b"k", b"x" * 50, NOW + i)])
    t.advance(100_000)
    assert log.delete_old_segments() == 0


def test_stale_index_entry_never_makes_truncation_keep_records(open_log, log_dir):
    """truncate_to and read_batches locate batches through the same checked index position as
    reads: an entry pointing at a later batch must not move the cut."""
    log = log_with_stale_index_entry(open_log, log_dir)
    assert struct.unpack(">q", bytes(log.read_batches(5, 1))[:8])[0] == 5
    log.truncate_to(5)
    assert log.log_end_offset == 5
    assert [r.offset for r in log.read(0, max_bytes=1 << 20)] == list(range(5))


@pytest.mark.parametrize("fail_at", range(8))
def test_truncate_to_failing_at_each_file_operation_leaves_old_or_new(tmp_path, fail_at):
    """Truncation writes <segment>.log.tmp, fsyncs it, renames it over the segment and fsyncs the
    directory. An I/O error at any of its file operations fails the log with
    KafkaStorageError; reopening finds the records as before the cut or as after it (never a
    mix, never the temporary file), every record below the cut intact."""
    from kstore.errors import KafkaStorageError
    from kstore.fileio import FileOps

    class FailFrom(FileOps):
        armed, n = False, 0

        def _tick(self):
            if self.armed:
                self.n += 1
                if self.n > fail_at:
                    raise OSError(5, "Input/output error (injected)")

    for name in ("open", "pwrite", "fsync", "rename", "fsync_dir", "map", "close", "unlink"):
        def wrap(name=name):
            base = getattr(FileOps, name)

            def op(self, *a, **kw):
                self._tick()
                return base(self, *a, **kw)
            return op
        setattr(FailFrom, name, wrap())
    d = str(tmp_path / "t-0")
    ops = FailFrom()
    lg = kstore.Log.open(d, {"segment.bytes": 1 << 20}, io=ops)
    for o in range(10):
        lg.append([(None, b"%d" % o, NOW + o)])
    lg.flush()
    ops.armed = True
    try:
        lg.truncate_to(4)
        ops.armed = False
        lg.close()
    except KafkaStorageError:
        ops.armed = False
        lg.close_handlers()
    with kstore.Log.open(d) as lg:
        got = [(r.offset, r.value) for r in lg.read(0, max_bytes=1 << 20)]
        assert got in ([(o, b"%d" % o) for o in range(4)], [(o, b"%d" % o) for o in range(10)])
        assert not [n for n in os.listdir(d) if n.endswith(".tmp")]


def test_a_second_writable_open_in_this_process_is_refused(tmp_path):
    path = str(tmp_path / "t-0")
    first = kstore.Log.open(path)
    first.append([(b"k", b"v")])
    with pytest.raises(LogDirLockedError, match=f"cannot open {path} for writing: another writer"):
        kstore.Log.open(path)
    with kstore.Log.open(path, read_only=True) as ro:          # readers take no lock
        assert [r.value for r in ro.read(0)] == [b"v"]
    first.append([(b"k", b"w")])                              # the owner is untouched
    first.close()
    with kstore.Log.open(path) as again:
        assert [r.value for r in again] == [b"v", b"w"]
    assert sorted(os.listdir(path)) == [".kstore-clean-shutdown", ".kstore-notify",
                                        "00000000000000000000.index", "00000000000000000000.log",
                                        "00000000000000000000.timeindex", "leader-epoch-checkpoint"]


def test_a_refused_open_holds_no_lock(tmp_path):
    """The second open got the log dir's shared lock, then failed on the partition's: it must
    let go of both, or a LogManager could never start after the first writer closes."""
    path = str(tmp_path / "t-0")
    first = kstore.Log.open(path)
    for _ in range(3):
        with pytest.raises(LogDirLockedError):
            kstore.Log.open(path)
    first.close()
    with LogManager(str(tmp_path), {"log.initial.task.delay.ms": 1 << 40}) as m:
        assert m.topics() == ["t"]


def test_flush_racing_a_truncation_leaves_the_recovery_point_at_the_cut(tmp_path):
    """A flush whose fsyncs ran while another thread truncated the log published its old end
    as the recovery point: above the new log end, so the records appended next were treated
    as durable (flush() returned without an fsync, and recovery after a crash skips them)."""
    from kstore.fileio import FileOps

    class TruncateDuringFsync(FileOps):
        armed = None

        def fsync(self, fd):
            super().fsync(fd)
            if self.armed is not None:
                action, self.armed = self.armed, None
                action()

    io = TruncateDuringFsync()
    # managed: a standalone log's truncation waits for a flush (its start is saved under
    # _flush_lock), so only a LogManager's log can truncate during the flush's fsyncs
    lg = kstore.Log.open(str(tmp_path / "t-0"), {}, io=io, clean_shutdown=False, recovery_point=0)
    try:
        for o in range(10):
            lg.append([(None, b"v%d" % o, NOW)])
        lg.flush(5)
        assert lg.recovery_point == 5
        io.armed = lambda: lg.truncate_to(7)
        lg.flush()
        assert io.armed is None
        assert (lg.log_end_offset, lg.recovery_point) == (7, 5)
        for o in range(7, 10):
            lg.append([(None, b"w%d" % o, NOW)])
        synced = []
        io.armed = lambda: synced.append(True)
        lg.flush()
        assert synced == [True] and lg.recovery_point == 10
    finally:
        lg.close()


def test_unflushed_messages_count_from_the_recovery_point(tmp_path):
    """Kafka's unflushedMessages: log end minus recovery point; a flush brings it to 0."""
    log = kstore.Log.open(str(tmp_path / "t-0"))
    log.append([(None, b"a", NOW), (None, b"b", NOW)])
    log.append([(None, b"c", NOW)])
    assert log.unflushed_messages == 3
    log.flush()
    assert log.unflushed_messages == 0 and log.recovery_point == 3
    log.close()


def test_a_partition_dir_made_by_another_opener_meanwhile_is_used(tmp_path):
    """Another process's open makes the partition directory between this open's look and its
    mkdir (and has closed since): the open goes on in it. Before, the mkdir's EEXIST failed the
    open as a failing disk (KafkaStorageError)."""

    class OtherMakesItFirst(FileOps):
        def mkdir(self, path):
            os.mkdir(path)                  # the other opener, first
            super().mkdir(path)
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path, io=OtherMakesItFirst()) as lg:
        assert lg.append([(b"k", b"v")]).first_offset == 0
    with kstore.Log.open(path) as lg:
        assert [r.value for r in lg] == [b"v"]


def test_truncate_fully_past_the_end_deletes_the_oldest_segment_first(log_dir):
    """truncate_fully_and_start_at past the log end moves the start up: every listing of the
    directory a reader can take meanwhile holds the newest segments (the start moved up, the
    end not down), as retention leaves it. Before, the active segment went first: a reader in
    between saw the log end below its position, reset to the log start and read records
    again (test_read_committed_races)."""
    from kstore.fileio import FileOps
    listings = []

    class Watch(FileOps):
        def unlink(self, path):
            super().unlink(path)
            if path.endswith(".log"):
                listings.append(sorted(int(f[:20]) for f in os.listdir(log_dir) if f.endswith(".log")))

    with kstore.Log.open(log_dir, {"segment.bytes": 200}, io=Watch()) as lg:
        for i in range(12):
            lg.append([(None, b"v%d" % i * 10, NOW)])
        bases = [s.base_offset for s in lg.segments]
        assert len(bases) >= 3
        lg.truncate_fully_and_start_at(lg.log_end_offset + 5)
        assert listings == [bases[i + 1:] for i in range(len(bases))]
        assert (lg.log_start_offset, lg.log_end_offset) == (17, 17)
