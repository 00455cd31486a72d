"""A consumer's reads: the logs of a store, records from the positions, out-of-range resets and
the wait for new data (Kafka's Fetcher and OffsetFetcher, with the log files in place of brokers).

`LogSource` gives the consumer its logs: a `LogManager`'s own (writable, in-process) or a
`StoreReader`'s (read-only, lock-free: the usual case, a consumer process beside the producer's).
`Fetcher.fetch` reads the fetchable partitions from their positions with the compiled
`Log.read` (no per-record Python work), within max_records, rotating partitions so none starves;
`wait` sleeps on the partitions' notification words (one futex_waitv, GIL released) plus any
extra Bell (a consumer group's), so an idle poll costs no CPU.
"""
from __future__ import annotations

import errno
import logging
import os
import time
from typing import Callable, Mapping, Optional, Sequence

from kstore import _notify, notify
from kstore._core import Record
from kstore.consumer_types import OffsetAndTimestamp
from kstore.errors import (CoordinatorNotAvailableError, InvalidConfigError, KStoreStateError,
                           LogDirOfflineError, LogTruncationError, NoOffsetForPartitionError,
                           OffsetOutOfRangeError, SegmentGoneError, UnknownTopicError)
from kstore.fileio import FileOps
from kstore.leader_epoch import epoch_before
from kstore.log import Log
from kstore.manager import LogManager
from kstore.read_committed import TxnFilter, skip_control_batches
from kstore.read_skip import after_empty_read
from kstore.reader import StoreReader
from kstore.subscription_state import SubscriptionState
from kstore.topic_partition import TopicPartition

__all__ = ["LogSource", "Fetcher", "wait_logs", "INTERNAL_TOPICS", "RESCAN_S"]

log = logging.getLogger("kstore.consumer")

#: Kafka's internal topics: never part of a pattern subscription (exclude.internal.topics=true)
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
#: How often a StoreReader-backed consumer rescans the log dirs for new topics and partitions.
RESCAN_S = 1.0
#: Default bytes per partition read (Kafka's max.partition.fetch.bytes).
MAX_PARTITION_FETCH_BYTES = 1 << 20


class LogSource:
    """The logs a consumer reads: a LogManager's (not closed by the consumer) or those of a
    StoreReader it opens on the log dirs given (closed with the consumer)."""

    def __init__(self, store: "LogManager | StoreReader | str | os.PathLike | Sequence[str]", *,
                 io: Optional[FileOps] = None):
        self.manager: Optional[LogManager] = store if isinstance(store, LogManager) else None
        self._owned = not isinstance(store, (LogManager, StoreReader))
        self.reader: Optional[StoreReader] = None
        if self.manager is None:
            self.reader = store if isinstance(store, StoreReader) else StoreReader(store, io=io)  # type: ignore[arg-type]
        self.log_dirs: list[str] = (self.manager or self.reader).log_dirs  # type: ignore[union-attr]
        self._scanned = time.monotonic()

    @property
    def store(self) -> "LogManager | StoreReader":
        """What a GroupCoordinator is opened on (the manager, or the log dirs' reader)."""
        return self.manager if self.manager is not None else self.reader  # type: ignore[return-value]

    def rescan(self, force: bool = False) -> None:
        """A reader looks for new topics and partitions at most every RESCAN_S (force: now)."""
        if self.reader is not None:
            now = time.monotonic()
            if force or now - self._scanned >= RESCAN_S:
                self._scanned = now
                self.reader.refresh()

    def topics(self) -> list[str]:
        return (self.manager or self.reader).topics()  # type: ignore[union-attr]

    def partitions(self, topic: str) -> list[int]:
        if self.manager is not None:
            try:
                return self.manager.partitions(topic)
            except UnknownTopicError:
                return []
        return [p for _t, p in self.reader.partitions(topic)]  # type: ignore[union-attr]

    def partition_count(self, topic: str) -> int:
        """The topic's partition count as a consumer group assigns it (0 if it does not exist)."""
        ps = self.partitions(topic)
        return max(ps) + 1 if ps else 0

    def log(self, tp: TopicPartition, fresh: bool = False) -> Log:
        """The partition's log (UnknownTopicError if it is not in the store); fresh: a read-only
        log refreshed first (what it knows of the log end and start is current)."""
        if self.manager is not None:
            return self.manager.log(tp[0], tp[1])
        return self.reader.log(tp[0], tp[1], refresh=fresh)  # type: ignore[union-attr]

    def close(self) -> None:
        if self._owned and self.reader is not None:
            self.reader.close()


