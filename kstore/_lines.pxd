# cython: language_level=3
"""Kafka's murmur2 for the other extension modules (kstore/_lines.pyx); inline."""
cimport cython
from libc.stdint cimport uint8_t, uint32_t

@cython.overflowcheck(False)    # zig-zag / hashing wrap on purpose
cdef inline uint32_t murmur2_hash(const uint8_t* d, Py_ssize_t length) noexcept nogil:
    """Kafka's Utils.murmur2 (seed 0x9747b28c)."""
    cdef uint32_t m = 0x5bd1e995
    cdef uint32_t h = 0x9747b28cU ^ <uint32_t>length
    cdef uint32_t k
    cdef Py_ssize_t i, n4 = length // 4
    for i in range(n4):
        k = (<uint32_t>d[4 * i]) | (<uint32_t>d[4 * i + 1] << 8) | (<uint32_t>d[4 * i + 2] << 16) | \
            (<uint32_t>d[4 * i + 3] << 24)
        k *= m
        k ^= k >> 24
        k *= m
        h *= m
        h ^= k
    i = length & 3
    if i == 3:
        h ^= <uint32_t>d[4 * n4 + 2] << 16
    if i >= 2:
        h ^= <uint32_t>d[4 * n4 + 1] << 8
    if i >= 1:
        h ^= d[4 * n4]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return h

