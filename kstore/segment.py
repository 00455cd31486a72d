"""One segment of a partition: a .log file of batches plus its .index and .timeindex
(Kafka's LogSegment).

The active segment's .log is mapped shared and writable. A large append (a producer's batch) is
a pwrite at the end, which grows the file; a small one is a memcpy into the mapping over a
zero-filled runway that the writer grows ahead of the data in chunks (written zeros, so a full
disk fails the append cleanly instead of raising SIGBUS later). Either way the bytes are in the
page cache when append returns (durable against a process crash), and the file is trimmed to
its logical size at roll and close. After a crash, recovery (recover) stops at the first batch
that fails validation and cuts what follows in place, except the last segment's zero tail, which
stays as its runway (its preallocated indexes are rewritten in place, not at all if they already
hold the recomputed entries). Inactive segments are mapped read-only on first use.

A file is never shrunk or overwritten below bytes a reader may have mapped: truncate_to()
writes the kept prefix to a new file renamed over the old one, and the trims at roll and close
cut only the runway past the logical size. So a reader (another thread, another process, a
memoryview from read_batches()) holding an old mapping keeps reading the records as they were,
never a zeroed batch or a page past the end of the file (SIGBUS).
"""
from __future__ import annotations

import logging
import os

import numpy as np
from typing import Optional

from kstore import _core, pretouch
from kstore.config import LogConfig
from kstore.errors import KStoreStateError, LogSegmentOffsetOverflowError
from kstore.fileio import FileOps
from kstore.index import AbstractIndex
from kstore.runway import Runway
from kstore.offset_index import OffsetIndex
from kstore.time_index import TimeIndex
from kstore.segment_reader import SegmentReader
from kstore.segment_recovery import SegmentRecovery, bytes_since_entry
from kstore.segment_files import SegmentFiles

log = logging.getLogger("kstore.segment")

INT32_MAX = (1 << 31) - 1
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
#: a truncation's new .log is written under this suffix, then renamed over the segment (the
#: load removes a leftover one)
TRUNCATE_TEMP_SUFFIX = ".tmp"
COPY_CHUNK = 8 << 20
#: cores a recovery scan hashes on (recover_scan's parallel CRC pass, for segments of 8 MiB
#: and more): the CRC of a large unflushed tail is what bounds a reopen after a crash
RECOVERY_CRC_THREADS = min(2, os.cpu_count() or 1)
#: appends of at least this many bytes are pwritten, smaller ones copied into the mapping
#: (measured: a pwrite's syscall costs more than the page faults of a small copy)
PWRITE_MIN_BYTES = 16 << 10


def _page_round_up(n: int) -> int:
    return (n + PAGE - 1) // PAGE * PAGE


