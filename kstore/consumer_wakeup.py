"""What another thread may do to a Consumer's blocking calls (KafkaConsumer.wakeup and its
close): `wakeup()` makes the poll blocked now, or the next poll/commit/committed, raise
WakeupError once; `close()` ends a poll's wait at once (the poll returns what it has: nothing).
A group join waiting for another process's group.lock is ended the same way (check_wait), and
a commit waiting for an offsets flock too (pause: a close() from another thread, or one called
while this thread waits, ends a poll's auto-commit or rebalance commit there, nothing written),
but for a rebalance listener's commit, which waits on. Once a close() has begun, every commit
wait (the close's own, its listener's, a running listener's) ends at close's deadline
(close(timeout): CloseTimeoutError).

Both ring a private Bell that every poll sleeps on beside its logs' words, so the sleeper wakes
at once (one futex_waitv; GIL released), never after its timeout. The request itself is a flag:
two wakeups before one raise are one WakeupError, as Kafka's AtomicBoolean. No lock: the flag
is one attribute and the Bell's bump is atomic.
"""
from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Optional

from kstore import _notify
from kstore.consumer_access import CLOSED
from kstore.errors import KStoreStateError, WakeupError
from kstore.offsets_topic import CoordinatorLockTimeout

if TYPE_CHECKING:
    from kstore.consumer_access import ThreadGuard

__all__ = ["CloseTimeoutError", "Wakeup", "DEFAULT_CLOSE_TIMEOUT_S"]

#: close()'s bound when none is given (Kafka's DEFAULT_CLOSE_TIMEOUT_MS, 30 s)
DEFAULT_CLOSE_TIMEOUT_S = 30.0


class CloseTimeoutError(CoordinatorLockTimeout):
    """A commit inside close() (its own, its listener's) still waited for a __consumer_offsets
    lock when close(timeout) ran out: nothing written (Kafka's commitSync TimeoutException)."""


class Wakeup:
    """One consumer's wakeup and close requests, and the bell its waits include."""

    __slots__ = ("bell", "requested", "closing", "claimed", "deadline", "timeout", "listening")

    def __init__(self) -> None:
        self.bell = _notify.Bell.private()
        self.requested = False          # a wakeup() not raised yet
        self.closing: Optional[int] = None   # the thread whose close() has begun
        self.claimed = False            # a thread runs the close (under the consumer's lock)
        self.deadline = float("inf")    # close(timeout)'s end (monotonic), once close() began
        self.timeout = DEFAULT_CLOSE_TIMEOUT_S
        self.listening = 0              # rebalance listener calls under way in a poll

    def wake(self) -> None:
        """wakeup(): any thread; the consumer's next blocking call (or the one now) raises."""
        self.requested = True
        self.bell.nudge()

    def close(self, guard: "ThreadGuard", timeout: float) -> None:
        """close() has begun: a poll's wait ends now (its thread need not be this one), other
        threads' new calls are refused (guard), commit waits end timeout seconds from now. A
        later close() keeps the first one's thread and deadline; the one that runs the close
        claims it (claim)."""
        if self.closing is None:
            self.timeout, self.deadline = timeout, time.monotonic() + timeout
            self.closing = guard.closer = threading.get_ident()
        self.bell.nudge()

    def left(self) -> float:
        """Seconds until close(timeout)'s deadline (0 once passed; inf before a close)."""
        return max(0.0, self.deadline - time.monotonic())

    def claim(self, guard: "ThreadGuard") -> None:
        """The calling thread runs the close (under the consumer's lock): its listener's calls
        (commit, committed) are the close's own, whichever thread called close() first, and
        pass the guard while another thread's poll waits for the lock."""
        self.closing = guard.closer = threading.get_ident()
        self.claimed = True

    def closed_elsewhere(self) -> bool:
        """Another thread's close() has begun (it waits for the consumer's lock)."""
        return self.closing not in (None, threading.get_ident())

    def check(self) -> None:
        """Raise WakeupError if a wakeup is pending (and clear it: it is raised once); never
        once close() has begun (Kafka's close disables wakeups: a listener's commit in it)."""
        if self.requested and self.closing is None:
            self.requested = False
            raise WakeupError("the consumer was woken up (Consumer.wakeup)")

    def check_wait(self) -> None:
        """A group join's or rebalance's wait for group.lock: WakeupError on a wakeup, and
        KStoreStateError once close() has begun (the poll then returns {}, as from its idle wait)."""
        if self.closing is not None:
            raise KStoreStateError(CLOSED)
        self.check()

    def pause(self, seconds: float) -> None:
        """A commit's pause between attempts at the offsets flock (no notification to sleep
        on): sleep on the bell up to seconds, so a wakeup() ends it at once (WakeupError), and
        so does a close() not yet running (KStoreStateError: it waits for this call, then
        commits itself); the close's own commits and any listener's wait on, up to close's
        deadline (CloseTimeoutError)."""
        armed = self.bell.arm()
        self.check_pause()
        self.bell.sleep(armed, min(seconds, self.left()))
        self.check_pause()

    def check_pause(self) -> None:
        """pause's check: once a close() has begun, KStoreStateError for a commit of the poll
        itself while no thread runs the close yet, CloseTimeoutError past its deadline; else
        check() (the wakeup)."""
        if self.closing is not None:
            if not self.claimed and not self.listening:
                raise KStoreStateError(CLOSED)
            if time.monotonic() >= self.deadline:
                raise CloseTimeoutError(f"close(timeout={self.timeout:g}) ran out while waiting "
                                        "for a __consumer_offsets writer's lock")
        self.check()

    def interrupted(self) -> bool:
        """A wait's check: a wakeup or a close arrived."""
        return self.requested or self.closing is not None
