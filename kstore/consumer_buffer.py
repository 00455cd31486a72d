"""The records a consumer's iteration fetched ahead (kafka-python's iterator over a poll's
records): entries [partition, records, index of the next record to yield], oldest first.

A deque, so `Consumer.__next__` takes each record with C-level indexing and popleft; the
methods here serve iteration (fill), poll (drain), position and commit (held) and
revocations (drop)."""
from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterable, Optional

from kstore._core import Record
from kstore.consumer_access import CLOSED
from kstore.notify import SLICE_S
from kstore.topic_partition import TopicPartition

__all__ = ["RecordBuffer"]


class RecordBuffer(deque[list]):
    """Read-ahead records of one consumer (used by its one thread: no lock)."""

    def fill(self, poll: Callable[..., dict], timeout: Optional[float],
             closed: Callable[[], bool] = lambda: False) -> None:
        """Poll (in SLICE_S waits) until records arrive; StopIteration after timeout seconds
        (consumer_timeout_ms) without one, never if timeout is None, or once closed()."""
        start = time.monotonic()
        while not self:
            if closed():
                raise StopIteration(CLOSED)
            left = SLICE_S
            if timeout is not None:
                left = timeout - (time.monotonic() - start)
            got = poll(timeout_ms=max(0.0, min(left, SLICE_S)) * 1000)
            if not got and left <= 0:
                raise StopIteration          # consumer_timeout_ms without a record
            self.extend([tp, recs, 0] for tp, recs in got.items())

    def held(self) -> dict[TopicPartition, int]:
        """The first record not yet yielded of each partition read ahead (its position as far
        as the user is concerned)."""
        return {e[0]: e[1][e[2]].offset for e in self if e[2] < len(e[1])}

    def drop(self, tps: Iterable[TopicPartition]) -> None:
        """Forget the records of these partitions (revoked, lost, sought, paused), in place."""
        drop = set(tps)
        if self and drop:
            kept = [e for e in self if e[0] not in drop]
            self.clear()
            self.extend(kept)

    def drain(self, limit: int) -> dict[TopicPartition, list[Record]]:
        """Up to limit records, oldest first, grouped by partition (a poll while read ahead)."""
        out: dict[TopicPartition, list[Record]] = {}
        while self and limit > 0:
            tp, recs, i = self[0]
            take = recs[i:i + limit]
            if take:
                out.setdefault(tp, []).extend(take)
            limit -= len(take)
            if i + len(take) == len(recs):
                self.popleft()
            else:
                self[0][2] = i + len(take)
        return out
