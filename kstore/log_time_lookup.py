"""Offsets by timestamp (Kafka's UnifiedLog.fetchOffsetByTimestamp and
LogSegment.findOffsetByTimestamp), a part of Log: the first segment whose largest timestamp
reaches the target, its time-index floor, offset-index floor, then the batches walked in the
compiled core (control batches included, as Kafka's FileRecords.searchForTimestamp).

A mixin of Log (log.py): it reads the log's published segment list and offsets, lock-free as
every read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from kstore._core import log_offset_for_timestamp as _log_offset_for_timestamp
from kstore.errors import CorruptRecordError, OffsetOutOfRangeError, SegmentGoneError, with_path

if TYPE_CHECKING:
    from kstore.log_segments import LogSegments
    from kstore.segment import LogSegment

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3


class TimestampLookup:
    """Log's offsets by timestamp (see the module docstring)."""

    _leo: int
    _log_start_offset: int
    _segments: LogSegments

    def _check_open(self) -> None:
        raise NotImplementedError

    def _segment_gone(self, seg: LogSegment) -> None:
        raise NotImplementedError

    def offset_for_timestamp(self, timestamp: int) -> Optional[int]:
        """First offset whose timestamp >= timestamp (None past the end); -1 latest,
        -2 earliest, -3 the offset of the max timestamp."""
        r = self.fetch_offset_by_timestamp(timestamp)
        return None if r is None else r[0]

    def fetch_offset_by_timestamp(self, timestamp: int) -> Optional[tuple[int, int]]:
        """(offset, timestamp) as Kafka's fetchOffsetByTimestamp (timestamp -1 for the specials
        -1 and -2)."""
        if timestamp == LATEST_TIMESTAMP:
            return (self._leo, -1)
        if timestamp == EARLIEST_TIMESTAMP:
            return (self._log_start_offset, -1)
        if timestamp == MAX_TIMESTAMP:
            return self._offset_of_max_timestamp()
        if timestamp < 0:
            raise OffsetOutOfRangeError(f"unsupported special timestamp {timestamp}")
        start = self._log_start_offset
        while True:
            segs = self._segments
            try:
                r = _log_offset_for_timestamp(segs.views, timestamp, start)
            except CorruptRecordError as e:
                raise with_path(e, segs[e.segment].log_path) from None  # type: ignore[attr-defined]  # set by the core
            if r is not None:
                return r if isinstance(r, tuple) else None     # False: no such timestamp
            # map and load what the fast path found missing, then retry on fresh segment lists
            # (a segment deleted meanwhile is gone from them; a closed log raises)
            self._check_open()
            for seg in segs:
                try:
                    if seg.size and not seg.closed:
                        seg.mapping()
                        seg.load_indexes()
                        seg.load_max_timestamp()
                except SegmentGoneError:
                    self._segment_gone(seg)
                    break

    def _offset_of_max_timestamp(self) -> Optional[tuple[int, int]]:
        """(offset, timestamp) of the first record with the log's max timestamp; a segment
        deleted or replaced meanwhile sends it back to the current segments."""
        while True:
            best: Optional[tuple[int, LogSegment]] = None
            seg: Optional[LogSegment] = None
            try:
                for seg in self._segments:
                    if seg.size == 0:
                        continue
                    ts = seg.max_timestamp_so_far
                    if ts >= 0 and (best is None or ts > best[0]):
                        best = (ts, seg)
                if best is None:
                    return None
                ts, seg = best
                return seg.find_offset_by_timestamp(ts, self._log_start_offset)
            except SegmentGoneError:
                assert seg is not None       # the error came from a segment
                self._segment_gone(seg)
