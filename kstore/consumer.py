"""`kstore.Consumer`: Kafka's consumer over a local store, with kafka-python's names and rules.

    with kstore.Consumer("data", "clicks", group_id="billing", auto_offset_reset="earliest") as c:
        for tp, records in c.poll(timeout_ms=1000).items():
            ...                      # records: kstore.Record objects of partition tp, in order

Reads go to the store's files directly: a `StoreReader` on the log dirs (lock-free, beside the
producer's process) or the `LogManager` given. `poll` returns `{TopicPartition: [Record, ...]}`
(at most max_poll_records) and, when nothing is there, sleeps on the partitions' notification
words and the group's bell until data, a rebalance or the timeout (no busy loop).

Positions start at the group's committed offset (`__consumer_offsets`, through a
`GroupCoordinator`), else at `auto_offset_reset` ("latest", "earliest", or "none":
NoOffsetForPartitionError); a position outside the log (retention, truncation) resets the same way
("none": OffsetOutOfRangeError), as Kafka's, and so does one read from a topic since deleted and
re-created (never committed: fetcher.py). With `subscribe` and a group_id the partitions are shared
with the group's other members (`GroupMember`: file locks); with `assign` there is no membership,
commits still go to the group's offsets. Auto-commit (the default) commits the positions of records
returned: in poll every auto_commit_interval_ms, before partitions are revoked, at close
(at-least-once; consumer_commits.py). A member not polling for max_poll_interval_ms is evicted by
its poll timer (poll_timer.py) without a commit; its next poll reports the partitions lost and
rejoins. One user thread at a time (Kafka's): a second raises ConcurrentModificationError
(consumer_access.py); any thread may call wakeup() (a blocked poll or commit raises WakeupError)
and close() (a poll returns; close(timeout) bounds its waits for other processes):
consumer_wakeup.py. `_lock` (RLock), held by every call (consumer_access.py), keeps that timer
and a close() out of them; once closed every call raises KStoreStateError (Kafka's message).
"""
from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import replace
from typing import Any, Iterable, Optional, Sequence

from kstore._core import Record
from kstore.errors import CoordinatorNotAvailableError, InvalidConfigError, KStoreStateError
from kstore.consumer_access import CLOSED, ThreadGuard, guard_methods
from kstore.consumer_buffer import RecordBuffer
from kstore.consumer_commits import ConsumerCommits
from kstore.consumer_queries import RETRIABLE, DEFAULT_API_TIMEOUT_MS, ConsumerQueries, retrying
from kstore.consumer_types import (ConsumerRebalanceListener, ConsumerRecord,
                                   OffsetAndTimestamp, check_settings)
from kstore.consumer_wakeup import DEFAULT_CLOSE_TIMEOUT_S, Wakeup
from kstore.fetcher import INTERNAL_TOPICS, Fetcher, LogSource
from kstore.fileio import FileOps
from kstore.group_records import OffsetAndMetadata
from kstore.notify import SLICE_S
from kstore.poll_timer import POLL_TIMEOUT_EXPIRED, PollTimer
from kstore.subscription_state import SubscriptionState
from kstore.topic_partition import TopicPartition

__all__ = ["Consumer", "ConsumerRebalanceListener", "ConsumerRecord", "OffsetAndTimestamp"]

_new_tuple = tuple.__new__     # a ConsumerRecord without NamedTuple's Python-level __new__
_EVICTED = object()            # _pending after the poll timer evicted the member
log = logging.getLogger("kstore.consumer")


