# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Scans over a segment's bytes that stop at batch headers: validation, the recovery scan
(Kafka's LogSegment.recover) that also computes both indexes, header listings, and the
offset / time index floor searches and entry writes."""
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int32_t, int64_t
from libc.string cimport memcpy
from libc.stdlib cimport malloc, realloc, free
from libc.errno cimport errno, EINTR
from posix.unistd cimport pread
from posix.mman cimport mmap, PROT_READ, PROT_WRITE, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FAILED

from kstore._format cimport *
from kstore._mapping cimport Mapping

import os
import _thread

import numpy as np

from kstore._format import OFFSET_DTYPE as _OFFSET_DTYPE, TIME_DTYPE as _TIME_DTYPE
from kstore._format import StrStatus as _StrStatus

cdef uint8_t _empty_byte = 0


class ScanStatus(_StrStatus):
    """Where recover_scan stopped: at the end of the valid batches (END: the data ends, or what
    follows is no whole batch), or at an invalid batch and why."""
    END = "end"
    CORRUPT = "corrupt"               # malformed header or record lengths
    CRC = "crc"                       # stored CRC does not match
    OFFSET_ORDER = "offset_order"     # offsets do not follow the previous batch's
    OVERFLOW = "overflow"             # more than 2^31-1 above the segment's base offset
    BELOW_BASE = "below_base"         # below the segment's base offset
    PAST_NEXT = "past_next"           # at or past the next segment's base offset


_STATUS = {R_END: ScanStatus.END, R_CORRUPT: ScanStatus.CORRUPT, R_CRC: ScanStatus.CRC,
           R_OFFSET_ORDER: ScanStatus.OFFSET_ORDER, R_OVERFLOW: ScanStatus.OVERFLOW,
           R_BELOW_BASE: ScanStatus.BELOW_BASE, R_PAST_NEXT: ScanStatus.PAST_NEXT}


class RecoverResult(dict):
    """recover_scan's result. A dict (its callers read and extend it by key, as they did the plain
    dict it replaces) whose fields are also typed attributes: valid_bytes, next_offset (-1 if no
    batch), max_timestamp, offset_of_max_timestamp, first_batch_timestamp, batches,
    offset_entries / time_entries (big-endian structured arrays in the on-disk layout), status
    (a ScanStatus), reason (text), tail_zero and epochs."""

    @property
    def valid_bytes(self) -> int:
        return self["valid_bytes"]

    @property
    def next_offset(self) -> int:
        return self["next_offset"]

    @property
    def max_timestamp(self) -> int:
        return self["max_timestamp"]

    @property
    def offset_of_max_timestamp(self) -> int:
        return self["offset_of_max_timestamp"]

    @property
    def first_batch_timestamp(self) -> int:
        return self["first_batch_timestamp"]

    @property
    def batches(self) -> int:
        return self["batches"]

    @property
    def offset_entries(self):
        return self["offset_entries"]

    @property
    def time_entries(self):
        return self["time_entries"]

    @property
    def status(self) -> ScanStatus:
        return self["status"]

    @property
    def reason(self) -> str:
        return self["reason"]

    @property
    def tail_zero(self) -> bool:
        return self["tail_zero"]

    @property
    def epochs(self) -> list:
        return self["epochs"]


cdef struct _Run:
    Py_ssize_t valid
    int64_t last
    int64_t max_ts
    int64_t off_max
    bint complete


cdef void _validate_run(const uint8_t* p, Py_ssize_t n, int64_t base_offset, int64_t prev_last,
                        bint verify_crc, _Run* out) noexcept nogil:
    """validate_batches over n bytes at p (no Python objects: run without the GIL)."""
    cdef Py_ssize_t pos = 0
    cdef BatchHeader h
    cdef const char* why
    cdef int status
    cdef uint32_t s, c
    out.last, out.max_ts, out.off_max, out.complete = prev_last, NO_TIMESTAMP, -1, True
    while True:
        status = check_batch(p, pos, n, &h, base_offset, out.last, out.last >= 0, -1,
                             verify_crc, &why, &s, &c)
        if status == R_END:
            out.complete = (n - pos) == 0 or not (n - pos < HEADER_UP_TO_MAGIC or
                                                  pos + LOG_OVERHEAD + ld32(p + pos + 8) > n)
            if n - pos >= 12 and ld32(p + pos + 8) == 0 and ld64(p + pos) == 0:
                out.complete = True    # zero padding: nothing more to come at this position yet
            break
        if status != R_VALID:
            break
        if h.max_timestamp > out.max_ts:
            out.max_ts = h.max_timestamp
            out.off_max = h.last_offset
        out.last = h.last_offset
        pos += h.size
    out.valid = pos


def validate_batches(data, int64_t base_offset, int64_t prev_last_offset, bint verify_crc=True):
    """Validate a run of batches held in memory (a pread copy): returns (valid_bytes,
    last_offset (prev_last_offset if none), max_timestamp, offset_of_max_timestamp, complete)
    where complete is False when the data ended inside a batch (more may follow on disk)."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0]
    cdef _Run r
    _validate_run(&mv[0] if n else &_empty_byte, n, base_offset, prev_last_offset, verify_crc, &r)
    return (r.valid, r.last, r.max_ts, r.off_max, r.complete)


