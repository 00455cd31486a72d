"""Type stubs for kstore/_format.pyx: format constants and the codec hooks."""
import enum
from typing import Callable, Optional

from typing_extensions import Self

import numpy as np

RECORD_BATCH_OVERHEAD: int
OFFSET_ENTRY_SIZE: int
TIME_ENTRY_SIZE: int
OFFSET_WARM_ENTRIES: int
TIME_WARM_ENTRIES: int
OFFSET_DTYPE: np.dtype
TIME_DTYPE: np.dtype
CODEC_NAMES: dict[int, str]

_Decompress = Callable[[int, bytes, int], bytes]
_Compress = Callable[[int, bytes, Optional[int], int], bytes]

def set_codecs(decompress: _Decompress, compress: _Compress) -> None: ...

# the base of the status enums (ScanStatus, ColumnsStatus): memberless by design
class StrStatus(str, enum.Enum):  # type: ignore[misc]
    def __new__(cls, value: str) -> Self: ...
    def __str__(self) -> str: ...
    def __format__(self, spec: str) -> str: ...
    def __hash__(self) -> int: ...
