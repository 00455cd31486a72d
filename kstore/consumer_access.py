"""One thread at a time inside a Consumer (KafkaConsumer's acquire/release): a call from a second
thread while another thread is inside raises ConcurrentModificationError at once, instead of
racing it (a seek lost under a poll's position update, a record returned twice by two iterating
threads). The same thread may re-enter (a rebalance listener called in poll may commit or seek);
calls from different threads one after another are fine. close() may come from any thread: the
thread running it (under the consumer's lock, which a poll holds while it runs) passes, so a
rebalance listener's commit in that close works while another thread sits in a poll; any other
thread's call from the moment close() began is refused (KStoreStateError; iteration ends), as
Kafka's close holds the consumer: a seek racing close's commit rewound the group. Once closed,
every call raises KStoreStateError with Kafka's message (CLOSED). A call runs under the
consumer's lock, so a close() from another thread waits for a call already inside (a read of
the store, iteration's read-ahead) instead of closing under it. The guard has no lock of its
own: a call tries Consumer._lock; held by another user call, ConcurrentModificationError; held
by the poll timer's eviction or a close(), it waits (locks.py). A close() called inside a call
on the same thread (a signal handler's) cannot wait for it: it runs as that call ends (later).
"""
from __future__ import annotations

import functools
import threading
from threading import get_ident
from typing import Any, Callable, Optional, TypeVar

from kstore.errors import ConcurrentModificationError, KStoreStateError

__all__ = ["CLOSED", "ThreadGuard", "guard_methods"]

#: Kafka's IllegalStateException message for any call to a closed consumer
CLOSED = "This consumer has already been closed."

F = TypeVar("F", bound=Callable[..., Any])


class ThreadGuard:
    """Who is inside a Consumer: the user thread whose call holds its lock (owner), the thread
    whose close() began (closer), whether the close is done (shut). No lock of its own."""

    __slots__ = ("owner", "closer", "shut", "later")

    def __init__(self) -> None:
        self.owner: Optional[int] = None      # the thread whose outermost call holds the lock
        self.closer: Optional[int] = None     # the thread whose close() began or runs: it passes
        self.shut = False                     # the close is done: every call is refused
        self.later: Optional[Callable[[], None]] = None   # a close() called inside the owner's
        #                                       call (a signal handler's): run as that call ends

    def run_later(self) -> None:
        """The outermost call ended: run the close() deferred inside it, if any."""
        later, self.later = self.later, None
        if later is not None:
            later()


def _wait_for(lock: Any, guard: ThreadGuard, me: int) -> None:
    """The consumer's lock is held: by another user thread's call (Kafka's acquire():
    ConcurrentModificationError), else by the poll timer's eviction or a close(): wait for it,
    as the owner already (a third thread's call meanwhile is refused, as Kafka's)."""
    if guard.owner is not None:
        raise ConcurrentModificationError(
            f"Consumer is not safe for multi-threaded access. currentThread(name: "
            f"{threading.current_thread().name}, id: {me}) otherThread(id: {guard.owner})")
    guard.owner = me
    try:
        lock.acquire()
    except BaseException:
        guard.owner = None
        raise


def _guarded(fn: F) -> F:
    """fn under the consumer's _lock, entered as Kafka's acquire(). The common case costs one
    non-blocking try of the RLock (iteration calls it per record)."""
    closed = StopIteration if fn.__name__ == "__next__" else KStoreStateError   # iteration ends

    def inside(self, guard: ThreadGuard, me: int, args: tuple, kwargs: dict) -> Any:
        """A call while this thread is already inside (a rebalance listener's, in poll) or once
        a close() began: the closing thread's own calls (its listener's) pass, others' are refused."""
        if guard.owner != me and guard.closer != me:
            raise closed(CLOSED)
        with self._lock:
            if guard.shut:
                raise closed(CLOSED)
            return fn(self, *args, **kwargs)

    def call(self, *args, **kwargs):
        guard = self._guard
        me = get_ident()
        if guard.owner == me or guard.closer is not None:
            return inside(self, guard, me, args, kwargs)
        lock = self._lock
        if not lock.acquire(False):
            _wait_for(lock, guard, me)
        try:
            if guard.shut or guard.closer is not None:     # a close() began meanwhile
                raise closed(CLOSED)
            guard.owner = me
            return fn(self, *args, **kwargs)
        finally:
            guard.owner = None
            lock.release()
            if guard.later is not None:
                guard.run_later()

    def call0(self):                  # the same for a method of no arguments (__next__): no packing
        guard = self._guard
        me = get_ident()
        if guard.owner == me or guard.closer is not None:
            return inside(self, guard, me, (), {})
        lock = self._lock
        if not lock.acquire(False):
            _wait_for(lock, guard, me)
        try:
            if guard.shut or guard.closer is not None:
                raise closed(CLOSED)
            guard.owner = me
            return fn(self)
        finally:
            guard.owner = None
            lock.release()
            if guard.later is not None:
                guard.run_later()

    code = fn.__code__
    plain = code.co_argcount == 1 and not code.co_kwonlyargcount and not code.co_flags & 0x0C
    return functools.update_wrapper(call0 if plain else call, fn)  # type: ignore[return-value]


def guard_methods(cls: type, names: tuple[str, ...]) -> None:
    """Wrap cls's methods `names` so that each runs under the instance's `_lock` (the lock its
    close() and poll timer take), tracked by its `_guard` (a ThreadGuard), refused once closed."""
    for name in names:
        setattr(cls, name, _guarded(getattr(cls, name)))
