"""kstore.offsets_expiry: the delete-expired-group-metadata task never holds its scheduler thread for the
coordinator's 30 s lock timeout behind another process's offsets flock. It waits
task_wait.TASK_LOCK_WAIT_S (1 s) in all, puts the rest off to its next run (INFO), and the
scheduler's other tasks (flush, retention) go on; the next run after the flock is let go
expires what was left, each offset once; close() ends its wait at once."""
from __future__ import annotations

import logging
import os
import threading

from group_helpers import FlockHolder
from thread_watchdog import join_all

import kstore
from kstore import LogManager, TopicPartition as TP
from kstore.fileio import FileOps
from kstore.group_coordinator import GroupCoordinator
from kstore.group_records import OffsetKey, parse_key, partition_for

GENEROUS_S = 20
MINUTE = 60_000
CFG = {"log.initial.task.delay.ms": 0, "offsets.retention.minutes": 1,
       "offsets.retention.check.interval.ms": MINUTE, "log.retention.check.interval.ms": MINUTE,
       "log.flush.scheduler.interval.ms": MINUTE, "log.flush.interval.ms": MINUTE}
HELD = "offsets flocks held by others for 1 s"


def put_off(step: str, n: int, of: int, at: str, why: str = HELD) -> str:
    """The task's INFO line for a step ("expiry", "compaction") put off at partition path at."""
    name = "expiry of committed offsets" if step == "expiry" else "compaction of __consumer_offsets"
    return f"the {name} is put off to the next run for {n} of {of} partitions (from {os.path.basename(at)}): {why}"


class FlockSeen(FileOps):
    """FileOps telling when a __consumer_offsets partition's flock was found held (`held`)."""

    def __init__(self) -> None:
        super().__init__()
        self.held = threading.Event()

    def try_lock(self, path, *, shared=False, directory=False):
        fd = super().try_lock(path, shared=shared, directory=directory)
        if fd is None and os.path.basename(path).startswith("__consumer_offsets-"):
            self.held.set()
        return fd


def _groups() -> tuple[str, str]:
    """Two groups, the first in a lower __consumer_offsets partition (expired first)."""
    first = "a"
    later = next(f"b{i}" for i in range(1000) if partition_for(f"b{i}", 50) > partition_for(first, 50))
    return first, later


def _setup(m: LogManager, t) -> tuple[str, str, str]:
    """t (2 partitions) and r (retention.ms just under 1 min, 10 small segments); both groups committed
    t now (MockTime t); returns the groups and the later group's partition path."""
    first, later = _groups()
    m.create_topic("t", 2)
    m.create_topic("r", 1, {"retention.ms": MINUTE - 1, "segment.bytes": 200})
    m.append_batch("t", 0, [(None, b"x")] * 5)
    for i in range(10):
        m.append_batch("r", 0, [(None, b"r%03d" % i + b"." * 100)])
    with GroupCoordinator(m, time=t) as gc:
        gc.commit_offsets(first, {TP("t", 0): 5})
        gc.commit_offsets(later, {TP("t", 0): 4, TP("t", 1): 0})
        path = gc.topic.partition_path(gc.partition_for(later))
    return first, later, path


def _offsets(m: LogManager, *groups: str) -> dict:
    with GroupCoordinator(m) as gc:
        return {g: {tp: o.offset for tp, o in gc.fetch_offsets(g).items()} for g in groups}


def _tombstones(d: str) -> dict:
    """(group, topic, partition) -> how many offset tombstones __consumer_offsets holds of it."""
    out: dict = {}
    for name in sorted(os.listdir(d)):
        if name.startswith("__consumer_offsets-"):
            with kstore.Log.open(os.path.join(d, name), read_only=True) as lg:
                for rec in lg.read(0, 10_000):
                    k = parse_key(rec.key)
                    if isinstance(k, OffsetKey) and rec.value is None:
                        key = (k.group, k.topic, k.partition)
                        out[key] = out.get(key, 0) + 1
    return out


def _beat(s) -> None:
    runner = threading.Thread(target=s.advance, args=(MINUTE,), name="beat")
    runner.start()
    join_all([runner], 10)                # well under the coordinator's 30 s lock timeout


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kstore.groups" and (" is put off to the next run " in r.getMessage()
                                              or r.getMessage().startswith("Removed "))]


