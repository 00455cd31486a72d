"""GroupCoordinator.commit_offsets checks its partitions against the store's topics, as Kafka's
broker answers an OffsetCommit of a partition it does not host with UNKNOWN_TOPIC_OR_PARTITION:
a topic that does not exist (or is being deleted) or a partition beyond the topic's count raises
UnknownTopicError and nothing of the commit is written; a broker's log dirs holding some
partitions of a topic accept the others below its recorded count."""
from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest

from kstore import Consumer, LogManager, TopicPartition, UnknownTopicError
from kstore.group_coordinator import GroupCoordinator
from kstore.group_records import partition_for
from thread_watchdog import join_all

TP = TopicPartition


def _offsets_log_end(d: str, group: str) -> int:
    """How many records the group's __consumer_offsets partition holds (0: none yet)."""
    from kstore import Log
    path = os.path.join(d, f"__consumer_offsets-{partition_for(group, 50)}")
    if not os.path.exists(path):
        return 0
    with Log.open(path, read_only=True) as lg:
        return lg.log_end_offset


@pytest.mark.parametrize("on", ["log_dirs", "manager"])
def test_commit_of_an_unknown_topic_or_partition_writes_nothing(tmp_path, on):
    """Unknown topic, partition beyond the count, and a commit mixing them with a good one:
    UnknownTopicError naming the partitions, the offsets partition unchanged; the good one
    alone commits. The same through a LogManager (in memory) and through the log dirs."""
    d = str(tmp_path)
    with LogManager(d) as m:
        m.create_topic("t", 2)
        store = m if on == "manager" else d
        with GroupCoordinator(store) as gc:
            gc.commit_offsets("g", {TP("t", 1): 4})
            before = _offsets_log_end(d, "g")
            for bad in ({TP("nope", 0): 3}, {TP("t", 2): 3}, {TP("t", -1): 3},
                        {TP("t", 0): 5, TP("nope", 0): 3, TP("t", 7): 1}):
                with pytest.raises(UnknownTopicError) as e:
                    gc.commit_offsets("g", bad)
                unknown = sorted(tp for tp in bad if tp.topic == "nope" or not 0 <= tp.partition < 2)
                assert e.value.partitions == frozenset(unknown)
                assert str(e.value) == ("cannot commit offsets of " + ", ".join(map(str, unknown))
                                        + ": This server does not host this topic-partition.")
                assert _offsets_log_end(d, "g") == before
            assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 1): 4}
            gc.commit_offsets("g", {TP("t", 0): 5})
            assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 5, TP("t", 1): 4}


def test_a_brokers_partial_log_dirs_accept_partitions_held_elsewhere(tmp_path):
    """A broker's dir holds partitions 0 and 3 of a topic: with its count unknown only they are
    hosted; once set_partition_count(8) records the count, 1-7 are accepted and 8 is not."""
    d = str(tmp_path)
    from kstore import Log
    for p in (0, 3):
        Log.open(os.path.join(d, f"b-{p}")).close()
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("b", 0): 1, TP("b", 3): 1})
        with pytest.raises(UnknownTopicError):
            gc.commit_offsets("g", {TP("b", 5): 1})
        with LogManager(d) as m:
            m.set_partition_count("b", 8)
        gc.commit_offsets("g", {TP("b", 5): 2, TP("b", 7): 2})
        with pytest.raises(UnknownTopicError):
            gc.commit_offsets("g", {TP("b", 8): 2})
        assert {tp.partition: o.offset for tp, o in gc.fetch_offsets("g").items()} == {0: 1, 3: 1, 5: 2, 7: 2}


def test_consumer_commit_of_an_unknown_partition_raises(tmp_path):
    """Consumer.commit(offsets) of a partition the store does not host raises UnknownTopicError
    (Kafka's commitSync fails on UNKNOWN_TOPIC_OR_PARTITION) and commits none of the batch."""
    d = str(tmp_path)
    with LogManager(d) as m:
        m.create_topic("t", 1)
        m.append_batch("t", 0, [(None, b"x")] * 3)
    with Consumer(d, group_id="g", enable_auto_commit=False) as c:
        with pytest.raises(UnknownTopicError):
            c.commit({TP("t", 0): 2, TP("t", 1): 1})
        assert c.committed(TP("t", 0)) is None
        c.commit({TP("t", 0): 2})
        assert c.committed(TP("t", 0)) == 2


