"""The benchmarks' standard records: 16-byte keys, 100-byte values and rising timestamps, shared
by `kstore bench` and `kstore bench --spark` so both measure the same bytes."""
from __future__ import annotations

KEY_SIZE = 16
VALUE_SIZE = 100
BASE_TS = 1_700_000_000_000
VALUE = bytes(range(VALUE_SIZE))


def key(i: int) -> bytes:
    """The key of record i: its index, 8 bytes big-endian, twice (KEY_SIZE bytes)."""
    return i.to_bytes(8, "big") * 2
