"""kstore.group_membership / group_files: consumer groups on file locks, across threads of one
process and across processes (children killed with SIGKILL at chosen points)."""
from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

from group_helpers import ChildMember, FakeCoordinator
import kstore
from kstore import _notify
from kstore.assignors import RangeAssignor, RoundRobinAssignor
from kstore.errors import InvalidConfigError, KStoreStateError
from kstore.fileio import FileOps
from kstore.group_files import GROUPS_DIR, GroupDir, decode_name, encode_name
from kstore.group_membership import (RETRY_BACKOFF_S, CommitFailedError, GroupMember,
                                     InconsistentGroupProtocolError, live_members)
from kstore.group_records import OffsetAndMetadata
from kstore.topic_partition import TopicPartition as TP

G = "workers"


def tps(topic, *ps):
    return {TP(topic, p) for p in ps}


class Store:
    """What a consumer would hand a member: partition counts and the topic list, mutable."""

    def __init__(self, **counts):
        self.counts = dict(counts)

    def partitions_for(self, topic):
        return self.counts[topic]

    def list_topics(self):
        return list(self.counts)


@pytest.fixture
def co(tmp_path):
    return FakeCoordinator(str(tmp_path))


def member(co, store, topics=("t",), **kw):
    kw.setdefault("heartbeat_interval_ms", 100)
    kw.setdefault("session_timeout_ms", 10000)
    if "pattern" in kw:
        topics = None
    return GroupMember(co, G, topics=topics, partitions_for=store.partitions_for,
                       list_topics=store.list_topics, **kw)


def settle(members, rounds=50):
    """Poll every member (each revoking what it is told to, at once) until no poll changes
    anything; returns the last change each member saw."""
    last: dict = {}
    for _ in range(rounds):
        changed = False
        for m in members:
            c = m.poll()
            if c is not None:
                changed = True
                last[m] = c
                m.release(c.revoked)
        if not changed:
            return last
    raise AssertionError("members did not settle")


def gdir(co):
    return GroupDir(FileOps(), co.dir, G)


def state_path(co):
    return gdir(co).state_files()[0][1]


def state_of(co):
    with open(state_path(co)) as f:
        return json.load(f)


def test_one_member_joins_and_owns_everything(co):
    store = Store(t=3)
    with member(co, store) as m:
        c = m.join()
        assert c.generation == 1 and c.revoked == frozenset() and c.assigned == tps("t", 0, 1, 2)
        assert m.owned() == tps("t", 0, 1, 2) and m.generation() == 1
        assert m.member_id.startswith("kstore-") and len(m.member_id) == len("kstore-") + 36
        state = state_of(co)
        assert state["generation"] == 1 and state["protocol"] == "range" and state["leader"] == m.member_id
        assert state["assignment"] == {m.member_id: [["t", 0], ["t", 1], ["t", 2]]}
        assert state["partitions"] == {"t": 3}
        g = co.group(G)
        assert (g.protocol_type, g.generation, g.protocol, g.leader) == ("consumer", 1, "range", m.member_id)
        assert [x.member_id for x in g.members] == [m.member_id]
        assert g.members[0].session_timeout == 10000 and g.members[0].rebalance_timeout == 300000
        # the member file is locked: alive
        assert gdir(co).is_alive(m.member_id)
        assert m.poll() is None
    # leaving: an Empty group, generation 2, and the member's file gone
    g = co.group(G)
    assert (g.generation, g.protocol, g.leader, g.members) == (2, None, None, ())
    assert not gdir(co).is_alive(m.member_id)
    assert os.listdir(gdir(co).members) == []


def test_poll_without_change_makes_no_file_operation(co):
    class Counting(FileOps):
        calls = 0

        def __getattribute__(self, name):
            if not name.startswith("__") and name != "calls":
                type(self).calls += 1
            return super().__getattribute__(name)
    io = Counting()
    m = member(co, Store(t=2), io=io, heartbeat_interval_ms=60000, session_timeout_ms=120000)
    m.join()
    Counting.calls = 0
    for _ in range(1000):
        assert m.poll() is None
    assert Counting.calls == 0
    m.leave()


def test_second_member_takes_half_after_the_first_releases(co):
    store = Store(t=4)
    a, b = member(co, store), member(co, store)
    assert a.join().assigned == tps("t", 0, 1, 2, 3)
    cb = b.join()
    assert cb.generation == 2 and cb.assigned == frozenset()      # a still holds them all
    assert b.owned() == frozenset() and b.assignment() in (tps("t", 0, 1), tps("t", 2, 3))
    ca = a.poll()
    assert ca.generation == 2 and ca.revoked == b.assignment() and ca.assigned == frozenset()
    assert a.owned() == tps("t", 0, 1, 2, 3)          # revoked but not released yet
    assert b.poll() is None                            # nothing rang since: no retry
    a.release(ca.revoked)
    cb = b.poll()                                      # the release rang the bell
    assert cb.generation == 2 and cb.assigned == b.assignment() and cb.revoked == frozenset()
    assert a.owned() | b.owned() == tps("t", 0, 1, 2, 3) and not a.owned() & b.owned()
    # a leaves: b takes everything at its next poll (the leave rang the bell)
    a.leave()
    cb = b.poll()
    assert cb.generation == 3 and b.owned() == tps("t", 0, 1, 2, 3)
    b.leave()
    assert [g.generation for g in co.groups[G]] == [1, 2, 3, 4]


