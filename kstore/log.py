"""One partition's log (Kafka's UnifiedLog + LocalLog + LogLoader, for a single node).

Offsets: log_start_offset <= recovery_point <= log_end_offset; high_watermark equals
log_end_offset in this single-node engine. One writer and any number of reader threads: the
writer serialises on a lock and publishes new segment lists and sizes by replacing them, so a
reader always sees whole batches.
"""
from __future__ import annotations

import bisect
import errno
import functools
import itertools
import json
import logging
import os
import random
import threading
from typing import Any, Iterable, Iterator, Mapping, Optional

import numpy as np

from kstore import _core
from kstore.clock import SYSTEM_TIME
from kstore.config import LogConfig
from kstore._core import log_offset_for_timestamp as _log_offset_for_timestamp
from kstore._core import log_read as _log_read
from kstore.errors import (CorruptRecordError, KafkaStorageError, KStoreError, KStoreStateError,
                           LogDirLockedError, LogSegmentOffsetOverflowError,
                           OffsetOutOfRangeError, RecordTooLargeError, SegmentGoneError,
                           UnknownTopicError, with_path)
from kstore.fileio import FileOps, get_file_ops
from kstore.files import (CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIXES, LOG_SUFFIX,
                          SWAP_SUFFIX, TIME_INDEX_SUFFIX, INDEX_SUFFIX, parse_name, segment_file)
from kstore.segment import LogSegment
from kstore.segment_ro import ReadOnlySegment

log = logging.getLogger("kstore.log")

#: Written in a standalone (unmanaged) log's directory by close(); its presence at open means
#: the log was closed cleanly. Kafka brokers ignore unknown files in a partition directory.
STANDALONE_CLEAN_MARKER = ".kstore-clean-shutdown"
#: A log dir's lock file: its LogManager holds it exclusively, a standalone writable Log of one
#: of its partitions holds it shared (and flocks the partition directory itself exclusively).
LOG_DIR_LOCK = ".lock"
DEFAULT_MAX_BYTES = 1 << 20
INT32_MAX = (1 << 31) - 1
_TS_CLAMP = 1 << 62

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


def split_rows(sizes: np.ndarray, start: int, stop: int, budget: int) -> list[tuple[int, int]]:
    """Consecutive row ranges of [start, stop) whose summed sizes stay within budget (a range
    holds at least one row). One Python step per range, not per row."""
    out = []
    if stop <= start:
        return out
    cs = np.cumsum(sizes[start:stop])
    pos = 0
    n = stop - start
    while pos < n:
        base = cs[pos - 1] if pos else 0
        j = int(np.searchsorted(cs, base + budget, side="right"))
        j = max(j, pos + 1)
        out.append((start + pos, start + j))
        pos = j
    return out


def _failed_error(log_dir: str, failed: str) -> KafkaStorageError:
    return KafkaStorageError(errno.EIO, f"log {log_dir} failed after an I/O error ({failed}); "
                             f"reopen it once the disk is fixed")


def _storage_error(log_dir: str, e: OSError) -> KafkaStorageError:
    """e as a KafkaStorageError naming the log (e itself if it already is one)."""
    if isinstance(e, KafkaStorageError):
        return e
    err = KafkaStorageError(e.errno or errno.EIO, f"{e.strerror or e} (log {log_dir})")
    err.__cause__ = e
    return err


def _storage_op(fn):
    """A write-side Log operation: an OSError fails the log (Kafka's offline log dir) and is
    raised as KafkaStorageError naming it; later writes are refused without touching the disk.
    (append inlines the same steps: it is the hot path.)"""
    @functools.wraps(fn)
    def op(self, *args, **kw):
        if self._failed is not None:
            raise _failed_error(self.dir, self._failed)
        try:
            return fn(self, *args, **kw)
        except OSError as e:
            self._failed = str(e)
            raise _storage_error(self.dir, e) from e
    return op


