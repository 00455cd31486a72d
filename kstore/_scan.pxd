# cython: language_level=3
"""The index floor search for the other extension modules (kstore/_scan.pyx); inline."""
from libc.stdint cimport uint8_t, int64_t

from kstore._format cimport ld32, ld64

cdef inline Py_ssize_t floor_slot(const uint8_t* p, Py_ssize_t n, Py_ssize_t esize, int key_off,
                                   bint key64, int64_t add, int64_t target, Py_ssize_t warm) noexcept nogil:
    """Kafka's largestLowerBoundSlotFor with the warm-section optimisation (KAFKA-6432).
    key(i) = add + (int64 or int32 at p + i*esize + key_off). Returns -1 if target < key(0)."""
    cdef Py_ssize_t lo, hi, mid, first_hot
    cdef int64_t k
    if n <= 0:
        return -1
    first_hot = n - 1 - warm
    if first_hot < 0:
        first_hot = 0
    k = add + (ld64(p + first_hot * esize + key_off) if key64 else ld32(p + first_hot * esize + key_off))
    if k < target:
        lo = first_hot
        hi = n - 1
    else:
        k = add + (ld64(p + key_off) if key64 else ld32(p + key_off))
        if k > target:
            return -1
        lo = 0
        hi = first_hot
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        k = add + (ld64(p + mid * esize + key_off) if key64 else ld32(p + mid * esize + key_off))
        if k > target:
            hi = mid - 1
        elif k < target:
            lo = mid
        else:
            return mid
    return lo