def pread_validate(int fd, Py_ssize_t n, int64_t offset, int64_t base_offset,
                   int64_t prev_last_offset):
    """validate_batches of the n bytes at offset of fd (pread, looping over short reads until
    EOF), read and validated without the GIL and without a bytes copy: FileOps.pread_validate,
    a read-only log's tail refresh on the append-to-visible path. Returns (bytes read,
    valid_bytes, last_offset, max_timestamp, offset_of_max_timestamp); OSError if pread fails."""
    cdef uint8_t* buf
    cdef Py_ssize_t got = 0
    cdef ssize_t k = 0
    cdef int err = 0
    cdef _Run r
    if n < 0 or offset < 0:
        raise ValueError(f"pread_validate of {n} bytes at {offset}")
    buf = <uint8_t*>malloc(n if n > 0 else 1)
    if buf == NULL:
        raise MemoryError()
    try:
        with nogil:
            while got < n:
                k = pread(fd, buf + got, n - got, offset + got)
                if k < 0:
                    if errno == EINTR:
                        continue
                    err = errno
                    break
                if k == 0:
                    break
                got += k
            if err == 0:
                _validate_run(buf, got, base_offset, prev_last_offset, True, &r)
        if err:
            raise OSError(err, os.strerror(err))
        return (got, r.valid, r.last, r.max_ts, r.off_max)
    finally:
        free(buf)


def find_batch(Mapping m, Py_ssize_t start, Py_ssize_t end, int64_t target):
    """Kafka's searchForOffsetWithSize: position of the first batch at or after `start` whose
    last offset >= target, or -1 if none before `end` (headers only, no CRC)."""
    cdef const uint8_t* p
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t pos = start
    if start < 0 or end > m.length or start > end:
        raise ValueError("scan range outside mapping")
    p = m.ptr()
    while True:
        if parse_header(p, pos, end, &h, &why) != H_OK:
            m.check_intact()
            return -1
        if h.last_offset >= target:
            m.check_intact()
            return pos
        pos += h.size

def batch_headers(Mapping m, Py_ssize_t start, Py_ssize_t end):
    """List of (position, base_offset, last_offset, size, magic, attrs, max_timestamp, count)
    for the well-formed batches in [start, end); stops at the first malformed one."""
    cdef const uint8_t* p
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t pos = start
    cdef list out = []
    if start < 0 or end > m.length or start > end:
        raise ValueError("scan range outside mapping")
    p = m.ptr()
    while parse_header(p, pos, end, &h, &why) == H_OK:
        out.append((pos, h.base_offset, h.last_offset, h.size, h.magic, h.attrs,
                    h.max_timestamp, h.count))
        pos += h.size
    m.check_intact()
    return out


