"""Type stubs for kstore/_index_copy.pyx: a read-only view's private index copies."""
from typing import Union

from kstore._mapping import Mapping

_Buffer = Union[bytes, bytearray, memoryview]

class IndexCopy(Mapping): ...

def index_valid_prefix(data: _Buffer, entry_size: int, log_size: int, last_rel: int,
                       prev: _Buffer | None = None) -> int: ...
def extend_index_copy(copy: IndexCopy | None, used: int, data: _Buffer, n_new: int) -> IndexCopy: ...
