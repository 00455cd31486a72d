"""A scheduler task's wait for flocks another process holds: short, and ended by close(); also
the bound of a group rebalance's GroupMetadata record (group_membership: under group.lock).

A background task of a LogManager (Kafka's scheduler threads: topic deletion's retry, offsets
expiry) never holds its thread for a lock timeout behind another process's commit: it waits
TASK_LOCK_WAIT_S in all, then puts what it could not do off to its next run (PutOff), as
Kafka's background work retries on its next beat instead of blocking; its owner's close()
ends the wait at once.
"""
from __future__ import annotations

import threading
import time as _time
from typing import Callable, Optional

from kstore.errors import KStoreError

__all__ = ["TASK_LOCK_WAIT_S", "PutOff", "task_pause", "held_too_long"]

#: how long, in all, a task's attempt waits for offsets flocks (another process's commit holds
#: one for milliseconds) before putting its work off to its next run
TASK_LOCK_WAIT_S = 1.0
CLOSING = "the LogManager is closing"


class PutOff(KStoreError):
    """A task's attempt stopped waiting for a flock (its wait's end, or its owner's close())."""


def held_too_long(wait_s: float) -> str:
    """The put-off reason when the wait ran out."""
    return f"offsets flocks held by others for {wait_s:g} s"


def task_pause(closing: Optional[threading.Event], wait_s: float) -> Callable[[float], None]:
    """The pauses of one attempt between tries of a flock (a `sleep` for OffsetsTopic.locked):
    slept on closing (if any); PutOff once wait_s have passed since this call, or once closing
    is set."""
    deadline = _time.monotonic() + wait_s

    def pause(seconds: float) -> None:
        left = deadline - _time.monotonic()
        if left <= 0:
            raise PutOff(held_too_long(wait_s))
        if closing is None:
            _time.sleep(min(seconds, left))
        elif closing.wait(min(seconds, left)):
            raise PutOff(CLOSING)
    return pause
