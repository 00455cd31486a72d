"""kstore.consumer_wakeup: Consumer.wakeup() (KafkaConsumer.wakeup): from any thread, it makes the
poll blocked in another thread, or the next poll/commit, raise WakeupError at once instead of
waiting out its timeout; the consumer goes on from the same position. close() from another
thread interrupts a poll the same way (Kafka's close does not wait out a poll)."""
import asyncio
import contextlib
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

import kstore
from kstore import Consumer, TopicPartition as TP, WakeupError
from thread_watchdog import join_all
from writer_process import WriterProcess

T0 = TP("t", 0)
GENEROUS_S = 10      # far below every 30 s poll here, far above any scheduling delay


@pytest.fixture
def writer(tmp_path):
    """(log dir, WriterProcess): topic t, 1 partition of 100 records b"0".."99", owned by
    another process."""
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    w.run('m.create_topic("t", 1)',
          'm.append_batch("t", 0, [(None, b"%d" % i) for i in range(100)])')
    yield d, w
    assert w.close() == 0


def _poll_in_thread(c, timeout_ms=30_000):
    """Start a thread polling c once; returns (thread, outcome list, time the poll began)."""
    out, started = [], []

    def run():
        started.append(time.monotonic())
        try:
            out.append(c.poll(timeout_ms=timeout_ms))
        except kstore.KStoreError as e:
            out.append(e)
    t = threading.Thread(target=run, name="poller")
    t.start()
    deadline = time.monotonic() + GENEROUS_S
    while c._guard.owner is None and time.monotonic() < deadline:    # inside poll
        time.sleep(0.001)
    time.sleep(0.2)                                                   # asleep in its wait
    return t, out, started


def test_wakeup_interrupts_a_poll_blocked_in_another_thread(writer, watchdog):
    """A poll(timeout=30 s) at the log end, waiting on the writer process's notification word,
    raises WakeupError soon after wakeup() from the main thread; the consumer keeps its position
    and its next poll returns exactly the records appended since, none lost or repeated."""
    watchdog(60)
    d, w = writer
    with Consumer(d, auto_offset_reset="latest") as c:
        c.assign([T0])
        assert c.poll() == {} and c.position(T0) == 100
        t, out, started = _poll_in_thread(c)
        c.wakeup()
        join_all([t], GENEROUS_S)
        assert time.monotonic() - started[0] < GENEROUS_S
        assert type(out[0]) is WakeupError and isinstance(out[0], kstore.KStoreError)
        assert c.position(T0) == 100
        w.run('m.append_batch("t", 0, [(None, b"a"), (None, b"b")])')
        got = c.poll(timeout_ms=GENEROUS_S * 1000)
        assert [(r.offset, r.value) for r in got[T0]] == [(100, b"a"), (101, b"b")]
        assert c.poll() == {}                # the wakeup was raised once, not again


def test_wakeup_before_poll_raises_in_the_next_poll_once(writer, watchdog):
    """No thread blocked: the next poll raises (even with records to return, which stay for the
    poll after it), then polls and iteration go on from the same position."""
    watchdog(60)
    d, _w = writer
    with Consumer(d, auto_offset_reset="earliest", max_poll_records=10) as c:
        c.assign([T0])
        assert [r.offset for r in c.poll(timeout_ms=5000)[T0]] == list(range(10))
        c.wakeup()
        c.wakeup()                           # two before the raise: one WakeupError
        with pytest.raises(WakeupError):
            c.poll(timeout_ms=30_000)
        assert c.position(T0) == 10
        assert [r.offset for r in c.poll(timeout_ms=5000)[T0]] == list(range(10, 20))
        c.wakeup()
        with pytest.raises(WakeupError):
            next(iter(c))
        assert [next(c).offset for _ in range(3)] == [20, 21, 22]


def test_wakeup_makes_the_next_commit_and_committed_raise(group_store, watchdog):
    """commit() and committed() are blocking calls in Kafka: a pending wakeup raises there and
    nothing is written; the commit after it writes."""
    watchdog(60)
    d, _m = group_store
    with Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        c.assign([TP("t", 0)])
        assert len(c.poll(timeout_ms=5000)[TP("t", 0)]) == 10
        c.wakeup()
        with pytest.raises(WakeupError):
            c.commit()
        assert c.committed(TP("t", 0)) is None
        c.wakeup()
        with pytest.raises(WakeupError):
            c.committed(TP("t", 0))
        c.commit()
        assert c.committed(TP("t", 0)) == 10


