"""kstore.Consumer's commits (manual assignment with a group_id): commit / committed, positions
from committed offsets, auto-commit (interval, close, idle consumers write nothing), and a
commit that returned surviving kill -9 of the committing process."""
import os
import signal
import subprocess
import sys
import time

import pytest

import kstore
from kstore import Consumer, TopicPartition as TP
from kstore.errors import InvalidConfigError
from kstore.group_coordinator import GroupCoordinator
from kstore.group_records import OffsetAndMetadata

NOW = 1_700_000_000_000


@pytest.fixture
def store(tmp_path):
    d = str(tmp_path / "data")
    m = kstore.LogManager(d)
    m.create_topic("t", 2)
    for p in range(2):
        m.append_batch("t", p, [(b"k%d" % i, b"v%d" % i, NOW + i) for i in range(10)])
    yield d, m
    m.close()


def offsets_log_size(d):
    """Records in the store's __consumer_offsets partitions (what commits wrote)."""
    total = 0
    for name in os.listdir(d):
        if name.startswith("__consumer_offsets-"):
            with kstore.Log.open(os.path.join(d, name), read_only=True) as lg:
                total += lg.log_end_offset - lg.log_start_offset
    return total


def test_commit_committed_and_resume_from_committed(store):
    d, _m = store
    with Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.assign([TP("t", 0), TP("t", 1)])
        assert c.committed(TP("t", 0)) is None
        got = c.poll(1000, max_records=13)
        assert sum(map(len, got.values())) == 13
        c.commit()
        pos = {tp: c.position(tp) for tp in c.assignment()}
        assert {c.committed(tp) for tp in pos} == set(pos.values()) and sorted(pos.values()) == [3, 10]
        c.commit({TP("t", 1): OffsetAndMetadata(2, "note")})
        om = c.committed(TP("t", 1), metadata=True)
        assert (om.offset, om.metadata) == (2, "note")
        with pytest.raises(InvalidConfigError):
            c.commit({TP("t", 1): -4})
    # a new consumer of the group starts at the committed offsets, whatever its reset policy
    with Consumer(d, group_id="g", auto_offset_reset="latest") as c2:
        c2.assign([TP("t", 0), TP("t", 1)])
        assert {str(tp): c2.position(tp) for tp in c2.assignment()} == {
            str(tp): (2 if tp == TP("t", 1) else pos[tp]) for tp in pos}
        got = c2.poll(1000)
        assert [r.offset for r in got[TP("t", 1)]] == list(range(2, 10))
    # the records are Kafka's: a GroupCoordinator on the same dirs reads them
    with GroupCoordinator([d]) as gc:
        assert gc.fetch_offsets("g")[TP("t", 1)].offset == 10      # c2's auto-commit at close


def test_committed_offset_below_log_start_resets_per_policy(store):
    d, m = store
    with Consumer(d, group_id="g", enable_auto_commit=False) as c:
        c.assign([TP("t", 0)])
        c.commit({TP("t", 0): 1})
    lg = m.log("t", 0)
    lg.roll()
    m.append_batch("t", 0, [(b"x", b"y")])         # 10 in a new segment
    lg.delete_records(10)
    m.checkpoint_log_start_offsets()
    with Consumer(d, group_id="g", auto_offset_reset="earliest") as c:
        c.assign([TP("t", 0)])
        got = c.poll(1000)
        assert [r.offset for r in got[TP("t", 0)]] == [10]   # committed 1 is gone: from the start


def test_auto_commit_every_interval_of_returned_records_only(store):
    d, _m = store
    with Consumer(d, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=200,
                  max_poll_records=4) as c:
        c.assign([TP("t", 0)])
        c.poll(0)                                   # 0..3 returned
        assert c.committed(TP("t", 0)) is None      # not before the interval
        time.sleep(0.25)
        c.poll(0)                                   # commits 4 (what was returned), then reads 4..7
        assert c.committed(TP("t", 0)) == 4
        written = offsets_log_size(d)
        time.sleep(0.25)
        c.poll(0)                                   # commits 8
        assert c.committed(TP("t", 0)) == 8
        # an idle consumer commits nothing new
        c.poll(300)
        n = offsets_log_size(d)
        c.poll(300)
        c.poll(300)
        assert offsets_log_size(d) == n and n == written + 1 + 1   # 10 committed by the poll
        # that read 8, 9 then went idle


def test_close_commits_and_close_without_autocommit_does_not(store):
    d, _m = store
    with Consumer(d, group_id="g", auto_offset_reset="earliest") as c:
        c.assign([TP("t", 0)])
        c.poll(0, max_records=3)
    with Consumer(d, group_id="g") as c:
        c.assign([TP("t", 0)])
        assert c.committed(TP("t", 0)) == 3
        c.poll(0, max_records=2)
        c.close(autocommit=False)
    with Consumer(d, group_id="g") as c:
        c.assign([TP("t", 0)])
        assert c.committed(TP("t", 0)) == 3


COMMITTER = r"""
import sys, os, kstore
from kstore import TopicPartition as TP
c = kstore.Consumer(sys.argv[1], group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
c.assign([TP("t", 0)])
c.poll(1000, max_records=7)
c.commit()
print("committed", flush=True)
sys.stdin.read()
"""


