"""Crash states of a truncation that lowers a log's start (below a DeleteRecords' start), with an
append made in the window after the truncation released the log lock and before it returned:
every operation is a crash point, and the reopened log must hold what it held then. Before,
the lowered start was saved after that window, so a kill there reloaded the old, higher start
above the log end and the loader dropped every record, the returned append included.
"""
import os
import sys

import pytest

import kstore
from kstore.clock import MockTime
from kstore.scheduler import MockScheduler

from crash_harness import TracingOps, explore

sys.path.insert(0, os.path.dirname(__file__))
from test_crash import LOG_CFG, NOW, PREFIXES, value  # noqa: E402

TALLY: dict = {}
DELETED_TO = 20          # delete_records' start, above the truncation's target
END = 30                 # records 0..END-1 appended first
AFTER = b"appended-after-the-cut"


class WindowOps(TracingOps):
    """TracingOps that, while `window` is set, appends AFTER from the same thread when a save of
    the start (the start file, the log-start checkpoint) finds the truncation done (log end ==
    target): no lock of the log is held there, so this is an append another thread could have
    made, and had returned, before that save."""

    def __init__(self, root):
        super().__init__(root)
        self.window = None        # (log, target) during the truncation call
        self.appended = False

    def write_atomic(self, path, data):
        w = self.window
        if w is not None and not self.appended and w[0].log_end_offset == w[1] and \
                os.path.basename(path) in (".kstore-log-start", "log-start-offset-checkpoint"):
            w[0].append([(None, AFTER, NOW)])
            self.appended = True
            self.mark("appended", w[1])
        return super().write_atomic(path, data)


def _truncate_with_append(ops: WindowOps, lg, how: str, target: int) -> None:
    """lg.<how>(target) with the window open, then the append if the window had no operation
    (it came after the call returned: the same state for the next crash points)."""
    ops.mark("truncating", target)
    ops.window = (lg, target)
    if how == "truncate_to":
        lg.truncate_to(target)
    else:
        lg.truncate_fully_and_start_at(target)
    ops.window = None
    if not ops.appended:
        lg.append([(None, AFTER, NOW)])
        ops.appended = True
        ops.mark("appended", target)


def _fill(lg) -> None:
    for o in range(END):
        lg.append([(None, value(o), NOW + o)])
    lg.flush()
    assert lg.delete_records(DELETED_TO) == DELETED_TO


def standalone_workload(root: str, how: str, target: int) -> WindowOps:
    os.makedirs(root)
    ops = WindowOps(root)
    lg = kstore.Log.open(os.path.join(root, "t-0"), LOG_CFG, io=ops, time=MockTime(NOW))
    _fill(lg)
    ops.mark("filled", True)
    _truncate_with_append(ops, lg, how, target)
    lg.close_handlers()           # no close: the states after the workload are a kill's too
    ops.finish()
    return ops


def managed_workload(root: str, how: str, target: int) -> WindowOps:
    os.makedirs(root)
    ops = WindowOps(root)
    t = MockTime(NOW)
    m = kstore.LogManager(root, LOG_CFG, io=ops, time=t, scheduler=MockScheduler(t))
    m.create_topic("t", 1)
    lg = m.log("t", 0)
    _fill(lg)
    ops.mark("filled", True)
    _truncate_with_append(ops, lg, how, target)
    lg.flush()
    m.checkpoint_recovery_offsets()
    ops.finish()
    return ops


def after_fill(ops: WindowOps) -> list:
    """The crash points from the log as DeleteRecords left it on (test_crash covers the rest)."""
    return [s for s in ops.snapshots if "filled" in s.marks]


def check(lg, snap) -> None:
    """What a kill at this point must reopen: before the truncation began, the log as
    DeleteRecords left it; once the append returned, that append at the target, after the
    truncation (the start at or below it); in between, either log."""
    marks = snap.marks
    recs = [(r.offset, r.value) for r in lg]
    start, end = lg.log_start_offset, lg.log_end_offset
    if "appended" in marks:
        target = marks["appended"]
        assert start <= target and (target, AFTER) in recs, (start, end, recs[:3])
        assert recs == [(target, AFTER)], recs[:5]
    elif "truncating" not in marks:
        assert (start, end) == (DELETED_TO, END) and recs == [(o, value(o)) for o in range(start, END)]
    else:
        assert all(v == value(o) for o, v in recs), recs[:5]


CASES = [("truncate_to", 5), ("truncate_to", 10), ("truncate_fully_and_start_at", 3)]


@pytest.mark.parametrize("how,target", CASES)
def test_crash_states_of_a_lowering_truncation_beside_an_append_standalone(tmp_path, how, target):
    ops = standalone_workload(str(tmp_path / "w"), how, target)

    def check_state(state, snap, kind):
        with kstore.Log.open(os.path.join(state, "t-0"), LOG_CFG) as lg:
            check(lg, snap)
    TALLY[f"standalone-{how}-{target}"] = explore(after_fill(ops), str(tmp_path), check_state,
                                                  prefixes=PREFIXES, modes=())


@pytest.mark.parametrize("how,target", CASES)
def test_crash_states_of_a_lowering_truncation_beside_an_append_managed(tmp_path, how, target):
    ops = managed_workload(str(tmp_path / "w"), how, target)

    def check_state(state, snap, kind):
        t = MockTime(NOW)
        with kstore.LogManager(state, LOG_CFG, time=t, scheduler=MockScheduler(t)) as m:
            if "t" in m.topics():
                check(m.log("t", 0), snap)
            else:
                assert "appended" not in snap.marks
    TALLY[f"managed-{how}-{target}"] = explore(after_fill(ops), str(tmp_path), check_state,
                                               prefixes=PREFIXES, modes=())
