"""Type stubs for kstore/_decode.pyx: record decoding."""
from typing import Union

from kstore._record import Record

_Buffer = Union[bytes, bytearray, memoryview]

def decode_batches(data: _Buffer, min_offset: int = -1, verify_crc: bool = True,
                   include_control: bool = False) -> list[Record]: ...
def set_remember_min_bytes(n: int) -> int: ...
