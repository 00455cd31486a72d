"""LogManager under races and crashes (reliability tier; moved from test_manager.py): processes
killed while holding the lock or appending, a read-only manager beside a writing process, a
crash at every file operation of delete_topic, and threads racing appends, topic churn, the
scheduled tasks, checkpoints, the cleaner and close."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time as _time

import pytest

from kstore.checkpoint import OffsetCheckpointFile
from kstore.clock import MockTime
from kstore.errors import KStoreStateError, LogDirLockedError, UnknownTopicError
from kstore.fileio import FileOps
from kstore.manager import LogManager
from kstore.partitioner import partition_for_key
from kstore.scheduler import MockScheduler

from manager_helpers import NOW, manager
from thread_watchdog import run_threads



# -- processes killed ------------------------------------------------------------------------------
def test_lock_dies_with_a_killed_process(tmp_path):
    child = textwrap.dedent(f"""
        import kstore, time
        m = kstore.LogManager({str(tmp_path)!r})
        print("locked", flush=True)
        time.sleep(60)
    """)
    p = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, cwd=str(tmp_path.parent))
    assert p.stdout.readline().strip() == b"locked"
    with pytest.raises(LogDirLockedError):
        LogManager(str(tmp_path))
    p.send_signal(signal.SIGKILL)
    p.wait()
    p.stdout.close()
    LogManager(str(tmp_path)).close()


WRITER = r"""
import sys, kstore
m = kstore.LogManager(sys.argv[1], {"log.segment.bytes": "20000"})
if "t" not in m.topics():
    m.create_topic("t", 2)
i = 0
while True:
    md = m.append("t", None, b"%d" % i, partition=i % 2)
    print(md.partition, md.offset, flush=True)
    i += 1
"""


def test_restart_after_kill_9_of_an_appending_process(tmp_path):
    for _round in range(2):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                             cwd=str(tmp_path.parent))
        acked = {0: -1, 1: -1}
        n = 0
        for line in p.stdout:
            part, off = map(int, line.split())
            acked[part] = off
            n += 1
            if n >= 3000:
                break
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        assert not (tmp_path / ".kafka_cleanshutdown").exists()
        with LogManager(str(tmp_path)) as m:
            for part in (0, 1):
                got = [r.offset for r in m.log("t", part)]
                assert got == list(range(len(got)))
                assert len(got) >= acked[part] + 1


# -- a read-only manager beside a writing process ---------------------------------------------------
APPENDER = r"""
import sys, kstore
m = kstore.LogManager(sys.argv[1], {"log.segment.bytes": "30000", "log.index.interval.bytes": "500"})
if "t" not in m.topics():
    m.create_topic("t", 1)
i = 0
while True:
    m.append("t", None, (b"%d-" % i) * (1 + i % 40), partition=0)
    i += 1
    if i % 500 == 0:
        print(i, flush=True)