class Log:
    """A partition directory of segments. Open with ``Log.open``; use as a context manager."""

    def __init__(self, dir_: str, config: LogConfig, *, io: FileOps, time, scheduler=None,
                 managed: bool = False, read_only: bool = False):
        self.dir = dir_
        self._config = config
        self._io = io
        self._time = time
        self._scheduler = scheduler
        self._managed = managed
        self.read_only = read_only
        self._lock = threading.RLock()
        self._flush_lock = threading.Lock()
        self._rng = random.Random()
        self._bases: list[int] = []
        self._views: list = []
        self._segs: list[LogSegment] = []
        self._leo = 0
        self._log_start_offset = 0
        self._recovery_point = 0
        self._builder = _core.BatchBuilder()
        self._closed = False
        self._failed: Optional[str] = None     # the I/O error that failed this log
        self._deferred: list = []     # fsyncs and hand-offs queued under _lock, run after it
        self._truncations = 0         # bumped by every truncation (a flush in flight is void)
        self._lock_fds: list[int] = []    # flocks of a standalone writable log (_take_locks)
        self._ts_window_cfg = None
        self._ts_window_cache = (0, 0)
        self._last_flush_ms = time.milliseconds()
        self.recovery_report: list[dict] = []

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike, config: Optional[Mapping[str, Any] | LogConfig] = None, *,
             recovery_point: Optional[int] = None, log_start_offset: Optional[int] = None,
             clean_shutdown: Optional[bool] = None, io: Optional[FileOps] = None, time=None,
             scheduler=None, read_only: bool = False) -> "Log":
        """Open (creating if missing) the partition directory at path.

        A log owned by a LogManager passes recovery_point, log_start_offset and clean_shutdown
        from its checkpoints. A standalone log keeps a clean-shutdown marker in its directory:
        after a clean close it opens without recovery; otherwise every segment is validated and
        the invalid tail cut, as Kafka does for a log with no recovery checkpoint.

        read_only=True writes nothing (no recovery, no marker, no index resizing): the valid end
        of each segment is found by a CRC-validating scan, so a batch that another process is
        still writing is never returned; refresh() (or a read at the end) picks up new data.
        """
        cfg = config if isinstance(config, LogConfig) else LogConfig(config)
        io = io or get_file_ops()
        time = time or SYSTEM_TIME
        path = os.fspath(path)
        managed = clean_shutdown is not None
        log_ = cls(path, cfg, io=io, time=time, scheduler=scheduler, managed=managed,
                   read_only=read_only)
        if read_only:
            log_._load_read_only(log_start_offset)
        else:
            try:
                if not managed:
                    log_._create_dir()
                    log_._take_locks()
                log_._load(recovery_point, log_start_offset, clean_shutdown)
            except OSError as e:
                log_.close_handlers()
                if isinstance(e, KStoreError) or e.errno in (errno.ENOENT, errno.EACCES, errno.ENOTDIR):
                    raise                # a wrong path, not a failing disk
                raise _storage_error(log_.dir, e) from e
            except BaseException:
                # a refused file, a lock held elsewhere, corruption: no mapping, descriptor or
                # lock outlives the failed open
                log_.close_handlers()
                raise
        return log_

    # -- read-only -------------------------------------------------------------------------
    def _load_read_only(self, log_start_offset: Optional[int]) -> None:
        if not self._io.exists(self.dir):
            raise KStoreError(f"partition directory {self.dir} does not exist (read-only open)")
        self._set_segments([])
        self.refresh(log_start_offset)

    def refresh(self, log_start_offset: Optional[int] = None) -> None:
        """Read-only logs: pick up segments and batches another process added, segments it
        deleted and files it replaced (compaction, truncation: a new segment reads the new
        file; readers still holding the old one finish on it). A no-op for a writable log.
        UnknownTopicError if the partition directory itself is gone (topic deleted)."""
        if not self.read_only:
            return
        with self._lock:
            for _attempt in range(50):
                segs = self._scan_segments()
                if segs is not None:
                    break
            else:
                raise SegmentGoneError(f"the segments of {self.dir} keep changing; try again")
            self._set_segments(segs)
            self._leo = segs[-1].read_next_offset() if segs else (log_start_offset or 0)
            start = max(log_start_offset or 0, self._log_start_offset, segs[0].base_offset if segs else 0)
            self._log_start_offset = min(start, self._leo)
            self._recovery_point = self._leo

    def _scan_segments(self) -> Optional[list[LogSegment]]:
        """The directory's segments, the last one (and every one validated before) validated
        now; None if one vanished meanwhile (the caller lists again). Segments dropped from the
        list are not closed: a reader thread may still be reading them."""
        present = self._list_segment_bases()
        old = {s.base_offset: s for s in self._segs}
        segs = []
        try:
            for base in present:
                seg = old.get(base)
                segs.append(seg if seg is not None and not seg.closed else self._ro_segment(base))
            for i, seg in enumerate(segs):
                # the last segment is validated now and re-validated whenever its file length
                # differs from what was validated (it grows; one that was last may have grown
                # before its roll); the others are validated when a read first maps them
                last = i == len(segs) - 1
                seg.ro_next_base = None if last else segs[i + 1].base_offset
                if (seg.ro_scanned or last) and not seg.refresh_read_only(last):
                    segs[i] = seg = self._ro_segment(seg.base_offset)     # the file was replaced
                    seg.ro_next_base = None if last else segs[i + 1].base_offset
                    if last:
                        seg.refresh_read_only(last)
        except (SegmentGoneError, FileNotFoundError):
            return None
        # a listing taken while the writer deletes or creates segments can miss one in the
        # middle (readdir is not atomic); one that still holds after the validations is a
        # view of one moment (the writer deletes tail segments last-first, see truncate_to)
        if self._list_segment_bases() != present:
            return None
        return segs

    def _list_segment_bases(self) -> list[int]:
        """Base offsets of the live .log files in the directory, sorted."""
        try:
            names = self._io.listdir(self.dir)
        except FileNotFoundError:
            raise UnknownTopicError(f"partition directory {self.dir} was deleted") from None
        return sorted(p[0] for p in (parse_name(n, self.dir) for n in names)
                      if p and not p[2] and p[1] == LOG_SUFFIX)

    def _ro_segment(self, base: int) -> ReadOnlySegment:
        return ReadOnlySegment(self.dir, base, self._config, io=self._io, time=self._time,
                               rng=self._rng)

    def _take_locks(self) -> None:
        """A standalone writable open excludes every other writer of the partition: the
        partition directory flocked exclusively (another standalone Log, in this process or
        another; no file is added to Kafka's directory) and the parent log dir's `.lock` shared
        (a LogManager holds it exclusively). Held until close or close_handlers."""
        parent = os.path.dirname(os.path.abspath(self.dir))
        fd = self._io.try_lock(os.path.join(parent, LOG_DIR_LOCK), shared=True)
        if fd is None:
            raise LogDirLockedError(
                f"cannot open {self.dir} for writing: a LogManager owns its log dir {parent} "
                f"(in this process or another); append through it, or open read-only")
        self._lock_fds.append(fd)
        fd = self._io.try_lock(self.dir, directory=True)
        if fd is None:
            raise LogDirLockedError(
                f"cannot open {self.dir} for writing: another writer (a Log in this process or "
                f"another) has it open; close it first, or open read-only")
        self._lock_fds.append(fd)

    def _release_locks(self) -> None:
        fds, self._lock_fds = self._lock_fds, []
        for fd in fds:
            try:
                self._io.unlock(fd)
            except OSError:
                pass          # the descriptor is gone either way: so is its lock

    def _create_dir(self) -> None:
        if not self._io.exists(self.dir):
            parent = os.path.dirname(os.path.abspath(self.dir))
            if not self._io.exists(parent):
                os.makedirs(parent, exist_ok=True)
            self._io.mkdir(self.dir)
            self._io.fsync_dir(parent)

    def _load(self, recovery_point, log_start_offset, clean_shutdown) -> None:
        io = self._io
        self._create_dir()
        marker = os.path.join(self.dir, STANDALONE_CLEAN_MARKER)
        if clean_shutdown is None:
            # standalone: the marker is deleted before loading, so a crash during this open
            # is itself recovered next time (KAFKA-10471)
            clean_shutdown = False
            if io.exists(marker):
                try:
                    info = json.loads(io.read_file(marker).decode())
                    if log_start_offset is None and isinstance(info.get("log_start_offset"), int):
                        log_start_offset = info["log_start_offset"]
                    clean_shutdown = True
                except (ValueError, OSError, AttributeError):
                    log.warning("ignoring unreadable clean-shutdown marker %s", marker)
                io.unlink(marker)
                io.fsync_dir(self.dir)
        self._remove_temp_files_and_swap()
        segs = self._load_segment_files()
        # Kafka: logStart = max(checkpoint, first base)
        start = log_start_offset or 0
        if segs:
            start = max(start, segs[0].base_offset)
        self._set_segments(segs)
        if recovery_point is None:
            recovery_point = 0
        self._recover_missing_indexes()
        segs = self._segs
        if clean_shutdown:
            self._leo = segs[-1].read_next_offset() if segs else start
        else:
            self._recover_log(recovery_point)
            segs = self._segs
        if segs and self._leo < start:
            # LEO below the checkpointed start: everything is gone (testLogEndLessThanStartAfterReopen)
            for s in segs:
                s.delete()
            self._set_segments([])
            segs = []
        if not segs:
            seg = LogSegment(self.dir, start, self._config, io=io, time=self._time, rng=self._rng)
            self._set_segments([seg])
            self._leo = start
            io.fsync_dir(self.dir)
        self._log_start_offset = start if start <= self._leo else self._leo
        # clean: everything is durable; unclean: Kafka's min(checkpoint, LEO). Offsets below the
        # first segment do not exist, so the point is never below its base.
        self._recovery_point = self._leo if clean_shutdown else min(recovery_point, self._leo)
        self._recovery_point = max(self._recovery_point, self._segs[0].base_offset)
        self._segs[-1].make_active()

    def _remove_temp_files_and_swap(self) -> None:
        """Kafka's LogLoader step 1-2: drop .deleted and .cleaned files, finish .swap renames."""
        io = self._io
        names = io.listdir(self.dir)
        swaps, cleaned_offsets = [], []
        for name in names:
            p = parse_name(name, self.dir)
            path = os.path.join(self.dir, name)
            if name.endswith((DELETED_SUFFIX, ".tmp")):
                io.unlink(path)          # .tmp: an atomic write (marker, metadata) cut short
            elif name.endswith(CLEANED_SUFFIX):
                if p:
                    cleaned_offsets.append(p[0])
                io.unlink(path)
            elif name.endswith(SWAP_SUFFIX) and p:
                swaps.append((p[0], p[1], path))
        min_cleaned = min(cleaned_offsets) if cleaned_offsets else None
        live_swaps = []
        for base, suffix, path in swaps:
            if min_cleaned is not None and base >= min_cleaned:
                io.unlink(path)     # a clean that did not finish swapping: discard it
            else:
                live_swaps.append((base, suffix, path))
        for base, suffix, _path in sorted(live_swaps):
            if suffix != LOG_SUFFIX:
                continue
            swap_seg = LogSegment(self.dir, base, self._config, io=io, time=self._time,
                                  rng=self._rng, file_already_exists=True, suffix=SWAP_SUFFIX)
            try:
                end = swap_seg.read_next_offset()
            finally:
                swap_seg.close_handlers()
            # delete the segments the swap replaces: [base, end)
            for name in io.listdir(self.dir):
                p = parse_name(name, self.dir)
                if p and not p[2] and base <= p[0] < end:
                    io.unlink(os.path.join(self.dir, name))
        for _base, _suffix, path in live_swaps:
            if io.exists(path):
                io.rename(path, path[: -len(SWAP_SUFFIX)])
        if live_swaps:
            io.fsync_dir(self.dir)

    def _load_segment_files(self) -> list[LogSegment]:
        io = self._io
        names = sorted(io.listdir(self.dir))
        logs, indexes = set(), []
        for name in names:
            p = parse_name(name, self.dir)
            if not p or p[2]:
                continue
            if p[1] == LOG_SUFFIX:
                logs.add(p[0])
            elif p[1] in INDEX_SUFFIXES:
                indexes.append((p[0], name))
        for base, name in indexes:
            if base not in logs:
                log.warning("deleting orphaned index file %s", os.path.join(self.dir, name))
                io.unlink(os.path.join(self.dir, name))
        segs = []
        present = set(names)
        for base in sorted(logs):
            seg = LogSegment(self.dir, base, self._config, io=io, time=self._time, rng=self._rng,
                             file_already_exists=True)
            # Kafka: a missing .index means recovery; a missing .timeindex is recreated too
            prefix = f"{base:020d}"
            seg.needs_recovery = (prefix + INDEX_SUFFIX not in present
                                  or prefix + TIME_INDEX_SUFFIX not in present)
            segs.append(seg)
        return segs

    def _recover_log(self, recovery_point: int) -> None:
        """Unclean shutdown: recover segments from floor(recovery_point) onward (Kafka's
        recoverLog); after the first segment that loses bytes to corruption, later segments go."""
        segs = list(self._segs)
        bases = [s.base_offset for s in segs]
        i = max(0, bisect.bisect_right(bases, recovery_point) - 1)
        kept = segs[:i]
        todo = segs[i:]
        truncated = False
        while todo:
            seg = todo.pop(0)
            if truncated:
                seg.delete()
                continue
            try:
                res = self._recover_segment(seg, todo[0].base_offset if todo else None)
            except LogSegmentOffsetOverflowError:
                todo[:0] = self._split_overflowed_segment(seg)
                continue
            kept.append(seg)
            if res["truncated_bytes"] > 0 and not (not todo and res["tail_zero"]):
                if todo:
                    log.warning("corruption in segment %s (%s): deleting %d later segment(s)",
                                seg.log_path, res["reason"], len(todo))
                truncated = True
        self._set_segments(kept)
        self._leo = kept[-1].read_next_offset() if kept else 0

    def _recover_missing_indexes(self) -> None:
        """Segments whose .index or .timeindex is missing are recovered whatever the shutdown."""
        segs = list(self._segs)
        out = []
        for seg in segs:
            if getattr(seg, "needs_recovery", False):
                try:
                    self._recover_segment(seg)
                except LogSegmentOffsetOverflowError:
                    for piece in self._split_overflowed_segment(seg):
                        self._recover_segment(piece)
                        out.append(piece)
                    continue
            out.append(seg)
        self._set_segments(out)

    def split_overflowed_segment(self, seg: LogSegment) -> list[LogSegment]:
        """Public form of the split (Kafka's splitOverflowedSegment) for a loaded segment."""
        with self._lock:
            pieces = self._split_overflowed_segment(seg)
            segs = [s for s in self._segs if s is not seg] + pieces
            segs.sort(key=lambda s: s.base_offset)
            for piece in pieces:
                self._recover_segment(piece)
            self._set_segments(segs)
            if pieces and segs[-1] in pieces:
                segs[-1].make_active()
            return pieces

    def _split_overflowed_segment(self, seg: LogSegment) -> list[LogSegment]:
        """Rewrite a segment whose offsets do not fit 32-bit relative offsets as several
        segments, each named by its first batch's base offset (KAFKA-6264), crash-safely:
        write .cleaned files, rename them to .swap, retire the old files, drop the suffix."""
        io = self._io
        log.warning("splitting segment %s: offsets overflow its relative-offset range", seg.log_path)
        seg.close_handlers()
        fd = io.open(seg.log_path, os.O_RDONLY)
        try:
            flen = io.size(fd)
            m = io.map(fd, flen, False)
        finally:
            io.close(fd)
        try:
            groups: list[list[int]] = []
            for pos, base, last, size, *_ in _core.batch_headers(m, 0, flen):
                if not groups or last - groups[-1][0] > INT32_MAX or base < groups[-1][0]:
                    groups.append([base, pos, pos + size])
                else:
                    groups[-1][2] = pos + size
            written = []
            for base, a, b in groups:
                path = segment_file(self.dir, base, LOG_SUFFIX, CLEANED_SUFFIX)
                wfd = io.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                try:
                    io.pwrite(wfd, m.read(a, b - a), 0)
                    io.fsync(wfd)
                finally:
                    io.close(wfd)
                written.append(base)
        finally:
            m.close()
        io.fsync_dir(self.dir)
        for base in sorted(written, reverse=True):
            io.rename(segment_file(self.dir, base, LOG_SUFFIX, CLEANED_SUFFIX),
                      segment_file(self.dir, base, LOG_SUFFIX, SWAP_SUFFIX))
        io.fsync_dir(self.dir)
        seg.change_file_suffixes("", DELETED_SUFFIX)
        seg.delete()
        for base in written:
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                stale = segment_file(self.dir, base, suffix)
                if io.exists(stale):
                    io.unlink(stale)
            io.rename(segment_file(self.dir, base, LOG_SUFFIX, SWAP_SUFFIX),
                      segment_file(self.dir, base, LOG_SUFFIX))
        io.fsync_dir(self.dir)
        pieces = []
        for base in written:
            piece = LogSegment(self.dir, base, self._config, io=io, time=self._time, rng=self._rng,
                               file_already_exists=True)
            piece.needs_recovery = True
            pieces.append(piece)
        return pieces

    def _recover_segment(self, seg: LogSegment, upper_bound: Optional[int] = None) -> dict:
        res = seg.recover(upper_bound)
        res["segment"] = seg.log_path
        if res["truncated_bytes"] and not res["tail_zero"]:
            log.warning("recovered %s: truncated %d invalid bytes (%s)", seg.log_path,
                        res["truncated_bytes"], res["reason"])
        self.recovery_report.append({k: v for k, v in res.items()
                                     if k not in ("offset_entries", "time_entries")})
        seg.needs_recovery = False
        return res

    # -- state -----------------------------------------------------------------------------
    def _set_segments(self, segs: list[LogSegment]) -> None:
        # readers take (_bases, _views, _segs) without the lock: publish whole new lists
        self._views = [s.view for s in segs]
        self._bases = [s.base_offset for s in segs]
        self._segs = list(segs)

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def rng(self) -> random.Random:
        """The random source of this log's segments' roll jitter (segment.jitter.ms); a segment
        made for this log elsewhere (the cleaner's `.cleaned` one) draws from it too."""
        return self._rng

    def update_config(self, config: Mapping[str, Any] | LogConfig) -> None:
        cfg = config if isinstance(config, LogConfig) else LogConfig(config)
        with self._lock:
            self._config = cfg
            for s in self._segs:
                s.set_config(cfg)

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segs)

    @property
    def active_segment(self) -> LogSegment:
        return self._segs[-1]

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._leo

    @property
    def high_watermark(self) -> int:
        return self._leo

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size(self) -> int:
        """Bytes in every segment's .log."""
        return sum(s.size for s in self._segs)

    @property
    def closed(self) -> bool:
        return self._closed

    def _check_open(self) -> None:
        if self._closed:
            raise KStoreStateError(f"log {self.dir} is closed")

    def _check_writable(self) -> None:
        self._check_open()
        if self.read_only:
            raise KStoreStateError(f"log {self.dir} is open read-only")

    # -- append ----------------------------------------------------------------------------
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
                raise _failed_error(self.dir, self._failed)
            cfg = self._config
            now = self._time.milliseconds()
            b = self._builder
            b.compression_level = cfg.compression_level
            before, after = self._ts_window
            n = b.build(records, cfg.magic, self._leo, now, cfg.log_append_time,
                        now - before, now + after, cfg.compact, cfg.codec)
            if n == 0:
                return _core.empty_append_info(self._leo)
            try:
                self._append_built(b, cfg, now)
            except OSError as e:         # _storage_op, inlined on the hot path
                self._failed = str(e)
                raise _storage_error(self.dir, e) from e
            if not self._deferred and self._leo - self._recovery_point < cfg.flush_messages:
                return b.info(now if cfg.log_append_time else -1)     # the usual case
            info = b.info(now if cfg.log_append_time else -1)
            deferred = self._take_deferred()
            due = self._leo - self._recovery_point >= cfg.flush_messages
        self._after_write(deferred, due)
        return info

    def _take_deferred(self) -> list:
        """The post-lock actions queued so far (lock held), leaving none queued."""
        deferred = self._deferred
        if deferred:
            self._deferred = []
        return deferred

    def _after_write(self, deferred: list, flush_due: bool = False) -> None:
        """Run, with no lock held, what a write left for after the lock: the fsyncs and
        scheduler hand-offs of a roll or a deletion (in order), then the flush.messages flush.
        An I/O error fails the log, as in the write itself."""
        try:
            for action in deferred:
                action()
            if flush_due:
                self.flush()
        except OSError as e:
            self._failed = self._failed or str(e)
            raise _storage_error(self.dir, e) from e

    @_storage_op
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
                    pos += b.load_batch(view, pos, self._leo, now if cfg.log_append_time else -1)
                    self._append_built(b, cfg, now)
                    count += b.count
            finally:
                deferred = self._take_deferred()
                due = self._leo - self._recovery_point >= cfg.flush_messages
        self._after_write(deferred, due and count > 0)
        return first, count

    @_storage_op
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
                                now - before, now + after, cfg.compact, cfg.codec)
                    else:
                        b.build_columns(lo, hi, cols, self._leo, now, cfg.log_append_time,
                                        now - before, now + after, cfg.compact, cfg.codec)
                    self._append_built(b, cfg, now)
            finally:
                deferred = self._take_deferred()
                due = self._leo - self._recovery_point >= cfg.flush_messages
            count = self._leo - first
        self._after_write(deferred, due and count > 0)
        return first, count

    def _append_built(self, b: _core.BatchBuilder, cfg: LogConfig, now: int) -> None:
        """Write the batch the builder holds at the log end (lock held): size limits, roll if
        any roll condition holds, segment append, log end offset."""
        size = b.size
        if b.max_entry_size > cfg.max_message_bytes or size > cfg.segment_bytes:
            self._too_large(b)
        seg = self._segs[-1]
        last = b.last_offset
        if seg.should_roll(size, b.max_timestamp, last, now):
            seg = self._roll_locked(b.base_offset)
        seg.append(b, last, b.max_timestamp, b.offset_of_max_timestamp)
        self._leo = last + 1

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
            self._ts_window_cache = (min(cfg.timestamp_before_max_ms, _TS_CLAMP),
                                     min(cfg.timestamp_after_max_ms, _TS_CLAMP))
            self._ts_window_cfg = cfg
        return self._ts_window_cache

    # -- roll ------------------------------------------------------------------------------
    @_storage_op
    def roll(self, expected_next_offset: Optional[int] = None) -> LogSegment:
        """Start a new active segment at max(expected_next_offset, log_end_offset)."""
        with self._lock:
            self._check_writable()
            try:
                seg = self._roll_locked(expected_next_offset)
            finally:
                deferred = self._take_deferred()
        self._after_write(deferred)
        return seg

    def _roll_locked(self, expected_next_offset: Optional[int]) -> LogSegment:
        io = self._io
        new_offset = max(expected_next_offset or 0, self._leo)
        active = self._segs[-1]
        if new_offset in self._bases:
            if active.base_offset == new_offset and active.size == 0:
                # KAFKA-6388: an empty active segment at the same offset is recreated
                log.warning("rolling to existing empty segment %s: recreating it", active.log_path)
                active.delete()
                self._set_segments(self._segs[:-1])
            else:
                raise KStoreError(
                    f"Trying to roll a new log segment for {self.dir} with start offset {new_offset} "
                    f"while it already exists.")
        elif new_offset < active.base_offset:
            raise KStoreError(
                f"Trying to roll a new log segment for {self.dir} with start offset {new_offset} "
                f"=max(provided offset = {expected_next_offset}, LEO = {self._leo}) lower than the "
                f"start offset of the active segment {active.base_offset}")
        else:
            for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                path = segment_file(self.dir, new_offset, suffix)
                if io.exists(path):
                    log.warning("newly rolled segment file %s already exists; deleting it first", path)
                    io.unlink(path)
            active.on_become_inactive()
            if self._leo <= self._recovery_point:
                # its data is durable already, so no later flush covers it (a flush starts at the
                # recovery point): make the trim durable now, before the new segment exists, or
                # a power loss brings the preallocated zeros back below the recovery point,
                # where recovery never looks (the crash harness finds that state if this waits
                # until after the lock). The one fsync under _lock, and only when there is
                # nothing unflushed. Otherwise the flush up to the new segment covers it.
                active.flush()
        seg = LogSegment(self.dir, new_offset, self._config, io=io, time=self._time, rng=self._rng)
        seg.make_active()
        self._set_segments(self._segs + [seg])
        # Kafka flushes everything below the new segment asynchronously on the scheduler; both
        # the fsyncs and the hand-off happen after the log lock is released (_after_write)
        if self._scheduler is not None:
            scheduler = self._scheduler
            self._deferred.append(lambda: scheduler.schedule_once(
                "flush-log", lambda: self._flush_after_roll(new_offset)))
        else:
            self._deferred.append(lambda: self.flush(new_offset))
        return seg

    def _flush_after_roll(self, offset: int) -> None:
        """The scheduled flush of a roll: nothing to do once the log is closed (a clean close
        flushed it; a deleted topic's log has nowhere to flush to)."""
        if not self._closed:
            self.flush(offset)

    # -- read ------------------------------------------------------------------------------
    def _segment_for(self, offset: int) -> int:
        return bisect.bisect_right(self._bases, offset) - 1

    def _check_range(self, offset: int) -> None:
        if offset < self._log_start_offset or offset > self._leo:
            raise OffsetOutOfRangeError(
                f"offset {offset} is out of range for {self.dir}: log start offset "
                f"{self._log_start_offset}, log end offset {self._leo}")

    def read(self, offset: int, max_records: Optional[int] = None,
             max_bytes: int = DEFAULT_MAX_BYTES, *, verify_crc: bool = True) -> list[_core.Record]:
        """Records from `offset` on: at most max_records, from batches totalling at most
        max_bytes (but always at least one batch). Empty at the log end."""
        if offset >= self._leo or offset < self._log_start_offset:
            if self.read_only:
                self.refresh()
            if offset == self._leo:
                self._check_corrupt_end()
                return []
            if offset > self._leo or offset < self._log_start_offset:
                self._check_range(offset)
        limit = (1 << 62) if max_records is None else max_records
        out: list[_core.Record] = []
        used = 0
        start = offset
        first = self._segs
        while True:        # _read_run, inlined on the hot path
            bases, views, segs = self._bases, self._views, self._segs
            try:
                need = _log_read(bases, views, offset, limit, max_bytes, verify_crc, out, used)
            except CorruptRecordError as e:
                raise with_path(e, segs[e.segment].log_path) from None
            if need is None or not segs:
                if self._segs is first:
                    return out
                break
            i, offset, used = need
            try:
                self._prepare_for_read(offset, segs[i:])
            except OffsetOutOfRangeError:
                if self._segs is first:
                    raise
                break
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
                if offset >= self._leo or offset < self._log_start_offset:
                    if self.read_only:
                        self.refresh()
                    if offset == self._leo:
                        self._check_corrupt_end()
                        return []
                    self._check_range(offset)
                out = self._read_run(offset, limit, max_bytes, verify_crc)
                if out is not None:
                    return out
            finally:
                if attempt == 3:
                    self._lock.release()
        raise SegmentGoneError(f"the segments of {self.dir} kept changing during a read; try again")

    def _read_run(self, offset: int, limit: int, max_bytes: int,
                  verify_crc: bool) -> Optional[list[_core.Record]]:
        """read()'s loop over the published segment lists; None if the list changed meanwhile
        (the caller reads again)."""
        out: list[_core.Record] = []
        used = 0
        first = self._segs
        while True:
            bases, views, segs = self._bases, self._views, self._segs
            try:
                need = _log_read(bases, views, offset, limit, max_bytes, verify_crc, out, used)
            except CorruptRecordError as e:
                raise with_path(e, segs[e.segment].log_path) from None
            if need is None or not segs:
                return out if self._segs is first else None
            # a segment not mapped yet: map it and go on from there (what was read is kept)
            i, offset, used = need
            try:
                self._prepare_for_read(offset, segs[i:])
            except OffsetOutOfRangeError:
                if self._segs is first:
                    raise
                return None

    def _prepare_for_read(self, offset: int, segs: list[LogSegment]) -> None:
        """Map the first segment of segs that holds offset or follows it, and load its index
        (lazy open; a read-only segment is validated then). One per call, so a read maps only the
        segments it reaches. A segment deleted under the reader (retention, truncation) sends it
        back for a fresh segment list, or raises OffsetOutOfRangeError if the offset is gone."""
        if self._closed:
            self._check_open()
        i = max(0, bisect.bisect_right([s.base_offset for s in segs], offset) - 1)
        for seg in segs[i:]:
            try:
                if seg.closed:
                    raise SegmentGoneError(f"segment {seg.log_path} was deleted")
                if not seg.view.is_ready:
                    seg.mapping()
                    seg.offset_index
                    return
            except SegmentGoneError:
                self._segment_gone(seg)
                self._check_range(offset)
                return

    def _check_corrupt_end(self) -> None:
        """A read-only view that ends where its last segment holds an invalid batch followed by
        valid ones: a read at the end reaches the corruption (CorruptRecordError)."""
        segs = self._segs
        if self.read_only and segs and segs[-1].view.corrupt is not None:
            segs[-1].raise_corrupt()

    def _locate(self, offset: int) -> tuple[list[LogSegment], int]:
        """(segments, index of the one holding offset) from one published list: _bases and _segs
        are replaced one after the other, so bases that do not match the list are rebuilt."""
        segs, bases = self._segs, self._bases
        if len(bases) != len(segs) or (segs and (bases[0] != segs[0].base_offset
                                                 or bases[-1] != segs[-1].base_offset)):
            bases = [s.base_offset for s in segs]
        return segs, max(0, bisect.bisect_right(bases, offset) - 1)

    def _segment_gone(self, seg: LogSegment) -> None:
        """A read met seg deleted or replaced (or its mapping swapped) under it. Waiting for the
        log lock lets the change in progress finish publishing the new segments (the writer
        holds it while it deletes, truncates or swaps segments); a read-only log rescans its
        directory. The caller then retries on the current segments (or raises
        OffsetOutOfRangeError if its offset is gone)."""
        with self._lock:
            self._check_open()
            if any(s is seg for s in self._segs):
                if self.read_only:
                    self.refresh()
                elif seg.closed:
                    raise KStoreStateError(f"segment {seg.log_path} of {self.dir} is closed")
                # else only its mapping was swapped (roll, truncation): a retry takes the new one

    def read_batches(self, offset: int, max_bytes: int = DEFAULT_MAX_BYTES) -> memoryview:
        """Whole raw batches from the one holding offset, as a zero-copy view (one segment)."""
        while True:
            self._check_range(offset)
            if offset == self._leo:
                return memoryview(b"")
            segs, i = self._locate(offset)
            try:
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
        resume = offset          # everything below it is in cols
        while offset < stop:
            segs, i = self._locate(offset)
            seg = segs[i]
            try:
                if seg.closed:
                    raise SegmentGoneError(f"segment {seg.log_path} was deleted")
                status, nxt = seg.read_columns(offset, stop, cols, max_records, max_data, verify_crc)
            except SegmentGoneError:
                # deleted or replaced under us: go on with the current segments from where the
                # records stopped (the segment before may have been short of its end), or raise
                # OffsetOutOfRangeError if that offset is gone
                self._segment_gone(seg)
                offset = resume
                self._check_range(offset)
                stop = min(stop_offset, self._leo)
                continue
            if status == "limit":
                return nxt
            if status == "stop":
                return stop
            if i + 1 >= len(segs):
                return stop
            resume = max(resume, nxt)
            offset = max(offset, segs[i + 1].base_offset)
        return max(offset, stop)

    def __iter__(self) -> Iterator[_core.Record]:
        """Every record from log_start_offset to the end as of each chunk read."""
        return itertools.chain.from_iterable(self.iter_chunks())

    def iter_chunks(self, start: Optional[int] = None,
                    max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[list[_core.Record]]:
        """Records from start (default log_start_offset) in lists of about max_bytes of batches."""
        offset = self._log_start_offset if start is None else start
        while offset < self._leo:
            if offset < self._log_start_offset:
                offset = self._log_start_offset
            chunk = self.read(offset, max_bytes=max_bytes)
            if not chunk:
                # nothing at or after offset in this segment (a gap): skip to the next one
                i = self._segment_for(offset)
                if i + 1 >= len(self._segs):
                    return
                offset = self._segs[i + 1].base_offset
                continue
            yield chunk
            offset = chunk[-1].offset + 1

    def offset_for_timestamp(self, timestamp: int) -> Optional[int]:
        """First offset whose timestamp >= timestamp (None past the end); -1 latest,
        -2 earliest, -3 the offset of the max timestamp."""
        r = self.fetch_offset_by_timestamp(timestamp)
        return None if r is None else r[0]

    def fetch_offset_by_timestamp(self, timestamp: int) -> Optional[tuple[int, int]]:
        """(offset, timestamp) as Kafka's fetchOffsetByTimestamp (timestamp -1 for the specials
        -1 and -2)."""
        segs = self._segs
        if timestamp == LATEST_TIMESTAMP:
            return (self._leo, -1)
        if timestamp == EARLIEST_TIMESTAMP:
            return (self._log_start_offset, -1)
        if timestamp == MAX_TIMESTAMP:
            while True:
                try:
                    return self._offset_of_max_timestamp(self._segs)
                except SegmentGoneError as e:
                    self._segment_gone(e.segment)
        if timestamp < 0:
            raise OffsetOutOfRangeError(f"unsupported special timestamp {timestamp}")
        start = self._log_start_offset
        while True:
            views, segs = self._views, self._segs
            try:
                r = _log_offset_for_timestamp(views, timestamp, start)
            except CorruptRecordError as e:
                raise with_path(e, segs[e.segment].log_path) from None
            if r is not None:
                return r or None
            # map and load what the fast path found missing, then retry on fresh segment lists
            # (a segment deleted meanwhile is gone from them; a closed log raises)
            self._check_open()
            for seg in segs:
                try:
                    if seg.size and not seg.closed:
                        seg.mapping()
                        seg.offset_index
                        seg.time_index
                        seg._load_max_timestamp()
                except SegmentGoneError:
                    self._segment_gone(seg)
                    break

    def _offset_of_max_timestamp(self, segs) -> Optional[tuple[int, int]]:
        best = None
        seg = None
        try:
            for seg in segs:
                if seg.size == 0:
                    continue
                ts = seg.max_timestamp_so_far
                if ts >= 0 and (best is None or ts > best[0]):
                    best = (ts, seg)
            if best is None:
                return None
            ts, seg = best
            return seg.find_offset_by_timestamp(ts, self._log_start_offset)
        except SegmentGoneError as e:
            e.segment = seg
            raise

    # -- flush -----------------------------------------------------------------------------
    @_storage_op
    def flush(self, offset: Optional[int] = None) -> None:
        """fsync every segment holding offsets in [recovery_point, offset) (default: the log
        end), fsync the directory if any of them is new, and advance the recovery point."""
        if self.read_only:
            return
        with self._flush_lock:
            self._flush_holding_flush_lock(offset)

    def _flush_holding_flush_lock(self, offset: Optional[int]) -> None:
        """flush() with _flush_lock held: the log lock only to read and publish offsets, never
        across an fsync, so appends and rolls go on while the disk works."""
        with self._lock:
            if self._closed:
                return
            end = self._leo if offset is None else min(offset, self._leo)
            rp = self._recovery_point
            if end <= rp:
                return
            bases, segs = self._bases, self._segs
            lo = max(0, bisect.bisect_right(bases, rp) - 1)
            hi = bisect.bisect_left(bases, end)
            to_flush = segs[lo:hi] if hi > lo else []
            if not to_flush and segs:
                to_flush = [segs[max(0, self._segment_for(end - 1))]]
            truncations = self._truncations
        try:
            for s in to_flush:
                s.flush()
            if any(s.base_offset >= rp for s in to_flush):
                self._io.fsync_dir(self.dir)
        except OSError:
            if self._closed:
                # closed under the flush (topic deleted, handlers released): its files are
                # gone or moved on purpose; there is nothing left to make durable
                return
            raise
        with self._lock:
            # a truncation during the fsyncs set the recovery point to its cut: the offsets
            # appended since are not the ones flushed
            if end > self._recovery_point and self._truncations == truncations:
                self._recovery_point = end
            self._last_flush_ms = self._time.milliseconds()

    @property
    def last_flush_time(self) -> int:
        return self._last_flush_ms

    @property
    def unflushed_messages(self) -> int:
        return self._leo - self._recovery_point

    # -- truncation and deletion ---------------------------------------------------------------
    @_storage_op
    def truncate_to(self, target_offset: int) -> bool:
        """Drop every record at or after target_offset (whole batches, as Kafka); returns False
        if there was nothing to drop."""
        if target_offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate {self.dir} to a negative offset {target_offset}")
        with self._lock:
            self._check_writable()
            if target_offset >= self._leo:
                return False
            if self._segs[0].base_offset > target_offset:
                self.truncate_fully_and_start_at(target_offset)
                return True
            keep = [s for s in self._segs if s.base_offset <= target_offset]
            drop = [s for s in self._segs if s.base_offset > target_offset]
            # last first: a reader listing the directory meanwhile sees a shorter log, never
            # one with a hole in the middle
            for s in reversed(drop):
                s.delete()
            new_active = keep[-1]
            # the cut (and a rolled segment taking appends again) gets a new file: readers of
            # the old one keep valid pages and may trust a rolled file to be complete
            new_active.truncate_to(target_offset, replace=not new_active.is_active)
            new_active.make_active()
            self._set_segments(keep)
            self._truncations += 1
            self._leo = target_offset
            self._log_start_offset = min(target_offset, self._log_start_offset)
            self._recovery_point = min(target_offset, self._recovery_point)
            return True

    @_storage_op
    def truncate_fully_and_start_at(self, new_offset: int) -> None:
        """Delete every segment and start empty at new_offset."""
        with self._lock:
            self._check_writable()
            for s in reversed(self._segs):      # last first, as truncate_to
                s.delete()
            seg = LogSegment(self.dir, new_offset, self._config, io=self._io, time=self._time, rng=self._rng)
            seg.make_active()
            self._set_segments([seg])
            self._truncations += 1
            self._io.fsync_dir(self.dir)
            self._leo = self._log_start_offset = self._recovery_point = new_offset

    @_storage_op
    def delete_records(self, offset: int) -> int:
        """Advance log_start_offset to offset (Kafka's DeleteRecords); segments wholly below it
        are deleted. Returns the new log start offset."""
        with self._lock:
            self._check_writable()
            if offset > self._leo:
                raise OffsetOutOfRangeError(
                    f"cannot delete records up to {offset}: beyond the high watermark {self._leo} of {self.dir}")
            if offset > self._log_start_offset:
                self._log_start_offset = offset
            try:
                self._delete_segments(lambda seg, nxt: nxt is not None and nxt <= self._log_start_offset,
                                      "log start offset breach")
            finally:
                deferred = self._take_deferred()
            start = self._log_start_offset
        self._after_write(deferred)
        return start

    @_storage_op
    def delete_old_segments(self) -> int:
        """Retention (Kafka's deleteOldSegments): start-offset breach, then size, then time
        (size and time only with cleanup.policy delete). Returns the segments deleted."""
        with self._lock:
            self._check_writable()
            try:
                n = self._delete_old_segments_locked()
            finally:
                deferred = self._take_deferred()
        self._after_write(deferred)
        return n

    def _delete_old_segments_locked(self) -> int:
        cfg = self._config
        n = self._delete_segments(lambda seg, nxt: nxt is not None and nxt <= self._log_start_offset,
                                  "log start offset breach")
        if not cfg.delete:
            return n
        if cfg.retention_bytes >= 0:
            diff = [self.size - cfg.retention_bytes]

            def size_breach(seg, nxt):
                if diff[0] - seg.size >= 0:
                    diff[0] -= seg.size
                    return True
                return False
            n += self._delete_segments(size_breach, "retention size breach")
        if cfg.retention_ms >= 0:
            now = self._time.milliseconds()
            n += self._delete_segments(lambda seg, nxt: now - seg.largest_timestamp() > cfg.retention_ms,
                                       "retention time breach")
        return n

    def _delete_segments(self, predicate, reason: str) -> int:
        segs = self._segs
        doomed = []
        hw = self._leo
        for i, seg in enumerate(segs):
            nxt = segs[i + 1].base_offset if i + 1 < len(segs) else None
            upper = nxt if nxt is not None else self._leo
            if upper > hw:
                break
            if nxt is None and seg.size == 0:
                break
            if not predicate(seg, nxt):
                break
            doomed.append(seg)
        if not doomed:
            return 0
        if len(doomed) == len(segs):
            # never leave the log without a segment: roll first, then delete all of the old ones
            self._roll_locked(None)
        remaining = [s for s in self._segs if s not in doomed]
        self._set_segments(remaining)
        new_start = remaining[0].base_offset
        if new_start > self._log_start_offset:
            self._log_start_offset = new_start
        for seg in doomed:
            log.info("deleting segment %s (%s)", seg.log_path, reason)
            seg.close_handlers()
            seg.change_file_suffixes("", DELETED_SUFFIX)
        # after the lock, before the caller returns: one directory fsync makes every .deleted
        # rename durable, so deleted segments never come back after a power loss (a
        # crash-harness finding; Kafka leaves this to its checkpoint); then the unlinks
        self._deferred.append(self._sync_dir)
        self._deferred.append(functools.partial(self._delete_later, doomed))
        return len(doomed)

    def _sync_dir(self) -> None:
        """fsync the partition directory after the lock; nothing to do if the log was closed
        meanwhile (a deleted topic's directory has moved)."""
        try:
            self._io.fsync_dir(self.dir)
        except OSError:
            if not self._closed:
                raise

    def _delete_later(self, segs: list[LogSegment]) -> None:
        """Unlink retired (.deleted) segments after file.delete.delay.ms (Kafka), on the
        scheduler when there is one; called with no lock held."""
        if self._scheduler is None:
            for seg in segs:
                seg.delete()
            return
        for seg in segs:
            self._scheduler.schedule_once("delete-file", seg.delete,
                                          delay_ms=self._config.file_delete_delay_ms)

    def replace_segments(self, new_base: int, old: list[LogSegment]) -> bool:
        """Swap a cleaned segment in for `old` (Kafka's replaceSegments): rename its `.cleaned`
        files to `.swap`, retire the old segments to `.deleted`, drop the `.swap` suffix, fsync
        the directory. A crash at any point is finished or undone by the next load. Returns
        False (nothing changed) if the old segments are no longer all in the log."""
        io = self._io
        with self._lock:
            if self._closed or any(s not in self._segs for s in old):
                return False
            files = [segment_file(self.dir, new_base, suf, CLEANED_SUFFIX)
                     for suf in (TIME_INDEX_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX)]
            for path in files:
                if io.exists(path):
                    io.rename(path, path[: -len(CLEANED_SUFFIX)] + SWAP_SUFFIX)
            io.fsync_dir(self.dir)
            for seg in old:
                seg.close_handlers()
                seg.change_file_suffixes("", DELETED_SUFFIX)
            for suf in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                path = segment_file(self.dir, new_base, suf, SWAP_SUFFIX)
                if io.exists(path):
                    io.rename(path, path[: -len(SWAP_SUFFIX)])
            new = LogSegment(self.dir, new_base, self._config, io=io, time=self._time,
                             rng=self._rng, file_already_exists=True)
            segs = sorted([s for s in self._segs if s not in old] + [new], key=lambda s: s.base_offset)
            self._set_segments(segs)
        # the final renames' fsync and the unlinks need no lock (a crash before the fsync is
        # finished by the next load, as above)
        io.fsync_dir(self.dir)
        self._delete_later(old)
        return True

    # -- close -----------------------------------------------------------------------------
    def close(self) -> None:
        """Flush, trim the active segment and its indexes, and (standalone) mark a clean close."""
        with self._flush_lock, self._lock:     # the hierarchy's order: _flush_lock, then _lock
            if self._closed:
                return
            if self.read_only or self._failed is not None:
                self.close_handlers()
                return
            try:
                # the one fsync under the log lock: nothing may append between the last flush
                # and the trim, and an appender waiting here gets "closed" next
                self._flush_holding_flush_lock(None)
                for s in self._segs:
                    s.close()
            except OSError as e:
                # no clean-shutdown marker: the next open recovers
                self._failed = str(e)
                self.close_handlers()
                raise _storage_error(self.dir, e) from e
            self._closed = True
            try:
                if not self._managed:
                    marker = os.path.join(self.dir, STANDALONE_CLEAN_MARKER)
                    self._io.write_atomic(marker, json.dumps(
                        {"version": 0, "log_start_offset": self._log_start_offset}).encode())
            finally:
                self._release_locks()     # last: no other writer sees the log half-closed

    def close_handlers(self) -> None:
        """Release every mapping and descriptor without flushing (a simulated crash in tests)."""
        with self._lock:
            try:
                for s in self._segs:
                    s.close_handlers()
                self._closed = True
            finally:
                self._release_locks()

    def delete(self) -> None:
        """Close and remove the whole partition directory."""
        with self._lock:
            try:
                for s in self._segs:
                    s.delete()
                self._closed = True
                for name in self._io.listdir(self.dir):
                    self._io.unlink(os.path.join(self.dir, name))
                self._io.rmdir(self.dir)
            finally:
                self._release_locks()

    def __enter__(self) -> "Log":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Log({self.dir!r}, log_start_offset={self._log_start_offset}, "
                f"log_end_offset={self._leo}, segments={len(self._segs)})")
