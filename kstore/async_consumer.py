"""`kstore.AsyncConsumer`: the consumer for asyncio, shaped as aiokafka's AIOKafkaConsumer.

    async with kstore.AsyncConsumer("data", "clicks", group_id="g") as c:
        async for rec in c:                  # ConsumerRecord(topic, partition, offset, ...)
            ...
        batch = await c.getmany(timeout_ms=500, max_records=100)   # {TopicPartition: [Record]}

It wraps a `Consumer` (same options, same rules) whose reads and commits run on the event loop's
thread (they are short file operations). Only the waiting moves off it: when a consumer has
nothing to return it hands what it would sleep on (its partitions' notification words and
offsets, its group's bell) to ONE process-wide waiter thread, which sleeps on the words of every
waiting async consumer at once (one futex_waitv) and resolves each consumer's future through
`loop.call_soon_threadsafe` when its data arrives, its bell rings or its timeout passes. No
thread per consumer, no polling loop.
"""
from __future__ import annotations

import asyncio
import errno
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

from kstore import _notify, notify
from kstore._core import Record
from kstore.consumer import Consumer, ConsumerRecord, OffsetAndTimestamp
from kstore.consumer_queries import RETRY_BACKOFF_S
from kstore.errors import ApiTimeoutError, InvalidConfigError, KStoreError, KStoreStateError
from kstore.group_records import OffsetAndMetadata
from kstore.topic_partition import TopicPartition

__all__ = ["AsyncConsumer", "AsyncWaiter", "WAITER"]

V = TypeVar("V")


class _Wait:
    __slots__ = ("loop", "fut", "logs", "offsets", "bells", "seen", "deadline", "check")

    def __init__(self, loop, fut, logs, offsets, bells, deadline, check=None):
        self.loop = loop
        self.fut = fut
        self.logs = logs
        self.offsets = offsets
        self.bells = bells
        self.seen = [b.load() >> 1 for b in bells]   # the bells' counters when the wait began
        self.deadline = deadline
        self.check = check


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


#: seconds the waiter thread stays (asleep on its kick word) with no wait pending before it
#: ends: a consumer loop waits again right after each batch it gets, and starting a thread for
#: every such wait cost more than the wake-up itself
LINGER_S = 2.0