def test_the_expiry_task_puts_off_what_another_processs_flock_holds(tmp_path, mock, caplog,
                                                                    watchdog):
    """Both groups' offsets are a minute old (offsets.retention.minutes 1) when another process
    holds the flock of the later group's partition. Each beat returns within 10 s (not the
    30 s lock timeout): the first group's offsets are tombstoned, the later group's put off
    (one INFO line per beat), and the flush and retention tasks of the same scheduler ran in
    each beat (t flushed to its end, r's old segments deleted). The beat after the process lets
    go tombstones the later group's two offsets, and no offset is tombstoned twice. Each put
    off beat logs what it expired (Kafka's line) and the partition it was put off at."""
    watchdog(120)
    caplog.set_level(logging.INFO, logger="kstore.groups")
    t, s = mock
    d = str(tmp_path / "data")
    with LogManager(d, CFG, time=t, scheduler=s, io=FlockSeen()) as m:
        s.tick()
        first, later, path = _setup(m, t)
        holder = FlockHolder(path, tmp_path)
        caplog.clear()
        try:
            for beat in (1, 2):
                m.append_batch("t", 1, [(None, b"y")] * beat)
                t_log, r_log = m.log("t", 1), m.log("r", 0)
                assert t_log.recovery_point < t_log.log_end_offset
                _beat(s)
                assert t_log.recovery_point == t_log.log_end_offset == (1 if beat == 1 else 3)
                assert [sg.base_offset for sg in r_log.segments] == [10]     # all expired: rolled
                assert _offsets(m, first, later) == {first: {}, later: {TP("t", 0): 4, TP("t", 1): 0}}
                assert _messages(caplog)[-3:] == [
                    f"Removed {2 - beat} expired offsets in 0 milliseconds.", put_off("expiry", 1, 2, path),
                    put_off("compaction", 1, 2, path)]
        finally:
            holder.release()
        caplog.clear()
        _beat(s)
        assert _offsets(m, first, later) == {first: {}, later: {}}
        assert _messages(caplog) == ["Removed 2 expired offsets in 0 milliseconds."]
        _beat(s)
        assert _messages(caplog) == ["Removed 2 expired offsets in 0 milliseconds.",
                                     "Removed 0 expired offsets in 0 milliseconds."]
    assert _tombstones(d) == {(first, "t", 0): 1, (later, "t", 0): 1, (later, "t", 1): 1}


def test_close_ends_the_expiry_tasks_wait_for_another_processs_flock(tmp_path, mock, monkeypatch,
                                                                     caplog, watchdog):
    """The expiry task waits for the flock another process holds (its wait made 600 s here):
    close() from another thread ends the wait at once and returns, well before the wait's end;
    nothing of the later group was written, and a direct expire_group_offsets after the
    process let go expires its offsets (it waits the coordinator's lock timeout, not the
    task's bound)."""
    from kstore import offsets_expiry
    watchdog(90)
    caplog.set_level(logging.INFO, logger="kstore.groups")
    monkeypatch.setattr(offsets_expiry, "TASK_LOCK_WAIT_S", 600.0)
    t, s = mock
    ops = FlockSeen()
    d = str(tmp_path / "data")
    m = LogManager(d, CFG, time=t, scheduler=s, io=ops)
    s.tick()
    first, later, path = _setup(m, t)
    holder = FlockHolder(path, tmp_path)
    caplog.clear()
    try:
        ops.held.clear()
        runner = threading.Thread(target=s.advance, args=(MINUTE,), name="beat")
        runner.start()
        assert ops.held.wait(GENEROUS_S)          # the task is in its wait for the flock
        closer = threading.Thread(target=m.close, name="close")
        closer.start()
        join_all([closer, runner], 20)            # not 600 s
        closing = ["Removed 1 expired offsets in 0 milliseconds.",
                   put_off("expiry", 1, 2, path, "the LogManager is closing")]
        assert _messages(caplog) == closing
        assert _offsets(m, first, later) == {first: {}, later: {TP("t", 0): 4, TP("t", 1): 0}}
        s.advance(MINUTE)                         # closed: the task does nothing
        assert _messages(caplog) == closing
    finally:
        holder.release()
    with LogManager(d, CFG, time=t, scheduler=s) as m2:
        assert m2.expire_group_offsets() == 2
        assert _offsets(m2, first, later) == {first: {}, later: {}}
    assert _tombstones(d) == {(first, "t", 0): 1, (later, "t", 0): 1, (later, "t", 1): 1}


def test_a_direct_call_waits_for_the_flock_as_before(tmp_path, mock, watchdog):
    """expire_group_offsets called by the user waits for another process's flock past the
    task's 1 s bound (the coordinator's lock timeout) and expires every offset once it is let
    go; the call in another thread is seen still waiting after 2 s."""
    import time
    watchdog(90)
    t, s = mock
    d = str(tmp_path / "data")
    with LogManager(d, CFG, time=t, scheduler=s) as m:
        s.tick()
        first, later, path = _setup(m, t)
        t.sleep(MINUTE)
        holder = FlockHolder(path, tmp_path)
        out: dict = {}
        try:
            caller = threading.Thread(target=lambda: out.setdefault("n", m.expire_group_offsets()),
                                      name="caller")
            caller.start()
            time.sleep(2)
            assert caller.is_alive() and out == {}
        finally:
            holder.release()
        join_all([caller], GENEROUS_S)
        assert out == {"n": 3} and _offsets(m, first, later) == {first: {}, later: {}}
    assert _tombstones(d) == {(first, "t", 0): 1, (later, "t", 0): 1, (later, "t", 1): 1}


