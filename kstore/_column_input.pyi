"""Type stubs for kstore/_column_input.pyx: columnar append input."""
from typing_extensions import disjoint_base
from typing import Any, Optional

import numpy as np

@disjoint_base
class ColumnInput:
    @property
    def n(self) -> int: ...
    def __init__(self, n: int, key: Optional[tuple[Any, ...]] = None,
                 value: Optional[tuple[Any, ...]] = None, timestamps: Any = None,
                 headers: Optional[tuple[Any, ...]] = None) -> None: ...
    def rows(self, start: int, stop: int) -> list[tuple[Optional[bytes], Optional[bytes],
                                                       Optional[int],
                                                       Optional[list[tuple[str, Optional[bytes]]]]]]: ...
    def sizes(self) -> np.ndarray: ...
    def key_hashes(self) -> np.ndarray: ...
