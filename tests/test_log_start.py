"""log_start.py: moves of a log's start and where they are saved, beside other threads (the
crash states of a lowering truncation are tests/reliability/test_crash_log_start.py)."""
import shutil
import threading

import kstore
from kstore.checkpoint import OffsetCheckpointFile
from kstore.clock import MockTime
from kstore.fileio import FileOps
from kstore.scheduler import MockScheduler

from log_helpers import NOW
from thread_watchdog import join_all


class _CutGate(FileOps):
    """Holds the named thread at its first unlink (a truncation's cut, under the log lock)."""

    def __init__(self, thread: str):
        self.thread = thread
        self.entered, self.go = threading.Event(), threading.Event()

    def unlink(self, path):
        if threading.current_thread().name == self.thread and not self.entered.is_set():
            self.entered.set()
            assert self.go.wait(30)
        return super().unlink(path)


def test_a_checkpoint_during_a_lowering_truncation_saves_no_start_above_its_target(tmp_path, watchdog):
    """The manager's log-start checkpoint written by another thread (its periodic task, another
    log's DeleteRecords) while a truncation below the start is in its cut: it saves nothing
    above the target (before: the old start, which a crash after the cut and an append
    reloaded above the log end, dropping every record)."""
    watchdog(60)
    t = MockTime(NOW)
    ops = _CutGate("truncator")
    m = kstore.LogManager(str(tmp_path / "store"), io=ops, time=t, scheduler=MockScheduler(t))
    m.create_topic("t", 1, {"segment.bytes": 400})
    lg = m.log("t", 0)
    for o in range(30):
        lg.append([(None, b"v%d" % o, NOW)])
    cut = lg.segments[-2].base_offset + 1       # inside a segment: the checkpoint holds it
    assert lg.delete_records(cut) == cut and lg.segments[0].base_offset > 5   # a full truncation
    cp = OffsetCheckpointFile(str(tmp_path / "store" / "log-start-offset-checkpoint"))
    assert cp.read() == {("t", 0): cut}
    truncator = threading.Thread(target=lg.truncate_to, args=(5,), name="truncator", daemon=True)
    truncator.start()
    assert ops.entered.wait(10)                 # in the cut, the log lock held
    m.checkpoint_log_start_offsets()            # the periodic task, on this thread
    assert cp.read() == {}         # 5, below the first segment: no entry (its base bounds it)
    assert lg.log_start_offset == cut and lg.checkpoint_start == 5
    ops.go.set()
    join_all([truncator], 10)
    assert (lg.log_start_offset, lg.log_end_offset, lg.checkpoint_start) == (5, 5, 5)
    lg.append([(None, b"after", NOW)])
    m.checkpoint_log_start_offsets()
    assert cp.read() == {}
    shutil.copytree(tmp_path / "store", tmp_path / "crash")   # what a kill -9 leaves
    m.close()
    with kstore.LogManager(str(tmp_path / "crash")) as m2:
        lg2 = m2.log("t", 0)
        assert (lg2.log_start_offset, lg2.log_end_offset) == (5, 6)
        assert [r.value for r in lg2.read(5)] == [b"after"]


def test_a_lowering_truncation_beside_appending_threads_keeps_every_returned_append(tmp_path, watchdog):
    """Standalone: appender threads run while another thread alternates DeleteRecords and
    truncations below the start; after a crash at the end the reopened log holds exactly what
    the log held (start, end and records)."""
    watchdog(60)
    d = str(tmp_path / "t-0")
    lg = kstore.Log.open(d, {"segment.bytes": 600})
    stop = threading.Event()

    def appender(k):
        while not stop.is_set():
            lg.append([(None, b"a%d" % k, NOW)])

    def mover():
        for _ in range(30):
            end = lg.log_end_offset
            lg.delete_records(end)
            lg.truncate_to(max(0, end - 3))
        stop.set()
    ts = [threading.Thread(target=appender, args=(k,), name=f"appender-{k}") for k in (1, 2)]
    ts.append(threading.Thread(target=mover, name="mover"))
    for th in ts:
        th.start()
    join_all(ts, 50)
    want = (lg.log_start_offset, lg.log_end_offset, [(r.offset, r.value) for r in lg])
    lg.close_handlers()
    with kstore.Log.open(d) as lg2:
        assert (lg2.log_start_offset, lg2.log_end_offset,
                [(r.offset, r.value) for r in lg2]) == want
