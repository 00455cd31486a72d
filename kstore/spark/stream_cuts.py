"""A streaming query's truncation check (KIP-320's, as a consumer's position gets it): where
each partition's last batch read up to, with the leader epoch of the record before it, so that
a cut of the log below the next batch's start is found (the records read there are gone, and
others may be appended in their place) instead of those records being skipped."""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

from kstore.errors import OffsetOutOfRangeError, SegmentGoneError, UnknownTopicError
from kstore.leader_epoch import epoch_at
from kstore.log import Log
from kstore.reader import StoreReader

TopicPartition = tuple[str, int]

__all__ = ["StreamCuts"]


class _Mark(NamedTuple):
    end: int            # the batch's end (the next batch's start, in Spark's offsets)
    read_to: int        # what its tasks could read up to: the log end when planned, if lower
    epoch: int          # the leader epoch of the record before read_to, when planned
    log: Log            # the log it was read from (a topic created again is a new one)
    incarnation: int


class StreamCuts:
    """The marks of one stream reader, kept in memory (a restarted query checks from its first
    batch on). report(message, what_then): data loss, as failOnDataLoss says (raise or log)."""

    def __init__(self, report: Callable[[str, str], None]):
        self._report = report
        self._marks: dict[TopicPartition, _Mark] = {}
        self._next: dict[TopicPartition, _Mark] = {}
        self._at: dict[TopicPartition, int] = {}      # the epoch known at a start (start())

    def start(self, store: StoreReader, tp: TopicPartition, s: int, log_start: int) -> int:
        """tp's next batch start: s, or where the records the query read were cut (reported),
        or where its last batch stopped short of s (the log was cut under it: reported)."""
        self._at.pop(tp, None)
        m = self._marks.get(tp)
        try:
            lg = store.log(*tp)
        except UnknownTopicError:
            return s
        if m is None or m.end != s or m.log is not lg or m.incarnation != lg.incarnation:
            return s
        name = f"{tp[0]}-{tp[1]}"
        if m.read_to < s:
            self._report(f"{name}: offsets {m.read_to}..{s - 1} were cut before the batch that "
                         f"planned them read them", f"reading from {m.read_to}")
            s = m.read_to
        # (past_end: no "file ahead of its cut" pass. The view may be older than the epochs'
        # file, which a cut writes first; a cut below s under way loses what was read too)
        div = lg.diverging_epoch(s, m.epoch, True)
        if div is None:
            self._at[tp] = m.epoch
            return s
        epoch, cut = div
        cut = cut if epoch >= 0 else log_start
        self._report(f"{name} was truncated below offset {s}, which the query had read up to: "
                     f"leader epoch {m.epoch} ends at {cut}", f"reading it again from {cut}")
        if epoch >= 0:
            self._at[tp] = epoch
        return cut

    def plan(self, store: StoreReader, tp: TopicPartition, s: int, e: int, log_end: int) -> int:
        """The end of tp's range [s, e) as planned now: no further than the log end (a cut
        since latestOffset: the next start() goes back to it). Marks it with the epoch of the
        record before it, read before the tasks read (an epoch taken too low reads again)."""
        read_to = max(s, min(e, log_end))
        epoch = self._at.get(tp) if read_to == s else self._epoch_before(store, tp, read_to)
        try:
            lg = store.log(*tp)
        except UnknownTopicError:
            return read_to
        if epoch is not None:
            self._next[tp] = _Mark(e, read_to, epoch, lg, lg.incarnation)
        return read_to

    def planned(self) -> None:
        """The batch is planned: its marks replace the last one's."""
        self._marks, self._next = self._next, {}

    @staticmethod
    def _epoch_before(store: StoreReader, tp: TopicPartition, offset: int) -> Optional[int]:
        """The leader epoch of the record before offset as the log holds it now; from the
        record, not from leader-epoch-checkpoint alone (a cut writes its new epoch there
        first, while the tasks may still read what it cuts): the lower of the two."""
        try:
            lg = store.log(*tp)
            off = offset - 1
            if off < lg.log_start_offset:
                return None
            recs = lg.read(off, 1)
            by_entries = epoch_at(lg.epoch_entries(True), off)
        except (UnknownTopicError, SegmentGoneError, OffsetOutOfRangeError):
            return None
        eps = [x for x in (recs[0].leader_epoch if recs else None, by_entries)
               if x is not None and x >= 0]
        return min(eps) if eps else None
