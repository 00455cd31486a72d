"""Crash states of a topic deletion (tests/crash_harness.py): at every crash point of
LogManager.delete_topic, kill or power loss, the next start-up leaves the topic either whole
(with its committed offsets, which still apply to it) or gone with no group's committed offset
of it left, so a topic created again under the name is read from auto_offset_reset and not
resumed at the deleted topic's offsets (which skipped its first records)."""
from __future__ import annotations

from crash_harness import TracingOps, explore

from kstore import Consumer, LogManager, TopicPartition as TP
from kstore.group_coordinator import GroupCoordinator


def test_delete_topic_crash_states_leave_no_offsets_of_a_gone_topic(tmp_path, reliability_counts):
    root = str(tmp_path / "store")
    with LogManager(root) as m:
        m.create_topic("t", 2)
        m.create_topic("u", 1)
        for p in range(2):
            m.append_batch("t", p, [(None, b"old%d" % i) for i in range(100)])
        m.append_batch("u", 0, [(None, b"u")] * 7)
        with GroupCoordinator(m) as gc:
            gc.commit_offsets("g", {TP("t", 0): 100, TP("t", 1): 60})
            gc.commit_offsets("h", {TP("u", 0): 7, TP("t", 1): 30})
    ops = TracingOps(root)
    m = LogManager(root, io=ops)
    ops.mark("deleting", True)
    m.delete_topic("t")
    ops.mark("deleted", True)
    m.close()
    assert len(ops.snapshots) > 20
    seen = {"kept": 0, "gone": 0}

    def check(d, snap, kind):
        with LogManager(d) as m2:
            with GroupCoordinator(m2) as gc:
                g, h = gc.fetch_offsets("g"), gc.fetch_offsets("h")
            if "t" in m2.topics():           # the deletion was not recorded: all of it stays
                assert not snap.marks.get("deleted"), kind
                assert {tp: o.offset for tp, o in g.items()} == {TP("t", 0): 100, TP("t", 1): 60}, kind
                seen["kept"] += 1
                return
            assert snap.marks.get("deleting"), kind
            assert g == {}, (kind, g)
            assert {tp: o.offset for tp, o in h.items()} == {TP("u", 0): 7}, (kind, h)
            m2.create_topic("t", 2)          # not left "marked for deletion"
            m2.append_batch("t", 0, [(None, b"new%d" % i) for i in range(5)])
            with Consumer(m2, "t", group_id="g", auto_offset_reset="earliest") as c:
                got = c.poll(timeout_ms=5000)
            assert [r.value for r in got[TP("t", 0)]] == [b"new%d" % i for i in range(5)], kind
            seen["gone"] += 1

    tally = explore(ops.snapshots, str(tmp_path / "states"), check, prefixes="ends",
                    modes=("synced", "all"))
    assert seen["kept"] > 0 and seen["gone"] > 0, seen
    reliability_counts["delete_topic"] = {"states": tally.states, "distinct": tally.distinct}
