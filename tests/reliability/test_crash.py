"""Crash-state enumeration (facts: crash-and-fault-testing §2): every operation of a workload is
a crash point; each process-kill and power-loss state is reopened and Kafka's promises checked:

1. the records are a prefix (or, after retention, a contiguous run) of those appended, byte-equal;
2. a kill keeps everything appended; a power loss keeps everything flush() acknowledged;
3. a checkpoint is never partial and never ahead of the log it describes;
4. recover -> append -> flush -> recover still holds;
5. no .tmp/.cleaned/.swap/.deleted file survives recovery; every index is sound against its .log;
6. a compaction swap is all or nothing; every key's latest value survives;
7. deleted segments and topics never come back once deletion returned;
8. a crash during recovery is itself recoverable.

KSTORE_CRASH_FULL=1 tries every prefix of the pending metadata operations (a larger run).
Counts go to tests/.crash-counts.json for the README's reliability section.
"""
import os
import shutil

import pytest

import kstore
from kstore.checkpoint import CheckpointError, OffsetCheckpointFile
from kstore.clock import MockTime
from kstore.tools.dump import dump_index
from kstore.scheduler import MockScheduler

from crash_harness import TracingOps, Tally, explore

FULL = bool(os.environ.get("KSTORE_CRASH_FULL"))
PREFIXES = "all" if FULL else "ends"
NOW = 1_700_000_000_000
LOG_CFG = {"segment.bytes": 700, "segment.index.bytes": 4096, "index.interval.bytes": 120}
TALLY: dict[str, Tally] = {}


def value(o: int) -> bytes:
    return b"value-%06d-" % o + b"x" * 40


def leftovers(path: str) -> list[str]:
    bad = []
    for dp, _dns, fns in os.walk(path):
        bad += [os.path.join(dp, f) for f in fns if f.endswith((".tmp", ".cleaned", ".swap", ".deleted"))]
    return bad


def check_indexes(part: str) -> None:
    """Invariant 5: every index has its .log and passes the dump tool's checks against it."""
    import io as _io
    for name in sorted(os.listdir(part)):
        if name.endswith((".index", ".timeindex")):
            log = os.path.join(part, name.rsplit(".", 1)[0] + ".log")
            assert os.path.exists(log), f"{name} has no .log"
            out = _io.StringIO()
            problems = dump_index(os.path.join(part, name), out, verify_only=True, sanity_check=False,
                                  as_json=False, log_path=log)
            assert problems == 0, out.getvalue()


def check_records(lg, start_at_least=0, exact_start=None):
    """Records from the log start: contiguous and byte-equal to what was appended at those
    offsets. The log end may lie past the last record: an unflushed segment lost in a power
    failure while the next one's (empty) file survived leaves offsets that are never reused,
    as in Kafka."""
    recs = [(r.offset, r.value) for r in lg]
    start = lg.log_start_offset
    if exact_start is not None:
        assert start == exact_start, f"log start {start}, expected {exact_start}"
    assert start >= start_at_least, f"log start {start} went back below {start_at_least} (deleted data returned)"
    offs = [o for o, _ in recs]
    assert offs == list(range(start, start + len(recs))), f"offsets not contiguous: {offs[:5]}..{offs[-5:]}"
    bad = [o for o, v in recs if v != value(o)]
    assert not bad, f"records {bad[:5]} differ from what was appended"
    assert lg.log_end_offset >= start + len(recs)
    return recs


# -- workload 1: a standalone log: appends, flushes, rolls, close ------------------------------------
def log_workload(root: str) -> TracingOps:
    os.makedirs(root)
    ops = TracingOps(root)
    t = MockTime(NOW)
    lg = kstore.Log.open(os.path.join(root, "t-0"), LOG_CFG, io=ops, time=t)
    o = 0
    for i in range(24):
        n = 1 + i % 3
        lg.append([(None, value(o + j), NOW + o + j) for j in range(n)])
        o += n
        ops.mark("appended", o)
        if i % 5 == 4:
            lg.flush()
            ops.mark("flushed", o)
    lg.close()
    ops.mark("flushed", o)
    ops.finish()
    return ops


def check_log_state(state: str, snap, kind: str, cfg=LOG_CFG, probe: int = 1) -> None:
    """A crash state of a standalone log's workload: every promised record recovered, no gap
    after a kill, no leftovers, and the recovered log takes `probe` more records and recovers
    them again."""
    part = os.path.join(state, "t-0")
    need = snap.marks.get("appended" if kind == "kill" else "flushed", 0)
    if not os.path.isdir(part):
        assert need == 0, f"the partition is gone but {need} records were promised"
        return
    with kstore.Log.open(part, cfg) as lg:
        recs = check_records(lg, exact_start=0)
        assert len(recs) >= need, f"{len(recs)} records recovered, {need} promised ({kind})"
        assert len(recs) == lg.log_end_offset or kind != "kill", "a gap after a process kill"
        assert not leftovers(part), leftovers(part)
        n = lg.log_end_offset
        lg.append([(None, value(n + j), NOW + n + j) for j in range(probe)])
        lg.flush()
    with kstore.Log.open(part, cfg) as lg:
        after = [(r.offset, r.value) for r in lg]
        assert after == recs + [(n + j, value(n + j)) for j in range(probe)], \
            "recover -> append -> recover lost or changed records"
    check_indexes(part)