def test_a_pending_wakeup_is_left_to_the_next_poll_by_a_position_found_at_once(group_store, watchdog):
    """position() of a partition without one (a rebalance listener's, say) finds it from the
    commit at once: a pending wakeup stays for the next poll (only a wait for an offline
    offsets dir ends by it). A position() that took the wakeup broke a listener recording
    positions beside a waking thread (test_consumer_commits_races)."""
    watchdog(60)
    d, _m = group_store
    with Consumer(d, group_id="g", enable_auto_commit=False) as c:
        c.commit({TP("t", 1): 4})
        c.assign([TP("t", 0), TP("t", 1)])
        c.wakeup()
        assert c.position(TP("t", 1)) == 4
        with pytest.raises(WakeupError):
            c.poll(timeout_ms=5000)
        assert [r.offset for r in c.poll(timeout_ms=5000).get(TP("t", 1), [])][:2] == [4, 5]


def test_wakeup_interrupts_a_group_members_poll(group_store, watchdog):
    """A subscribed group member's poll sleeps on the logs and the group's bell: wakeup ends it;
    the member stays in the group with its partitions and its next poll goes on."""
    watchdog(60)
    d, m = group_store
    with Consumer(d, "t", group_id="g", auto_offset_reset="latest") as c:
        c.poll(timeout_ms=0)
        assert c.assignment() == {TP("t", p) for p in range(4)}
        t, out, started = _poll_in_thread(c)
        c.wakeup()
        join_all([t], GENEROUS_S)
        assert type(out[0]) is WakeupError
        assert c.assignment() == {TP("t", p) for p in range(4)}
        m.append_batch("t", 2, [(b"k", b"new")])
        got = c.poll(timeout_ms=GENEROUS_S * 1000)
        assert {tp: [r.value for r in rs] for tp, rs in got.items()} == {TP("t", 2): [b"new"]}


def test_wakeup_interrupts_a_join_waiting_for_the_group_lock(group_store, watchdog):
    """A rebalance holds group.lock (here: this test, as another member would): a new member's
    poll waits for it up to its 30 s lock timeout. wakeup() ends that wait with WakeupError, the
    consumer is not in the group (nothing joined, nothing owned), and once the lock is free its
    next poll joins and reads every partition's records from the start."""
    from kstore.fileio import FileOps
    from kstore.group_coordinator import GroupCoordinator
    from kstore.group_files import GroupDir
    watchdog(60)
    d, _m = group_store
    with GroupCoordinator(d) as gc:
        gdir = GroupDir(FileOps(), gc.log_dir_for("g"), "g")
    gdir.make()
    held = gdir.lock(5)
    try:
        with Consumer(d, "t", group_id="g", auto_offset_reset="earliest") as c:
            t, out, started = _poll_in_thread(c)
            c.wakeup()
            join_all([t], GENEROUS_S)
            assert time.monotonic() - started[0] < GENEROUS_S
            assert type(out[0]) is WakeupError
            assert c.assignment() == set()
            gdir.unlock(held)
            held = None
            got: dict = {}
            deadline = time.monotonic() + GENEROUS_S
            while sum(map(len, got.values())) < 40 and time.monotonic() < deadline:
                for tp, rs in c.poll(timeout_ms=1000).items():
                    got.setdefault(tp, []).extend(r.offset for r in rs)
            assert got == {TP("t", p): list(range(10)) for p in range(4)}
    finally:
        if held is not None:
            gdir.unlock(held)


def test_close_from_another_thread_interrupts_the_poll(writer, watchdog):
    """close() from another thread does not wait out a 30 s poll: the poll returns {} (no
    records taken), close() returns, and the polling thread's next call says closed."""
    watchdog(60)
    d, _w = writer
    c = Consumer(d, auto_offset_reset="latest")
    c.assign([T0])
    c.poll()
    t, out, started = _poll_in_thread(c)
    c.close()
    join_all([t], GENEROUS_S)
    assert time.monotonic() - started[0] < GENEROUS_S
    assert out == [{}]
    with pytest.raises(kstore.KStoreStateError, match="^This consumer has already been closed\\.$"):
        c.poll()


def test_close_from_another_thread_ends_an_iteration(writer, watchdog):
    """`for r in consumer` ends (StopIteration, as kafka-python's) when another thread closes the
    consumer, after exactly the records read before; iterating a closed consumer ends at once.
    Before, the loop raised KStoreStateError out of the iteration."""
    watchdog(60)
    d, _w = writer
    c = Consumer(d, auto_offset_reset="earliest", consumer_timeout_ms=30_000)
    c.assign([T0])
    got: list = []
    errors: list = []

    def run():
        try:
            for r in c:
                got.append(r.offset)
        except BaseException as e:      # noqa: BLE001 - the test reports it
            errors.append(e)
    t = threading.Thread(target=run, name="iterating")
    t.start()
    deadline = time.monotonic() + GENEROUS_S
    while len(got) < 100 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)                     # asleep in the poll under the iteration
    c.close()
    join_all([t], GENEROUS_S)
    assert errors == []
    assert got == list(range(100))
    assert list(c) == []


