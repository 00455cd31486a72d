"""isolation_level="read_committed": the last stable offset and aborted transactions of a log.

Kafka's consumer in read_committed mode returns records only below the partition's last stable
offset (LSO: the first offset of the earliest transaction still open, across all producers,
never below the log start; the broker's ProducerStateManager.firstUnstableOffset, whatever the
fetch offset) and drops the batches of aborted transactions (the broker sends their ranges from
its `.txnindex`). A kstore consumer finds both from the log itself: `TxnFilter` first learns
the transactions open at the position it starts at (txn_prefix.open_at: a header walk from the
first segment, kept per segment base), then walks the v2 batch headers forward, keeping each
producer's open transaction (its batch ranges) until the producer's control batch (an ABORT or
COMMIT marker, ControlRecordType key: version int16, type int16) ends it; an aborted one's
ranges are kept until the position passes them. One header parse per batch (no record decoded
except a marker's). Bytes are checked before use (CorruptRecordError naming the log and offset).
Guarantee: a reader placed anywhere (seek, committed offset, --offset) returns no record at or
past the first offset of a transaction open in the log, nor any aborted record; known limit: a
transaction whose first batch lies in a segment deleted before this process first walked the
log is not known (Kafka's producer snapshot keeps it).
"""
from __future__ import annotations

import struct
from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from kstore._core import Record, decode_batches
from kstore._txn_scan import last_whole_batch, producer_headers, txn_headers
from kstore.errors import CorruptRecordError, OffsetOutOfRangeError, SegmentGoneError
from kstore.read_skip import batch_heads
from kstore.txn_prefix import open_at

if TYPE_CHECKING:
    from kstore.log import Log

__all__ = ["TxnFilter", "producer_batches", "skip_control_batches", "transactional_batches"]

TRANSACTIONAL = 0x10
CONTROL = 0x20
ABORT = 0
COMMIT = 1
DATA = -1             # transactional_batches: a data batch,
EMPTY_CONTROL = -2    # a control batch a cleaner emptied (its records removed)
IDEMPOTENT = -3       # producer_batches: a non-transactional batch with a producer id
#: bytes of batches looked at per read_batches call
SCAN_BYTES = 1 << 20
_COUNT = struct.Struct(">i")         # records count at 57
_HEAD = struct.Struct(">qi")         # base offset, batch length
V2_HEADER = 61


def _check_walk(why, log_dir: str, pos: int) -> None:
    """txn_headers stopped at malformed bytes: CorruptRecordError naming the log."""
    if why is not None:
        raise CorruptRecordError(f"{log_dir}: {why} (scanning transactions at offset {pos})")


def _marker_type(view: memoryview, log_dir: str, base: int) -> int:
    recs = decode_batches(view, -1, True, True)
    key = recs[0].key if recs else None
    if key is None or len(key) < 4:
        raise CorruptRecordError(f"control batch at offset {base} of {log_dir} has no control key")
    return struct.unpack_from(">hh", key)[1]


def _walk(lg: "Log", start: int, scan):
    """(view, batches) of each read from start to the log end, batches being what scan (a
    _txn_scan walk) lists of the view's whole batches at or past the position. The segments
    are read themselves, below the log start too (what is left of the first segment, as
    Kafka's cleaner reads it), so the log start moving during the walk skips nothing; a segment
    removed under the walk (retention: below the log start) is passed over, its batches gone."""
    pos = start
    while pos < lg.log_end_offset:
        segs = lg.segments
        if not segs:
            return
        bases = [sg.base_offset for sg in segs]
        i = max(0, bisect_right(bases, pos) - 1)
        pos = max(pos, bases[i])
        try:
            view = segs[i].read_batches(pos, SCAN_BYTES)
        except (SegmentGoneError, ValueError, BufferError):
            view = None                              # removed under the walk
        moved = False
        if view:
            batches, last_whole, why = scan(view)
            yield view, [b for b in batches if b[1] >= pos]
            moved = last_whole >= pos
            if moved:
                pos = last_whole + 1
            _check_walk(why, lg.dir, pos)
        if not moved:
            if i + 1 >= len(segs):
                return
            pos = bases[i + 1]                       # the next segment (a compacted one's tail)


def _last_head(view: memoryview, batches: list) -> tuple[int, bytes] | None:
    """(base offset, first 21 bytes: base, length, epoch, magic, CRC) of the last whole batch
    of view (the one txn_headers' last offset ends); walked in C from the last transactional
    batch (batches: txn_headers')."""
    pos = last_whole_batch(view, batches[-1][4] if batches else 0)
    if pos < 0:
        return None
    base = _HEAD.unpack_from(view, pos)[0]
    return base, bytes(view[pos:pos + 21])