"""


def test_read_only_manager_beside_an_appending_process(tmp_path):
    p = subprocess.Popen([sys.executable, "-c", APPENDER, str(tmp_path)], stdout=subprocess.PIPE,
                         cwd=str(tmp_path.parent))
    try:
        assert p.stdout.readline()
        ro = LogManager(str(tmp_path), read_only=True)
        with ro:
            lg = ro.log("t", 0)
            with pytest.raises(KStoreStateError):
                lg.append([(None, b"no")])
            offset, seen_segments = 0, set()
            deadline = _time.time() + 4
            while _time.time() < deadline or offset < 5000:
                for r in lg.read(offset, max_records=1000):
                    assert r.offset == offset
                    assert r.value == (b"%d-" % offset) * (1 + offset % 40)   # never torn
                    offset += 1
                seen_segments.add(len(lg.segments))
                if _time.time() > deadline + 20:
                    break
            assert offset >= 5000 and max(seen_segments) > 1
        assert not (tmp_path / ".kafka_cleanshutdown").exists()      # a read-only manager writes nothing
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()


def test_crash_anywhere_in_delete_topic_leaves_the_topic_whole_or_gone(tmp_path):
    """Crash at every file operation of delete_topic (process kill and power loss): the reopened
    store has all three partitions of the topic with their records, or none (and no `t-N` dir
    left), and keyed appends work either way."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from crash_harness import TracingOps, explore
    cfg = {"log.segment.delete.delay.ms": 0, "file.delete.delay.ms": 0, "log.cleaner.enable": False}
    root = str(tmp_path / "w")
    os.makedirs(root)
    t = MockTime(NOW)
    with LogManager(root, cfg, time=t, scheduler=MockScheduler(t)) as m:
        m.create_topic("keep", 1)
        m.create_topic("t", 3)
        for p in range(3):
            m.append_batch("t", p, [(b"k%d" % p, b"v%d" % p, NOW)])
        m.append_batch("keep", 0, [(None, b"kept", NOW)])
    ops = TracingOps(root)
    m = LogManager(root, cfg, io=ops, time=t, scheduler=MockScheduler(t))
    first = len(ops.snapshots)
    m.delete_topic("t")
    ops.mark("deleted", True)
    m.close()
    ops.finish()
    seen = {"whole": 0, "gone": 0}

    def check(state, snap, kind):
        with LogManager(state, cfg, time=t, scheduler=MockScheduler(t)) as m2:
            assert [r.value for r in m2.read("keep", 0, 0)] == [b"kept"]
            if "t" in m2.topics():
                assert not snap.marks.get("deleted"), "a deleted topic came back"
                assert m2.partitions("t") == [0, 1, 2]
                for p in range(3):
                    assert [(r.offset, r.value) for r in m2.read("t", p, 0)] == [(0, b"v%d" % p)]
                for i in range(12):
                    key = b"key-%d" % i
                    assert m2.append("t", key, b"x").partition == partition_for_key(key, 3)
                seen["whole"] += 1
            else:
                assert not [n for n in os.listdir(state) if n.startswith("t-") and "-delete" not in n]
                m2.create_topic("t", 2)
                assert m2.append("t", b"key", b"x").offset == 0
                seen["gone"] += 1

    tally = explore(ops.snapshots[first:], str(tmp_path), check, prefixes="ends")
    assert tally.states > 100 and seen["whole"] and seen["gone"], (tally, seen)


class WriterMidOpen(FileOps):
    """Runs a statement in the writer process the first time the read-only open touches a
    path: the writer's change lands exactly between the reader's scan and its use of it."""

    def __init__(self, writer, exists_of=None, listdir_of=None, statement=""):
        self.writer, self.statement = writer, statement
        self.exists_of, self.listdir_of = exists_of, listdir_of

    def _fire(self):
        if self.statement:
            st, self.statement = self.statement, ""
            self.writer.run(st)

    def exists(self, path):
        if self.exists_of and path.endswith(self.exists_of):
            self._fire()
        return super().exists(path)

    def listdir(self, path):
        names = super().listdir(path)
        if self.listdir_of and path.endswith(self.listdir_of):
            self._fire()                    # the listing the reader goes on with is now stale
        return names


@pytest.mark.parametrize("what", ["topic", "segments"])
def test_read_only_manager_opens_while_the_writer_deletes(tmp_path, watchdog, what):
    """Defect 10: a topic deleted (its directory renamed to -delete) or segments deleted by
    retention between the read-only manager's directory scan and its opening of them failed the
    open (KStoreError) or took the whole log dir offline (FileNotFoundError). Now what vanished
    is skipped: the manager opens, no dir is offline, and what remains reads exactly."""
    from writer_process import WriterProcess
    watchdog(60)
    w = WriterProcess(str(tmp_path), str(tmp_path))
    try:
        w.run("m.create_topic('keep', 1)", "m.create_topic('gone', 1)",
              "for o in range(60): m.log('keep', 0).append([(None, b'%d' % o)])",
              "m.log('gone', 0).append([(None, b'x')])")
        bases = [int(n[:20]) for n in sorted(os.listdir(tmp_path / "keep-0")) if n.endswith(".log")]
        assert len(bases) >= 4
        if what == "topic":
            ops = WriterMidOpen(w, exists_of="gone-0", statement="m.delete_topic('gone')")
        else:
            ops = WriterMidOpen(w, listdir_of="keep-0", statement=(
                f"lg = m.log('keep', 0); lg.delete_records({bases[2]}); lg.delete_old_segments()"))
        with LogManager(str(tmp_path), read_only=True, io=ops) as ro:
            assert not ops.statement, "the writer's change did not run mid-open"
            assert ro.offline_dirs == {}
            assert ro.topics() == (["keep"] if what == "topic" else ["gone", "keep"])
            lg = ro.log("keep", 0)
            start = 0 if what == "topic" else bases[2]
            assert (lg.log_start_offset, lg.log_end_offset) == (start, 60)
            assert [(r.offset, r.value) for r in lg.read(start, max_bytes=1 << 20)] == \
                [(o, b"%d" % o) for o in range(start, 60)]
    finally:
        assert w.close() == 0