def test_a_commit_that_returned_survives_kill_9(store, tmp_path, watchdog):
    watchdog(60)
    d, _m = store
    p = subprocess.Popen([sys.executable, "-c", COMMITTER, d], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        assert p.stdout.readline().strip() == "committed"
        os.kill(p.pid, signal.SIGKILL)
        assert p.wait(timeout=30) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
    with Consumer(d, group_id="g") as c:
        c.assign([TP("t", 0)])
        assert c.committed(TP("t", 0)) == 7
        assert [r.offset for r in c.poll(1000)[TP("t", 0)]] == [7, 8, 9]


def test_iteration_commits_what_was_yielded(store):
    """Iterating reads ahead a poll's worth, yet commit() and position() stand after the
    record last yielded; consumer_timeout_ms=0 yields what is there, then stops."""
    d, _m = store
    with Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False,
                  consumer_timeout_ms=0) as c:
        c.assign([TP("t", 0)])
        it = iter(c)
        assert [next(it).offset for _ in range(4)] == [0, 1, 2, 3]
        assert c.position(TP("t", 0)) == 4
        c.commit()
        assert c.committed(TP("t", 0)) == 4
        assert [r.offset for r in it] == [4, 5, 6, 7, 8, 9]
        assert c.position(TP("t", 0)) == 10


def test_positions_of_a_deleted_topic_are_not_committed(tmp_path, watchdog):
    """A member read 100 records of t, then the writer process deleted t: its commit() and its
    close() commit the other topic's position but not t's (Kafka's broker refuses commits of
    unknown partitions), so the group starts the topic created again under the name from
    auto_offset_reset. The old code wrote offset 100 after the deletion removed the group's
    offsets, and the next member skipped the new topic's first 100 records."""
    from writer_process import WriterProcess
    watchdog(90)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    batch = 'for i in range(0, {n}, 10): m.append_batch("{t}", 0, [(None, b"{t}%d" % j) for j in range(i, i + 10)])'
    try:
        w.run('m.create_topic("t", 1)', 'm.create_topic("u", 1)', batch.format(n=100, t="t"),
              batch.format(n=20, t="u"))
        c = Consumer(d, "t", "u", group_id="g", auto_offset_reset="earliest",
                     auto_commit_interval_ms=3_600_000)
        got = {}
        deadline = time.monotonic() + 20
        while sum(map(len, got.values())) < 120 and time.monotonic() < deadline:
            for tp, recs in c.poll(500).items():
                got.setdefault(tp, []).extend(r.offset for r in recs)
        assert got == {TP("t", 0): list(range(100)), TP("u", 0): list(range(20))}
        w.run('m.delete_topic("t")')
        c.commit()
        assert c.committed(TP("t", 0)) is None and c.committed(TP("u", 0)) == 20
        c.close()
        with GroupCoordinator(d) as gc:
            assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("u", 0): 20}
        w.run('m.create_topic("t", 1)', batch.format(n=150, t="t"))
        with Consumer(d, "t", group_id="g", auto_offset_reset="earliest") as c2:
            got2 = []
            deadline = time.monotonic() + 20
            while len(got2) < 150 and time.monotonic() < deadline:
                got2 += [(r.offset, r.value) for r in c2.poll(500).get(TP("t", 0), [])]
            assert got2 == [(i, b"t%d" % i) for i in range(150)]
    finally:
        w.close()


def test_an_auto_commit_racing_a_deletion_commits_the_rest(tmp_path, watchdog):
    """The window fetcher.stale cannot close: the topic is deleted after the consumer's check
    and before its commit (here the check is made to miss it). The coordinator refuses the
    deleted partition (UnknownTopicError); the auto-commit at close logs it and commits the
    other topic's position, as Kafka's auto-commit logs a failed partition, instead of raising
    from close() or losing the other commit."""
    watchdog(60)
    d = str(tmp_path / "data")
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
        m.create_topic("u", 1)
        m.append_batch("t", 0, [(None, b"t")] * 5)
        m.append_batch("u", 0, [(None, b"u")] * 7)
        c = Consumer(m, group_id="g", auto_offset_reset="earliest")
        c.assign([TP("t", 0), TP("u", 0)])
        got = {}
        deadline = time.monotonic() + 20
        while sum(map(len, got.values())) < 12 and time.monotonic() < deadline:
            for tp, recs in c.poll(500).items():
                got.setdefault(tp, []).extend(r.offset for r in recs)
        assert got == {TP("t", 0): list(range(5)), TP("u", 0): list(range(7))}
        m.delete_topic("t")
        c._fetcher.stale = lambda positions: []        # the check ran before the deletion
        c.close()
        with GroupCoordinator(d) as gc:
            assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("u", 0): 7}


def _group_path(d: str, group: str) -> str:
    with GroupCoordinator(d) as gc:
        return gc.topic.partition_path(gc.partition_for(group))


def _committed(d: str, group: str) -> dict:
    with GroupCoordinator(d) as gc:
        return {str(tp): o.offset for tp, o in sorted(gc.fetch_offsets(group).items())}


def _in_call(c) -> None:
    """Until a thread is inside one of c's calls, then a little more (waiting in it)."""
    deadline = time.monotonic() + 10
    while c._guard.owner is None and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.3)