def test_wakeup_interrupts_an_async_getmany(writer, watchdog):
    """An AsyncConsumer's getmany(timeout 30 s) waits in the process's waiter thread: a wakeup()
    of its Consumer from another thread ends it with WakeupError; the next getmany reads on."""
    watchdog(60)
    d, w = writer

    async def main():
        async with kstore.AsyncConsumer(d, auto_offset_reset="latest") as ac:
            ac.assign([T0])
            assert await ac.getmany() == {}
            threading.Timer(0.3, ac.consumer.wakeup).start()
            t0 = time.monotonic()
            with pytest.raises(WakeupError):
                await ac.getmany(timeout_ms=30_000)
            assert time.monotonic() - t0 < GENEROUS_S
            w.run('m.append_batch("t", 0, [(None, b"x")])')
            got = await ac.getmany(timeout_ms=GENEROUS_S * 1000)
            assert [(r.offset, r.value) for r in got[T0]] == [(100, b"x")]
    asyncio.run(main())


def test_wakeup_from_other_threads_leaves_another_process_consumer_alone(writer, watchdog, tmp_path):
    """A consumer in another process, reading beside this one, never sees this one's wakeups:
    it reads all 100 + 50 records while threads here wake this consumer 20 times and a thread
    keeps polling it (each WakeupError caught, the poll repeated; it too ends with all)."""
    import os
    import subprocess
    import sys
    watchdog(120)
    d, w = writer
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, kstore\n"
         "c = kstore.Consumer(sys.argv[1], auto_offset_reset='earliest')\n"
         "c.assign([kstore.TopicPartition('t', 0)])\n"
         "n = []\n"
         "while len(n) < 150:\n"
         "    for rs in c.poll(timeout_ms=1000).values(): n += [r.offset for r in rs]\n"
         "print(n == list(range(150)), flush=True)\n", d],
        cwd=str(tmp_path), env=dict(os.environ), stdout=subprocess.PIPE, text=True)
    wakes = 0
    with Consumer(d, auto_offset_reset="earliest") as c:
        c.assign([T0])
        seen: list = []

        def poller():
            nonlocal wakes
            while len(seen) < 150:
                try:
                    for rs in c.poll(timeout_ms=30_000).values():
                        seen.extend(r.offset for r in rs)
                except WakeupError:
                    wakes += 1
        t = threading.Thread(target=poller, name="poller")
        t.start()
        wakers = [threading.Thread(target=c.wakeup, name=f"waker-{i}") for i in range(20)]
        for th in wakers:
            th.start()
            time.sleep(0.02)
        join_all(wakers, 30)
        for _ in range(5):
            w.run('m.append_batch("t", 0, [(None, b"n") for _ in range(10)])')
        join_all([t], 60)
        assert seen == list(range(150))
        assert 1 <= wakes <= 20
    out, _ = child.communicate(timeout=60)
    assert (child.returncode, out) == (0, "True\n")


class _CommitOnRevoke:
    """A rebalance listener committing in on_partitions_revoked (Kafka's usual pattern); a
    wakeup() from another thread arrives while the callback runs, so its commit raises."""

    def __init__(self) -> None:
        self.c: Any = None
        self.wake_during = False         # wake the consumer from another thread first
        self.commit_always = False       # commit even without waking
        self.calls: list = []

    def on_partitions_revoked(self, tps) -> None:
        self.calls.append(("revoked", set(tps)))
        if self.wake_during:
            self.wake_during = False
            waker = threading.Thread(target=self.c.wakeup, name="waker")
            waker.start()
            join_all([waker], GENEROUS_S)
            self.c.commit()
        elif self.commit_always:
            self.c.commit()

    def on_partitions_assigned(self, tps) -> None:
        self.calls.append(("assigned", set(tps)))


