"""Log compaction (Kafka's LogCleaner and LogCleanerManager).

A pass picks the filthiest compacted log (dirty ratio above min.cleanable.dirty.ratio, or a dirty
section older than max.compaction.lag.ms), builds the dedupe map (an OffsetMap in the compiled
core) over its dirty section up to the first uncleanable offset, then rewrites every segment below
the map's end, in groups, into `.cleaned` files that are swapped in through `.swap` names with
Kafka's crash-recovery rules. Only the latest value of each key survives; tombstones survive until
their delete horizon. Offsets never change; unchanged batches are copied byte for byte.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time as _time
import weakref
from typing import Optional

from kstore import _core, swap
from kstore.config import NO_LIMIT
from kstore.checkpoint import CLEANER_OFFSET_CHECKPOINT, CheckpointError, OffsetCheckpointFile
from kstore.cleaner_txn import clean_actions, first_uncleanable_by_lso
from kstore.errors import KStoreError, LogDirOfflineError, SegmentGoneError, UnknownTopicError
from kstore.files import CLEANED_SUFFIX, LOG_SUFFIX, segment_file
from kstore.log import Log
from kstore.read_committed import TxnFilter
from kstore.segment import LogSegment
from kstore.storage_errors import failed_error

log = logging.getLogger("kstore.cleaner")
INT32_MAX = (1 << 31) - 1
OUT_CHUNK = 256 << 10


@dataclasses.dataclass
class CleanerStats:
    """What one clean of one log did."""
    topic: str = ""
    partition: int = -1
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_removed: int = 0
    segments_in: int = 0
    segments_out: int = 0
    map_entries: int = 0
    end_offset: int = -1
    duration_ms: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes_read / 1e6 / (self.duration_ms / 1000) if self.duration_ms else 0.0


class Throttler:
    """Caps bytes/s over a 300 ms window (log.cleaner.io.max.bytes.per.second), shared by threads."""

    def __init__(self, bytes_per_second: float, time=None):
        self.rate = bytes_per_second
        self._lock = threading.Lock()
        self._start = _time.monotonic()
        self._count = 0.0

    def maybe_throttle(self, n: int) -> None:
        if self.rate >= 1e300 or n <= 0:
            return
        with self._lock:
            self._count += n
            elapsed = _time.monotonic() - self._start
            wanted = self._count / self.rate
            if wanted > elapsed:
                _time.sleep(wanted - elapsed)      # ahead of the allowed rate: wait it out
                elapsed = wanted
            if elapsed >= 0.3:                     # a new window
                self._start = _time.monotonic()
                self._count = 0.0


@dataclasses.dataclass
class LogToClean:
    tp: tuple[str, int]
    log: Log
    first_dirty: int
    first_uncleanable: int
    clean_bytes: int
    dirty_bytes: int
    forced: bool = False

    @property
    def ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def cleanable_range(lg: Log, first_dirty: int, now: int,
                    lso: Optional[int] = None) -> tuple[int, int, int, int, bool]:
    """(first_dirty, first_uncleanable, clean_bytes, dirty_bytes, max_lag_exceeded) per Kafka:
    the active segment, the segment holding the last stable offset (lso; an open transaction)
    and later ones, and segments newer than min.compaction.lag.ms are uncleanable."""
    cfg = lg.config
    segs = lg.segments
    start = lg.log_start_offset
    if first_dirty < start or first_dirty > lg.log_end_offset:
        first_dirty = start
    first_uncleanable = segs[-1].base_offset
    if lso is not None:
        first_uncleanable = min(first_uncleanable, first_uncleanable_by_lso(lg, lso))
    nexts = _next_bases(segs)
    for s, nxt in zip(segs[:-1], nexts):
        if s.base_offset >= first_dirty or nxt > first_dirty:
            if cfg.min_compaction_lag_ms > 0 and s.largest_timestamp() > now - cfg.min_compaction_lag_ms:
                first_uncleanable = min(first_uncleanable, s.base_offset)
                break
    clean = sum(s.size for s, nxt in zip(segs, nexts) if nxt <= first_dirty)
    dirty_segs = [s for s, nxt in zip(segs, nexts) if nxt > first_dirty and s.base_offset < first_uncleanable]
    dirty = sum(s.size for s in dirty_segs)
    lag_exceeded = False
    if dirty and cfg.max_compaction_lag_ms < NO_LIMIT:
        first_ts = dirty_segs[0].first_batch_timestamp()
        if first_ts >= 0 and first_ts < now - cfg.max_compaction_lag_ms:
            lag_exceeded = True
    return first_dirty, first_uncleanable, clean, dirty, lag_exceeded


def _next_bases(segs: list[LogSegment]) -> list[int]:
    """Each segment's next base offset (NO_LIMIT for the last): the end of its offset range."""
    return [s.base_offset for s in segs[1:]] + [NO_LIMIT]


