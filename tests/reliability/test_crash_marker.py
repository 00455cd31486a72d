"""Crash states of a clean open whose clean-shutdown marker is removed in the background
(marker_gate.MarkerGate): every operation after the open is a crash point, and each process-kill
and power-loss state must load correctly. The danger is a state with the marker still on disk
and a data file changed (a clean load would skip the recovery it needs); the gate orders the
marker's directory fsync before every change, which the first test asserts on the trace itself.
"""
import os
import sys

import pytest

import kstore
from kstore.clock import MockTime

from crash_harness import TracingOps, explore

sys.path.insert(0, os.path.dirname(__file__))
from test_crash import (LOG_CFG, NOW, PREFIXES, check_indexes, check_records,  # noqa: E402
                        leftovers, manager, value)

TALLY: dict = {}
#: the first appends after the open change the active segment's existing files (no new
#: segment, no directory fsync of their own: the case a marker left on disk would hide);
#: later ones roll
CFG = {**LOG_CFG, "segment.bytes": 1500}

_CHANGES = ("pwrite", "truncate", "allocate", "zero_fill", "rename", "unlink", "mkdir", "rmdir")


def _changes_after_marker_sync(ops: TracingOps, marker_dir_name: str) -> None:
    """In the trace: the marker's unlink, then the fsync of its directory, then the first
    change of any file or name (open(O_CREAT) shows up as the pwrite/truncate that follows)."""
    ops_seq = [s.op for s in ops.snapshots]
    first_unlink = ops_seq.index("unlink")
    first_sync = ops_seq.index("fsync_dir", first_unlink)
    later = [i for i, op in enumerate(ops_seq) if op in _CHANGES and i != first_unlink]
    assert later and min(later) > first_sync, (ops_seq[:first_sync + 3], marker_dir_name)


def _clean_standalone(root: str) -> str:
    part = os.path.join(root, "t-0")
    with kstore.Log.open(part, CFG, time=MockTime(NOW)) as lg:
        for o in range(10):
            lg.append([(None, value(o), NOW + o)])
    assert os.path.exists(os.path.join(part, ".kstore-clean-shutdown"))
    return part


def standalone_workload(root: str) -> TracingOps:
    os.makedirs(root)
    part = _clean_standalone(root)
    ops = TracingOps(root)
    ops.mark("appended", 10)
    ops.mark("flushed", 10)
    lg = kstore.Log.open(part, CFG, io=ops, time=MockTime(NOW))
    assert lg.recovery_report == []                    # a clean open
    o = 10
    for i in range(12):
        lg.append([(None, value(o), NOW + o), (None, value(o + 1), NOW + o + 1)])
        o += 2
        ops.mark("appended", o)
        if i % 4 == 3:
            lg.flush()
            ops.mark("flushed", o)
    lg.close()
    ops.mark("flushed", o)
    ops.finish()
    return ops


def check_standalone(state: str, snap, kind: str) -> None:
    part = os.path.join(state, "t-0")
    need = snap.marks.get("appended" if kind == "kill" else "flushed", 0)
    with kstore.Log.open(part, CFG) as lg:
        recs = check_records(lg, exact_start=0)
        assert len(recs) >= need, f"{len(recs)} records loaded, {need} promised ({kind})"
        if kind == "kill":
            assert len(recs) == lg.log_end_offset, "a gap after a process kill"
        assert not leftovers(part), leftovers(part)
        n = lg.log_end_offset
        lg.append([(None, value(n), NOW + n)])
    with kstore.Log.open(part, CFG) as lg:
        assert [(r.offset, r.value) for r in lg] == recs + [(n, value(n))]
    check_indexes(part)


def test_crash_states_after_a_clean_open_of_a_standalone_log(tmp_path):
    ops = standalone_workload(str(tmp_path / "w"))
    _changes_after_marker_sync(ops, "t-0")
    assert len(ops.snapshots) > 50
    TALLY["clean_open"] = explore(ops.snapshots, str(tmp_path), check_standalone, prefixes=PREFIXES)


def manager_clean_workload(root: str) -> TracingOps:
    os.makedirs(root)
    t = MockTime(NOW)
    with manager(root, None, t) as m:
        m.create_topic("keep", 1)
        for o in range(0, 10, 2):
            m.append_batch("keep", 0, [(None, value(o), NOW + o), (None, value(o + 1), NOW + o + 1)])
    assert os.path.exists(os.path.join(root, ".kafka_cleanshutdown"))
    ops = TracingOps(root)
    ops.mark("flushed_keep", 10)
    m = manager(root, ops, t)
    assert m.log("keep", 0).recovery_report == []
    o = 10
    for i in range(10):
        m.append_batch("keep", 0, [(None, value(o), NOW + o), (None, value(o + 1), NOW + o + 1)])
        o += 2
        if i % 4 == 3:
            m.log("keep", 0).flush()
            ops.mark("flushed_keep", o)
            m.checkpoint_recovery_offsets()
    m.close()
    ops.mark("flushed_keep", o)
    ops.finish()
    return ops


