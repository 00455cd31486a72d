"""The transactions open at an offset of a log: what a read_committed filter starting there
must know for its last stable offset to be Kafka's.

Kafka's broker keeps every producer's ongoing transaction (ProducerStateManager.ongoingTxns,
rebuilt at load from the `.snapshot` of a segment roll plus the log after it), so its LSO
holds at the earliest one's first offset whatever offset a fetch starts at. A kstore reader has
no producer state (the writer may be another process): `open_at` walks the batch headers from
the first segment to the offset (bytes below the log start included, as Kafka's state keeps
transactions begun there) and keeps the state at each segment base it passes, per Log object,
so a later walk on that log starts at the nearest base below its offset. A base's state is used
only while the batch before it is in the log as walked (base, length, epoch, magic, CRC), the
test TxnFilter applies to what it scanned. A process that first walks a log after the segments
where a transaction began were deleted does not know it (Kafka's snapshot would).
"""
from __future__ import annotations

import threading
import weakref
from bisect import bisect_right
from typing import TYPE_CHECKING, Optional

from kstore._txn_scan import txn_headers
from kstore.errors import CorruptRecordError, SegmentGoneError

if TYPE_CHECKING:
    from kstore.log import Log
    from kstore.segment import LogSegment

__all__ = ["Mark", "State", "head_at", "kept_bases", "open_at"]

CONTROL = 0x20
SCAN_BYTES = 1 << 20
HEAD_BYTES = 21                     # base offset, length, leader epoch, magic, CRC
#: producer id -> (base, last offset) of the first data batch of its open transaction
State = dict[int, tuple[int, int]]
#: (base offset, first 21 bytes) of a batch: where a walk's knowledge ends, to recheck it
Mark = Optional[tuple[int, bytes]]


class _Points:
    """One log's states at segment bases: base -> (state, mark of the batch before the base)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.points: dict[int, tuple[State, Mark]] = {}


_LOGS: "weakref.WeakKeyDictionary[Log, _Points]" = weakref.WeakKeyDictionary()
_LOGS_LOCK = threading.Lock()


def _points(lg: "Log") -> _Points:
    with _LOGS_LOCK:
        p = _LOGS.get(lg)
        if p is None:
            p = _LOGS[lg] = _Points()
        return p


ATTEMPTS = 4


class _Gone(Exception):
    """A segment of the listing a walk uses was removed under it."""


def _read(segs: list["LogSegment"], off: int, n: int, strict: bool = False) -> Optional[memoryview]:
    """Whole batches from the one holding off, of the segment holding it (below the log start
    too); None when it has nothing there, or (unless strict: _Gone) was removed under the read."""
    i = bisect_right([s.base_offset for s in segs], off) - 1
    if i < 0:
        return None
    try:
        v = segs[i].read_batches(off, n)
    except (SegmentGoneError, ValueError, BufferError):
        if strict:
            raise _Gone() from None
        return None
    return v if v is not None and len(v) else None


def head_at(segs: list["LogSegment"], off: int) -> Mark:
    """The mark of the batch holding offset off (None if there is none to read)."""
    v = _read(segs, off, HEAD_BYTES)
    if v is None or len(v) < HEAD_BYTES:
        return None
    return int.from_bytes(v[:8], "big", signed=True), bytes(v[:HEAD_BYTES])


def _holds(segs: list["LogSegment"], mark: Mark, base: int) -> bool:
    """Whether the log below base is still as it was when base's state was kept: the batch
    before it unchanged (unverifiable, so trusted, once deleted below the first segment)."""
    if mark is None:
        return base <= segs[0].base_offset
    return mark[0] < segs[0].base_offset or head_at(segs, mark[0]) == mark


def _start(lg: "Log", segs: list["LogSegment"], pos: int) -> tuple[int, State]:
    """The nearest kept base at or below pos whose state still holds, and a copy of that state;
    else the first segment's base and no transaction."""
    pts = _points(lg)
    with pts.lock:
        for b in [b for b in pts.points if b < segs[0].base_offset]:
            del pts.points[b]            # below the first segment: never a start again
        kept = sorted((b for b in pts.points if segs[0].base_offset <= b <= pos), reverse=True)
        for b in kept:
            state, mark = pts.points[b]
            if _holds(segs, mark, b):
                return b, dict(state)
            del pts.points[b]
    return segs[0].base_offset, {}


def kept_bases(lg: "Log") -> list[int]:
    """The segment bases whose state is kept for lg (what a later walk may start from)."""
    pts = _points(lg)
    with pts.lock:
        return sorted(pts.points)


def _keep(lg: "Log", segs: list["LogSegment"], base: int, state: State) -> None:
    mark = head_at(segs, base - 1)
    if mark is None:
        return
    pts = _points(lg)
    with pts.lock:
        pts.points[base] = (dict(state), mark)


def open_at(lg: "Log", pos: int) -> tuple[State, Mark]:
    """The transactions open at pos: for each producer with a transactional data batch wholly
    below pos and no control batch of its own after it below pos, its first such batch; and the
    mark of the batch holding pos - 1 (None if none), which a caller rechecks to find a
    truncation below pos. CorruptRecordError (naming the log and offset) on malformed bytes.
    A segment removed under the walk (retention, a truncation; another process's, seen by a
    read-only log) is never skipped, which would lose its transactions: the walk starts again
    on the log's new listing; SegmentGoneError if that keeps happening (a reader retries)."""
    for _ in range(ATTEMPTS):
        try:
            return _open_at(lg, pos)
        except _Gone:
            lg.refresh()                  # a read-only log lists its segments again
    raise SegmentGoneError(f"{lg.dir}: segments removed again and again while finding the "
                           f"transactions open at offset {pos}")


def _open_at(lg: "Log", pos: int) -> tuple[State, Mark]:
    segs = lg.segments
    if not segs or pos <= segs[0].base_offset:
        return {}, None
    cur, state = _start(lg, segs, pos)
    bases = [s.base_offset for s in segs]
    i = max(0, bisect_right(bases, cur) - 1)
    while cur < pos and i < len(segs):
        view = _read(segs, cur, SCAN_BYTES, strict=True) if bases[i] <= cur else None
        last_whole = -1
        if view is not None:
            batches, last_whole, why = txn_headers(view)
            for base, last, pid, attrs, _s, _e in batches:
                if last < cur:
                    continue
                if last >= pos:
                    return state, head_at(segs, pos - 1)
                if attrs & CONTROL:
                    state.pop(pid, None)          # a marker (or one the cleaner emptied) ends it
                else:
                    state.setdefault(pid, (base, last))
            if why is not None and last_whole < pos - 1:
                raise CorruptRecordError(f"{lg.dir}: {why} (finding the transactions open at "
                                         f"offset {pos})")
        if last_whole >= cur:
            cur = last_whole + 1
            if i + 1 >= len(segs) or cur < bases[i + 1]:
                continue
        # this segment is done (or gone, or its tail emptied by the cleaner): the next one
        i += 1
        if i >= len(segs) or bases[i] > pos:
            break
        cur = bases[i]
        _keep(lg, segs, cur, state)
    return state, head_at(segs, pos - 1)