def test_commit_only_for_owned_partitions(co):
    store = Store(t=2)
    a = member(co, store)
    a.join()
    a.commit({TP("t", 0): OffsetAndMetadata(5)})
    assert co.commits == [(G, {TP("t", 0): OffsetAndMetadata(5)}, 1, a.member_id)]
    with pytest.raises(CommitFailedError, match="does not own"):
        a.commit({TP("t", 7): OffsetAndMetadata(1)})
    a.leave()
    with pytest.raises(KStoreStateError):
        a.commit({TP("t", 0): OffsetAndMetadata(6)})


def test_expire_leaves_without_commit_and_refuses_commits(co):
    """expire() (the poll timer's eviction): the member file and owner locks go, the other
    member's rebalance gives it everything, and a commit of the expired member raises
    CommitFailedError with Kafka's meaning and writes nothing; expire() again is False."""
    store = Store(t=2)
    a, b = member(co, store), member(co, store)
    a.join()
    b.join()
    settle([a, b])
    assert a.owned() | b.owned() == tps("t", 0, 1) and a.owned() and b.owned()
    assert a.expire() is True and a.expired
    assert a.owned() == frozenset() and not GroupDir(FileOps(), co.dir, G).is_alive(a.member_id)
    assert b.poll() is not None and b.owned() == tps("t", 0, 1)
    with pytest.raises(CommitFailedError, match=f"member {re.escape(a.member_id)}: Offset commit cannot be "
                       "completed since the consumer is not part of an active group"):
        a.commit({TP("t", 0): OffsetAndMetadata(3)})
    assert co.commits == []
    assert a.expire() is False
    a.leave()                                 # idempotent after an eviction
    assert [m.member_id for m in live_members(co, G)] == [b.member_id]
    b.leave()


def test_expire_does_not_wait_long_for_a_held_group_lock(co, watchdog):
    """The poll timer's eviction runs under the consumer's lock: with group.lock held elsewhere
    it gives up on it after EXPIRE_LOCK_S (not the member's 30 s), still drops its member and
    owner flocks, and the other member takes everything at its next heartbeat."""
    from kstore.group_membership import EXPIRE_LOCK_S
    watchdog(60)
    store = Store(t=2)
    a, b = member(co, store), member(co, store)
    a.join()
    b.join()
    settle([a, b])
    assert a.owned() and b.owned()
    held = gdir(co).lock(5)
    try:
        t0 = time.monotonic()
        assert a.expire() is True
        took = time.monotonic() - t0
        assert EXPIRE_LOCK_S <= took < EXPIRE_LOCK_S + 1.0
        assert a.owned() == frozenset() and not gdir(co).is_alive(a.member_id)
    finally:
        gdir(co).unlock(held)
    deadline = time.monotonic() + 10
    while b.owned() != tps("t", 0, 1) and time.monotonic() < deadline:
        c = b.poll()
        if c is not None:
            b.release(c.revoked)
        time.sleep(0.02)
    assert b.owned() == tps("t", 0, 1)
    b.leave()


def test_config_checks(co):
    store = Store(t=1)
    with pytest.raises(InvalidConfigError, match="heartbeat"):
        member(co, store, heartbeat_interval_ms=5000, session_timeout_ms=5000)
    with pytest.raises(InvalidConfigError, match="exactly one"):
        GroupMember(co, G, partitions_for=store.partitions_for, list_topics=store.list_topics)
    with pytest.raises(InvalidConfigError, match="twice"):
        member(co, store, assignors=(RangeAssignor(), RangeAssignor()))
    with pytest.raises(InvalidConfigError):
        GroupMember(co, "", topics=["t"], partitions_for=store.partitions_for, list_topics=store.list_topics)
    m = member(co, store)
    with pytest.raises(KStoreStateError, match="has not joined"):
        m.poll()
    m.join()
    with pytest.raises(KStoreStateError, match="already joined"):
        m.join()
    m.leave()
    m.leave()                 # idempotent
    with pytest.raises(KStoreStateError, match="left"):
        m.poll()


def test_protocol_votes_and_inconsistent_joiner(co):
    store = Store(t=2)
    a = member(co, store, assignors=(RangeAssignor(), RoundRobinAssignor()))
    b = member(co, store, assignors=(RoundRobinAssignor(), RangeAssignor()))
    c = member(co, store, assignors=(RoundRobinAssignor(), RangeAssignor()))
    a.join()
    assert co.group(G).protocol == "range"
    b.join()                       # one vote each: the leader's (a's) preference
    assert co.group(G).protocol == "range"
    c.join()
    assert co.group(G).protocol == "roundrobin"
    d = member(co, store, assignors=(RoundRobinAssignor(),))
    d.join()
    e = member(co, store, assignors=(RangeAssignor(),))
    with pytest.raises(InconsistentGroupProtocolError, match="share none"):
        e.join()
    assert not os.path.exists(os.path.join(gdir(co).members, encode_name(e.member_id)))
    for m in (a, b, c, d):
        m.leave()


