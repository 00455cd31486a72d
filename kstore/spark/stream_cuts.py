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


class _Found(NamedTuple):
    start: int                  # where the next batch reads from
    epoch: Optional[int]        # the leader epoch of the record before it, if known
    news: Optional[str]         # what happened to what the query read (None: nothing)
    then: str = ""


class StreamCuts:
    """The marks of one stream reader, kept in memory (a restarted query checks from its first
    batch on). report(message, what_then): data loss, as failOnDataLoss says (raise or log)."""

    def __init__(self, report: Callable[[str, str], None]):
        self._report = report
        self._marks: dict[TopicPartition, _Mark] = {}
        self._next: dict[TopicPartition, _Mark] = {}
        self._at: dict[TopicPartition, int] = {}      # the epoch known at a start (start())

    def begin(self) -> None:
        """A batch's planning begins (what a failed one left is dropped)."""
        self._next, self._at = {}, {}

    def pending(self, store: StoreReader, tp: TopicPartition, s: int, log_start: int
                ) -> Optional[int]:
        """latestOffset's look: where tp's next batch must start instead of s (a cut below
        what the query read, or a topic created again), else None. An end other than the
        start makes Spark plan a batch, whose start() reports it: a cut regrown to exactly the
        last end is not left unread while nothing new comes."""
        f = self._check(store, tp, s, log_start)
        return None if f is None or f.news is None else f.start

    def start(self, store: StoreReader, tp: TopicPartition, s: int, log_start: int) -> int:
        """tp's next batch start: s, or where the records the query read were cut, or where
        its last batch stopped short of s (the log was cut under it), or the start of a topic
        created again: each reported."""
        f = self._check(store, tp, s, log_start)
        if f is None:
            return s
        if f.news is not None:
            self._report(f.news, f.then)
        if f.epoch is not None:
            self._at[tp] = f.epoch
        return f.start

    def _check(self, store: StoreReader, tp: TopicPartition, s: int, log_start: int
               ) -> Optional[_Found]:
        m = self._marks.get(tp)
        if m is None or m.end != s:
            return None
        try:
            lg = store.log(*tp)
        except UnknownTopicError:
            return None
        name = f"{tp[0]}-{tp[1]}"
        if m.log is not lg or m.incarnation != lg.incarnation:
            return _Found(log_start, None, f"{name} was deleted and created again since the query "
                          f"read it up to {s}", f"reading the new one from its start {log_start}")
        news = None
        if m.read_to < s:
            news = f"{name}: offsets {m.read_to}..{s - 1} were cut before the batch that planned them read them"
            s = m.read_to
        # (past_end: no "file ahead of its cut" pass. The view may be older than the epochs'
        # file, which a cut writes first; a cut below s under way loses what was read too)
        div = lg.diverging_epoch(s, m.epoch, True)
        if div is None:
            return _Found(s, m.epoch, news, f"reading from {s}")
        epoch, cut = div
        cut = cut if epoch >= 0 else log_start
        news = (f"{news}; and " if news else "") + (
            f"{name} was truncated below offset {s}, which the query had read up to: leader "
            f"epoch {m.epoch} ends at {cut}")
        return _Found(cut, epoch if epoch >= 0 else None, news, f"reading it again from {cut}")

    def plan(self, store: StoreReader, tp: TopicPartition, s: int, e: int, log_end: int
             ) -> tuple[int, int]:
        """tp's range [s, e) as planned now: no further than the log end (a cut since
        latestOffset: the next start() goes back to it). Marks its end with the epoch of the
        record before it, read before the tasks read (an epoch taken too low reads again),
        then checks s again: a cut since start() moves it back (reported)."""
        read_to = max(s, min(e, log_end))
        epoch = self._at.get(tp) if read_to == s else self._epoch_before(store, tp, read_to)
        try:
            lg = store.log(*tp)
        except UnknownTopicError:
            return s, read_to
        at_s = self._at.get(tp)
        if at_s is not None and s < read_to:
            div = lg.diverging_epoch(s, at_s, True)
            if div is not None and div[0] >= 0 and div[1] < s:
                self._report(f"{tp[0]}-{tp[1]} was truncated below offset {s} while the batch "
                             f"was planned: leader epoch {at_s} ends at {div[1]}",
                             f"reading it again from {div[1]}")
                s = div[1]
        if epoch is not None:
            self._next[tp] = _Mark(e, read_to, epoch, lg, lg.incarnation)
        return s, read_to

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