class LogSegment(SegmentFiles, SegmentReader):
    """A segment: the reads of SegmentReader, and append, roll, recover, truncate, flush, close."""

    def __init__(self, dir_: str, base_offset: int, config: LogConfig, *, io: FileOps, time,
                 rng, file_already_exists: bool = False, suffix: str = "", lazy_size: bool = False):
        super().__init__(dir_, base_offset, config, io=io, suffix=suffix)
        self._time = time
        self._fd: Optional[int] = None
        self._map_writable = False
        self._runway: Optional[Runway] = None     # the active segment's (runway.py)
        self.roll_jitter_ms = config.random_segment_jitter(rng)
        self.created = time.milliseconds()
        self._rolling_ts: Optional[int] = None     # None: not loaded yet
        self._bytes_since_last_index_entry = 0
        self._indexes_full = False       # cached: changes only when index entries change
        self._index_room = 0             # entries both indexes can still take (a lower bound)
        self._rebuilding = False
        #: set by the loader: an index file is missing, so the segment is recovered at load
        self.needs_recovery = False
        self._zero_runway = 0    # recover(): file length whose bytes past size are all zero
        if file_already_exists:
            # lazy_size (the load's segments): read on first use (_load_size), not stat'ed now
            self.view.size, self._size_unknown = -1, True
            if not lazy_size:
                self._load_size()
        else:
            fd = io.open(self.log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            io.close(fd)
            self.size = 0

    def __repr__(self) -> str:
        return f"LogSegment(base_offset={self.base_offset}, size={self.size})"

    # size and mapping live in the view so that readers see them without a Python call

    # -- indexes (opened lazily, as Kafka's LazyIndex) --------------------------------------

    def _check_index(self, idx: AbstractIndex) -> None:
        """An index is checked against its .log when first used, whatever side of the recovery
        point the segment is on; one that fails is rebuilt from the .log, never trusted."""
        if self.read_only or self._rebuilding:
            return
        problem = idx.entries_problem(self.size)
        if problem is None:
            return
        sound = idx.sound_entries_before_zero_tail(self.size)
        if sound is not None:
            # a sound index followed by its untrimmed preallocation (the segment was active
            # when its writer was killed): trimmed, never rebuilt
            log.info("trimming %d zero entries after the %d of %s", idx.entries - sound,
                     sound, idx.path)
            idx.trim_entries(sound)
            return
        log.warning("rebuilding the indexes of %s: %s is corrupt (%s)", self.log_path, idx.path, problem)
        self._rebuilding = True
        try:
            self._rebuild_indexes()
        finally:
            self._rebuilding = False

    # -- mapping ---------------------------------------------------------------------------

    @property
    def is_active(self) -> bool:
        return self._map_writable

    def make_active(self) -> None:
        """Map the .log writable (preallocating ahead) and resize both indexes to the maximum."""
        with self._lock:
            if self._map_writable:
                return
            fd = self._io.open(self.log_path, os.O_RDWR)
            try:
                flen = self._io.size(fd)
                if flen > self.size and flen != self._zero_runway:
                    # stale bytes past the logical end (only after an external change): wipe them
                    self._io.truncate(fd, self.size)
                    flen = self.size
                self._activate(fd, flen, None)
            except BaseException:
                if self._fd is None:
                    self._io.close(fd)
                raise

    def _activate(self, fd: int, flen: int, m: Optional[_core.Mapping]) -> None:
        """make_active with the .log open (fd, of flen bytes) and, from recover(), already
        mapped writable over _active_length(flen) (m; else mapped here). The segment owns fd
        and m from the moment the mapping is set; lock held."""
        old, self._zero_runway, map_len = self._map, 0, self._active_length(flen)
        self._fd, self._map = fd, m if m is not None else self._io.map(fd, map_len, True)
        self._map_writable = True
        self._runway = Runway(self._io, fd, self._map, flen, self.log_path)
        if old is not None:
            old.close()
        if self._config.preallocate and map_len > flen:
            # Kafka's preallocate: reserve the whole segment up front (fallocate)
            self._io.allocate(fd, flen, map_len - flen)
            self._runway.alloc = map_len
        # the runway is grown by the first appends (_ensure_capacity): an open writes nothing
        self.offset_index.resize_lazily(self._config.max_index_size)
        self.time_index.resize_lazily(self._config.max_index_size)
        self._bytes_since_last_index_entry = bytes_since_entry(self.offset_index, self.size)
        self.load_max_timestamp()
        self._update_indexes_full()

    def _active_length(self, flen: int) -> int:     # the writable mapping's, for flen bytes
        return _page_round_up(max(self._config.segment_bytes, flen, 1))

    def _active_file(self) -> tuple[int, _core.Mapping]:
        """(descriptor, writable mapping) of the active segment."""
        fd, m = self._fd, self._map
        if fd is None or m is None or not self._map_writable:
            raise KStoreStateError(f"segment {self.log_path} is not the active segment")
        return fd, m

    def _grow_mapping(self, need: int) -> None:
        """segment.bytes grew since the mapping was made: map a larger window (readers clamp
        to the mapping)."""
        fd, m = self._active_file()
        new_len = _page_round_up(max(need, self._config.segment_bytes))
        self._map = self._io.map(fd, new_len, True)
        self._runway.set_mapping(self._map)  # type: ignore[union-attr]
        m.close()

    def _ensure_capacity(self, n: int, pwrite: bool = False) -> None:
        """Grow the runway (runway.py) for n bytes at the end (the mapping first if needed)."""
        need = self.size + n
        _fd, m = self._active_file()
        if need > m.length:
            self._grow_mapping(need)
        self._runway.grow(self.size, n, pwrite)  # type: ignore[union-attr]

    # -- append ----------------------------------------------------------------------------
    def append(self, builder: _core.BatchBuilder, largest_offset: int, largest_timestamp: int,
               offset_of_max_timestamp: int) -> None:
        """Write an encoded append at the end and maintain both indexes (Kafka's rules). From
        PWRITE_MIN_BYTES on, a pwrite (no page faults: half a fresh-page memcpy's cost on
        tmpfs, ~10-20% less on ext4) unless the pretoucher pre-faulted the pages there; else a
        copy into the mapping. The bytes are in the shared page cache before the size is
        published: in-process readers see whole batches; other processes validate what they
        pread (a batch being written is incomplete or fails its CRC, so invisible)."""
        v = self.view
        n = builder.size
        pos = v.size
        rel = largest_offset - self.base_offset
        if rel < 0 or rel > INT32_MAX:
            raise LogSegmentOffsetOverflowError(
                f"Detected offset overflow at offset {largest_offset} in segment {self.log_path}")
        end = pos + n
        if not v.max_ts_known:
            self.load_max_timestamp()
        indexed = self._bytes_since_last_index_entry > self._config.index_interval_bytes
        if indexed:
            # the entries' blocks before the bytes: a full disk fails the append while nothing
            # of it is in the file, where another process's reader (which validates past the
            # published size) could see it before runway.unwrite zeroed it
            self.offset_index.reserve_next()
            self.time_index.reserve_next()
        try:
            if n >= PWRITE_MIN_BYTES:
                rw: Runway = self._runway  # type: ignore[assignment]
                rw.write_large(builder, pos, n, self._ensure_capacity)
                v.log_map.check_intact_for_writer()  # type: ignore[union-attr]  # as copy_to
                if (pt := pretouch.ACTIVE) is not None:
                    pt.submit(rw, end, n)       # grow the runway ahead in the background
            else:
                if end > self._runway.alloc:  # type: ignore[union-attr]
                    self._ensure_capacity(n)
                # v.log_map is the writable mapping (make_active): no check on the hot path
                if self._io.intercept_map_writes:
                    self._io.map_write(v.log_map, pos, builder.getvalue())  # type: ignore[arg-type]
                else:
                    builder.copy_to(v.log_map, pos)  # type: ignore[arg-type]
            if largest_timestamp > v.max_timestamp:
                v.max_timestamp = largest_timestamp
                v.offset_of_max_timestamp = offset_of_max_timestamp
            if indexed:
                self.offset_index.append(largest_offset, pos)
                self.time_index.maybe_append(v.max_timestamp, v.offset_of_max_timestamp)
                self._bytes_since_last_index_entry = 0
                self._index_room -= 1    # at most one entry each: recounted when it runs out
                if self._index_room <= 0:
                    self._update_indexes_full()
        except BaseException as e:  # nothing of a failed append stays: entries, max time, bytes
            for idx in (self.offset_index, self.time_index):
                idx.truncate_to(builder.base_offset)
            self._max_ts = None              # recounted from the batches that stay
            self._runway.unwrite(pos, n, e)  # type: ignore[union-attr]
            raise
        if pos == 0:
            self._rolling_ts = largest_timestamp
        self._bytes_since_last_index_entry += n
        v.size = end

    # -- roll ------------------------------------------------------------------------------

    def first_batch_timestamp(self) -> int:
        """The first batch's max timestamp (what time-based roll and max.compaction.lag.ms
        measure from), -1 if the segment is empty or its first batch has none."""
        if self._rolling_ts is None:
            ts = -1
            if self.size >= 17:
                head = self.mapping().read(0, min(self.size, 61))
                magic = head[16]
                if magic == 2 and len(head) >= 43:
                    ts = int.from_bytes(head[35:43], "big", signed=True)
                elif magic == 1 and len(head) >= 26:
                    ts = int.from_bytes(head[18:26], "big", signed=True)
            self._rolling_ts = ts
        return self._rolling_ts

    def should_roll(self, incoming_bytes: int, max_timestamp: int, max_offset: int, now: int) -> bool:
        """Kafka's shouldRoll: size, age (with jitter), a full index, or a relative-offset overflow."""
        cfg = self._config
        size = self.view.size
        if size > cfg.segment_bytes - incoming_bytes:
            return True
        if size > 0:
            ts = self._rolling_ts
            if ts is None:
                ts = self.first_batch_timestamp()
            waited = max_timestamp - ts if ts >= 0 else now - self.created
            if waited > cfg.max_segment_ms - self.roll_jitter_ms:
                return True
        if self._indexes_full:
            return True
        rel = max_offset - self.base_offset
        return rel < 0 or rel > INT32_MAX

    def _update_indexes_full(self) -> None:
        """Recount the room left in both indexes (their is_full() rules: the time index keeps
        one slot for the final entry); append counts it down instead of asking per entry."""
        oi, ti = self.offset_index, self.time_index
        self._index_room = min(oi.max_entries - oi.entries, ti.max_entries - 1 - ti.entries)
        self._indexes_full = self._index_room <= 0

    def on_become_inactive(self) -> None:
        """At roll: final time-index entry, trim both indexes and the .log, map read-only."""
        with self._lock:
            ts, off = self.load_max_timestamp()
            if ts >= 0:
                self.time_index.maybe_append(ts, off, skip_full_check=True)
            self.offset_index.trim_to_valid_size()
            self.time_index.trim_to_valid_size()
            if self._map_writable:
                fd, old = self._active_file()
                self._stop_runway()
                self._io.truncate(fd, self.size)
                self._map = self._io.map(fd, self.size, False)
                self._map_writable = False
                old.close()

    # -- read ------------------------------------------------------------------------------

    # -- recovery --------------------------------------------------------------------------
    def _install_indexes(self, res: dict, next_active: bool = False) -> None:
        """Replace both indexes with the entries of a recover_scan result (plus Kafka's final
        time entry for the max timestamp). next_active: the segment becomes the active one
        next, so an index file still at its preallocated length keeps it."""
        times = res["time_entries"]
        mts, moff = (res["max_timestamp"], res["offset_of_max_timestamp"])
        if mts >= 0 and (len(times) == 0 or mts > int(times["timestamp"][-1])):
            # the final entry Kafka's recover() writes with skip_full_check
            # (built in the on-disk dtype: np.concatenate would canonicalise to native order)
            grown = np.zeros(len(times) + 1, dtype=_core.TIME_DTYPE)
            grown[:-1] = times
            grown["timestamp"][-1] = mts
            grown["relative_offset"][-1] = moff - self.base_offset
            times = grown
        oidx, tidx = self._oidx, self._tidx
        if oidx is None:      # not loaded yet: no need to open the file being replaced
            oidx = self._oidx = OffsetIndex(self.offset_index_path, self.base_offset,
                                            self._config.max_index_size, io=self._io, load=False)
            self.view.index = oidx.state
        if tidx is None:
            tidx = self._tidx = TimeIndex(self.time_index_path, self.base_offset,
                                          self._config.max_index_size, io=self._io, load=False)
            self.view.tindex = tidx.state
        oidx.rewrite(res["offset_entries"], next_active)
        tidx.rewrite(times, next_active)
        self._update_indexes_full()

    def _rebuild_indexes(self) -> None:
        """Rebuild both indexes from the valid batches of the .log as it is (no truncation, the
        mapping kept: a reader may hold it)."""
        m = self.mapping()
        end = min(self.size, m.length)
        max_index = self._config.max_index_size
        res = _core.recover_scan(m, end, self.base_offset, self._config.index_interval_bytes,
                                 max_index // 8, max_index // 12 - 1)
        if res.status == "overflow":
            raise LogSegmentOffsetOverflowError(f"{res['reason']} in {self.log_path}")
        self._install_indexes(res)

    def recover(self, upper_bound: Optional[int] = None, next_active: bool = False,
                epochs: bool = True) -> SegmentRecovery:
        """Validate every batch, rebuild both indexes and cut the invalid tail (Kafka's recover).

        A batch whose offsets fall below the base offset, go back, or reach upper_bound (the next
        segment's base) is invalid too (recover_scan). Raises LogSegmentOffsetOverflowError if a
        batch's offset does not fit. next_active: the log's last segment, made active with the
        scan's descriptor, mapped writable (no second open and map): index files left at their
        preallocated length rewritten in place, a zero tail kept. epochs=False: none reported."""
        with self._lock:
            was_active = self._map_writable
            self._drop_mapping()
            fd = self._io.open(self.log_path, os.O_RDWR)
            handoff, m = next_active and not was_active, None
            try:
                flen = self._io.size(fd)
                self.check_length(flen)
                m = self._io.map(fd, self._active_length(flen) if handoff else flen, handoff)
                try:
                    max_index = self._config.max_index_size
                    res = _core.recover_scan(m, flen, self.base_offset, self._config.index_interval_bytes,
                                             max_index // 8, max_index // 12 - 1,
                                             upper_bound=-1 if upper_bound is None else upper_bound,
                                             threads=RECOVERY_CRC_THREADS, epochs=epochs)
                finally:
                    if not handoff:
                        m.close()
                if res.status == "overflow":
                    raise LogSegmentOffsetOverflowError(f"{res['reason']} in {self.log_path}")
                valid = res["valid_bytes"]
                truncated = flen - valid
                # the zero tail of the segment made active next is its runway: kept (as a live
                # writer's, no reader takes a zero header for a batch; the first appends need
                # no zero_fill), else cut in place (the bytes past the valid ones are none a
                # read-only reader validated, so none it maps)
                self._zero_runway = flen if next_active and res["tail_zero"] else 0
                if flen > valid and not self._zero_runway:
                    self._io.truncate(fd, valid)
                    flen = valid
                self.size = valid
                self._max_ts = (res["max_timestamp"], res["offset_of_max_timestamp"]) \
                    if res["max_timestamp"] >= 0 else (-1, -1)
                self._rolling_ts = res["first_batch_timestamp"] if res["batches"] else None
                self._install_indexes(res, next_active or was_active)
                if handoff:
                    self._activate(fd, flen, m)
            except BaseException:
                if handoff and m is not None and self._map is not m:
                    m.close()
                raise
            finally:
                if self._fd != fd:         # not handed to _activate
                    self._io.close(fd)
            if was_active:
                self.make_active()
            return SegmentRecovery(
                segment=self.log_path, status=res.status, reason=res.reason,
                valid_bytes=valid, truncated_bytes=truncated, tail_zero=res["tail_zero"],
                batches=res["batches"], next_offset=res["next_offset"],
                max_timestamp=res["max_timestamp"],
                offset_of_max_timestamp=res["offset_of_max_timestamp"],
                first_batch_timestamp=res["first_batch_timestamp"], epochs=tuple(res.epochs))

    # -- truncation ------------------------------------------------------------------------
    def truncate_to(self, offset: int, replace: bool = False) -> int:
        """Remove batches with last offset >= offset (batch-granular); returns bytes removed.
        replace=True gives the .log a new file even if nothing is cut (a rolled segment about to
        take appends again: readers may treat the old file as complete)."""
        with self._lock:
            pos = self.translate_offset(offset)
            self.offset_index.truncate_to(offset)
            self.time_index.truncate_to(offset)
            if self._map_writable or replace:
                self.offset_index.resize(self._config.max_index_size)
                self.time_index.resize(self._config.max_index_size)
            removed = 0
            if pos is not None or replace:
                removed = self.size - pos if pos is not None else 0
                self._truncate_log(self.size if pos is None else pos, replace)
            if self.size == 0:
                self.created = self._time.milliseconds()
                self._rolling_ts = None
            self._bytes_since_last_index_entry = bytes_since_entry(self.offset_index, self.size)
            self._max_ts = self._scan_max_timestamp()
            self._update_indexes_full()
            return removed

    def _truncate_log(self, position: int, force: bool = False) -> None:
        """Cut the .log to position by replacing the file: the kept prefix goes to a temporary
        file, fsynced and renamed over the segment (directory fsynced), which is then mapped.
        The old inode is never shrunk or zeroed, so a reader holding its mapping reads the
        records as they were just before the cut instead of zeros (CRC errors) or pages past
        its end (SIGBUS). A crash leaves the old file or the new one; the load removes the
        temporary. The smaller size is published before the new mapping: no (mapping, size)
        pair a reader can take reaches past a file's end."""
        if position >= self.size and not force:
            return
        io = self._io
        tmp = self.log_path + TRUNCATE_TEMP_SUFFIX
        old_map, old_fd, writable = self._map, self._fd, self._map_writable
        src = self.mapping()
        fd = io.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        try:
            with memoryview(src) as mv:
                for a in range(0, position, COPY_CHUNK):
                    io.pwrite(fd, mv[a:min(position, a + COPY_CHUNK)], a)
            io.fsync(fd)
            io.rename(tmp, self.log_path)
        except BaseException:
            io.close(fd)
            try:
                io.unlink(tmp)
            except OSError:
                pass
            raise
        self._stop_runway()       # the old file is gone: nothing grows it any more
        self.size = position
        map_len = _page_round_up(max(self._config.segment_bytes, position, 1))
        try:
            if writable:
                new_map = io.map(fd, map_len, True)
            else:
                new_map = io.map(fd, position, False) if position else _core.Mapping.from_bytes(b"")
        except BaseException:
            io.close(fd)
            raise
        self._map = new_map
        if writable:
            self._fd = fd
            self._runway = Runway(io, fd, new_map, position, self.log_path)
            if old_fd is not None:
                io.close(old_fd)
        else:
            io.close(fd)
        if old_map is not None:
            old_map.close()
        if src is not old_map:
            src.close()
        if writable and self._config.preallocate and map_len > position:
            io.allocate(fd, position, map_len - position)
            self._runway.alloc = map_len  # type: ignore[union-attr]
        io.fsync_dir(self.dir)

    # -- durability and life cycle -----------------------------------------------------------
    def flush(self) -> None:
        """fsync the .log (and its mapping) and flush both index mappings."""
        with self._lock:
            if self.closed:
                return
            if self._map_writable:
                fd, m = self._active_file()
                self._io.map_flush(m, 0, self.size)
                self._io.fsync(fd)
            else:
                fd = self._io.open(self.log_path, os.O_RDONLY)
                try:
                    self._io.fsync(fd)
                finally:
                    self._io.close(fd)
            if self._oidx is not None:
                self._oidx.flush()
            if self._tidx is not None:
                self._tidx.flush()

    def _stop_runway(self) -> None:
        """No runway growth (the writer's or the pretoucher's) touches the descriptor after this."""
        if (rw := self._runway) is not None:
            rw.stop()
        self._runway = None

    def _drop_mapping(self) -> None:
        self._stop_runway()
        if self._map is not None:
            self._map.close()
            self._map = None
        if self._fd is not None:
            self._io.close(self._fd)
            self._fd = None
        self._map_writable = False

    def close(self) -> None:
        """Final time entry, trim indexes and .log to their used sizes, unmap."""
        with self._lock:
            if self.closed:
                return
            try:
                if self._map_writable:
                    ts, off = self.load_max_timestamp()
                    if ts >= 0:
                        self.time_index.maybe_append(ts, off, skip_full_check=True)
                    fd, _m = self._active_file()
                    self._stop_runway()
                    self._io.truncate(fd, self.size)
                    # durable before a clean-shutdown marker can be: a lost trim would bring
                    # the preallocated zeros back behind a marker that skips recovery
                    self._io.fsync(fd)
                if self._oidx is not None:
                    self._oidx.close(durable=True)
                if self._tidx is not None:
                    self._tidx.close(durable=True)
            finally:
                self._drop_mapping()
                self.closed = True

    def close_handlers(self) -> None:
        """Release maps and descriptors without trimming (used before deleting files)."""
        self.settle_size()
        with self._lock:
            self._drop_mapping()
            self.view.index = None
            self.view.tindex = None
            if self._oidx is not None:
                self._oidx.close_handler()
            if self._tidx is not None:
                self._tidx.close_handler()
            self.closed = True