cdef bint _all_zero(const uint8_t* p, Py_ssize_t n) noexcept nogil:
    """Whether the n bytes at p are all zero: 64 bytes a step (the preallocated tail after a
    crash is megabytes; a byte loop took ~1 ms per MiB)."""
    cdef Py_ssize_t i = 0
    cdef uint64_t acc, w
    cdef int j
    while i + 64 <= n:
        acc = 0
        for j in range(8):
            memcpy(&w, p + i + 8 * j, 8)
            acc |= w
        if acc:
            return False
        i += 64
    while i < n:
        if p[i]:
            return False
        i += 1
    return True


#: a recovery scan verifies CRCs on two threads when at least this many bytes are valid (below
#: it, starting a thread costs more than half the hashing saves)
_PARALLEL_CRC_BYTES = 8 << 20


cdef Py_ssize_t _first_bad_crc(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end) noexcept nogil:
    """Position of the first batch in [pos, end) whose CRC does not match, or -1. The batches
    there were parsed before (recover_scan's first pass): whole, back to back."""
    cdef BatchHeader h
    cdef const char* why
    cdef uint32_t stored, computed
    while pos < end:
        if parse_header(p, pos, end, &h, &why) != H_OK:
            return pos
        if not crc_ok(p, pos, &h, &stored, &computed):
            return pos
        pos += h.size
    return -1


def _crc_span(Mapping m, Py_ssize_t start, Py_ssize_t end, list out, done):
    """Thread body of recover_scan's parallel CRC pass: out.append(the first bad batch's
    position in [start, end), or -1), the mapping pinned and the GIL released; done (a lock
    the starter holds) released at the end, whatever happened."""
    cdef const uint8_t* p = m.ptr()
    cdef Py_ssize_t bad
    try:
        m.pin()
        try:
            with nogil:
                bad = _first_bad_crc(p, start, end)
        finally:
            m.unpin()
        out.append(bad)
    finally:
        done.release()


cdef Py_ssize_t _split_point(const uint8_t* p, Py_ssize_t start, Py_ssize_t end) noexcept nogil:
    """The first batch boundary at or after the middle of [start, end) (end if none)."""
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t pos = start, mid = start + (end - start) // 2
    while pos < mid:
        if parse_header(p, pos, end, &h, &why) != H_OK:
            return end
        pos += h.size
    return pos


def _crcs_ok(Mapping m, Py_ssize_t start, Py_ssize_t end, res, int64_t base_offset,
             int64_t prev_last_offset, int64_t upper_bound):
    """recover_scan's parallel CRC pass over the batches its first pass (no CRCs) found valid
    in [start, valid): True if every CRC matches and the batch where that pass stopped gets the
    same status with its CRC checked (a CRC failure there would be reported first), so the
    one-thread scan would return the same result."""
    cdef Py_ssize_t valid = res["valid_bytes"], split, bad
    cdef const uint8_t* p
    cdef BatchHeader h
    cdef const char* why = ""
    cdef uint32_t stored = 0, computed = 0
    cdef int64_t prev_last = res["next_offset"] - 1 if res["batches"] else prev_last_offset
    if valid - start < _PARALLEL_CRC_BYTES:
        return False
    p = m.ptr()
    out = []
    m.pin()
    try:
        if _STATUS.get(check_batch(p, valid, end, &h, base_offset, prev_last, prev_last >= 0,
                               upper_bound, True, &why, &stored, &computed)) != res["status"]:
            return False
        with nogil:
            split = _split_point(p, start, valid)
        # a bare thread, waited for through a lock it releases: Thread.start() would first
        # wait until the new thread runs (a context switch, milliseconds on a loaded machine)
        # before this thread starts hashing its half
        done = _thread.allocate_lock()
        done.acquire()
        _thread.start_new_thread(_crc_span, (m, split, valid, out, done))
        try:
            with nogil:
                bad = _first_bad_crc(p, start, split)
        finally:
            done.acquire()
    finally:
        m.unpin_checked()
    return bad < 0 and out == [-1]