def test_wakeup_during_a_revoke_callback_completes_the_rebalance(group_store, watchdog):
    """A second member joins; the first's revoke callback is woken up mid-commit, so its poll
    raises WakeupError (once). The rebalance still completes: the first keeps two partitions
    (its next poll reports nothing new assigned), the second, polling in another thread, gets
    the other two and reads a record appended there. Before, the first kept all four partitions for
    good and the second never got any."""
    watchdog(60)
    d, m = group_store
    lst = _CommitOnRevoke()
    stop = threading.Event()
    c1 = Consumer(d, group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=200)
    c2 = Consumer(d, "t", group_id="g", auto_offset_reset="latest", heartbeat_interval_ms=200)
    try:
        c1.subscribe(["t"], listener=lst)
        lst.c = c1
        assert sum(map(len, c1.poll(timeout_ms=GENEROUS_S * 1000).values())) == 40
        lst.wake_during = True
        got2: list = []
        owned2: list = [set()]                          # c2's assignment after its last poll

        def member2():
            while not stop.is_set():
                for rs in c2.poll(timeout_ms=100).values():
                    got2.extend(r.value for r in rs)
                owned2[0] = c2.assignment()
        t = threading.Thread(target=member2, name="member-2")
        t.start()
        raised = 0
        deadline = time.monotonic() + GENEROUS_S
        while len(c1.assignment()) != 2 and time.monotonic() < deadline:
            try:
                c1.poll(timeout_ms=100)
            except WakeupError:
                raised += 1
        assert raised == 1
        c1.poll(timeout_ms=0)                           # applies the rest of the change
        kept = c1.assignment()
        gone = {TP("t", p) for p in range(4)} - kept
        assert len(kept) == 2 and lst.calls[1:] == [("revoked", gone), ("assigned", set())]
        while owned2[0] != gone and time.monotonic() < deadline:
            c1.poll(timeout_ms=10)
        tp2 = min(gone)
        m.append_batch("t", tp2.partition, [(b"k", b"new")])
        while got2 != [b"new"] and time.monotonic() < deadline:
            c1.poll(timeout_ms=100)                     # c1 stays a live member meanwhile
        stop.set()
        join_all([t], GENEROUS_S)
        assert got2 == [b"new"]
        assert owned2[0] == gone and c1.assignment() == kept
        assert c1.committed(tp2) == 10           # the commit before the revoke, on time
    finally:
        stop.set()
        c2.close()
        c1.close()


def test_close_with_a_wakeup_pending_commits_in_the_listener_and_leaves(group_store, watchdog):
    """A wakeup() from another thread is pending when close() runs the revoke callback, which
    commits (auto-commit off): close returns (Kafka's close disables wakeups), the commit is
    written, and a member polling in another thread takes all four partitions and reads on
    from it. Before, close raised WakeupError, the listener's commit was lost and the member
    did not leave."""
    watchdog(60)
    d, m = group_store
    lst = _CommitOnRevoke()
    c1 = Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    c1.subscribe(["t"], listener=lst)
    lst.c, lst.commit_always = c1, True
    assert sum(map(len, c1.poll(timeout_ms=GENEROUS_S * 1000, max_records=1000).values())) == 40
    waker = threading.Thread(target=c1.wakeup, name="waker")
    waker.start()
    join_all([waker], GENEROUS_S)
    c1.close()
    assert c1.closed and lst.calls[-1] == ("revoked", {TP("t", p) for p in range(4)})
    for p in range(4):
        m.append_batch("t", p, [(b"k", b"after")])
    got: list = []

    def member2():
        with Consumer(d, "t", group_id="g", auto_offset_reset="earliest") as c2:
            deadline = time.monotonic() + GENEROUS_S
            while len(got) < 4 and time.monotonic() < deadline:
                for rs in c2.poll(timeout_ms=100).values():
                    got.extend((r.offset, r.value) for r in rs)
    t = threading.Thread(target=member2, name="member-2")
    t.start()
    join_all([t], GENEROUS_S * 2)
    assert got == [(10, b"after")] * 4


@contextlib.contextmanager
def _flock_held(path, cwd):
    """Another process holds path's (a directory's) exclusive flock for the block."""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_FLOCK, path], cwd=str(cwd),
                              env=dict(os.environ), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=GENEROUS_S) == 0


def _commit_into(c, out, started):
    """A thread's c.commit(): "committed" or the kstore error, appended to out."""
    started.append(time.monotonic())
    try:
        c.commit()
        out.append("committed")
    except kstore.KStoreError as e:
        out.append(e)


def _wait_inside(c):
    """Until a thread is inside one of c's calls, then a little more (waiting in it)."""
    deadline = time.monotonic() + GENEROUS_S
    while c._guard.owner is None and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(0.3)


_HOLD_FLOCK = ("import fcntl, os, sys\n"
               "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
               "fcntl.flock(fd, fcntl.LOCK_EX)\n"
               "print('locked', flush=True)\n"
               "sys.stdin.read()\n")