def _fifteen_due(c, m) -> None:
    """c read t-0's 10 records and committed; 5 more read; its auto-commit due at its next poll."""
    assert len(c.poll(timeout_ms=5000, max_records=1000)[TP("t", 0)]) == 10
    c.commit()
    m.append_batch("t", 0, [(b"k", b"more%d" % i) for i in range(5)])
    assert len(c.poll(timeout_ms=5000)[TP("t", 0)]) == 5
    time.sleep(1.1)                              # the auto-commit is due at the next poll


@pytest.mark.parametrize("member", [False, True], ids=["assigned", "group-member"])
def test_close_from_another_thread_ends_a_polls_auto_commit_waiting_for_the_flock(
        group_store, watchdog, tmp_path, member):
    """A poll's auto-commit waits for the group's offsets flock, which another process holds:
    close() from another thread makes that poll return {} at once (well before the flock's
    30 s timeout), nothing written (committed stays 10); the close then commits itself, waiting
    for the flock (Kafka's close commits within its bound), and once the process lets go it
    writes 15. Before, the poll sat in its wait until the flock was released or timed out, and
    close() waited as long behind it."""
    import threading
    from group_helpers import FlockHolder
    from thread_watchdog import join_all
    watchdog(90)
    d, m = group_store
    c = Consumer(d, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=1000)
    if member:
        c.subscribe(["t"])
    else:
        c.assign([TP("t", 0)])
    _fifteen_due(c, m)
    before = {"t-0": 10} | ({f"t-{p}": 10 for p in (1, 2, 3)} if member else {})
    assert _committed(d, "g") == before
    holder = FlockHolder(_group_path(d, "g"), tmp_path)
    try:
        out: list = []
        poller = threading.Thread(target=lambda: out.append(c.poll(timeout_ms=60_000)), name="poller")
        poller.start()
        _in_call(c)
        closer = threading.Thread(target=c.close, name="closer")
        closer.start()
        join_all([poller], 10)
        assert out == [{}] and _committed(d, "g") == before
        time.sleep(0.5)
        assert closer.is_alive() and not c.closed       # its own commit waits for the flock
    finally:
        holder.release()
    join_all([closer], 20)
    assert c.closed and _committed(d, "g") == before | {"t-0": 15}


def test_a_commit_ended_by_another_threads_close_raises_closed_and_writes_nothing(
        group_store, watchdog, tmp_path):
    """commit() waits for the offsets flock another process holds: close() from another thread
    ends it with KStoreStateError (Kafka's closed message), nothing written; the close's own
    commit then writes 15 once the process lets go."""
    import threading
    from group_helpers import FlockHolder
    from thread_watchdog import join_all
    watchdog(90)
    d, m = group_store
    c = Consumer(d, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=60_000)
    c.assign([TP("t", 0)])
    _fifteen_due(c, m)
    holder = FlockHolder(_group_path(d, "g"), tmp_path)
    try:
        out: list = []

        def commit():
            try:
                c.commit()
                out.append("committed")
            except kstore.KStoreError as e:
                out.append(e)
        committer = threading.Thread(target=commit, name="committer")
        committer.start()
        _in_call(c)
        closer = threading.Thread(target=c.close, name="closer")
        closer.start()
        join_all([committer], 10)
        assert [(type(e), str(e)) for e in out] == [
            (kstore.KStoreStateError, "This consumer has already been closed.")]
        assert _committed(d, "g") == {"t-0": 10} and closer.is_alive()
    finally:
        holder.release()
    join_all([closer], 20)
    assert c.closed and _committed(d, "g") == {"t-0": 15}


@pytest.mark.parametrize("member", [False, True], ids=["assigned", "group-member"])
def test_closes_commit_that_cannot_get_the_flock_is_logged_and_the_close_goes_on(
        group_store, watchdog, tmp_path, caplog, member):
    """Another process holds the offsets flock past the coordinator's lock timeout (1 s here):
    close()'s auto-commit gives up, is logged as Kafka's ("Synchronous auto-commit of offsets
    ... failed"), and the close goes on: it returns, the member has left, committed stays 10.
    Before, close() raised CoordinatorLockTimeout."""
    import logging
    from group_helpers import FlockHolder
    watchdog(90)
    caplog.set_level(logging.WARNING, logger="kstore.consumer")
    d, m = group_store
    gc = GroupCoordinator(d, lock_timeout=1.0)
    c = Consumer(d, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=60_000,
                 coordinator=gc)
    if member:
        c.subscribe(["t"])
    else:
        c.assign([TP("t", 0)])
    _fifteen_due(c, m)
    holder = FlockHolder(_group_path(d, "g"), tmp_path)
    try:
        assert c.close() is None and c.closed
        assert _committed(d, "g") == {"t-0": 10} | ({f"t-{p}": 10 for p in (1, 2, 3)} if member else {})
        if member:
            assert gc.live_members("g") == []
    finally:
        holder.release()
        gc.close()
    offsets = "{'t-0': 15" + (", 't-1': 10, 't-2': 10, 't-3': 10}" if member else "}")
    got = [r.getMessage() for r in caplog.records if r.name == "kstore.consumer"]
    assert len(got) == 1 and got[0].startswith(
        f"Synchronous auto-commit of offsets {offsets} failed: timed out after 1.0 s waiting for "
        "the writer's lock of "), got