def test_pattern_subscription_picks_up_a_new_topic_and_partition_growth(co):
    store = Store(orders=2, other=1, __consumer_offsets=50)
    a = member(co, store, pattern=re.compile(r"ord.*"))
    assert a.join().assigned == tps("orders", 0, 1)
    store.counts["orders2"] = 1
    time.sleep(0.12)              # the next heartbeat looks at the topics again
    c = a.poll()
    assert c.generation == 2 and c.assigned == tps("orders2", 0)
    store.counts["orders"] = 3    # partitions added
    time.sleep(0.12)
    c = a.poll()
    assert c.generation == 3 and c.assigned == tps("orders", 2)
    assert a.owned() == tps("orders", 0, 1, 2) | tps("orders2", 0)
    time.sleep(0.12)
    assert a.poll() is None       # a heartbeat with nothing new: no generation
    assert a.generation() == 3
    a.leave()


def test_subscribe_changes_the_subscription(co):
    store = Store(t=2, u=1)
    a = member(co, store)
    a.join()
    a.subscribe(topics=["u"])
    c = a.poll()
    assert c.generation == 2 and c.revoked == tps("t", 0, 1) and c.assigned == tps("u", 0)
    a.leave()


def test_threads_are_separate_members(co, watchdog):
    """Members in threads of one process: each takes its own flocks; no partition is owned
    twice at any point, and all are owned once the group settles."""
    watchdog(120)
    store = Store(t=6)
    members = [member(co, store) for _ in range(3)]
    errors = []

    def run(m):
        try:
            m.join()
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=run, args=(m,)) for m in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    settle(members)
    owned = [m.owned() for m in members]
    assert sorted(len(o) for o in owned) == [2, 2, 2]
    assert set().union(*owned) == tps("t", *range(6))
    assert len({m.generation() for m in members}) == 1 and members[0].generation() == 3
    for m in members:
        m.leave()


def test_child_member_killed_partitions_taken_within_heartbeat(co, tmp_path, watchdog):
    watchdog(120)
    store = Store(t=4)
    child = ChildMember(tmp_path)
    try:
        child.run("!m = GroupMember(co, 'workers', topics=['t'], partitions_for=lambda t: 4, "
                  "list_topics=lambda: ['t'], heartbeat_interval_ms=100, session_timeout_ms=10000)")
        child.run("m.join()")
        a = member(co, store)
        a.join()
        assert child.run("sorted(m.poll().revoked)") == repr(sorted(a.assignment()))
        assert len(a.assignment()) == 2 and a.owned() == frozenset()
        # the child dies before releasing what it was told to give up
        child.kill()
        killed = time.monotonic()
        while a.owned() != tps("t", 0, 1, 2, 3):
            assert time.monotonic() - killed < 10, "partitions not taken within the session timeout"
            a.poll()
            time.sleep(0.005)
        assert a.generation() == 3              # join, join, the death
        assert live_members(co, G) and [x.member_id for x in live_members(co, G)] == [a.member_id]
        a.leave()
    finally:
        child.kill()


def test_member_killed_holding_group_lock(co, tmp_path, watchdog):
    watchdog(120)
    child = ChildMember(tmp_path)
    try:
        child.run("!d = GroupDir(__import__('kstore').get_file_ops(), sys.argv[1], 'workers'); d.make()")
        child.run("!fd = d.lock(5)")
        # a half-written temp state next to the real one, as a writer killed mid-write leaves
        child.run("!open(d.path + '/.state.1.tmp', 'w').write('{\"generat')")
        a = member(co, Store(t=1), lock_timeout=0.3)
        from kstore.group_files import GroupLockTimeoutError
        with pytest.raises(GroupLockTimeoutError, match=r"pid \d+"):
            a.join()
        child.kill()
        assert a.join().assigned == tps("t", 0)
        assert not any(n.endswith(".tmp") for n in os.listdir(gdir(co).path))
        a.leave()
    finally:
        child.kill()


def test_garbled_group_file_rebuilt_generation_continues(co):
    store = Store(t=2)
    a = member(co, store)
    a.join()
    b = member(co, store)
    b.join()
    settle([a, b])
    with open(state_path(co), "w") as f:
        f.write("{not json")
    time.sleep(0.12)
    settle([a, b])
    assert a.generation() == b.generation() == 3          # from the stored record's 2
    assert a.owned() | b.owned() == tps("t", 0, 1) and not a.owned() & b.owned()
    a.leave()
    b.leave()


def test_hostile_member_files_are_ignored(co):
    store = Store(t=2)
    d = gdir(co)
    d.make()
    with open(os.path.join(d.members, "junk"), "w") as f:
        f.write("not json")
    os.symlink("/etc/passwd", os.path.join(d.members, "link"))
    a = member(co, store)
    assert a.join().assigned == tps("t", 0, 1)
    assert [x.member_id for x in live_members(co, G)] == [a.member_id]
    a.leave()