class Fetcher:
    """Reads records from the positions of a SubscriptionState."""

    def __init__(self, source: LogSource, state: SubscriptionState, *,
                 max_partition_bytes: int = MAX_PARTITION_FETCH_BYTES, read_committed: bool = False):
        self.source = source
        self.state = state
        self.max_partition_bytes = max_partition_bytes
        self.read_committed = read_committed
        self._txn: dict[TopicPartition, TxnFilter] = {}
        #: read_committed: partitions held at their last stable offset, with the log end then
        #: (their wait is for the log to grow past it, not past the position)
        self._stalled: dict[TopicPartition, int] = {}
        #: the log (and its incarnation) each position was last read from: a topic deleted and
        #: re-created under the consumer is a new log, where the old position means nothing
        self._read_from: dict[TopicPartition, tuple[Log, int]] = {}

    # -- positions -------------------------------------------------------------------------------
    def offset_for_policy(self, tp: TopicPartition, policy: str, lg: Optional[Log] = None) -> int:
        """Where "earliest" or "latest" puts tp now (the log start or end)."""
        lg = lg or self.source.log(tp, fresh=True)
        return lg.log_start_offset if policy == "earliest" else self.end_offset(tp, lg)

    def end_offset(self, tp: TopicPartition, lg: Optional[Log] = None) -> int:
        """The log end, or under read_committed the last stable offset (as Kafka's end offsets)."""
        lg = lg or self.source.log(tp, fresh=True)
        if not self.read_committed:
            return lg.log_end_offset
        return self._filter(tp, lg.log_start_offset).stable_offset(lg)

    def update_positions(self, only: Optional[Sequence[TopicPartition]],
                         committed: Optional[Callable[[list[TopicPartition]],
                                                      dict[TopicPartition, tuple[int, Optional[int]]]]]
                         ) -> None:
        """Positions of partitions that have none (of only, if given): a pending seek_to_*,
        else the committed offset (committed: the group's, None without one), else
        auto_offset_reset ("none": NoOffsetForPartitionError); Kafka's updateFetchPositions."""
        st = self.state
        missing = [tp for tp in (only if only is not None else st.missing_positions())
                   if st.position(tp) is None]
        if not missing:
            return
        need_committed = [tp for tp in missing if st.pending_reset(tp) is None]
        # the logs before the committed offsets are read: an offset read after is of that log
        # (a deletion tombstones the offsets before the name can be created again), never of
        # one created after it, whose first records it would skip (KIP-320 would take the old
        # epoch's end for a cut); a partition with no log yet takes no committed offset
        before = self._logs_now(need_committed, only is not None) if committed is not None else {}
        try:
            offsets = committed(need_committed) if need_committed and committed is not None else {}
        except CoordinatorNotAvailableError:
            if only is not None:             # position(tp): say why not
                raise
            # a poll's: the committed offsets are unknown, not absent (no reset): next poll's
            missing, offsets = [tp for tp in missing if tp not in need_committed], {}
        no_offset = []
        for tp in missing:
            policy = st.pending_reset(tp)
            try:
                if policy is None and tp in offsets and tp in before:
                    st.seek(tp, *offsets[tp])        # (its epoch: checked as any position's)
                    seen = before[tp]
                    if seen is not None:
                        self._read_from[tp] = seen
                    continue
                if policy is None and tp in offsets:
                    continue                 # no log when it was read: a deleted topic's offset
                policy = policy or st.default_reset
                if policy == "none":
                    no_offset.append(tp)
                    continue
                lg = self.source.log(tp, fresh=True)
                st.seek(tp, self.offset_for_policy(tp, policy, lg))
                self._read_from[tp] = (lg, lg.incarnation)
            except UnknownTopicError:
                continue                     # not in the store (yet): no position
            except LogDirOfflineError:
                if only is not None:         # position(tp) asked for this one: say why not
                    raise
                continue                     # a poll's: retried at the next poll
        if no_offset:
            raise NoOffsetForPartitionError(
                f"Undefined offset with no reset policy for partitions: {sorted(map(str, no_offset))}",
                no_offset)

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]
                          ) -> dict[TopicPartition, Optional[OffsetAndTimestamp]]:
        """Consumer.offsets_for_times (Kafka's OffsetFetcher.offsetsForTimes); under
        read_committed an offset at or past the last stable offset is None, as the broker's
        ListOffsets answers a READ_COMMITTED request (only offsets below it are fetchable)."""
        out: dict[TopicPartition, Optional[OffsetAndTimestamp]] = {}
        for tp, ts in timestamps.items():
            if not isinstance(ts, int) or ts < 0:
                raise InvalidConfigError(f"The target time for partition {tp} is {ts}. The target time cannot be negative.")
            tp = TopicPartition(*tp)
            lg = self.source.log(tp, fresh=True)
            lso = self.end_offset(tp, lg) if self.read_committed else None
            r = lg.fetch_offset_by_timestamp(ts)
            if r is not None and lso is not None and r[0] >= lso:
                r = None
            out[tp] = None if r is None else OffsetAndTimestamp(r[0], r[1])
        return out

    def _reset(self, tp: TopicPartition, pos: int, lg: Log, e: OffsetOutOfRangeError) -> None:
        """A position outside the log: past its end after a cut, back to where the cut was
        (_truncated); else reset as auto_offset_reset says (Kafka's rule), or raise."""
        if pos > lg.log_end_offset and self._truncated(tp, pos, lg, True):
            return
        policy = self.state.default_reset
        if policy == "none":
            raise OffsetOutOfRangeError(f"Offsets out of range with no configured reset policy for "
                                        f"partitions: {{{tp}: {pos}}} ({e})") from e
        self.state.seek(tp, self.offset_for_policy(tp, policy))

    def _truncated(self, tp: TopicPartition, pos: int, lg: Log, past_end: bool = False) -> bool:
        """KIP-320: whether tp's position was past a cut of the log (Log.diverging_epoch);
        then it goes back to where its epoch ends ("Truncation detected", no record skipped);
        with auto_offset_reset "none", LogTruncationError; with no such end (the epoch is older
        than every entry), the reset policy. Asked when a read at the position returned a later
        epoch than the position's, or the position is past the log end (past_end)."""
        ep = self.state.position_epoch(tp)
        div = None if ep is None else lg.diverging_epoch(pos, ep, past_end)
        if div is None:
            return False
        epoch, end = div
        self._txn.pop(tp, None)
        self._stalled.pop(tp, None)
        if self.state.default_reset == "none":
            raise LogTruncationError(
                f"Truncation detected for partition {tp} at offset {pos} (epoch {ep}); the first "
                f"offset known to diverge is {end if epoch >= 0 else 'unknown'} and no reset "
                f"policy is set", {tp: end if epoch >= 0 else None})
        if epoch < 0:
            self.state.seek(tp, self.offset_for_policy(tp, self.state.default_reset))
        else:
            log.info("Truncation detected for partition %s at offset %d (epoch %d), resetting "
                     "offset to the first offset known to diverge %d", tp, pos, ep, end)
            self.state.seek(tp, end, epoch)
        return True

    # -- reads -----------------------------------------------------------------------------------
    def fetch(self, max_records: int) -> dict[TopicPartition, list[Record]]:
        """Records of the fetchable partitions from their positions, at most max_records in all;
        positions advance past what is returned."""
        out: dict[TopicPartition, list[Record]] = {}
        budget = max_records
        for tp in self.state.fetchable():
            if budget <= 0:
                break
            pos = self.state.position(tp)
            assert pos is not None           # fetchable() has positions only
            try:
                lg = self.source.log(tp)
                if lg.read_only:
                    _catch_up(lg)
                new = self._new_log(tp, lg)
                end = lg.log_end_offset          # what the read can see (after_empty_read)
                # read_committed: the LSO before the read, so that the records are cut at a
                # stable offset of what the read saw or an earlier log, never of a later one
                # (a truncation meanwhile can remove an open transaction whose records the
                # read returned, and a later log's LSO is then past them)
                lso = self._filter(tp, pos).stable_offset(lg) if self.read_committed and not new else 0
                recs = [] if new else lg.read(pos, budget, self.max_partition_bytes)
                new = new or self._new_log(tp, lg)     # (the read's own refresh may find it)
            except UnknownTopicError:
                continue                     # deleted (or not there yet): nothing to read
            except LogDirOfflineError as e:
                # Kafka's consumer takes a fetch's KAFKA_STORAGE_ERROR as retriable: nothing
                # from this partition, the others go on (and their positions stay theirs)
                log.debug("not reading %s: %s", tp, e)
                continue
            except SegmentGoneError:
                continue                     # a change raced the read: the next poll reads again
            except LogTruncationError:
                raise
            except OffsetOutOfRangeError as e:
                if self._new_log(tp, lg):        # (its read's refresh found it)
                    self._reset_new_log(tp, pos, lg)
                else:
                    self._reset(tp, pos, lg, e)
                self._read_from[tp] = (lg, lg.incarnation)
                continue
            if new:
                self._reset_new_log(tp, pos, lg)
                continue
            ep = self.state.position_epoch(tp)
            if recs and ep is not None and recs[0].leader_epoch > ep and \
                    self._truncated(tp, pos, lg):
                continue                         # (read from where the cut was next poll)
            nxt = recs[-1].offset + 1 if recs else pos
            read_nothing, raw = not recs, recs
            if self.read_committed:
                recs, nxt = self._committed_only(tp, lg, pos, recs, lso)
            if not recs:
                if nxt == pos and tp not in self._stalled:
                    # transaction markers only, or (nothing read) a compacted segment's empty
                    # tail; records all at or past the LSO are no gap: wait at the LSO
                    nxt = after_empty_read(lg, pos, end) if read_nothing else skip_control_batches(lg, pos)
                if nxt != pos:       # (or an aborted transaction skipped: its epoch is known)
                    self.state.set_position(tp, nxt, epoch_before(raw, nxt))
                continue
            out[tp] = recs
            self.state.set_position(tp, nxt, recs[-1].leader_epoch)
            self.state.rotate(tp)
            budget -= len(recs)
        return out

    def _logs_now(self, tps: Sequence[TopicPartition], rescan: bool
                  ) -> dict[TopicPartition, Optional[tuple[Log, int]]]:
        """The log (and incarnation) of each of tps that has one now (None: offline, where a
        committed offset stands unpinned); tps with no log are left out, after a reader's
        rescan if asked (position(): a poll's own rescan comes every RESCAN_S)."""
        out: dict[TopicPartition, Optional[tuple[Log, int]]] = {}
        todo = list(tps)
        for attempt in (0, 1):
            unknown = []
            for tp in todo:
                try:
                    lg = self.source.log(tp, fresh=True)
                except UnknownTopicError:
                    unknown.append(tp)
                    continue
                except LogDirOfflineError:
                    out[tp] = None
                    continue
                out[tp] = (lg, lg.incarnation)
            if not unknown or attempt or not rescan:
                break
            self.source.rescan(force=True)   # a reader's scan may predate the topic
            todo = unknown
        return out

    def _new_log(self, tp: TopicPartition, lg: Log) -> bool:
        """True if tp's log is not the one its position was read from (the topic was deleted
        and re-created); the first log a position is read from is remembered."""
        seen = self._read_from.setdefault(tp, (lg, lg.incarnation))
        return seen[0] is not lg or seen[1] != lg.incarnation

    def _reset_new_log(self, tp: TopicPartition, pos: int, lg: Log) -> None:
        """A position of a deleted topic in the topic created again under its name: reset by
        auto_offset_reset, as for a new partition, instead of skipping the new log's first
        records ("none": OffsetOutOfRangeError at every poll until a seek)."""
        self._txn.pop(tp, None)
        self._stalled.pop(tp, None)
        self.state.seek(tp, pos)             # (its epoch is the old log's: no KIP-320 check)
        self._reset(tp, pos, lg, OffsetOutOfRangeError(
            f"{tp} was deleted and re-created: position {pos} belongs to the old topic"))
        self._read_from[tp] = (lg, lg.incarnation)

    def stale(self, tps) -> list[TopicPartition]:
        """Of tps, those whose position was read from a log that is now gone (the topic
        deleted) or replaced (deleted and re-created): positions no commit may write (Kafka's
        broker refuses a commit of an unknown partition), so the group does not resume the
        topic created again under the name at them."""
        out = []
        for tp in tps:
            seen = self._read_from.get(tp)
            if seen is None:
                continue
            try:
                lg = self.source.log(tp, fresh=True)
            except UnknownTopicError:
                out.append(tp)
                continue
            except LogDirOfflineError:
                continue                     # the same log, offline: its position stands
            if lg is not seen[0] or lg.incarnation != seen[1]:
                out.append(tp)
        if out:
            log.warning("not committing the positions of %s: the topic was deleted (or deleted "
                        "and re-created) since they were read", sorted(map(str, out)))
        return out

    def _filter(self, tp: TopicPartition, pos: int) -> TxnFilter:
        f = self._txn.get(tp)
        if f is None or pos < f.start:
            f = self._txn[tp] = TxnFilter(pos)
        return f

    def _committed_only(self, tp: TopicPartition, lg: Log, pos: int,
                        recs: list[Record], lso: int) -> tuple[list[Record], int]:
        """read_committed: the records below the last stable offset lso (found before they
        were read), aborted transactions' dropped, and the position after those looked at."""
        f = self._filter(tp, pos)
        self._stalled.pop(tp, None)
        if lso <= pos and lg.log_end_offset > pos:
            self._stalled[tp] = lg.log_end_offset
        return f.committed(recs, pos, lso)

    def forget(self, tps) -> None:
        """Partitions no longer assigned (or sought): their transaction state goes."""
        for tp in tps:
            self._txn.pop(tp, None)
            self._stalled.pop(tp, None)
            self._read_from.pop(tp, None)

    # -- waits -----------------------------------------------------------------------------------
    def wait(self, timeout: float, bells: Sequence[_notify.Bell] = (),
             check: Optional[Callable[[], bool]] = None) -> None:
        """Sleep until a fetchable partition has records past its position, a bell rings, check()
        holds, or timeout seconds: see wait_logs."""
        logs, offsets = self.wait_spec()
        wait_logs(logs, offsets, timeout, bells, check)

    def wait_spec(self, only: Optional[set[TopicPartition]] = None) -> tuple[list[Log], list[int]]:
        """The logs to wait on (the fetchable partitions, of only if given) and, for each, the
        offset its end must pass."""
        logs: list[Log] = []
        offsets: list[int] = []
        for tp in self.state.fetchable():
            if only is not None and tp not in only:
                continue
            try:
                logs.append(self.source.log(tp))
            except (UnknownTopicError, LogDirOfflineError):
                continue                     # nothing to wait for until a reopen
            pos = self.state.position(tp)
            assert pos is not None
            offsets.append(max(pos, self._stalled.get(tp, pos)))
        return logs, offsets


