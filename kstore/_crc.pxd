# cython: language_level=3
"""CRC-32C and CRC-32 for the other extension modules (kstore/_crc.pyx owns the tables)."""
from libc.stdint cimport uint8_t, uint32_t

# Finalized CRC of p[0:n) chained from crc, like zlib.crc32(data, crc); no GIL needed.
cdef uint32_t crc32c_update(uint32_t crc, const uint8_t* p, size_t n) noexcept nogil
cdef uint32_t crc32_update(uint32_t crc, const uint8_t* p, size_t n) noexcept nogil