def recover_scan(Mapping m, Py_ssize_t end, int64_t base_offset, int64_t index_interval,
                 Py_ssize_t max_offset_entries, Py_ssize_t max_time_entries,
                 bint verify_crc=True, Py_ssize_t start=0, int64_t prev_last_offset=-1,
                 int64_t upper_bound=-1, int threads=1, bint epochs=False):
    """Validate the batches in [0, end) and compute the index entries Kafka's recover() writes.

    Returns a RecoverResult: valid_bytes, next_offset (-1 if no batch), max_timestamp,
    offset_of_max_timestamp, first_batch_timestamp, batches, offset_entries / time_entries
    (big-endian structured arrays in the on-disk layout), status (a ScanStatus), reason (text)
    and tail_zero (whether the bytes after valid_bytes are all zero, i.e. a preallocated tail
    rather than garbage), epochs: with epochs=True, [(epoch, base offset)] of the valid v2
    batches whose partition leader epoch is >= 0 and above every earlier one's in the scan (what
    Kafka's LogSegment.recover assigns to the leader epoch cache), found in the same pass (else []).
    Runs without the GIL. `start` / `prev_last_offset` continue a scan from a known valid
    position (the read-only refresh of a segment another process appends to). A batch reaching
    `upper_bound` (the next segment's base offset, if >= 0) is invalid ('past_next'): base
    offsets lie outside the CRC, so a flipped bit there is caught only this way.

    threads=2 hashes on two cores when at least _PARALLEL_CRC_BYTES are valid (the hashing is
    what bounds a recovery: ~6 GB/s per core from memory): a first pass validates everything
    but the CRCs and computes the indexes, then the CRCs of [start, valid) are checked in two
    halves at once, and the batch where the first pass stopped is checked again with its CRC
    (its status may be 'crc' rather than what the first pass saw). If any CRC fails, the scan
    runs again on one thread with CRCs: the result is always the one-thread scan's.
    """
    if verify_crc and threads > 1 and end - start >= _PARALLEL_CRC_BYTES and 0 <= start <= end <= m.length:
        res = recover_scan(m, end, base_offset, index_interval, max_offset_entries,
                           max_time_entries, False, start, prev_last_offset, upper_bound, 1, epochs)
        if _crcs_ok(m, start, end, res, base_offset, prev_last_offset, upper_bound):
            return res
        # a CRC failed, the first pass stopped at an invalid batch (whose CRC decides its
        # status) or too little was valid: the one-thread scan says where and why
        return recover_scan(m, end, base_offset, index_interval, max_offset_entries,
                            max_time_entries, True, start, prev_last_offset, upper_bound, 1, epochs)
    if end < 0 or end > m.length or start < 0 or start > end:
        raise ValueError("scan range outside mapping")
    cdef Py_ssize_t cap_o = max_offset_entries if max_offset_entries > 0 else 0
    cdef Py_ssize_t cap_t = max_time_entries if max_time_entries > 0 else 0
    cdef Py_ssize_t bound = end // (index_interval + 1) + 2
    if cap_o > bound:
        cap_o = bound
    if cap_t > bound:
        cap_t = bound
    oarr = np.zeros(cap_o, dtype=_OFFSET_DTYPE)
    tarr = np.zeros(cap_t, dtype=_TIME_DTYPE)
    cdef uint8_t[::1] ob = oarr.view(np.uint8) if cap_o else np.zeros(1, np.uint8)
    cdef uint8_t[::1] tb = tarr.view(np.uint8) if cap_t else np.zeros(1, np.uint8)
    cdef uint8_t* op = &ob[0]
    cdef uint8_t* tp = &tb[0]
    cdef Py_ssize_t no = 0, nt = 0
    cdef const uint8_t* p
    cdef Py_ssize_t valid = start, last_entry_pos = start, batches = 0
    cdef int64_t prev_last = prev_last_offset, max_ts = NO_TIMESTAMP, off_max = -1, first_ts = NO_TIMESTAMP
    cdef int64_t last_time_ts = NO_TIMESTAMP
    cdef int status = R_END
    cdef BatchHeader h
    cdef const char* why = ""
    cdef uint32_t stored = 0, computed = 0
    cdef bint have_prev = prev_last_offset >= 0
    cdef bint tail_zero = True
    cdef int64_t *ep = NULL, *grown    # ep: (epoch, base offset) pairs, grown by doubling
    cdef Py_ssize_t ne = 0, ne_cap = 0
    cdef int32_t top = -1
    cdef bint want_epochs = epochs
    h.base_offset = h.last_offset = 0     # (read by the reasons below only once parsed)
    p = m.ptr()
    m.pin()
    try:
        with nogil:
            while True:
                status = check_batch(p, valid, end, &h, base_offset, prev_last, have_prev,
                                     upper_bound, verify_crc, &why, &stored, &computed)
                if status != R_VALID:
                    break
                if batches == 0:
                    first_ts = h.max_timestamp
                if h.max_timestamp > max_ts:
                    max_ts = h.max_timestamp
                    off_max = h.last_offset
                if valid - last_entry_pos > index_interval:
                    if no < cap_o:
                        st32(op + 8 * no, <uint32_t>(h.last_offset - base_offset))
                        st32(op + 8 * no + 4, <uint32_t>valid)
                        no += 1
                    # TimeIndex.maybeAppend: only a strictly larger timestamp is written
                    if max_ts > last_time_ts and nt < cap_t:
                        st64(tp + 12 * nt, <uint64_t>max_ts)
                        st32(tp + 12 * nt + 8, <uint32_t>(off_max - base_offset))
                        nt += 1
                        last_time_ts = max_ts
                    last_entry_pos = valid
                if want_epochs and h.magic == 2 and <int32_t>ld32(p + valid + 12) > top:
                    top = <int32_t>ld32(p + valid + 12)          # partitionLeaderEpoch
                    if ne == ne_cap:
                        ne_cap = 2 * ne_cap + 8
                        grown = <int64_t*>realloc(ep, 2 * ne_cap * sizeof(int64_t))
                        want_epochs = grown != NULL            # else MemoryError below
                        ep = grown if want_epochs else ep
                    if want_epochs:
                        ep[2 * ne], ep[2 * ne + 1] = top, h.base_offset
                        ne += 1
                prev_last = h.last_offset
                have_prev = True
                valid += h.size
                batches += 1
            tail_zero = _all_zero(p + valid, end - valid)
        found = [(ep[2 * i], ep[2 * i + 1]) for i in range(ne)]
    finally:
        m.unpin_checked()
        free(ep)
    if epochs and not want_epochs:
        raise MemoryError("recover_scan: no memory for the leader epochs")
    if status == R_CRC:
        reason = f"CRC mismatch in the batch at position {valid} (stored {stored:#010x}, computed {computed:#010x})"
    elif status == R_OFFSET_ORDER:
        reason = f"offsets of the batch at position {valid} do not follow the previous batch's last offset {prev_last}"
    elif status == R_OVERFLOW:
        reason = f"the batch at position {valid} has offset {h.last_offset}, more than 2^31-1 above the base offset {base_offset}"
    elif status == R_PAST_NEXT:
        reason = (f"the batch at position {valid} has offsets {h.base_offset}..{h.last_offset}, at or "
                  f"past the next segment's base offset {upper_bound}")
    elif status == R_BELOW_BASE:
        reason = f"the batch at position {valid} has offset {h.base_offset}, below the segment's base offset {base_offset}"
    elif valid < end:
        reason = f"at position {valid}: {why.decode('ascii')}"
    else:
        reason = ""
    return RecoverResult(
        valid_bytes=valid,
        next_offset=prev_last + 1 if have_prev else -1,
        max_timestamp=max_ts,
        offset_of_max_timestamp=off_max,
        first_batch_timestamp=first_ts,
        batches=batches,
        offset_entries=oarr[:no],
        time_entries=tarr[:nt],
        status=_STATUS[status],
        reason=reason,
        tail_zero=tail_zero,
        epochs=found,
    )


