"""GroupCoordinator: committed offsets and group metadata in shared-writer __consumer_offsets
partitions (offsets_topic.py): exact records on disk, other processes committing and reading,
a LogManager beside the committers, expiry, compaction, crashes of a committer."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from kstore import InvalidConfigError, Log, LogManager, TopicPartition
from kstore.clock import MockTime
from kstore.group_coordinator import GroupCoordinator, GroupIdNotFoundError, GroupNotEmptyError
from kstore.group_records import (GroupMetadata, MemberMetadata, OffsetAndMetadata,
                                  assignment_bytes, group_metadata_key, offset_commit_key, offset_commit_value, partition_for,
                                  subscription_bytes)
from kstore.offsets_topic import GROUPS_DIR, TOPIC_FILE, CoordinatorLockTimeout
from kstore.scheduler import MockScheduler

TP = TopicPartition
NOW = 1_700_000_000_000
# children run outside the checkout (cwd = the store) with the test's own sys.path setting
# (PYTHONPATH as given): CI runs the suite against the installed package, and the checkout's
# kstore/ has no built core there


def host(d):
    """Topics t (10 partitions), u (4), x and gone (1) in store d: what the tests commit offsets of
    (commit_offsets refuses partitions the store does not host)."""
    with LogManager(d) as m:
        for topic, n in (("t", 10), ("u", 4), ("x", 1), ("gone", 1)):
            m.create_topic(topic, n)


def part_dir(d, group, n=50):
    return os.path.join(d, f"__consumer_offsets-{partition_for(group, n)}")


def batches(path):
    """The records of every batch, batch by batch, read back independently of the coordinator
    (a read-only Log's raw batches: base offset, last offset delta and record count from the
    v2 header)."""
    out = []
    with Log.open(path, read_only=True) as lg:
        off = lg.log_start_offset
        while off < lg.log_end_offset:
            raw = bytes(lg.read_batches(off))
            pos = 0
            while pos + 61 <= len(raw):
                base = int.from_bytes(raw[pos:pos + 8], "big")
                size = 12 + int.from_bytes(raw[pos + 8:pos + 12], "big")
                last = base + int.from_bytes(raw[pos + 23:pos + 27], "big")
                count = int.from_bytes(raw[pos + 57:pos + 61], "big")
                if count:
                    out.append(lg.read(base, max_records=count))
                off = last + 1
                pos += size
    return out


def test_commit_is_one_batch_of_kafka_records(tmp_path):
    d = str(tmp_path)
    host(d)
    t = MockTime(NOW)
    with GroupCoordinator(d, time=t) as gc:
        gc.commit_offsets("g", {TP("t", 0): 5, TP("t", 1): OffsetAndMetadata(7, "meta", 3)})
        t.sleep(10)
        gc.commit_offsets("g", {TP("t", 0): OffsetAndMetadata(9, commit_timestamp=NOW - 1)})
        p = part_dir(d, "g")
        with Log.open(p, read_only=True) as lg:
            assert lg.log_end_offset == 3
            recs = lg.read(0)
        assert [(r.offset, r.key, r.value, r.timestamp) for r in recs] == [
            (0, offset_commit_key("g", "t", 0), offset_commit_value(OffsetAndMetadata(5, "", None, NOW)), NOW),
            (1, offset_commit_key("g", "t", 1), offset_commit_value(OffsetAndMetadata(7, "meta", 3, NOW)), NOW),
            (2, offset_commit_key("g", "t", 0), offset_commit_value(OffsetAndMetadata(9, "", None, NOW - 1)), NOW - 1)]
        # one batch per commit: the first holds offsets 0-1
        with Log.open(p, read_only=True) as lg:
            raw = bytes(lg.read_batches(0))
        assert int.from_bytes(raw[0:8], "big") == 0 and int.from_bytes(raw[23:27], "big") == 1
        assert raw[16] == 2                                   # magic v2
        second = 12 + int.from_bytes(raw[8:12], "big")
        assert int.from_bytes(raw[second:second + 8], "big") == 2
        assert gc.fetch_offsets("g") == {TP("t", 0): OffsetAndMetadata(9, "", None, NOW - 1),
                                         TP("t", 1): OffsetAndMetadata(7, "meta", 3, NOW)}
        assert gc.fetch_offsets("g", [("t", 1), TP("x", 0)]) == {TP("t", 1): OffsetAndMetadata(7, "meta", 3, NOW)}
        assert gc.fetch_offsets("other") == {}
    # the partition directory is Kafka's: partition.metadata, the leader epoch cache (epoch 0
    # from offset 0, as a broker's first leader), no kstore marker, no lock files
    names = sorted(os.listdir(p))
    assert names == [".kstore-notify", "00000000000000000000.index", "00000000000000000000.log",
                     "00000000000000000000.timeindex", "leader-epoch-checkpoint", "partition.metadata"]
    assert open(os.path.join(p, "leader-epoch-checkpoint")).read() == "0\n1\n0 0\n"
    rec = json.loads(open(os.path.join(d, GROUPS_DIR, TOPIC_FILE)).read())
    assert rec["num_partitions"] == 50
    assert open(os.path.join(p, "partition.metadata")).read() == f"version: 0\ntopic_id: {rec['topic_id']}\n"
    # a clean close trims the runway: the .log holds exactly the two batches
    assert os.path.getsize(os.path.join(p, "00000000000000000000.log")) == len(raw)


def test_store_group_list_and_delete(tmp_path):
    d = str(tmp_path)
    host(d)
    m = MemberMetadata("c-1", None, "c", "/127.0.0.1", 300000, 45000, subscription_bytes(["t"]),
                       assignment_bytes([TP("t", 0)]))
    g = GroupMetadata("consumer", 3, "range", "c-1", NOW, (m,))
    with GroupCoordinator(d) as gc:
        assert gc.list_groups() == [] and gc.group("a") is None
        gc.store_group("a", g)
        gc.commit_offsets("b", {TP("t", 0): 1})
        gc.commit_offsets("a", {TP("t", 0): 4, TP("u", 2): 8})
        assert gc.group("a") == g
        assert gc.list_groups() == ["a", "b"]
        last = batches(part_dir(d, "a"))[-1] if partition_for("a", 50) != partition_for("b", 50) else None
        assert last is not None and len(last) == 2
    with GroupCoordinator(d) as gc:          # another coordinator reads it all back
        assert gc.group("a") == g
        assert gc.fetch_offsets("a") == {TP("t", 0): gc.fetch_offsets("a")[TP("t", 0)],
                                         TP("u", 2): gc.fetch_offsets("a")[TP("u", 2)]}
        gc.delete_group("a")
        assert gc.group("a") is None and gc.fetch_offsets("a") == {}
        assert gc.list_groups() == ["b"]
        tomb = batches(part_dir(d, "a"))[-1]
        assert sorted((r.key, r.value) for r in tomb) == sorted(
            [(offset_commit_key("a", "t", 0), None), (offset_commit_key("a", "u", 2), None),
             (group_metadata_key("a"), None)])
        with pytest.raises(GroupIdNotFoundError, match=r"^group 'nobody' does not exist$"):
            gc.delete_group("nobody")        # Kafka's GROUP_ID_NOT_FOUND: no write
        assert len(batches(part_dir(d, "a"))) == 3     # group, commit, tombstones


def test_delete_group_refuses_live_members(tmp_path, monkeypatch):
    host(str(tmp_path))
    with GroupCoordinator(str(tmp_path)) as gc:
        gc.commit_offsets("g", {TP("t", 0): 1})
        live = [MemberMetadata("m-1", None, "c", "/h", 1, 1, b"", b"")]
        monkeypatch.setattr(gc, "live_members", lambda g: live)
        with pytest.raises(GroupNotEmptyError, match="m-1"):
            gc.delete_group("g")
        assert gc.fetch_offsets("g") == {TP("t", 0): gc.fetch_offsets("g")[TP("t", 0)]}


def test_partition_count_is_fixed_once_written(tmp_path):
    d = str(tmp_path)
    host(d)
    with GroupCoordinator(d, num_partitions=3) as gc:
        assert gc.partition_for("foo") == partition_for("foo", 3)
        gc.commit_offsets("foo", {TP("t", 0): 1})
    with pytest.raises(InvalidConfigError, match="3 partitions"):
        GroupCoordinator(d, num_partitions=5)
    with GroupCoordinator(d) as gc:          # the recorded count, not the default 50
        assert gc.num_partitions == 3
        assert gc.fetch_offsets("foo")[TP("t", 0)].offset == 1
    with GroupCoordinator([str(tmp_path / "other"), d]) as gc:   # found in any log dir
        assert gc.num_partitions == 3
        assert gc.log_dir_for("foo") == d


def test_lock_timeout_names_the_holder(tmp_path):
    d = str(tmp_path)
    host(d)
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("t", 0): 1})
        # a standalone writable Log of the partition takes the same flock
        with Log.open(part_dir(d, "g")):
            gc2 = GroupCoordinator(d, lock_timeout=0.2)
            t0 = time.monotonic()
            with pytest.raises(CoordinatorLockTimeout, match=f"pid {os.getpid()}"):
                gc2.commit_offsets("g", {TP("t", 0): 2})
            assert time.monotonic() - t0 < 5
            gc2.close()
        gc.commit_offsets("g", {TP("t", 0): 3})
        assert gc.fetch_offsets("g")[TP("t", 0)].offset == 3


def test_readers_bell_rings_on_commit(tmp_path, watchdog):
    watchdog(60)
    d = str(tmp_path)
    host(d)
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("t", 0): 1})
        with Log.open(part_dir(d, "g"), read_only=True) as lg:
            woke = []
            th = threading.Thread(target=lambda: woke.append(lg.wait_for(1, timeout=30)))
            th.start()
            time.sleep(0.1)
            with GroupCoordinator(d) as other:      # another writer, its own flock and Log
                other.commit_offsets("g", {TP("t", 0): 2})
            th.join(30)
            assert woke == [True]
        # our kept Log is stale now (the word moved): the next commit reopens, loses nothing
        gc.commit_offsets("g", {TP("t", 1): 5})
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 2, TP("t", 1): 5}
        assert len(batches(part_dir(d, "g"))) == 3


def test_threads_commit_concurrently(tmp_path, watchdog):
    watchdog(120)
    from thread_watchdog import join_all
    d = str(tmp_path)
    host(d)
    gcs = [GroupCoordinator(d), GroupCoordinator(d)]      # two coordinators, two fds: flocks

    def work(i):
        gc = gcs[i % 2]
        for n in range(1, 51):
            gc.commit_offsets("g", {TP("t", i): n})
    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    join_all(threads, 100)
    for gc in gcs:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", i): 50 for i in range(4)}
    assert sum(len(b) for b in batches(part_dir(d, "g"))) == 200
    for gc in gcs:
        gc.close()


CHILD = textwrap.dedent("""
    import sys, time
    from kstore.group_coordinator import GroupCoordinator
    from kstore import TopicPartition as TP
    d, role, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    gc = GroupCoordinator(d)
    if role == "commit":
        part = int(sys.argv[4])
        for i in range(1, n + 1):
            gc.commit_offsets("g", {TP("t", part): i, TP("u", part): i})
            print(i, flush=True)
    elif role == "read":
        seen = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            got = {tp: o.offset for tp, o in gc.fetch_offsets("g").items()}
            for tp, o in got.items():
                assert o >= seen.get(tp, 0), (tp, o, seen)
                assert got[TP("u", tp.partition)] >= 0
            seen = got
            if len(got) == 4 and all(v == n for v in got.values()):
                print("done", flush=True)
                break
        else:
            print("timeout", seen, flush=True)
    elif role == "hold":
        print("ready", flush=True)
        for i in range(1, 10**9):
            gc.commit_offsets("g", {TP("t", 0): i})
            print(i, flush=True)
    gc.close()
