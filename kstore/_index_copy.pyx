# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""A read-only view's private copies of another process's index files (segment_ro.py, index.py):
the valid prefix of entries read from an index that its writer may be appending to, and the
anonymous-memory copy those entries are kept in and extended."""
from libc.stdint cimport uint8_t, uint32_t, int32_t, int64_t
from libc.string cimport memcpy
from libc.errno cimport errno
from posix.mman cimport mmap, PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FAILED

from kstore._format cimport *
from kstore._mapping cimport Mapping

import os


cdef inline bint _entry_follows(const uint8_t* e, const uint8_t* prev, int esize,
                                int64_t log_size, int64_t last_rel) noexcept nogil:
    """Entry e may follow prev (NULL: first): the offset index's keys and positions strictly
    increasing, every position inside the validated .log (and above 0: the first entry is made
    after index.interval.bytes); the time index's timestamps (positive) and offsets
    non-decreasing; every offset in [0, last_rel]. Anything else (zeros not yet written, an entry
    ahead of the validated data, garbage) ends the valid prefix."""
    cdef int64_t k, v
    if esize == 8:
        k = ld32(e)
        v = ld32(e + 4)
        if k < 0 or k > last_rel or v <= 0 or v >= log_size:
            return False
        return prev == NULL or (k > ld32(prev) and v > ld32(prev + 4))
    k = ld64(e)
    v = ld32(e + 8)
    if k <= 0 or v < 0 or v > last_rel:
        return False
    return prev == NULL or (k >= ld64(prev) and v >= ld32(prev + 8))


cdef class IndexCopy(Mapping):
    """A read-only view's private copy of an index's valid entries: anonymous memory, read-only to
    Python (only extend_index_copy writes into it, past the count it was published with)."""


cdef IndexCopy _private_copy(Py_ssize_t capacity):
    """A new IndexCopy of capacity bytes."""
    cdef IndexCopy m = IndexCopy.__new__(IndexCopy, -1, 0, False)
    cdef void* p
    if capacity > 0:
        p = mmap(NULL, <size_t>capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
        if p == MAP_FAILED:
            e = errno
            raise OSError(e, os.strerror(e))
        m.addr = <uint8_t*>p
        m.length = capacity
    return m


def index_valid_prefix(data, int entry_size, int64_t log_size, int64_t last_rel,
                       prev=None):
    """How many leading whole entries of data (raw index entries, on-disk layout) are valid
    after the entry prev (bytes of one entry, None: data starts the index); see _entry_follows."""
    cdef const uint8_t[::1] mv = data
    cdef const uint8_t[::1] pv
    cdef Py_ssize_t n, i
    cdef const uint8_t* p
    cdef const uint8_t* last = NULL
    if entry_size != 8 and entry_size != 12:
        raise ValueError(f"entry size {entry_size}")
    n = mv.shape[0] // entry_size
    if prev is not None:
        pv = prev
        if pv.shape[0] != entry_size:
            raise ValueError("prev is not one entry")
        last = &pv[0]
    if n == 0:
        return 0
    p = &mv[0]
    with nogil:
        for i in range(n):
            if not _entry_follows(p + i * entry_size, last, entry_size, log_size, last_rel):
                break
            last = p + i * entry_size
        else:
            i = n
    return i


def extend_index_copy(IndexCopy copy, Py_ssize_t used, data, Py_ssize_t n_new):
    """A read-only view's private index copy (its entries the first `used` bytes of copy; copy
    None: none yet) extended by the first n_new bytes of data (whole entries the caller
    validated). Returns the copy to publish: copy itself when they fit its capacity (written
    past its entries, where no reader looks: a reader pairs a copy with a count published with
    it or before it), else a new one of twice the capacity. Before moving to a new copy the old
    one is filled to its capacity, so a reader that pairs it with the new, larger count (the two
    are read apart) still finds valid entries everywhere below min(count, its length); a copy
    made from scratch (copy None) has exactly the capacity of its entries, for the same reason.
    Old copies are never written below their capacity again, nor closed here."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t fit, cap
    cdef IndexCopy out
    if n_new < 0 or n_new > mv.shape[0]:
        raise ValueError(f"{n_new} bytes of {mv.shape[0]}")
    if copy is None:
        out = _private_copy(n_new)
        if n_new:
            memcpy(out.addr, &mv[0], n_new)
        return out
    if used < 0 or used > copy.length or copy.closing or (used and copy.addr == NULL):
        raise ValueError(f"{used} bytes do not fit the index copy ({copy.length} bytes)")
    if n_new == 0:
        return copy
    fit = min(n_new, copy.length - used)
    if fit > 0:
        memcpy(copy.addr + used, &mv[0], fit)
    if fit == n_new:
        return copy
    cap = max(2 * copy.length, used + n_new, 4096)
    out = _private_copy(cap)
    if used:
        memcpy(out.addr, copy.addr, used)
    memcpy(out.addr + used, &mv[0], n_new)
    return out