def test_a_signal_handlers_close_ends_the_polls_auto_commit_wait_in_the_same_thread(
        group_store, watchdog, tmp_path, caplog):
    """A signal handler calls close() while this thread's poll waits in its auto-commit for the
    offsets flock another process holds (the coordinator's lock timeout 3 s here): the wait
    ends at once, nothing written, the poll returns {} and the close runs as it returns; its
    own commit cannot get the flock either, is logged, and the close completes (committed
    stays 10). Before, the poll waited out the 3 s and raised CoordinatorLockTimeout."""
    import logging
    import signal
    from group_helpers import FlockHolder
    watchdog(90)
    caplog.set_level(logging.WARNING, logger="kstore.consumer")
    d, m = group_store
    gc = GroupCoordinator(d, lock_timeout=3.0)
    c = Consumer(d, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=1000,
                 coordinator=gc)
    c.assign([TP("t", 0)])
    _fifteen_due(c, m)
    holder = FlockHolder(_group_path(d, "g"), tmp_path)
    old = signal.signal(signal.SIGALRM, lambda *_: c.close())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        assert c.poll(timeout_ms=60_000) == {}
        assert c.closed and _committed(d, "g") == {"t-0": 10}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        holder.release()
        gc.close()
    got = [r.getMessage() for r in caplog.records if r.name == "kstore.consumer"]
    assert len(got) == 1 and got[0].startswith(
        "Synchronous auto-commit of offsets {'t-0': 15} failed: timed out after 3.0 s"), got


class _Calls:
    """A rebalance listener recording its calls: ("revoked" | "assigned" | "lost", sorted names)."""

    def __init__(self) -> None:
        self.calls: list = []

    def on_partitions_revoked(self, tps) -> None:
        self.calls.append(("revoked", sorted(map(str, tps))))

    def on_partitions_assigned(self, tps) -> None:
        self.calls.append(("assigned", sorted(map(str, tps))))

    def on_partitions_lost(self, tps) -> None:
        self.calls.append(("lost", sorted(map(str, tps))))


ALL4 = [f"t-{p}" for p in range(4)]


def _member_with_fifteen(d, m, child, listener, **kw):
    """c (here) owns t's 4 partitions, committed 10 each, positions 15 (5 more read); b, a
    member in the child process, has joined: c's next poll revokes b's half."""
    c = Consumer(d, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=3_600_000,
                 listener=listener, **kw)
    c.subscribe(["t"])
    got = 0
    deadline = time.monotonic() + 20
    while got < 40 and time.monotonic() < deadline:
        got += sum(map(len, c.poll(timeout_ms=500).values()))
    assert got == 40
    c.commit()
    for p in range(4):
        m.append_batch("t", p, [(b"k", b"more%d" % i) for i in range(5)])
    while got < 60 and time.monotonic() < deadline:
        got += sum(map(len, c.poll(timeout_ms=500).values()))
    assert got == 60 and _committed(d, "g") == dict.fromkeys(ALL4, 10)
    child.run("!import kstore")
    child.run(f"!b = kstore.Consumer({d!r}, 't', group_id='g', heartbeat_interval_ms=60000, "
              "session_timeout_ms=120000)")
    child.run("b.poll(timeout_ms=0) and None")          # joins: owns nothing until c lets go
    return c


def _b_takes(child, want: list) -> dict:
    """b polls until it owns want; where it took each up (from the group's commits): the first
    offset it read there, else its position (nothing left to read)."""
    child.run("!import time; t_end = time.monotonic() + 20; first = {}")
    child.run(f"!while sorted(map(str, b.assignment())) != {want!r} and time.monotonic() < t_end: "
              "first.update((str(tp), rs[0].offset) for tp, rs in b.poll(timeout_ms=100).items() "
              "if str(tp) not in first)")
    return eval(child.run("{str(tp): first.get(str(tp), b.position(tp)) for tp in sorted(b.assignment())}"))


def _poll_in_thread(c) -> tuple:
    """A thread polling c once (30 s); (thread, outcome list: what it returned or raised)."""
    import threading
    out: list = []

    def run():
        try:
            out.append(c.poll(timeout_ms=30_000))
        except kstore.KStoreError as e:
            out.append(e)
    t = threading.Thread(target=run, name="poller")
    t.start()
    _in_call(c)
    return t, out


