"""The segments of one partition on disk and their offsets (Kafka's LocalLog): the writer's
locks, roll, flush, truncation, retention and DeleteRecords, swapping segments in, close. Log
(log.py) extends it with opening and loading, appends and reads.

Offsets: log_start_offset <= recovery_point <= log_end_offset. One writer and any number of
reader threads: the writer serialises on _lock and publishes a new LogSegments snapshot (one
reference) and new sizes for every change, so a reader always sees whole batches.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import random
import threading
from typing import Any, Callable, Mapping, Optional, Sequence, TypeVar

from kstore import _notify, swap
from kstore.config import LogConfig
from kstore.errors import KStoreError, KStoreStateError, LogDirLockedError, OffsetOutOfRangeError
from kstore.fileio import FileOps
from kstore.files import DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, segment_file
from kstore.log_segments import LogSegments
from kstore.log_start import LogStart
from kstore.notify import LogNotifier, ring_hints
from kstore.segment import LogSegment
from kstore.start_file import STANDALONE_CLEAN_MARKER, save_log_start
from kstore.storage_errors import failed_error, storage_error, storage_op

log = logging.getLogger("kstore.log")
# the roll jitter's random source, one per process as Kafka's ThreadLocalRandom (seeding a
# Random per log from os.urandom cost ~16 us of every partition's start-up); its methods are
# safe to share between threads (getrandbits runs under the GIL)
_JITTER_RNG = random.Random()

#: A log dir's lock file: its LogManager holds it exclusively, a standalone writable Log of one
#: of its partitions holds it shared (and flocks the partition directory itself exclusively).
LOG_DIR_LOCK = ".lock"


_L = TypeVar("_L", bound="LocalLog")

class LocalLog(LogStart):
    """A partition directory's segments and offsets, and what changes them on disk."""

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
        self._rng = _JITTER_RNG
        # the published segments: readers take this snapshot without the lock
        self._segments = LogSegments()
        self._leo = self._log_start_offset = self._recovery_point = 0
        self._closed = False
        self._failed: Optional[str] = None     # the I/O error that failed this log
        #: a LogManager's (log_registry.py): told of the I/O error that fails this log
        self.failure_listener: Optional[Callable[[OSError], None]] = None
        self._deferred: list = []     # fsyncs and hand-offs queued under _lock, run after it
        LogStart.__init__(self)
        self._truncations = 0         # bumped by every truncation (a flush in flight is void)
        self._lock_fds: list[int] = []    # flocks of a standalone writable log (_take_locks)
        self._last_flush_ms = time.milliseconds()
        #: wait_for's machinery; _bell is bumped after every change of the log end (notify.py),
        #: None until the first change or wait maps the notification file (attach_bell)
        self.notifier = LogNotifier(self, io, dir_)  # type: ignore[arg-type]  # a Log: it refreshes
        self._bell: Optional[_notify.Bell] = None

    def fail(self, why: str) -> None:
        """Refuse every write from now on, as after a write's own I/O error (Kafka: the log's
        dir went offline, its partitions with it); reads go on. Takes no lock: another log's
        failing write, whose lock may be held, calls it through LogDirFailureChannel."""
        if self._failed is None:
            self._failed = why

    @property
    def failed(self) -> Optional[str]:
        """The I/O error that failed this log (its writes refused), None while it is sound."""
        return self._failed

    def _fail_on(self, e: OSError) -> None:
        """e failed this log (the first error is kept); a LogManager's log tells its log dir's
        failure channel (failure_listener, set by log_registry.py), lock-free as fail()."""
        self.fail(str(e))
        if (tell := self.failure_listener) is not None:
            tell(e)

    def _take_locks(self) -> None:
        """A standalone writable open excludes every other writer: the parent's `.lock` shared
        (a LogManager's), then the partition directory (made here if missing, so that a refused
        open adds nothing to a manager's log dir) flocked exclusively (another standalone Log,
        in any process; no file is added to Kafka's directory). Until close(_handlers)."""
        parent = os.path.dirname(os.path.abspath(self.dir))
        if not self._io.exists(parent):
            os.makedirs(parent, exist_ok=True)
        fd = self._io.try_lock(os.path.join(parent, LOG_DIR_LOCK), shared=True)
        if fd is None:
            raise LogDirLockedError(
                f"cannot open {self.dir} for writing: a LogManager owns its log dir {parent} "
                f"(in this process or another); append through it, or open read-only")
        self._lock_fds.append(fd)
        self._create_dir()
        fd = self._io.try_lock(self.dir, directory=True)
        if fd is None:
            raise LogDirLockedError(
                f"cannot open {self.dir} for writing: another writer (a Log in this process or "
                f"another) has it open; close it first, or open read-only")
        self._lock_fds.append(fd)

    def _release_locks(self) -> None:
        fds, self._lock_fds = self._lock_fds, []
        for fd in fds:
            with contextlib.suppress(OSError):   # the descriptor is gone either way: its lock too
                self._io.unlock(fd)

    def _create_dir(self) -> None:
        """The partition directory, made (durably) if missing; one made meanwhile by another
        opener (a standalone Log racing this one for it) is used, made durable all the same."""
        if not self._io.exists(self.dir):
            parent = os.path.dirname(os.path.abspath(self.dir))
            if not self._io.exists(parent):
                os.makedirs(parent, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                self._io.mkdir(self.dir)
            self._io.fsync_dir(parent)

    def _set_segments(self, segs: LogSegments | Sequence[LogSegment]) -> None:
        """Publish a new segment list (lock held): readers take it whole, without the lock."""
        self._segments = segs if isinstance(segs, LogSegments) else LogSegments(segs)

    def attach_bell(self) -> _notify.Bell:
        """The writer's Bell, its notification file mapped and written at the log's first
        change or wait, not its open (~20-45 µs a partition; notify.py), unless it had no page
        or recovery cut a torn tail (Log._load). A read-only or closed log's: never mapped."""
        with self._lock:
            if self._bell is None and not self.read_only and not self._closed:
                self._bell = self.notifier.attach_writer()
            return self._bell or self.notifier.bell

    def _before_cut(self, offset: int) -> None:
        """Hook (lock held): a truncation to offset is about to be made (leader_epoch.py)."""

    def _ring(self) -> None:
        """Wake wait_for's waiters after a change other than an append (lock held)."""
        (self._bell or self.attach_bell()).ring(*ring_hints(self._segments.segs, self._leo,
                                                            self._log_start_offset))

    def wait_for(self, offset: int, timeout: Optional[float] = None, *, spin: float = 0.0) -> bool:
        """Block until the log end is above offset (True) or timeout seconds pass (False; None
        waits on), as threading.Event.wait, on writable and read-only logs (another process
        appends: it refreshes itself), no polling (notify.py). spin: busy-wait that long first.
        KStoreStateError once the log is closed; UnknownTopicError if its directory is deleted."""
        return self.notifier.wait(offset, timeout, spin)

    @property
    def config(self) -> LogConfig:
        return self._config

    @property
    def rng(self) -> random.Random:
        """The segments' roll jitter source (for segments made beside the log: the cleaner's)."""
        return self._rng

    def update_config(self, config: Mapping[str, Any] | LogConfig) -> None:
        cfg = config if isinstance(config, LogConfig) else LogConfig(config)
        with self._lock:
            self._config = cfg
            for s in self._segments:
                s.set_config(cfg)

    @property
    def segments(self) -> list[LogSegment]:
        return list(self._segments.segs)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments.active

    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._leo

    high_watermark = log_end_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def size(self) -> int:
        """Bytes in every segment's .log."""
        return self._segments.total_size()

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

    def _take_deferred(self) -> list:
        """The post-lock actions queued so far (lock held), leaving none queued."""
        deferred = self._deferred
        if deferred:
            self._deferred = []
        return deferred

    def _after_write(self, deferred: list, flush_due: bool = False) -> None:
        """Run, with no lock held, a write's fsyncs and hand-offs of a roll or a deletion (in
        order), then the flush.messages flush; an I/O error fails the log, as in the write."""
        try:
            for action in deferred:
                action()
            if flush_due:
                self.flush()
        except OSError as e:
            self._fail_on(e)
            raise storage_error(self.dir, e) from e

    @storage_op
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
        active = self._segments.active
        if self._segments.has_base(new_offset):
            if active.base_offset == new_offset and active.size == 0:
                # KAFKA-6388: an empty active segment at the same offset is recreated
                log.warning("rolling to existing empty segment %s: recreating it", active.log_path)
                active.delete()
                self._set_segments(self._segments.segs[:-1])
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
        self._set_segments(self._segments.segs + [seg])
        self._ring()
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

    @storage_op
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
            segs = self._segments
            lo, hi = segs.floor_index(rp), segs.index_above(end)
            to_flush = segs.segs[lo:hi] if hi > lo else []
            if not to_flush and segs:
                to_flush = [segs.floor(end - 1)]
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

    @storage_op
    def truncate_to(self, target_offset: int) -> bool:
        """Drop every record at or after target_offset (whole batches, as Kafka); returns False
        if there was nothing to drop."""
        if target_offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate {self.dir} to a negative offset {target_offset}")
        with self._start_guard(), self._lowering(target_offset):
            with self._lock:
                self._check_writable()
                if target_offset >= self._leo:
                    return False
                self._truncate_locked(target_offset)
        return True

    def _truncate_locked(self, target_offset: int) -> None:
        """truncate_to's change (lock held)."""
        start, segs = self._log_start_offset, self._segments.segs
        if segs[0].base_offset > target_offset:
            self._truncate_fully_locked(target_offset)
            return
        self._before_cut(target_offset)
        keep = [s for s in segs if s.base_offset <= target_offset]
        drop = [s for s in segs if s.base_offset > target_offset]
        # last first: a reader listing the directory sees a shorter log, never a hole
        for s in reversed(drop):
            s.delete()
        new_active = keep[-1]
        # the cut (and a rolled segment taking appends again) gets a new file: readers of the
        # old one keep valid pages and may trust a rolled file to be complete
        new_active.truncate_to(target_offset, replace=not new_active.is_active)
        new_active.make_active()
        self._set_segments(keep)
        self._truncations += 1
        self._leo = target_offset
        self._log_start_offset = min(target_offset, start)
        self._recovery_point = min(target_offset, self._recovery_point)
        self._ring()

    @storage_op
    def truncate_fully_and_start_at(self, new_offset: int) -> None:
        """Delete every segment and start empty at new_offset."""
        with self._start_guard(), self._lowering(new_offset):
            with self._lock:
                self._check_writable()
                raised = new_offset > self._log_start_offset
                self._truncate_fully_locked(new_offset)
            if raised:       # saved after the cut: a start above the old segments' is only safe then
                self._start_moved()

    def _truncate_fully_locked(self, new_offset: int) -> None:     # lock held
        # at or past the end (the start moves up): oldest first, so that a reader listing the
        # directory meanwhile sees the start move up, as by retention, never the end come
        # down below its position (an out-of-range reset to the start: records read twice);
        # below the end (a cut): last first, as truncate_to
        segs = self._segments.segs
        self._before_cut(new_offset)
        for s in (segs if new_offset >= self._leo else reversed(segs)):
            s.delete()
        seg = LogSegment(self.dir, new_offset, self._config, io=self._io, time=self._time, rng=self._rng)
        seg.make_active()
        self._set_segments([seg])
        self._truncations += 1
        self._io.fsync_dir(self.dir)
        self._leo = self._log_start_offset = self._recovery_point = new_offset
        self._ring()

    @storage_op
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
        segs = self._segments
        doomed = []
        hw = self._leo
        for i, seg in enumerate(segs):
            nxt = segs.next_base(i)
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
        remaining = self._segments.without(doomed)
        self._set_segments(remaining)
        new_start = remaining[0].base_offset
        if new_start > self._log_start_offset:
            self._log_start_offset = new_start
        for seg in doomed:
            log.info("deleting segment %s (%s)", seg.log_path, reason)
            seg.close_handlers()
            seg.change_file_suffixes("", DELETED_SUFFIX)
        self._ring()
        # after the lock, before the caller returns: one directory fsync makes every .deleted
        # rename durable, so deleted segments never come back after a power loss (a
        # crash-harness finding; Kafka leaves this to its checkpoint); then the unlinks
        self._deferred.append(self._sync_dir)
        self._deferred.append(functools.partial(self._delete_later, doomed))
        return len(doomed)

    def _sync_dir(self) -> None:
        """fsync the directory after the lock (not once closed: a deleted topic's has moved)."""
        try:
            self._io.fsync_dir(self.dir)
        except OSError:
            if not self._closed:
                raise

    def _delete_later(self, segs: list[LogSegment]) -> None:
        """Unlink retired segments, after file.delete.delay.ms on the scheduler if any (unlocked)."""
        if self._scheduler is None:
            for seg in segs:
                seg.delete()
            return
        for seg in segs:
            self._scheduler.schedule_once("delete-file", seg.delete,
                                          delay_ms=self._config.file_delete_delay_ms)

    @storage_op
    def replace_segments(self, new_base: int, old: list[LogSegment]) -> bool:
        """Swap a cleaned segment in for `old` (Kafka's replaceSegments, swap.swap_in): `.cleaned`
        -> `.swap`, old -> `.deleted`, then final, the directory fsynced; a crash is finished or
        undone by the next load. False (nothing changed) if `old` is no longer all in the log.
        A failed log (its dir offline) refuses it, as every write: nothing renamed there."""
        io = self._io
        with self._lock:
            if self._closed or any(s not in self._segments for s in old):
                return False
            if self._failed is not None:          # failed after storage_op's check
                raise failed_error(self.dir, self._failed)
            swap.swap_in(io, self.dir, [new_base], old)
            new = LogSegment(self.dir, new_base, self._config, io=io, time=self._time,
                             rng=self._rng, file_already_exists=True)
            self._set_segments(self._segments.replaced(old, [new]))
            self._ring()
        # the final renames' fsync and the unlinks need no lock (the next load finishes them)
        io.fsync_dir(self.dir)
        self._delete_later(old)
        return True

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
                for s in self._segments:
                    s.close()
            except OSError as e:
                # no clean-shutdown marker: the next open recovers
                self._fail_on(e)
                self.close_handlers()
                raise storage_error(self.dir, e) from e
            self._attach_to_close()
            self._closed = True
            self.notifier.close()
            try:
                if not self._managed:
                    save_log_start(self._io, self.dir, self._log_start_offset, STANDALONE_CLEAN_MARKER)
            finally:
                self._release_locks()     # last: no other writer sees the log half-closed

    def _attach_to_close(self) -> None:
        """A loaded writable log's close bumps the page whether or not it changed anything (its
        open may have recovered, its close trims): a kept writer elsewhere that checks the word
        before reusing its view of the files (offsets_topic) must see it moved (lock held)."""
        if self._bell is None and not self.read_only and not self._closed \
                and self._failed is None and self._segments.segs:
            self.attach_bell()

    def close_handlers(self) -> None:
        """Release every mapping and descriptor without flushing (a simulated crash in tests)."""
        with self._lock:
            try:
                self._attach_to_close()
                for s in self._segments:
                    s.close_handlers()
                self._closed = True
                self.notifier.close()
            finally:
                self._release_locks()

    def delete(self) -> None:
        """Close and remove the whole partition directory."""
        with self._lock:
            try:
                for s in self._segments:
                    s.delete()
                self._closed = True
                self.notifier.close()
                for name in self._io.listdir(self.dir):
                    self._io.unlink(os.path.join(self.dir, name))
                self._io.rmdir(self.dir)
            finally:
                self._release_locks()

    def __enter__(self: _L) -> _L:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"Log({self.dir!r}, log_start_offset={self._log_start_offset}, "
                f"log_end_offset={self._leo}, segments={len(self._segments)})")
