"""kstore.AsyncConsumer under an event loop: several consumers in one loop share ONE waiter
thread (no thread per consumer), getmany waits without blocking the loop and wakes on an
append (this process or another), getone / async for, commits."""
import asyncio
import threading
import time

import pytest

import kstore
from kstore import AsyncConsumer, TopicPartition as TP
from kstore.async_consumer import WAITER

from thread_watchdog import join_all
from writer_process import WriterProcess


@pytest.fixture
def store(tmp_path):
    d = str(tmp_path / "data")
    m = kstore.LogManager(d)
    m.create_topic("t", 4)
    yield d, m
    m.close()


def offsets(got):
    return {str(tp): [r.offset for r in recs] for tp, recs in got.items()}


def test_many_consumers_one_loop_one_waiter_thread(store, watchdog):
    watchdog(60)
    d, m = store

    async def main():
        cs = [AsyncConsumer(d, auto_offset_reset="earliest") for _ in range(4)]
        for p, c in enumerate(cs):
            c.assign([TP("t", p)])
            await c.start()
        tasks = [asyncio.create_task(c.getmany(timeout_ms=10000)) for c in cs]
        await asyncio.sleep(0.3)                # all four are waiting now
        assert all(not t.done() for t in tasks)
        waiting_threads = [t.name for t in threading.enumerate() if "waiter" in t.name]
        ticks = 0

        async def ticker():                     # the loop stays free while they wait
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)
        tick = asyncio.create_task(ticker())
        for p in (2, 0, 3, 1):
            m.append_batch("t", p, [(b"k", b"v%d" % p)])
            await asyncio.sleep(0.05)
        got = await asyncio.wait_for(asyncio.gather(*tasks), 10)
        tick.cancel()
        for c in cs:
            await c.stop()
        return got, waiting_threads, ticks

    got, waiting_threads, ticks = asyncio.run(main())
    assert waiting_threads == ["kstore-async-waiter"] and WAITER.wakeups > 0     # the one waiter, not one per consumer
    assert [offsets(g) for g in got] == [{"t-%d" % p: [0]} for p in range(4)]
    assert [g[TP("t", p)][0].value for p, g in enumerate(got)] == [b"v%d" % p for p in range(4)]
    assert ticks >= 10


def test_getmany_timeout_returns_empty_and_idles(store, watchdog):
    watchdog(60)
    d, _m = store

    async def main():
        async with AsyncConsumer(d) as c:
            c.assign([TP("t", 0), TP("t", 1)])
            cpu, t0 = time.process_time(), time.monotonic()
            got = await c.getmany(timeout_ms=1500)
            return got, time.monotonic() - t0, time.process_time() - cpu

    got, wall, cpu = asyncio.run(main())
    assert got == {} and wall >= 1.49
    assert cpu < 0.1, f"an idle getmany(1500) used {cpu * 1000:.1f} ms of CPU"


def test_getone_async_for_and_partitions_filter(store, watchdog):
    watchdog(60)
    d, m = store
    for p in range(2):
        m.append_batch("t", p, [(b"k", b"p%d-%d" % (p, i)) for i in range(3)])

    async def main():
        async with AsyncConsumer(d, auto_offset_reset="earliest") as c:
            c.assign([TP("t", 0), TP("t", 1)])
            only1 = await c.getmany(TP("t", 1), timeout_ms=1000)
            first = await c.getone(TP("t", 0))
            rest = []
            async for r in c:
                rest.append((r.partition, r.offset, r.value))
                if len(rest) == 2:
                    break
            return only1, first, rest, await c.position(TP("t", 0))

    only1, first, rest, pos = asyncio.run(main())
    assert offsets(only1) == {"t-1": [0, 1, 2]}
    assert (first.topic, first.partition, first.offset, first.value) == ("t", 0, 0, b"p0-0")
    assert rest == [(0, 1, b"p0-1"), (0, 2, b"p0-2")] and pos == 3