def test_wakeup_ends_a_rebalance_commit_and_the_next_poll_revokes_once(group_store, watchdog, tmp_path):
    """b (another process) joins; c's poll must give up half its partitions and first commits
    their positions (15), waiting for the offsets flock a third process holds. wakeup() from
    another thread ends that wait: the poll raises WakeupError, nothing is written, c still owns
    all four and the listener heard nothing (Kafka's onJoinPrepare is redone by the next poll).
    The next poll, the flock free, commits 15 for the two, calls on_partitions_revoked once
    with them, gives them up; b reads on from 15. Before, the commit waited out the 30 s lock
    timeout, neither wakeup() nor close() ended it."""
    from group_helpers import ChildMember, FlockHolder
    from thread_watchdog import join_all
    watchdog(90)
    d, m = group_store
    lst = _Calls()
    child = ChildMember(tmp_path)
    try:
        c = _member_with_fifteen(d, m, child, lst)
        holder = FlockHolder(_group_path(d, "g"), tmp_path)
        try:
            t, out = _poll_in_thread(c)
            c.wakeup()
            join_all([t], 10)
            assert [type(e) for e in out] == [kstore.WakeupError]
            assert _committed(d, "g") == dict.fromkeys(ALL4, 10)
            assert sorted(map(str, c.assignment())) == ALL4 and lst.calls == [("assigned", ALL4)]
        finally:
            holder.release()
        c.poll(timeout_ms=0)
        kept = sorted(map(str, c.assignment()))
        gone = sorted(set(ALL4) - set(kept))
        assert len(kept) == 2 and lst.calls == [("assigned", ALL4), ("revoked", gone), ("assigned", [])]
        assert _committed(d, "g") == dict.fromkeys(kept, 10) | dict.fromkeys(gone, 15)
        assert _b_takes(child, gone) == dict.fromkeys(gone, 15)
        for _ in range(3):
            c.poll(timeout_ms=50)
        assert len(lst.calls) == 3 and sorted(map(str, c.assignment())) == kept
        c.close()
        assert lst.calls[3:] == [("revoked", kept)]
        child.run("!b.close()")
    finally:
        child.close()


def test_close_ends_a_rebalance_commit_and_commits_and_revokes_everything_once(
        group_store, watchdog, tmp_path):
    """As above, but close() from another thread ends the rebalance commit's wait: the poll
    returns {} (nothing written), then the close commits all four positions once the flock is
    free and calls on_partitions_revoked once with all four; b takes them from 15."""
    import threading
    from group_helpers import ChildMember, FlockHolder
    from thread_watchdog import join_all
    watchdog(90)
    d, m = group_store
    lst = _Calls()
    child = ChildMember(tmp_path)
    try:
        c = _member_with_fifteen(d, m, child, lst)
        holder = FlockHolder(_group_path(d, "g"), tmp_path)
        try:
            t, out = _poll_in_thread(c)
            closer = threading.Thread(target=c.close, name="closer")
            closer.start()
            join_all([t], 10)
            assert out == [{}] and _committed(d, "g") == dict.fromkeys(ALL4, 10)
            assert lst.calls == [("assigned", ALL4)] and not c.closed
        finally:
            holder.release()
        join_all([closer], 20)
        assert c.closed and lst.calls == [("assigned", ALL4), ("revoked", ALL4)]
        assert _committed(d, "g") == dict.fromkeys(ALL4, 15)
        assert _b_takes(child, ALL4) == dict.fromkeys(ALL4, 15)
        child.run("!b.close()")
    finally:
        child.close()


def test_a_failed_rebalance_commit_is_logged_and_the_partitions_given_up(group_store, watchdog,
                                                                          tmp_path, caplog):
    """The rebalance commit cannot get the flock within the coordinator's lock timeout (1 s
    here): as Kafka's maybeAutoCommitOffsetsSync, it is logged and the rebalance goes on
    (listener called once, partitions given up), nothing written. Before, the poll raised
    CoordinatorLockTimeout and gave the partitions up without calling the listener."""
    import logging
    from group_helpers import ChildMember, FlockHolder
    watchdog(90)
    caplog.set_level(logging.WARNING, logger="kstore.consumer")
    d, m = group_store
    lst = _Calls()
    child = ChildMember(tmp_path)
    gc = GroupCoordinator(d, lock_timeout=1.0)
    try:
        c = _member_with_fifteen(d, m, child, lst, coordinator=gc)
        holder = FlockHolder(_group_path(d, "g"), tmp_path)
        try:
            assert c.poll(timeout_ms=0) == {}
        finally:
            holder.release()
        kept = sorted(map(str, c.assignment()))
        gone = sorted(set(ALL4) - set(kept))
        assert len(kept) == 2 and lst.calls == [("assigned", ALL4), ("revoked", gone), ("assigned", [])]
        assert _committed(d, "g") == dict.fromkeys(ALL4, 10)
        got = [r.getMessage() for r in caplog.records if r.name == "kstore.consumer"]
        assert len(got) == 1 and got[0].startswith(
            "Synchronous auto-commit of offsets %s failed: timed out after 1.0 s waiting for "
            % dict.fromkeys(gone, 15)), got
        assert _b_takes(child, gone) == dict.fromkeys(gone, 10)
        c.close()
        child.run("!b.close()")
    finally:
        child.close()
        gc.close()


