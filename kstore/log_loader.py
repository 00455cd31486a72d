"""Loading a partition directory into segments and offsets (Kafka's LogLoader): interrupted swaps
finished, orphan and temporary files removed, missing indexes rebuilt, the segments after the
recovery point validated after an unclean shutdown, overflowed segments split. A read-only log's
segments are listed and validated here too. The Log publishes what the loader returns.
"""
from __future__ import annotations

import bisect
import dataclasses
import logging
import os
import random
from typing import Callable, Optional

from kstore import _core, swap
from kstore._listing import split_listing
from kstore.config import LogConfig
from kstore.errors import LogSegmentOffsetOverflowError, SegmentGoneError, UnknownTopicError
from kstore.fileio import FileOps
from kstore.files import (CLEANED_SUFFIX, DELETED_SUFFIX, INDEX_SUFFIX, LOG_SUFFIX, SWAP_SUFFIX,
                          TIME_INDEX_SUFFIX, parse_name, segment_file)
from kstore.log_segments import LogSegments
from kstore.marker_gate import gate_for, remove_marker
from kstore.notify import NOTIFY_FILE
from kstore.segment import LogSegment, SegmentRecovery
from kstore.segment_ro import ReadOnlySegment
from kstore.start_file import (LOG_START_FILE, MANAGER_CLEAN_MARKER, STANDALONE_CLEAN_MARKER,
                               carry_to_manager,
                               checkpointed_start, read_saved_start)

log = logging.getLogger("kstore.log")

INT32_MAX = (1 << 31) - 1
#: the names swap.complete_swaps acts on (removes, discards or completes): a listing without
#: one needs no pass of it
_SWAP_LEFTOVERS = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX, ".tmp")


