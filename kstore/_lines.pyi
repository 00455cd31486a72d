"""Type stubs for kstore/_lines.pyx: split_lines and murmur2."""
from typing import Any, Optional, Union

import numpy as np

_Buffer = Union[bytes, bytearray, memoryview]
# (offsets int32[n+1], data uint8, validity None): ColumnInput's form of one column
_Column = tuple[np.ndarray, np.ndarray, None]

def murmur2(data: _Buffer) -> int: ...
def split_lines(data: _Buffer, sep: Optional[bytes], n_parts: int, partition: int, sticky: int,
                final: bool) -> tuple[int, int, list[Optional[tuple[int, Optional[_Column], _Column]]],
                                      Any]: ...   # last: -1, or the bad line's (start, end)
