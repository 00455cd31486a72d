"""Type stubs for kstore/_txn_scan.pyx: the header walk of transaction scans."""
from typing import Optional, Union

_Buffer = Union[bytes, bytearray, memoryview]

def txn_headers(data: _Buffer) -> tuple[list[tuple[int, int, int, int, int, int]], int, Optional[str]]: ...
def producer_headers(data: _Buffer) -> tuple[list[tuple[int, int, int, int, int, int, int, int]], int,
                                             Optional[str]]: ...
