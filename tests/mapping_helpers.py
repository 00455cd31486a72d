"""A core Mapping over a file a test writes (tests/test_decode.py, tests/test_columnar.py):
the record tables and columnar decode are kept per mapping, so these tests need a real file's
mapping (Mapping.from_bytes has none to write through or map again)."""
from __future__ import annotations

import os

from kstore import _core


def file_mapping(tmp_path, raw: bytes, name: str = "seg.log", writable: bool = False):
    """(Mapping of tmp_path/name holding raw, writable if asked; its path). The descriptor is
    closed at once: the mapping keeps the file."""
    path = tmp_path / name
    path.write_bytes(raw)
    fd = os.open(path, os.O_RDWR)
    try:
        return _core.Mapping(fd, len(raw), writable), str(path)
    finally:
        os.close(fd)