def _kind(view: memoryview, lg: "Log", attrs: int, base: int, s: int, e: int) -> int:
    if not attrs & TRANSACTIONAL:
        return IDEMPOTENT
    if not attrs & CONTROL:
        return DATA
    if _COUNT.unpack_from(view, s + 57)[0] == 0:
        return EMPTY_CONTROL
    return _marker_type(view[s:e], lg.dir, base)


def transactional_batches(lg: "Log", start: int):
    """(base, last, producer id, type) of each transactional v2 batch from `start` to the log end,
    in offset order: type DATA, EMPTY_CONTROL, or a marker's ControlRecordType (ABORT, COMMIT)."""
    for view, batches in _walk(lg, start, txn_headers):
        for base, last, pid, attrs, s, e in batches:
            yield base, last, pid, _kind(view, lg, attrs, base, s, e)


def producer_batches(lg: "Log", start: int):
    """(base, last, producer id, producer epoch, type, max timestamp) of each v2 batch with a
    producer id from `start` (below the log start: from what is left of the first segment, as
    Kafka's cleaner reads it) to the log end, in offset order: type IDEMPOTENT (a
    non-transactional one), or as transactional_batches gives."""
    for view, batches in _walk(lg, start, producer_headers):
        for base, last, pid, attrs, epoch, max_ts, s, e in batches:
            yield base, last, pid, epoch, _kind(view, lg, attrs, base, s, e), max_ts


def _data_batch_at(lg: "Log", base: int, last: int, pid: int) -> bool:
    """Whether the log still holds, at [base, last], a transactional data batch of producer pid
    with records (not removed or emptied by the cleaner). An unreadable position (a segment
    gone under the read, the log end below it) counts as held: the next look decides."""
    try:
        view = lg.read_batches(base, V2_HEADER)
    except (OffsetOutOfRangeError, SegmentGoneError):
        return True
    for b, lst, magic, attrs, p, count, _s, _e in batch_heads(view, lg.dir, base):
        return (b, lst, p) == (base, last, pid) and magic >= 2 and not attrs & CONTROL and count > 0
    return base >= lg.log_end_offset


def skip_control_batches(lg: "Log", pos: int) -> int:
    """The offset after the control batches (transaction markers) that start at pos: a read
    there returns no records, yet the log end is past it."""
    while pos < lg.log_end_offset:
        try:
            view = lg.read_batches(pos, SCAN_BYTES)
        except (OffsetOutOfRangeError, SegmentGoneError):
            return pos
        moved = False
        for _base, last, magic, attrs, _pid, _n, _s, _e in batch_heads(view, lg.dir, pos):
            if last < pos:
                continue
            if magic < 2 or not attrs & CONTROL:
                return pos
            pos = last + 1
            moved = True
        if not moved:
            return pos
    return pos


