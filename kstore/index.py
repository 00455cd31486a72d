"""Sparse offset and time indexes: what both share (Kafka's AbstractIndex; the two kinds are
OffsetIndex in offset_index.py and TimeIndex in time_index.py).

An index is a file of fixed-size big-endian entries, memory-mapped and exposed as a numpy
structured array. A new index file is preallocated to ``segment.index.bytes`` rounded down to
the entry size; it is trimmed to the used entries when its segment rolls or closes and resized
back to the maximum when the segment becomes active again. The floor searches run in the
compiled core without the GIL held for long.

    .index      relative offset i32 | position i32            (8 bytes)
    .timeindex  timestamp i64       | relative offset i32     (12 bytes)

Views returned by ``entries_array`` stay valid after a resize or close (the old mapping lives
until the view is released) but no longer track later appends.
"""
from __future__ import annotations

import errno
import os
import threading
from typing import Optional

import numpy as np

from kstore import _core
from kstore._core import IndexCopy, extend_index_copy
from kstore.errors import CorruptRecordError, KafkaStorageError, KStoreStateError
from kstore.fileio import FileOps, get_file_ops

OFFSET_DTYPE = _core.OFFSET_DTYPE
TIME_DTYPE = _core.TIME_DTYPE
INT32_MAX = (1 << 31) - 1
ALLOCATION_STEP = 64 << 10
PAGE = 4096


def _nonzero(b: bytes) -> bool:
    """b holds a byte other than zero (counted in C, not by iterating ints)."""
    return b.count(0) != len(b)


class CorruptIndexError(CorruptRecordError):
    """An index failed its sanity check."""


