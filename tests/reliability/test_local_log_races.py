"""LocalLog reliability: flush, close, appends and rolls on several threads (lock order), and
one writer per partition across processes."""
import os
import subprocess
import sys
import threading
import time

import pytest

import kstore
from thread_watchdog import run_threads

from kstore.errors import LogDirLockedError
from kstore.manager import LogManager


# -- concurrency: lock order (issue 12, defect 3) -------------------------------------------------
def _appender(log, acked):
    def run(stop):
        i = 0
        while not stop.is_set():
            info = log.append([(b"k", b"%d" % i)])
            acked.append((info.first_offset, b"%d" % i))
            i += 1
    return run


def _assert_all_there(log, acked):
    assert acked, "nothing was appended"
    got = [(r.offset, r.value) for r in log]
    assert got == sorted(acked)
    assert [o for o, _ in got] == list(range(len(acked)))


@pytest.mark.parametrize("flush_messages", [1, 7, None])
def test_flush_beside_appends_and_rolls_never_deadlocks(open_log, watchdog, flush_messages):
    """flush() on one thread, appends that roll (and reach flush.messages) on another: flush used
    to hold _flush_lock while waiting for _lock, and append/roll held _lock while flushing."""
    watchdog(60)
    cfg = {"segment.bytes": 2048}
    if flush_messages is not None:
        cfg["flush.messages"] = flush_messages
    log = open_log(cfg)
    acked = []
    flushes = [0]

    def flusher(stop):
        while not stop.is_set():
            log.flush()
            flushes[0] += 1
    run_threads(2.0, _appender(log, acked), flusher)
    assert len(log.segments) > 3 and flushes[0] > 0
    log.flush()
    assert log.recovery_point == log.log_end_offset == len(acked)
    _assert_all_there(log, acked)


def test_close_beside_a_flush_never_deadlocks(tmp_path, watchdog):
    """close() took _lock then flush()'s _flush_lock; a flush takes them the other way round."""
    from thread_watchdog import join_all
    watchdog(60)
    for round_ in range(20):
        path = str(tmp_path / f"t-{round_}")
        log = kstore.Log.open(path, {"segment.bytes": 4096})
        for i in range(200):
            log.append([(b"k", b"%d" % i)])
        t = threading.Thread(target=lambda log=log: [log.flush() for _ in range(50)])
        t.start()
        log.close()
        join_all([t], 30)
        with kstore.Log.open(path) as again:
            assert [r.value for r in again] == [b"%d" % i for i in range(200)]
            assert again.recovery_report == []        # closed cleanly: nothing recovered


_HOLD_OPEN = """
import sys, kstore
lg = kstore.Log.open(sys.argv[1]) if sys.argv[2] == "log" else kstore.LogManager(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
lg.close()
"""


def _holder(path, kind):
    """A second process holding path open for writing (a Log, or a LogManager of a log dir)
    until its stdin is closed."""
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(kstore.__file__)))
    p = subprocess.Popen([sys.executable, "-c", _HOLD_OPEN, path, kind], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, env=env,
                         cwd=os.path.dirname(os.path.abspath(path)))   # outside the checkout
    assert p.stdout.readline() == b"ready\n"
    return p


def _release(p):
    p.stdin.close()
    assert p.wait(30) == 0


def test_a_writable_open_beside_another_process_is_refused(tmp_path):
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path) as lg:
        lg.append([(b"k", b"v")])
    p = _holder(path, "log")
    try:
        with pytest.raises(LogDirLockedError, match=f"cannot open {path} for writing"):
            kstore.Log.open(path)
        with pytest.raises(LogDirLockedError, match="Failed to acquire lock on file .lock"):
            LogManager(str(tmp_path))                    # a standalone writer holds the log dir too
        with kstore.Log.open(path, read_only=True) as ro:
            assert [r.value for r in ro.read(0)] == [b"v"]
    finally:
        _release(p)
    with kstore.Log.open(path) as lg:
        assert [r.value for r in lg] == [b"v"]


@pytest.mark.parametrize("where", ["this process", "another process"])
def test_a_standalone_open_of_a_managed_partition_is_refused(tmp_path, where):
    with LogManager(str(tmp_path), {"log.initial.task.delay.ms": 1 << 40}) as m:
        m.create_topic("t", 1)
        m.append("t", b"k", b"v")
    part = str(tmp_path / "t-0")
    if where == "this process":
        m = LogManager(str(tmp_path), {"log.initial.task.delay.ms": 1 << 40})
        release = m.close
    else:
        p = _holder(str(tmp_path), "manager")
        release = lambda: _release(p)   # noqa: E731
    try:
        with pytest.raises(LogDirLockedError, match=f"cannot open {part} for writing: a LogManager owns"):
            kstore.Log.open(part)
    finally:
        release()
    with kstore.Log.open(part) as lg:          # the manager gone, a standalone open is fine
        assert [r.value for r in lg] == [b"v"]


def test_a_refused_standalone_open_adds_nothing_to_a_managers_log_dir(tmp_path):
    """Standalone opens of partitions a LogManager in another process does not host (a new
    topic's, and partition 5 of its 1-partition topic) are refused and leave its log dir as it
    was: readers see no new topic or partition, and the manager restarted hosts only its own.
    Before, the open made the partition directory before it found the lock taken: a reader saw
    topic "new" appear, and the next start-up hosted "new" and t-5."""
    with LogManager(str(tmp_path), {"log.initial.task.delay.ms": 1 << 40}) as m:
        m.create_topic("t", 1)
        m.append("t", b"k", b"v")
    p = _holder(str(tmp_path), "manager")
    try:
        before = sorted(os.listdir(tmp_path))
        for part in ("new-0", "t-5", "t-0"):
            with pytest.raises(LogDirLockedError, match="a LogManager owns"):
                kstore.Log.open(str(tmp_path / part))
        assert sorted(os.listdir(tmp_path)) == before
        with kstore.StoreReader(str(tmp_path)) as r:
            assert (r.topics(), r.partitions("t")) == (["t"], [("t", 0)])
    finally:
        _release(p)
    with LogManager(str(tmp_path), {"log.initial.task.delay.ms": 1 << 40}) as m:
        assert (m.topics(), sorted(m.logs())) == (["t"], [("t", 0)])


_RACE_OPEN = """
import sys, time, kstore
path, go = sys.argv[1], float(sys.argv[2])
while time.time() < go:
    time.sleep(0.0005)
try:
    lg = kstore.Log.open(path)
except kstore.KStoreError as e:
    print(type(e).__name__, flush=True)
else:
    print("opened", flush=True)
    sys.stdin.readline()
    lg.close()
"""


def test_processes_racing_to_make_a_partition_one_opens_it(tmp_path, watchdog):
    """Four processes open the same new partition directory at the same instant, five times:
    each time exactly one opens it and the other three get LogDirLockedError. Before, a loser
    whose mkdir came second raised KafkaStorageError ("[Errno 17] File exists"), as if the
    disk had failed."""
    watchdog(120)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(kstore.__file__)))
    for round_ in range(5):
        path = str(tmp_path / f"r{round_}" / "new-0")
        go = time.time() + 1.0
        ps = [subprocess.Popen([sys.executable, "-c", _RACE_OPEN, path, str(go)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                               cwd=str(tmp_path)) for _ in range(4)]
        outs = []
        for p in ps:
            outs.append(p.stdout.readline().strip())
        for p in ps:
            p.stdin.close()
            assert p.wait(30) == 0, p.stderr.read()
        assert sorted(outs) == ["LogDirLockedError"] * 3 + ["opened"], (round_, outs)