def test_crash_states_of_appends_flushes_and_rolls(tmp_path):
    ops = log_workload(str(tmp_path / "w"))
    assert len(ops.snapshots) > 100
    TALLY["log"] = explore(ops.snapshots, str(tmp_path), check_log_state, prefixes=PREFIXES)


# -- workload 1b: producer-sized batches (pwritten into a fallocated runway) beside small ones ------
BIG_CFG = {"segment.bytes": 150_000, "segment.index.bytes": 4096, "index.interval.bytes": 4096}


def big_log_workload(root: str) -> TracingOps:
    from kstore.segment import PWRITE_MIN_BYTES
    os.makedirs(root)
    ops = TracingOps(root)
    lg = kstore.Log.open(os.path.join(root, "t-0"), BIG_CFG, io=ops, time=MockTime(NOW))
    o = 0
    for i in range(12):
        n = 400 if i % 3 else 2                   # 400 records: ~24 KB, pwritten; 2: copied
        lg.append([(None, value(o + j), NOW + o + j) for j in range(n)])
        assert n == 2 or lg.active_segment.size >= PWRITE_MIN_BYTES or len(lg.segments) > 1
        o += n
        ops.mark("appended", o)
        if i % 4 == 3:
            lg.flush()
            ops.mark("flushed", o)
    lg.close()
    ops.mark("flushed", o)
    ops.finish()
    return ops


def check_big_log_state(state: str, snap, kind: str) -> None:
    check_log_state(state, snap, kind, BIG_CFG, probe=400)


def test_crash_states_of_large_batches_written_by_pwrite(tmp_path):
    ops = big_log_workload(str(tmp_path / "w"))
    assert sum(s.op == "pwrite" for s in ops.snapshots) >= 8      # every large append a crash point
    explore(ops.snapshots, str(tmp_path), check_big_log_state, prefixes=PREFIXES)


# -- workload 2: a LogManager: checkpoints, retention, topic deletion -------------------------------
MGR_CFG = {"log.segment.bytes": 700, "log.index.size.max.bytes": 4096, "log.index.interval.bytes": 120,
           "log.segment.delete.delay.ms": 0, "file.delete.delay.ms": 0, "log.cleaner.enable": False}


def manager(root, io=None, t=None):
    t = t or MockTime(NOW)
    return kstore.LogManager(root, MGR_CFG, io=io, time=t, scheduler=MockScheduler(t))


def manager_workload(root: str) -> TracingOps:
    os.makedirs(root)
    ops = TracingOps(root)
    t = MockTime(NOW)
    m = manager(root, ops, t)
    m.create_topic("keep", 1, {"retention.bytes": 1500})
    m.create_topic("gone", 1)
    ops.mark("topics", ("keep", "gone"))
    o = 0
    for i in range(20):
        m.append_batch("keep", 0, [(None, value(o), NOW + o), (None, value(o + 1), NOW + o + 1)])
        m.append_batch("gone", 0, [(None, value(i), NOW + i)])
        o += 2
        if i % 6 == 5:
            m.log("keep", 0).flush()
            ops.mark("flushed_keep", o)
            m.checkpoint_recovery_offsets()
            m.checkpoint_log_start_offsets()
    m.log("keep", 0).flush()
    ops.mark("flushed_keep", o)
    m.cleanup_logs()                                   # retention by size
    ops.mark("start_keep", m.log("keep", 0).log_start_offset)
    ops.mark("topics_in_flight", ("keep",))           # a crash during the delete may go either way
    m.delete_topic("gone")
    ops.mark("topics", ("keep",))
    ops.mark("topics_in_flight", None)
    m.delete_logs()                                    # the delayed removal of the -delete dir
    m.close()
    ops.finish()
    return ops


def check_manager_state(state: str, snap, kind: str) -> None:
    marks = snap.marks
    with manager(state) as m:
        topics = marks.get("topics")
        if topics is not None:
            allowed = [set(topics)] + ([set(marks["topics_in_flight"])] if marks.get("topics_in_flight") else [])
            assert set(m.topics()) in allowed, f"topics {m.topics()} after the store held {topics}"
        if "keep" in m.topics():
            lg = m.log("keep", 0)
            recs = check_records(lg, start_at_least=marks.get("start_keep", 0))
            need = marks.get("flushed_keep", 0)
            assert lg.log_end_offset >= need, f"log end {lg.log_end_offset}, {need} flushed"
            # a checkpoint written by this store is whole and not ahead of its log
            for name in ("recovery-point-offset-checkpoint", "log-start-offset-checkpoint"):
                p = os.path.join(state, name)
                if os.path.exists(p):
                    try:
                        cp = OffsetCheckpointFile(p).read()
                    except CheckpointError as e:
                        raise AssertionError(f"partial checkpoint: {e}") from e
                    assert cp.get(("keep", 0), 0) <= lg.log_end_offset, f"{name} ahead of the log: {cp}"
            n = lg.log_end_offset
            m.append_batch("keep", 0, [(None, value(n), NOW + n)])
            lg.flush()
        else:
            assert topics is None, "topic keep vanished"
    assert not leftovers(state), leftovers(state)
    with manager(state) as m:
        if "keep" in m.topics():
            after = [(r.offset, r.value) for r in m.log("keep", 0)]
            assert after == recs + [(n, value(n))], "recover -> append -> recover lost or changed records"
    if os.path.isdir(os.path.join(state, "keep-0")):
        check_indexes(os.path.join(state, "keep-0"))


