"""A Consumer's commits (Kafka's ConsumerCoordinator's half that writes offsets): commit(),
poll's auto-commit every auto_commit_interval_ms, the auto-commit before partitions are given up
(a rebalance's, close()'s) and committed(). A mixin of `Consumer`, on its state (positions,
member, lock).

Waits: commit(), poll's auto-commit and its rebalance commit wait for the offsets flock in
pauses slept on the consumer's bell (Wakeup.pause): wakeup() ends the wait (WakeupError), and
so does a close() not yet running (from another thread, or a signal handler's in this one):
the poll returns {} and the close commits instead. A commit that ended so wrote nothing and is
not recorded; a rebalance's keeps its partitions for the next poll (or the close) to commit and
give up. A rebalance listener's commit and close()'s own wait up to close(timeout)'s deadline;
a rebalance's or close()'s commit that fails is logged and the caller goes on (Kafka's
maybeAutoCommitOffsetsSync).
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from kstore.consumer_buffer import RecordBuffer
from kstore.consumer_queries import retrying
from kstore.consumer_wakeup import CloseTimeoutError, Wakeup
from kstore.errors import (CoordinatorNotAvailableError, KStoreError, KStoreStateError,
                           UnknownTopicError, WakeupError)
from kstore.fetcher import Fetcher, LogSource
from kstore.fileio import FileOps
from kstore.subscription_state import SubscriptionState
from kstore.topic_partition import TopicPartition

__all__ = ["ConsumerCommits"]

log = logging.getLogger("kstore.consumer")


class ConsumerCommits:
    """Consumer's commits (the consumer sets the attributes below)."""

    group_id: Optional[str]
    enable_auto_commit: bool
    auto_commit_interval: float
    _state: SubscriptionState
    _buffer: RecordBuffer
    _fetcher: Fetcher
    _source: LogSource
    _io: Optional[FileOps]
    _coordinator: Any
    _member: Any
    _lock: threading.RLock
    _wake: Wakeup
    _next_commit: float
    _last_commit: dict[TopicPartition, int]
    default_api_timeout_ms: float

    def _coord(self) -> Any:
        """The group's coordinator (the one given, else made at first use)."""
        if self._coordinator is None:
            from kstore.group_coordinator import GroupCoordinator
            store = self._source.manager if self._source.manager is not None else self._source.log_dirs
            self._coordinator = GroupCoordinator(store, io=self._io)
        return self._coordinator

    def _consumed(self, tps: Optional[Iterable[TopicPartition]] = None) -> dict[TopicPartition, int]:
        pos = self._state.consumed()
        if self._buffer:
            pos.update((tp, off) for tp, off in self._buffer.held().items() if tp in pos)
        if tps is not None:
            keep = set(tps)
            pos = {tp: o for tp, o in pos.items() if tp in keep}
        gone = self._fetcher.stale(pos)      # a deleted topic's: never committed (fetcher.py)
        return {tp: o for tp, o in pos.items() if tp not in gone} if gone else pos

    def commit(self, offsets: Optional[Mapping[TopicPartition, Any]] = None,
               timeout_ms: Optional[float] = None) -> None:
        """Commit offsets (default: the positions of every assigned partition, i.e. after the
        records returned so far) to the group's `__consumer_offsets` partition, in one batch.
        When it returns the commit survives a kill -9 of this process. A group member commits
        only partitions it owns (CommitFailedError otherwise, as Kafka's). wakeup() raises
        WakeupError here, also in its wait for another process's commit (nothing written).
        While the offsets partition's log dir is offline (Kafka's retriable COORDINATOR_NOT_
        AVAILABLE) it tries again until timeout_ms (default_api_timeout_ms): ApiTimeoutError."""
        if self.group_id is None:
            raise KStoreStateError("commit needs a group_id (the consumer was made without one)")
        ms = self.default_api_timeout_ms if timeout_ms is None else timeout_ms
        with self._lock:
            self._wake.check()      # and its wait for the offsets flock: wakeup() ends it
            todo = self._consumed() if offsets is None else offsets
            retrying(self._wake, ms, lambda: self._commit(todo, self._wake.pause, offsets is None),
                     lambda _ms, why: f"Timeout of {ms}ms expired before successfully committing "
                     f"offsets {{{', '.join(f'{tp}={o}' for tp, o in todo.items())}}} ({why})")

    def _commit(self, offsets: Mapping[TopicPartition, Any],
                sleep: Optional[Callable[[float], None]] = None, positions: bool = False) -> None:
        """Write offsets; positions: they are the consumer's own (commit() without offsets,
        auto-commits), each committed with the leader epoch of the record before it."""
        if not offsets:
            return
        from kstore.group_records import OffsetAndMetadata
        values = {TopicPartition(*tp): OffsetAndMetadata.coerce(v) for tp, v in offsets.items()}
        if positions:     # with the epoch of the record before each (Kafka's allConsumed())
            values = {tp: dataclasses.replace(v, leader_epoch=self._position_epoch(tp, v.offset))
                      for tp, v in values.items()}
        if self._member is not None:
            self._member.commit(values, sleep)       # CommitFailedError for a partition it lost
        else:
            self._coord().commit_offsets(self.group_id, values, sleep=sleep)
        self._last_commit.update((tp, v.offset) for tp, v in values.items())

    def _maybe_auto_commit(self) -> bool:
        """Poll's auto-commit; False if a close() ended its flock wait (nothing written)."""
        if not self.enable_auto_commit or time.monotonic() < self._next_commit:
            return True
        due, self._next_commit = self._next_commit, time.monotonic() + self.auto_commit_interval
        try:        # wakeup() ends its flock wait (nothing written): the next poll commits
            self._commit_changed(self._consumed(), self._wake.pause)
        except CoordinatorNotAvailableError as e:     # retriable: logged, tried again (Kafka)
            log.warning("Asynchronous auto-commit of offsets failed due to retriable error: %s", e)
        except (WakeupError, KStoreStateError):
            self._next_commit = due
            if self._wake.closing is None:
                raise
            return False
        return True

    def _maybe_commit_before_losing(self, tps: Optional[Iterable[TopicPartition]],
                                    closing: bool = False,
                                    sleep: Optional[Callable[[float], None]] = None) -> None:
        """The auto-commit of tps (None: all) before they are given up (Kafka's
        maybeAutoCommitOffsetsSync). closing (close()'s) or with sleep (a poll's rebalance, its
        wait's pauses): a failure is logged and the caller goes on, but for a rebalance's
        commit ended by wakeup() or a close() (raised: nothing written). Else it raises."""
        positions = self._consumed(tps) if self.enable_auto_commit else {}
        try:
            self._commit_changed(positions, sleep)
        except KStoreError as e:
            if not closing and (sleep is None or isinstance(e, (WakeupError, KStoreStateError))):
                raise
            shown = {str(tp): o for tp, o in sorted(positions.items())}
            if isinstance(e, CloseTimeoutError):
                log.warning("Auto-commit of offsets %s timed out before completion", shown)
            else:
                log.warning("Synchronous auto-commit of offsets %s failed: %s", shown, e)

    def _commit_changed(self, positions: dict[TopicPartition, int],
                        sleep: Optional[Callable[[float], None]] = None) -> None:
        """Commit the positions that moved since the last commit (an idle one writes nothing)."""
        if self._member is not None:
            owned = self._member.owned()
            positions = {tp: o for tp, o in positions.items() if tp in owned}
        changed = {tp: o for tp, o in positions.items() if self._last_commit.get(tp) != o}
        try:
            self._commit(changed, sleep, True)
        except UnknownTopicError as e:       # deleted since read (Kafka: logged, the rest commits)
            log.warning("auto-commit left out %s: %s", sorted(map(str, e.partitions)), e)
            self._commit({tp: o for tp, o in changed.items() if tp not in e.partitions}, sleep,
                         True)

    def _position_epoch(self, tp: TopicPartition, offset: int) -> Optional[int]:
        """The leader epoch of the record before offset if offset is tp's position (a buffered
        one's is not known: None, committed without an epoch)."""
        try:
            return self._state.position_epoch(tp) if self._state.position(tp) == offset else None
        except KStoreStateError:
            return None

    def committed(self, tp: TopicPartition, metadata: bool = False,
                  timeout_ms: Optional[float] = None) -> Any:
        """The group's committed offset of tp (None if none); metadata=True: its OffsetAndMetadata.
        While the group's offsets partition is on an offline log dir (Kafka's retriable
        COORDINATOR_NOT_AVAILABLE) it asks again until timeout_ms (default_api_timeout_ms), then
        raises ApiTimeoutError; wakeup() and close() end the wait (consumer_queries.retrying)."""
        if self.group_id is None:
            raise KStoreStateError("committed needs a group_id (the consumer was made without one)")
        tp = TopicPartition(*tp)
        ms = self.default_api_timeout_ms if timeout_ms is None else timeout_ms
        group = self.group_id
        got = retrying(self._wake, ms, lambda: self._coord().fetch_offsets(group, [tp]).get(tp),
                       lambda _ms, why: f"Timeout of {ms}ms expired before the last committed offset "
                       f"for partitions [{tp}] could be determined. Try tuning default.api.timeout.ms "
                       f"larger to relax the threshold. ({why})")
        return got if got is None or metadata else got.offset

    def _fetch_committed(self, tps: Sequence[TopicPartition]
                         ) -> dict[TopicPartition, tuple[int, Optional[int]]]:
        """(offset, leader epoch) committed for tps: where a resumed position starts, checked
        against truncations by its epoch (KIP-320, fetcher.py)."""
        got = self._coord().fetch_offsets(self.group_id, tps)
        return {TopicPartition(*tp): (o.offset, o.leader_epoch) for tp, o in got.items()
                if o.offset >= 0}
