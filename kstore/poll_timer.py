"""A group member's poll timer: Kafka's max.poll.interval.ms (KIP-62), checked off the
application's thread as Kafka's heartbeat thread checks `pollTimeoutExpired`.

The consumer stores the time of each poll (one attribute store: nothing else on the poll path).
The timer's thread sleeps (a bounded Event wait, no polling) until that time plus the interval,
reads the time again, and sleeps on if a poll came since; else it takes the consumer's lock
(so never inside a poll, commit or close), checks once more and calls its `evict`. It holds
the consumer only through weak references, so a consumer dropped without close() is freed and its
timer ends; `cancel()`/`stop()` end it at once.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any, Callable

__all__ = ["PollTimer", "POLL_TIMEOUT_EXPIRED"]

#: Kafka's warning (AbstractCoordinator's heartbeat thread), with kstore's option names.
POLL_TIMEOUT_EXPIRED = (
    "consumer poll timeout has expired. This means the time between subsequent calls to poll() "
    "was longer than the configured max_poll_interval_ms (%d), which typically implies that the "
    "poll loop is spending too much time processing messages. You can address this either by "
    "increasing max_poll_interval_ms or by reducing the maximum size of batches returned in poll() "
    "with max_poll_records.")

#: The longest stop() waits for the thread (an eviction in progress waits for group.lock,
#: bounded by the member's lock timeout).
STOP_JOIN_S = 5.0
#: How often a timer waiting for the consumer's lock looks whether it was stopped meanwhile.
LOCK_SLICE_S = 0.05


class PollTimer:
    """One thread per group member. `owner.last_poll_time` is the monotonic time of its last
    poll; `evict()` runs under `lock` once interval seconds passed since it; the thread ends.

    Lock: none of its own (an Event); it takes `lock` (Consumer._lock) only to evict."""

    def __init__(self, interval: float, lock: Any, owner: Any,
                 evict: Callable[[], None], name: str) -> None:
        self._stop = threading.Event()
        refs = (weakref.ref(owner), weakref.WeakMethod(evict))
        # a consumer dropped without close(): its timer ends at once, not at its next check
        self._finalizer = weakref.finalize(owner, self._stop.set)
        self._thread = threading.Thread(target=_run, args=(interval, lock, refs, self._stop),
                                        name=name, daemon=True)
        self._thread.start()

    def cancel(self) -> None:
        """Tell the thread to end: at once, or (waiting for `lock`) as soon as it has it."""
        self._finalizer.detach()
        self._stop.set()

    def stop(self) -> None:
        """cancel() and wait for the thread (up to STOP_JOIN_S); not while holding `lock`."""
        self.cancel()
        if self._thread is not threading.current_thread():
            self._thread.join(STOP_JOIN_S)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


def _left(interval: float, ref: "weakref.ref") -> float:
    """Seconds until the poll interval passes (-1.0 if the owner is gone: evict() is None)."""
    owner = ref()
    return -1.0 if owner is None else owner.last_poll_time + interval - time.monotonic()


def _run(interval: float, lock: Any, refs: tuple, stop: threading.Event) -> None:
    wait = interval
    while not stop.wait(wait):
        wait = _left(interval, refs[0])
        if wait > 0:
            continue
        while not lock.acquire(timeout=LOCK_SLICE_S):
            if stop.is_set():           # stop() from a thread holding the lock (a close inside
                return                  # a listener's callback): do not keep it waiting
        try:
            if stop.is_set():
                return
            wait = _left(interval, refs[0])
            if wait > 0:
                continue
            evict = refs[1]()
            if evict is not None:
                evict()
            return
        finally:
            lock.release()
