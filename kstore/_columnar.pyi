"""Type stubs for kstore/_columnar.pyx: columnar decode."""
from typing_extensions import disjoint_base
import numpy as np

from kstore._format import StrStatus
from kstore._mapping import Mapping

class ColumnsStatus(StrStatus):
    END = "end"
    LIMIT = "limit"
    STOP = "stop"

@disjoint_base
class Columns:
    @property
    def count(self) -> int: ...
    @property
    def header_count(self) -> int: ...
    @property
    def headers(self) -> bool: ...
    @property
    def live_views(self) -> int: ...
    def __new__(cls, headers: bool = False) -> Columns: ...
    def clear(self) -> None: ...
    def arrays(self) -> dict[str, np.ndarray]: ...
    def views(self) -> dict[str, np.ndarray]: ...

def decode_columns(m: Mapping, pos: int, end: int, min_offset: int, stop_offset: int,
                   cols: Columns, max_records: int = ..., max_data: int = ...,
                   verify_crc: bool = True) -> tuple[int, int, ColumnsStatus]: ...
