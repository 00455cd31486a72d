"""Producer-style appends by topic: Kafka's default partitioner over a topic's partitions
(murmur2 of the key, round robin without one), a missing topic auto-created as a broker does,
and every append guarded so that an I/O error takes its log dir offline.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, NamedTuple, Optional

from kstore.errors import UnknownTopicError
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
                 auto_create: bool, create_topic: Callable[[str], None]):
        self._reg = registry
        self._guard = failures.guard
        self._auto_create = auto_create          # auto.create.topics.enable
        self._create_topic = create_topic        # with num.partitions
        self._rr = itertools.count()

    def append(self, topic: str, key: Optional[bytes], value: Optional[bytes], *,
               partition: Optional[int] = None, timestamp: Optional[int] = None,
               headers: Optional[Iterable] = None) -> RecordMetadata:
        """Append one record (LogManager.append)."""
        parts = self.partitions(topic)
        n = parts[-1] + 1
        if partition is None:
            if key is not None:
                partition = partition_for_key(bytes(key), n)
            elif len(parts) == n and not self._reg.failed:
                partition = next(self._rr) % n
            else:       # holes or isolated partitions: round robin over those that work
                logs = self._reg.logs
                here = [p for p in parts if (topic, p) in logs] or parts
                partition = here[next(self._rr) % len(here)]
        elif not 0 <= partition < n:
            raise UnknownTopicError(f"partition {partition} of {topic!r} does not exist ({n} partitions)")
        lg, d = self._reg.log_and_dir(topic, partition)
        info = self._guard(d, lg.append, [(key, value, timestamp, headers)])
        ts = info.log_append_time if info.log_append_time >= 0 else info.max_timestamp
        return RecordMetadata(topic, partition, info.first_offset, ts)

    def append_batch(self, topic: str, partition: int, records: Iterable) -> Any:
        """Append records to one partition as one batch (LogManager.append_batch)."""
        n = self.partitions(topic)[-1] + 1
        if not 0 <= partition < n:
            raise UnknownTopicError(f"partition {partition} of {topic!r} does not exist ({n} partitions)")
        lg, d = self._reg.log_and_dir(topic, partition)
        return self._guard(d, lg.append, records)

    def append_columns(self, topic: str, partition: int, cols: Any, start: int = 0,
                       stop: Optional[int] = None, *, batch_bytes: int = 1 << 20) -> tuple[int, int]:
        """Append rows of columnar input to one partition (LogManager.append_columns)."""
        n = self.partitions(topic)[-1] + 1
        if not 0 <= partition < n:
            raise UnknownTopicError(f"partition {partition} of {topic!r} does not exist ({n} partitions)")
        lg, d = self._reg.log_and_dir(topic, partition)
        return self._guard(d, lg.append_columns, cols, start, stop, batch_bytes=batch_bytes)

    def partitions(self, topic: str) -> tuple[int, ...]:
        """The topic's partitions (lock-free), auto-creating the topic first when it is missing
        and auto-creation is on."""
        parts = self._reg.parts.get(topic)
        if parts is None:
            if not self._auto_create:
                raise UnknownTopicError(f"unknown topic {topic!r} (auto.create.topics.enable=false)")
            with self._reg.lock:
                if topic not in self._reg.parts:
                    self._create_topic(topic)
                parts = self._reg.parts[topic]
        return parts