def test_wakes_on_an_append_in_another_process_and_commits(tmp_path, watchdog):
    watchdog(60)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run('m.create_topic("t", 1)')

        async def main():
            async with AsyncConsumer(d, group_id="g", auto_offset_reset="earliest") as c:
                c.assign([TP("t", 0)])
                task = asyncio.create_task(c.getmany(timeout_ms=20000))
                await asyncio.sleep(0.3)
                t0 = time.monotonic()
                await asyncio.get_running_loop().run_in_executor(
                    None, w.run, 'm.append_batch("t", 0, [(b"k", b"x")])')
                got = await task
                waited = time.monotonic() - t0
                await c.commit()
                return got, waited, await c.committed(TP("t", 0))

        got, waited, committed = asyncio.run(main())
        assert offsets(got) == {"t-0": [0]} and waited < 10 and committed == 1
    finally:
        w.close()


def _waiter_idents():
    return [t.ident for t in threading.enumerate() if t.name == "kstore-async-waiter"]


def test_waiter_thread_lingers_between_waits_then_ends(store, watchdog, monkeypatch):
    """A consumer loop waits again right after each batch: the same waiter thread serves the
    next wait (no thread started per wait), and it ends once LINGER_S pass with none pending."""
    import kstore.async_consumer as ac
    watchdog(60)
    monkeypatch.setattr(ac, "LINGER_S", 0.5)
    d, m = store

    async def main():
        idents = []
        async with AsyncConsumer(d, auto_offset_reset="earliest") as c:
            c.assign([TP("t", 0)])
            for i in range(5):
                task = asyncio.create_task(c.getmany(timeout_ms=10000))
                await asyncio.sleep(0.02)           # waiting now, through the waiter thread
                idents.append(tuple(_waiter_idents()))
                m.append_batch("t", 0, [(b"k", b"v%d" % i)])
                got = await asyncio.wait_for(task, 10)
                assert [(r.offset, r.value) for r in got[TP("t", 0)]] == [(i, b"v%d" % i)]
        return idents

    idents = asyncio.run(main())
    assert len(idents[0]) == 1 and idents == [idents[0]] * 5       # one thread, kept
    deadline = time.monotonic() + 5
    while WAITER.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not WAITER.running and _waiter_idents() == []


def test_waits_racing_the_waiter_threads_end_all_resolve(store, watchdog, monkeypatch):
    """A wait added just as the lingering thread gives up is served (by it or by a new one):
    with a linger of ~0, every round's wait must still wake on its append."""
    import kstore.async_consumer as ac
    watchdog(120)
    monkeypatch.setattr(ac, "LINGER_S", 0.0005)
    d, m = store

    async def main():
        async with AsyncConsumer(d, auto_offset_reset="earliest") as c:
            c.assign([TP("t", 1)])
            for i in range(200):
                task = asyncio.create_task(c.getmany(timeout_ms=20000))
                await asyncio.sleep(0.001 * (i % 3))
                m.append_batch("t", 1, [(b"k", b"%d" % i)])
                got = await asyncio.wait_for(task, 20)
                assert [r.offset for r in got[TP("t", 1)]] == [i]
    asyncio.run(main())


def test_a_forked_child_waits_through_its_own_waiter(store, watchdog, tmp_path):
    """fork() while the parent's waiter thread lingers: the child's getmany still wakes on an
    append (a thread of its own), it does not take the parent's thread for alive."""
    import multiprocessing as mp
    watchdog(60)
    d, m = store

    async def parent():
        async with AsyncConsumer(d, auto_offset_reset="earliest") as c:
            c.assign([TP("t", 2)])
            task = asyncio.create_task(c.getmany(timeout_ms=10000))
            await asyncio.sleep(0.05)
            m.append_batch("t", 2, [(b"k", b"parent")])
            return await asyncio.wait_for(task, 10)
    assert [r.value for r in asyncio.run(parent())[TP("t", 2)]] == [b"parent"]
    assert WAITER.running                       # lingering: what the child must not rely on

    def child(q):
        async def main():
            async with AsyncConsumer(d, auto_offset_reset="earliest") as c:
                c.assign([TP("t", 3)])
                got = await c.getmany(timeout_ms=8000)
                return [r.value for r in got.get(TP("t", 3), [])]
        q.put(asyncio.run(main()))

    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start()
    time.sleep(0.5)                             # the child is waiting
    m.append_batch("t", 3, [(b"k", b"child")])
    assert q.get(timeout=20) == [b"child"]
    p.join(20)
    assert p.exitcode == 0