@pytest.mark.parametrize("member", [False, True], ids=["assigned", "group-member"])
def test_wakeup_interrupts_a_commit_waiting_for_the_offsets_flock(group_store, watchdog, tmp_path,
                                                                  member):
    """Another process holds the flock of the group's __consumer_offsets partition: a commit in
    one thread (of an assigned partition, or a subscribed group member's) waits for it, up to
    its 30 s lock timeout. wakeup() from another thread ends that wait with WakeupError well
    before: nothing is written (the committed offset stays 10, read while the flock is still
    held), the position stays 15, and once the flock is released the next commit writes 15.
    Before, the commit waited the flock out."""
    from kstore.group_coordinator import GroupCoordinator
    watchdog(90)
    d, m = group_store
    with Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
        if member:
            c.subscribe(["t"])
        else:
            c.assign([TP("t", 0)])
        assert sum(map(len, c.poll(timeout_ms=5000).values())) == (40 if member else 10)
        c.commit()                                   # makes the group's offsets partition
        m.append_batch("t", 0, [(b"k", b"more%d" % i) for i in range(5)])
        assert len(c.poll(timeout_ms=5000)[TP("t", 0)]) == 5
        with GroupCoordinator(d) as gc:
            path = gc.topic.partition_path(gc.partition_for("g"))
        with _flock_held(path, tmp_path):
            out: list = []
            started: list = []
            t = threading.Thread(target=_commit_into, args=(c, out, started), name="committer")
            t.start()
            _wait_inside(c)
            assert t.is_alive() and out == []
            c.wakeup()
            join_all([t], GENEROUS_S)
            assert time.monotonic() - started[0] < GENEROUS_S
            assert len(out) == 1 and type(out[0]) is WakeupError, out
            assert c.committed(TP("t", 0)) == 10 and c.position(TP("t", 0)) == 15
        c.commit()
        assert c.committed(TP("t", 0)) == 15


def test_wakeup_interrupts_a_commit_waiting_behind_another_threads_commit(group_store, watchdog,
                                                                          tmp_path):
    """Two consumers of g share one GroupCoordinator, each used by its own thread: a's commit
    waits for the offsets flock another process holds, b's waits behind a's (the coordinator's
    one writer of the partition). b.wakeup() ends b's wait only; a.wakeup() then ends a's.
    Nothing was written; with the flock free both commit."""
    from kstore.group_coordinator import GroupCoordinator
    watchdog(90)
    d, _m = group_store
    with GroupCoordinator(d) as gc:
        a = Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False,
                     coordinator=gc)
        b = Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False,
                     coordinator=gc)
        with a, b:
            a.assign([TP("t", 0)])
            b.assign([TP("t", 1)])
            assert len(a.poll(timeout_ms=5000)[TP("t", 0)]) == 10
            assert len(b.poll(timeout_ms=5000)[TP("t", 1)]) == 10
            gc.commit_offsets("g", {TP("t", 2): 1})          # makes the offsets partition
            with _flock_held(gc.topic.partition_path(gc.partition_for("g")), tmp_path):
                outs: dict = {"a": [], "b": []}
                started: list = []
                ta = threading.Thread(target=_commit_into, args=(a, outs["a"], started), name="a")
                ta.start()
                _wait_inside(a)
                tb = threading.Thread(target=_commit_into, args=(b, outs["b"], started), name="b")
                tb.start()
                _wait_inside(b)
                b.wakeup()
                join_all([tb], GENEROUS_S)
                assert [type(e) for e in outs["b"]] == [WakeupError] and outs["a"] == []
                assert ta.is_alive()
                a.wakeup()
                join_all([ta], GENEROUS_S)
                assert [type(e) for e in outs["a"]] == [WakeupError]
                assert time.monotonic() - started[0] < 2 * GENEROUS_S
                assert gc.fetch_offsets("g") == {TP("t", 2): gc.fetch_offsets("g")[TP("t", 2)]}
            a.commit()
            b.commit()
            assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {
                TP("t", 0): 10, TP("t", 1): 10, TP("t", 2): 1}


