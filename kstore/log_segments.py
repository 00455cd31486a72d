"""The ordered segments of one log and their lookups by offset (Kafka's LogSegments).

A LogSegments is an immutable snapshot: the Log publishes a new one (a single reference) for
every change, so a lock-free reader takes segments, base offsets and read views that agree.
"""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Iterable, Iterator, Optional

if TYPE_CHECKING:
    from kstore._core import SegmentView
    from kstore.segment import LogSegment


class LogSegments:
    """Segments sorted by base offset, with their base offsets and views (never mutated).

    ``segs``, ``bases`` and ``views`` are plain lists for the read fast path (the core bisects
    ``bases`` and reads ``views``); treat them as read-only."""

    __slots__ = ("segs", "bases", "views")

    segs: list[LogSegment]
    bases: list[int]
    views: list[SegmentView]

    def __init__(self, segs: Iterable[LogSegment] = ()) -> None:
        self.segs = list(segs)
        self.bases = [s.base_offset for s in self.segs]
        self.views = [s.view for s in self.segs]

    def __len__(self) -> int:
        return len(self.segs)

    def __iter__(self) -> Iterator[LogSegment]:
        return iter(self.segs)

    def __getitem__(self, i: int) -> LogSegment:
        return self.segs[i]

    def __contains__(self, seg: object) -> bool:
        return any(s is seg for s in self.segs)

    def __repr__(self) -> str:
        return f"LogSegments({self.bases})"

    @property
    def active(self) -> LogSegment:
        """The last segment (the one appends go to)."""
        return self.segs[-1]

    def floor_index(self, offset: int) -> int:
        """Index of the segment that holds offset: the last one whose base offset <= offset
        (0 if offset is below the first base, as when it was deleted meanwhile)."""
        return max(0, bisect.bisect_right(self.bases, offset) - 1)

    def floor(self, offset: int) -> LogSegment:
        """The segment that holds offset (see floor_index); IndexError if there is none."""
        return self.segs[self.floor_index(offset)]

    def index_above(self, offset: int) -> int:
        """Index of the first segment whose base offset >= offset (len if none)."""
        return bisect.bisect_left(self.bases, offset)

    def higher(self, offset: int) -> Optional[LogSegment]:
        """The first segment whose base offset > offset, or None (Kafka's higherSegment)."""
        i = bisect.bisect_right(self.bases, offset)
        return self.segs[i] if i < len(self.segs) else None

    def next_base(self, i: int) -> Optional[int]:
        """The base offset of the segment after the i-th one, None for the last."""
        return self.bases[i + 1] if i + 1 < len(self.bases) else None

    def has_base(self, offset: int) -> bool:
        i = bisect.bisect_left(self.bases, offset)
        return i < len(self.bases) and self.bases[i] == offset

    def without(self, drop: Iterable[LogSegment]) -> LogSegments:
        """A new snapshot without the segments in drop (by identity)."""
        gone = {id(s) for s in drop}
        return LogSegments(s for s in self.segs if id(s) not in gone)

    def replaced(self, drop: Iterable[LogSegment], add: Iterable[LogSegment]) -> LogSegments:
        """A new snapshot without drop and with add, sorted by base offset."""
        gone = {id(s) for s in drop}
        kept = [s for s in self.segs if id(s) not in gone] + list(add)
        return LogSegments(sorted(kept, key=lambda s: s.base_offset))

    def total_size(self) -> int:
        """Bytes of valid batches in every segment's .log."""
        return sum(s.size for s in self.segs)
