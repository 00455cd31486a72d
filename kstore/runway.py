"""The runway of an active segment: the file space ahead of its data that appends land in.

The writer grows it in proportion to the segment's size (64 KiB doubling up to 4 MiB: small
partitions stay small). Under copies into the mapping it is written zeros (a store into an
unwritten extent costs ~10x more on ext4); ahead of a pwrite it is fallocated (ext4: ~10%
cheaper than growing the file), except on tmpfs, where fallocate zeroes pages the write then
fills, so the pwrite grows the file. A full disk fails here or in the pwrite, never as SIGBUS.

`alloc` is the end of the file space ready for data: only bytes below it are written through
the mapping, and nothing but data is ever written below it. Growth is a claim under `lock`:
whoever grows the runway (the writer here, or the pretoucher, kstore/pretouch.py) writes only
at and past `alloc` and publishes the new end when its write is done. `stop()` (roll, close,
truncation, unmapping) takes the same lock, so once it returns no growth runs or starts on the
descriptor: the segment may then truncate, remap or close it.
"""
from __future__ import annotations

import errno
import logging
import threading
from typing import Callable, Optional

from kstore._core import BatchBuilder, Mapping
from kstore.errors import KafkaStorageError
from kstore.fileio import FileOps

log = logging.getLogger("kstore.runway")

#: the largest step the runway grows by at once
PREALLOCATE_CHUNK = 4 << 20
#: the smallest step (a new segment's first growth)
MIN_STEP = 64 << 10


class Runway:
    """The zero-filled (or allocated) space ahead of an active segment's data (see module doc).

    Shared state: alloc, populated, mapping, stopped, guarded by lock (LogSegment._lock and
    Log._lock may be held when it is taken; it takes no kstore lock, only FileOps calls).
    The writer reads alloc and populated without the lock: they only grow while the runway
    lives (except in unwrite, the writer's own undo of a failed append, which may cut them
    back to the file's end), and only the writer (under Log._lock) stops it.
    """

    __slots__ = ("lock", "io", "fd", "mapping", "alloc", "populated", "stopped", "memory_fs",
                 "target", "queued", "path")

    def __init__(self, io: FileOps, fd: int, mapping: Mapping, alloc: int, path: str):
        self.lock = threading.Lock()
        self.io = io
        self.fd = fd
        self.mapping = mapping
        self.alloc = alloc          # file bytes ready for data (zero-filled or allocated)
        self.populated = 0          # bytes below which the mapping's pages are pre-faulted
        self.stopped = False
        self.memory_fs: Optional[bool] = None   # tmpfs/ramfs (asked when needed)
        self.target = 0             # the pretoucher grows alloc up to here (kstore/pretouch.py)
        self.queued = False         # waiting in the pretoucher's queue
        self.path = path

    def set_mapping(self, mapping: Mapping) -> None:
        """The segment mapped a larger window (segment.bytes grew)."""
        with self.lock:
            self.mapping = mapping

    def grow(self, size: int, n: int, pwrite: bool) -> None:
        """Make room for an append of n bytes at size (the writer, when size + n > alloc)."""
        need = size + n
        with self.lock:
            if need <= self.alloc:          # the pretoucher got there first
                return
            length = self.mapping.length
            step = min(PREALLOCATE_CHUNK, max(MIN_STEP, self.alloc))
            new_alloc = min(length, max(need, self.alloc + step))
            if pwrite:
                if self.memory_fs is None:
                    self.memory_fs = self.io.memory_backed(self.fd)
                if self.memory_fs:
                    new_alloc = need        # tmpfs: the pwrite grows the file (one pass)
                else:
                    self.io.allocate(self.fd, self.alloc, new_alloc - self.alloc)
            else:
                self.io.zero_fill(self.fd, self.alloc, new_alloc - self.alloc)
            self.alloc = new_alloc

    def fill(self, chunk: int) -> bool:
        """The pretoucher's step (kstore/pretouch.py): zero-fill up to chunk bytes at alloc,
        towards target, and pre-fault the mapping's pages there; publish the new alloc.
        Returns whether more is wanted. Never writes below alloc (data may be there) nor
        after stop(); an OSError (a full disk) propagates with alloc unchanged."""
        with self.lock:
            if self.stopped:
                return False
            start = self.alloc
            limit = min(self.target, self.mapping.length)
            end = min(limit, start + chunk)
            if end <= start:
                return False
            self.io.zero_fill(self.fd, start, end - start)
            self.alloc = end
            if self.io.populate(self.mapping, start, end):
                self.populated = end
            return end < limit

    def write_large(self, builder: BatchBuilder, pos: int, n: int,
                    ensure: Callable[[int, bool], None]) -> None:
        """A large append's bytes at pos (the writer, under Log._lock): copied into the
        mapping where the pretoucher pre-faulted the pages (no fault, no syscall), else
        pwritten from the builder's buffer, the runway grown first (ensure) if short."""
        end = pos + n
        if end > self.populated:
            if end > self.alloc:
                ensure(n, True)
            self.io.pwrite(self.fd, memoryview(builder), pos)
        elif self.io.intercept_map_writes:
            self.io.map_write(self.mapping, pos, builder.getvalue())
        else:
            builder.copy_to(self.mapping, pos)

    def unwrite(self, pos: int, n: int, error: BaseException) -> None:
        """Undo a failed append of n bytes at pos (the writer, under Log._lock; the size was
        not published): the bytes the file holds there are zeroed again, so neither a reopen's
        recovery nor another process's reader finds the batch, and alloc is cut back to the
        file's end where the failed pwrite was to grow the file (tmpfs), so no later copy lands
        past it (SIGBUS). An OSError is raised again as KafkaStorageError naming the file (the
        caller re-raises anything else). A failure of the undo itself is logged."""
        try:
            with self.lock:
                have = self.io.size(self.fd)
                self.alloc = min(self.alloc, max(have, pos))
                self.populated = min(self.populated, self.alloc)
                if have > pos:
                    self.io.zero_fill(self.fd, pos, min(n, have - pos))
        except OSError as e:
            log.error("could not zero the failed append at %d in %s: %s", pos, self.path, e)
        if isinstance(error, OSError) and not isinstance(error, KafkaStorageError):
            raise KafkaStorageError(error.errno or errno.EIO,
                                    f"{error.strerror or error} writing {n} bytes at {pos} "
                                    f"of {self.path} (nothing of the append was kept)") from error

    def stop(self) -> None:
        """No growth runs or starts after this returns (the segment is about to truncate,
        remap or close the descriptor)."""
        with self.lock:
            self.stopped = True