def check_manager_clean(state: str, snap, kind: str) -> None:
    with manager(state) as m:
        lg = m.log("keep", 0)
        recs = check_records(lg, exact_start=0)
        need = snap.marks.get("flushed_keep", 0)
        assert len(recs) >= need, f"{len(recs)} records loaded, {need} flushed ({kind})"
        n = lg.log_end_offset
        m.append_batch("keep", 0, [(None, value(n), NOW + n)])
    assert not leftovers(state), leftovers(state)
    with manager(state) as m:
        assert [(r.offset, r.value) for r in m.log("keep", 0)] == recs + [(n, value(n))]
    check_indexes(os.path.join(state, "keep-0"))


def test_crash_states_after_a_clean_start_of_a_log_manager(tmp_path):
    ops = manager_clean_workload(str(tmp_path / "w"))
    _changes_after_marker_sync(ops, "w")
    TALLY["clean_start"] = explore(ops.snapshots, str(tmp_path), check_manager_clean,
                                   prefixes=PREFIXES)


def test_changes_wait_for_the_markers_directory_fsync(tmp_path, watchdog):
    """A slow directory fsync holds the first change back (never a change before it), and a
    failed one fails the change with its error."""
    import threading
    from kstore.fileio import FileOps
    from kstore.marker_gate import MarkerGate
    watchdog(30)
    part = _clean_standalone(str(tmp_path))
    go = threading.Event()
    seen = []

    class Slow(FileOps):
        def fsync_dir(self, path):
            go.wait(10)
            seen.append(("fsync_dir", path))
            super().fsync_dir(path)

        def zero_fill(self, fd, offset, length):
            seen.append(("zero_fill", offset))
            super().zero_fill(fd, offset, length)

    lg = kstore.Log.open(part, CFG, io=Slow(), time=MockTime(NOW))
    assert [r.offset for r in lg.read(0, 100)] == list(range(10))            # reads pass
    t = threading.Thread(target=lambda: lg.append([(None, value(10), NOW + 10)]))
    t.start()
    t.join(0.3)
    assert t.is_alive() and seen == []            # the append waits for the fsync
    go.set()
    t.join(10)
    assert seen[0] == ("fsync_dir", part) and seen[1][0] == "zero_fill"
    assert not os.path.exists(os.path.join(part, ".kstore-clean-shutdown"))
    assert [r.offset for r in lg.read(0, 100)] == list(range(11))
    lg.close()

    class Failing(FileOps):
        def fsync_dir(self, path):
            raise OSError(5, "Input/output error (injected)")
    gate = MarkerGate(Failing())
    marker = tmp_path / "m"
    marker.write_bytes(b"x")
    gate.remove_later(str(marker), str(tmp_path))
    for _ in range(2):                 # every later change fails, not just the first
        try:
            gate.unlink(str(tmp_path / "other"))
        except OSError as e:
            assert "injected" in str(e)
        else:
            raise AssertionError("a change went ahead of a failed marker fsync")


@pytest.fixture(scope="module", autouse=True)
def _file_counts(reliability_counts):
    yield
    reliability_counts.update({k: v.__dict__ for k, v in TALLY.items()})


def test_threads_changing_a_log_during_the_markers_removal_all_wait_for_it(tmp_path, watchdog):
    """Right after a clean open whose marker fsync is slow, threads append, roll, truncate,
    delete records and read at once: no file changes before the fsync ends (every change call
    comes after the marker's unlink and fsync in the order the FileOps saw them), readers read
    meanwhile, and the log the threads leave reopens with contiguous offsets, each holding the
    value last appended at it."""
    import threading
    from kstore.fileio import FileOps
    from thread_watchdog import run_threads
    watchdog(60)
    part = _clean_standalone(str(tmp_path))
    calls = []
    order = threading.Lock()
    synced = threading.Event()

    class Recording(FileOps):
        def fsync_dir(self, path):
            if not synced.is_set():
                synced.wait(0.3)          # the marker's fsync, slow
            super().fsync_dir(path)
            with order:
                calls.append("fsync_dir")
            synced.set()

    for name in ("pwrite", "truncate", "allocate", "zero_fill", "rename", "unlink"):
        def change(self, *a, _name=name, **kw):
            with order:
                calls.append(_name)
            return getattr(FileOps, _name)(self, *a, **kw)
        setattr(Recording, name, change)

    lg = kstore.Log.open(part, CFG, io=Recording(), time=MockTime(NOW))
    reads = []
    latest = {o: value(o) for o in range(10)}     # offset -> the last value appended there

    def appender(stop):
        for i in range(30):
            v = b"appended-%d" % i
            info = lg.append([(None, v, NOW + 10 + i)])
            latest[info.first_offset] = v       # a truncation may hand the offset out again

    def roller(stop):
        lg.roll()

    def truncater(stop):
        lg.truncate_to(8)

    def deleter(stop):
        lg.delete_records(2)

    def reader(stop):
        while not stop.is_set() and not synced.is_set():
            reads.append(len(lg.read(lg.log_start_offset, 5)))

    run_threads(2.0, appender, roller, truncater, deleter, reader)
    assert calls[:2] == ["unlink", "fsync_dir"], calls[:5]      # the marker, then its fsync
    assert reads and all(n > 0 for n in reads)
    lg.close()
    with kstore.Log.open(part, CFG) as again:
        recs = [(r.offset, r.value) for r in again]
        assert [o for o, _ in recs] == list(range(again.log_start_offset, again.log_end_offset))
        assert all(v == latest[o] for o, v in recs), [(o, v) for o, v in recs if v != latest[o]]
