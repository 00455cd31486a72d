# cython: language_level=3, boundscheck=False, wraparound=False
# cython: embedsignature=True
"""The walk a transaction scan makes over batch headers (read_committed.py: a consumer's last
stable offset and aborted transactions, the cleaner's): compiled, with one Python tuple per
transactional batch and none for the others."""
from libc.stdint cimport uint8_t, int16_t, int64_t

from kstore._format cimport *

cdef uint8_t _empty_byte = 0

cdef tuple _walk(data, bint producers):
    """The header walk both scans share: a tuple per listed batch (transactional v2 batches, or
    with producers every v2 batch with a producer id), the last offset of the last whole batch
    and what is malformed after it (None at the end of data)."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0], pos = 0
    cdef const uint8_t* p = &mv[0] if n else &_empty_byte
    cdef BatchHeader h
    cdef const char* why
    cdef int hs
    cdef int64_t last = -1, pid
    cdef list out = []
    while True:
        hs = parse_header(p, pos, n, &h, &why)
        if hs == H_END:
            return out, last, None
        if hs == H_CORRUPT:
            return out, last, f"{why.decode('ascii')} (batch at offset {ld64(p + pos)}, position {pos})"
        if h.magic == 2:
            pid = ld64(p + pos + 43)
            if producers and pid >= 0:
                out.append((h.base_offset, h.last_offset, pid, h.attrs, <int16_t>ld16(p + pos + 51),
                            h.max_timestamp, pos, pos + h.size))
            elif not producers and h.attrs & TXN_BIT:
                out.append((h.base_offset, h.last_offset, pid, h.attrs, pos, pos + h.size))
        last = h.last_offset
        pos += h.size


def txn_headers(data):
    """A transaction scan's walk (read_committed.py) over the whole batches of data (a
    read_batches view): returns (batches, last_offset, why) where batches lists (base, last,
    producer id, attributes, start, end) of each transactional v2 batch, last_offset is the last
    offset of the last whole batch (-1 if none), and why says what is malformed at the position
    after it (None when the data just ends there)."""
    return _walk(data, False)


def producer_headers(data):
    """The cleaner's walk for producer state (cleaner_txn.py): as txn_headers, listing every v2
    batch that has a producer id (idempotent or transactional) as (base, last, producer id,
    attributes, producer epoch, max timestamp, start, end)."""
    return _walk(data, True)


def last_whole_batch(data, Py_ssize_t start=0):
    """The position of the last whole, well-formed batch of data walking from start (a batch
    boundary), or -1 if none: read_committed's mark of what a scan looked at last, found in C
    (a log of many small plain batches has one header per ~100 bytes)."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0], pos = start, found = -1
    cdef const uint8_t* p = &mv[0] if n else &_empty_byte
    cdef BatchHeader h
    cdef const char* why
    if start < 0 or start > n:
        raise ValueError(f"start {start} outside the {n} bytes")
    while parse_header(p, pos, n, &h, &why) == H_OK:
        found = pos
        pos += h.size
    return found