def test_crash_states_of_checkpoints_retention_and_topic_deletion(tmp_path):
    ops = manager_workload(str(tmp_path / "w"))
    TALLY["manager"] = explore(ops.snapshots, str(tmp_path), check_manager_state, prefixes=PREFIXES)


# -- workload 3: a compaction swap ---------------------------------------------------------------
def compact_setup(root: str) -> list:
    """A compacted topic with 60 records over 20 keys in several segments, cleanly closed."""
    with manager(root) as m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01,
                                "segment.bytes": 500})
        for i in range(60):
            m.append_batch("c", 0, [(b"k%d" % (i % 20), value(i), NOW + i)])
        m.log("c", 0).roll()
        return [(r.offset, r.key, r.value) for r in m.log("c", 0)]


def compact_workload(root: str) -> TracingOps:
    ops = TracingOps(root)
    t = MockTime(NOW)
    m = kstore.LogManager(root, dict(MGR_CFG, **{"log.cleaner.enable": True, "log.cleaner.threads": 0}),
                          io=ops, time=t, scheduler=MockScheduler(t))
    m.clean_now()
    ops.mark("cleaned", True)
    m.close()
    ops.finish()
    return ops


def test_crash_states_of_a_compaction_swap(tmp_path):
    """Every crash of clean_now (write .cleaned, rename to .swap, retire the old segments, drop
    the suffix) recovers each group's swap whole: the records are the old ones less superseded
    ones, never missing a record the compacted log keeps, never invented."""
    root = str(tmp_path / "w")
    before = compact_setup(root)
    dry = str(tmp_path / "dry")
    shutil.copytree(root, dry)
    with kstore.LogManager(dry, dict(MGR_CFG, **{"log.cleaner.enable": True, "log.cleaner.threads": 0})) as m:
        m.clean_now()
        after = [(r.offset, r.key, r.value) for r in m.log("c", 0)]
    assert len(after) == 20 and len(before) == 60
    latest = {k: (o, v) for o, k, v in before}

    def check(state, snap, kind):
        with manager(state) as m:
            recs = [(r.offset, r.key, r.value) for r in m.log("c", 0)]
            # each group's swap is atomic; a crash between groups leaves some groups cleaned
            assert set(after) <= set(recs) <= set(before), \
                f"{len(recs)} records: not the old records less some superseded ones"
            if snap.marks.get("cleaned") and kind == "kill":
                assert recs == after, "a finished clean was undone"
            assert {k: (o, v) for o, k, v in recs} == latest, "a key lost its latest value"
        assert not leftovers(state), leftovers(state)
        check_indexes(os.path.join(state, "c-0"))

    ops = compact_workload(root)
    assert any(s.op == "rename" for s in ops.snapshots)
    TALLY["compaction"] = explore(ops.snapshots, str(tmp_path), check, prefixes=PREFIXES)


# -- a crash during recovery ----------------------------------------------------------------------
def test_a_crash_during_recovery_is_recoverable(tmp_path):
    """Power-loss states that need recovery (torn, zeroed, garbage tails) are recovered under the
    harness, and every crash of that recovery is checked against the original promises."""
    from crash_harness import materialise
    ops = log_workload(str(tmp_path / "w"))
    total = Tally()
    picked = [s for s in ops.snapshots if s.marks.get("flushed")][::(8 if FULL else 30)]
    assert len(picked) >= 3
    for i, snap in enumerate(picked):
        for mode in ("torn", "garbage"):
            crashed = str(tmp_path / f"crashed-{i}-{mode}")
            os.makedirs(crashed)
            materialise(snap, os.path.join(crashed, "w"), kill=False, mode=mode, prefix=len(snap.pending))
            root = os.path.join(crashed, "w")
            rec = TracingOps(root)
            part = os.path.join(root, "t-0")
            if os.path.isdir(part):
                kstore.Log.open(part, LOG_CFG, io=rec, time=MockTime(NOW)).close()
            rec.finish()

            def check(state, rsnap, kind, snap=snap):
                check_log_state(state, snap, "power")    # the promises made before the first crash
            explore(rec.snapshots, str(tmp_path / f"x-{i}-{mode}"), check, prefixes=PREFIXES,
                    modes=("synced", "zero") if not FULL else ("synced", "all", "torn", "zero"), tally=total)
    TALLY["recovery"] = total


@pytest.fixture(scope="module", autouse=True)
def _file_counts(reliability_counts):
    yield
    reliability_counts.update({k: v.__dict__ for k, v in TALLY.items()})
