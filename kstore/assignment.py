"""Replica assignment (Kafka's AdminUtils.assignReplicasToBrokers, rack-unaware)."""
from __future__ import annotations

import random
from typing import Optional, Sequence

from kstore.errors import InvalidConfigError


def assign_replicas(num_partitions: int, brokers: Sequence[int] | int, replication_factor: int, *,
                    start_index: Optional[int] = None, shift: Optional[int] = None) -> dict[int, list[int]]:
    """{partition: [leader, followers...]} for brokers (ids, or a count meaning 0..n-1).

    start_index and shift default to independent random draws, as Kafka's; with both 0 the first
    n partitions get the seed's layout (partition i on broker i mod n, replica j on (i+j) mod n),
    and the shift grows by one every n partitions so follower sets do not repeat.
    """
    ids = list(range(brokers)) if isinstance(brokers, int) else list(brokers)
    n = len(ids)
    if num_partitions <= 0:
        raise InvalidConfigError(f"Invalid value {num_partitions} for num_partitions: must be at least 1")
    if replication_factor <= 0:
        raise InvalidConfigError(f"Invalid value {replication_factor} for replication_factor: must be at least 1")
    if replication_factor > n:
        raise InvalidConfigError(
            f"Replication factor: {replication_factor} larger than available brokers: {n}.")
    start = random.randrange(n) if start_index is None else start_index
    next_shift = random.randrange(n) if shift is None else shift
    out: dict[int, list[int]] = {}
    current = 0
    for p in range(num_partitions):
        if current > 0 and current % n == 0:
            next_shift += 1
        first = (current + start) % n
        replicas = [ids[first]]
        for j in range(replication_factor - 1):
            replicas.append(ids[(first + 1 + (next_shift + j) % (n - 1)) % n])
        out[p] = replicas
        current += 1
    return out