""")


def child(d, *args):
    return subprocess.Popen([sys.executable, "-c", CHILD, d, *map(str, args)], cwd=d,
                            stdout=subprocess.PIPE, text=True)


def test_processes_commit_while_another_reads(tmp_path):
    d = str(tmp_path)
    host(d)
    n = 150
    GroupCoordinator(d).close()
    reader = child(d, "read", n)
    writers = [child(d, "commit", n, 0), child(d, "commit", n, 1)]
    outs = [w.communicate(timeout=120)[0].split() for w in writers]
    assert [o[-1] for o in outs] == [str(n), str(n)]
    assert reader.communicate(timeout=120)[0].strip() == "done"
    assert all(p.returncode == 0 for p in writers + [reader])
    with GroupCoordinator(d) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {
            TP("t", 0): n, TP("u", 0): n, TP("t", 1): n, TP("u", 1): n}
    # every commit is one batch of its two records: 2n batches, 4n records, nothing torn
    bs = batches(part_dir(d, "g"))
    assert len(bs) == 2 * n and all(len(b) == 2 for b in bs)


def test_kill9_of_a_committer_keeps_every_returned_commit(tmp_path):
    d = str(tmp_path)
    host(d)
    for round_ in range(3):
        p = child(d, "hold", 0)
        assert p.stdout.readline().strip() == "ready"
        last = 0
        deadline = time.monotonic() + 0.2 + 0.15 * round_
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                break
            last = int(line)
        os.kill(p.pid, signal.SIGKILL)
        rest = p.stdout.read().split()     # (not communicate(): it skips what readline buffered)
        p.wait(30)
        last = int(rest[-1]) if rest else last
        with GroupCoordinator(d) as gc:
            got = gc.fetch_offsets("g")[TP("t", 0)].offset
            # every returned commit is there; at most one more landed before the kill
            assert got in (last, last + 1), (got, last)
            gc.commit_offsets("g", {TP("t", 9): round_})    # the next opener writes after it
            assert gc.fetch_offsets("g")[TP("t", 9)].offset == round_


def test_commit_after_a_torn_tail(tmp_path):
    d = str(tmp_path)
    host(d)
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("t", 0): 1})
    seg = os.path.join(part_dir(d, "g"), "00000000000000000000.log")
    good = os.path.getsize(seg)
    with open(seg, "ab") as f:                # a half-written batch a killed committer left
        f.write(offset_commit_value(OffsetAndMetadata(2))[:3] + b"\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x01\x00\xde\xad")
    with GroupCoordinator(d) as gc:
        assert gc.fetch_offsets("g")[TP("t", 0)].offset == 1
        gc.commit_offsets("g", {TP("t", 0): 3})
        assert gc.fetch_offsets("g")[TP("t", 0)].offset == 3
    assert [len(b) for b in batches(part_dir(d, "g"))] == [1, 1]
    assert os.path.getsize(seg) > good


def test_manager_in_another_process_beside_commits(tmp_path):
    d = str(tmp_path)
    with LogManager(d) as m:
        m.create_topic("t", 2)
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("t", 0): 1})
    code = textwrap.dedent("""
        import sys
        from kstore import LogManager
        m = LogManager(sys.argv[1])
        print(sorted(m.topics()), sorted(m.logs()), flush=True)
        sys.stdin.readline()
        print(sorted(m.topics()), flush=True)
        m.close()
    """)
    p = subprocess.Popen([sys.executable, "-c", code, d], cwd=d, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        first = p.stdout.readline().strip()
        assert first == "['t'] [('t', 0), ('t', 1)]"
        with GroupCoordinator(d) as gc:      # no LogDirLockedError: the manager's .lock is not ours
            for i in range(2, 20):
                gc.commit_offsets("g", {TP("t", 0): i})
            assert gc.fetch_offsets("g")[TP("t", 0)].offset == 19
        out, _ = p.communicate("\n", timeout=60)
        assert out.strip() == "['t']"
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    with LogManager(d) as m:                 # a restart leaves the partition out too
        assert m.topics() == ["t"]
    with LogManager(d, read_only=True) as m:       # a read-only view lists it
        assert "__consumer_offsets" in m.topics()


def member(topics):
    return MemberMetadata("m-1", None, "c", "/h", 1000, 1000, subscription_bytes(topics), b"")


def test_expire_offsets_kafka_rules(tmp_path):
    d = str(tmp_path)
    host(d)
    t = MockTime(NOW)
    cfg = {"offsets.retention.minutes": 1}
    with GroupCoordinator(d, time=t, config=cfg) as gc:
        gc.commit_offsets("simple", {TP("t", 0): 1})                           # no metadata
        gc.store_group("empty", GroupMetadata("consumer", 2, None, None, NOW + 30_000, ()))
        gc.commit_offsets("empty", {TP("t", 0): 1})
        gc.store_group("live", GroupMetadata("consumer", 1, "range", "m-1", NOW, (member(["t"]),)))
        gc.commit_offsets("live", {TP("t", 0): 1, TP("gone", 0): 2})
        t.sleep(59_999)
        assert gc.expire_offsets() == 0
        t.sleep(1)
        # simple: 60 s after its commit; live: only the unsubscribed topic; empty: not yet
        # (60 s after it became Empty, at NOW + 30 s)
        assert gc.expire_offsets() == 2
        assert gc.fetch_offsets("simple") == {}
        assert list(gc.fetch_offsets("live")) == [TP("t", 0)]
        assert list(gc.fetch_offsets("empty")) == [TP("t", 0)]
        t.sleep(30_000)
        assert gc.expire_offsets() == 1
        # an Empty group left without offsets is Dead: its metadata gets a tombstone too
        assert gc.fetch_offsets("empty") == {} and gc.group("empty") is None
        assert sorted(gc.list_groups()) == ["live"]
        gc.commit_offsets("v1", {TP("t", 0): OffsetAndMetadata(5, commit_timestamp=t.milliseconds(),
                                                                expire_timestamp=t.milliseconds() + 10)})
        t.sleep(10)
        assert gc.expire_offsets(t.milliseconds()) == 1        # value v1's explicit expiry


def test_compaction_keeps_latest_and_drops_tombstones(tmp_path):
    d = str(tmp_path)
    host(d)
    t = MockTime(NOW)
    cfg = {"offsets.topic.segment.bytes": 2000}
    with GroupCoordinator(d, time=t, config=cfg) as gc:
        for i in range(60):
            gc.commit_offsets("g", {TP("t", 0): i, TP("t", 1): 100 + i})
        gc.commit_offsets("bs", {TP("t", 0): 7})     # "bs" shares g's partition (3 of 50)
        gc.delete_group("bs")
        for i in range(60, 80):
            gc.commit_offsets("g", {TP("t", 0): i, TP("t", 1): 100 + i})
        path = part_dir(d, "g")
        assert partition_for("bs", 50) == partition_for("g", 50) == 3
        before = sum(len(b) for b in batches(path))
        with Log.open(path, read_only=True) as lg:
            assert len(lg.segments) > 3
        assert gc.compact() == 1
        after = [r for b in batches(path) for r in b]
        assert len(after) < before
        assert gc.fetch_offsets("g") == GroupCoordinator(d, config=cfg).fetch_offsets("g")
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 79, TP("t", 1): 179}
        keys = [r.key for r in after if r.value is None]
        assert keys                                     # tombstones kept until the horizon
        t.sleep(86_400_000 + 1)                          # delete.retention.ms (Kafka's 1 day)
        gc.commit_offsets("g", {TP("t", 0): 80})
        gc.compact()
        gc.compact()
        after = [r for b in batches(path) for r in b]
        assert all(r.value is not None for r in after if r.offset < after[-1].offset - 10)
        assert gc.fetch_offsets("bs") == {}
        assert gc.fetch_offsets("g")[TP("t", 0)].offset == 80


def test_reader_state_resets_when_compaction_replaces_segments(tmp_path):
    d = str(tmp_path)
    host(d)
    t = MockTime(NOW)
    cfg = {"offsets.topic.segment.bytes": 1500}
    with GroupCoordinator(d, time=t, config=cfg) as writer, GroupCoordinator(d, config=cfg) as reader:
        writer.commit_offsets("g", {TP("t", 0): 1, TP("t", 5): 1})
        assert TP("t", 5) in reader.fetch_offsets("g")            # the reader has read it
        writer.delete_group("g")
        for i in range(40):
            writer.commit_offsets("g", {TP("t", 0): i})
        t.sleep(86_400_001)
        writer.compact()
        writer.compact()                      # the tombstone of (g, t, 5) is gone now
        got = reader.fetch_offsets("g")
        assert TP("t", 5) not in got and got[TP("t", 0)].offset == 39


def test_manager_task_expires_and_compacts(tmp_path):
    d = str(tmp_path)
    host(d)
    t = MockTime(NOW)
    s = MockScheduler(t)
    cfg = {"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "1000",
           "log.initial.task.delay.ms": "0"}
    with LogManager(d, cfg, time=t, scheduler=s) as m:
        with GroupCoordinator(m, time=t) as gc:
            gc.commit_offsets("g", {TP("t", 0): 1})
            assert m.topics() == ["gone", "t", "u", "x"]      # __consumer_offsets is not one
            t.sleep(60_000)
            s.tick()
            assert gc.fetch_offsets("g") == {}
            assert m.expire_group_offsets() == 0


def test_manager_refuses_to_own_the_offsets_topic(tmp_path):
    from kstore import InvalidTopicError
    with LogManager(str(tmp_path)) as m:
        with pytest.raises(InvalidTopicError, match="GroupCoordinator"):
            m.create_topic("__consumer_offsets", 50)
        with pytest.raises(InvalidTopicError):
            m.append("__consumer_offsets", b"k", b"v")       # no auto-creation either
        assert m.topics() == []


def test_expiry_asks_membership_without_holding_locks(tmp_path, monkeypatch, watchdog):
    watchdog(60)
    d = str(tmp_path / "not" / "yet")          # a log dir that does not exist yet is made
    t = MockTime(NOW)
    with GroupCoordinator(d, time=t, config={"offsets.retention.minutes": 1}) as gc:
        gc.store_group("g", GroupMetadata("consumer", 3, "range", "m-1", NOW, (member(["t"]),)))
        host(d)                     # (after the coordinator made the dir)
        gc.commit_offsets("g", {TP("t", 0): 1})
        asked = []

        def live(group):           # membership may read (and write) through the coordinator
            asked.append(gc.group(group).generation)
            return []              # every member in the record is dead
        monkeypatch.setattr(gc, "live_members", live)
        t.sleep(60_000)
        # dead members: Empty since unknown, so each offset's commit time counts
        assert gc.expire_offsets() == 1 and asked
        assert gc.fetch_offsets("g") == {}
        assert gc.group("g") is not None      # the record lists members: not Dead by us


def test_a_waiting_reader_does_not_make_the_writer_reopen(tmp_path, watchdog, monkeypatch):
    watchdog(60)
    d = str(tmp_path)
    host(d)
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("t", 0): 1})
        opens = []
        real = Log.open.__func__

        def counting(cls, *a, **kw):
            if not kw.get("read_only"):
                opens.append(a[0])
            return real(cls, *a, **kw)
        monkeypatch.setattr(Log, "open", classmethod(counting))
        with Log.open(part_dir(d, "g"), read_only=True) as lg:
            for i in range(2, 6):
                woke: list = []
                th = threading.Thread(target=lambda w=woke, o=i - 1: w.append(lg.wait_for(o, timeout=30)))
                th.start()
                time.sleep(0.05)           # the reader armed the word's waiter bit
                gc.commit_offsets("g", {TP("t", 0): i})
                th.join(30)
                assert woke == [True]
        assert opens == []                 # every commit reused the kept writable Log
        assert gc.fetch_offsets("g")[TP("t", 0)].offset == 5


def test_manager_compacts_in_another_process_while_commits_go_on(tmp_path, watchdog):
    watchdog(180)
    d = str(tmp_path)
    host(d)
    cfg = {"offsets.topic.segment.bytes": 1500, "offsets.retention.minutes": 10080}
    code = textwrap.dedent("""
        import sys, time
        from kstore import LogManager
        m = LogManager(sys.argv[1], {"offsets.topic.segment.bytes": "1500",
                                     "log.initial.task.delay.ms": "3600000"})
        print("up", flush=True)
        runs = 0
        while sys.stdin.readline().strip() == "go":
            m.expire_group_offsets()          # expiry + compaction, under the partition flock
            runs += 1
            print(runs, flush=True)
        m.close()
    """)
    with GroupCoordinator(d, config=cfg) as gc:
        gc.commit_offsets("g", {TP("t", 0): 0})
    p = subprocess.Popen([sys.executable, "-c", code, d], cwd=d, stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "up"
        with GroupCoordinator(d, config=cfg) as gc, GroupCoordinator(d, config=cfg) as reader:
            for i in range(1, 301):
                gc.commit_offsets("g", {TP("t", 0): i, TP("t", 1): 1000 + i})
                if i % 10 == 0:
                    p.stdin.write("go\n")
                    p.stdin.flush()
                    assert int(p.stdout.readline()) == i // 10
                got = reader.fetch_offsets("g")
                assert got[TP("t", 0)].offset == i and got[TP("t", 1)].offset == 1000 + i
        p.stdin.write("stop\n")
        p.stdin.flush()
        assert p.wait(60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    bs = batches(part_dir(d, "g"))
    assert sum(len(b) for b in bs) < 300          # the manager's passes compacted it
    with GroupCoordinator(d, config=cfg) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 300, TP("t", 1): 1300}


def test_a_malformed_group_record_names_partition_and_offset(tmp_path):
    from kstore.group_coordinator import GroupRecordError
    d = str(tmp_path)
    host(d)
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("t", 0): 1})
    with Log.open(part_dir(d, "g"), {"cleanup.policy": "compact"}) as lg:    # a valid batch...
        lg.append([(offset_commit_key("g", "t", 1), b"\x00\x03\x00")])       # ...of a bad value
    with GroupCoordinator(d) as gc:
        with pytest.raises(GroupRecordError, match=r"OffsetCommitValue v3.*offset 1 of .*__consumer_offsets-"):
            gc.fetch_offsets("g")


DELETED_TOPIC_CHILD = textwrap.dedent("""
    import sys
    import kstore
    from kstore.group_coordinator import GroupCoordinator
    from kstore import TopicPartition as TP
    d, role = sys.argv[1], sys.argv[2]
    if role == "consume":        # a group member reads t to its end and commits at close
        with kstore.Consumer(d, "t", group_id="g", auto_offset_reset="earliest") as c:
            n = 0
            while n < 100:
                n += sum(len(r) for r in c.poll(timeout_ms=1000).values())
        print(n, flush=True)
    else:                        # another group commits u over and over
        with GroupCoordinator(d) as gc:
            print("ready", flush=True)
            for i in range(1, 301):
                gc.commit_offsets("h", {TP("u", 0): i})
            print(i, flush=True)
