# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Kafka's record format: the Python-level constants, and the non-inline parts of _format.pxd
(the corruption error, the CRC requirement and the codec hooks kstore.compression installs)."""
from libc.stdint cimport uint8_t, uint32_t

import enum

import numpy as np

from kstore.errors import CorruptRecordError, UnsupportedCodecError

# Kafka: LOG_OVERHEAD, RECORD_BATCH_OVERHEAD; index entry sizes and warm sections (KAFKA-6432)
RECORD_BATCH_OVERHEAD = V2_OVERHEAD
OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
OFFSET_WARM_ENTRIES = 8192 // 8
TIME_WARM_ENTRIES = 8192 // 12
# the on-disk layout of .index and .timeindex entries
OFFSET_DTYPE = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
TIME_DTYPE = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])



class StrStatus(str, enum.Enum):
    """Base of the core's status enums: each member is also its value string (equal to it,
    hashed and formatted as it), so callers written against the former plain strings work."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)

    def __hash__(self) -> int:
        return str.__hash__(self)


# attribute bits
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# Python-level codec hooks, installed by kstore.compression at import.
_decompress = None
_compress = None


def set_codecs(decompress, compress) -> None:
    """Install the codecs: decompress(codec, data, magic) -> bytes and
    compress(codec, data, level, magic) -> bytes (kstore.compression does this at import)."""
    global _decompress, _compress
    _decompress = decompress
    _compress = compress



cdef object compress(int codec, object data, object level, int magic):
    if _compress is None:
        raise UnsupportedCodecError("no codecs registered")
    return _compress(codec, data, level, magic)


cdef object decompress(int codec, object data, int magic):
    if _decompress is None:
        raise UnsupportedCodecError("no codecs registered")
    return _decompress(codec, data, magic)


cdef object corrupt(str msg, Py_ssize_t position):
    e = CorruptRecordError(msg)
    e.position = position
    return e


cdef int require_crc(const uint8_t* p, Py_ssize_t pos, BatchHeader* h) except -1:
    cdef uint32_t s, c
    if not crc_ok(p, pos, h, &s, &c):
        raise corrupt(f"CRC mismatch (stored {s:#010x}, computed {c:#010x})", pos)
    return 0