def test_bell_wakes_a_waiter_on_rebalance(co, watchdog):
    watchdog(60)
    store = Store(t=2)
    a = member(co, store, heartbeat_interval_ms=30000, session_timeout_ms=60000)
    a.join()
    bell = a.notify_word()
    armed = bell.arm()
    assert a.poll() is None
    woke = []

    def wait():
        woke.append(_notify.wait_any([bell], [armed], 30.0))
    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.05)
    b = member(co, store, heartbeat_interval_ms=30000, session_timeout_ms=60000)
    b.join()
    t.join(30)
    assert woke and woke[0] in (0, 11)        # woken (or changed before it slept)
    c = a.poll()
    assert c.generation == 2 and c.revoked
    a.leave()
    b.leave()


def test_no_partition_read_by_two_members_at_once(co, watchdog):
    """Members join and leave while the others keep reading: every read of a partition is
    logged (start, end) under a monotonic clock; intervals of one partition never overlap."""
    watchdog(120)
    store = Store(t=6, u=3)
    events: list = []
    lock = threading.Lock()
    stop = threading.Event()
    errors: list = []

    def consumer(seconds):
        m = member(co, store, topics=("t", "u"), heartbeat_interval_ms=20)
        try:
            m.join()
            end = time.monotonic() + seconds
            while time.monotonic() < end and not stop.is_set():
                c = m.poll()
                if c is not None and c.revoked:
                    m.release(c.revoked)
                for tp in m.owned() - (c.revoked if c else frozenset()):
                    t0 = time.monotonic_ns()
                    time.sleep(0.0005)
                    with lock:
                        events.append((tp, t0, time.monotonic_ns(), id(m)))
            m.leave()
        except BaseException as e:
            errors.append(e)
            stop.set()
    threads = []
    for i in range(8):
        t = threading.Thread(target=consumer, args=(0.3 + 0.15 * i,))
        t.start()
        threads.append(t)
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    assert not errors, errors
    by_tp: dict = {}
    for tp, s, e, who in events:
        by_tp.setdefault(tp, []).append((s, e, who))
    assert set(by_tp) == tps("t", *range(6)) | tps("u", 0, 1, 2)
    for tp, iv in by_tp.items():
        ends: dict = {}                       # member -> the end of its latest read so far
        for s, e, who in sorted(iv):
            assert all(end <= s for w, end in ends.items() if w != who), f"{tp} read by two members at once"
            ends[who] = max(e, ends.get(who, e))
    gens = [g.generation for g in co.groups[G]]
    assert gens == sorted(set(gens)) and len(gens) >= 16        # 8 joins and 8 leaves at least
    # partitions did change hands while their old owners were reading
    assert sum(len({w for _, _, w in iv}) > 1 for iv in by_tp.values()) >= 5


def test_names_encoding():
    for name in ["g", "a b/c", "..", ".", ".hidden", "ü-ñ", "%7E", "x~y", "\U0001F600"]:
        enc = encode_name(name)
        assert "/" not in enc and enc not in (".", "..") and not enc.startswith(".")
        assert decode_name(enc) == name
    long = "g" * 1000
    enc = encode_name(long)
    assert len(enc) <= 180 and "~" in enc and decode_name(enc) is None
    assert encode_name("g" * 999 + "h") != enc
    assert decode_name("bad%zz") is None and decode_name("a b") is None


def test_group_dir_location(co):
    m = member(co, Store(t=1))
    m.join()
    assert os.path.isdir(os.path.join(co.dir, GROUPS_DIR, "workers", "members"))
    assert sorted(os.listdir(os.path.join(co.dir, GROUPS_DIR, "workers"))) == [
        ".kstore-notify", "group.lock", "members", "owners", "state-00000000000000000001.json"]
    assert os.listdir(os.path.join(co.dir, GROUPS_DIR, "workers", "owners")) == ["t-0"]
    m.leave()


