"""The consumer API's small public types, as Kafka's clients name them: `ConsumerRecord` (what
iterating a consumer yields), `OffsetAndTimestamp` (offsets_for_times' answer) and
`ConsumerRebalanceListener` (called when the group changes a consumer's partitions)."""
from __future__ import annotations

from typing import NamedTuple, Optional

from kstore.topic_partition import TopicPartition

__all__ = ["ConsumerRecord", "OffsetAndTimestamp", "ConsumerRebalanceListener"]


class OffsetAndTimestamp(NamedTuple):
    """offsets_for_times' answer for one partition (Kafka's OffsetAndTimestamp)."""
    offset: int
    timestamp: int


class ConsumerRecord(NamedTuple):
    """What iterating a consumer yields: a record with its topic and partition (kafka-python's
    ConsumerRecord fields; poll returns the plain Records grouped by partition instead)."""
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int
    key: Optional[bytes]
    value: Optional[bytes]
    headers: tuple


class ConsumerRebalanceListener:
    """Called inside poll when the group changes what this consumer reads (Kafka's
    ConsumerRebalanceListener): on_partitions_revoked before it gives partitions up (after
    the auto-commit of their positions: commit there yourself otherwise), then
    on_partitions_assigned with the partitions it now owns (their positions come from the
    committed offsets; seek there to start elsewhere). Sets are incremental, as Kafka's
    cooperative protocol. on_partitions_lost: partitions taken away without a chance to commit
    (the consumer was evicted: max_poll_interval_ms passed between polls); by default it calls
    on_partitions_revoked, as Kafka's default onPartitionsLost."""

    def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        pass

    def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        pass

    def on_partitions_lost(self, lost: set[TopicPartition]) -> None:
        """Partitions other members may already own: committing them fails (CommitFailedError)."""
        self.on_partitions_revoked(lost)