@dataclasses.dataclass(frozen=True)
class LoadedLogOffsets:
    """What a load found (Kafka's LoadedLogOffsets, with the segments themselves)."""
    segments: LogSegments
    log_start_offset: int
    recovery_point: int
    log_end_offset: int
    #: one entry per segment recovery ran on (none after a clean shutdown)
    recovery_report: list[SegmentRecovery]
    #: whether the directory held a writer's notification page (notify.NOTIFY_FILE) when
    #: listed: without one the log makes it at once (a fresh partition), else at first use
    notify_page: bool = True


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

    @staticmethod
    def file_ops(io: FileOps, standalone: bool, read_only: bool) -> FileOps:
        """The FileOps a log opened with io uses: a writable standalone log's goes behind a
        MarkerGate, through which its load removes the clean-shutdown marker in the
        background (a LogManager gates its own)."""
        return gate_for(io, standalone=standalone, read_only=read_only)

    # -- writable logs -----------------------------------------------------------------------
    def load(self, recovery_point: Optional[int], log_start_offset: Optional[int],
             clean_shutdown: Optional[bool], listing: Optional[list[str]] = None) -> LoadedLogOffsets:
        """Load the directory (which exists). clean_shutdown None: a standalone log, whose
        clean close is told by its marker file (removed here). listing: the directory's names
        if the caller listed it just before (a LogManager's start-up, which holds the log dir:
        nothing else changes the directory), so it is not listed again. If the load fails, no
        segment it opened keeps a mapping or descriptor."""
        try:
            return self._load(recovery_point, log_start_offset, clean_shutdown, listing)
        except BaseException:
            for seg in self._made:
                seg.close_handlers()
            raise

    def _load(self, recovery_point: Optional[int], log_start_offset: Optional[int],
              clean_shutdown: Optional[bool], listing: Optional[list[str]]) -> LoadedLogOffsets:
        io = self._io
        marker = os.path.join(self.dir, STANDALONE_CLEAN_MARKER)
        standalone = clean_shutdown is None
        if standalone:
            # standalone: the marker is deleted before loading, so a crash during this open
            # is itself recovered next time (KAFKA-10471)
            clean_shutdown = False
            saved = os.path.join(self.dir, LOG_START_FILE)
            if io.exists(marker):
                clean_shutdown, start = read_saved_start(io, marker, "clean-shutdown marker")
                if log_start_offset is None:
                    log_start_offset = start
                # durably gone before any file changes: in the background (marker_gate)
                remove_marker(io, marker, self.dir)
            elif log_start_offset is None and io.exists(saved):
                log_start_offset = read_saved_start(io, saved, "log start file")[1]
            elif log_start_offset is None:          # a LogManager's life before this one
                log_start_offset = checkpointed_start(io, self.dir)
            # the log dir's clean-shutdown marker stops being true once this writer changes a
            # file: durably gone before any change, as the partition's own
            parent = os.path.dirname(os.path.abspath(self.dir))
            if io.exists(os.path.join(parent, MANAGER_CLEAN_MARKER)):
                remove_marker(io, os.path.join(parent, MANAGER_CLEAN_MARKER), parent)
        names = listing if listing is not None else io.listdir(self.dir)
        if not standalone:
            left = [n for n in (STANDALONE_CLEAN_MARKER, LOG_START_FILE) if n in names]
            if left:
                # a standalone life's start, newer than the checkpoint's, carried into it;
                # then its files durably gone before any change: the manager's checkpoints
                # rule now, and a standalone open after a crash must recover
                log_start_offset = carry_to_manager(io, self.dir, left, log_start_offset)
            for name in left:
                remove_marker(io, os.path.join(self.dir, name), self.dir)
        split = split_listing(names)
        if any(n.endswith(_SWAP_LEFTOVERS) for n in split[2]):
            # only a suffixed or temporary name gives complete_swaps work: most loads skip it
            done = swap.complete_swaps(io, self.dir, self._swap_end, names)
            split = split_listing(done if done is not None else io.listdir(self.dir))
        segs = self._load_segment_files(split)
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
        if segs:
            # again after recovery, as Kafka computes it: an overflow split names each piece
            # after its first batch, which may lie above the old first base
            start = max(start, segs[0].base_offset)
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
                                self._report, NOTIFY_FILE in names)

    def _swap_end(self, base: int) -> int:
        """One past the last offset of the .log.swap at base."""
        swap_seg = self._segment(base, file_already_exists=True, suffix=SWAP_SUFFIX)
        try:
            return swap_seg.read_next_offset()
        finally:
            swap_seg.close_handlers()

    def _load_segment_files(self, split: tuple[list[int], list[tuple[int, str]], list[str]]
                            ) -> list[LogSegment]:
        """A segment per live .log (split: the directory's listing as split_listing splits
        it); orphaned indexes deleted; a segment missing an index is marked for recovery."""
        io = self._io
        logs, indexes = segment_names(split, self.dir)
        live = set(logs)
        with_index, with_time = set(), set()
        for base, name in sorted(indexes):
            if base not in live:
                log.warning("deleting orphaned index file %s", os.path.join(self.dir, name))
                io.unlink(os.path.join(self.dir, name))
            elif name.endswith(INDEX_SUFFIX):
                with_index.add(base)
            elif name.endswith(TIME_INDEX_SUFFIX):
                with_time.add(base)
        segs = []
        for base in logs:
            # lazy_size: no stat now; the segments the load recovers (or makes active) read
            # their size then, the others on first use
            seg = self._segment(base, file_already_exists=True, lazy_size=True)
            # Kafka: a missing .index means recovery; a missing .timeindex is recreated too
            seg.needs_recovery = base not in with_index or base not in with_time
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
        # the log end as the last kept segment's recovery found it: no second mapping and
        # header scan of the segment just validated
        leo: Optional[int] = None
        while todo:
            seg = todo.pop(0)
            if truncated:
                seg.delete()
                continue
            try:
                res = self._recover_segment(seg, todo[0].base_offset if todo else None,
                                            next_active=not todo)
            except LogSegmentOffsetOverflowError:
                todo[:0] = self._split_overflowed_segment(seg)
                continue
            kept.append(seg)
            leo = res.next_offset if res.next_offset >= 0 else seg.base_offset
            if res.truncated_bytes > 0 and not (not todo and res.tail_zero):
                if todo:
                    log.warning("corruption in segment %s (%s): deleting %d later segment(s)",
                                seg.log_path, res.reason, len(todo))
                truncated = True
        if leo is None:
            leo = kept[-1].read_next_offset() if kept else 0
        return kept, leo

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

    def _recover_segment(self, seg: LogSegment, upper_bound: Optional[int] = None,
                         next_active: bool = False) -> SegmentRecovery:
        res = seg.recover(upper_bound, next_active)
        if res.truncated_bytes and not res.tail_zero:
            log.warning("recovered %s: truncated %d invalid bytes (%s)", seg.log_path,
                        res.truncated_bytes, res.reason)
        self._report.append(res)
        return res

    # -- read-only logs ----------------------------------------------------------------------
    def scan_read_only(self, old: LogSegments,
                       settled: Optional[Callable[[], bool]] = None) -> Optional[list[ReadOnlySegment]]:
        """The directory's segments for a read-only log, reusing those of old: the last one
        (and every one validated before) validated now; None if one vanished meanwhile (the
        caller lists again). Segments dropped from the list are not closed: a reader thread may
        still be reading them.

        A segment swap in progress (compaction, an overflow split, a load finishing either) is
        read as the writer's next load would finish it (swap.complete_swaps): each live
        `.log.swap` is the segment at its base and replaces the `.log`s of [its base, its end).
        Between the writer's `.deleted` renames of the old segments and its final rename of the
        `.swap`, no `.log` covers that range: a listing of `.log`s alone would start the log
        after it (the log start jumps up and sticks) or read across it (records skipped).

        A listing is not atomic (readdir may miss a name created or removed while it runs), so
        the directory is listed again after the validations, and the scan is accepted only if
        the second listing confirms the first (stable_run): equal, or, with no swap in either,
        differing only by segments the writer removed from the head (retention, DeleteRecords)
        and segments it added above the first listing's last one (rolls). A writer that keeps
        rolling makes no two listings equal; this rule lets the reader progress beside it.
        A head segment that vanished during the validations is one retention took: the second
        listing must confirm it (it is in the removed head), else the scan is retried.

        settled, if given, tells after the validations whether the directory cannot have
        changed since before the first listing (ro_refresh.DirWatch): then the second listing
        would equal the first and is not made. Segments made here and not returned (an attempt
        thrown away, a dropped head) release the .log descriptor a last one keeps."""
        made: list[ReadOnlySegment] = []

        def new(base: int, suffix: str = "") -> ReadOnlySegment:
            s = self._ro_segment(base, suffix)
            made.append(s)
            return s
        segs = None
        try:
            segs = self._scan_listed(old, settled, new)
            return segs
        finally:
            kept = {id(s) for s in segs or ()}
            for s in made:
                if id(s) not in kept:
                    s.release_fd()

    def _scan_listed(self, old: LogSegments, settled: Optional[Callable[[], bool]],
                     new: Callable[..., ReadOnlySegment]) -> Optional[list[ReadOnlySegment]]:
        """scan_read_only's listings and validations; new(base, suffix) makes a segment."""
        present = self.list_segment_bases()
        bases, swaps = present
        # reused only under the same file name: a swap's segment is not the final name's
        by_name = {(s.base_offset, s.ro_suffix): s for s in old
                   if isinstance(s, ReadOnlySegment) and not s.closed}
        try:
            swapped: list[tuple[int, int, ReadOnlySegment]] = []
            for base in swaps:
                s = by_name.get((base, SWAP_SUFFIX))
                if s is None:
                    s = new(base, SWAP_SUFFIX)
                s.ro_next_base = None
                if not s.refresh_read_only(False):
                    # a later swap's file under the same name (the next clean from this base):
                    # read through a new segment (not a reason to list again: every retry would
                    # see the same stale view)
                    s = new(base, SWAP_SUFFIX)
                    s.refresh_read_only(False)
                swapped.append((base, max(s.read_next_offset(), base + 1), s))
            segs = [s for _b, _e, s in swapped]
            for base in bases:
                if swapped and any(b <= base < e for b, e, _s in swapped):
                    continue           # replaced by the swap (the writer deletes it next)
                s = by_name.get((base, ""))
                segs.append(s if s is not None else new(base))
            segs.sort(key=lambda seg: seg.base_offset)
            gone = 0               # segs[:gone] hold one that vanished: retention's, if confirmed
            for i, s in enumerate(segs):
                # the last segment is validated now and re-validated whenever its file length
                # differs from what was validated (it grows; one that was last may have grown
                # before its roll); the others are validated when a read first maps them
                last = i == len(segs) - 1
                s.ro_next_base = None if last else segs[i + 1].base_offset
                try:
                    if (s.ro_scanned or last) and not s.refresh_read_only(last):
                        # the file was replaced
                        segs[i] = s = new(s.base_offset, s.ro_suffix)
                        s.ro_next_base = None if last else segs[i + 1].base_offset
                        if last:
                            s.refresh_read_only(last)
                except (SegmentGoneError, FileNotFoundError):
                    if last or swaps:
                        raise
                    gone = i + 1
        except (SegmentGoneError, FileNotFoundError):
            return None
        head = stable_run(present, present if settled is not None and settled()
                          else self.list_segment_bases())
        if head is None or head < gone:
            return None
        return segs[head:]

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
        for n in names:
            p = parse_name(n, self.dir)
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