def test_with_the_real_coordinator(tmp_path):
    """GroupCoordinator: each generation's GroupMetadata record in __consumer_offsets, the
    generation continued from it when the group state is lost, delete_group refused while a member
    lives."""
    from kstore.errors import KStoreError
    from kstore.group_coordinator import GroupCoordinator
    from kstore.group_records import parse_assignment, parse_subscription
    store = Store(t=3)
    with kstore.LogManager(str(tmp_path)) as m:      # offsets are committed of topics that exist
        m.create_topic("t", 3)
    with GroupCoordinator(str(tmp_path), num_partitions=5) as gc:
        a = GroupMember(gc, G, topics=["t"], partitions_for=store.partitions_for,
                        list_topics=store.list_topics, heartbeat_interval_ms=100)
        a.join()
        g = gc.group(G)
        assert (g.generation, g.protocol, g.leader) == (1, "range", a.member_id)
        assert parse_subscription(g.members[0].subscription).topics == ["t"]
        assert parse_assignment(g.members[0].assignment) == [TP("t", 0), TP("t", 1), TP("t", 2)]
        assert os.path.isdir(os.path.join(gc.log_dir_for(G), GROUPS_DIR, G))
        with pytest.raises(KStoreError, match="live member"):
            gc.delete_group(G)
        a.commit({TP("t", 1): OffsetAndMetadata(42)})
        assert gc.fetch_offsets(G)[TP("t", 1)].offset == 42
        os.unlink(GroupDir(FileOps(), gc.log_dir_for(G), G).state_files()[0][1])
        time.sleep(0.12)
        assert a.poll().generation == 2              # from the stored record, not from 0
        a.leave()
        g = gc.group(G)
        assert (g.generation, g.protocol, g.leader, g.members) == (3, None, None, ())
        assert live_members(gc, G) == []                 # known here, nobody alive
        assert live_members(gc, "never-joined") is None  # unknown here: the record decides
        gc.delete_group(G)
        assert gc.group(G) is None


KILL_AFTER_STATE = r"""
import os, signal
from kstore.fileio import FileOps

class KillAfterState(FileOps):
    armed = False

    def rename(self, src, dst):
        super().rename(src, dst)
        if self.armed and os.path.basename(dst).startswith("state-"):
            os.kill(os.getpid(), signal.SIGKILL)
ops = KillAfterState()
"""


def test_rebalancer_killed_after_writing_the_group_file_before_releasing(co, tmp_path, watchdog):
    """The child owns every partition of t, changes its subscription to u and dies right after
    its rebalance renamed the new state file into place: no bell rung, its revoked partitions
    never released by it, group.lock held. The other member notices the death at a heartbeat
    and takes t's partitions once the kernel dropped the child's owner flocks."""
    watchdog(120)
    store = Store(t=3, u=1)
    child = ChildMember(tmp_path)
    try:
        child.run("!exec(" + repr(KILL_AFTER_STATE) + ")")
        child.run("!m = GroupMember(co, 'workers', topics=['t'], partitions_for=lambda t: {'t': 3, 'u': 1}[t], "
                  "list_topics=lambda: ['t', 'u'], heartbeat_interval_ms=100, session_timeout_ms=10000, io=ops)")
        child.run("m.join()")
        a = member(co, store, topics=("t", "u"))
        a.join()
        settle([a])
        # told to give up its share for a, the child keeps it (not released yet)
        assert child.run("sorted(m.poll().revoked)") == repr(sorted(a.assignment() - tps("u", 0)))
        assert child.run("sorted(m.owned())") == repr(sorted(tps("t", 0, 1, 2)))
        gen_before = state_of(co)["generation"]
        child.run("!m.subscribe(topics=['u']); ops.armed = True")
        with pytest.raises(ValueError):                # no reply: killed inside
            child.run("m.poll()")
        child.p.wait(timeout=30)
        state = state_of(co)
        assert state["generation"] == gen_before + 1  # written whole, then the kill
        deadline = time.monotonic() + 10
        while a.owned() != tps("t", 0, 1, 2) | tps("u", 0):
            assert time.monotonic() < deadline, (a.owned(), a.generation())
            c = a.poll()
            if c is not None:
                a.release(c.revoked)
            time.sleep(0.005)
        assert a.generation() == gen_before + 2       # the dead child's generation, then a's
        assert [x.member_id for x in live_members(co, G)] == [a.member_id]
        a.leave()
    finally:
        child.kill()


def test_group_directory_removed_under_live_members(co):
    """The group's directory deleted by hand while members live: the next heartbeat makes it
    again, re-files the members, maps the new bell and rebalances (generation continued from
    the stored record). (Until then the owner locks are on removed files: removing a live
    group's directory voids the one-reader guarantee; consumer-groups --delete refuses.)"""
    import shutil
    store = Store(t=2)
    a, b = member(co, store), member(co, store)
    a.join()
    b.join()
    settle([a, b])
    shutil.rmtree(gdir(co).path)
    time.sleep(0.12)
    settle([a, b])
    assert a.generation() == b.generation() >= 3
    assert sorted(x.member_id for x in live_members(co, G)) == sorted([a.member_id, b.member_id])
    armed = b.notify_word().arm()
    a.leave()                       # rings the new bell: b wakes without waiting for a heartbeat
    assert b.notify_word().load() != armed
    assert b.poll().assigned
    assert b.owned() == tps("t", 0, 1)
    b.leave()


def test_a_custom_assignor_with_the_design_signature(co):
    """Any object with a name and assign(partitions_per_topic, subscriptions) is an assignor;
    a plan that leaves a partition out leaves it unowned."""
    class EverythingToTheFirst:
        name = "first"

        def assign(self, partitions_per_topic, subscriptions):
            first = sorted(subscriptions)[0]
            return {m: ([TP(t, p) for t, n in sorted(partitions_per_topic.items()) for p in range(n)]
                        if m == first else []) for m in subscriptions}
    store = Store(t=2)
    a = member(co, store, assignors=(EverythingToTheFirst(),))
    b = member(co, store, assignors=(EverythingToTheFirst(),))
    a.join()
    b.join()
    settle([a, b])
    first, other = sorted([a, b], key=lambda m: m.member_id)
    assert first.owned() == tps("t", 0, 1) and other.owned() == frozenset()
    assert co.group(G).protocol == "first"
    a.leave()
    b.leave()


