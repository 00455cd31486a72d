"""The pretoucher: one background thread per process that grows active segments' runways
ahead of their writers (Chronicle Queue's pretoucher), so a large append's copy lands in file
pages that already exist and are mapped writable, instead of allocating them on the append's
path (35-60 µs of a ~127 KB batch's append on ext4 and tmpfs, measured).

Opt-in (`enable()`, or KSTORE_PRETOUCH=1 in the environment): it moves that cost to another
core, it does not remove it (the zero-fill and the pre-faulting cost as much CPU as the
write-path allocation they replace, more on tmpfs), and it keeps up to `ahead` bytes of zeroed
page cache per active segment that takes appends.

Only appends of segment.PWRITE_MIN_BYTES (16 KiB) or more ask for it: the producer-batched
case it is for. Small appends keep the runway the writer grows itself (zero-filled, in
proportion to the segment's size), so a process with many small partitions holds no more
zeroed page cache than without it; a partition taking large batches holds at most `ahead`
plus one step.

How: after a large append, a segment whose runway (runway.py) reaches less than half the window
ahead of its end submits it here with a new target (end + window, the window 32 appends of that
size within [2 CHUNK, ahead]). The thread grows the runway CHUNK bytes at a time under the
runway's lock: zero-fill at `alloc` (FileOps.zero_fill), pre-fault those pages writable
(FileOps.populate, MADV_POPULATE_WRITE), publish `alloc` and `populated`. The writer copies an
append that ends below `populated` into the mapping; anything else takes the usual path, growing
the runway itself under the same lock when the pretoucher is behind. Roll, close, truncation and
deletion stop the runway under its lock first, so the thread never writes to a descriptor that
was closed or a file that was trimmed, and never below `alloc`, where data may be.

A FileOps that is not thread-safe (`thread_safe = False`: the crash harness's) is served in
the caller's thread instead, synchronously, so crash tests see the same writes in order.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
from typing import Optional

from kstore.runway import Runway

log = logging.getLogger("kstore.pretouch")

#: the runway is grown this many bytes at a time (the lock is released between steps, so a
#: writer that needs it waits for at most one step)
CHUNK = 1 << 20
#: the default largest window kept ready ahead of a segment's end
DEFAULT_AHEAD = 8 << 20


class Pretoucher:
    """The background thread and its queue of runways to grow (see the module doc).

    Shared state: the queue and each runway's queued/target, under _cv (a leaf but for the
    runway locks the thread takes without holding it)."""

    def __init__(self, ahead: int = DEFAULT_AHEAD):
        if ahead < 2 * CHUNK:
            raise ValueError(f"pretouch window of {ahead} bytes is under two steps ({2 * CHUNK})")
        self.ahead = ahead
        self._cv = threading.Condition(threading.Lock())
        self._queue: collections.deque[Runway] = collections.deque()
        self._stopping = False
        self._thread: Optional[threading.Thread] = None
        #: bytes zero-filled and pre-faulted by this pretoucher (tests, benchmarks)
        self.filled = 0

    def submit(self, rw: Runway, end: int, n: int) -> None:
        """The writer's call (Log._lock held) after an append of n bytes ending at end."""
        window = min(self.ahead, max(2 * CHUNK, 32 * n))
        if rw.alloc - end >= window // 2 or rw.stopped:
            return
        if not getattr(rw.io, "thread_safe", True):
            rw.target = end + window
            self._serve(rw)              # the crash harness: in the caller's thread, in order
            return
        with self._cv:
            if end + window > rw.target:
                rw.target = end + window
            if rw.queued or self._stopping:
                return
            rw.queued = True
            self._queue.append(rw)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kstore-pretouch",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()

    def _serve(self, rw: Runway) -> None:
        """Grow one runway to its target, a step at a time."""
        try:
            while True:
                before = rw.alloc
                more = rw.fill(CHUNK)
                self.filled += rw.alloc - before
                if not more:
                    return
        except OSError as e:
            # a full disk, an I/O error: the writer's own growth will meet it and fail the
            # append cleanly (KafkaStorageError); nothing was published here
            log.debug("pretouching %s stopped: %s", rw.path, e)

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._stopping:
                    self._cv.wait()
                if self._stopping:
                    return
                rw = self._queue.popleft()
            self._serve(rw)
            with self._cv:
                rw.queued = False

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread (bounded wait); queued runways are dropped."""
        with self._cv:
            self._stopping = True
            for rw in self._queue:
                rw.queued = False
            self._queue.clear()
            t = self._thread
            self._cv.notify_all()
        if t is not None:
            t.join(timeout)

    def _after_fork(self) -> None:
        """In a forked child: no thread, a fresh lock, an empty queue (its runways may ask
        again)."""
        for rw in self._queue:
            rw.queued = False
        self._cv = threading.Condition(threading.Lock())
        self._queue = collections.deque()
        self._thread = None


#: the process's pretoucher, None when pretouching is off (read by LogSegment.append)
ACTIVE: Optional[Pretoucher] = None


def enable(ahead: int = DEFAULT_AHEAD) -> Pretoucher:
    """Turn pretouching on for this process (segments made active from now on and the ones
    already active, from their next append); returns the pretoucher."""
    global ACTIVE
    old = ACTIVE
    if old is not None and old.ahead == ahead:
        return old
    ACTIVE = Pretoucher(ahead)
    if old is not None:
        old.stop()
    return ACTIVE


def disable(timeout: float = 10.0) -> None:
    """Turn pretouching off and stop the thread (runways already grown stay)."""
    global ACTIVE
    old, ACTIVE = ACTIVE, None
    if old is not None:
        old.stop(timeout)


def _reset_in_child() -> None:
    if ACTIVE is not None:
        ACTIVE._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_in_child)
if os.environ.get("KSTORE_PRETOUCH", "") not in ("", "0"):
    enable()
