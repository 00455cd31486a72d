"""A consumer's assignment and positions: Kafka's SubscriptionState.

What the consumer subscribed to (topics, a pattern, or partitions assigned by hand), the
partitions it holds now and, for each, its position (the offset of the next record poll returns;
None until it is initialised from the committed offset or the reset policy), whether it is
paused and whether a seek to the beginning or the end is pending. No I/O: the consumer and its
fetcher decide where positions come from. Used by one thread (the consumer's, as Kafka's
consumer is not thread-safe): no lock.
"""
from __future__ import annotations

import re
from typing import Iterable, Optional

from kstore.errors import InvalidConfigError, KStoreStateError
from kstore.topic_partition import TopicPartition

__all__ = ["RESET_POLICIES", "SubscriptionState"]

#: auto_offset_reset values, as Kafka's auto.offset.reset
RESET_POLICIES = ("latest", "earliest", "none")


class _PartitionState:
    __slots__ = ("position", "epoch", "paused", "reset")

    def __init__(self) -> None:
        self.position: Optional[int] = None
        self.epoch: Optional[int] = None       # the leader epoch of the record before position
        self.paused = False
        self.reset: Optional[str] = None       # "earliest" / "latest": a pending seek


class SubscriptionState:
    """Subscription, assignment, positions, pauses and pending resets of one consumer."""

    def __init__(self, default_reset: str = "latest"):
        if default_reset not in RESET_POLICIES:
            raise InvalidConfigError(f"auto_offset_reset must be one of {RESET_POLICIES}, not {default_reset!r}")
        self.default_reset = default_reset
        self.topics: frozenset[str] = frozenset()
        self.pattern: Optional[re.Pattern[str]] = None
        self.user_assigned = False
        self._parts: dict[TopicPartition, _PartitionState] = {}

    # -- what is subscribed ----------------------------------------------------------------------
    def subscribe(self, topics: Iterable[str] = (), pattern: "str | re.Pattern[str] | None" = None) -> None:
        """Topics or a pattern (exactly one), as Kafka: not both, and not beside assign()."""
        if self.user_assigned:
            raise KStoreStateError("Subscription to topics, partitions and pattern are mutually exclusive")
        topics = frozenset(topics)
        if bool(topics) == (pattern is not None):
            raise KStoreStateError("subscribe needs topics or a pattern (one of the two)")
        if any(not isinstance(t, str) or not t for t in topics):
            raise InvalidConfigError(f"topics must be non-empty strings: {sorted(map(str, topics))}")
        self.topics = topics
        self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern

    @property
    def subscribed(self) -> bool:
        return bool(self.topics) or self.pattern is not None

    def matches(self, topic: str) -> bool:
        """Whether a topic falls under the subscription (a pattern must match the whole name)."""
        if self.pattern is not None:
            return self.pattern.fullmatch(topic) is not None
        return topic in self.topics

    def assign_from_user(self, partitions: Iterable[TopicPartition]) -> None:
        """assign(): manual assignment; positions of partitions kept are kept."""
        if self.subscribed:
            raise KStoreStateError("Subscription to topics, partitions and pattern are mutually exclusive")
        tps = [TopicPartition(*tp) for tp in partitions]
        self.set_assignment(tps)
        self.user_assigned = bool(tps)

    def unsubscribe(self) -> None:
        self.topics = frozenset()
        self.pattern = None
        self.user_assigned = False
        self._parts.clear()

    # -- what is assigned ------------------------------------------------------------------------
    def set_assignment(self, partitions: Iterable[TopicPartition]) -> None:
        """The partitions held now: new ones start without a position, kept ones keep theirs."""
        new: dict[TopicPartition, _PartitionState] = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            new[tp] = self._parts.get(tp) or _PartitionState()
        self._parts = new

    def add(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._parts.setdefault(TopicPartition(*tp), _PartitionState())

    def remove(self, partitions: Iterable[TopicPartition]) -> None:
        for tp in partitions:
            self._parts.pop(TopicPartition(*tp), None)

    def assignment(self) -> set[TopicPartition]:
        return set(self._parts)

    def is_assigned(self, tp: TopicPartition) -> bool:
        return tp in self._parts

    def _state(self, tp: TopicPartition) -> _PartitionState:
        try:
            return self._parts[tp]
        except KeyError:
            raise KStoreStateError(f"No current assignment for partition {tp}") from None

    # -- positions -------------------------------------------------------------------------------
    def position(self, tp: TopicPartition) -> Optional[int]:
        return self._state(tp).position

    def position_epoch(self, tp: TopicPartition) -> Optional[int]:
        """The leader epoch of the record before the position (Kafka's FetchPosition.offsetEpoch;
        None: unknown, the position is not validated against truncations)."""
        return self._state(tp).epoch

    def seek(self, tp: TopicPartition, offset: int, epoch: Optional[int] = None) -> None:
        if not isinstance(offset, int) or offset < 0:
            raise InvalidConfigError(f"seek offset must be a non-negative int, not {offset!r}")
        st = self._state(tp)
        st.position = offset
        st.epoch = epoch if epoch is not None and epoch >= 0 else None
        st.reset = None

    def set_position(self, tp: TopicPartition, offset: int, epoch: Optional[int] = None) -> None:
        """The fetcher's advance past records returned (epoch: the last one's; None keeps it),
        or past a gap."""
        st = self._parts[tp]
        st.position = offset
        if epoch is not None:
            st.epoch = epoch if epoch >= 0 else None

    def request_reset(self, tp: TopicPartition, policy: str) -> None:
        """seek_to_beginning/end: applied lazily, at the next poll or position()."""
        st = self._state(tp)
        st.reset = policy
        st.position = st.epoch = None

    def pending_reset(self, tp: TopicPartition) -> Optional[str]:
        return self._state(tp).reset

    def missing_positions(self) -> list[TopicPartition]:
        """Partitions whose position must be found (committed offset, reset policy or a seek)."""
        return [tp for tp, st in self._parts.items() if st.position is None]

    def consumed(self) -> dict[TopicPartition, int]:
        """Every known position: what commit() commits by default."""
        return {tp: st.position for tp, st in self._parts.items() if st.position is not None}

    # -- pause -----------------------------------------------------------------------------------
    def pause(self, tp: TopicPartition) -> None:
        self._state(tp).paused = True

    def resume(self, tp: TopicPartition) -> None:
        self._state(tp).paused = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self._parts.items() if st.paused}

    def fetchable(self) -> list[TopicPartition]:
        """Assigned, not paused, with a position: what poll reads, in fetch order."""
        return [tp for tp, st in self._parts.items() if not st.paused and st.position is not None]

    def rotate(self, tp: TopicPartition) -> None:
        """Move tp to the end of the fetch order (Kafka rotates fetched partitions), so a
        partition that keeps filling max_poll_records does not starve the others."""
        st = self._parts.pop(tp, None)
        if st is not None:
            self._parts[tp] = st
