"""Moves of a log's start offset and where a moved start is saved (LocalLog's mixin; Kafka's
UnifiedLog.deleteRecords, and its log-start checkpoint): DeleteRecords raises the start, a
truncation below it lowers it, and either is saved so a crash reopens at it, never below a
DeleteRecords that returned nor above what the log holds. A standalone log saves it in its
directory (start_file.py), a managed one through log_start_listener (its LogManager's
log-start-offset-checkpoint, which reads checkpoint_start).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, ContextManager, Iterator, Optional

from kstore.errors import OffsetOutOfRangeError
from kstore.fileio import FileOps
from kstore.start_file import save_log_start
from kstore.storage_errors import storage_op


class LogStart:
    """LocalLog's start moves (a mixin: the attributes and methods it uses are LocalLog's)."""

    dir: str
    _io: FileOps
    _managed: bool
    _lock: threading.RLock
    _flush_lock: threading.Lock
    _leo: int
    _log_start_offset: int
    _failed: Optional[str]
    #: a LogManager's log-start checkpoint of this log's dir, run after the start moved
    log_start_listener: Optional[Callable[[], None]] = None
    _check_writable: Callable[[], None]
    _delete_segments: Callable[..., int]
    _take_deferred: Callable[[], list]
    _after_write: Callable[[list], None]
    _ring: Callable[[], None]

    def __init__(self) -> None:
        self._start_floors: list[int] = []   # targets of the truncations under way (_lowering)

    @storage_op
    def delete_records(self, offset: int) -> int:
        """Advance log_start_offset to offset (Kafka's DeleteRecords), deleting the segments
        wholly below it, and save it (_start_moved). Returns the new log start offset."""
        if offset < 0:        # Kafka's ReplicaManager: "The offset -3 for partition ... is not valid"
            raise OffsetOutOfRangeError(f"The offset {offset} for {self.dir} is not valid (an offset >= 0)")
        with self._start_guard():
            with self._lock:
                self._check_writable()
                if offset > self._leo:
                    raise OffsetOutOfRangeError(f"cannot delete records up to {offset}: beyond "
                                                f"the high watermark {self._leo} of {self.dir}")
                moved = offset > self._log_start_offset
                self._log_start_offset = max(offset, self._log_start_offset)
                try:
                    self._delete_segments(lambda seg, nxt: nxt is not None and nxt <= self._log_start_offset,
                                          "log start offset breach")
                finally:
                    deferred = self._take_deferred()
                start = self._log_start_offset
                self._ring()
            if moved and not self._managed:
                self._start_moved()
        self._after_write(deferred)
        if moved and self._managed:     # once the retired segments are gone for good
            self._start_moved()
        return start

    def _start_guard(self) -> ContextManager:
        """Standalone: _flush_lock, so close() never comes between a start's move and save."""
        return self._flush_lock if not self._managed else contextlib.nullcontext()

    def _start_moved(self, start: Optional[int] = None) -> None:
        """Save a moved start (default: the log's): standalone, in its directory; managed, the
        dir's checkpoint (which takes checkpoint_start)."""
        if not self._managed:
            save_log_start(self._io, self.dir, self._log_start_offset if start is None else start)
        elif (listener := self.log_start_listener) is not None:
            listener()

    @contextlib.contextmanager
    def _lowering(self, target: int) -> Iterator[None]:
        """Around a truncation to target: until it ends no checkpoint saves a start above
        target (checkpoint_start), and a start it lowers is saved before its cut, so a crash
        never finds a saved start above the log end, whatever another thread appended after
        the cut (a lower one only shows, after a crash inside the call, records the cut was
        removing). Raising a start is saved after the cut (the loader clamps up to it)."""
        with self._lock:
            self._check_writable()
            self._start_floors.append(target)
            lowers = target < self._log_start_offset
        try:
            if lowers:
                self._start_moved(target)
            yield
        finally:
            with self._lock:
                self._start_floors.remove(target)

    @property
    def checkpoint_start(self) -> int:
        """The start a checkpoint may save now: the log start, lower while a truncation to
        below it is under way (_lowering). Lock-free: the floors are read first, so a start
        read after a floor's removal is the cut's."""
        floors = tuple(self._start_floors)
        start = self._log_start_offset
        return min(start, *floors) if floors else start