class AsyncWaiter:
    """The process's one waiter thread: sleeps on the words of every pending wait and wakes
    their futures. Started on the first wait, ends after LINGER_S with none pending (and
    starts again).

    Lock: `_lock` guards the list of pending waits and the thread's life; a leaf, never held
    while the thread arms, refreshes (LogNotifier._lock, Log._lock) or sleeps."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waits: list[_Wait] = []
        self._kick = _notify.Bell.private()     # rung when a wait is added
        self._thread: Optional[threading.Thread] = None
        self.wakeups = 0                         # loop turns (tests: no spinning)

    @property
    def running(self) -> bool:
        t = self._thread
        return t is not None and t.is_alive()

    def wait(self, logs, offsets, bells, timeout: float,
             check: Optional[Callable[[], bool]] = None) -> "asyncio.Future[None]":
        """A future (of the running loop) done when some logs[i] ends past offsets[i], a bell's
        word moves, check() holds (asked after arming: a Consumer's wakeup), or after timeout
        seconds."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        w = _Wait(loop, fut, list(logs), list(offsets), list(bells), time.monotonic() + max(0.0, timeout),
                  check)
        with self._lock:
            self._waits.append(w)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kstore-async-waiter", daemon=True)
                self._thread.start()
        self._kick.bump_end(0, 0, 0)
        return fut

    def after_fork(self) -> None:
        """In a forked child, which has none of the parent's threads: forget the parent's waits
        and thread (a lingering one would look alive to wait() and never serve the child's) and
        its lock (a parent thread may have held it)."""
        self._lock = threading.Lock()
        self._waits = []
        self._thread = None

    def _run(self) -> None:
        quiet = False
        idle_until: Optional[float] = None      # no wait pending: lingering until then
        while True:
            kick = self._kick.arm()             # before the look: a wait added after it rings
            now = time.monotonic()
            with self._lock:
                waits = [w for w in self._waits if not w.fut.done()]
                self._waits = waits
                if not waits and idle_until is not None and now >= idle_until:
                    self._thread = None         # wait() starts another from here on
                    return
            if not waits:
                if idle_until is None:
                    idle_until = now + LINGER_S
                if self._kick.sleep(kick, idle_until - now) == errno.ENOSYS:
                    time.sleep(min(idle_until - now, notify.POLL_S))    # no futex: poll
                continue
            idle_until = None
            quiet = self._turn(waits, kick, now, quiet)

    def _turn(self, waits: list[_Wait], kick: int, now: float, quiet: bool) -> bool:
        """One turn of _run with waits pending: resolve the ready ones, else sleep on every
        word (a slice at most). Returns whether the turn ended quiet (a timeout, no wake). A
        method of its own so that nothing of a turn (a loop, its futures) outlives it while
        the thread lingers."""
        self.wakeups += 1
        bells: dict[int, tuple[Any, int]] = {id(self._kick): (self._kick, kick)}
        usable = True
        done: list[_Wait] = []
        for w in waits:
            try:
                ready = self._arm(w, now, quiet, bells)
            except (KStoreError, OSError):
                ready = True                 # closed or deleted: the consumer finds out
            if ready is None:
                usable = False
            elif ready:
                done.append(w)
        if done:
            self._resolve(done)
            return False
        left = min(w.deadline for w in waits) - now
        slice_ = max(0.0, min(left, notify.SLICE_S))
        r = errno.ENOSYS
        if usable and len(bells) <= _notify.WAIT_ANY_MAX:
            bs = [b for b, _w in bells.values()]
            r = _notify.wait_any(bs, [wd for _b, wd in bells.values()], slice_, notify.SETTLE_S)
        if r == errno.ENOSYS:
            time.sleep(min(slice_, notify.POLL_S))
        elif r == 0 or r == errno.EAGAIN:
            # woken: read-only logs whose writer appended learn it by the tail step alone (the
            # append-to-visible path); the rest waits for the next turn's catch-up
            done = [w for w in waits if self._woken(w, now)]
            if done:
                self._resolve(done)
        return r in (errno.ETIMEDOUT, errno.ENOSYS)

    def _resolve(self, done: list[_Wait]) -> None:
        """Hand each done wait's result to its event loop; they leave the pending list."""
        for w in done:
            try:
                w.loop.call_soon_threadsafe(_resolve, w.fut)
            except RuntimeError:
                pass                         # its loop is closed
        with self._lock:
            self._waits = [w for w in self._waits if w not in done]

    @staticmethod
    def _woken(w: _Wait, now: float) -> bool:
        """Whether a log of w is past its offset by a woken waiter's tail step
        (LogNotifier.woken); False leaves w to the next turn."""
        try:
            for lg, off in zip(w.logs, w.offsets):
                if notify.woken_past(lg, lg.notifier.current_bell(now) if lg.read_only else None, off):
                    return True
        except (KStoreError, OSError):
            return True                      # closed or deleted: the consumer finds out
        return False

    @staticmethod
    def _arm(w: _Wait, now: float, quiet: bool, bells: dict) -> Optional[bool]:
        """Arm w's words (into bells); True if w is done, None if one log has no usable word."""
        if w.fut.done() or now >= w.deadline:
            return True
        for b, seen in zip(w.bells, w.seen):
            word = b.arm()
            if b.closed or word >> 1 != seen:
                return True                  # rang, or closed (replaced): it cannot ring
            bells[id(b)] = (b, word)
        if w.check is not None and w.check():
            return True
        usable: Optional[bool] = False
        for lg, off in zip(w.logs, w.offsets):
            n = lg.notifier
            bell = n.current_bell(now)
            word = bell.arm() if bell is not None else 0
            n.catch_up(bell, word, quiet)
            if lg.log_end_offset > off:
                return True
            if bell is None:
                usable = None
            else:
                bells[id(bell)] = (bell, word)
        return usable


#: The process-wide waiter of every AsyncConsumer.
WAITER = AsyncWaiter()


def _after_fork_in_child() -> None:
    WAITER.after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)