class Cleaner:
    """One cleaner thread's state: its OffsetMap and the clean of one log."""

    def __init__(self, map_memory: int, load_factor: float, throttler: Throttler, time, io,
                 producer_expiration_ms: int = 86400000):
        self.offset_map = _core.OffsetMap(map_memory, load_factor)
        self.producer_expiration_ms = producer_expiration_ms   # producer.id.expiration.ms
        self.lock = threading.Lock()     # one clean at a time per OffsetMap (thread vs clean_now)
        self.throttler = throttler
        self._time = time
        self._io = io

    def clean(self, ltc: LogToClean) -> CleanerStats:
        t0 = _time.perf_counter()
        lg = ltc.log
        stats = CleanerStats(topic=ltc.tp[0], partition=ltc.tp[1])
        omap = self.offset_map
        omap.clear()
        segs = lg.segments
        now = self._time.milliseconds()
        # aborted transactions, markers that may go, producers' last batches (None: no batch has
        # a producer id)
        txn = clean_actions(lg, ltc.first_uncleanable, now, self.producer_expiration_ms)
        # 1. the dedupe map over the dirty section
        nexts = _next_bases(segs)
        for s, nxt in zip(segs, nexts):
            if nxt <= ltc.first_dirty or s.base_offset >= ltc.first_uncleanable:
                continue
            m = s.mapping()
            pos, full = _core.build_offset_map(m, 0, min(s.size, m.length), ltc.first_dirty, omap, txn,
                                               min(nxt, ltc.first_uncleanable))
            stats.bytes_read += pos
            self.throttler.maybe_throttle(pos)
            if full:
                break
        stats.map_entries = omap.size
        # a dirty section with no keyed record (markers, aborted transactions) is cleaned too, as
        # Kafka's: its aborted batches, expired markers and tombstones go now, not at the next
        # keyed clean
        end_offset = max(omap.latest_offset + 1, ltc.first_dirty)
        # 2. legacy tombstones: Kafka's horizon is the mtime of the last segment below the first
        # dirty offset (logSegments(0, firstDirtyOffset): the one holding it, if it is inside a
        # segment) - delete.retention.ms
        clean_section = [s for s in segs if s.base_offset < ltc.first_dirty]
        legacy_horizon = (clean_section[-1].largest_mtime() - lg.config.delete_retention_ms
                          if clean_section else 0)
        # 3. rewrite the segments below end_offset, in groups
        to_clean = [s for s in segs if s.base_offset < end_offset and s.base_offset < ltc.first_uncleanable]
        # the batch ending just before the first uncleanable offset is kept even if emptied
        # (Kafka's upperBoundOffsetOfCleaningRound), so the cleaned range keeps its end
        final_offset = ltc.first_uncleanable - 1
        for group in group_segments(to_clean, lg.config, end_offset):
            self._clean_group(lg, group, omap, now, legacy_horizon, final_offset, stats, txn)
        stats.end_offset = end_offset
        stats.duration_ms = (_time.perf_counter() - t0) * 1000
        return stats

    def _clean_group(self, lg: Log, group: list[LogSegment], omap, now: int, legacy_horizon: int,
                     final_offset: int, stats: CleanerStats, txn: Optional[dict[int, int]]) -> None:
        io = self._io
        base = group[0].base_offset
        out_path = segment_file(lg.dir, base, LOG_SUFFIX, CLEANED_SUFFIX)
        cs = _core.CleanStats()
        fd = io.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        out_pos = 0
        try:
            for s in group:
                m = s.mapping()
                end = min(s.size, m.length)
                retain_legacy = s.largest_mtime() > legacy_horizon
                pos = 0
                while pos < end:
                    if lg.failed is not None:     # its dir went offline: write nothing more there
                        raise failed_error(lg.dir, lg.failed)
                    before = cs.bytes_read
                    pos, data = _core.filter_batches(m, pos, end, omap, now, lg.config.delete_retention_ms,
                                                     retain_legacy, final_offset, OUT_CHUNK, cs, txn)
                    if data:
                        io.pwrite(fd, data, out_pos)
                        out_pos += len(data)
                    self.throttler.maybe_throttle(cs.bytes_read - before + len(data))
                    if cs.bytes_read == before and not data:
                        break     # malformed tail: recovery owns it
            io.fsync(fd)
        except BaseException:
            io.close(fd)
            try:
                if lg.failed is None:     # an offline dir is left as it is: the next load tidies up
                    swap.remove_cleaned(io, lg.dir, base)
            except OSError:
                pass          # the error being raised matters more; the next load tidies up
            raise
        io.close(fd)
        # indexes for the cleaned segment, built as recovery builds them, then made durable
        piece = LogSegment(lg.dir, base, lg.config, io=io, time=self._time, rng=lg.rng,
                           file_already_exists=True, suffix=CLEANED_SUFFIX)
        try:
            piece.recover(epochs=False)      # (its leader epochs: the log's cache has them)
            piece.flush()
        finally:
            piece.close_handlers()
        io.set_mtime_ms(out_path, group[-1].largest_mtime())
        stats.bytes_read += cs.bytes_read
        stats.bytes_written += out_pos
        stats.records_read += cs.records_read
        stats.records_removed += cs.records_read - cs.records_kept
        stats.segments_in += len(group)
        stats.segments_out += 1
        if not lg.replace_segments(base, group):
            swap.remove_cleaned(io, lg.dir, base)
            raise CleanAborted(f"segments of {lg.dir} changed during cleaning")


