"""The read side of one segment (the reads of Kafka's LogSegment): its file names, the lazily
opened mapping and indexes, and every lookup and read, which take no lock (they read the
SegmentView's mapping and size together). LogSegment (segment.py) adds the writer's side.
"""
from __future__ import annotations

import enum
import logging
import os
import threading
from typing import Optional

from kstore import _core
from kstore.config import LogConfig
from kstore.errors import CorruptRecordError, KStoreError, SegmentGoneError, with_path
from kstore.fileio import FileOps
from kstore.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX
from kstore.index import AbstractIndex
from kstore.offset_index import OffsetIndex
from kstore.time_index import TimeIndex

log = logging.getLogger("kstore.segment")

INT32_MAX = (1 << 31) - 1


class ColumnsEnd(enum.Enum):
    """Why SegmentReader.read_columns stopped (the core's decode_columns statuses)."""
    END = "end"          #: the segment's data ended: go on in the next segment
    LIMIT = "limit"      #: the columns are full (max_records or max_data)
    STOP = "stop"        #: reached stop_offset


class SegmentReader:
    """A segment's files opened for reading: base offset, logical size, lazy mapping and
    indexes, reads. Mappings and indexes are opened on first use, as Kafka's LazyIndex."""

    #: a view of files another process writes (segment_ro.ReadOnlySegment): indexes opened
    #: read-only and not loaded from disk (the subclass copies their validated prefix)
    read_only = False

    def __init__(self, dir_: str, base_offset: int, config: LogConfig, *, io: FileOps,
                 suffix: str = "") -> None:
        self.dir = dir_
        self.base_offset = base_offset
        self._config = config
        self._io = io
        self._suffix = suffix
        # the three names from one stem: os.path.join(dir_, name) for a relative name, without
        # its per-call cost (start-up builds one segment per .log file)
        stem = (dir_ + os.sep if dir_ and not dir_.endswith(os.sep) else dir_) + f"{base_offset:020d}"
        self.log_path = stem + LOG_SUFFIX + suffix
        self.offset_index_path = stem + INDEX_SUFFIX + suffix
        self.time_index_path = stem + TIME_INDEX_SUFFIX + suffix
        self._lock = threading.RLock()
        self.view = _core.SegmentView(base_offset)   # what the read fast path sees
        self._oidx: Optional[OffsetIndex] = None
        self._tidx: Optional[TimeIndex] = None
        self.closed = False

    def _check_index(self, idx: AbstractIndex) -> None:
        """Called when an index is first opened (lock held): LogSegment checks it against the
        .log and rebuilds it if it fails."""

    def sanity_check(self, time_index_file_newly_created: bool = False) -> None:
        """Kafka's sanityCheck: both indexes well-formed (raises CorruptIndexError)."""
        self.offset_index.sanity_check()
        if time_index_file_newly_created:
            self.time_index.resize(0)
        self.time_index.sanity_check()

    #: the size is not read yet: a segment the load left lazy (below the recovery point, see
    #: LogSegment's lazy_size) has view.size == -1 until _load_size reads its file's length
    _size_unknown = False

    @property
    def size(self) -> int:
        """Bytes of valid batches in the .log (the logical size)."""
        if self._size_unknown:
            self._load_size()
        return self.view.size

    @size.setter
    def size(self, n: int) -> None:
        self.view.size = n
        self._size_unknown = False

    def _load_size(self, flen: Optional[int] = None) -> None:
        """Materialise a lazy segment's size: the .log's length (flen if the caller has the
        file open, else a stat through FileOps), refused above 2^31-1 bytes as an eager open
        refuses it. Under the segment's lock, so it never races a rename or a deletion (which
        materialise it first, see settle_size); the flag is cleared after view.size is set, so
        a lock-free reader that sees it cleared sees the size."""
        with self._lock:
            if not self._size_unknown:
                return
            if flen is None:
                try:
                    flen = self._io.getsize(self.log_path)
                except FileNotFoundError:
                    raise SegmentGoneError(f"segment {self.log_path} was deleted") from None
            self.check_length(flen)
            self.view.size = flen
            self._size_unknown = False

    def check_length(self, flen: int) -> None:
        """A .log longer than 32-bit positions can address is refused (CorruptRecordError)."""
        if flen > INT32_MAX:
            raise CorruptRecordError(f"segment file {self.log_path} is larger than 2^31-1 bytes")

    def settle_size(self) -> None:
        """Before the .log is renamed, replaced or removed: a lazy size is read while the file
        is there (what an eager open read at load); if it cannot be, the segment has no bytes."""
        if self._size_unknown:
            try:
                self._load_size()
            except (OSError, KStoreError):
                with self._lock:
                    if self._size_unknown:
                        self.view.size = 0
                        self._size_unknown = False

    @property
    def _max_ts(self) -> Optional[tuple[int, int]]:
        """(max timestamp, its offset), (-1, -1) if none, None until loaded."""
        v = self.view
        return (v.max_timestamp, v.offset_of_max_timestamp) if v.max_ts_known else None

    @_max_ts.setter
    def _max_ts(self, pair: Optional[tuple[int, int]]) -> None:
        v = self.view
        if pair is None:
            v.max_ts_known = False
        else:
            v.max_timestamp, v.offset_of_max_timestamp = pair
            v.max_ts_known = True

    @property
    def _map(self) -> Optional[_core.Mapping]:
        return self.view.log_map

    @_map.setter
    def _map(self, m: Optional[_core.Mapping]) -> None:
        self.view.log_map = m

    @property
    def offset_index(self) -> OffsetIndex:
        idx = self._oidx
        if idx is None:
            with self._lock:
                if self._oidx is None:
                    self._check_not_closed()
                    self._oidx = OffsetIndex(self.offset_index_path, self.base_offset,
                                             self._config.max_index_size, io=self._io,
                                             writable=not self.read_only, load=not self.read_only)
                    self.view.index = self._oidx.state
                    self._check_index(self._oidx)
                idx = self._oidx
        return idx

    @property
    def time_index(self) -> TimeIndex:
        idx = self._tidx
        if idx is None:
            with self._lock:
                if self._tidx is None:
                    self._check_not_closed()
                    self._tidx = TimeIndex(self.time_index_path, self.base_offset,
                                           self._config.max_index_size, io=self._io,
                                           writable=not self.read_only, load=not self.read_only)
                    self.view.tindex = self._tidx.state
                    self._check_index(self._tidx)
                idx = self._tidx
        return idx

    def load_offset_index(self) -> OffsetIndex:
        """Open the offset index now if it is not open yet (a read about to need it)."""
        return self.offset_index

    def load_time_index(self) -> TimeIndex:
        """Open the time index now if it is not open yet."""
        return self.time_index

    def load_indexes(self) -> None:
        """Open both indexes now if they are not open yet (a timestamp lookup about to need them)."""
        self.load_offset_index()
        self.load_time_index()

    def _check_not_closed(self) -> None:
        """A lazy index is never opened for a closed segment (lock held): its files are renamed
        or gone, and opening would create a stray index (or fail raw if the directory moved)."""
        if self.closed:
            raise SegmentGoneError(f"segment {self.log_path} was deleted or closed")

    def set_config(self, config: LogConfig) -> None:
        self._config = config

    def mapping(self) -> _core.Mapping:
        """The mapping that covers [0, size): writable for the active segment, else read-only
        (mapped now if it is not yet)."""
        m = self._map
        if m is None:
            with self._lock:
                if self.closed:
                    raise SegmentGoneError(f"segment {self.log_path} was deleted or closed")
                if self._map is None:
                    try:
                        fd = self._io.open(self.log_path, os.O_RDONLY)
                    except FileNotFoundError:
                        raise SegmentGoneError(f"segment {self.log_path} was deleted") from None
                    try:
                        flen = self._io.size(fd)
                        if self._size_unknown:
                            self._load_size(flen)    # the file mapped: no second stat
                        self._map = self._io.map(fd, flen, False)
                    finally:
                        self._io.close(fd)
                m = self._map
        return m

    def load_max_timestamp(self) -> tuple[int, int]:
        """(max timestamp, its offset) of the segment, (-1, -1) if none: loaded on first use
        from the time index and the batch headers after its last entry."""
        if self._max_ts is None:
            # the last time entry, then the batch headers after it: exact even when the time
            # index lost entries (cut short, or never written), at the cost of reading the
            # headers of about one index interval when it is intact
            ts, off = self._scan_max_timestamp() if self.size > 0 else (-1, -1)
            self._max_ts = (ts, off) if ts >= 0 else (-1, -1)
        return self._max_ts

    @property
    def max_timestamp_so_far(self) -> int:
        return self.load_max_timestamp()[0]

    def _mapped(self) -> tuple[_core.Mapping, int]:
        """(mapping, valid end) taken together in the core (see SegmentView.snapshot), mapping
        the segment first if needed; SegmentGoneError if it was deleted meanwhile."""
        if self.view.log_map is None:
            self.mapping()
        m, end = self.view.snapshot()
        if m is None:
            raise SegmentGoneError(f"segment {self.log_path} was deleted or closed")
        return m, end

    def _gone(self, m: _core.Mapping, e: Exception) -> Exception:
        """A reader's mapping closed under it (the segment was deleted): SegmentGoneError;
        any other error as it is."""
        if m.closed:
            return SegmentGoneError(f"segment {self.log_path} was deleted or remapped while being read")
        return e

    def _scan_start(self, offset: int, m: _core.Mapping, end: int) -> int:
        """Where to start scanning for offset: the index floor, checked against the batch it
        points at (a stale or damaged entry never makes a scan skip records)."""
        st = self.offset_index.state
        imap, n = st.map, st.entries
        if imap is None or n <= 0:
            return 0
        try:
            # map and count are read apart: clamp a count from another generation of the index
            return _core.index_position(imap, min(n, imap.length // 8), self.base_offset, offset,
                                        m, end)
        except ValueError:
            if imap.closed:
                return 0          # resized or closed meanwhile: the index only saves a scan
            raise

    def translate_offset(self, offset: int) -> Optional[int]:
        """Position of the first batch whose last offset >= offset, or None."""
        m, end = self._mapped()
        try:
            p = _core.find_batch(m, self._scan_start(offset, m, end), end, offset)
        except (ValueError, BufferError) as e:
            raise self._gone(m, e) from None
        return None if p < 0 else p

    def read(self, offset: int, max_records: int, max_bytes: int, out: list,
             verify_crc: bool = True, min_one: bool = True) -> tuple[int, int, int]:
        """Append records with offset >= `offset` to out; returns (next position, next offset,
        bytes used)."""
        st = self.offset_index.state
        imap, n = st.map, st.entries
        m, end = self._mapped()
        try:
            return _core.read_at(m, imap, min(n, imap.length // 8) if imap is not None else 0,
                                 self.base_offset, end, offset, max_records, max_bytes,
                                 verify_crc, out, min_one)
        except CorruptRecordError as e:
            raise with_path(e, self.log_path) from None
        except (ValueError, BufferError) as e:
            raise self._gone(m, e) from None

    def read_columns(self, offset: int, stop_offset: int, cols: _core.Columns, max_records: int,
                     max_data: int, verify_crc: bool = True) -> tuple[ColumnsEnd, int]:
        """Decode records in [offset, stop_offset) into cols (see _core.decode_columns):
        (why it stopped, offset to resume at)."""
        self.load_offset_index()
        m, end = self._mapped()
        try:
            pos = self._scan_start(offset, m, end)
            _pos, nxt, status = _core.decode_columns(m, pos, end, offset, stop_offset, cols,
                                                     max_records, max_data, verify_crc)
        except CorruptRecordError as e:
            raise with_path(e, self.log_path) from None
        except (ValueError, BufferError) as e:
            raise self._gone(m, e) from None
        if status == "end" and self.view.corrupt is not None:
            self.raise_corrupt()
        return ColumnsEnd(status), nxt

    def raise_corrupt(self) -> None:
        """A read reached the invalid bytes a read-only refresh found at the end of the valid
        data (as SegmentView's reads do): CorruptRecordError naming file and position."""
        e = CorruptRecordError(self.view.corrupt)
        e.position = self.size
        raise with_path(e, self.log_path)

    def read_batches(self, offset: int, max_bytes: int) -> Optional[memoryview]:
        """Zero-copy view of whole batches from the one holding offset, up to max_bytes
        (at least one batch)."""
        m, end = self._mapped()
        try:
            pos = _core.find_batch(m, self._scan_start(offset, m, end), end, offset)
            if pos < 0:
                if self.view.corrupt is not None:
                    self.raise_corrupt()
                return None
            # only the headers within max_bytes are parsed (not the rest of the segment's)
            heads = _core.batch_headers(m, pos, min(end, pos + max(max_bytes, 0)))
            if not heads:            # the first batch is larger than max_bytes: it alone
                first = end
                if end - pos >= 12:
                    with memoryview(m) as mv:
                        first = pos + 12 + int.from_bytes(mv[pos + 8:pos + 12], "big", signed=True)
                heads = _core.batch_headers(m, pos, min(end, max(first, pos)))
            stop = heads[-1][0] + heads[-1][3] if heads else pos
            return memoryview(m)[pos:stop]
        except (ValueError, BufferError) as e:
            raise self._gone(m, e) from None

    def find_offset_by_timestamp(self, timestamp: int, start_offset: int) -> Optional[tuple[int, int]]:
        """First (offset, timestamp) with timestamp >= target and offset >= start_offset."""
        _ts, off = self.time_index.lookup(timestamp)
        m, end = self._mapped()
        try:
            pos = self._scan_start(max(off, start_offset), m, end)
            return _core.find_offset_by_timestamp(m, pos, end, timestamp, start_offset)
        except CorruptRecordError as e:
            raise with_path(e, self.log_path) from None
        except (ValueError, BufferError) as e:
            raise self._gone(m, e) from None

    def largest_timestamp(self) -> int:
        """Max timestamp in the segment, or the .log's mtime if it has none (Kafka)."""
        ts = self.max_timestamp_so_far
        if ts >= 0:
            return ts
        return self._io.getmtime_ms(self.log_path)

    def largest_mtime(self) -> int:
        """The .log's modification time in ms (legacy tombstone horizons use it)."""
        try:
            return self._io.getmtime_ms(self.log_path)
        except FileNotFoundError:
            return 0

    def read_next_offset(self) -> int:
        """One past the last offset in the segment (scan from the last index entry)."""
        if self.size == 0:
            return self.base_offset
        last = self.offset_index.last_offset
        m, end = self._mapped()
        try:
            pos = self._scan_start(last, m, end)
            headers = _core.batch_headers(m, pos, end)
            if not headers and pos:
                headers = _core.batch_headers(m, 0, end)
        except (ValueError, BufferError) as e:
            raise self._gone(m, e) from None
        return headers[-1][2] + 1 if headers else self.base_offset

    def _scan_max_timestamp(self) -> tuple[int, int]:
        """Exact (max timestamp, offset) after a truncation: start from the last time-index entry
        and scan the batch headers written after it (Kafka keeps the stale index entry)."""
        ts, off = self.time_index.last_entry
        best = (ts, off) if ts >= 0 else (-1, -1)
        if self.size == 0:
            return (-1, -1)
        pos = self.offset_index.lookup(off)[1] if ts >= 0 else 0
        m, end = self._mapped()
        if pos > end:
            pos = 0
        try:
            headers = _core.batch_headers(m, pos, end)
        except (ValueError, BufferError) as e:
            raise self._gone(m, e) from None
        for (_p, _base, last, _size, _magic, _attrs, max_ts, _count) in headers:
            if max_ts > best[0]:
                best = (max_ts, last)
        return best