# -- threads racing the manager (issue 12) ---------------------------------------------------------
@pytest.fixture
def fast_switches():
    """Switch threads every 10 µs, so that races show up within a short test."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


def test_scheduled_flusher_beside_appends_never_deadlocks(tmp_path, watchdog):
    """Defect 4: the flusher task (flush() takes _flush_lock, then _lock) against an appender
    that reaches flush.messages or rolls while holding _lock."""
    watchdog(60)
    cfg = {"log.flush.scheduler.interval.ms": 1, "log.flush.interval.ms": 0,
           "log.flush.interval.messages": 5, "log.segment.bytes": 2048,
           "log.initial.task.delay.ms": 0, "background.threads": 2}
    acked = []
    with LogManager(str(tmp_path), cfg) as m:
        m.create_topic("t", 1)

        def appender(stop):
            i = 0
            while not stop.is_set():
                info = m.append_batch("t", 0, [(b"k", b"%d" % i)])
                acked.append((info.first_offset, b"%d" % i))
                i += 1
        run_threads(2.0, appender)
        lg = m.log("t", 0)
        assert len(lg.segments) > 3
        assert [(r.offset, r.value) for r in lg] == acked
        assert [o for o, _ in acked] == list(range(len(acked)))
        assert m.offline_dirs == {}
    with LogManager(str(tmp_path), read_only=True) as m:
        assert [r.value for r in m.log("t", 0)] == [v for _, v in acked]


def test_create_and_delete_topics_beside_appends(tmp_path, watchdog, fast_switches):
    """Defect 14: ensure_topic/topics()/partitions() iterated the registry while create_topic
    and delete_topic changed it (RuntimeError: dictionary changed size during iteration)."""
    watchdog(60)
    acked = []
    with LogManager(str(tmp_path), {"log.initial.task.delay.ms": 1 << 40}) as m:
        m.create_topic("filler", 60)
        m.create_topic("steady", 3)

        def appender(stop):
            i = 0
            while not stop.is_set():
                key = b"k%d" % (i % 17)
                md = m.append("steady", key, b"%d" % i)
                assert md.partition == partition_for_key(key, 3)
                acked.append((md.partition, md.offset, b"%d" % i))
                assert "steady" in m.topics()
                i += 1

        def churn(stop):
            n = 0
            while not stop.is_set():
                m.create_topic(f"churn{n}", 2)
                m.delete_topic(f"churn{n}")
                n += 1
        run_threads(2.0, appender, churn)
        for p in range(3):
            mine = [(o, v) for q, o, v in acked if q == p]
            assert [(r.offset, r.value) for r in m.log("steady", p)] == mine
        assert m.topics() == ["filler", "steady"]
        assert m.offline_dirs == {}


def test_a_topic_is_seen_only_with_all_its_partitions(tmp_path, watchdog):
    """A keyed append racing create_topic used to see the topic after its first partition was
    made and hash the key over 1 partition instead of 8."""
    watchdog(60)
    with LogManager(str(tmp_path), {"auto.create.topics.enable": False,
                                    "log.initial.task.delay.ms": 1 << 40}) as m:
        got = []

        def appender(stop):
            while not stop.is_set():
                try:
                    got.append(m.append("x", b"key-7", b"v").partition)
                    return
                except UnknownTopicError:
                    continue
        t = threading.Thread(target=appender, args=(threading.Event(),), daemon=True)
        t.start()
        m.create_topic("x", 8)
        from thread_watchdog import join_all
        join_all([t], 30)
        assert got == [partition_for_key(b"key-7", 8)]


def test_concurrent_checkpoint_writers_keep_the_dir_online(tmp_path, watchdog):
    """Defect 12: two writers of one checkpoint shared its .tmp name; os.replace failed with
    ENOENT and the dir went offline."""
    watchdog(60)
    with LogManager(str(tmp_path), {"log.initial.task.delay.ms": 1 << 40}) as m:
        m.create_topic("a", 4)
        for p in range(4):
            m.append_batch("a", p, [(b"k", b"v")] * 3)
            m.log("a", p).delete_records(2)

        def writer(stop):
            while not stop.is_set():
                m.checkpoint_log_start_offsets()
                m.checkpoint_recovery_offsets()
        run_threads(1.5, writer, writer, writer)
        assert m.offline_dirs == {}
        assert OffsetCheckpointFile(str(tmp_path / "log-start-offset-checkpoint")).read() == \
            {("a", p): 2 for p in range(4)}
        assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]


class _HoldCheckpointRename(FileOps):
    """Holds the first rename onto a log-start-offset checkpoint until released."""

    def __init__(self):
        self.held = threading.Event()
        self.release = threading.Event()
        self.armed = False

    def rename(self, src, dst):
        if self.armed and dst.endswith("log-start-offset-checkpoint"):
            self.armed = False
            self.held.set()
            assert self.release.wait(30)
        super().rename(src, dst)


def test_an_older_checkpoint_snapshot_never_lands_after_a_newer_one(tmp_path, watchdog):
    """Defect 12: a log-start-offset checkpoint written from an older snapshot after a newer one
    goes backwards (deleted records come back after a crash)."""
    from thread_watchdog import join_all
    watchdog(60)
    io = _HoldCheckpointRename()
    with LogManager(str(tmp_path), {"log.initial.task.delay.ms": 1 << 40}, io=io) as m:
        m.create_topic("a", 1)
        m.append_batch("a", 0, [(b"k", b"v")] * 20)
        lg = m.log("a", 0)
        lg.delete_records(5)
        io.armed = True
        older = threading.Thread(target=m.checkpoint_log_start_offsets)   # snapshot: 5
        older.start()
        assert io.held.wait(30)
        # delete_records writes the checkpoint itself (snapshot: 10), after the older one's
        newer = threading.Thread(target=lg.delete_records, args=(10,))
        newer.start()
        _time.sleep(0.3)
        io.release.set()
        join_all([older, newer], 30)
        assert m.offline_dirs == {}
        assert OffsetCheckpointFile(str(tmp_path / "log-start-offset-checkpoint")).read() == {("a", 0): 10}


class _PauseFlushDirSync(FileOps):
    """The scheduler's first fsync of a partition dir waits until the test says go."""

    def __init__(self, part_dir):
        self.part_dir = part_dir
        self.paused = threading.Event()
        self.go = threading.Event()
        self.done = threading.Event()

    def fsync_dir(self, path):
        if (path == self.part_dir and threading.current_thread().name.startswith("kstore-scheduler")
                and not self.paused.is_set()):
            self.paused.set()
            assert self.go.wait(30)
            try:
                return super().fsync_dir(path)
            finally:
                self.done.set()
        return super().fsync_dir(path)