""")


def test_delete_topic_removes_its_committed_offsets(tmp_path, watchdog):
    """A group that committed offsets of a topic, deleted and created again: its consumers read
    the new topic from auto_offset_reset (the old code resumed at offset 100 of the deleted one
    and skipped the new topic's first 100 records). Another group's commits beside the
    deletion, in another process, are kept."""
    watchdog(120)
    d = str(tmp_path)

    def run(role):
        return subprocess.Popen([sys.executable, "-c", DELETED_TOPIC_CHILD, d, role], cwd=d,
                                stdout=subprocess.PIPE, text=True)
    with LogManager(d) as m:
        m.create_topic("t", 2)
        m.create_topic("u", 1)
        m.append_batch("t", 0, [(None, b"old%d" % i) for i in range(60)])
        m.append_batch("t", 1, [(None, b"old%d" % i) for i in range(40)])
        consumer = run("consume")
        assert consumer.communicate(timeout=60)[0].split() == ["100"]
        with GroupCoordinator(d) as gc:
            assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 60, TP("t", 1): 40}
            gc.commit_offsets("g", {TP("u", 0): 7})
        committer = run("commit")
        assert committer.stdout.readline().strip() == "ready"
        m.delete_topic("t")
        assert committer.communicate(timeout=60)[0].split() == ["300"]
        with GroupCoordinator(d) as gc:
            assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("u", 0): 7}
            assert {tp: o.offset for tp, o in gc.fetch_offsets("h").items()} == {TP("u", 0): 300}
        tombs = [b for b in batches(part_dir(d, "g")) if any(r.value is None for r in b)]
        assert [sorted(r.key for r in b) for b in tombs] == [
            sorted([offset_commit_key("g", "t", 0), offset_commit_key("g", "t", 1)])]
        assert all(r.value is None for r in tombs[0])
        m.create_topic("t", 2)
        m.append_batch("t", 0, [(None, b"new%d" % i) for i in range(150)])
        from kstore import Consumer
        with Consumer(m, "t", group_id="g", auto_offset_reset="earliest") as c:
            got = []
            while len(got) < 150:
                polled = c.poll(timeout_ms=1000)
                assert polled, got[-1:]
                got.extend((r.offset, r.value) for r in polled.get(TP("t", 0), []))
        assert got == [(i, b"new%d" % i) for i in range(150)]
        m.delete_topic("u")                  # both groups' offsets of u go; g's of the new t stay
        with GroupCoordinator(d) as gc:
            assert gc.fetch_offsets("h") == {}
            assert gc.fetch_offsets("g")[TP("t", 0)].offset == 150
            assert {tp.topic for tp in gc.fetch_offsets("g")} == {"t"}


def test_a_coordinator_on_log_dirs_takes_broker_keys_or_a_parsed_broker_config(tmp_path):
    """config: broker keys, or a BrokerConfig already parsed (what a LogManager's deletion tail
    passes, so its settings are not parsed and logged again): the same offsets settings."""
    from kstore.broker_config import BrokerConfig
    keys = {"offsets.topic.num.partitions": 3, "offsets.retention.minutes": 7}
    for config in (keys, BrokerConfig(keys)):
        with GroupCoordinator([str(tmp_path)], config=config) as gc:
            assert (gc.num_partitions, gc.retention_ms) == (3, 7 * 60_000)
