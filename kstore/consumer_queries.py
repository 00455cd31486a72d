"""A Consumer's questions about the store rather than its own reading: the topics and their
partitions (Kafka's listTopics, partitionsFor) and the offsets at the log ends or at a time
(beginningOffsets, endOffsets, offsetsForTimes). A mixin of `Consumer`: they use only its
LogSource and Fetcher, and move nothing (positions, commits, the group)."""
from __future__ import annotations

from typing import Iterable, Mapping, Optional

from kstore.consumer_types import OffsetAndTimestamp
from kstore.fetcher import Fetcher, LogSource
from kstore.topic_partition import TopicPartition

__all__ = ["ConsumerQueries"]


class ConsumerQueries:
    """Consumer's metadata and offset queries (the consumer sets _source and _fetcher)."""

    _source: LogSource
    _fetcher: Fetcher

    def topics(self) -> set[str]:
        """The store's topics, looked up now."""
        self._source.rescan(force=True)
        return set(self._source.topics())

    def partitions_for_topic(self, topic: str) -> Optional[set[int]]:
        """The topic's partition numbers, looked up now (None for a topic not in the store)."""
        self._source.rescan(force=True)
        ps = self._source.partitions(topic)
        return set(ps) if ps else None

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Log start offsets."""
        return {TopicPartition(*tp): self._fetcher.offset_for_policy(TopicPartition(*tp), "earliest")
                for tp in partitions}

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Log ends (the last stable offsets under read_committed)."""
        return {TopicPartition(*tp): self._fetcher.end_offset(TopicPartition(*tp)) for tp in partitions}

    def offsets_for_times(self, timestamps: Mapping[TopicPartition, int]
                          ) -> dict[TopicPartition, Optional[OffsetAndTimestamp]]:
        """For each partition the earliest offset whose timestamp is >= the one given, with
        that record's timestamp; None where there is none (Kafka's offsetsForTimes)."""
        return self._fetcher.offsets_for_times(timestamps)