def test_leaver_that_does_not_know_the_remaining_protocol(co):
    """a supports only x; b and c support z first. When a leaves, the others' protocol is z,
    which a cannot run: it leaves without a plan and b (or c) rebalances at its heartbeat."""
    def named(n):
        class Named(RangeAssignor):
            name = n
        return Named()
    store = Store(t=2)
    a = member(co, store, assignors=(named("x"),))
    b = member(co, store, assignors=(named("z"), named("x")))
    c = member(co, store, assignors=(named("z"), named("x")))
    for m in (a, b, c):
        m.join()
    settle([a, b, c])
    assert co.group(G).protocol == "x"
    a.leave()
    time.sleep(0.12)
    settle([b, c])
    assert co.group(G).protocol == "z" and b.generation() == c.generation() == 4
    assert b.owned() | c.owned() == tps("t", 0, 1)
    b.leave()
    c.leave()


def test_a_rebalance_cut_short_by_a_lock_timeout_is_redone_by_the_next_poll(co, tmp_path):
    """A member's subscription change makes its next poll rebalance; group.lock is held by
    another process past the member's lock timeout, so that poll raises GroupLockTimeoutError.
    The poll after the lock is free redoes the rebalance at once (u's partitions assigned), not
    at the next heartbeat (heartbeat_interval_ms / 2 = 30 s here)."""
    from kstore.group_files import GroupLockTimeoutError
    store = Store(t=2, u=2)
    m = member(co, store, heartbeat_interval_ms=60_000, session_timeout_ms=120_000,
               lock_timeout=0.3)
    holder = ChildMember(tmp_path)
    try:
        assert m.join().assigned == tps("t", 0, 1)
        m.subscribe(["t", "u"])
        holder.run(f"!gd = GroupDir(__import__('kstore').fileio.FileOps(), {str(tmp_path)!r}, {G!r})")
        holder.run("!fd = gd.lock(5)")
        with pytest.raises(GroupLockTimeoutError):
            m.poll()
        holder.run("!gd.unlock(fd)")
        change = m.poll()
        assert change is not None and change.assigned == tps("u", 0, 1)
        assert m.assignment() == tps("t", 0, 1) | tps("u", 0, 1)
    finally:
        holder.close()
        m.leave()


class StateWriteFails(FileOps):
    """FileOps whose next `fail` renames of a group state file fail (ENOSPC), as on a full disk."""

    fail = 0

    def rename(self, src, dst, *args, **kw):
        if self.fail and os.path.basename(dst).startswith("state-"):
            self.fail -= 1
            raise OSError(28, f"injected: no space left for {dst}")
        return super().rename(src, dst, *args, **kw)


def test_a_subscription_change_whose_rebalance_failed_is_redone_by_the_next_poll(co):
    """A member of t and u subscribes to t only; the rebalance of its next poll fails writing
    the group's state (ENOSPC), after the member file took the new subscription. A poll after
    the retry backoff redoes the rebalance: u's partitions are revoked. Before, the failed rebalance had
    already cleared the subscription change, and a heartbeat compares only the partition counts
    of the topics subscribed: polls saw nothing to do and the member kept reading u."""
    store = Store(t=2, u=2)
    ops = StateWriteFails()
    m = member(co, store, topics=("t", "u"), heartbeat_interval_ms=60_000,
               session_timeout_ms=120_000, io=ops)
    try:
        assert m.join().assigned == tps("t", 0, 1) | tps("u", 0, 1)
        m.subscribe(["t"])
        ops.fail = 1
        with pytest.raises(OSError, match="injected: no space left"):
            m.poll()
        time.sleep(RETRY_BACKOFF_S * 1.5)
        change = m.poll()
        assert change is not None and change.revoked == tps("u", 0, 1) and not change.assigned
        m.release(change.revoked)
        assert m.assignment() == tps("t", 0, 1)
        assert m.poll() is None
    finally:
        m.leave()


class StateWriteAlwaysFails(FileOps):
    """FileOps whose renames of a group state file fail (ENOSPC) while `failing`; counts them."""

    failing = False
    attempts = 0

    def rename(self, src, dst, *args, **kw):
        if self.failing and os.path.basename(dst).startswith("state-"):
            self.attempts += 1
            raise OSError(28, f"injected: no space left for {dst}")
        return super().rename(src, dst, *args, **kw)