class _NoFutexKick:
    """The waiter's kick bell on a system without futex (off Linux): sleep reports ENOSYS at
    once, as kn_wait does there; counts the sleeps."""

    def __init__(self, bell):
        self.bell = bell
        self.sleeps = 0

    def arm(self):
        return self.bell.arm()

    def bump_end(self, *hints):
        self.bell.bump_end(*hints)

    def sleep(self, armed, timeout, settle=0.0):
        import errno
        self.sleeps += 1
        return errno.ENOSYS


def test_a_lingering_waiter_without_futex_polls_instead_of_spinning(watchdog, monkeypatch):
    """Without futex the idle waiter sleeps POLL_S at a time, as every other kstore wait does
    there: about LINGER_S / POLL_S turns while it lingers, not a busy loop."""
    import kstore.async_consumer as ac
    from kstore import notify
    watchdog(60)
    monkeypatch.setattr(ac, "LINGER_S", 0.5)
    waiter = ac.AsyncWaiter()
    kick = waiter._kick = _NoFutexKick(waiter._kick)

    async def main():
        await asyncio.wait_for(waiter.wait([], [], [], 0.0), 10)   # done at once; then it lingers
    asyncio.run(main())
    deadline = time.monotonic() + 10
    while waiter.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not waiter.running
    assert 1 <= kick.sleeps <= 0.5 / notify.POLL_S + 2, kick.sleeps


def test_the_lingering_waiter_keeps_no_loop_alive(store, watchdog):
    """While the waiter thread lingers after its last wait, nothing of that wait (its loop, its
    future) is kept: a finished asyncio.run's loop is freed."""
    import gc
    import weakref
    watchdog(60)
    d, m = store
    ref = []

    async def main():
        ref.append(weakref.ref(asyncio.get_running_loop()))
        async with AsyncConsumer(d, auto_offset_reset="earliest") as c:
            c.assign([TP("t", 0)])
            task = asyncio.create_task(c.getmany(timeout_ms=10000))
            await asyncio.sleep(0.05)
            m.append_batch("t", 0, [(b"k", b"v")])
            got = await asyncio.wait_for(task, 10)
            assert [r.value for r in got[TP("t", 0)]] == [b"v"]
    asyncio.run(main())
    time.sleep(0.1)                             # the waiter's turn is over: it lingers
    gc.collect()
    assert WAITER.running and ref[0]() is None


def test_a_wait_on_a_bell_closed_before_it_began_resolves_without_spinning(store, watchdog):
    """A group bell replaced by a heartbeat (its file re-created) is closed under a wait spec
    taken just before: the wait ends at once, as for a bell that rang, instead of turning the
    waiter thread in a busy loop until its deadline (the consumer then polls the new bell)."""
    from kstore import _notify
    import kstore.async_consumer as ac
    watchdog(60)
    d, m = store
    lg = m.log("t", 0)
    bell = _notify.Bell.private()
    bell.close()
    waiter = ac.AsyncWaiter()

    async def main():
        t0 = time.monotonic()
        await asyncio.wait_for(waiter.wait([lg], [lg.log_end_offset], [bell], 20.0), 30)
        return time.monotonic() - t0
    took = asyncio.run(main())
    assert took < 10, took                   # not the 20 s deadline
    assert waiter.wakeups <= 2, waiter.wakeups


def test_a_blocking_wait_on_a_closed_bell_returns_at_once(store, watchdog):
    """fetcher.wait_logs, the blocking poll's sleep: a closed bell ends it (it cannot ring)."""
    from kstore import _notify
    from kstore import fetcher
    watchdog(60)
    d, m = store
    lg = m.log("t", 0)
    bell = _notify.Bell.private()
    bell.close()
    calls = []
    t0 = time.monotonic()
    fetcher.wait_logs([lg], [lg.log_end_offset], 20.0, [bell], check=lambda: calls.append(1) and False)
    assert time.monotonic() - t0 < 10
    assert len(calls) <= 1, len(calls)       # returned before its first sleep, no spinning turns


