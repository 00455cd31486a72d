"""Kafka's default partitioner: murmur2 of the key, made positive, modulo the partition count
(clients' Utils.murmur2 and Utils.toPositive), so a key lands where a Kafka client sends it."""
from __future__ import annotations

M = 0x5BD1E995
MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c) as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & MASK
    n4 = length // 4
    for i in range(n4):
        k = int.from_bytes(data[4 * i: 4 * i + 4], "little")
        k = (k * M) & MASK
        k ^= k >> 24
        k = (k * M) & MASK
        h = (h * M) & MASK
        h ^= k
    rem = length & 3
    tail = 4 * n4
    if rem == 3:
        h ^= data[tail + 2] << 16
    if rem >= 2:
        h ^= data[tail + 1] << 8
    if rem >= 1:
        h ^= data[tail]
        h = (h * M) & MASK
    h ^= h >> 13
    h = (h * M) & MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(n: int) -> int:
    return n & 0x7FFFFFFF


def partition_for_key(key: bytes, num_partitions: int) -> int:
    return to_positive(murmur2(key)) % num_partitions