cdef inline Py_ssize_t _checked_entries(Mapping m, Py_ssize_t n, Py_ssize_t esize) except -2:
    if n < 0 or n * esize > m.length:
        raise ValueError(f"{n} index entries do not fit a mapping of {m.length} bytes")
    return n

def offset_index_floor_slot(Mapping m, Py_ssize_t n, int64_t base_offset, int64_t target):
    """Slot of the largest entry with offset <= target, or -1."""
    _checked_entries(m, n, 8)
    return floor_slot(m.ptr(), n, 8, 0, False, base_offset, target, 1024)

def offset_index_lookup(Mapping m, Py_ssize_t n, int64_t base_offset, int64_t target):
    """OffsetIndex.lookup: (offset, position) of the floor entry, or (base_offset, 0)."""
    _checked_entries(m, n, 8)
    cdef const uint8_t* p = m.ptr()
    cdef Py_ssize_t s = floor_slot(p, n, 8, 0, False, base_offset, target, 1024)
    if s < 0:
        return (base_offset, 0)
    return (base_offset + ld32(p + 8 * s), ld32(p + 8 * s + 4))

def time_index_lookup(Mapping m, Py_ssize_t n, int64_t base_offset, int64_t ts):
    """TimeIndex.lookup: (timestamp, offset) of the floor entry by timestamp, or (-1, base)."""
    _checked_entries(m, n, 12)
    cdef const uint8_t* p = m.ptr()
    cdef Py_ssize_t s = floor_slot(p, n, 12, 0, True, 0, ts, 682)
    if s < 0:
        return (NO_TIMESTAMP, base_offset)
    return (ld64(p + 12 * s), base_offset + ld32(p + 12 * s + 8))

