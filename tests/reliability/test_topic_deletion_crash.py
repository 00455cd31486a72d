"""Crash states of a topic deletion's retry (kstore.topic_deletion; tests/crash_harness.py): the
deletion's tombstoning failed (EIO on the offsets flock), then the running manager retried it.
At every crash point of the retry, kill or power loss, the deletion stays recorded until the
offsets are gone for good: the next start-up finds either the record (and finishes it) or no
offset of the topic, never the record gone with offsets left; a topic created again under the
name is read from auto_offset_reset, not resumed at the deleted topic's offsets."""
from __future__ import annotations

import errno
import os

from crash_harness import TracingOps, explore

from kstore import Consumer, LogManager, TopicPartition as TP
from kstore.group_coordinator import GroupCoordinator
from kstore.topics import TopicConfigFile


class OffsetsLockFailsTracing(TracingOps):
    """TracingOps whose flock of a __consumer_offsets partition fails (EIO) while `failing`."""

    failing = False

    def try_lock(self, path, *, shared=False, directory=False):
        if self.failing and os.path.basename(path).startswith("__consumer_offsets-"):
            raise OSError(errno.EIO, f"injected: cannot lock {path}")
        return super().try_lock(path, shared=shared, directory=directory)


def test_retry_crash_states_leave_no_offsets_of_a_gone_topic(tmp_path, reliability_counts):
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
    ops = OffsetsLockFailsTracing(root)
    m = LogManager(root, io=ops)
    ops.failing = True
    m.delete_topic("t")
    ops.failing = False
    first = len(ops.snapshots)
    ops.mark("pending", True)
    assert m.retry_deletions(wait=True) is True
    ops.mark("retried", True)
    m.close()
    assert len(ops.snapshots) - first > 10
    seen = {"recorded": 0, "done": 0}

    def check(d, snap, kind):
        doc = TopicConfigFile.read([d])
        assert doc is not None and "t" not in doc.topics, kind
        if doc.deleting == ["t"]:
            assert not snap.marks.get("retried"), kind       # a retry that returned is durable
            seen["recorded"] += 1
        else:
            assert doc.deleting == [], kind
            seen["done"] += 1
        with LogManager(d) as m2:                # a record left: the start-up finishes it
            assert m2.topics() == ["u"], kind
            with GroupCoordinator(m2) as gc:
                g, h = gc.fetch_offsets("g"), gc.fetch_offsets("h")
            assert g == {}, (kind, g)
            assert {tp: o.offset for tp, o in h.items()} == {TP("u", 0): 7}, (kind, h)
            m2.create_topic("t", 2)
            m2.append_batch("t", 0, [(None, b"new%d" % i) for i in range(5)])
            with Consumer(m2, "t", group_id="g", auto_offset_reset="earliest") as c:
                got = c.poll(timeout_ms=5000)
            assert [r.value for r in got[TP("t", 0)]] == [b"new%d" % i for i in range(5)], kind

    tally = explore(ops.snapshots[first:], str(tmp_path / "states"), check, prefixes="ends",
                    modes=("synced", "all"))
    assert seen["recorded"] > 0 and seen["done"] > 0, seen
    reliability_counts["topic_deletion_retry"] = {"states": tally.states, "distinct": tally.distinct}