@pytest.mark.parametrize("member", [False, True], ids=["assigned", "group-member"])
def test_close_timeout_bounds_its_waits_for_another_processs_flock(group_store, watchdog, tmp_path,
                                                                    caplog, member):
    """close(timeout=0.5) while another process holds the group's offsets flock for good (past
    the coordinator's 30 s lock timeout): close returns (a 10 s watchdog armed just before it,
    the flock released only after), the consumer is closed, the commit it could not make is
    logged with Kafka's words, the offsets are the last committed (10), and a member has left
    the group (its GroupMetadata record, which needs the flock too, logged as not written).
    Before, close() took no timeout and waited 30 s."""
    import logging
    from group_helpers import FlockHolder
    watchdog(90)
    caplog.set_level(logging.WARNING)
    d, m = group_store
    lst = _Calls()
    c = Consumer(d, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=60_000,
                 listener=lst)
    if member:
        c.subscribe(["t"])
    else:
        c.assign([TP("t", 0)])
    _fifteen_due(c, m)
    before = {"t-0": 10} | ({f"t-{p}": 10 for p in (1, 2, 3)} if member else {})
    holder = FlockHolder(_group_path(d, "g"), tmp_path)
    try:
        watchdog(10)
        assert c.close(timeout=0.5) is None and c.closed
        assert holder.p.poll() is None                  # the flock was held all along
        if member:
            with GroupCoordinator(d) as gc:
                assert gc.live_members("g") == []
    finally:
        holder.release()
    assert _committed(d, "g") == before
    with pytest.raises(kstore.KStoreStateError, match="This consumer has already been closed."):
        c.poll(timeout_ms=0)
    offsets = "{'t-0': 15" + (", 't-1': 10, 't-2': 10, 't-3': 10}" if member else "}")
    ran_out = "close(timeout=0.5) ran out while waiting for a __consumer_offsets writer's lock"
    got = [(r.name, r.getMessage()) for r in caplog.records if r.name.startswith("kstore.")]
    assert got == [("kstore.consumer", f"Auto-commit of offsets {offsets} timed out before completion")] + (
        [("kstore.group", f"group 'g' generation 2: its GroupMetadata record was not written ({ran_out})")]
        if member else []) + [
        ("kstore.groups", f"closing {_group_path(d, 'g')} without a flush: {ran_out}")], got
    assert lst.calls == ([("assigned", ALL4), ("revoked", ALL4)] if member else [])


@pytest.mark.parametrize("freed", [True, False], ids=["flock-freed", "close-timeout-runs-out"])
def test_a_listeners_commit_in_a_poll_waits_on_past_a_close_from_another_thread(
        group_store, watchdog, tmp_path, freed):
    """Kafka forbids close() from another thread during a poll (ConcurrentModificationException);
    kstore takes it as a wakeup that closes. A rebalance listener already running in the poll
    (auto-commit off, it commits in on_partitions_revoked) is part of a rebalance the close
    cannot redo without calling it twice, so its commit() waits on for the flock another process
    holds, up to close(timeout)'s deadline: freed meanwhile, it writes 15 and the poll returns
    {}, then the close revokes the rest once (its listener's commit written too) and b takes
    every partition from 15; held past the deadline (0.5 s), the commit raises CloseTimeoutError
    in the listener, the close finishes, nothing is written. Before, the listener's commit
    raised KStoreStateError (closed) at once and the poll gave the two partitions up with their
    committed offsets left at 10 (the poller ended at once: this test's first check fails)."""
    import threading
    from group_helpers import ChildMember, FlockHolder
    from thread_watchdog import join_all
    watchdog(90)
    d, m = group_store
    calls: list = []

    class CommitOnRevoke(_Calls):
        def on_partitions_revoked(self, tps) -> None:
            try:
                c.commit()
                calls.append(("revoked", sorted(map(str, tps)), "committed"))
            except kstore.KStoreError as e:
                calls.append(("revoked", sorted(map(str, tps)), type(e).__name__))

    child = ChildMember(tmp_path)
    try:
        c = _member_with_fifteen(d, m, child, CommitOnRevoke(), enable_auto_commit=False)
        holder = FlockHolder(_group_path(d, "g"), tmp_path)
        try:
            t, out = _poll_in_thread(c)
            closer = threading.Thread(target=lambda: c.close(timeout=20 if freed else 0.5), name="closer")
            closer.start()
            if freed:
                time.sleep(0.5)
                assert t.is_alive() and closer.is_alive() and calls == []
                holder.release()
            join_all([t, closer], 20)
            assert c.closed
        finally:
            holder.release()
        gone = sorted(set(ALL4) - set(calls[0][1]))
        if freed:
            assert out == [{}] and calls == [("revoked", calls[0][1], "committed"), ("revoked", gone, "committed")]
            assert len(gone) == 2 and _committed(d, "g") == dict.fromkeys(ALL4, 15)
            assert _b_takes(child, ALL4) == dict.fromkeys(ALL4, 15)
        else:
            assert out == [{}] and calls == [("revoked", calls[0][1], "CloseTimeoutError"),
                                             ("revoked", gone, "CloseTimeoutError")]
            assert _committed(d, "g") == dict.fromkeys(ALL4, 10)
        child.run("!b.close()")
    finally:
        child.close()


def test_a_signal_handlers_close_ends_a_rebalance_commit_in_the_same_thread(group_store, watchdog,
                                                                             tmp_path, caplog):
    """A signal handler calls close(timeout=1) while this thread's poll waits in its rebalance
    commit for the flock another process holds for good: the wait ends at once, the poll
    returns {} and the close runs as it returns: its commit of all four positions cannot get
    the flock either and is logged once its 1 s runs out, the listener hears revoked once for
    all four, the consumer is closed (a 10 s watchdog armed before the poll), nothing written;
    b then takes every partition from 10."""
    import logging
    import signal
    from group_helpers import ChildMember, FlockHolder
    watchdog(90)
    caplog.set_level(logging.WARNING, logger="kstore.consumer")
    d, m = group_store
    lst = _Calls()
    child = ChildMember(tmp_path)
    try:
        c = _member_with_fifteen(d, m, child, lst)
        holder = FlockHolder(_group_path(d, "g"), tmp_path)
        old = signal.signal(signal.SIGALRM, lambda *_: c.close(timeout=1.0))
        try:
            watchdog(10)
            signal.setitimer(signal.ITIMER_REAL, 0.5)
            assert c.poll(timeout_ms=60_000) == {}
            assert c.closed and holder.p.poll() is None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
            holder.release()
        watchdog(90)
        assert lst.calls == [("assigned", ALL4), ("revoked", ALL4)]
        assert _committed(d, "g") == dict.fromkeys(ALL4, 10)
        assert [r.getMessage() for r in caplog.records if r.name == "kstore.consumer"] == [
            "Auto-commit of offsets %s timed out before completion" % dict.fromkeys(ALL4, 15)]
        assert _b_takes(child, ALL4) == dict.fromkeys(ALL4, 10)
        child.run("!b.close()")
    finally:
        child.close()


