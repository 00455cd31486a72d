"""Loading a partition directory into segments and offsets (Kafka's LogLoader): interrupted swaps
finished, orphan and temporary files removed, missing indexes rebuilt, the segments after the
recovery point validated after an unclean shutdown, overflowed segments split. A read-only log's
segments are listed and validated here too. The Log publishes what the loader returns.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
from typing import Optional

from kstore import _core, swap
from kstore.config import LogConfig
from kstore.errors import LogSegmentOffsetOverflowError, SegmentGoneError, UnknownTopicError
from kstore.fileio import FileOps
from kstore.files import (CLEANED_SUFFIX, INDEX_SUFFIX, INDEX_SUFFIXES, LOG_SUFFIX, SWAP_SUFFIX,
                          TIME_INDEX_SUFFIX, parse_name, segment_file)
from kstore.log_segments import LogSegments
from kstore.segment import LogSegment, SegmentRecovery
from kstore.segment_ro import ReadOnlySegment

log = logging.getLogger("kstore.log")

INT32_MAX = (1 << 31) - 1
#: Written in a standalone (unmanaged) log's directory by close(); its presence at open means
#: the log was closed cleanly. Kafka brokers ignore unknown files in a partition directory.
STANDALONE_CLEAN_MARKER = ".kstore-clean-shutdown"


@dataclasses.dataclass(frozen=True)
class LoadedLogOffsets:
    """What a load found (Kafka's LoadedLogOffsets, with the segments themselves)."""
    segments: LogSegments
    log_start_offset: int
    recovery_point: int
    log_end_offset: int
    #: one entry per segment recovery ran on (none after a clean shutdown)
    recovery_report: list[SegmentRecovery]


class LogLoader:
    """Loads one partition directory; one instance per load (it keeps the recovery report)."""

    def __init__(self, dir_: str, config: LogConfig, *, io: FileOps, time,
                 rng: random.Random) -> None:
        self.dir = dir_
        self._config = config
        self._io = io
        self._time = time
        self._rng = rng
        self._report: list[SegmentRecovery] = []
        self._made: list[LogSegment] = []     # closed if the load fails

    def _segment(self, base: int, **kw) -> LogSegment:
        seg = LogSegment(self.dir, base, self._config, io=self._io, time=self._time,
                         rng=self._rng, **kw)
        self._made.append(seg)
        return seg

    # -- writable logs -----------------------------------------------------------------------
    def load(self, recovery_point: Optional[int], log_start_offset: Optional[int],
             clean_shutdown: Optional[bool]) -> LoadedLogOffsets:
        """Load the directory (which exists). clean_shutdown None: a standalone log, whose
        clean close is told by its marker file (removed here). If the load fails, no segment
        it opened keeps a mapping or descriptor."""
        try:
            return self._load(recovery_point, log_start_offset, clean_shutdown)
        except BaseException:
            for seg in self._made:
                seg.close_handlers()
            raise

    def _load(self, recovery_point: Optional[int], log_start_offset: Optional[int],
              clean_shutdown: Optional[bool]) -> LoadedLogOffsets:
        io = self._io
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
        swap.complete_swaps(io, self.dir, self._swap_end)
        segs = self._load_segment_files()
        # Kafka: logStart = max(checkpoint, first base)
        start = log_start_offset or 0
        if segs:
            start = max(start, segs[0].base_offset)
        if recovery_point is None:
            recovery_point = 0
        segs = self._recover_missing_indexes(segs)
        if clean_shutdown:
            leo = segs[-1].read_next_offset() if segs else start
        else:
            segs, leo = self._recover_log(segs, recovery_point)
        if segs and leo < start:
            # LEO below the checkpointed start: everything is gone (testLogEndLessThanStartAfterReopen)
            for s in segs:
                s.delete()
            segs = []
        if not segs:
            segs = [self._segment(start)]
            leo = start
            io.fsync_dir(self.dir)
        # clean: everything is durable; unclean: Kafka's min(checkpoint, LEO). Offsets below the
        # first segment do not exist, so the point is never below its base.
        rp = leo if clean_shutdown else min(recovery_point, leo)
        rp = max(rp, segs[0].base_offset)
        segs[-1].make_active()
        return LoadedLogOffsets(LogSegments(segs), start if start <= leo else leo, rp, leo,
                                self._report)

    def _swap_end(self, base: int) -> int:
        """One past the last offset of the .log.swap at base."""
        swap_seg = self._segment(base, file_already_exists=True, suffix=SWAP_SUFFIX)
        try:
            return swap_seg.read_next_offset()
        finally:
            swap_seg.close_handlers()

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
            seg = self._segment(base, file_already_exists=True)
            # Kafka: a missing .index means recovery; a missing .timeindex is recreated too
            prefix = f"{base:020d}"
            seg.needs_recovery = (prefix + INDEX_SUFFIX not in present
                                  or prefix + TIME_INDEX_SUFFIX not in present)
            segs.append(seg)
        return segs

    def _recover_log(self, segs: list[LogSegment],
                     recovery_point: int) -> tuple[list[LogSegment], int]:
        """Unclean shutdown: recover segments from floor(recovery_point) onward (Kafka's
        recoverLog); after the first segment that loses bytes to corruption, later segments go.
        Returns the segments kept and the log end offset."""
        i = LogSegments(segs).floor_index(recovery_point)
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
            if res.truncated_bytes > 0 and not (not todo and res.tail_zero):
                if todo:
                    log.warning("corruption in segment %s (%s): deleting %d later segment(s)",
                                seg.log_path, res.reason, len(todo))
                truncated = True
        return kept, kept[-1].read_next_offset() if kept else 0

    def _recover_missing_indexes(self, segs: list[LogSegment]) -> list[LogSegment]:
        """Segments whose .index or .timeindex is missing are recovered whatever the shutdown."""
        out = []
        for seg in segs:
            if seg.needs_recovery:
                try:
                    self._recover_segment(seg)
                except LogSegmentOffsetOverflowError:
                    for piece in self._split_overflowed_segment(seg):
                        self._recover_segment(piece)
                        out.append(piece)
                    continue
            out.append(seg)
        return out

    def _split_overflowed_segment(self, seg: LogSegment) -> list[LogSegment]:
        """Rewrite a segment whose offsets do not fit 32-bit relative offsets as several
        segments, each named by its first batch's base offset (KAFKA-6264), crash-safely:
        durable .cleaned files swapped in for the segment (swap.swap_in)."""
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
        swap.swap_in(io, self.dir, written, [seg], suffixes=(LOG_SUFFIX,))
        seg.delete()
        io.fsync_dir(self.dir)
        pieces = []
        for base in written:
            piece = self._segment(base, file_already_exists=True)
            piece.needs_recovery = True
            pieces.append(piece)
        return pieces

    def _recover_segment(self, seg: LogSegment, upper_bound: Optional[int] = None) -> SegmentRecovery:
        res = seg.recover(upper_bound)
        if res.truncated_bytes and not res.tail_zero:
            log.warning("recovered %s: truncated %d invalid bytes (%s)", seg.log_path,
                        res.truncated_bytes, res.reason)
        self._report.append(res)
        return res

    # -- read-only logs ----------------------------------------------------------------------
    def scan_read_only(self, old: LogSegments) -> Optional[list[ReadOnlySegment]]:
        """The directory's segments for a read-only log, reusing those of old: the last one
        (and every one validated before) validated now; None if one vanished meanwhile (the
        caller lists again). Segments dropped from the list are not closed: a reader thread may
        still be reading them.

        A segment swap in progress (compaction, an overflow split, a load finishing either) is
        read as the writer's next load would finish it (swap.complete_swaps): each live
        `.log.swap` is the segment at its base and replaces the `.log`s of [its base, its end).
        Between the writer's `.deleted` renames of the old segments and its final rename of the
        `.swap`, no `.log` covers that range: a listing of `.log`s alone would start the log
        after it (the log start jumps up and sticks) or read across it (records skipped)."""
        present = self.list_segment_bases()
        bases, swaps = present
        # reused only under the same file name: a swap's segment is not the final name's
        by_path = {s.log_path: s for s in old if isinstance(s, ReadOnlySegment) and not s.closed}
        try:
            swapped: list[tuple[int, int, ReadOnlySegment]] = []
            for base in swaps:
                s = by_path.get(segment_file(self.dir, base, LOG_SUFFIX, SWAP_SUFFIX))
                if s is None:
                    s = self._ro_segment(base, SWAP_SUFFIX)
                s.ro_next_base = None
                if not s.refresh_read_only(False):
                    # a later swap's file under the same name (the next clean from this base):
                    # read through a new segment (not a reason to list again: every retry would
                    # see the same stale view)
                    s = self._ro_segment(base, SWAP_SUFFIX)
                    s.refresh_read_only(False)
                swapped.append((base, max(s.read_next_offset(), base + 1), s))
            segs = [s for _b, _e, s in swapped]
            for base in bases:
                if any(b <= base < e for b, e, _s in swapped):
                    continue           # replaced by the swap (the writer deletes it next)
                s = by_path.get(segment_file(self.dir, base, LOG_SUFFIX))
                segs.append(s if s is not None else self._ro_segment(base))
            segs.sort(key=lambda seg: seg.base_offset)
            for i, s in enumerate(segs):
                # the last segment is validated now and re-validated whenever its file length
                # differs from what was validated (it grows; one that was last may have grown
                # before its roll); the others are validated when a read first maps them
                last = i == len(segs) - 1
                s.ro_next_base = None if last else segs[i + 1].base_offset
                if (s.ro_scanned or last) and not s.refresh_read_only(last):
                    # the file was replaced
                    segs[i] = s = self._ro_segment(s.base_offset, s.ro_suffix)
                    s.ro_next_base = None if last else segs[i + 1].base_offset
                    if last:
                        s.refresh_read_only(last)
        except (SegmentGoneError, FileNotFoundError):
            return None
        # a listing taken while the writer deletes or creates segments can miss one in the
        # middle (readdir is not atomic); one that still holds after the validations is a
        # view of one moment (the writer deletes tail segments last-first, see truncate_to)
        if self.list_segment_bases() != present:
            return None
        return segs

    def list_segment_bases(self) -> tuple[list[int], list[int]]:
        """Base offsets of the live .log files in the directory, sorted, and of the live
        .log.swap files: those a load would finish (swap.split_swaps: not at or above a
        `.cleaned` file's base, which marks a swap not fully made)."""
        try:
            names = self._io.listdir(self.dir)
        except FileNotFoundError:
            raise UnknownTopicError(f"partition directory {self.dir} was deleted") from None
        logs: list[int] = []
        swaps: list[tuple[int]] = []
        cleaned: list[int] = []
        for p in (parse_name(n, self.dir) for n in names):
            if not p:
                continue
            if not p[2]:
                if p[1] == LOG_SUFFIX:
                    logs.append(p[0])
            elif p[2] == CLEANED_SUFFIX:
                cleaned.append(p[0])
            elif p[2] == SWAP_SUFFIX and p[1] == LOG_SUFFIX:
                swaps.append((p[0],))
        live, _void = swap.split_swaps(swaps, cleaned)
        return sorted(logs), sorted(b for (b,) in live)

    def _ro_segment(self, base: int, suffix: str = "") -> ReadOnlySegment:
        return ReadOnlySegment(self.dir, base, self._config, io=self._io, time=self._time,
                               rng=self._rng, suffix=suffix)