def test_delete_topic_after_a_roll_logs_nothing_above_info(tmp_path, watchdog, caplog):
    """Defect 20: the roll's scheduled flush ran against the renamed directory and logged an
    ERROR with a traceback for an ordinary deletion."""
    import logging
    watchdog(60)
    caplog.set_level(logging.DEBUG)
    io = _PauseFlushDirSync(str(tmp_path / "t-0"))
    m = LogManager(str(tmp_path), {"log.segment.bytes": 1024, "log.initial.task.delay.ms": 1 << 40},
                   io=io)
    m.create_topic("t", 1)
    while len(m.log("t", 0).segments) < 2:
        m.append_batch("t", 0, [(b"k", b"v" * 30)])
    assert io.paused.wait(30)        # the roll's flush is under way on the scheduler
    m.delete_topic("t")
    io.go.set()
    assert io.done.wait(30)
    m.close()                        # joins the scheduler's threads
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.INFO] == []
    assert m.offline_dirs == {} and m.topics() == []


def test_delete_topic_during_retention_keeps_the_dir_online(tmp_path, mock, caplog):
    """Retention's directory fsync runs after the log lock is released; a topic deleted in that
    window must not fail retention or take the dir offline (an ordinary deletion)."""
    import logging
    caplog.set_level(logging.DEBUG)
    box = {}

    class DeleteDuringDirSync(FileOps):
        armed = False

        def fsync_dir(self, path):
            if self.armed and path == str(tmp_path / "t-0"):
                self.armed = False
                box["m"].delete_topic("t")
            return super().fsync_dir(path)
    io = DeleteDuringDirSync()
    t, s = mock
    m = manager(str(tmp_path), {"log.segment.bytes": 1024, "log.retention.bytes": 1024}, mock=mock, io=io)
    box["m"] = m
    with m:
        m.create_topic("t", 1)
        m.create_topic("other", 1)
        for _ in range(60):
            m.append_batch("t", 0, [(b"k", b"v" * 30)])
        io.armed = True
        assert m.cleanup_logs() > 0
        assert not io.armed                          # the deletion did run inside retention
        assert m.topics() == ["other"] and m.offline_dirs == {}
        assert m.append("other", b"k", b"v").offset == 0
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.INFO] == []


