"""One partition's log (Kafka's UnifiedLog, for a single node): open and load, append, read and
offsets by timestamp. The segments on disk, their offsets and retention are LocalLog's
(local_log.py), which Log extends rather than wraps: the append and read fast paths reach the
segment list and offsets without an extra attribute lookup. high_watermark equals log_end_offset
(a single node)."""
from __future__ import annotations

import errno
import logging
import os
from typing import Any, Iterable, Mapping, Optional

from kstore import _core
from kstore.clock import SYSTEM_TIME
from kstore.config import NO_LIMIT, LogConfig, bad_max_records
from kstore._core import log_read as _log_read
from kstore.errors import (CorruptRecordError, KStoreError, KStoreStateError,
                           OffsetOutOfRangeError, RecordTooLargeError, SegmentGoneError,
                           UnknownTopicError, with_path)
from kstore.fileio import FileOps, get_file_ops
from kstore.leader_epoch import LeaderEpochs
from kstore.local_log import LOG_DIR_LOCK, LocalLog
from kstore.log_loader import LogLoader
from kstore.log_segments import LogSegments
from kstore.log_tail import warn_unreadable
from kstore.log_time_lookup import (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, MAX_TIMESTAMP,
                                    TimestampLookup)
from kstore.read_skip import LogFetch
from kstore.ro_refresh import ReadOnlyRefresh
from kstore.segment import LogSegment, SegmentRecovery
from kstore.segment_ro import ReadOnlySegment
from kstore.segment_reader import ColumnsEnd
from kstore.row_split import split_rows
from kstore.start_file import STANDALONE_CLEAN_MARKER, read_only_start
from kstore.storage_errors import failed_error, storage_error, storage_op

__all__ = ["Log", "LOG_DIR_LOCK", "STANDALONE_CLEAN_MARKER", "DEFAULT_MAX_BYTES", "split_rows",
           "LATEST_TIMESTAMP", "EARLIEST_TIMESTAMP", "MAX_TIMESTAMP"]

log = logging.getLogger("kstore.log")

DEFAULT_MAX_BYTES = 1 << 20