def time_index_floor_slot_by_offset(Mapping m, Py_ssize_t n, int64_t base_offset, int64_t target):
    """Slot of the largest time entry whose offset <= target (TimeIndex.truncateTo), or -1."""
    _checked_entries(m, n, 12)
    return floor_slot(m.ptr(), n, 12, 8, False, base_offset, target, 682)

def index_entry(Mapping m, Py_ssize_t slot, int entry_size):
    """Raw entry at slot: (relative_offset, position) or (timestamp, relative_offset)."""
    if slot < 0 or (slot + 1) * entry_size > m.length:
        raise ValueError(f"index slot {slot} outside mapping")
    cdef const uint8_t* p = m.ptr() + slot * entry_size
    if entry_size == 8:
        return (ld32(p), ld32(p + 4))
    return (ld64(p), ld32(p + 8))

def put_offset_entry(Mapping m, Py_ssize_t slot, int32_t rel, int32_t position):
    if not m.writable or slot < 0 or (slot + 1) * 8 > m.length:
        raise ValueError(f"cannot write offset index slot {slot}")
    cdef uint8_t* p = <uint8_t*>m.ptr() + slot * 8
    st32(p, <uint32_t>rel)
    st32(p + 4, <uint32_t>position)

def put_time_entry(Mapping m, Py_ssize_t slot, int64_t ts, int32_t rel):
    if not m.writable or slot < 0 or (slot + 1) * 12 > m.length:
        raise ValueError(f"cannot write time index slot {slot}")
    cdef uint8_t* p = <uint8_t*>m.ptr() + slot * 12
    st64(p, <uint64_t>ts)
    st32(p + 8, <uint32_t>rel)