def test_every_writer_side_task_at_once_keeps_the_lock_hierarchy(tmp_path, watchdog, caplog):
    """Appends (rolling, reaching flush.messages), the flusher and checkpoint tasks every ms,
    two cleaner threads, retention, delete_records, topic churn: nothing hangs, nothing goes
    offline, nothing is logged above INFO, every acknowledged record at or after the log start
    is read back at its offset."""
    import logging
    watchdog(90)
    caplog.set_level(logging.INFO)
    cfg = {"log.flush.scheduler.interval.ms": 1, "log.flush.interval.ms": 0,
           "log.flush.interval.messages": 3, "log.segment.bytes": 2048,
           "log.initial.task.delay.ms": 0, "background.threads": 3,
           "log.flush.offset.checkpoint.interval.ms": 1,
           "log.flush.start.offset.checkpoint.interval.ms": 1, "log.retention.check.interval.ms": 5,
           "log.cleaner.enable": True, "log.cleaner.threads": 2, "log.cleaner.backoff.ms": 1,
           "log.segment.delete.delay.ms": 0}
    acked = []
    with LogManager(str(tmp_path), cfg) as m:
        m.create_topic("plain", 1)
        m.create_topic("compact", 2, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01})

        def appender(stop):
            i = 0
            while not stop.is_set():
                info = m.append_batch("plain", 0, [(b"k", b"%d" % i)])
                acked.append((info.first_offset, b"%d" % i))
                m.append("compact", b"key%d" % (i % 5), b"%d" % i)
                i += 1

        def deleter(stop):
            while not stop.is_set():
                lg = m.log("plain", 0)
                lg.delete_records(max(lg.log_start_offset, lg.log_end_offset - 50))
                _time.sleep(0.01)

        def churn(stop):
            n = 0
            while not stop.is_set():
                m.create_topic(f"churn{n}", 1)
                m.append(f"churn{n}", b"k", b"v")
                m.delete_topic(f"churn{n}")
                n += 1
        run_threads(3.0, appender, deleter, churn)
        assert m.offline_dirs == {}
        assert m.uncleanable_partitions() == {}
        lg = m.log("plain", 0)
        start = lg.log_start_offset
        assert [(r.offset, r.value) for r in lg] == [a for a in acked if a[0] >= start]
        assert lg.log_end_offset == len(acked)
    assert [(r.levelname, r.getMessage()) for r in caplog.records if r.levelno > logging.INFO] == []