@pytest.mark.parametrize("by", ["task", "thread"])
def test_waits_end_when_another_task_or_thread_stops_the_consumer(tmp_path, watchdog, by):
    """getmany, getone and async for, all waiting on one consumer (a writer process's topic),
    end when another task stops it or another thread closes it, as aiokafka's after stop():
    getmany/getone raise (aiokafka: ConsumerStoppedError; kstore: KStoreStateError with
    Kafka's message), async for ends; later calls raise the same, stop() again is quiet, and
    the close committed what getmany returned. In 'thread' the close is held in its revoke
    listener until the tasks are done: before, async for raised KStoreStateError instead of
    ending while the close was still running (it looked only at `closed`, set last)."""
    watchdog(60)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    w.run('m.create_topic("t", 1)', 'm.append_batch("t", 0, [(None, b"%d" % i) for i in range(10)])')
    let_go = threading.Event()

    class HoldClose(kstore.ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            assert by == "task" or let_go.wait(30)

        def on_partitions_assigned(self, assigned):
            pass

    def outcome(task):
        e = task.exception()
        return (type(e).__name__, str(e)) if e is not None else task.result()

    async def collect(c):
        return [r.offset async for r in c]

    async def main():
        c = AsyncConsumer(d, "t", group_id="g", auto_offset_reset="earliest", listener=HoldClose())
        first = offsets(await c.getmany(timeout_ms=10000))
        tasks = {"getmany": asyncio.create_task(c.getmany(timeout_ms=60000)),
                 "getone": asyncio.create_task(c.getone()), "async for": asyncio.create_task(collect(c))}
        await asyncio.sleep(0)               # each task runs to its wait on the waiter thread
        assert not any(t.done() for t in tasks.values())
        if by == "task":
            await c.stop()
        else:
            closer = threading.Thread(target=c.consumer.close, name="closer")
            closer.start()
        await asyncio.wait(tasks.values(), timeout=30)
        ended = {name: outcome(t) for name, t in tasks.items()}
        let_go.set()
        if by == "thread":
            await asyncio.get_running_loop().run_in_executor(None, join_all, [closer], 30)
        later = []
        for call in (lambda: c.getmany(timeout_ms=1000), c.getone, lambda: c.position(TP("t", 0)),
                     lambda: c.end_offsets([TP("t", 0)])):
            try:
                later.append(await call())
            except kstore.KStoreStateError as e:
                later.append(str(e))
        later.append(await collect(c))
        t0 = TP("t", 0)
        surface = {"commit": c.commit, "commit_offsets": lambda: c.commit({t0: 3}),
                   "committed": lambda: c.committed(t0), "seek": lambda: c.seek(t0, 0),
                   "seek_to_beginning": c.seek_to_beginning, "seek_to_end": c.seek_to_end,
                   "offsets_for_times": lambda: c.offsets_for_times({t0: 0}),
                   "beginning_offsets": lambda: c.beginning_offsets([t0]),
                   "subscribe": lambda: c.subscribe(["t"]), "unsubscribe": c.unsubscribe,
                   "assign": lambda: c.assign([t0]), "assignment": c.assignment,
                   "subscription": c.subscription, "pause": lambda: c.pause(t0),
                   "resume": lambda: c.resume(t0), "paused": c.paused}
        refused = {}
        for name, call in surface.items():
            try:
                got = call()
                refused[name] = await got if asyncio.iscoroutine(got) else got
            except kstore.KStoreStateError as e:
                refused[name] = str(e)
        await c.stop()
        return first, ended, later, refused

    first, ended, later, refused = asyncio.run(main())
    closed = "This consumer has already been closed."
    assert first == {"t-0": list(range(10))}
    assert ended == {"getmany": ("KStoreStateError", closed), "getone": ("KStoreStateError", closed),
                     "async for": []}
    assert later == [closed] * 4 + [[]]
    assert refused == dict.fromkeys(refused, closed) and len(refused) == 16
    assert kstore.Consumer(d, group_id="g").committed(TP("t", 0)) == 10
    assert w.close() == 0


def test_a_close_begun_by_another_thread_never_blocks_getmany_on_the_loop(tmp_path, watchdog):
    """Another thread's close() begins just after a getmany's poll found nothing and before
    that getmany hands its wait to the waiter thread; the close's revoke listener runs a
    coroutine on the event loop and waits for it (run_coroutine_threadsafe, as an async app's
    listener does to flush its own state). getmany raises KStoreStateError (Kafka's message)
    at once, the loop runs the listener's coroutine, the close commits what getmany returned.
    Before, getmany's wait spec waited for the consumer's lock, held by the close: the event
    loop blocked behind the close, which waited for the loop (a deadlock, here cut by the
    listener's 10 s timeout)."""
    watchdog(90)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    w.run('m.create_topic("t", 1)', 'm.append_batch("t", 0, [(None, b"%d" % i) for i in range(10)])')
    in_listener = threading.Event()
    ran: list = []

    async def main():
        loop = asyncio.get_running_loop()

        async def flush_state(revoked):
            ran.append(sorted(map(str, revoked)))

        class FlushOnTheLoop(kstore.ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked):
                in_listener.set()
                t0 = time.monotonic()
                asyncio.run_coroutine_threadsafe(flush_state(revoked), loop).result(10)
                ran.append(time.monotonic() - t0 < 5)

            def on_partitions_assigned(self, assigned):
                pass

        c = AsyncConsumer(d, "t", group_id="g", auto_offset_reset="earliest", listener=FlushOnTheLoop())
        first = offsets(await c.getmany(timeout_ms=10000))
        poll_now, closer = c._poll_now, threading.Thread(target=c.consumer.close, name="closer")

        def found_nothing_then_close_begins(*a):
            got = poll_now(*a)
            if not got and not closer.is_alive():
                closer.start()
                assert in_listener.wait(10)      # the close holds the consumer, waiting for the loop
            return got
        c._poll_now = found_nothing_then_close_begins
        try:
            await c.getmany(timeout_ms=30000)
            outcome = "returned"
        except kstore.KStoreStateError as e:
            outcome = str(e)
        await loop.run_in_executor(None, join_all, [closer], 30)
        return first, outcome

    first, outcome = asyncio.run(main())
    assert first == {"t-0": list(range(10))}
    assert outcome == "This consumer has already been closed."
    assert ran == [["t-0"], True]
    assert kstore.Consumer(d, group_id="g").committed(TP("t", 0)) == 10
    assert w.close() == 0


def test_getmany_of_some_partitions_never_returns_or_consumes_one_a_rebalance_assigns(store, watchdog):
    """getmany(tp) returns only tp's records (aiokafka's), also when its poll's rebalance
    assigns this member more partitions: those were unpaused and fetched, returned to a caller
    that asked for tp only, and their positions moved past records nobody handled."""
    watchdog(60)
    d, m = store
    for i in range(40):
        m.append_batch("t", i % 4, [(None, b"%d" % i)])

    async def main():
        a = AsyncConsumer(d, "t", group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=50)
        b = AsyncConsumer(d, "t", group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=50)
        await a.getmany(timeout_ms=0, max_records=1)           # a: all four partitions
        assert a.assignment() == {TP("t", p) for p in range(4)}
        for _ in range(100):                                    # b joins: a keeps two
            await b.getmany(timeout_ms=0, max_records=1)
            await a.getmany(timeout_ms=0, max_records=1)
            if len(a.assignment()) == 2 and len(b.assignment()) == 2:
                break
        assert len(a.assignment()) == 2 and not a.assignment() & b.assignment()
        want = min(a.assignment())
        b_positions = {tp: await b.position(tp) for tp in b.assignment()}
        await b.stop()                                          # b leaves: committed its positions
        got = {}
        for _ in range(100):                                    # a's poll takes t-2, t-3 back
            for tp, recs in (await a.getmany(want, timeout_ms=0, max_records=20)).items():
                got.setdefault(tp, []).extend(r.offset for r in recs)
            if len(a.assignment()) == 4:
                break
        assert a.assignment() == {TP("t", p) for p in range(4)}
        assert set(got) <= {want}
        positions = {tp: await a.position(tp) for tp in b_positions}
        rest = await a.getmany(*b_positions, timeout_ms=0, max_records=100)
        await a.stop()
        return positions, b_positions, {tp: recs[0].offset for tp, recs in rest.items()}

    positions, b_positions, first = asyncio.run(main())
    assert positions == b_positions                             # nothing of t-2, t-3 consumed
    for tp, off in b_positions.items():
        assert first[tp] == off                                 # a later getmany reads them


def test_stop_takes_closes_timeout(store, watchdog, tmp_path, caplog):
    """AsyncConsumer.stop(timeout=) is Consumer.close(timeout=): another process holds the
    group's offsets flock for good, stop(timeout=0.5) returns (a 10 s watchdog armed before
    it, the flock released only after), the consumer is stopped, its commit logged as not
    made (Kafka's words): the last commit (1) stays."""
    import logging
    from group_helpers import FlockHolder
    from kstore.group_coordinator import GroupCoordinator
    watchdog(60)
    caplog.set_level(logging.WARNING, logger="kstore.consumer")
    d, m = store
    m.append_batch("t", 0, [(None, b"x")] * 3)
    with GroupCoordinator(d) as gc:
        path = gc.topic.partition_path(gc.partition_for("g"))

    async def main():
        c = AsyncConsumer(d, group_id="g", auto_offset_reset="earliest")
        c.consumer.assign([TP("t", 0)])
        got = await c.getmany(timeout_ms=5000)
        c.consumer.commit({TP("t", 0): 1})
        holder = FlockHolder(path, tmp_path)
        try:
            watchdog(10)
            await c.stop(timeout=0.5)
            assert holder.p.poll() is None
        finally:
            holder.release()
        return got, c.consumer.closed
    got, closed = asyncio.run(main())
    assert offsets(got) == {"t-0": [0, 1, 2]} and closed
    with GroupCoordinator(d) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 1}
    assert [r.getMessage() for r in caplog.records if r.name == "kstore.consumer"] == [
        "Auto-commit of offsets {'t-0': 3} timed out before completion"]


