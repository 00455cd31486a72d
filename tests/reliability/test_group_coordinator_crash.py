"""Crash states of committers (tests/crash_harness.py): a commit that returned survives a
process kill at every later operation; at every crash point, kill or power loss, a commit is
all or nothing (one batch) and the next committer opens, recovers and commits after it."""
from __future__ import annotations

from crash_harness import TracingOps, explore

from kstore import LogManager, TopicPartition as TP
from kstore.clock import MockTime
from kstore.group_coordinator import GroupCoordinator
from kstore.group_records import GroupMetadata

NOW = 1_700_000_000_000


def test_commit_crash_states(tmp_path, reliability_counts):
    root = tmp_path / "store"
    root.mkdir()
    with LogManager(str(root)) as m:                   # the topics committed (they must exist)
        m.create_topic("t", 2)
        m.create_topic("u", 1)
    ops = TracingOps(str(root))
    cfg = {"offsets.topic.segment.bytes": 700}          # rolls during the workload
    gc = GroupCoordinator(str(root), io=ops, time=MockTime(NOW), config=cfg)
    for i in range(1, 13):
        gc.commit_offsets("g", {TP("t", 0): i, TP("t", 1): 100 + i, TP("u", 0): 200 + i})
        ops.mark("committed", i)
        if i == 6:
            gc.store_group("g", GroupMetadata("consumer", 1, None, None, NOW, ()))
            ops.mark("group", 1)
    gc.close()
    assert len(ops.snapshots) > 50          # every commit's operations are crash points
    checked = []

    def check(d, snap, kind):
        committed = snap.marks.get("committed", 0)
        with GroupCoordinator(d, config=cfg) as c:
            got = {tp: o.offset for tp, o in c.fetch_offsets("g").items()}
            if got:
                n = got[TP("t", 0)]
                # all of one commit or none of it: the three offsets move together
                assert got == {TP("t", 0): n, TP("t", 1): 100 + n, TP("u", 0): 200 + n}, (kind, got)
                assert n <= committed + 1
            else:
                n = 0
            if kind == "kill":
                # every commit that returned is there (at most the one in flight beyond it)
                assert n in (committed, committed + 1), (kind, committed, got)
                if snap.marks.get("group"):
                    assert c.group("g") is not None
            c.commit_offsets("g", {TP("t", 0): 1000, TP("t", 1): 1100, TP("u", 0): 1200})
            assert c.fetch_offsets("g")[TP("u", 0)].offset == 1200
        with GroupCoordinator(d, config=cfg) as c:
            assert c.fetch_offsets("g")[TP("t", 1)].offset == 1100
        checked.append(kind)

    tally = explore(ops.snapshots, str(tmp_path / "states"), check, prefixes="ends")
    assert tally.kill > 10 and "kill" in checked
    reliability_counts["group_coordinator"] = {"states": tally.states, "distinct": tally.distinct}
