"""A Consumer's questions about the store rather than its own reading: the topics and their
partitions (Kafka's listTopics, partitionsFor) and the offsets at the log ends or at a time
(beginningOffsets, endOffsets, offsetsForTimes). A mixin of `Consumer`: they use only its
LogSource, Fetcher and Wakeup, and move nothing (positions, commits, the group).

A partition on an offline log dir is Kafka's retriable KAFKA_STORAGE_ERROR: the offset queries
retry it every RETRY_BACKOFF_S until their timeout (default_api_timeout_ms), then raise
ApiTimeoutError; wakeup() ends the wait (WakeupError), as it ends a poll's, and a close() from
another thread too (KStoreStateError)."""
from __future__ import annotations

import time
from typing import Callable, Iterable, Mapping, Optional, TypeVar

from kstore.consumer_types import OffsetAndTimestamp
from kstore.consumer_wakeup import Wakeup
from kstore.errors import (ApiTimeoutError, CoordinatorNotAvailableError, InvalidConfigError,
                           LogDirOfflineError)
from kstore.fetcher import Fetcher, LogSource
from kstore.topic_partition import TopicPartition

__all__ = ["ConsumerQueries", "DEFAULT_API_TIMEOUT_MS", "RETRY_BACKOFF_S", "RETRIABLE", "retrying"]

#: Kafka's default.api.timeout.ms: how long an offset query retries a retriable error
DEFAULT_API_TIMEOUT_MS = 60000
#: between attempts (Kafka's retry.backoff.ms, 100 ms)
RETRY_BACKOFF_S = 0.1
#: the errors a Consumer call bounded by default_api_timeout_ms retries
RETRIABLE = (LogDirOfflineError, CoordinatorNotAvailableError)

A = TypeVar("A")
V = TypeVar("V")


class ConsumerQueries:
    """Consumer's metadata and offset queries (the consumer sets _source, _fetcher, _wake and
    default_api_timeout_ms)."""

    _source: LogSource
    _fetcher: Fetcher
    _wake: Wakeup
    default_api_timeout_ms: float

    def topics(self) -> set[str]:
        """The store's topics, looked up now."""
        self._source.rescan(force=True)
        return set(self._source.topics())

    def partitions_for_topic(self, topic: str) -> Optional[set[int]]:
        """The topic's partition numbers, looked up now (None for a topic not in the store)."""
        self._source.rescan(force=True)
        ps = self._source.partitions(topic)
        return set(ps) if ps else None

    def beginning_offsets(self, partitions: Iterable[TopicPartition],
                          timeout_ms: Optional[float] = None) -> dict[TopicPartition, int]:
        """Log start offsets (ApiTimeoutError if one stays offline past timeout_ms)."""
        return self._retrying({TopicPartition(*tp): None for tp in partitions}, timeout_ms,
                              lambda tp, _v: self._fetcher.offset_for_policy(tp, "earliest"))

    def end_offsets(self, partitions: Iterable[TopicPartition],
                    timeout_ms: Optional[float] = None) -> dict[TopicPartition, int]:
        """Log ends (the last stable offsets under read_committed); ApiTimeoutError as above."""
        return self._retrying({TopicPartition(*tp): None for tp in partitions}, timeout_ms,
                              lambda tp, _v: self._fetcher.end_offset(tp))

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int],
                          timeout_ms: Optional[float] = None
                          ) -> dict[TopicPartition, Optional[OffsetAndTimestamp]]:
        """For each partition the earliest offset whose timestamp is >= the one given, with
        that record's timestamp; None where there is none (Kafka's offsetsForTimes)."""
        return self._retrying({TopicPartition(*tp): ts for tp, ts in timestamps.items()},
                              timeout_ms, lambda tp, ts: self._fetcher.offsets_for_times({tp: ts})[tp])

    def _retrying(self, args: Mapping[TopicPartition, A], timeout_ms: Optional[float],
                  query: Callable[[TopicPartition, A], V]) -> dict[TopicPartition, V]:
        """query(tp, arg) for each partition; those on an offline dir are asked again as
        `retrying` says (Kafka's fetchOffsetsByTimes: "Failed to get offsets by times in Nms")."""
        out: dict[TopicPartition, V] = {}

        def attempt() -> dict[TopicPartition, V]:
            offline: dict[TopicPartition, str] = {}
            for tp, arg in args.items():
                if tp not in out:
                    try:
                        out[tp] = query(tp, arg)
                    except LogDirOfflineError as e:
                        offline[tp] = str(e)
            if offline:
                raise LogDirOfflineError("; ".join(f"{tp}: {e}" for tp, e in offline.items()))
            return {tp: out[tp] for tp in args}
        return retrying(self._wake, self.default_api_timeout_ms if timeout_ms is None else timeout_ms,
                        attempt, lambda ms, why: f"Failed to get offsets by times in {ms:.0f}ms: {why}")


def retrying(wake: Wakeup, timeout_ms: float, attempt: Callable[[], V],
             message: Callable[[float, str], str]) -> V:
    """attempt() until it returns. A retriable error (RETRIABLE: Kafka's KAFKA_STORAGE_ERROR,
    COORDINATOR_NOT_AVAILABLE) is tried again every RETRY_BACKOFF_S, sleeping on the wakeup bell,
    until timeout_ms has passed: then ApiTimeoutError(message(elapsed ms, the last error)).
    wakeup() ends the wait (WakeupError), a close() from another thread too (KStoreStateError)."""
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not timeout_ms >= 0:
        raise InvalidConfigError(f"timeout_ms must be a number >= 0, not {timeout_ms!r}")
    start = time.monotonic()
    while True:
        wake.check()
        try:
            return attempt()
        except RETRIABLE as e:
            why = str(e)
        now = time.monotonic()
        left = start + timeout_ms / 1000 - now
        if left <= 0:
            raise ApiTimeoutError(message((now - start) * 1000, why))
        armed = wake.bell.arm()
        wake.check_wait()                # a close() from another thread ends it too
        wake.bell.sleep(armed, min(RETRY_BACKOFF_S, left))
        wake.check_wait()