class AbstractIndex:
    """The mmap life cycle shared by both index kinds: preallocate, resize, trim, close."""

    ENTRY_SIZE = 0
    DTYPE: np.dtype

    def __init__(self, path: str, base_offset: int, max_index_size: int = -1,
                 writable: bool = True, io: Optional[FileOps] = None, load: bool = True):
        self.path = path
        self.base_offset = base_offset
        self._io = io or get_file_ops()
        self._writable = writable
        self._lock = threading.RLock()
        self._max_index_size = max_index_size
        self.state = _core.IndexState()     # mapping + entries, shared with the read fast path
        self._map: Optional[_core.Mapping] = None
        self._length = 0
        self._allocated = 0
        self._pending_length: Optional[int] = None
        self._resized_unsynced = False      # a length change no fsync has made durable yet
        self.load_problem: Optional[str] = None   # why the file's length cannot be trusted
        if not load:
            # the owner fills the entries itself (a read-only view of a file another process
            # may shrink must not be mapped)
            self._entries = 0
            return
        if self._io.exists(path):
            fd = self._io.open(path, os.O_RDWR if writable else os.O_RDONLY)
            try:
                length = self._io.size(fd)
                self.load_problem = self._length_problem(length)
                if self.load_problem is not None:
                    # neither mapped nor reserved: a damaged or hostile length (a sparse GiB) is
                    # rebuilt from the .log on first use (Kafka's sanity check), never trusted
                    self._entries = 0
                    self._length = length       # so that a resize or trim still cuts it
                    return
                # Kafka: entries = length / entry size (an untrimmed zero tail counts, and fails
                # the entries check). Nothing is reserved or grown here: blocks are reserved
                # just ahead of the first store (_ensure_allocated), and only an active
                # segment's index grows back to the maximum (resize_lazily), so an index read
                # past (an empty segment left by compaction) stays as it is on disk.
                self._entries = length // self.ENTRY_SIZE
                self._allocated = 0
                self._remap(fd, length)
            finally:
                self._io.close(fd)
        else:
            if not writable:
                self._entries = 0
                return
            fd = self._io.open(path, os.O_RDWR | os.O_CREAT)
            try:
                length = self._round(max_index_size)
                self._io.truncate(fd, length)
                self._entries = 0
                self._remap(fd, length)
            finally:
                self._io.close(fd)

    @property
    def _map(self) -> Optional[_core.Mapping]:
        return self.state.map

    @_map.setter
    def _map(self, m: Optional[_core.Mapping]) -> None:
        self.state.map = m

    @property
    def _entries(self) -> int:
        return self.state.entries

    @_entries.setter
    def _entries(self, n: int) -> None:
        self.state.entries = n

    # -- sizes -----------------------------------------------------------------------------
    def _round(self, n: int) -> int:
        return max(0, n) // self.ENTRY_SIZE * self.ENTRY_SIZE

    def _length_problem(self, length: int) -> Optional[str]:
        """Why an existing file's length is corrupt (Kafka's sanityCheck: not a multiple of the
        entry size; and longer than segment.index.bytes rounded, which kstore never writes)."""
        if length % self.ENTRY_SIZE:
            return f"length {length} is not a multiple of {self.ENTRY_SIZE}"
        if self._max_index_size > 0 and length > self._round(self._max_index_size):
            return (f"length {length} is above segment.index.bytes "
                    f"({self._round(self._max_index_size)})")
        return None

    def _remap(self, fd: int, length: int) -> None:
        old = self._map
        self._length = length
        self._map = self._io.map(fd, length, self._writable) if length > 0 else None
        if old is not None:
            old.close()

    def _mapping(self) -> _core.Mapping:
        """The mapping of an index that has entries (or is about to get some)."""
        m = self.state.map
        if m is None:
            raise KStoreStateError(f"index {self.path} is not mapped (closed or empty)")
        return m

    def _unmap(self) -> None:
        """Unpublish the mapping, then close it: a lock-free reader (the read fast path) never
        finds a closed mapping in the index state."""
        old = self._map
        if old is not None:
            self._map = None
            old.close()

    @property
    def entries(self) -> int:
        return self._entries

    @property
    def max_entries(self) -> int:
        length = self._pending_length if self._pending_length is not None else self._length
        return length // self.ENTRY_SIZE

    def resize_lazily(self, new_size: int) -> None:
        """Resize on the first write instead of now (an active segment's indexes grow back to
        the maximum only when they get an entry: opening many partitions stays cheap)."""
        rounded = self._round(new_size)
        self._pending_length = None if rounded == self._length else rounded

    def _apply_pending(self) -> None:
        if self._pending_length is not None:
            n, self._pending_length = self._pending_length, None
            self.resize(n)

    @property
    def length(self) -> int:
        """Bytes the file (and mapping) currently spans."""
        return self._length

    @property
    def size_in_bytes(self) -> int:
        return self._entries * self.ENTRY_SIZE

    def is_full(self) -> bool:
        return self._entries >= self.max_entries

    @property
    def mapping(self) -> Optional[_core.Mapping]:
        return self._map

    def entries_array(self) -> np.ndarray:
        """The used entries as a big-endian structured numpy array over the mapping."""
        if self._map is None or self._entries == 0:
            return np.zeros(0, dtype=self.DTYPE)
        # Mapping exports the buffer protocol (Cython's __getbuffer__), which a stub cannot
        # declare before Python 3.12's __buffer__
        return np.frombuffer(self._map, dtype=self.DTYPE, count=self._entries)  # type: ignore[call-overload]

    def resize(self, new_size: int, durable: bool = False) -> bool:
        """Set the file and mapping length to new_size rounded down to whole entries (and fsync
        the file when durable: a clean close must not leave a preallocated tail to come back)."""
        with self._lock:
            self._pending_length = None
            rounded = self._round(new_size)
            if rounded == self._length:
                if durable and self._writable:
                    if self._map is not None:
                        self._io.map_flush(self._map, 0, rounded)
                    if self._resized_unsynced:
                        self._fsync_file()
                return False
            if not self._writable:
                raise KStoreStateError(f"cannot resize read-only index {self.path}")
            fd = self._io.open(self.path, os.O_RDWR)
            try:
                self._unmap()
                # sparse, as Kafka's setLength: entries are written with pwrite (never through
                # the mapping), so a full disk fails an append cleanly instead of raising SIGBUS
                self._io.truncate(fd, rounded)
                self.load_problem = None
                if durable:
                    self._io.fsync(fd)
                self._resized_unsynced = not durable
                self._allocated = min(self._allocated, rounded)
                self._remap(fd, rounded)
            finally:
                self._io.close(fd)
            return True

    def _fsync_file(self) -> None:
        fd = self._io.open(self.path, os.O_RDWR)
        try:
            self._io.fsync(fd)
        finally:
            self._io.close(fd)
        self._resized_unsynced = False

    def trim_to_valid_size(self, durable: bool = False) -> None:
        if self._writable:
            self.resize(self._entries * self.ENTRY_SIZE, durable)

    @property
    def length_on_disk(self) -> int:
        """The file's length once a pending lazy resize is applied."""
        return self._pending_length if self._pending_length is not None else self._length

    def rewrite(self, raw: np.ndarray, keep_preallocated: bool = False) -> None:
        """Replace the file with exactly these entries (recovery's rebuilt index): one truncate
        and one write, the same bytes Kafka's reset + appends + trim leave. keep_preallocated
        (the segment is made active next): a file still at its preallocated length keeps it,
        the entries written over the old ones, which are zeroed up to the first zero page
        (no two truncations of 10 MiB, ~1.4 ms each, nor regrowth; bytes past the entries are
        never read: an active segment is recovered after a crash, trimmed at roll and close).
        A sound index, already these entries (the usual case after a crash: the writer indexed
        the batches recovery validates), is read and left as it is: no write, no truncation."""
        with self._lock:
            data = np.ascontiguousarray(raw, dtype=self.DTYPE).tobytes()   # on-disk layout, always
            self._entries = 0     # first: a reader never pairs the old count with a shorter map
            self._unmap()
            fd = self._io.open(self.path, os.O_RDWR | os.O_CREAT)
            try:
                full = self._round(self._max_index_size)
                flen = self._io.size(fd)
                keep = keep_preallocated and len(data) <= full == flen > 0
                pos = len(data)
                sound = False
                if keep or flen == pos:
                    # a sound index (these entries, then zeros to the page end when it keeps
                    # its preallocated length) is read, never rewritten
                    have = self._io.pread(fd, pos + PAGE - pos % PAGE if keep else pos, 0)
                    sound = (have[:pos] == data and have.count(0, pos) == len(have) - pos
                             and (keep or len(have) == pos))
                if not sound:
                    if not keep:
                        self._io.truncate(fd, len(data))
                    if data:
                        self._io.pwrite(fd, data, 0)
                    while keep and pos < full and _nonzero(page := self._io.pread(fd, PAGE - pos % PAGE, pos)):
                        self._io.pwrite(fd, bytes(len(page)), pos)
                        pos += len(page)
                self._pending_length = None
                self.load_problem = None
                self._allocated = 0 if keep else len(data)
                self._remap(fd, full if keep else len(data))
            finally:
                self._io.close(fd)
            self._entries = len(raw)
            self._after_truncate()

    def _ensure_allocated(self, end: int, zero_fill: bool = False) -> None:
        """Reserve disk blocks under [0, end) before storing through the mapping: the file is
        sparse past its entries (as Kafka's), and a store into an unallocated page on a full disk
        would be SIGBUS. Blocks are reserved 64 KiB at a time, so appends make no syscall.

        zero_fill (the append paths, where every byte past the entries is zero): the part past
        the entries is written zeros rather than fallocated. The first store through the mapping
        into a fallocated (unwritten) extent cost ~5 ms of CPU per index on ext4 (measured:
        a new segment's first index entries, 10 ms of a 1000-record append, against 0.4 ms)."""
        if end <= self._allocated:
            return
        new = min(self._length, max(end, self._allocated + ALLOCATION_STEP))
        start = self._allocated
        fd = self._io.open(self.path, os.O_RDWR)
        try:
            if zero_fill:
                data_end = min(new, max(start, self._entries * self.ENTRY_SIZE))
                if data_end > start:
                    self._io.allocate(fd, start, data_end - start)
                self._io.zero_fill(fd, data_end, new - data_end)
            else:
                self._io.allocate(fd, start, new - start)
        finally:
            self._io.close(fd)
        self._allocated = new

    def reserve_next(self) -> None:
        """Reserve the blocks of the next entry (the append paths, when it starts a new 64 KiB
        block; see _ensure_allocated). A full disk is raised as KafkaStorageError naming the
        file; the segment's append then takes back what it wrote (segment.py, runway.unwrite)."""
        if (self.state.entries + 1) * self.ENTRY_SIZE <= self._allocated:
            return
        with self._lock:
            self._apply_pending()
            try:
                self._ensure_allocated((self._entries + 1) * self.ENTRY_SIZE, zero_fill=True)
            except OSError as e:
                err = KafkaStorageError(e.errno or errno.EIO, f"{e.strerror or e} reserving "
                                        f"the blocks of entry {self._entries} of {self.path}")
                raise err from e

    def _write(self, position: int, data: bytes) -> None:
        self._apply_pending()
        self._ensure_allocated(position + len(data))
        self._mapping().write(position, data)

    def _truncate_to_entries(self, n: int) -> None:
        with self._lock:
            n = max(0, min(n, self._entries))
            if self._writable and self._map is not None and n < self._entries:
                self._write(n * self.ENTRY_SIZE, bytes((self._entries - n) * self.ENTRY_SIZE))
            self._entries = n
            self._after_truncate()

    def _after_truncate(self) -> None:
        pass

    def load_copy(self, data: bytes, extend: bool = False) -> None:
        """Replace the entries with a private in-memory copy of the whole entries of data, never
        mapped from the file (a read-only view of an index another process writes;
        ReadOnlySegment), or with extend=True append them after the entries already copied, so
        a refresh copies only what is new. Old copies are never closed (a reader thread may
        still use one) nor written below their published count; the count and the copy are
        read apart, so a larger count is published after the copy holding its entries, a
        smaller one before the smaller copy (see _index_copy.extend_index_copy)."""
        n = len(data) // self.ENTRY_SIZE
        nbytes = n * self.ENTRY_SIZE
        old = self._entries
        if extend and old and n == 0:
            return
        if extend and old:
            cur = self._map
            if not isinstance(cur, IndexCopy):
                raise KStoreStateError(f"index {self.path} is not a read-only copy")
            self._map = extend_index_copy(cur, old * self.ENTRY_SIZE, data, nbytes)
            n += old
        else:
            if n < old:
                self._entries = n
            self._map = extend_index_copy(None, 0, data, nbytes)
        self._length = n * self.ENTRY_SIZE
        self._entries = n
        self._after_truncate()

    def copy_entry(self, n: int) -> bytes:
        """The raw bytes of entry n of a read-only view's copy (what the next entries must
        follow)."""
        return self._mapping().read(n * self.ENTRY_SIZE, self.ENTRY_SIZE)

    def flush(self) -> None:
        if self._map is not None and self._writable:
            self._io.map_flush(self._map, 0, self._entries * self.ENTRY_SIZE)

    def close(self, durable: bool = False) -> None:
        """Trim to the used entries (fsynced when durable) and unmap."""
        self.trim_to_valid_size(durable)
        self.close_handler()

    def close_handler(self) -> None:
        self._unmap()

    def delete(self) -> bool:
        self.close_handler()
        try:
            self._io.unlink(self.path)
            return True
        except FileNotFoundError:
            return False

    def _check_sizes(self) -> None:
        """Length not a multiple of the entry size is corrupt (Kafka's sanityCheck)."""
        if self._io.exists(self.path):
            length = self._io.getsize(self.path)
            if length % self.ENTRY_SIZE != 0:
                raise CorruptIndexError(
                    f"index file {self.path} has length {length}, not a multiple of {self.ENTRY_SIZE}")

    def entries_problem(self, log_size: int) -> Optional[str]:
        """Why the loaded entries cannot be trusted against a .log of log_size bytes, or None:
        keys not increasing, offsets below the base, positions past the end of the .log."""
        if self.load_problem is not None:
            return self.load_problem
        arr = self.entries_array()
        if not len(arr):
            return None
        return self._entries_problem(arr, log_size)

    def _entries_problem(self, arr: np.ndarray, log_size: int) -> Optional[str]:
        """Why entries arr (non-empty) cannot be trusted against a .log of log_size bytes."""
        raise NotImplementedError

    def sound_entries_before_zero_tail(self, log_size: int) -> Optional[int]:
        """n if the entries are n sound ones then all-zero ones (at least one), else None. An
        all-zero entry never follows another (offsets and positions increase, a first append
        gets no entry): it is the untrimmed preallocation of a segment that was active when its
        writer was killed (Kafka counts it as entries; it trims at roll and close)."""
        if self.load_problem is not None or self._entries == 0 or self._map is None:
            return None
        raw = np.frombuffer(self._map, dtype=np.uint8,  # type: ignore[call-overload]
                            count=self._entries * self.ENTRY_SIZE)
        if raw[-self.ENTRY_SIZE:].any():
            return None
        nonzero = np.flatnonzero(raw)
        n = 0 if not len(nonzero) else int(nonzero[-1]) // self.ENTRY_SIZE + 1
        if n and self._entries_problem(self.entries_array()[:n], log_size) is not None:
            return None
        return n

    def trim_entries(self, n: int) -> None:
        """Keep the first n entries and cut the file to them (a zero tail found at load):
        the smaller count is published before the shorter mapping."""
        with self._lock:
            self._entries = min(n, self._entries)
            self._after_truncate()
            self.resize(self._entries * self.ENTRY_SIZE)

    def _load_bulk(self, raw: np.ndarray) -> None:
        """Replace every entry with raw (a structured array in the on-disk layout)."""
        n = len(raw)
        if n > self.max_entries:
            raise KStoreStateError(f"{n} entries do not fit index {self.path}")
        self._entries = 0
        if n:
            self._write(0, np.ascontiguousarray(raw, dtype=self.DTYPE).tobytes())
        self._entries = n
