"""The consumer API's small public types, as Kafka's clients name them: `ConsumerRecord` (what
iterating a consumer yields), `OffsetAndTimestamp` (offsets_for_times' answer) and
`ConsumerRebalanceListener` (called when the group changes a consumer's partitions)."""
from __future__ import annotations

from typing import NamedTuple, Optional

from kstore.errors import InvalidConfigError
from kstore.topic_partition import TopicPartition

__all__ = ["ConsumerRecord", "OffsetAndTimestamp", "ConsumerRebalanceListener", "check_settings"]

ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def check_settings(isolation_level: str, max_poll_records: int, group_id: Optional[str],
                   max_poll_interval_ms: int) -> None:
    """A Consumer's settings checked before anything is opened (InvalidConfigError naming it)."""
    if isolation_level not in ISOLATION_LEVELS:
        raise InvalidConfigError(
            f"isolation_level must be one of {ISOLATION_LEVELS}, not {isolation_level!r}")
    if not isinstance(max_poll_records, int) or max_poll_records < 1:
        raise InvalidConfigError(f"max_poll_records must be a positive int, not {max_poll_records!r}")
    if group_id is not None and (not isinstance(group_id, str) or not group_id):
        raise InvalidConfigError(f"group_id must be a non-empty string, not {group_id!r}")
    if type(max_poll_interval_ms) is not int or max_poll_interval_ms < 1:
        raise InvalidConfigError(
            f"max_poll_interval_ms must be a positive int, not {max_poll_interval_ms!r}")


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