class Log(LeaderEpochs, LocalLog, TimestampLookup, LogFetch):
    """A partition directory of segments. Open with ``Log.open``; use as a context manager."""

    def __init__(self, dir_: str, config: LogConfig, *, io: FileOps, time, scheduler=None,
                 managed: bool = False, read_only: bool = False):
        super().__init__(dir_, config, io=io, time=time, scheduler=scheduler, managed=managed,
                         read_only=read_only)
        self._builder = _core.BatchBuilder()
        self._ts_window_cfg: Optional[LogConfig] = None
        self._ts_window_cache = (0, 0)
        self.recovery_report: list[SegmentRecovery] = []
        #: a read-only log: how many times a refresh found its directory deleted and re-created
        #: (the records from then on are a new topic's; a reader's positions are not theirs)
        self.incarnation = 0

    @classmethod
    def open(cls, path: str | os.PathLike, config: Optional[Mapping[str, Any] | LogConfig] = None, *,
             recovery_point: Optional[int] = None, log_start_offset: Optional[int] = None,
             clean_shutdown: Optional[bool] = None, io: Optional[FileOps] = None, time=None,
             scheduler=None, read_only: bool = False,
             listing: Optional[list[str]] = None) -> "Log":
        """Open (creating if missing) the partition directory at path.

        A log owned by a LogManager passes recovery_point, log_start_offset and clean_shutdown
        from its checkpoints. A standalone log keeps a clean-shutdown marker in its directory:
        after a clean close it opens without recovery; otherwise every segment is validated and
        the invalid tail cut, as Kafka does for a log with no recovery checkpoint.

        read_only=True writes nothing (no recovery, no marker, no index resizing): the valid end
        of each segment is found by a CRC-validating scan, so a batch that another process is
        still writing is never returned; refresh() (or a read at the end) picks up new data.

        listing: the directory's names, listed by the caller just before (a LogManager's
        start-up), so that a writable open does not list it again.
        """
        cfg = config if isinstance(config, LogConfig) else LogConfig(config)
        io = LogLoader.file_ops(io or get_file_ops(), clean_shutdown is None, read_only)
        time = time or SYSTEM_TIME
        path = os.fspath(path)
        managed = clean_shutdown is not None
        log_ = cls(path, cfg, io=io, time=time, scheduler=scheduler, managed=managed,
                   read_only=read_only)
        if read_only:
            try:
                log_._load_read_only(log_start_offset)
            except BaseException:
                log_.close_handlers()    # a dir deleted mid-load: nothing it opened is kept
                raise
        else:
            try:
                log_._load(recovery_point, log_start_offset, clean_shutdown, listing)
            except OSError as e:
                log_.close_handlers()
                if isinstance(e, KStoreError) or e.errno in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
                    raise                # a wrong path, not a failing disk
                raise storage_error(log_.dir, e) from e
            except BaseException:
                # a refused file, a lock held elsewhere, corruption: no mapping, descriptor or
                # lock outlives the failed open
                log_.close_handlers()
                raise
        return log_

    def _load_read_only(self, log_start_offset: Optional[int]) -> None:
        if not self._io.exists(self.dir):
            # (deleted since a listing named it, as refresh() says of a dir deleted later)
            raise UnknownTopicError(f"partition directory {self.dir} does not exist (read-only open)")
        self._set_segments([])
        self._ro_refresh = ReadOnlyRefresh(self._io, self.dir)
        self.refresh(log_start_offset if log_start_offset is not None else read_only_start(self._io, self.dir))
        warn_unreadable(self)          # a garbage .log is said, not shown as empty (log_tail.py)

    def refresh(self, log_start_offset: Optional[int] = None, *,
                tail: Optional[tuple[int, int]] = None) -> None:
        """Read-only logs: pick up the segments and batches another process added, deleted or
        replaced (readers of an old file finish on it), and a start a standalone writer saved
        (start_file.py; never lowered); tail: the writer's (active base, size) hints (notify.py).
        No-op if writable; UnknownTopicError if the partition dir is gone; KStoreStateError once
        closed (checked under the lock: a refresh racing close() would open segments, and keep a
        descriptor, that nothing closes)."""
        if not self.read_only:
            return
        with self._lock:
            self._check_open()
            segs = self._ro_refresh.scan(self._segments, lambda: LogLoader(
                self.dir, self._config, io=self._io, time=self._time, rng=self._rng), tail,
                self._forget_log_start)
            if segs is not self._segments:
                if self._start_lowered(self._segments, segs):
                    self._log_start_offset = 0      # from the writer's files again, below
                self._set_segments(segs)
            self._leo = segs[-1].read_next_offset() if segs else (log_start_offset or 0)
            start = max(log_start_offset or 0, self._log_start_offset, segs[0].base_offset if segs else 0,
                        self._ro_refresh.saved_start() or 0)     # a standalone writer's
            self._log_start_offset = min(start, self._leo)
            self._recovery_point = self._leo

    def _start_lowered(self, old: LogSegments, segs: LogSegments) -> bool:
        """Whether the writer truncated below the start this reader keeps (truncateFullyAndStartAt,
        the one change that lowers a start): its log end is now below that start, or every
        segment was replaced and the first begins below it. (A start learned from the page
        alone comes back at the caller's next page look.)"""
        kept = self._log_start_offset
        if not len(segs) or not len(old) or segs.segs[0].base_offset >= kept:
            return False
        if segs.segs[-1].read_next_offset() < kept:
            return True
        survivors = {id(s) for s in old.segs}
        return not any(id(s) in survivors for s in segs.segs)

    @property
    def dir_identity(self) -> Optional[tuple[int, int]]:
        """Read-only: (device, inode) of the directory its segments were last listed from."""
        return self._ro_refresh.identity if self.read_only else None

    def note_log_start(self, offset: int) -> None:
        """A read-only log: the writer's log start from its notification page (notify.py; a
        DeleteRecords inside a segment shows nowhere else until a checkpoint): raised to it,
        never past the log end, never lowered. No-op if writable."""
        if self.read_only:
            with self._lock:
                if offset > self._log_start_offset:
                    self._log_start_offset = min(offset, self._leo)

    def _forget_log_start(self) -> None:
        """The partition was deleted and re-created between two refreshes: a new log, which
        starts where its own segments (or its checkpoint) say, not where the old one did."""
        self._log_start_offset = 0
        self.incarnation += 1

    def refresh_tail(self, base: int, size: int) -> bool:
        """A read-only log's waiter just woken by the writer (notify.py), the page's list stamp
        the trusted one: refresh's tail step alone, without its other layers (this is on the
        append-to-visible path). True if the last segment is the active one (base) and now
        holds the validated bytes up to size (the log end moved on with them); False: the
        full refresh must look. The index copies are left for catch_up_index (up to a bound)."""
        with self._lock:
            if self._closed or not self.read_only or \
                    not self._ro_refresh.extend(self._segments, base, size, False):
                return False
            self._leo = self._recovery_point = self._segments.segs[-1].read_next_offset()
            return True

    def catch_up_index(self) -> None:
        """A read-only log's waiter with nothing new, about to sleep (notify.py): copy the index
        entries refresh_tail left for later, off the append-to-visible path."""
        if self.read_only:
            with self._lock:
                segs = self._segments.segs
                if not self._closed and segs and isinstance(segs[-1], ReadOnlySegment):
                    segs[-1].catch_up_index()

    def _load(self, recovery_point: Optional[int], log_start_offset: Optional[int],
              clean_shutdown: Optional[bool], listing: Optional[list[str]] = None) -> None:
        """A writable open: a standalone log's flocks taken (a refused open makes no directory),
        the directory created if missing, the loader's segments and offsets published."""
        self._create_dir() if self._managed else self._take_locks()
        loaded = LogLoader(self.dir, self._config, io=self._io, time=self._time,
                           rng=self._rng).load(recovery_point, log_start_offset, clean_shutdown,
                                               listing)
        self._set_segments(loaded.segments)
        self._leo = loaded.log_end_offset
        self._log_start_offset = loaded.log_start_offset
        self._recovery_point = loaded.recovery_point
        self.recovery_report = loaded.recovery_report
        if not loaded.notify_page or any(r.truncated_bytes and not r.tail_zero
                                         for r in loaded.recovery_report):
            self.attach_bell()        # a fresh partition's page, or a torn tail cut: at once
        self._load_epochs()            # leader-epoch-checkpoint (leader_epoch.py)

    def append(self, records: Iterable) -> _core.AppendInfo:
        """Append records as one batch and return the offsets they got.

        records: (key, value[, timestamp_ms[, headers]]) tuples or kstore.Record objects;
        a missing timestamp means now. Rolls first when any of Kafka's roll conditions holds.
        """
        if type(records) is not list and type(records) is not tuple:
            records = list(records)
        with self._lock:
            if self._closed or self.read_only:
                self._check_open()
                raise KStoreStateError(f"log {self.dir} is open read-only")
            if self._failed is not None:
                raise failed_error(self.dir, self._failed)
            (self._bell or self.attach_bell()).prewake()    # sleepers wake while it builds (notify.py)
            cfg = self._config
            now = self._time.milliseconds()
            b = self._builder
            b.compression_level = cfg.compression_level
            before, after = self._ts_window
            n = b.build(records, cfg.magic, self._leo, now, cfg.log_append_time,
                        now - before, now + after, cfg.compact, cfg.codec, self._epoch)
            if n == 0:
                return _core.empty_append_info(self._leo)
            try:
                self._append_built(b, cfg, now)
            except OSError as e:         # storage_op, inlined on the hot path
                self._fail_on(e)
                raise storage_error(self.dir, e) from e
            if not self._deferred and self._leo - self._recovery_point < cfg.flush_messages:
                return b.info(now if cfg.log_append_time else -1)     # the usual case
            info = b.info(now if cfg.log_append_time else -1)
            deferred = self._take_deferred()
            due = self._leo - self._recovery_point >= cfg.flush_messages
        self._after_write(deferred, due)
        return info

    @storage_op
    def append_batches(self, data) -> tuple[int, int]:
        """Append pre-encoded v2 batches (bytes-like, back to back), giving them offsets from the
        log end as a broker does for a produce request: each batch's CRC is checked and its bytes
        kept except the base offset (and, on LogAppendTime topics, the timestamp type and max
        timestamp). Returns (first offset, record count). Used to commit data staged elsewhere,
        e.g. by Spark tasks."""
        view = memoryview(data).cast("B")
        total = len(view)
        with self._lock:
            self._check_writable()
            cfg = self._config
            b = self._builder
            first = self._leo
            count = 0
            pos = 0
            try:
                while pos < total:
                    now = self._time.milliseconds()
                    pos += b.load_batch(view, pos, self._leo, now if cfg.log_append_time else -1,
                                        self._epoch)
                    self._append_built(b, cfg, now)
                    count += b.count
            finally:
                deferred = self._take_deferred()
                due = self._leo - self._recovery_point >= cfg.flush_messages
        self._after_write(deferred, due and count > 0)
        return first, count

    @storage_op
    def append_columns(self, cols: _core.ColumnInput, start: int = 0, stop: Optional[int] = None,
                       *, batch_bytes: int = DEFAULT_MAX_BYTES) -> tuple[int, int]:
        """Append rows [start, stop) of columnar input (Arrow-layout buffers, see
        _core.ColumnInput) as batches of about batch_bytes, encoded in the core with append()'s
        validation and no per-record Python objects. Each batch is appended as it is built, as
        a producer's separate requests: one that fails validation stops the call, the ones
        before it stay. Returns (first offset, record count)."""
        stop = cols.n if stop is None else stop
        sizes = cols.sizes()
        with self._lock:
            self._check_writable()
            cfg = self._config
            budget = max(1, min(batch_bytes, cfg.max_message_bytes - 256))
            first = self._leo
            b = self._builder
            b.compression_level = cfg.compression_level
            before, after = self._ts_window
            try:
                for lo, hi in split_rows(sizes, start, stop, budget):
                    now = self._time.milliseconds()
                    if cfg.magic < 2:        # legacy message format: append()'s encoder
                        b.build(cols.rows(lo, hi), cfg.magic, self._leo, now, cfg.log_append_time,
                                now - before, now + after, cfg.compact, cfg.codec, self._epoch)
                    else:
                        b.build_columns(lo, hi, cols, self._leo, now, cfg.log_append_time,
                                        now - before, now + after, cfg.compact, cfg.codec, self._epoch)
                    self._append_built(b, cfg, now)
            finally:
                deferred = self._take_deferred()
                due = self._leo - self._recovery_point >= cfg.flush_messages
            count = self._leo - first
        self._after_write(deferred, due and count > 0)
        return first, count

    def _append_built(self, b: _core.BatchBuilder, cfg: LogConfig, now: int) -> None:
        """The builder's batch at the log end (lock held): size limits, roll, append, wake."""
        size = b.size
        if b.max_entry_size > cfg.max_message_bytes or size > cfg.segment_bytes:
            self._too_large(b)
        if self._epoch_stale:
            self._stamp_epoch(b)       # a truncation removed the epoch's entry (leader_epoch.py)
        seg = self._segments.segs[-1]
        last = b.last_offset
        if seg.should_roll(size, b.max_timestamp, last, now):
            seg = self._roll_locked(b.base_offset)
        seg.append(b, last, b.max_timestamp, b.offset_of_max_timestamp)
        self._leo = last + 1
        (self._bell or self.attach_bell()).bump_end(self._leo, seg.base_offset, seg.size)   # notify.py

    def _too_large(self, b: _core.BatchBuilder):
        cfg = self._config
        if b.max_entry_size > cfg.max_message_bytes:
            raise RecordTooLargeError(
                f"The batch of {b.count} record(s) is {b.max_entry_size} bytes, larger than "
                f"max.message.bytes ({cfg.max_message_bytes}) for {self.dir}")
        raise RecordTooLargeError(
            f"The batch of {b.count} record(s) is {b.size} bytes, larger than segment.bytes "
            f"({cfg.segment_bytes}) for {self.dir}")

    @property
    def _ts_window(self) -> tuple[int, int]:
        cfg = self._config
        if self._ts_window_cfg is not cfg:
            self._ts_window_cache = (min(cfg.timestamp_before_max_ms, NO_LIMIT),
                                     min(cfg.timestamp_after_max_ms, NO_LIMIT))
            self._ts_window_cfg = cfg
        return self._ts_window_cache

    def _check_range(self, offset: int) -> None:
        if offset < self._log_start_offset or offset > self._leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.dir}: log start offset "
                f"{self._log_start_offset}, log end offset {self._leo}")

    read = _core.read_records    # Log.read(offset, max_records, max_bytes, *, verify_crc)
    def _read_slow(self, offset: int, max_records: Optional[int], max_bytes: int,
                   verify_crc: bool) -> list[_core.Record]:
        """Log.read's every case (the compiled read_records returns the usual one itself)."""
        if (offset >= self._leo or offset < self._log_start_offset) and self._at_end(offset):
            return []
        limit = NO_LIMIT if max_records is None else max_records if max_records >= 0 else bad_max_records(max_records)
        out: list[_core.Record] = []
        used = 0
        start = offset
        ss = first = self._segments
        while True:        # _read_run, inlined on the hot path
            try:
                need = _log_read(ss.bases, ss.views, offset, limit, max_bytes, verify_crc, out, used)
            except CorruptRecordError as e:
                raise with_path(e, ss.segs[e.segment].log_path) from None  # type: ignore[attr-defined]  # e.segment: set by _core.log_read
            if need is None or not ss.segs:
                if self._segments is first:
                    return out
                break
            i, offset, used = need
            if i < 0:
                break           # the head was removed after the range check: check it again
            try:
                self._prepare_for_read(offset, ss, i)
            except OffsetOutOfRangeError:
                if self._segments is first:
                    raise
                break
            ss = self._segments
        return self._read_again(start, limit, max_bytes, verify_crc)

    def _read_again(self, offset: int, limit: int, max_bytes: int,
                    verify_crc: bool) -> list[_core.Record]:
        """read() after its segment list changed under it (a truncation, say): a segment read as
        cut may have been followed by a later segment's records (a gap), or the read may have
        gone on at an offset the change removed. Read again from the range check; after a few
        tries, with the writer held off."""
        for attempt in range(4):
            if attempt == 3:
                self._lock.acquire()
            try:
                if (offset >= self._leo or offset < self._log_start_offset) and self._at_end(offset):
                    return []
                out = self._read_run(offset, limit, max_bytes, verify_crc)
                if out is not None:
                    return out
            finally:
                if attempt == 3:
                    self._lock.release()
        raise SegmentGoneError(f"the segments of {self.dir} kept changing during a read; try again")

    def _at_end(self, offset: int) -> bool:
        """read()'s range check, for an offset outside [log start, log end) as last seen: True
        at the log end (a read-only log refreshes first), OffsetOutOfRangeError outside it."""
        if self.read_only:
            self.refresh()
        if offset == self._leo:
            self._check_corrupt_end()
            return True
        self._check_range(offset)
        return False

    def _read_run(self, offset: int, limit: int, max_bytes: int,
                  verify_crc: bool) -> Optional[list[_core.Record]]:
        """read()'s loop over the published segment lists; None if the list changed meanwhile
        (the caller reads again)."""
        out: list[_core.Record] = []
        used = 0
        first = self._segments
        while True:
            ss = self._segments
            try:
                need = _log_read(ss.bases, ss.views, offset, limit, max_bytes, verify_crc, out, used)
            except CorruptRecordError as e:
                raise with_path(e, ss.segs[e.segment].log_path) from None  # type: ignore[attr-defined]  # e.segment: set by _core.log_read
            if need is None or not ss.segs:
                return out if self._segments is first else None
            # a segment not mapped yet: map it and go on from there (what was read is kept)
            i, offset, used = need
            if i < 0:
                return None     # below the first segment: the caller checks the range again
            try:
                self._prepare_for_read(offset, ss, i)
            except OffsetOutOfRangeError:
                if self._segments is first:
                    raise
                return None

    def _prepare_for_read(self, offset: int, segs: LogSegments, start: int) -> None:
        """Map the first segment of segs[start:] that holds offset or follows it, and load its index
        (lazy open; a read-only segment is validated then). One per call, so a read maps only the
        segments it reaches. A segment deleted under the reader (retention, truncation) sends it
        back for a fresh segment list, or raises OffsetOutOfRangeError if the offset is gone."""
        if self._closed:
            self._check_open()
        for seg in segs.segs[max(start, segs.floor_index(offset)):]:
            try:
                if seg.closed:
                    raise SegmentGoneError(f"segment {seg.log_path} was deleted")
                if not seg.view.is_ready:
                    seg.mapping()
                    seg.load_offset_index()
                    return
            except SegmentGoneError:
                self._segment_gone(seg)
                self._check_range(offset)
                return

    def _check_corrupt_end(self) -> None:
        """A read-only view that ends where its last segment holds an invalid batch followed by
        valid ones: a read at the end reaches the corruption (CorruptRecordError)."""
        segs = self._segments
        if self.read_only and segs and segs.active.view.corrupt is not None:
            segs.active.raise_corrupt()

    def _head_removed(self, offset: int, segs: LogSegments) -> None:
        """Offset lies below the read's first segment (retention removed it after the range
        check): wait for the change, then OffsetOutOfRangeError, or SegmentGoneError (read again)."""
        self._segment_gone(segs.segs[0])
        self._check_range(offset)
        if self._segments.bases and offset < self._segments.bases[0]:
            raise OffsetOutOfRangeError(
                f"offset {offset} is below the first segment of {self.dir} "
                f"({self._segments.bases[0]}); the log starts at {self._log_start_offset}")
        raise SegmentGoneError(f"the segments of {self.dir} changed under a read at {offset}")

    def _segment_gone(self, seg: LogSegment) -> None:
        """A read met seg deleted or replaced (or its mapping swapped) under it. Waiting for the
        log lock lets the change in progress (the writer holds it to delete, truncate or swap
        segments) publish the new segments; a read-only log rescans its directory. The caller
        then retries on the current segments (or raises OffsetOutOfRangeError: offset gone)."""
        with self._lock:
            self._check_open()
            if seg in self._segments:
                if self.read_only:
                    self.refresh()
                elif seg.closed:
                    raise KStoreStateError(f"segment {seg.log_path} of {self.dir} is closed")

    def read_batches(self, offset: int, max_bytes: int = DEFAULT_MAX_BYTES) -> memoryview:
        """Whole raw batches from the one holding offset, as a zero-copy view (one segment)."""
        while True:
            self._check_range(offset)
            if offset == self._leo:
                return memoryview(b"")
            segs = self._segments
            i = segs.floor_index(offset)
            try:
                if segs.bases and offset < segs.bases[0]:
                    # the segment holding offset was removed after the range check
                    self._head_removed(offset, segs)
                while i < len(segs):
                    v = segs[i].read_batches(offset, max_bytes)
                    if v is not None and len(v):
                        return v
                    i += 1
                return memoryview(b"")
            except SegmentGoneError:
                self._segment_gone(segs[i])

    def read_columns(self, offset: int, stop_offset: int, cols: _core.Columns, *,
                     max_records: int = 1 << 16, max_data: int = 64 << 20,
                     verify_crc: bool = True) -> int:
        """Decode the records with offset in [offset, stop_offset) into cols (a
        kstore._core.Columns, Arrow-layout buffers) until it holds max_records records or about
        max_data bytes of data. Returns the offset to continue from: stop_offset (or the log
        end, if lower) once the range is done. No per-record Python objects are made."""
        if offset >= self._leo and self.read_only:
            self.refresh()
        self._check_range(offset)
        if offset == self._leo:
            self._check_corrupt_end()
        stop = min(stop_offset, self._leo)
        if offset >= stop:
            return offset
        resume = offset          # everything below it is in cols
        segs = self._segments
        i = segs.floor_index(offset)
        while True:
            seg = segs[i]
            try:
                if seg.closed:
                    raise SegmentGoneError(f"segment {seg.log_path} was deleted")
                if offset < seg.base_offset:
                    # only the first segment can start above offset (floor_index): the one
                    # holding offset was removed after the range check
                    self._head_removed(offset, segs)
                if offset >= stop:
                    return max(offset, stop)    # the gap before this live segment is real
                status, nxt = seg.read_columns(offset, stop, cols, max_records, max_data, verify_crc)
            except SegmentGoneError:
                # deleted or replaced under us: go on with the current segments from where the
                # records stopped (the segment before may have been short of its end), or raise
                # OffsetOutOfRangeError if that offset is gone
                self._segment_gone(seg)
                offset = resume
                self._check_range(offset)
                stop = min(stop_offset, self._leo)
                if offset >= stop:
                    return offset
                segs = self._segments
                i = segs.floor_index(offset)
                continue
            if status is ColumnsEnd.LIMIT:
                return nxt
            if status is ColumnsEnd.STOP:
                return stop
            resume = max(resume, nxt)
            if i + 1 >= len(segs):
                # the range existed when the call began: a last segment short of stop was cut
                # by a truncation meanwhile; the caller goes on where its records stopped
                return min(resume, stop)
            # the next segment of the SAME list: a truncation that cut this one closed it
            # first (SegmentGoneError above). Its base taken to a newer list could lie inside
            # this segment grown again, skipping the offsets between.
            i += 1
            offset = max(resume, segs[i].base_offset)