def test_a_rebalance_that_keeps_failing_is_retried_after_a_backoff_not_by_every_poll(co):
    """A member's rebalance fails at once each time (ENOSPC writing the group state). A poll
    loop that catches the error is not hot: polls within Kafka's retry.backoff.ms (100 ms) of a
    failure return None without trying (one atomic load), and the rebalance is retried at most
    once per backoff, at least every heartbeat. Once the disk has room the rebalance is done.
    Before, every poll redid the failed rebalance (group.lock, member scan, state write): over a
    thousand attempts a second."""
    store = Store(t=2, u=2)
    ops = StateWriteAlwaysFails()
    m = member(co, store, topics=("t", "u"), heartbeat_interval_ms=60_000,
               session_timeout_ms=120_000, io=ops)
    try:
        assert m.join().assigned == tps("t", 0, 1) | tps("u", 0, 1)
        m.subscribe(["t"])
        ops.failing = True
        polls, raised = 0, 0
        t0 = time.monotonic()
        while time.monotonic() - t0 < 0.5:
            polls += 1
            try:
                assert m.poll() is None
            except OSError as e:
                assert str(e).startswith("[Errno 28] injected: no space left for ")
                raised += 1
        elapsed = time.monotonic() - t0
        assert ops.attempts == raised and 2 <= raised <= elapsed / RETRY_BACKOFF_S + 1, (raised, polls)
        assert polls > 10 * raised
        ops.failing = False
        time.sleep(RETRY_BACKOFF_S * 1.5)
        change = m.poll()
        assert change is not None and change.revoked == tps("u", 0, 1) and not change.assigned
    finally:
        m.leave()


def test_a_first_join_waits_for_the_groups_dir_another_process_holds(co, tmp_path, watchdog):
    """A group's directory is made only under the flock of .kstore-groups itself (what an admin
    holds to decide about a group that has none): while another process holds it, a member's
    first join waits, up to its lock timeout (GroupLockTimeoutError naming the dir, nothing
    made), and an interrupt (a Consumer's wakeup) ends the wait at once; once the process lets
    go, the join makes the group and takes its partitions. A group whose directory exists
    joins without it."""
    from kstore.group_files import GroupLockTimeoutError
    watchdog(120)
    other = GroupDir(kstore.get_file_ops(), co.log_dir_for("other"), "other")
    other.make()
    child = ChildMember(tmp_path)
    try:
        child.run("!import fcntl, os")
        child.run(f"!fd = os.open({os.path.dirname(gdir(co).path)!r}, os.O_RDONLY)")
        child.run("!fcntl.flock(fd, fcntl.LOCK_EX)")
        a = member(co, Store(t=1), lock_timeout=0.3)
        with pytest.raises(GroupLockTimeoutError,
                           match=r"/\.kstore-groups: locked by another process \(making or "
                                 r"deleting a group\) for more than 0\.3 s$"):
            a.join()
        assert not os.path.exists(gdir(co).path)

        def interrupt():
            raise kstore.WakeupError("woken")
        b = member(co, Store(t=1), interrupt=interrupt)
        with pytest.raises(kstore.WakeupError, match="^woken$"):
            b.join()
        assert not os.path.exists(gdir(co).path)
        o = GroupMember(co, "other", topics=["t"], partitions_for=Store(t=1).partitions_for,
                        list_topics=Store(t=1).list_topics, lock_timeout=0.3)
        assert o.join().assigned == tps("t", 0)
        o.leave()
        child.run("!fcntl.flock(fd, fcntl.LOCK_UN)")
        assert a.join().assigned == tps("t", 0)
        a.leave()
    finally:
        child.kill()