def test_close_beside_a_delete_topic_in_flight_is_no_key_error(tmp_path, watchdog):
    """close() took the registry's logs, then looked each one's dir up in the registry as
    published later: a delete_topic that was under way (past its closed check) unpublished a
    partition in between, and close raised a raw KeyError. Now the deleted partition's log is
    left to the deletion and the store closes cleanly."""
    import threading
    from thread_watchdog import join_all
    watchdog(60)
    gate, published = threading.Event(), threading.Event()

    class Interleave(FileOps):
        armed = False

        def write_atomic(self, path, data):
            if path.endswith("kstore-topic-config.json") and self.armed and \
                    threading.current_thread() is not threading.main_thread():
                gate.wait(20)          # delete_topic waits here until close has begun
            super().write_atomic(path, data)

        def rename(self, src, dst):
            super().rename(src, dst)
            if dst.endswith("-delete"):
                published.set()        # delete_topic has unpublished "b" and moved it

        def fsync(self, fd):
            super().fsync(fd)
            if self.armed and threading.current_thread() is threading.main_thread() \
                    and not gate.is_set():
                gate.set()             # close is closing "a": let delete_topic go on
                published.wait(20)

    io = Interleave()
    m = LogManager(str(tmp_path), io=io, scheduler=MockScheduler(MockTime()),
                   config={"log.cleaner.enable": False})
    m.create_topic("a", 1)
    m.create_topic("b", 1)
    m.append("a", None, b"x")
    errors = []

    def delete():
        try:
            m.delete_topic("b")
        except Exception as e:          # noqa: BLE001 - surfaced below
            errors.append(e)
    io.armed = True
    t = threading.Thread(target=delete, name="delete-b")
    t.start()
    while not any(f.f_code.co_name == "write_atomic" for f in _frames_of(t)):
        _time.sleep(0.01)
    m.close()
    join_all([t], 30)
    assert gate.is_set() and published.is_set()
    assert errors == []
    names = os.listdir(tmp_path)
    assert "a-0" in names and "b-0" not in names
    assert [n for n in names if n.startswith("b-0.") and n.endswith("-delete")]
    assert os.path.exists(tmp_path / ".kafka_cleanshutdown")


def _frames_of(thread):
    """The frames of a running thread's stack (innermost first)."""
    f = sys._current_frames().get(thread.ident)
    while f is not None:
        yield f
        f = f.f_back


_RACE_START = """
import sys, time, kstore
d, kind, go = sys.argv[1], sys.argv[2], float(sys.argv[3])
while time.time() < go:
    time.sleep(0.0005)
try:
    w = kstore.LogManager(d) if kind == "manager" else kstore.Log.open(d + "/t-0")
except kstore.KStoreError as e:
    print(type(e).__name__, flush=True)
else:
    print("opened", flush=True)
    sys.stdin.readline()
    w.close()
"""


def test_writers_racing_to_make_a_log_dir_one_opens_it(tmp_path, watchdog):
    """Two LogManagers and two standalone Logs (of a partition in it) start at the same instant
    on a log dir nobody made yet, six times: each time exactly one opens and the others get
    LogDirLockedError. Before, a manager whose mkdir of the log dir came second took the dir
    offline ("[Errno 17] File exists") and failed with LogDirOfflineError ("every log dir is
    offline"), as if its disk had failed."""
    watchdog(150)
    import kstore
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(kstore.__file__)))
    for round_ in range(6):
        d = str(tmp_path / f"r{round_}")
        go = _time.time() + 1.0
        kinds = ["manager", "log"] * 2 if round_ % 2 else ["manager"] * 4
        ps = [subprocess.Popen([sys.executable, "-c", _RACE_START, d, kind, str(go)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               cwd=str(tmp_path)) for kind in kinds]
        outs = [p.stdout.readline().strip() for p in ps]
        for p in ps:
            p.stdin.close()
            assert p.wait(30) == 0, p.stderr.read()
        assert sorted(outs) == ["LogDirLockedError"] * 3 + ["opened"], (round_, outs)


def test_a_log_dir_made_by_another_writer_meanwhile_is_used(tmp_path):
    """Another process makes the log dir between the start-up's look and its mkdir: the
    manager starts on it (before: the dir offline, LogDirOfflineError)."""

    class OtherMakesItFirst(FileOps):
        def mkdir(self, path):
            os.mkdir(path)
            super().mkdir(path)
    d = str(tmp_path / "data")
    with LogManager(d, io=OtherMakesItFirst()) as m:
        m.create_topic("t", 1)
        assert m.append("t", b"k", b"v").offset == 0
    with LogManager(d) as m:
        assert [r.value for r in m.log("t", 0).read(0)] == [b"v"]
