"""Type stubs for kstore/_compact.pyx: the dedupe map and batch filtering."""
from typing_extensions import disjoint_base
from typing import Union

from kstore._mapping import Mapping

_Buffer = Union[bytes, bytearray, memoryview]

@disjoint_base
class OffsetMap:
    @property
    def slots(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def latest_offset(self) -> int: ...
    @property
    def lookups(self) -> int: ...
    @property
    def probes(self) -> int: ...
    def __init__(self, memory: int, load_factor: float = 0.9) -> None: ...
    def clear(self) -> None: ...
    def put(self, key: _Buffer, offset: int) -> None: ...
    def get(self, key: _Buffer) -> int: ...
    @property
    def full(self) -> bool: ...

TXN_ABORTED: int
TXN_MARKER_GOES: int
TXN_KEEP_EMPTY: int

def build_offset_map(m: Mapping, start: int, end: int, first_dirty: int,
                     omap: OffsetMap, txn: dict[int, int] | None = None,
                     next_offset: int = -1) -> tuple[int, bool]: ...

@disjoint_base
class CleanStats:
    records_read: int
    records_kept: int
    bytes_read: int
    bytes_written: int
    batches_copied: int
    batches_rebuilt: int
    batches_dropped: int
    tombstones_kept: int
    max_timestamp: int
    offset_of_max_timestamp: int
    last_offset: int
    def __init__(self) -> None: ...

def filter_batches(m: Mapping, start: int, end: int, omap: OffsetMap, now: int,
                   delete_retention_ms: int, legacy_retain_deletes: bool, final_offset: int,
                   max_out: int, stats: CleanStats,
                   txn: dict[int, int] | None = None) -> tuple[int, bytes]: ...