def segment_names(split: tuple[list[int], list[tuple[int, str]], list[str]],
                  dir_: str) -> tuple[list[int], list[tuple[int, str]]]:
    """The base offsets of the live `.log` files (sorted) and (base, name) of the live index
    files, from a listing as _scan.split_listing splits it (the plain names read in one
    compiled pass); the other names go through files.parse_name, which refuses a 20-digit
    base offset above 2^63-1 by name."""
    logs, indexes, others = split
    for name in others:
        parse_name(name, dir_)
    return logs, indexes


def stable_run(first: tuple[list[int], list[int]],
               second: tuple[list[int], list[int]]) -> Optional[int]:
    """Whether a read-only scan built on the listing first (its `.log` bases and live `.swap`
    bases, sorted) may publish it, given the listing second taken after its validations: None
    if not (the caller lists again), else how many of first's segments to drop from its head.

    readdir returns every name present throughout it and may miss one created or removed
    meanwhile, so one listing can hold a hole: a segment retention removed, missed, above one
    it had not removed yet; a tail segment truncation deleted (last first), seen, above one it
    deleted after, missed; a segment a swap retired, missed, beside an old one seen. The
    writer changes the `.log` bases only by adding one above the highest (roll, or a new
    segment after truncation), removing the lowest (retention, DeleteRecords, lowest first),
    removing the highest (truncation, highest first) or, within a swap (its `.swap` present
    throughout), retiring segments inside its range. Accepted:

    - second == first: the rule this extends (a listing unchanged across the validations);
    - with no `.swap` in either, second == first[k:] + added, every added base above first's
      last, first[k:] not empty: first[k:] is published, first[:k] dropped.

    Why first[k:] (m = first[k], M = first's last, both in second) is the run of segments from
    m to M at one moment. first[:k] are gone by second and below m, which stayed: retention
    took them (truncation takes the highest first, and M stayed; a swap retires an interior
    segment and renames its new one to the first base, changing the bases at or below M). The
    added bases are above M: rolls, picked up by the next refresh; a truncation followed by
    rolls creates bases at or below M and fails the rule, as does any swap completed between
    the listings (an interior base gone). A base X in (m, M) missed by first was created or
    removed while first was taken. Removed by retention, m went before it, so m would be gone
    by second; removed by truncation, M went before it, and M would be gone by second unless
    rolls re-created M and X, at their old offsets, X again missed. Created (a roll: above the
    highest then), X precedes M and stays until retention takes m and then X, which second,
    holding m, must also have missed. So a hole needs several writer steps inside single
    readdir calls, two listings missing the same segment: the equal rule is exposed to those
    alike (and a Linux getdents call, under the directory's lock, lists a partition's directory
    of up to hundreds of segments atomically).

    A `.swap` in either listing means a swap in progress: only an equal listing is accepted (a
    swap is a few renames; the next scan sees it done)."""
    if first == second:
        return 0
    (logs1, swaps1), (logs2, swaps2) = first, second
    if swaps1 or swaps2 or not logs1:
        return None
    # second's bases up to first's last must be first's last n bases, n >= 1
    n = bisect.bisect_right(logs2, logs1[-1])
    if n == 0 or logs2[:n] != logs1[len(logs1) - n:]:
        return None
    return len(logs1) - n