def test_a_rebalances_group_record_waits_at_most_a_second_for_another_processs_flock(
        group_store, watchdog, tmp_path, caplog):
    """A member joins while another process holds the group's __consumer_offsets flock for good:
    the GroupMetadata record its rebalance writes under group.lock waits TASK_LOCK_WAIT_S (1 s),
    then is logged as not written, and the join completes (all four partitions, a 10 s
    watchdog armed before it, the flock released only after); a member in another process
    joins the same way. The next rebalance, the flock free, writes its record. Before, the
    join held group.lock (and its consumer's lock: a close() from another thread waited too)
    for the coordinator's 30 s lock timeout, and neither wakeup() nor close() ended it."""
    import logging
    from group_helpers import FlockHolder
    from kstore import Consumer
    from kstore.group_coordinator import GroupCoordinator
    watchdog(90)
    caplog.set_level(logging.WARNING, logger="kstore.group")
    d, _m = group_store
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("t", 0): 0})
        path = gc.topic.partition_path(gc.partition_for("g"))
    holder = FlockHolder(path, tmp_path)
    child = ChildMember(tmp_path)
    try:
        c = Consumer(d, "t", group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
        watchdog(10)
        c.poll(timeout_ms=0)
        assert c.assignment() == tps("t", 0, 1, 2, 3) and holder.p.poll() is None
        child.run("!import kstore")
        child.run(f"!b = kstore.Consumer({d!r}, 't', group_id='g', enable_auto_commit=False)")
        child.run("b.poll(timeout_ms=0) and None")
        assert holder.p.poll() is None
        assert [r.getMessage() for r in caplog.records if r.name == "kstore.group"] == [
            "group 'g' generation 1: its GroupMetadata record was not written (offsets flocks "
            "held by others for 1 s)"]                  # b's, generation 2, in its own log
    finally:
        holder.release()
    watchdog(90)
    try:
        with GroupCoordinator(d) as gc:
            assert gc.group("g") is None
        child.run("!b.close()")
        with GroupCoordinator(d) as gc:
            assert gc.group("g").generation == 3 and len(gc.group("g").members) == 1
        c.close()
    finally:
        child.close()


# -- a group whose log dir is offline -------------------------------------------------------------

def _tree(d):
    """{relative path: bytes (None for a dir)} of everything under d."""
    out = {}
    for root, dirs, files in os.walk(d):
        for n in dirs:
            out[os.path.relpath(os.path.join(root, n), d)] = None
        for n in files:
            with open(os.path.join(root, n), "rb") as f:
                out[os.path.relpath(os.path.join(root, n), d)] = f.read()
    return out


_COMMITTED = r"""
import sys
from kstore import Consumer, TopicPartition as TP
with Consumer(sys.argv[1:], group_id="g", enable_auto_commit=False) as c:
    print(" ".join(str(c.committed(TP("t", p))) for p in range(4)))
"""


def test_nothing_of_the_group_is_written_to_an_offline_dir(tmp_path, watchdog, caplog):
    """Before, with the group's log dir (its __consumer_offsets partition's) offline, a join
    made the group's directory, bell, group.lock, its member file, owner locks and a new
    generation's state file there, and a leave wrote another state. Kafka: that partition's
    coordinator is unavailable: JoinGroup/Heartbeat get COORDINATOR_NOT_AVAILABLE (retriable),
    a member keeps fetching its partitions meanwhile. Now, beside a thread appending to the
    online dir's partitions: a joined member's polls go on reading its online partitions (no
    rebalance, auto-commit logged), its commit is refused (CoordinatorNotAvailableError,
    retried until its timeout: ApiTimeoutError), a new
    member's poll returns {} without joining, their closes only drop flocks; every file under
    d1/.kstore-groups is as before, and the earlier commit is what another process and a
    restart read."""
    import errno
    import logging
    import subprocess
    import sys
    from kstore import Consumer, LogManager
    from thread_watchdog import join_all
    watchdog(90)
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2], {"offsets.topic.num.partitions": "1"})
    m.create_topic("t", 4)
    for p in range(4):
        m.append_batch("t", p, [(b"k", b"v%d" % i, None) for i in range(30)])
    on = [p for p in range(4) if m.log_dir_of("t", p) == d2]
    earlier = {TP("t", p): 10 + p for p in range(4)}
    a = Consumer(m, "t", group_id="g", auto_commit_interval_ms=0, heartbeat_interval_ms=100,
                 session_timeout_ms=1000)
    a.commit(earlier)
    while a.assignment() != tps("t", 0, 1, 2, 3):
        a.poll(50)
    a.commit(earlier)                      # the poll's auto-commit moved them: back
    for tp in earlier:
        a.seek(tp, earlier[tp])
    before = _tree(os.path.join(d1, GROUPS_DIR))
    assert any(n.startswith(os.path.join("g", "members")) for n in before)
    stop = threading.Event()

    def append():
        while not stop.is_set():
            for p in on:
                m.append("t", b"k", b"w", partition=p)
    writer = threading.Thread(target=append, daemon=True)
    m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))
    writer.start()
    try:
        why = f"log dir {d1}, which is offline"
        seen = set()
        with caplog.at_level(logging.WARNING, "kstore"):
            deadline = time.monotonic() + 30
            while seen != {TP("t", p) for p in on} and time.monotonic() < deadline:
                seen.update(a.poll(50))               # its heartbeats fail: no rebalance
            a.poll(0)                                 # its auto-commit of them: refused, logged
        assert seen == {TP("t", p) for p in on} and a.assignment() == tps("t", 0, 1, 2, 3)
        assert any("retriable error" in r.getMessage() for r in caplog.records)
        with pytest.raises(kstore.ApiTimeoutError, match=f"Timeout of 0ms expired before "
                           f"successfully committing offsets {{t-{on[0]}=25}} .*{why}"):
            a.commit({TP("t", on[0]): 25}, timeout_ms=0)      # (retried until its timeout)
        b = Consumer(m, "t", group_id="g", heartbeat_interval_ms=100, session_timeout_ms=1000)
        assert b.poll(300) == {} and b.assignment() == set()     # no join: retried
        b.close()
        a.close()
        assert _tree(os.path.join(d1, GROUPS_DIR)) == before
        out = subprocess.run([sys.executable, "-c", _COMMITTED, d1, d2], timeout=60, check=True,
                             capture_output=True, text=True, cwd=str(tmp_path)).stdout.split()
        assert out == ["10", "11", "12", "13"]
    finally:
        stop.set()
        join_all([writer], 30)
    m.close()
    with LogManager([d1, d2]) as m2, Consumer(m2, group_id="g", enable_auto_commit=False) as c:
        assert {tp: c.committed(tp) for tp in earlier} == earlier
