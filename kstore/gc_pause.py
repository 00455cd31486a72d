"""The cyclic garbage collector paused while a log dir loads (LogDirLoader.load).

A start-up builds ~100 long-lived objects per partition (segments, their views, indexes,
locks, the Log and its parts), none of them garbage. With the collector on, every 700
allocations start a young-generation pass, every tenth of those a middle one, and the growing
old generation is traversed whole when it has grown by a quarter: measured on the unclean
start-up of 1,000 partitions x 10 segments, 67-99 ms of a 600 ms open (about 60-100 passes),
more in a process that already holds many objects (the pass over the old generation is over
all of them). Paused, the objects are traversed once, by the first young pass after the load.

Reference counting still frees everything that is not in a cycle; only cycle collection waits,
for the length of the load. The pause is process-wide (the collector is), so it is counted:
several loads at once (a manager's log dirs load in parallel, or two managers in two threads)
share one pause, which ends with the last of them. The collector is re-enabled only if it was
enabled when the first of them began (a caller that had disabled it finds it disabled after)
and is still disabled.

A child forked during a load is not loading: it starts with no pause under way and the collector
as it was before the pause (`_after_fork_in_child`).

Lock: `_lock` is a leaf (locks.py), held only around the count and the gc switch.
"""
from __future__ import annotations

import contextlib
import gc
import os
import threading
from typing import Iterator

_lock = threading.Lock()
_depth = 0                 # loads under way
_restore = False           # whether the last one to finish re-enables the collector


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause cyclic garbage collection for the block (nested and concurrent uses share it)."""
    global _depth, _restore
    with _lock:
        if _depth == 0:
            _restore = gc.isenabled()
            if _restore:
                gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restore and not gc.isenabled():
                gc.enable()
            if _depth == 0:
                _restore = False


def paused() -> bool:
    """Whether a pause is under way (for tests)."""
    with _lock:
        return _depth > 0


def _after_fork_in_child() -> None:
    """A forked child inherits the pause but none of the loads: end it (a fresh lock too, in
    case the fork caught another thread holding it)."""
    global _lock, _depth, _restore
    _lock = threading.Lock()
    if _depth and _restore and not gc.isenabled():
        gc.enable()
    _depth = 0
    _restore = False


os.register_at_fork(after_in_child=_after_fork_in_child)
