"""Producer-style appends by topic: Kafka's default partitioner over a topic's partitions
(murmur2 of the key, round robin without one), a missing topic auto-created as a broker does,
and every append guarded so that an I/O error takes its log dir offline.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Any, Callable, Iterable, NamedTuple, Optional

from kstore.errors import KStoreStateError, UnknownPartitionCountError, UnknownTopicError
from kstore.log_dir_failure import LogDirFailureChannel
from kstore.log_registry import LogRegistry
from kstore.partitioner import partition_for_key


class RecordMetadata(NamedTuple):
    """Where a producer-style append landed."""
    topic: str
    partition: int
    offset: int
    timestamp: int


class Producer:
    """The appends by topic of one LogManager. Lock-free: it reads the published registry (the
    registry lock only to auto-create a topic). The caller checks that the store is writable."""

    def __init__(self, registry: LogRegistry, failures: LogDirFailureChannel, *,
                 auto_create: bool, create_topic: Callable[[str], None],
                 partition_count: Callable[[str], Optional[int]]):
        self._reg = registry
        self._count = partition_count            # the topic's count if the store knows it
        self._guard = failures.guard
        self._auto_create = auto_create          # auto.create.topics.enable
        # with num.partitions; a bound method (LogManager.create_topic, whose manager holds this
        # producer) held weakly: no reference cycle (the manager outlives every call)
        self._create_topic = weakref.WeakMethod(create_topic)
        self._rr = itertools.count()

    def append(self, topic: str, key: Optional[bytes], value: Optional[bytes], *,
               partition: Optional[int] = None, timestamp: Optional[int] = None,
               headers: Optional[Iterable] = None) -> RecordMetadata:
        """Append one record (LogManager.append)."""
        parts = self.partitions(topic)
        n = self._count(topic)
        if partition is None:
            if key is not None:
                partition = partition_for_key(bytes(key), self.count(topic, parts))
            elif len(parts) == n and not self._reg.failed:
                partition = next(self._rr) % n
            else:       # holes, isolated partitions, count unknown: round robin over those here
                logs = self._reg.logs
                here = [p for p in parts if (topic, p) in logs] or list(parts)
                partition = here[next(self._rr) % len(here)]
        else:
            self.check_partition(topic, partition, n)
        lg, d = self._reg.log_and_dir(topic, partition)
        info = self._guard(d, lg.append, [(key, value, timestamp, headers)])
        ts = info.log_append_time if info.log_append_time >= 0 else info.max_timestamp
        return RecordMetadata(topic, partition, info.first_offset, ts)

    def append_batch(self, topic: str, partition: int, records: Iterable) -> Any:
        """Append records to one partition as one batch (LogManager.append_batch)."""
        self.partitions(topic)
        self.check_partition(topic, partition, self._count(topic))
        lg, d = self._reg.log_and_dir(topic, partition)
        return self._guard(d, lg.append, records)

    def append_columns(self, topic: str, partition: int, cols: Any, start: int = 0,
                       stop: Optional[int] = None, *, batch_bytes: int = 1 << 20) -> tuple[int, int]:
        """Append rows of columnar input to one partition (LogManager.append_columns)."""
        self.partitions(topic)
        self.check_partition(topic, partition, self._count(topic))
        lg, d = self._reg.log_and_dir(topic, partition)
        return self._guard(d, lg.append_columns, cols, start, stop, batch_bytes=batch_bytes)

    def count(self, topic: str, parts: tuple[int, ...]) -> int:
        """The topic's partition count, which keyed appends need (murmur2 of the key modulo
        it, as Kafka's partitioner); UnknownPartitionCountError when the store does not know it
        (its log dirs hold some partitions of a broker's topic)."""
        n = self._count(topic)
        if n is None:
            raise UnknownPartitionCountError(
                f"the partition count of topic {topic!r} is unknown: this store holds its "
                f"partitions {list(parts)} (a broker's log dirs hold some of a topic's "
                f"partitions), and a key is mapped to a partition by the count; give the "
                f"partition, or the count with LogManager.set_partition_count({topic!r}, n)")
        return n

    def ensure(self, topic: str, partition: Optional[int]) -> int:
        """LogManager.ensure_topic: the count (auto-creating the topic); with a partition, a
        count that covers it (the count, else the highest partition + 1) once it is found here."""
        parts = self.partitions(topic)
        if partition is None:
            return self.count(topic, parts)
        n = self._count(topic)
        self.check_partition(topic, partition, n)
        self._reg.log_and_dir(topic, partition)
        return n if n is not None else parts[-1] + 1

    def check_partition(self, topic: str, partition: int, n: Optional[int]) -> None:
        """UnknownTopicError for a partition number beyond a known count (one within it, or
        any with the count unknown, is looked up: a kstore error if it is not here)."""
        if n is not None and not 0 <= partition < n:
            raise UnknownTopicError(f"partition {partition} of {topic!r} does not exist ({n} partitions)")

    def partitions(self, topic: str) -> tuple[int, ...]:
        """The topic's partitions (lock-free), auto-creating the topic first when it is missing
        and auto-creation is on."""
        parts = self._reg.parts.get(topic)
        if parts is None:
            if not self._auto_create:
                raise UnknownTopicError(f"unknown topic {topic!r} (auto.create.topics.enable=false)")
            with self._reg.lock:
                if topic not in self._reg.parts:
                    create = self._create_topic()
                    if create is None:
                        raise KStoreStateError("the producer's LogManager is gone")
                    create(topic)
                parts = self._reg.parts[topic]
        return parts