class AsyncConsumer:
    """A Consumer for asyncio (aiokafka's names): see the module doc. Takes Consumer's
    arguments. Use `async with`, or `await start()` / `await stop()`."""

    def __init__(self, store: Any, *topics: str, **configs: Any):
        self._c = Consumer(store, *topics, **configs)

    @property
    def consumer(self) -> Consumer:
        """The synchronous Consumer underneath (same positions, same group membership)."""
        return self._c

    async def start(self) -> None:
        """aiokafka's start(): the group is joined at the first getmany/getone."""

    async def stop(self, timeout: Optional[float] = None) -> None:
        """Commit (with auto-commit), leave the group and close: Consumer.close(timeout=)."""
        self._c.close(timeout=timeout)

    close = stop

    async def __aenter__(self) -> "AsyncConsumer":
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def getmany(self, *partitions: TopicPartition, timeout_ms: float = 0,
                      max_records: Optional[int] = None) -> dict[TopicPartition, list[Record]]:
        """Records grouped by partition (of partitions only, if given), waiting up to
        timeout_ms for some without blocking the event loop. Once stopped (here, by another
        task or thread, even while it waits): KStoreStateError, aiokafka's ConsumerStoppedError."""
        deadline = time.monotonic() + max(0.0, timeout_ms / 1000)
        while True:
            got = self._poll_now(partitions, max_records)
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            logs, offsets, bells, bound = self._c.wait_spec(partitions or None)
            await WAITER.wait(logs, offsets, bells, min(left, bound), self._c.wait_interrupted)

    def _poll_now(self, partitions, max_records) -> dict[TopicPartition, list[Record]]:
        """A poll(0) of the given partitions only: the others paused for it, and one its
        rebalance assigned (unpaused) put back where it was, neither returned nor consumed."""
        if not partitions:
            return self._c.poll(0, max_records)
        want = set(map(_tp, partitions))
        others = self._c.assignment() - want - self._c.paused()
        self._c.pause(*others)
        try:
            got = self._c.poll(0, max_records)
        finally:
            self._c.resume(*(tp for tp in others if tp in self._c.assignment()))
        for tp in [tp for tp in got if tp not in want]:    # assigned by this poll's rebalance:
            self._c.seek(tp, got.pop(tp)[0].offset)       # unread, for a getmany that asks
        return got

    async def getone(self, *partitions: TopicPartition) -> ConsumerRecord:
        """The next record (of partitions only, if given), waiting as long as it takes."""
        while True:
            got = await self.getmany(*partitions, timeout_ms=notify.SLICE_S * 1000, max_records=1)
            for tp, recs in got.items():
                r = recs[0]
                return ConsumerRecord(tp.topic, tp.partition, r.offset, r.timestamp,
                                      r.timestamp_type, r.key, r.value, r.headers)

    def __aiter__(self) -> "AsyncConsumer":
        return self

    async def __anext__(self) -> ConsumerRecord:
        """Records forever (until stop(), or a close() begun in another thread: StopAsyncIteration)."""
        if self._c.closing:
            raise StopAsyncIteration
        try:
            return await self.getone()
        except KStoreStateError:
            if self._c.closing:
                raise StopAsyncIteration from None
            raise

    # -- the rest of the surface: the Consumer's, awaitable where aiokafka's is --------------------
    async def commit(self, offsets: Optional[Mapping[TopicPartition, Any]] = None,
                     timeout_ms: Optional[float] = None) -> None:
        await self._retried(lambda ms: self._c.commit(offsets, timeout_ms=ms), timeout_ms)

    async def committed(self, tp: TopicPartition, timeout_ms: Optional[float] = None) -> Optional[int]:
        return await self._retried(lambda ms: self._c.committed(tp, timeout_ms=ms), timeout_ms)

    async def position(self, tp: TopicPartition, timeout_ms: Optional[float] = None) -> int:
        return await self._retried(lambda ms: self._c.position(tp, timeout_ms=ms), timeout_ms)

    async def _retried(self, call: Callable[[float], V], timeout_ms: Optional[float]) -> V:
        """call(0): one try of a Consumer method that retries a retriable error (an offline
        offsets dir or partition) until its timeout, tried again every RETRY_BACKOFF_S in the
        event loop, whose other tasks run meanwhile (the Consumer's own wait would block it),
        until timeout_ms (default_api_timeout_ms): then its ApiTimeoutError, for the whole wait."""
        ms = self._c.default_api_timeout_ms if timeout_ms is None else timeout_ms
        if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms >= 0:
            raise InvalidConfigError(f"timeout_ms must be a number >= 0, not {ms!r}")
        deadline = time.monotonic() + ms / 1000
        while True:
            try:
                return call(0)
            except ApiTimeoutError as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ApiTimeoutError(str(e).replace("Timeout of 0ms", f"Timeout of {ms}ms", 1)) from None
            await asyncio.sleep(min(RETRY_BACKOFF_S, left))

    def seek(self, tp: TopicPartition, offset: int | OffsetAndMetadata) -> None:
        self._c.seek(tp, offset)

    async def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._c.seek_to_beginning(*partitions)

    async def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._c.seek_to_end(*partitions)

    async def offsets_for_times(self, timestamps: Mapping[TopicPartition, int],
                                timeout_ms: Optional[float] = None
                                ) -> dict[TopicPartition, Optional[OffsetAndTimestamp]]:
        return await self._retried(lambda ms: self._c.offsets_for_times(timestamps, ms), timeout_ms)

    async def beginning_offsets(self, partitions: Iterable[TopicPartition],
                                timeout_ms: Optional[float] = None) -> dict[TopicPartition, int]:
        tps = list(partitions)
        return await self._retried(lambda ms: self._c.beginning_offsets(tps, ms), timeout_ms)

    async def end_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: Optional[float] = None) -> dict[TopicPartition, int]:
        tps = list(partitions)
        return await self._retried(lambda ms: self._c.end_offsets(tps, ms), timeout_ms)

    def subscribe(self, topics: Iterable[str] = (), pattern: Any = None, listener: Any = None) -> None:
        self._c.subscribe(topics, pattern=pattern, listener=listener)

    def unsubscribe(self) -> None:
        self._c.unsubscribe()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        self._c.assign(partitions)

    def assignment(self) -> set[TopicPartition]:
        return self._c.assignment()

    def subscription(self) -> Optional[set[str]]:
        return self._c.subscription()

    def pause(self, *partitions: TopicPartition) -> None:
        self._c.pause(*partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self._c.resume(*partitions)

    def paused(self) -> set[TopicPartition]:
        return self._c.paused()


def _tp(tp: Any) -> TopicPartition:
    return TopicPartition(*tp)