CREATOR = r"""
import sys, kstore
m = kstore.LogManager(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
m.create_topic("late", 2)
print("created", flush=True)
sys.stdin.readline()
m.delete_topic("late")
m.close()
print("deleted", flush=True)
"""


def test_threads_commit_while_another_process_creates_and_deletes_the_topic(tmp_path, watchdog):
    """Threads commit offsets of topic t (which exists all along) and of topic late, which
    another process creates, then deletes: every commit of t succeeds; commits of late fail
    with UnknownTopicError before its creation and after its deletion, succeed between; the
    group ends with t's last offsets and no offset of late (the deletion removed them, and no
    commit refused afterwards wrote one)."""
    watchdog(120)
    d = str(tmp_path)
    with LogManager(d) as m:
        m.create_topic("t", 4)
    child = subprocess.Popen([sys.executable, "-c", CREATOR, d], cwd=d, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    assert child.stdout.readline() == "ready\n"
    phase = ["before"]
    outcomes: dict[str, list] = {"before": [], "during": [], "after": []}
    errors: list = []
    stop = threading.Event()

    def committer(i):
        with GroupCoordinator(d) as gc:
            n = 0
            while not stop.is_set():
                n += 1
                try:
                    gc.commit_offsets("g", {TP("t", i): n})
                    p = phase[0]
                    try:
                        gc.commit_offsets("g", {TP("late", i % 2): n})
                        outcomes[p].append(("ok", p == phase[0]))
                    except UnknownTopicError:
                        outcomes[p].append(("unknown", p == phase[0]))
                except Exception as e:        # noqa: BLE001  (reported below)
                    errors.append(e)
                    return
            gc.commit_offsets("g", {TP("t", i): 1_000_000 + i})
    threads = [threading.Thread(target=committer, args=(i,), name=f"committer-{i}") for i in range(4)]
    for t in threads:
        t.start()
    import time
    time.sleep(0.3)
    phase[0] = "during"
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline() == "created\n"
    time.sleep(0.3)
    phase[0] = "after"
    child.stdin.write("\n")
    child.stdin.flush()
    assert child.stdout.readline() == "deleted\n"
    time.sleep(0.3)
    stop.set()
    join_all(threads, 60)
    assert child.wait(60) == 0
    assert errors == []
    # a phase's outcome counts only if the phase did not change during the commit
    assert {o for o, same in outcomes["before"] if same} == {"unknown"}
    assert "ok" in {o for o, same in outcomes["during"] if same}
    with GroupCoordinator(d) as gc:
        got = {tp: o.offset for tp, o in gc.fetch_offsets("g").items()}
    assert got == {TP("t", i): 1_000_000 + i for i in range(4)}


def test_a_commit_in_flight_when_its_topic_is_deleted_is_tombstoned(tmp_path, watchdog):
    """A commit of topic late (the group's first offset of it) has passed its check and holds
    the group's offsets partition when delete_topic, in another thread, tombstones the groups'
    offsets of late: the deletion waits for that commit and tombstones it, so late created again
    has no committed offset. Before, the deletion saw no offset of late in the partition, left
    it without waiting, and the commit landed after: the new late resumed at offset 5."""
    watchdog(60)
    d = str(tmp_path)
    with LogManager(d) as m:
        m.create_topic("late", 1)
        with GroupCoordinator(d) as gc:
            checked, go = threading.Event(), threading.Event()
            real = gc._hosted.unknown

            def unknown(tps):                    # the commit's check, then a pause (flock held)
                got = real(tps)
                checked.set()
                go.wait(10)
                return got
            gc._hosted.unknown = unknown         # type: ignore[method-assign]
            errors: list = []

            def run(fn):
                try:
                    fn()
                except Exception as e:           # noqa: BLE001  (asserted below)
                    errors.append(e)
            committer = threading.Thread(target=run, name="committer",
                                         args=(lambda: gc.commit_offsets("g", {TP("late", 0): 5}),))
            committer.start()
            assert checked.wait(10)
            deleter = threading.Thread(target=run, name="deleter", args=(lambda: m.delete_topic("late"),))
            deleter.start()
            deleter.join(0.5)                    # done already: it did not wait for the commit
            go.set()
            join_all([committer, deleter], 30)
            assert errors == []
        m.create_topic("late", 1)
        with GroupCoordinator(d) as gc:
            assert gc.fetch_offsets("g") == {}