def test_retries_of_an_offline_offsets_dir_leave_the_event_loop_running(tmp_path, watchdog):
    """commit, committed and position of a group whose offsets partition's dir is offline are
    retried until their timeout (Kafka's), in the event loop: a ticker task runs meanwhile
    (the Consumer's own retry would block the loop for default_api_timeout_ms, 60 s), then
    ApiTimeoutError naming the whole timeout and the cause; the earlier commit stands."""
    import errno
    from test_consumer_commits import _two_groups
    watchdog(60)
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = kstore.LogManager([d1, d2], {"offsets.topic.num.partitions": "2"})
    try:
        m.create_topic("t", 4)
        g, _h, _pg = _two_groups(m)
        with kstore.Consumer(m, group_id=g, enable_auto_commit=False) as c:
            c.commit({TP("t", p): 10 + p for p in range(4)})
        m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))

        async def main():
            ac = AsyncConsumer(m, group_id=g, enable_auto_commit=False, default_api_timeout_ms=400)
            ac.assign([TP("t", p) for p in range(4)])
            ticks = []

            async def ticker():
                while True:
                    ticks.append(time.monotonic())
                    await asyncio.sleep(0.02)
            tk = asyncio.create_task(ticker())
            out = []
            try:
                for call in (lambda: ac.commit({TP("t", 0): 5}),
                             lambda: ac.committed(TP("t", 0), timeout_ms=300),
                             lambda: ac.position(TP("t", 0))):
                    t0, n0 = time.monotonic(), len(ticks)
                    with pytest.raises(kstore.ApiTimeoutError) as e:
                        await call()
                    out.append((str(e.value), time.monotonic() - t0, len(ticks) - n0))
            finally:
                tk.cancel()
                await ac.stop()
            return out
        got = asyncio.run(main())
        for (msg, took, ticked), (ms, what) in zip(got, ((400, "successfully committing offsets {t-0=5}"),
                                                        (300, "the last committed offset for partitions [t-0] could be determined"),
                                                        (400, "the position for partition t-0 could be determined"))):
            assert msg.startswith(f"Timeout of {ms}ms expired before {what}"), msg
            assert f"log dir {d1}, which is offline" in msg
            assert took >= ms / 1000 and ticked >= 5, (msg, took, ticked)
    finally:
        m.close()
    with kstore.LogManager([d1, d2]) as m2, kstore.Consumer(m2, group_id=g, enable_auto_commit=False) as c3:
        assert [c3.committed(TP("t", p)) for p in range(4)] == [10, 11, 12, 13]
