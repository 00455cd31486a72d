"""Type stubs for kstore/_core.pyx: the read fast path, and every concept module's public names
(re-exported, so kstore._core.X keeps working)."""
from typing_extensions import disjoint_base
from typing import Any, Optional, Union

from kstore._column_input import ColumnInput as ColumnInput
from kstore._columnar import (Columns as Columns, ColumnsStatus as ColumnsStatus,
                              decode_columns as decode_columns)
from kstore._compact import (CleanStats as CleanStats, OffsetMap as OffsetMap,
                             TXN_ABORTED as TXN_ABORTED, TXN_KEEP_EMPTY as TXN_KEEP_EMPTY,
                             TXN_MARKER_GOES as TXN_MARKER_GOES,
                             build_offset_map as build_offset_map, filter_batches as filter_batches)
from kstore._crc import (_force_table_crc as _force_table_crc, crc32 as crc32, crc32c as crc32c,
                         crc32c_hw as crc32c_hw, crc32c_implementation as crc32c_implementation,
                         crc32c_table as crc32c_table)
from kstore._decode import (decode_batches as decode_batches,
                            set_remember_min_bytes as set_remember_min_bytes)
from kstore._encode import BatchBuilder as BatchBuilder
from kstore._format import (CODEC_NAMES as CODEC_NAMES,
                            OFFSET_DTYPE as OFFSET_DTYPE, OFFSET_ENTRY_SIZE as OFFSET_ENTRY_SIZE,
                            OFFSET_WARM_ENTRIES as OFFSET_WARM_ENTRIES,
                            RECORD_BATCH_OVERHEAD as RECORD_BATCH_OVERHEAD,
                            TIME_DTYPE as TIME_DTYPE, TIME_ENTRY_SIZE as TIME_ENTRY_SIZE,
                            TIME_WARM_ENTRIES as TIME_WARM_ENTRIES, StrStatus as StrStatus,
                            set_codecs as set_codecs)
from kstore._lines import murmur2 as murmur2, split_lines as split_lines
from kstore._mapping import (Mapping as Mapping, batch_memory as batch_memory,
                             set_batch_memory_limit as set_batch_memory_limit)
from kstore._record import (AppendInfo as AppendInfo, Record as Record, _make_record as _make_record,
                            empty_append_info as empty_append_info)
from kstore._scan import (batch_headers as batch_headers, find_batch as find_batch,
                          index_entry as index_entry,
                          offset_index_floor_slot as offset_index_floor_slot,
                          offset_index_lookup as offset_index_lookup,
                          put_offset_entry as put_offset_entry, put_time_entry as put_time_entry,
                          recover_scan as recover_scan, RecoverResult as RecoverResult,
                          ScanStatus as ScanStatus,
                          time_index_floor_slot_by_offset as time_index_floor_slot_by_offset,
                          time_index_lookup as time_index_lookup,
                          validate_batches as validate_batches,
                          pread_validate as pread_validate)
from kstore._index_copy import (IndexCopy as IndexCopy, extend_index_copy as extend_index_copy,
                                index_valid_prefix as index_valid_prefix)

def index_position(index: Optional[Mapping], entries: int, base_offset: int, offset: int,
                   m: Mapping, end: int) -> int: ...
def read_at(m: Mapping, index: Optional[Mapping], index_entries: int, base_offset: int, end: int,
            offset: int, max_records: int, max_bytes: int, verify_crc: bool, out: list[Record],
            min_one: bool = True) -> tuple[int, int, int]: ...

@disjoint_base
class IndexState:
    map: Optional[Mapping]
    entries: int

@disjoint_base
class SegmentView:
    log_map: Optional[Mapping]
    index: Optional[IndexState]
    tindex: Optional[IndexState]
    base_offset: int
    size: int
    max_ts_known: bool
    max_timestamp: int
    offset_of_max_timestamp: int
    corrupt: Optional[str]
    def __init__(self, base_offset: int) -> None: ...
    def snapshot(self) -> tuple[Optional[Mapping], int]: ...
    @property
    def is_ready(self) -> bool: ...
    def read(self, offset: int, max_records: int, max_bytes: int, verify_crc: bool,
             out: list[Record], min_one: bool = True) -> tuple[int, int, int]: ...

def log_read(bases: list[int], views: list[SegmentView], offset: int, max_records: int,
             max_bytes: int, verify_crc: bool, out: list[Record],
             used: int = 0) -> Optional[tuple[int, int, int]]: ...
def read_records(log: Any, offset: int, max_records: Optional[int] = None,
                 max_bytes: int = 1 << 20, *, verify_crc: bool = True) -> list[Record]: ...
def find_offset_by_timestamp(m: Mapping, start: int, end: int, ts: int, start_offset: int,
                             verify_crc: bool = True) -> Optional[tuple[int, int]]: ...
def log_offset_for_timestamp(views: list[SegmentView], ts: int, start_offset: int,
                             verify_crc: bool = True) -> Union[tuple[int, int], bool, None]: ...