def wait_logs(logs: Sequence[Log], offsets: Sequence[int], timeout: float,
              bells: Sequence[_notify.Bell] = (), check: Optional[Callable[[], bool]] = None) -> None:
    """Until the end of some logs[i] is above offsets[i], the word of one of bells moves (a
    consumer group's rebalance bell) or one is closed, check() is true (called after arming,
    so a change between the check and the sleep still wakes), or timeout seconds. One
    futex_waitv over all the words (notify.wait_any's scheme, plus the extra bells), in slices
    of notify.SLICE_S; a log without a usable word (or more than _notify.WAIT_ANY_MAX words)
    makes it poll every notify.POLL_S.
    A log closed or deleted meanwhile ends the wait: the next fetch finds out."""
    deadline = time.monotonic() + max(0.0, timeout)
    quiet = False
    while True:
        now = time.monotonic()
        left = deadline - now
        ws: list[int] = [b.arm() for b in bells]
        if any(b.closed for b in bells):
            return                              # a closed (replaced) bell cannot ring
        bs: list[_notify.Bell] = list(bells)
        usable = True
        try:
            for lg in logs:
                n = lg.notifier
                bell = n.current_bell(now)
                word = bell.arm() if bell is not None else 0
                n.catch_up(bell, word, quiet)
                if bell is None:
                    usable = False
                else:
                    bs.append(bell)
                    ws.append(word)
        except (KStoreStateError, UnknownTopicError):
            return
        quiet = False
        if any(lg.log_end_offset > off for lg, off in zip(logs, offsets)):
            return
        if check is not None and check():
            return
        if left <= 0:
            return
        r = errno.ENOSYS
        if usable and bs and len(bs) <= _notify.WAIT_ANY_MAX:
            r = _notify.wait_any(bs, ws, min(left, notify.SLICE_S), notify.SETTLE_S)
        elif usable and not bs:
            time.sleep(min(left, notify.SLICE_S))       # nothing to wait on: the timeout
            quiet = True
            continue
        if any(b.load() != w for b, w in zip(bells, ws)):
            return
        if r == 0 or r == errno.EAGAIN:
            # woken: a read-only log whose writer appended learns it by the tail step alone
            # (the append-to-visible path); anything else goes round the loop's catch-up
            extra = len(bells)
            try:
                for i, (lg, off) in enumerate(zip(logs, offsets)):
                    if notify.woken_past(lg, bs[extra + i], off):
                        return
            except (KStoreStateError, UnknownTopicError):
                return
        if r == errno.ETIMEDOUT:
            quiet = True
        elif r == errno.ENOSYS:
            time.sleep(min(left, notify.POLL_S))
            quiet = True


def _catch_up(lg: Log) -> None:
    """A read-only log learns what its writer appended: a refresh only if the notification
    word moved since the last look and its hints differ from what the log knows (a few loads
    otherwise)."""
    n = lg.notifier
    bell = n.current_bell(time.monotonic())
    n.catch_up(bell, bell.load() if bell is not None else 0)