def test_a_rebalance_interrupted_by_a_wakeup_is_redone_by_the_next_poll(group_store, watchdog,
                                                                        tmp_path):
    """a (here) and b (another process) share t; a then subscribes to u too, and its next poll's
    rebalance waits for group.lock, which b's process holds (as a third member's join would).
    wakeup() from another thread ends that wait (WakeupError). Once the lock is free, a's very
    next poll redoes the rebalance: it owns u's two partitions beside its share of t. Before,
    the heartbeat that had begun the rebalance counted as done, so nothing happened until the
    next one, heartbeat_interval_ms / 2 later (30 s here)."""
    from group_helpers import ChildMember
    watchdog(90)
    d, m = group_store
    m.create_topic("u", 2)
    slow = dict(heartbeat_interval_ms=60_000, session_timeout_ms=120_000)
    child = ChildMember(tmp_path)
    try:
        child.run("!import kstore; from kstore.fileio import FileOps")
        child.run(f"!b = kstore.Consumer({d!r}, 't', group_id='g', heartbeat_interval_ms=60000, "
                  "session_timeout_ms=120000)")
        with Consumer(d, "t", group_id="g", **slow) as a:
            a.poll(timeout_ms=0)
            assert a.assignment() == {TP("t", p) for p in range(4)}
            child.run("b.poll(timeout_ms=0) and None")         # joins: a rebalance, a ring
            a.poll(timeout_ms=0)                               # a gives up b's half
            mine = a.assignment()
            assert len(mine) == 2 and {tp.topic for tp in mine} == {"t"}
            a.subscribe(["t", "u"])
            child.run(f"!gd = GroupDir(FileOps(), {d!r}, 'g'); fd = gd.lock(5)")
            out: list = []
            t = threading.Thread(target=lambda: out.append(_raises(a.poll)), name="poller")
            t.start()
            _wait_inside(a)
            a.wakeup()
            join_all([t], GENEROUS_S)
            assert [type(e) for e in out] == [WakeupError] and a.assignment() == mine
            child.run("!gd.unlock(fd)")
            a.poll(timeout_ms=0)
            assert a.assignment() == mine | {TP("u", 0), TP("u", 1)}
        child.run("!b.close()")
    finally:
        child.close()


def _raises(fn):
    """What fn() raised (a kstore error), or what it returned."""
    try:
        return fn()
    except kstore.KStoreError as e:
        return e


def test_a_commits_pause_sleeps_on_the_bell_and_a_wakeup_ends_it(watchdog):
    """Wakeup.pause, the offsets flock wait's pause: it sleeps (10 pauses of 20 ms take at least
    0.2 s: no hot loop), and a wakeup() from another thread ends a 30 s one with WakeupError;
    the next pause sleeps again (the wakeup was raised once)."""
    from kstore.consumer_wakeup import Wakeup
    watchdog(60)
    w = Wakeup()
    t0 = time.monotonic()
    for _ in range(10):
        w.pause(0.02)
    assert time.monotonic() - t0 >= 0.2
    waker = threading.Timer(0.2, w.wake)
    waker.start()
    t0 = time.monotonic()
    with pytest.raises(WakeupError):
        w.pause(30)
    assert time.monotonic() - t0 < GENEROUS_S
    join_all([waker], GENEROUS_S)
    t0 = time.monotonic()
    w.pause(0.05)
    assert time.monotonic() - t0 >= 0.05


def test_wakeup_interrupts_a_polls_auto_commit_waiting_for_the_offsets_flock(group_store, watchdog,
                                                                             tmp_path):
    """A poll's auto-commit waits for the group's offsets flock, which another process holds:
    wakeup() from another thread ends that poll with WakeupError well before the flock's 30 s
    timeout, nothing written (committed stays 10), position 15; once the flock is free the very
    next poll auto-commits 15 (the woken auto-commit is not put off for an interval, 1 s here).
    Before, the poll sat in the wait until the flock was released or timed out."""
    from kstore.group_coordinator import GroupCoordinator
    watchdog(90)
    d, m = group_store
    with Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=True,
                  auto_commit_interval_ms=1000) as c:
        c.assign([TP("t", 0)])
        assert len(c.poll(timeout_ms=5000)[TP("t", 0)]) == 10
        c.commit()
        m.append_batch("t", 0, [(b"k", b"more%d" % i) for i in range(5)])
        assert len(c.poll(timeout_ms=5000)[TP("t", 0)]) == 5
        time.sleep(1.1)                              # the auto-commit is due at the next poll
        with GroupCoordinator(d) as gc:
            path = gc.topic.partition_path(gc.partition_for("g"))
        with _flock_held(path, tmp_path):
            out: list = []
            t0 = time.monotonic()
            t = threading.Thread(target=lambda: out.append(_raises(lambda: c.poll(timeout_ms=60_000))),
                                 name="poller")
            t.start()
            _wait_inside(c)
            assert t.is_alive() and out == []
            c.wakeup()
            join_all([t], GENEROUS_S)
            assert time.monotonic() - t0 < GENEROUS_S
            assert [type(e) for e in out] == [WakeupError], out
            assert c.committed(TP("t", 0)) == 10 and c.position(TP("t", 0)) == 15
        assert c.poll(timeout_ms=0) == {}
        assert c.committed(TP("t", 0)) == 15


_AFTER_CHILD = (
    "import sys, time, kstore\n"
    "got = []\n"
    "with kstore.Consumer(sys.argv[1], 't', group_id='g', auto_offset_reset='earliest') as c:\n"
    "    deadline = time.monotonic() + 20\n"
    "    while len(got) < 4 and time.monotonic() < deadline:\n"
    "        for rs in c.poll(timeout_ms=200).values(): got += [(r.offset, r.value) for r in rs]\n"
    "print(sorted(got), flush=True)\n")