# -- committed() while the group's offsets partition is on an offline log dir ----------------------

_COMMITTED_ELSEWHERE = r"""
import sys
from kstore import Consumer, TopicPartition as TP
with Consumer(sys.argv[2:], group_id=sys.argv[1], enable_auto_commit=False) as c:
    print(" ".join(str(c.committed(TP("t", p))) for p in range(4)))
"""


def _two_groups(m):
    """Two group ids whose offsets partitions (of 2) differ: (g, h, g's partition)."""
    gc = GroupCoordinator(m)
    try:
        names = [f"g{i}" for i in range(50)]
        g = names[0]
        h = next(n for n in names if gc.partition_for(n) != gc.partition_for(g))
        return g, h, gc.partition_for(g)
    finally:
        gc.close()


@pytest.fixture
def offline_offsets(tmp_path):
    """A manager of d1, d2 (t: 4 partitions) where group g committed 10..13 into its offsets
    partition in d1, then d1 went offline: (manager, d1, d2, g, h), h a group whose partition
    is not made yet (its first commit goes to d2)."""
    import errno
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = kstore.LogManager([d1, d2], {"offsets.topic.num.partitions": "2"})
    m.create_topic("t", 4)
    g, h, pg = _two_groups(m)
    with Consumer(m, group_id=g, enable_auto_commit=False) as c:
        c.commit({TP("t", p): 10 + p for p in range(4)})
    assert os.path.isdir(os.path.join(d1, f"__consumer_offsets-{pg}"))
    m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))
    yield m, d1, d2, g, h
    m.close()


def test_committed_retries_an_offline_offsets_partition_until_its_timeout(offline_offsets, tmp_path,
                                                                           watchdog):
    """Before, committed() read the offline dir's partition at once (10). Kafka's OffsetFetch
    gets COORDINATOR_NOT_AVAILABLE (retriable) and committed() retries until
    default.api.timeout.ms (or its own timeout), then TimeoutException ("Timeout of Nms expired
    before the last committed offset for partitions [t-0] could be determined"): here
    ApiTimeoutError, never before the timeout, beside a thread appending to d2's partitions. A
    poll leaves such partitions without a position (old code: read there; never reset), a
    group whose partition is in d2 answers at once; another process and a restart read 10..13."""
    import threading
    from kstore import ApiTimeoutError
    from thread_watchdog import join_all
    watchdog(60)
    m, d1, d2, g, h = offline_offsets
    on = [p for p in range(4) if m.log_dir_of("t", p) == d2]
    stop = threading.Event()

    def append():
        while not stop.is_set():
            for p in on:
                m.append("t", b"k", b"v", partition=p)
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    why = (r"Timeout of (300|200|0)ms expired before the last committed offset for partitions "
           rf"\[t-1\] could be determined.*log dir {d1}, which is offline \(\[Errno 5\]")
    try:
        with Consumer(m, group_id=g, enable_auto_commit=False, default_api_timeout_ms=300) as c:
            for kw, bound in (({}, 0.3), ({"timeout_ms": 200}, 0.2), ({"timeout_ms": 0}, 0),
                              ({"timeout_ms": 200, "metadata": True}, 0.2)):
                t0 = time.monotonic()
                with pytest.raises(ApiTimeoutError, match=why):
                    c.committed(TP("t", 1), **kw)
                assert time.monotonic() - t0 >= bound         # never before the timeout
            with pytest.raises(InvalidConfigError, match="timeout_ms must be a number"):
                c.committed(TP("t", 1), timeout_ms=-1)
        with Consumer(m, group_id=g, enable_auto_commit=False, auto_offset_reset="earliest") as c4:
            c4.assign([TP("t", p) for p in on])
            assert c4.poll(0) == {}        # committed unknown, not absent: no reset to earliest
            with pytest.raises(ApiTimeoutError, match=f"Timeout of 0ms expired before the position "
                               f"for partition t-{on[0]} could be determined .*log dir {d1}, which is offline"):
                c4.position(TP("t", on[0]), timeout_ms=0)
        with Consumer(m, group_id=h, enable_auto_commit=False) as c2:
            assert c2.committed(TP("t", 0)) is None
            c2.commit({TP("t", p): 5 + p for p in range(4)})
            assert [c2.committed(TP("t", p)) for p in range(4)] == [5, 6, 7, 8]
        elsewhere = subprocess.run([sys.executable, "-c", _COMMITTED_ELSEWHERE, g, d1, d2], timeout=60,
                                   check=True, capture_output=True, text=True, cwd=str(tmp_path))
        assert elsewhere.stdout.split() == ["10", "11", "12", "13"]
    finally:
        stop.set()
        join_all([writer], 30)
    m.close()
    with kstore.LogManager([d1, d2]) as m2, Consumer(m2, group_id=g, enable_auto_commit=False) as c3:
        assert [c3.committed(TP("t", p)) for p in range(4)] == [10, 11, 12, 13]