class TxnFilter:
    """One partition's transactions, scanned forward from `start` (those open there learnt
    first: txn_prefix.open_at)."""

    def __init__(self, start: int):
        self.start = start
        self.scanned = start                         # batches below this were looked at
        self._primed = False                         # the transactions open at scanned learnt
        self.open: dict[int, tuple[int, list[tuple[int, int]]]] = {}   # pid -> (first, ranges)
        self.aborted: list[tuple[int, int]] = []     # [first, last] of aborted batches, sorted
        self.transactional = False                   # any transactional batch scanned
        #: (offset, first 21 bytes) of the last whole batch scanned: a truncation below
        #: `scanned` followed by appends past it changes them (the log end alone does not)
        self._mark: tuple[int, bytes] | None = None

    def stable_offset(self, lg: "Log") -> int:
        """The last stable offset: the first offset of the earliest open transaction (never
        below the log start, as Kafka's firstUnstableOffset), else the log end (as far as
        scanned)."""
        self._scan(lg)
        self._drop_cleaned(lg)
        first = min((f for f, _r in self.open.values()), default=self.scanned)
        return first if first >= lg.log_start_offset else min(lg.log_start_offset, self.scanned)

    def _same_mark(self, lg: "Log") -> bool:
        """Whether the last batch scanned is still in the log as it was scanned (or below the
        log start, or unreadable now: the next look decides)."""
        if self._mark is None or self._mark[0] < lg.log_start_offset:
            return True
        off, head = self._mark
        try:
            view = lg.read_batches(off, V2_HEADER)
        except OffsetOutOfRangeError:
            return False
        except SegmentGoneError:
            return True
        return bytes(view[:len(head)]) == head

    def _emptied_below_start(self, lg: "Log") -> bool:
        """Whether the log now holds nothing below its start, this filter having scanned to
        that start and holding transactions begun below it: every segment was replaced at an
        end it scanned to (truncate_fully_and_start_at, which ends every transaction in
        Kafka; neither the end nor the mark, below the start, shows it) or retention removed
        them all. What is open there is learnt afresh (open_at: a state kept at that base)."""
        start = lg.log_start_offset
        if self.scanned != start or all(f >= start for f, _r in self.open.values()):
            return False
        segs = lg.segments
        return bool(segs) and segs[0].base_offset >= start

    def _prime(self, lg: "Log") -> None:
        """Learn the transactions open at `scanned` that began below it (Kafka's LSO holds at
        them whatever offset a fetch starts at), with the mark of the batch before it."""
        self.open.clear()
        state, self._mark = open_at(lg, self.scanned)
        for pid, (base, last) in state.items():
            self.open[pid] = (base, [(base, last)])
        self.transactional = self.transactional or bool(state)
        self._primed = True

    def _scan(self, lg: "Log") -> None:
        if lg.log_end_offset < self.scanned or not self._same_mark(lg):
            # truncated (or re-created) below what was scanned, even if appends have brought
            # the end past it again: what was learnt is void
            self._mark = None
            self.start = self.scanned = max(lg.log_start_offset, min(self.start, lg.log_end_offset))
            self.aborted.clear()
            self._primed = False
        if self.scanned < lg.log_start_offset or self._emptied_below_start(lg):
            # the log start passed what was scanned: learn afresh what is open there (a
            # transaction begun below it holds the LSO at the log start, as in Kafka)
            self.scanned = lg.log_start_offset
            self._primed = False
        if not self._primed:
            self._prime(lg)
        while self.scanned < lg.log_end_offset:
            if self.scanned < lg.log_start_offset:
                self.scanned = lg.log_start_offset
                self._prime(lg)
                continue
            try:
                view = lg.read_batches(self.scanned, SCAN_BYTES)
            except (OffsetOutOfRangeError, SegmentGoneError):
                return
            batches, last_whole, why = txn_headers(view)      # the walk in C: 1 tuple per txn batch
            for base, last, pid, attrs, s, e in batches:
                if last < self.scanned:
                    continue
                self.transactional = True
                if attrs & CONTROL:
                    # a marker the cleaner emptied ends its transaction, whose data is gone
                    # (removed after this filter saw it open): not an abort, as Kafka's
                    # containsAbortMarker
                    entry = self.open.pop(pid, None)
                    if entry is not None and _COUNT.unpack_from(view, s + 57)[0] > 0 \
                            and _marker_type(view[s:e], lg.dir, base) == ABORT:
                        self.aborted.extend(entry[1])
                        self.aborted.sort()
                else:
                    self.open.setdefault(pid, (base, []))[1].append((base, last))
            moved = last_whole >= self.scanned
            if moved:
                self.scanned = last_whole + 1
                self._mark = _last_head(view, batches)
            _check_walk(why, lg.dir, self.scanned)
            if not moved:
                nxt = [s.base_offset for s in lg.segments if s.base_offset > self.scanned]
                if not nxt:
                    return
                self.scanned = nxt[0]            # a compacted segment's empty tail

    def _drop_cleaned(self, lg: "Log") -> None:
        """Open transactions whose earliest data batch the cleaner removed (or emptied) since it
        was scanned are over: the cleaner works only below the writer's last stable offset, so
        their marker was written, and it may be gone too (removed with the transaction's last
        data past delete.retention.ms), never to be scanned. Such a transaction no longer holds
        the last stable offset; one whose data is still there (or below the log start) does."""
        while self.open:
            pid = min(self.open, key=lambda p: self.open[p][0])
            ranges = self.open[pid][1]
            base, last = ranges[0]
            if base < lg.log_start_offset or _data_batch_at(lg, base, last, pid):
                return
            ranges.pop(0)
            if ranges:
                self.open[pid] = (ranges[0][0], ranges)
            else:
                del self.open[pid]

    def committed(self, recs: list[Record], pos: int, lso: int) -> tuple[list[Record], int]:
        """recs (read from pos) cut at lso, aborted ones dropped; and the position after the
        records looked at: pos when none was read, the LSO when all were at or past it (a read
        is contiguous: nothing lies between; Kafka's fetch ends at the last batch below it)."""
        if recs and recs[-1].offset >= lso:
            recs = recs[:bisect_left(recs, lso, key=lambda r: r.offset)]
            if not recs:
                return recs, max(pos, lso)
        if not recs:
            return recs, pos
        nxt = recs[-1].offset + 1
        while self.aborted and self.aborted[0][1] < pos:
            self.aborted.pop(0)
        if not self.aborted or self.aborted[0][0] > recs[-1].offset:
            return recs, nxt
        ranges = self.aborted
        kept = []
        i = 0
        for r in recs:               # only where an aborted transaction overlaps the records
            while i < len(ranges) and ranges[i][1] < r.offset:
                i += 1
            if i < len(ranges) and ranges[i][0] <= r.offset:
                continue
            kept.append(r)
        return kept, nxt
