"""`TopicPartition`: a (topic, partition) pair, as Kafka's clients name it.

A NamedTuple, so it equals and hashes as the plain `(topic, partition)` tuples the engine keys
its maps by; the consumer API returns and accepts it (kafka-python's `TopicPartition`).
"""
from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """One partition of a topic; `str()` is the partition directory's name (`topic-N`)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"