@pytest.mark.parametrize("how", ["wakeup", "close"])
def test_wakeup_or_close_ends_committeds_retries(offline_offsets, how, watchdog):
    """committed() waiting for an offline offsets partition sleeps on the consumer's bell, as
    the offset queries do: wakeup() from another thread ends it with WakeupError (once: the
    next call times out as its own timeout says), a close() with KStoreStateError, long
    before its 60 s timeout."""
    import threading
    from kstore import ApiTimeoutError
    from kstore.errors import KStoreStateError, WakeupError
    from thread_watchdog import join_all
    watchdog(60)
    m, d1, d2, g, h = offline_offsets
    c = Consumer(m, group_id=g, enable_auto_commit=False)
    started = threading.Event()
    gc = c._coord()
    fetch = gc.fetch_offsets

    def counted(*a, **kw):                   # says when committed() has begun its retries
        started.set()
        return fetch(*a, **kw)
    gc.fetch_offsets = counted
    stopper = threading.Thread(target=lambda: (started.wait(30), time.sleep(0.2),
                                               c.wakeup() if how == "wakeup" else c.close()))
    stopper.start()
    with pytest.raises(WakeupError if how == "wakeup" else KStoreStateError):
        c.committed(TP("t", 0), timeout_ms=60000)
    join_all([stopper], 30)
    if how == "wakeup":
        with pytest.raises(ApiTimeoutError):
            c.committed(TP("t", 0), timeout_ms=0)
    c.close()


@pytest.mark.parametrize("created_again", [True, False])
def test_a_committed_offset_read_before_a_deletion_is_not_taken_into_the_new_topic(
        tmp_path, watchdog, created_again):
    """The window of a member resuming from its group's commit (CI's test_topic_deletion_txn_
    races failure): the committed offset 100 of t is read, then t is deleted (its offsets
    tombstoned) and created again with 40 records before the member's first read. The offset
    belongs to the deleted log: the member starts the new one by auto_offset_reset (0), or,
    while t is gone, waits for it. The old code took 100 into the new log, where KIP-320 saw
    epoch 0 ending at 40 and went on from 40: the new topic's first 40 records were skipped."""
    watchdog(60)
    with kstore.LogManager(str(tmp_path / "data")) as m:
        m.create_topic("t", 1)
        m.append_batch("t", 0, [(None, b"old%d" % i) for i in range(100)])
        with Consumer(m, "t", group_id="g", auto_offset_reset="earliest") as c:
            got = []
            deadline = time.monotonic() + 20
            while len(got) < 100 and time.monotonic() < deadline:
                got += [r.offset for r in c.poll(500).get(TP("t", 0), [])]
            assert got == list(range(100))
            c.commit()
        c2 = Consumer(m, "t", group_id="g", auto_offset_reset="earliest")
        read_committed = c2._fetch_committed

        def racing(tps):
            out = read_committed(tps)
            assert out == {TP("t", 0): (100, 0)}
            m.delete_topic("t")
            if created_again:
                m.create_topic("t", 1)
                m.append_batch("t", 0, [(None, b"new%d" % i) for i in range(40)])
            return out
        c2._fetch_committed = racing
        try:
            first = c2.poll(500)
            assert first.get(TP("t", 0), []) == [] or created_again
            c2._fetch_committed = read_committed
            if not created_again:
                m.create_topic("t", 1)
                m.append_batch("t", 0, [(None, b"new%d" % i) for i in range(40)])
            got = [(r.offset, r.value) for r in first.get(TP("t", 0), [])]
            deadline = time.monotonic() + 20
            while len(got) < 40 and time.monotonic() < deadline:
                got += [(r.offset, r.value) for r in c2.poll(500).get(TP("t", 0), [])]
            assert got == [(i, b"new%d" % i) for i in range(40)]
            assert c2.position(TP("t", 0)) == 40
        finally:
            c2.close()


def test_position_finds_a_committed_offset_of_a_topic_created_after_the_readers_scan(tmp_path):
    """A reader-backed consumer made before topic t was created: position() takes the group's
    committed offset (7), rescanning the store for t, as before update_positions pinned logs
    (then it raised "the partition is not in the store" until the next periodic rescan)."""
    d = str(tmp_path / "d")
    with kstore.LogManager(d) as m:
        m.create_topic("a", 1)
        with Consumer(d, group_id="g", enable_auto_commit=False) as c:
            m.create_topic("t", 1)
            m.append_batch("t", 0, [(None, b"x%d" % i) for i in range(20)])
            with Consumer(m, group_id="g", enable_auto_commit=False) as w:
                w.commit({TP("t", 0): 7})
            c.assign([TP("t", 0)])
            assert c.committed(TP("t", 0)) == 7
            assert c.position(TP("t", 0)) == 7
            assert [r.offset for r in c.poll(2000)[TP("t", 0)]][:3] == [7, 8, 9]
