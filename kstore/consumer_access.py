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
the store, iteration's read-ahead) instead of closing under it. The guard itself is a
non-blocking try: it has no place in the lock hierarchy.
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional, TypeVar

from kstore.errors import ConcurrentModificationError, KStoreStateError

__all__ = ["CLOSED", "ThreadGuard", "guard_methods"]

#: Kafka's IllegalStateException message for any call to a closed consumer
CLOSED = "This consumer has already been closed."

F = TypeVar("F", bound=Callable[..., Any])


class ThreadGuard:
    """The owner thread of an object and how deep it is in its methods."""

    __slots__ = ("_try", "_owner", "_depth", "closer", "shut")

    def __init__(self) -> None:
        self._try = threading.Lock()          # only ever tried, never waited on
        self._owner: Optional[int] = None
        self._depth = 0
        self.closer: Optional[int] = None     # the thread whose close() began or runs: it passes
        self.shut = False                     # the close is done: every call is refused

    def acquire(self, closed: type[Exception] = KStoreStateError) -> bool:
        """Enter (True) or re-enter (False); closed: raised to a new entry once a close began."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return False
        if self.closer is not None:
            raise closed(CLOSED)
        if not self._try.acquire(blocking=False):
            raise ConcurrentModificationError(
                f"Consumer is not safe for multi-threaded access. currentThread(name: "
                f"{threading.current_thread().name}, id: {me}) otherThread(id: {self._owner})")
        self._owner, self._depth = me, 1
        return True

    def release(self) -> None:
        self._depth -= 1
        if self._depth == 0:
            self._owner = None
            self._try.release()


def _guarded(fn: F, lock: Callable[[Any], Any]) -> F:
    closed = StopIteration if fn.__name__ == "__next__" else KStoreStateError   # iteration ends

    @functools.wraps(fn)
    def call(self, *args, **kwargs):
        guard = self._guard
        if guard.closer == threading.get_ident():     # close()'s own calls (its listener's)
            with lock(self):
                if guard.shut:
                    raise closed(CLOSED)
                return fn(self, *args, **kwargs)
        first = guard.acquire(closed)
        try:
            with lock(self):     # a close() that began meanwhile ran first (or waits for it)
                if first and (guard.shut or guard.closer is not None):
                    raise closed(CLOSED)
                return fn(self, *args, **kwargs)
        finally:
            guard.release()
    return call  # type: ignore[return-value]


def guard_methods(cls: type, names: tuple[str, ...], lock: Callable[[Any], Any]) -> None:
    """Wrap cls's methods `names` so that each holds the instance's `_guard` (a ThreadGuard)
    and, inside it, lock(instance) (the lock its close() takes), and is refused once closed."""
    for name in names:
        setattr(cls, name, _guarded(getattr(cls, name), lock))