def _after_in_another_process(d, tmp_path, m) -> str:
    """Append b"after" to each of t's 4 partitions; a group g member in another process reads
    what it gets from the committed offsets (its stdout: the sorted (offset, value) list)."""
    import os
    import subprocess
    import sys
    for p in range(4):
        m.append_batch("t", p, [(b"k", b"after")])
    child = subprocess.run([sys.executable, "-c", _AFTER_CHILD, d], cwd=str(tmp_path), env=dict(os.environ),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert child.returncode == 0, child.stderr
    return child.stdout


def test_close_from_another_thread_runs_the_listeners_commit(group_store, watchdog, tmp_path):
    """close() from another thread while a thread keeps polling: the revoke callback (run by
    close, in the closing thread, after the poller's next poll was refused: close had begun)
    commits (auto-commit off), close returns, the poller's polls end with {} then "closed", and
    a member in another process reads on from that commit. Before, the listener's commit raised
    ConcurrentModificationError (the poller held the thread guard) out of close(), and the
    commit was lost: the next member read all 40 records again."""
    watchdog(90)
    d, m = group_store
    outcomes: list = []
    in_close = threading.Event()

    class CommitOnceThePollerWaits:
        def on_partitions_revoked(self, tps) -> None:
            in_close.set()
            deadline = time.monotonic() + GENEROUS_S
            while len(outcomes) < 2 and time.monotonic() < deadline:
                time.sleep(0.001)          # the poller's next poll was refused (close began)
            c1.commit()
            outcomes.append(("revoked", sorted(tps)))

        def on_partitions_assigned(self, tps) -> None:
            pass
    c1 = Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    c1.subscribe(["t"], listener=CommitOnceThePollerWaits())
    assert sum(map(len, c1.poll(timeout_ms=GENEROUS_S * 1000, max_records=1000).values())) == 40

    def poll_until_closed():
        outcomes.append(c1.poll(timeout_ms=30_000))
        in_close.wait(GENEROUS_S)         # then poll again: refused, close() has begun
        try:
            outcomes.append(c1.poll(timeout_ms=30_000))
        except kstore.KStoreError as e:
            outcomes.append(str(e))
    poller = threading.Thread(target=poll_until_closed, name="poller")
    poller.start()
    deadline = time.monotonic() + GENEROUS_S
    while c1._guard.owner is None and time.monotonic() < deadline:    # inside poll
        time.sleep(0.001)
    time.sleep(0.2)                                                   # asleep in its wait
    c1.close()
    join_all([poller], GENEROUS_S)
    assert outcomes == [{}, "This consumer has already been closed.", ("revoked", [TP("t", p) for p in range(4)])]
    assert _after_in_another_process(d, tmp_path, m) == "[(10, b'after'), (10, b'after'), (10, b'after'), (10, b'after')]\n"


def test_a_second_close_while_the_first_runs_the_listener(group_store, watchdog, tmp_path):
    """A second close() from another thread arrives while the first close's revoke callback
    runs: the callback's commit is written, both closes return without an error, and a member
    in another process reads on from the commit. Before, the second close took the close over
    (the closing thread's id), so the first close's listener commit raised KStoreStateError
    ("the consumer is closed") out of close() and was lost."""
    watchdog(90)
    d, m = group_store
    errors: list = []
    seconds: list = []

    class SecondCloseThenCommit:
        def on_partitions_revoked(self, tps) -> None:
            word = c1._wake.bell.load()

            def close_again():
                try:
                    c1.close()
                except BaseException as e:      # noqa: BLE001 - the test reports it
                    errors.append(e)
            th = threading.Thread(target=close_again, name="second-close")
            th.start()
            seconds.append(th)
            deadline = time.monotonic() + GENEROUS_S
            while c1._wake.bell.load() == word and time.monotonic() < deadline:
                time.sleep(0.001)          # until the second close() rang the bell: it began
            c1.commit()

        def on_partitions_assigned(self, tps) -> None:
            pass
    c1 = Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    c1.subscribe(["t"], listener=SecondCloseThenCommit())
    assert sum(map(len, c1.poll(timeout_ms=GENEROUS_S * 1000, max_records=1000).values())) == 40
    c1.close()
    join_all(seconds, GENEROUS_S)
    assert errors == [] and c1.closed
    assert _after_in_another_process(d, tmp_path, m) == "[(10, b'after'), (10, b'after'), (10, b'after'), (10, b'after')]\n"


def test_other_threads_calls_are_refused_once_close_began(writer, watchdog):
    """While close() runs in another thread (its revoke callback, which commits, holds it), the
    user thread's seek, position and assignment raise KStoreStateError ("closed") and its
    iteration ends (StopIteration); the callback's commit is the position read (100), so a new
    member of the group starts after every record. Before, the user thread passed the guard
    while close ran: its seek(0) landed under the callback's commit, which committed 0 (the
    group rewound: every record read again)."""
    watchdog(60)
    d, w = writer
    inside, go = threading.Event(), threading.Event()
    refused: list = []

    class CommitWhenLetGo:
        def on_partitions_revoked(self, tps) -> None:
            inside.set()
            go.wait(GENEROUS_S)
            c.commit()

        def on_partitions_assigned(self, tps) -> None:
            pass
    c = Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    c.subscribe(["t"], listener=CommitWhenLetGo())
    assert sum(map(len, c.poll(timeout_ms=GENEROUS_S * 1000).values())) == 100
    closer = threading.Thread(target=c.close, name="closer")
    closer.start()
    assert inside.wait(GENEROUS_S)
    for call in (lambda: c.seek(T0, 0), lambda: c.position(T0), c.assignment):
        with pytest.raises(kstore.KStoreStateError, match="^This consumer has already been closed\\.$"):
            call()
        refused.append(True)
    with pytest.raises(StopIteration):
        next(c)
    go.set()
    join_all([closer], GENEROUS_S)
    assert c.closed and refused == [True] * 3
    with Consumer(d, group_id="g") as c2:
        assert c2.committed(T0) == 100


def test_a_second_close_returns_only_once_the_first_finished(writer, watchdog):
    """A close() called while another thread's close() is releasing the consumer's files (here
    held at its store's close) returns only after that close finished, as Kafka's close (it
    holds the consumer until done). Before, it returned at once: the first close had already
    marked the consumer closed, so a program that went on (reopened the store, exited) raced the
    first close still closing its coordinator and store."""
    watchdog(60)
    d, w = writer
    entered, go = threading.Event(), threading.Event()
    c = Consumer(d, "t", group_id="g", auto_offset_reset="earliest")
    assert sum(map(len, c.poll(timeout_ms=GENEROUS_S * 1000).values())) == 100
    source_close = c._source.close

    def held_close() -> None:
        entered.set()
        go.wait(GENEROUS_S)
        source_close()
    c._source.close = held_close            # type: ignore[method-assign]
    first = threading.Thread(target=c.close, name="first-close")
    first.start()
    assert entered.wait(GENEROUS_S)
    second = threading.Thread(target=c.close, name="second-close")
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second close() returned while the first was still closing"
    go.set()
    join_all([first, second], GENEROUS_S)
    assert c.closed
    with Consumer(d, group_id="g") as c2:
        assert c2.committed(T0) == 100


@pytest.mark.parametrize("how", ["poll", "iteration"])
def test_close_from_another_thread_ends_a_join_waiting_for_the_group_lock(writer, watchdog, monkeypatch, how):
    """The writer process holds the group's group.lock (as a member's rebalance there would): a
    poll joining the group waits for it. close() from another thread ends that wait as it ends a
    poll's idle wait: the poll returns {} and `for r in consumer` simply ends; nothing joined,
    nothing committed. Before, both raised KStoreStateError out of the poll and the loop."""
    from kstore.consumer_wakeup import Wakeup
    watchdog(60)
    d, w = writer
    w.run("from kstore.fileio import FileOps", "from kstore.group_files import GroupDir",
          "from kstore.group_coordinator import GroupCoordinator",
          'gd = GroupDir(FileOps(), GroupCoordinator(m).log_dir_for("g"), "g")', "gd.make()",
          "held = gd.lock(5)")
    waiting, check_wait = threading.Event(), Wakeup.check_wait

    def checked(self):                       # the join's group.lock wait asks it between tries
        waiting.set()
        check_wait(self)
    monkeypatch.setattr(Wakeup, "check_wait", checked)
    c = Consumer(d, "t", group_id="g", auto_offset_reset="earliest")
    out: list = []

    def run():
        try:
            out.append(c.poll(timeout_ms=30_000) if how == "poll" else list(c))
        except BaseException as e:           # noqa: BLE001 - the test reports it
            out.append(repr(e))
    t = threading.Thread(target=run, name="joining")
    t.start()
    assert waiting.wait(GENEROUS_S)
    c.close()
    join_all([t], GENEROUS_S)
    assert out == ([{}] if how == "poll" else [[]]) and c.closed
    w.run("gd.unlock(held)")
    assert Consumer(d, group_id="g").committed(T0) is None