class CleanAborted(KStoreError):
    """The log changed under the cleaner (retention, truncation); the pass is dropped."""


def _changed(lg: Log, segs_before: list[LogSegment]) -> bool:
    """Whether the log lost or replaced segments since segs_before (or was closed)."""
    return lg.closed or any(s.closed for s in segs_before) or lg.segments != segs_before


def group_segments(segs: list[LogSegment], cfg, end_offset: int) -> list[list[LogSegment]]:
    """Kafka's groupSegmentsBySize: consecutive segments whose combined .log fits segment.bytes,
    whose indexes fit segment.index.bytes, and whose offsets fit one relative-offset space."""
    groups = []
    i = 0
    while i < len(segs):
        group = [segs[i]]
        log_size = segs[i].size
        index_size = segs[i].offset_index.size_in_bytes
        time_size = segs[i].time_index.size_in_bytes
        i += 1
        while i < len(segs):
            nxt = segs[i]
            last = nxt.read_next_offset() - 1 if nxt.size else nxt.base_offset
            if (log_size + nxt.size > cfg.segment_bytes
                    or index_size + nxt.offset_index.size_in_bytes > cfg.max_index_size
                    or time_size + nxt.time_index.size_in_bytes > cfg.max_index_size
                    or (nxt.size and last - group[0].base_offset > INT32_MAX)):
                break
            group.append(nxt)
            log_size += nxt.size
            index_size += nxt.offset_index.size_in_bytes
            time_size += nxt.time_index.size_in_bytes
            i += 1
        groups.append(group)
    return groups