class Consumer(ConsumerQueries, ConsumerCommits):
    """A consumer of a store's topics: see the module doc. Use as a context manager.

    store: log dirs (a path, a comma-separated string or a sequence: read through a
    StoreReader), a StoreReader, or the producer's own LogManager. topics (positional or
    topics=) or pattern: subscribe at once. Options keep kafka-python's names and defaults:
    group_id, client_id, auto_offset_reset ("latest" | "earliest" | "none"),
    enable_auto_commit, auto_commit_interval_ms, max_poll_records, isolation_level
    ("read_uncommitted" | "read_committed"), max_partition_fetch_bytes, session_timeout_ms,
    heartbeat_interval_ms, max_poll_interval_ms, partition_assignment_strategy (names
    "range", "roundrobin" or assignor objects), consumer_timeout_ms (iteration stops after
    that long without a record), default_api_timeout_ms (how long the offset queries retry an
    offline partition). listener: a ConsumerRebalanceListener. coordinator: a
    GroupCoordinator to share (default: one on the store, closed with the consumer).
    """

    def __init__(self, store: Any, *topic_names: str, topics: Optional[Iterable[str]] = None,
                 pattern: "str | re.Pattern[str] | None" = None, group_id: Optional[str] = None,
                 client_id: str = "kstore", auto_offset_reset: str = "latest",
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5000,
                 max_poll_records: int = 500, isolation_level: str = "read_uncommitted",
                 max_partition_fetch_bytes: int = 1 << 20, session_timeout_ms: int = 45000,
                 heartbeat_interval_ms: int = 3000, max_poll_interval_ms: int = 300000,
                 partition_assignment_strategy: Sequence[Any] = ("range",),
                 consumer_timeout_ms: Optional[float] = None,
                 default_api_timeout_ms: float = DEFAULT_API_TIMEOUT_MS,
                 listener: Optional[ConsumerRebalanceListener] = None,
                 coordinator: Any = None, io: Optional[FileOps] = None):
        check_settings(isolation_level, max_poll_records, group_id, max_poll_interval_ms)
        self.group_id = group_id
        self.client_id = client_id
        self.enable_auto_commit = enable_auto_commit and group_id is not None
        self.auto_commit_interval = auto_commit_interval_ms / 1000
        self.max_poll_records = max_poll_records
        self.consumer_timeout = None if consumer_timeout_ms is None else consumer_timeout_ms / 1000
        self.max_poll_interval = max_poll_interval_ms / 1000
        self.default_api_timeout_ms = default_api_timeout_ms
        self._group_settings: dict[str, Any] = dict(client_id=client_id, session_timeout_ms=session_timeout_ms,
                                    heartbeat_interval_ms=heartbeat_interval_ms,
                                    rebalance_timeout_ms=max_poll_interval_ms)
        self._strategy = tuple(partition_assignment_strategy)
        self._io = io
        self._state = SubscriptionState(auto_offset_reset)
        self._source = LogSource(store, io=io)
        self._fetcher = Fetcher(self._source, self._state, max_partition_bytes=max_partition_fetch_bytes,
                                read_committed=isolation_level == "read_committed")
        self._coordinator, self._own_coordinator = coordinator, coordinator is None
        self._member: Any = None
        self._pending: Any = None               # an AssignmentChange seen while waiting
        self._listener = listener
        self._next_commit = time.monotonic() + self.auto_commit_interval
        self._last_commit: dict[TopicPartition, int] = {}
        self._buffer = RecordBuffer()           # iteration's records read ahead
        self._closed = False
        self._lock = threading.RLock()
        self._guard = ThreadGuard()             # one user thread at a time (consumer_access.py)
        self._wake = Wakeup()                   # wakeup() and close() from other threads
        self.last_poll_time = time.monotonic()  # of the last poll (what the poll timer reads)
        self._poll_timer: Optional[PollTimer] = None
        names = list(topic_names) + list(topics or ())
        if names or pattern is not None:
            self.subscribe(names, pattern=pattern, listener=listener)

    # -- context, iteration ----------------------------------------------------------------------
    def __enter__(self) -> "Consumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __iter__(self) -> "Consumer":
        return self

    def __next__(self) -> ConsumerRecord:
        """The next record, waiting (StopIteration after consumer_timeout_ms or once closed:
        checked on entry, under _lock, which close() waits for, and by fill's polls)."""
        buf = self._buffer
        while True:
            if buf:
                entry = buf[0]
                recs, i = entry[1], entry[2]
                if i < len(recs):
                    entry[2] = i + 1
                    r: Record = recs[i]
                    tp = entry[0]
                    return _new_tuple(ConsumerRecord, (tp.topic, tp.partition, r.offset, r.timestamp,
                                                       r.timestamp_type, r.key, r.value, r.headers))
                buf.popleft()
                continue
            buf.fill(self.poll, self.consumer_timeout, lambda: self._closed or self._wake.closing is not None)

    # -- subscription and assignment -------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] = (), pattern: "str | re.Pattern[str] | None" = None,
                  listener: Optional[ConsumerRebalanceListener] = None) -> None:
        """Subscribe to topics or to every topic whose whole name matches pattern (internal
        topics excluded). With a group_id the group shares their partitions; without one this
        consumer reads them all. Joining happens in the next poll."""
        if isinstance(topics, str):
            topics = [topics]
        self._state.subscribe(topics, pattern)
        if listener is not None:
            self._listener = listener
        if self._member is not None:     # the next poll's rebalance applies it
            st = self._state
            self._member.subscribe(topics=sorted(st.topics) if st.topics else None, pattern=st.pattern)

    def subscription(self) -> Optional[set[str]]:
        return set(self._state.topics) if self._state.topics else None

    def unsubscribe(self) -> None:
        """Leave the group (committing first, with auto-commit) and drop every partition."""
        if self._member is not None:
            self._leave_group()
        self._revoke(self._state.assignment(), release=False)
        self._state.unsubscribe()

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Manual assignment (no group membership); commits still go to group_id's offsets."""
        tps = [TopicPartition(*tp) for tp in partitions]
        gone = self._state.assignment() - set(tps)
        if gone:
            self._maybe_commit_before_losing(gone)
        self._drop(gone, remove=False)
        self._state.assign_from_user(tps)

    def assignment(self) -> set[TopicPartition]:
        return self._state.assignment()

    # -- positions -------------------------------------------------------------------------------
    def position(self, tp: TopicPartition, timeout_ms: Optional[float] = None) -> int:
        """The offset of the next record poll returns for tp (found now if still unknown: while
        the group's offsets partition is offline, asked again until timeout_ms, default
        default_api_timeout_ms, then ApiTimeoutError, as Kafka's position)."""
        tp = TopicPartition(*tp)
        if self._buffer:
            held = self._buffer.held()
            if tp in held:
                return held[tp]
        if self._state.position(tp) is None:
            ms = self.default_api_timeout_ms if timeout_ms is None else timeout_ms

            def update() -> None:
                self._fetcher.update_positions([tp], self._fetch_committed if self.group_id else None)
            try:            # (a wakeup() ends only the retries' wait: a listener may ask)
                update()
            except RETRIABLE:
                retrying(self._wake, ms, update, lambda _ms, why: f"Timeout of {ms}ms expired "
                         f"before the position for partition {tp} could be determined ({why})")
        pos = self._state.position(tp)
        if pos is None:
            raise KStoreStateError(f"no position for {tp}: the partition is not in the store")
        return pos

    def seek(self, tp: TopicPartition, offset: int | OffsetAndMetadata) -> None:
        """The next poll reads tp from offset. An OffsetAndMetadata (as committed(tp,
        metadata=True) returns) with a leader_epoch is checked against a truncation of the log
        past it (KIP-320, Kafka's seek(tp, OffsetAndMetadata)); a plain offset is not."""
        tp = TopicPartition(*tp)
        if isinstance(offset, OffsetAndMetadata):
            self._state.seek(tp, offset.offset, offset.leader_epoch)
        else:
            self._state.seek(tp, offset)
        self._drop([tp], remove=False)

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        self._seek_policy(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        self._seek_policy(partitions, "latest")

    def _seek_policy(self, partitions: Sequence[TopicPartition], policy: str) -> None:
        tps = [TopicPartition(*tp) for tp in partitions] or list(self._state.assignment())
        for tp in tps:
            self._state.request_reset(tp, policy)
        self._drop(tps, remove=False)

    def pause(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._state.pause(TopicPartition(*tp))
        self._buffer.drop(TopicPartition(*tp) for tp in partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        for tp in partitions:
            self._state.resume(TopicPartition(*tp))

    def paused(self) -> set[TopicPartition]:
        return self._state.paused()

    # -- poll ------------------------------------------------------------------------------------
    def poll(self, timeout_ms: float = 0, max_records: Optional[int] = None
             ) -> dict[TopicPartition, list[Record]]:
        """Records of the assigned, unpaused partitions from their positions, at most
        max_records (max_poll_records); waits up to timeout_ms for some to arrive, sleeping on
        the logs' notification words and the group's bell. Runs the group's rebalances, the
        rebalance listener and the auto-commit."""
        limit = self.max_poll_records if max_records is None else max_records
        if not isinstance(limit, int) or limit < 1:
            raise InvalidConfigError(f"max_records must be a positive int, not {limit!r}")
        with self._lock:
            self._wake.check()
            if self._buffer and self._pending is not _EVICTED:     # evicted: drop, rejoin first
                self.last_poll_time = time.monotonic()
                return self._buffer.drain(limit)
            deadline = time.monotonic() + max(0.0, timeout_ms / 1000)
            while True:
                if not self._maybe_auto_commit():     # close() ended its flock wait: it commits
                    return {}
                try:
                    self._coordinate()
                except CoordinatorNotAvailableError as e:    # retriable: owned ones still read
                    log.debug("group %r: coordinator not available: %s", self.group_id, e)
                except KStoreStateError:
                    if self._wake.closing is not None:    # close() ended a join's group.lock wait
                        return {}
                    raise
                if self._wake.closing is not None:        # a close() began (a signal handler's
                    return {}                             # here): it commits what was returned
                self._fetcher.update_positions(None, self._fetch_committed if self.group_id else None)
                got = self._fetcher.fetch(limit)
                now = self.last_poll_time = time.monotonic()
                if got or now >= deadline:
                    return got
                bells = [self._wake.bell] + ([self._member.notify_word()] if self._member is not None else [])
                self._fetcher.wait(min(deadline - now, self._wait_bound(now)), bells, self._wait_check)
                if self._wake.closing is not None:     # close() has begun: return now
                    return {}
                self._wake.check()

    def _wait_check(self) -> bool:
        """An idle poll's wait ends on wakeup(), close() or a rebalance (kept for _coordinate)."""
        return self._wake.interrupted() or (self._member is not None and self._group_changed())

    def wakeup(self) -> None:
        """From any thread (Kafka's wakeup): the poll blocked in another thread, or else the
        next poll, commit or committed, raises WakeupError once; positions stay as they were."""
        self._wake.wake()

    def wait_interrupted(self) -> bool:
        """Whether wakeup() or close() was called and a wait should end (the AsyncWaiter's check)."""
        return self._wake.interrupted()

    def _wait_bound(self, now: float) -> float:
        """The longest an idle poll may sleep before it has work: the next auto-commit, heartbeat
        or rescan (no group), half max_poll_interval (an async getmany's wait is no poll)."""
        bound = float("inf")
        if self.enable_auto_commit:
            bound = max(0.0, self._next_commit - now)
        if self._state.subscribed and self._member is None:
            bound = min(bound, SLICE_S)
        if self._member is not None:
            bound = min(bound, self._member.poll_timeout(), self.max_poll_interval / 2)
        return bound

    def wait_spec(self, partitions: Optional[Iterable[TopicPartition]] = None
                  ) -> tuple[list, list[int], list, float]:
        """(logs, offsets, bells, longest sleep): what a poll with nothing to return sleeps on
        (until some logs[i] ends past offsets[i] or a bell's word moves); the AsyncConsumer's
        waiter thread waits on it for every async consumer at once."""
        only = None if partitions is None else {TopicPartition(*tp) for tp in partitions}
        self._check_open()
        if not self._lock.acquire(False):    # a close() begun since, or the poll timer: the next
            return [], [], [], 0.0           # poll acts (the event loop never waits for them)
        try:
            if self._pending is _EVICTED or self._wake.interrupted():   # the next poll acts
                return [], [], [], 0.0
            logs, offsets = self._fetcher.wait_spec(only)
            bells = [self._wake.bell] + ([self._member.notify_word()] if self._member is not None else [])
            return logs, offsets, bells, self._wait_bound(time.monotonic())
        finally:
            self._lock.release()

    # -- the group -------------------------------------------------------------------------------
    def _coordinate(self) -> None:
        """Join the group, or apply what changed in it; without a group, a subscription reads
        every partition of its topics."""
        st = self._state
        if not st.subscribed:
            return
        if self.group_id is None:
            self._source.rescan()
            want = {TopicPartition(t, p) for t in self._source.topics()
                    if st.matches(t) and not (st.pattern is not None and t in INTERNAL_TOPICS)
                    for p in self._source.partitions(t)}
            have = st.assignment()
            if want != have:
                self._revoke(have - want, release=False)
                st.add(sorted(want - have))
                if self._listener is not None:
                    self._tell(self._listener.on_partitions_assigned, want - have)
            return
        if self._member is not None:
            change, self._pending = self._pending, None
            if change is None:
                change = self._member.poll()
                if change is None:
                    return
            if change is not _EVICTED:
                self._apply(change)
                return
            self._lose_partitions()          # then rejoin below, as a new member
        if self._member is None:
            from kstore.assignors import assignors_from
            from kstore.group_membership import GroupMember

            def partitions_for(topic: str) -> int:
                self._source.rescan()
                return self._source.partition_count(topic)

            def list_topics() -> list[str]:
                self._source.rescan()
                return [t for t in self._source.topics() if t not in INTERNAL_TOPICS]

            member = GroupMember(
                self._coord(), self.group_id,
                topics=sorted(st.topics) if st.topics else None, pattern=st.pattern,
                partitions_for=partitions_for, list_topics=list_topics,
                assignors=assignors_from(self._strategy), io=self._io, interrupt=self._wake.check_wait,
                **self._group_settings)
            change, self._member = member.join(), member     # a failed join: retried next poll
            self.last_poll_time = time.monotonic()
            self._poll_timer = PollTimer(self.max_poll_interval, self._lock, self, self._evict,
                                         f"kstore-poll-timer-{self.group_id}")
            self._apply(change)

    def _evict(self) -> None:
        """The poll timer's eviction (its thread, under _lock): the member leaves without a
        commit (Kafka's maybeLeaveGroup); the next poll reports its partitions lost, rejoins."""
        member = self._member
        if self._closed or member is None or self._pending is _EVICTED:
            return
        log.warning("group %r member %s: " + POLL_TIMEOUT_EXPIRED + " It leaves the group without "
                    "committing; its next poll() rejoins.", self.group_id, member.member_id,
                    round(self.max_poll_interval * 1000))
        try:
            member.expire()
        except Exception as e:     # a custom assignor's too (this thread has no caller): it left
            log.warning("group %r: %s left without a rebalance: %s", self.group_id, member.member_id, e)
        self._pending = _EVICTED

    def _lose_partitions(self) -> None:
        """After an eviction: the listener's on_partitions_lost (else on_partitions_revoked,
        Kafka's default), nothing committed, positions forgotten, the member dropped."""
        lost = self._state.assignment()
        self._pending = _EVICTED             # if the listener raises: still out until the next poll
        try:                                 # the member stays for the listener: commits fail
            if lost and self._listener is not None:
                on_lost = getattr(self._listener, "on_partitions_lost", None)
                self._tell(on_lost or self._listener.on_partitions_revoked, lost)
            self._member = self._pending = None
            self._cancel_timer()
        finally:
            self._drop(lost)
            self._last_commit = {tp: o for tp, o in self._last_commit.items() if tp not in lost}

    def _drop(self, tps: Iterable[TopicPartition], remove: bool = True) -> None:
        """Forget the partitions' fetch state and read-ahead records (remove: them too)."""
        if remove:
            self._state.remove(tps)
        self._fetcher.forget(tps)
        self._buffer.drop(tps)

    def _cancel_timer(self) -> None:
        timer, self._poll_timer = self._poll_timer, None
        if timer is not None:
            timer.cancel()

    def _group_changed(self) -> bool:
        """The wait's check: a rebalance reached this member (kept for the next _coordinate)."""
        if self._pending is None:
            try:
                self._pending = self._member.poll()
            except CoordinatorNotAvailableError:      # the next poll's _coordinate retries
                return False
        return self._pending is not None

    def _apply(self, change) -> None:
        """Apply a rebalance's change: commit the revoked (Kafka's onJoinPrepare), tell the
        listener, give them up, take the assigned. A commit ended by wakeup() or a close()
        keeps the whole change for the next poll (nothing given up, the listener not called);
        the close gives everything up. A listener raising (a WakeupError from its commit) does
        not undo it: the revoked are dropped and released, the assigned kept for the next poll."""
        if change.revoked:
            tps = set(change.revoked) & self._state.assignment()
            try:
                self._maybe_commit_before_losing(tps, sleep=self._wake.pause)
            except BaseException:
                self._pending = change
                raise
            try:
                if tps and self._listener is not None:
                    self._tell(self._listener.on_partitions_revoked, tps)
            except BaseException:
                self._pending = replace(change, revoked=frozenset())
                raise
            finally:
                self._drop(tps)
                self._member.release(change.revoked)
        added = set(change.assigned) - self._state.assignment()
        self._state.add(sorted(change.assigned))
        if self._listener is not None:
            self._tell(self._listener.on_partitions_assigned, added)

    def _tell(self, method, tps: Iterable[TopicPartition]) -> None:
        """Call a listener's method: its commits wait on past a close() begun meanwhile, up to
        close's deadline (the rebalance it is part of completes; consumer_wakeup)."""
        self._wake.listening += 1
        try:
            method(set(tps))
        finally:
            self._wake.listening -= 1

    def _revoke(self, tps: set[TopicPartition], release: bool) -> None:
        """Give partitions up: auto-commit their positions, tell the listener, forget them and
        (release) let the group's next owner have them."""
        if tps:
            try:
                self._maybe_commit_before_losing(tps)
                if self._listener is not None:
                    self._tell(self._listener.on_partitions_revoked, tps)
            finally:                         # given up even if the listener raised
                self._drop(tps)
        if release and self._member is not None:
            self._member.release(tps)

    def _leave_group(self, closing: bool = False) -> None:
        if self._pending is _EVICTED:
            self._lose_partitions()
            return
        self._cancel_timer()
        member, self._member = self._member, None
        self._pending = None
        owned = self._state.assignment()
        sleep = self._wake.pause if closing else None    # close's: within its deadline
        try:
            self._maybe_commit_before_losing(owned, closing, sleep)
            if owned and self._listener is not None:
                self._tell(self._listener.on_partitions_revoked, owned)
        finally:                             # the member leaves even if the listener raised
            self._drop(owned)
            if closing:
                member.leave(self._wake.left(), sleep)
            else:
                member.leave()

    # -- close -----------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        """close() is done."""
        return self._closed

    @property
    def closing(self) -> bool:
        """close() has begun, in any thread, or is done: other threads' calls are refused."""
        return self._closed or self._wake.closing is not None

    def _check_open(self) -> None:
        """Refuse once closed or once another thread's close() has begun (it waits for _lock)."""
        if self._closed or self._wake.closed_elsewhere():
            raise KStoreStateError(CLOSED)

    def close(self, autocommit: bool = True, timeout: Optional[float] = None) -> None:
        """Commit (auto-commit, unless autocommit=False), leave the group, close. Idempotent.
        timeout (seconds; default 30, Kafka's close(Duration)) bounds the waits for other
        processes' locks (the commits, the leave's group.lock): past it each is logged and
        skipped, and the consumer is closed. Called inside one of this consumer's calls on the
        same thread (a signal handler's, a rebalance listener's), it closes as that call returns."""
        if timeout is None:
            timeout = DEFAULT_CLOSE_TIMEOUT_S
        elif isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout != timeout:
            raise InvalidConfigError(f"close timeout must be a number of seconds, not {timeout!r}")
        elif timeout < 0:
            raise InvalidConfigError("The timeout cannot be negative.")
        if self._closed:
            return
        self._wake.close(self._guard, float(timeout))     # a poll in another thread returns now
        if self._guard.owner == threading.get_ident():
            # inside one of this thread's calls (a signal handler's close): closing under it
            # would pull its state away (a poll holding GroupMember._lock: a deadlock), so
            # the call ends now (a poll returns {}) and the close runs as it returns
            self._guard.later = lambda: self._close(autocommit)
            return
        self._close(autocommit)

    def _close(self, autocommit: bool) -> None:
        """close()'s work, once no call of this thread is under way (within Wakeup's deadline)."""
        if self._closed:
            return
        timer = self._poll_timer              # stopped after _lock: it may be waiting for it
        with self._lock:                      # closed (set last) once a close() is done
            if not self._closed:              # else another thread's close() ran meanwhile
                self._wake.claim(self._guard)     # this thread closes: its listener's calls pass
                try:
                    self.enable_auto_commit = self.enable_auto_commit and autocommit
                    if self._member is not None:
                        self._leave_group(closing=True)
                    else:
                        self._maybe_commit_before_losing(None, True, self._wake.pause)
                finally:
                    try:
                        self._cancel_timer()
                        self._buffer.clear()
                        if self._own_coordinator and self._coordinator is not None:
                            self._coordinator.close(self._wake.pause)
                        self._source.close()
                    finally:
                        self._closed = self._guard.shut = True
        if timer is not None:
            timer.stop()

    def __repr__(self) -> str:
        return (f"Consumer(group_id={self.group_id!r}, log_dirs={self._source.log_dirs}, "
                f"assignment={sorted(map(str, self._state.assignment()))})")


# Kafka's acquire() in every user-facing method but wakeup(), close() (any thread), wait_spec, wait_interrupted
guard_methods(Consumer, ("__next__", "subscribe", "subscription", "unsubscribe", "assign", "assignment", "topics",
                         "partitions_for_topic", "position", "seek", "seek_to_beginning", "seek_to_end", "pause",
                         "resume", "paused", "beginning_offsets", "end_offsets", "offsets_for_times", "poll", "commit", "committed"))