def test_the_task_has_kafkas_name(tmp_path, mock):
    """The task is scheduled under Kafka's name for it (GroupMetadataManager.startup's
    delete-expired-group-metadata), as the log manager's tasks carry Kafka's names (a failing
    run is logged under it); it was kstore's own 'kafka-offsets-expiry'."""
    t, s = mock
    with LogManager(str(tmp_path / "data"), CFG, time=t, scheduler=s):
        assert s.pending().count("delete-expired-group-metadata") == 1
        assert "kafka-offsets-expiry" not in s.pending()


def test_a_put_off_compaction_does_not_hide_a_finished_expiry(tmp_path, mock, caplog, watchdog):
    """Nothing has expired (offsets committed now) while another process holds the flock of a
    written __consumer_offsets partition: the expiry needs no flock and is done ("Removed 0
    expired offsets", Kafka's line), only the compaction that follows waits for that flock and
    is put off, and the INFO line says so. Before, the run logged "the expiry of committed
    offsets is put off" and no "Removed" line: every beat of a store whose partitions another
    process commits to read as an expiry that never ran. The next beat, the flock let go,
    logs its "Removed" line and nothing else; no offset was touched."""
    watchdog(120)
    caplog.set_level(logging.INFO, logger="kstore.groups")
    t, s = mock
    d = str(tmp_path / "data")
    cfg = dict(CFG, **{"offsets.retention.minutes": 10})
    with LogManager(d, cfg, time=t, scheduler=s, io=FlockSeen()) as m:
        s.tick()
        first, later, path = _setup(m, t)
        holder = FlockHolder(path, tmp_path)
        caplog.clear()
        try:
            _beat(s)
        finally:
            holder.release()
        messages = [r.getMessage() for r in caplog.records if r.name == "kstore.groups"]
        assert messages == ["Removed 0 expired offsets in 0 milliseconds.", put_off("compaction", 1, 2, path)]
        caplog.clear()
        _beat(s)
        messages = [r.getMessage() for r in caplog.records if r.name == "kstore.groups"]
        assert messages == ["Removed 0 expired offsets in 0 milliseconds."]
        assert _offsets(m, first, later) == {first: {TP("t", 0): 5},
                                             later: {TP("t", 0): 4, TP("t", 1): 0}}
    assert _tombstones(d) == {}


def test_a_partition_held_at_every_run_does_not_starve_the_later_ones(tmp_path, mock, caplog, watchdog):
    """Another process holds __consumer_offsets-0's flock at every run, and a group there has
    expired offsets as do three groups of later partitions. Run 1 waits its 1 s at partition 0
    and is put off (4 of 4 partitions); run 2 starts after it (round robin), tombstones the
    three later groups' offsets, and is put off only at partition 0 (1 of 4), its count in
    Kafka's line; run 3 finds nothing more. Once the process lets go, run 4 expires partition
    0's group. Every offset is tombstoned exactly once. Before, every run started at partition
    0, waited there and was put off, and the later groups' offsets never expired."""
    watchdog(120)
    caplog.set_level(logging.INFO, logger="kstore.groups")
    t, s = mock
    d = str(tmp_path / "data")
    names = ["g%d" % i for i in range(1000)]
    at0 = next(g for g in names if partition_for(g, 50) == 0)
    later: list[str] = []
    for g in names:
        if partition_for(g, 50) > 0 and partition_for(g, 50) not in {partition_for(x, 50) for x in later}:
            later.append(g)
        if len(later) == 3:
            break
    with LogManager(d, CFG, time=t, scheduler=s) as m:
        s.tick()
        m.create_topic("t", 1)
        m.append_batch("t", 0, [(None, b"x")] * 5)
        with GroupCoordinator(m, time=t) as gc:
            for i, g in enumerate([at0] + later):
                gc.commit_offsets(g, {TP("t", 0): i + 1})
            path0 = gc.topic.partition_path(0)
            assert sorted(gc.topic.existing_partitions()) == sorted(partition_for(g, 50) for g in [at0] + later)
        holder = FlockHolder(path0, tmp_path)
        try:
            caplog.clear()
            _beat(s)
            assert _messages(caplog) == ["Removed 0 expired offsets in 0 milliseconds.",
                                         put_off("expiry", 4, 4, path0), put_off("compaction", 4, 4, path0)]
            assert _tombstones(d) == {}
            caplog.clear()
            _beat(s)
            assert _messages(caplog) == ["Removed 3 expired offsets in 0 milliseconds.",
                                         put_off("expiry", 1, 4, path0), put_off("compaction", 1, 4, path0)]
            assert _tombstones(d) == {(g, "t", 0): 1 for g in later}
            assert _offsets(m, at0, *later) == {at0: {TP("t", 0): 1}} | {g: {} for g in later}
            caplog.clear()
            _beat(s)
            assert _messages(caplog)[0] == "Removed 0 expired offsets in 0 milliseconds."
        finally:
            holder.release()
        caplog.clear()
        _beat(s)
        assert _messages(caplog) == ["Removed 1 expired offsets in 0 milliseconds."]
        assert _offsets(m, at0, *later) == {g: {} for g in [at0] + later}
    assert _tombstones(d) == {(g, "t", 0): 1 for g in [at0] + later}