class LogCleaner:
    """The cleaner threads and their bookkeeping (LogCleaner + LogCleanerManager)."""

    def __init__(self, manager, threads: int, dedupe_buffer: int, load_factor: float,
                 max_bytes_per_second: float, backoff_ms: int, time, io,
                 producer_expiration_ms: int = 86400000):
        self._manager = weakref.proxy(manager)      # the manager holds this: no reference cycle
        self._failures = manager.log_dir_failure_channel
        self._time = time
        self._io = io
        self._lock = threading.Lock()
        self._done = threading.Condition(self._lock)     # notified when a clean finishes
        self._in_progress: set = set()
        self._passes = 0                # run_pass calls under way: the threads take none meanwhile
        #: each compacted log's transactions, scanned incrementally: its last stable offset
        self._txn: dict[tuple[str, int], tuple[Log, TxnFilter]] = {}
        self.uncleanable: dict[tuple[str, int], str] = {}
        self._checkpoints: dict[str, dict] = {}
        self.throttler = Throttler(max_bytes_per_second)
        n = max(1, threads)
        per_thread = min((1 << 31) - 1, dedupe_buffer // n)
        self._cleaners = [Cleaner(per_thread, load_factor, self.throttler, time, io, producer_expiration_ms)
                          for _ in range(n)]
        self._backoff_ms = backoff_ms
        self._threads_wanted = threads
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.dead_threads = 0

    # -- checkpoints ----------------------------------------------------------------------------
    def _checkpoint_file(self, d: str) -> OffsetCheckpointFile:
        return OffsetCheckpointFile(os.path.join(d, CLEANER_OFFSET_CHECKPOINT), self._io)

    def _load_checkpoint(self, d: str) -> dict:
        cp = self._checkpoints.get(d)
        if cp is None:
            cpf = self._checkpoint_file(d)
            with cpf.lock:
                cp = self._checkpoints.get(d)
                if cp is None:
                    try:
                        cp = cpf.read()
                    except (CheckpointError, OSError) as e:
                        log.warning("%s; cleaning from the log start", e)
                        cp = {}
                    self._checkpoints[d] = cp
        return cp

    def _update_checkpoint(self, d: str, tp, offset: Optional[int]) -> None:
        """Change one entry and rewrite the dir's file, under the file's lock: the cleaner
        threads share both the entries and the file."""
        cpf = self._checkpoint_file(d)
        cp = self._load_checkpoint(d)
        with cpf.lock:
            if offset is None:
                cp.pop(tp, None)
            else:
                cp[tp] = offset
            live = set(self._manager.logs())
            cpf.write({k: v for k, v in cp.items() if k in live})

    def forget_topic(self, topic: str, log_dirs) -> None:
        """A deleted topic's partitions leave cleaner-offset-checkpoint, in memory and in each
        dir's file (Kafka's asyncDelete: updateCheckpoints with the partition removed), so a
        topic created again under the name is cleaned from its start."""
        with self._lock:
            for tp in [tp for tp in self._txn if tp[0] == topic]:
                del self._txn[tp]
        for d in log_dirs:
            cpf = self._checkpoint_file(d)
            cp = self._load_checkpoint(d)
            with cpf.lock:
                if any(t == topic for t, _p in cp):
                    for tp in [tp for tp in cp if tp[0] == topic]:
                        del cp[tp]
                    cpf.write(cp)

    def first_dirty_offset(self, tp) -> Optional[int]:
        d = self._manager.log_dir_of(*tp)
        return self._load_checkpoint(d).get(tp)

    # -- selection -----------------------------------------------------------------------------
    def grab_filthiest(self, exclude=frozenset()) -> Optional[LogToClean]:
        """The eligible log with the highest dirty ratio, marked in progress (None if none)."""
        with self._lock:
            return self._grab_locked(exclude)

    def _grab_locked(self, exclude) -> Optional[LogToClean]:
        now = self._time.milliseconds()
        best = None
        for tp, lg in self._manager.logs().items():
            if (not lg.config.compact or tp in self._in_progress or tp in self.uncleanable
                    or lg.closed or tp in exclude):
                continue
            try:
                d = self._manager.log_dir_of(*tp)
                if self._failures.is_offline(d):
                    continue
                cp = self._load_checkpoint(d).get(tp, lg.log_start_offset)
                txn = self._txn.get(tp)
                if txn is None or txn[0] is not lg:
                    txn = self._txn[tp] = (lg, TxnFilter(lg.log_start_offset))
                lso = txn[1].stable_offset(lg)
                txn[1].aborted.clear()    # (a consumer's: the cleaner needs only the LSO)
                fd, fu, clean, dirty, lag = cleanable_range(lg, cp, now, lso)
            except (UnknownTopicError, FileNotFoundError, SegmentGoneError, ValueError, BufferError):
                continue         # deleted (topic, or segments by retention) while we looked
            except KStoreError as e:      # e.g. a corrupt batch header: as a failed clean
                if not lg.closed:         # (closed: the topic was deleted under the scan)
                    self._uncleanable(LogToClean(tp, lg, 0, 0, 0, 0), e)
                continue
            if dirty == 0:
                continue
            ltc = LogToClean(tp, lg, fd, fu, clean, dirty, forced=lag)
            if not (ltc.ratio > lg.config.min_cleanable_dirty_ratio or lag):
                continue
            if best is None or ltc.ratio > best.ratio:
                best = ltc
        if best is not None:
            self._in_progress.add(best.tp)
        return best

    # -- cleaning ----------------------------------------------------------------------------
    def _clean(self, cleaner: Cleaner, ltc: LogToClean) -> Optional[CleanerStats]:
        lg = ltc.log
        segs_before = lg.segments
        d = None
        try:
            d = self._manager.log_dir_of(*ltc.tp)
            stats = cleaner.clean(ltc)
            self._failures.guard(d, self._update_checkpoint, d, ltc.tp, stats.end_offset)
            log.info("cleaned %s-%d: %d -> %d bytes, %d records removed in %.0f ms",
                     ltc.tp[0], ltc.tp[1], stats.bytes_read, stats.bytes_written,
                     stats.records_removed, stats.duration_ms)
            return stats
        except CleanAborted as e:
            log.info("%s", e)
            return None
        except UnknownTopicError:
            log.info("clean of %s-%d aborted: the topic was deleted", *ltc.tp)
            return None
        except LogDirOfflineError as e:   # its dir went offline (taken there, or by another log)
            log.info("clean of %s-%d aborted: %s", ltc.tp[0], ltc.tp[1], e)
            return None
        except (SegmentGoneError, ValueError, BufferError) as e:
            # a segment closed or replaced under the clean (its mapping closed: "mapping is
            # closed"): a race with retention, delete_records, truncation or topic deletion
            if not isinstance(e, SegmentGoneError) and not _changed(lg, segs_before):
                self._uncleanable(ltc, e)
                return None
            log.info("clean of %s-%d aborted: %s changed during cleaning (%s)",
                     ltc.tp[0], ltc.tp[1], lg.dir, e)
            swap.remove_all_cleaned(self._io, lg.dir)
            return None
        except OSError as e:
            if isinstance(e, FileNotFoundError) and _changed(lg, segs_before):
                # retention, delete_records, truncation or topic deletion removed or renamed a
                # file under the clean: the clean is dropped (and retried later), the dir is fine
                log.info("clean of %s-%d aborted: %s changed during cleaning (%s)",
                         ltc.tp[0], ltc.tp[1], lg.dir, e)
                swap.remove_all_cleaned(self._io, lg.dir)
                return None
            self._failures.mark_offline(d, e)
            return None
        except Exception as e:   # KAFKA-7215: one bad partition must not stop the cleaner
            self._uncleanable(ltc, e)
            return None
        finally:
            with self._done:
                self._in_progress.discard(ltc.tp)
                self._done.notify_all()

    def _uncleanable(self, ltc: LogToClean, e: BaseException) -> None:
        log.error("cleaning %s-%d failed; marking it uncleanable", *ltc.tp, exc_info=e)
        self.uncleanable[ltc.tp] = f"{type(e).__name__}: {e}"

    def uncleanable_partitions(self) -> dict[tuple[str, int], str]:
        """The uncleanable partitions still among the manager's logs, with their errors."""
        self.maintain_uncleanable()
        return dict(self.uncleanable)

    def maintain_uncleanable(self) -> None:
        """Forget the uncleanable partitions no longer among the manager's logs: an offline
        dir's, a deleted topic's (Kafka's maintainUncleanablePartitions, after each pass)."""
        live = self._manager.logs()
        for tp in list(self.uncleanable):
            if tp not in live:
                self.uncleanable.pop(tp, None)

    def run_pass(self) -> list[CleanerStats]:
        """Clean every log that is eligible now, once; returns the statistics of each clean.

        A clean a background thread has under way is waited for first, so when this returns every
        log has been cleaned up to its active segment (the thread's clean or this pass's). The
        threads take no new log while a pass waits or runs: it is never starved by them."""
        out = []
        tried: set = set()
        cleaner = self._cleaners[0]
        with self._done:
            self._passes += 1
        try:
            while True:
                with self._done:
                    self._done.wait_for(lambda: not (self._in_progress - tried))
                    ltc = self._grab_locked(tried)
                if ltc is None:
                    break
                tried.add(ltc.tp)
                with cleaner.lock:      # background thread 0 shares this OffsetMap
                    stats = self._clean(cleaner, ltc)
                if stats is not None:
                    out.append(stats)
        finally:
            with self._done:
                self._passes -= 1
                self._done.notify_all()
        self._retention_for_compacted()
        self.maintain_uncleanable()
        return out

    def _retention_for_compacted(self) -> None:
        """compact,delete logs get their time/size retention from the cleaner (Kafka)."""
        for tp, lg in self._manager.logs().items():
            if lg.config.compact and lg.config.delete and not lg.closed:
                try:
                    self._failures.guard(self._manager.log_dir_of(*tp), lg.delete_old_segments)
                except KStoreError:
                    pass

    # -- threads ------------------------------------------------------------------------------
    def start(self) -> None:
        for i in range(self._threads_wanted):
            t = threading.Thread(target=self._run, args=(self._cleaners[i],),
                                 name=f"kafka-log-cleaner-thread-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def _run(self, cleaner: Cleaner) -> None:
        try:
            while not self._stop.is_set():
                self.maintain_uncleanable()
                with self._done:     # a run_pass goes first: a clean_now is never starved
                    while self._passes and not self._stop.is_set():
                        self._done.wait(1.0)
                    ltc = self._grab_locked(frozenset())
                if ltc is None:
                    self._retention_for_compacted()
                    self._stop.wait(self._backoff_ms / 1000)
                    continue
                with cleaner.lock:
                    self._clean(cleaner, ltc)
        except Exception:
            self.dead_threads += 1
            log.exception("cleaner thread died")

    def shutdown(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        self._threads.clear()
