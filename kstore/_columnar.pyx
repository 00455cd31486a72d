# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Columnar decode: records straight into Arrow-layout buffers (Columns), the Spark / Arrow
read path; uncompressed v2 batches decode without the GIL. A Columns can leave out keys, values,
timestamps and headers (a query that does not need them); one that keeps only offsets is filled
from batch headers alone wherever a batch has no gaps (see decode_columns)."""
from libc.stdint cimport uint8_t, uint32_t, int32_t, int64_t
from libc.string cimport memcpy, memset
from libc.stdlib cimport realloc, free
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING
from cpython.buffer cimport PyBuffer_FillInfo

from kstore._format cimport *
from kstore._mapping cimport Mapping
from kstore._record cimport Record
from kstore._decode cimport (decode_legacy, decompress_value, usable_with, remember_min_bytes,
                             new_table, table_add, BatchRecords)

import numpy as np

from kstore._format import StrStatus as _StrStatus


class ColumnsStatus(_StrStatus):
    """Why decode_columns returned."""
    END = "end"         # the range is consumed
    LIMIT = "limit"     # max_records / max_data reached: resume at next_offset
    STOP = "stop"       # stop_offset reached

cdef uint8_t _empty_byte = 0


cdef struct Buf:
    uint8_t* p
    Py_ssize_t n
    Py_ssize_t cap

cdef int _grow(Buf* b, Py_ssize_t extra) noexcept nogil:
    cdef Py_ssize_t c
    cdef uint8_t* q
    if b.n + extra <= b.cap:
        return 0
    c = b.cap * 2 if b.cap else 1024
    while c < b.n + extra:
        c *= 2
    q = <uint8_t*>realloc(b.p, c)
    if q == NULL:
        return -1
    b.p = q
    b.cap = c
    return 0

cdef inline int _put(Buf* b, const void* src, Py_ssize_t n) noexcept nogil:
    if b.n + n > b.cap and _grow(b, n) < 0:
        return -1
    if n:
        memcpy(b.p + b.n, src, n)
    b.n += n
    return 0

cdef inline int _put_i32(Buf* b, int32_t v) noexcept nogil:
    return _put(b, &v, 4)

cdef inline int _put_i64(Buf* b, int64_t v) noexcept nogil:
    return _put(b, &v, 8)

cdef inline int _put_u8(Buf* b, uint8_t v) noexcept nogil:
    return _put(b, &v, 1)

cdef inline int _put_binary(Buf* data, Buf* offsets, Buf* valid, const uint8_t* p,
                            Py_ssize_t n) noexcept nogil:
    """Append one value of an Arrow binary column (n < 0: null; valid NULL: never null)."""
    if n >= 0 and _put(data, p, n) < 0:
        return -1
    if _put_i32(offsets, <int32_t>data.n) < 0:
        return -1
    if valid != NULL and _put_u8(valid, n >= 0) < 0:
        return -1
    return 0

cdef enum:
    C_DONE = 0       # the batch was consumed
    C_LIMIT = 1      # max records / bytes reached: resume at next_offset
    C_STOP = 2       # reached stop_offset
    C_CORRUPT = -1
    C_NOMEM = -2
    # column slots
    COL_OFFSET = 0
    COL_TS = 1
    COL_TSTYPE = 2
    COL_KOFF = 3
    COL_KDAT = 4
    COL_KVAL = 5
    COL_VOFF = 6
    COL_VDAT = 7
    COL_VVAL = 8
    COL_HOFF = 9
    COL_HVAL = 10
    COL_HKOFF = 11
    COL_HKDAT = 12
    COL_HVOFF = 13
    COL_HVDAT = 14
    COL_HVVAL = 15
    NCOLS = 16


cdef class Columns


cdef class _ColumnView:
    """Read-only buffer over one column of a Columns. While any view lives, its Columns refuses
    clear() and decoding, so the memory under it can neither change nor move."""
    cdef Columns owner
    cdef const uint8_t* p
    cdef Py_ssize_t n

    def __dealloc__(self):
        if self.owner is not None:
            self.owner.live_views -= 1

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        PyBuffer_FillInfo(buffer, self, <void*>(self.p if self.p != NULL else &_empty_byte),
                          self.n, 1, flags)


_COLUMN_NAMES = (
    ("offset", COL_OFFSET, np.int64), ("timestamp", COL_TS, np.int64),
    ("timestampType", COL_TSTYPE, np.int32),
    ("key_offsets", COL_KOFF, np.int32), ("key_data", COL_KDAT, np.uint8),
    ("key_valid", COL_KVAL, np.uint8),
    ("value_offsets", COL_VOFF, np.int32), ("value_data", COL_VDAT, np.uint8),
    ("value_valid", COL_VVAL, np.uint8),
)
_HEADER_COLUMN_NAMES = (
    ("headers_offsets", COL_HOFF, np.int32), ("headers_valid", COL_HVAL, np.uint8),
    ("header_key_offsets", COL_HKOFF, np.int32), ("header_key_data", COL_HKDAT, np.uint8),
    ("header_value_offsets", COL_HVOFF, np.int32), ("header_value_data", COL_HVDAT, np.uint8),
    ("header_value_valid", COL_HVVAL, np.uint8),
)


cdef class Columns:
    """Decoded records as Arrow-layout columns: offset int64, timestamp int64 (microseconds),
    timestamp type int32, key / value as (int32 offsets, data, validity bytes) and, with
    headers=True, the list<struct<key string, value binary>> buffers. Filled by decode_columns;
    arrays() hands numpy copies out, views() zero-copy views (kstore.arrow turns them into a
    pyarrow RecordBatch).

    keys / values / timestamps=False leave those columns empty (nothing is copied for them), for
    a read that does not need them. With all three False and headers False the Columns holds
    offsets only (offsets_only): decode_columns then takes a batch without gaps (record count =
    offset span) from its header alone, without parsing its records."""
    cdef Buf b[16]
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t header_count
    cdef readonly bint headers
    cdef readonly bint keys
    cdef readonly bint values
    cdef readonly bint timestamps
    cdef readonly bint offsets_only
    cdef readonly Py_ssize_t live_views    # views() alive: while > 0 the columns are frozen

    def __cinit__(self, bint headers=False, *, bint keys=True, bint values=True,
                  bint timestamps=True):
        memset(self.b, 0, sizeof(self.b))
        self.headers = headers
        self.keys = keys
        self.values = values
        self.timestamps = timestamps
        self.offsets_only = not (headers or keys or values or timestamps)
        self.clear()

    def __dealloc__(self):
        cdef int i
        for i in range(NCOLS):
            free(self.b[i].p)

    def clear(self):
        """Empty the columns (keeping their memory) for the next chunk."""
        cdef int i
        self._require_unviewed()
        for i in range(NCOLS):
            self.b[i].n = 0
        self.count = 0
        self.header_count = 0
        if (_put_i32(&self.b[COL_KOFF], 0) < 0 or _put_i32(&self.b[COL_VOFF], 0) < 0 or
                _put_i32(&self.b[COL_HOFF], 0) < 0 or _put_i32(&self.b[COL_HKOFF], 0) < 0 or
                _put_i32(&self.b[COL_HVOFF], 0) < 0):
            raise MemoryError()

    cdef inline Py_ssize_t _data_bytes(self) noexcept nogil:
        return self.b[COL_KDAT].n + self.b[COL_VDAT].n + self.b[COL_HKDAT].n + self.b[COL_HVDAT].n

    cdef int add(self, int64_t offset, int64_t ts_ms, int32_t tstype, const uint8_t* k,
                 Py_ssize_t klen, const uint8_t* v, Py_ssize_t vlen) noexcept nogil:
        """One record without its headers (add_header / end_headers follow when headers=True)."""
        cdef Buf* b = self.b
        if _put_i64(&b[COL_OFFSET], offset) < 0:
            return -1
        if self.timestamps and (_put_i64(&b[COL_TS], ts_ms * 1000) < 0 or
                                _put_i32(&b[COL_TSTYPE], tstype) < 0):
            return -1
        if self.keys and _put_binary(&b[COL_KDAT], &b[COL_KOFF], &b[COL_KVAL], k, klen) < 0:
            return -1
        if self.values and _put_binary(&b[COL_VDAT], &b[COL_VOFF], &b[COL_VVAL], v, vlen) < 0:
            return -1
        self.count += 1
        return 0

    cdef int add_run(self, int64_t first, int64_t n) noexcept nogil:
        """Offsets first .. first+n-1 (an offsets-only Columns: a batch without gaps)."""
        cdef Buf* b = &self.b[COL_OFFSET]
        cdef int64_t* q
        cdef int64_t i
        if n <= 0:
            return 0
        if _grow(b, n * 8) < 0:
            return -1
        q = <int64_t*>(b.p + b.n)
        for i in range(n):
            q[i] = first + i
        b.n += n * 8
        self.count += n
        return 0

    cdef int add_header(self, const uint8_t* k, Py_ssize_t klen, const uint8_t* v,
                        Py_ssize_t vlen) noexcept nogil:
        cdef Buf* b = self.b
        if (_put_binary(&b[COL_HKDAT], &b[COL_HKOFF], NULL, k, klen) < 0 or
                _put_binary(&b[COL_HVDAT], &b[COL_HVOFF], &b[COL_HVVAL], v, vlen) < 0):
            return -1
        self.header_count += 1
        return 0

    cdef int end_headers(self, Py_ssize_t n) noexcept nogil:
        """Close the current record's header list (null when it has none, as Spark's Kafka
        source shows it)."""
        cdef Buf* b = self.b
        if _put_i32(&b[COL_HOFF], <int32_t>self.header_count) < 0 or _put_u8(&b[COL_HVAL], n > 0) < 0:
            return -1
        return 0

    cdef int _require_unviewed(self) except -1:
        if self.live_views:
            raise BufferError(f"Columns has {self.live_views} live view(s) of its buffers: release "
                              "the arrays from views() before clearing or refilling it")
        return 0

    cdef object _array(self, int col, object dtype):
        return np.frombuffer(PyBytes_FromStringAndSize(<char*>self.b[col].p, self.b[col].n), dtype=dtype)

    cdef object _view(self, int col, object dtype):
        cdef _ColumnView v = _ColumnView.__new__(_ColumnView)
        v.owner = self
        v.p = self.b[col].p
        v.n = self.b[col].n
        self.live_views += 1
        return np.frombuffer(v, dtype=dtype)

    def _columns(self, bint copy):
        names = _COLUMN_NAMES + _HEADER_COLUMN_NAMES if self.headers else _COLUMN_NAMES
        if copy:
            return {name: self._array(col, dtype) for name, col, dtype in names}
        return {name: self._view(col, dtype) for name, col, dtype in names}

    def arrays(self):
        """The columns as numpy arrays (copies), keyed by name."""
        return self._columns(True)

    def views(self):
        """The columns as read-only numpy arrays over this object's memory, keyed by name (no
        copy). Until every one of them is released, clear() and decode_columns raise
        BufferError, so the data under them stays put."""
        return self._columns(False)


cdef int _cols_v2(Columns c, const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                  int64_t base_offset, int64_t base_ts, int64_t max_ts, int64_t last_delta,
                  int32_t count, bint lat, int64_t min_offset, int64_t stop_offset,
                  Py_ssize_t max_records, Py_ssize_t max_data, int64_t* next_offset,
                  const char** why, BatchRecords* t) noexcept nogil:
    """Decode one v2 batch's records region p[pos:end) into c (see decode_columns); offset
    deltas must increase within the batch's last offset delta, as in _decode. t: a record table
    to fill as the records are validated (complete only when C_DONE is returned and min_offset
    is at most the batch's base offset)."""
    cdef Py_ssize_t start = pos - V2_OVERHEAD
    cdef int32_t i
    cdef int64_t hcount, hk, hv, j, offset
    cdef Py_ssize_t q, kq, vq
    cdef int tstype = 1 if lat else 0
    cdef RecordFields f
    cdef int64_t prev_delta = -1
    for i in range(count):
        if record_fields(p, pos, end, &f) < 0:
            why[0] = f.why
            return C_CORRUPT
        if f.off_delta <= prev_delta or f.off_delta > last_delta:
            why[0] = "a record's offset delta is not above the previous one or past the batch's last"
            return C_CORRUPT
        prev_delta = f.off_delta
        offset = base_offset + f.off_delta
        if offset >= stop_offset:
            next_offset[0] = offset
            return C_STOP
        if offset < min_offset:
            pos = f.end
            continue
        if c.count >= max_records or (c.count > 0 and c._data_bytes() + f.end - pos > max_data):
            next_offset[0] = offset
            return C_LIMIT
        q = header_count(p, &f, &hcount)
        if q < 0:
            why[0] = f.why
            return C_CORRUPT
        if c.add(offset, max_ts if lat else base_ts + f.ts_delta, tstype, p + f.key_pos,
                 f.key_len, p + f.value_pos, f.value_len) < 0:
            return C_NOMEM
        for j in range(hcount):
            q = next_header(p, q, &f, &kq, &hk, &vq, &hv)
            if q < 0:
                why[0] = f.why
                return C_CORRUPT
            if c.headers and c.add_header(p + kq, hk, p + vq, hv) < 0:
                return C_NOMEM
        if c.headers and c.end_headers(hcount) < 0:
            return C_NOMEM
        if q != f.end:
            why[0] = "a record has unexpected bytes after its headers"
            return C_CORRUPT
        if t != NULL:
            table_add(t, i, pos - start, f.off_delta, base_ts + f.ts_delta)
        pos = f.end
    if pos != end:
        why[0] = "bytes remain after the batch's records"
        return C_CORRUPT
    return C_DONE


cdef int _offset_run(Columns c, BatchHeader* h, int64_t min_offset, int64_t stop_offset,
                     Py_ssize_t max_records, int64_t* next_offset) noexcept nogil:
    """An offsets-only Columns takes the offsets of a v2 batch without gaps within
    [min_offset, stop_offset), up to max_records in all: C_DONE (the batch is consumed), C_LIMIT
    or C_STOP with next_offset set, as _cols_v2 returns them."""
    cdef int64_t lo = h.base_offset if h.base_offset > min_offset else min_offset
    cdef int64_t hi = h.last_offset + 1
    cdef int64_t take
    if hi > stop_offset:
        hi = stop_offset
    take = hi - lo
    if take > max_records - c.count:
        take = max_records - c.count
    if take < 0:
        take = 0
    if c.add_run(lo, take) < 0:
        return C_NOMEM
    if lo + take < hi:
        next_offset[0] = lo + take
        return C_LIMIT
    if hi <= h.last_offset:
        next_offset[0] = hi
        return C_STOP
    return C_DONE


cdef inline void _mark_verified(Mapping m, Py_ssize_t pos, BatchHeader* h) noexcept:
    """The batch at pos (its CRC just verified, a table remembered for it when it was looked
    up): mark that table verified, if it is still there."""
    cdef BatchRecords* t = <BatchRecords*>m.remembered(pos)
    if t != NULL and t.header.size == h.size and t.header.base_offset == h.base_offset:
        t.crc_ok = True


def decode_columns(Mapping m, Py_ssize_t pos, Py_ssize_t end, int64_t min_offset,
                   int64_t stop_offset, Columns cols, Py_ssize_t max_records=NO_LIMIT,
                   Py_ssize_t max_data=NO_LIMIT, bint verify_crc=True):
    """Decode the records with min_offset <= offset < stop_offset of the batches in m[pos:end)
    into cols, until cols holds max_records records or about max_data bytes of key/value/header
    data (at least one record). Control batches are skipped, as consumers do.

    Returns (position, next_offset, status), status a ColumnsStatus: END (the range is consumed;
    position is end), LIMIT (resume with min_offset=next_offset at position) or STOP
    (stop_offset reached). Uncompressed v2 batches are decoded without the GIL; CRCs are verified
    first, once per mapping for batches that get a record table (see _decode: a whole-batch
    decode here builds it, and _decode's record path uses it), on every read for the others.
    An offsets-only cols (Columns.offsets_only) takes a v2 batch whose record count equals its
    offset span from the header (count and offsets checked, CRC verified, records not parsed),
    so a query that needs no record data never decompresses or walks such batches.
    """
    cdef const uint8_t* p
    cdef const uint8_t* rp
    cdef BatchHeader h
    cdef const char* why = NULL
    cdef int hs, r, codec
    cdef uint32_t s, c
    cdef bint ok
    cdef int64_t next_offset = min_offset
    cdef Py_ssize_t n
    cdef list tmp
    cdef Record rec
    cdef const uint8_t[::1] mv
    cdef const uint8_t* kp
    cdef const uint8_t* vp
    cdef BatchRecords* tab
    cdef Py_ssize_t tab_bytes
    cdef bint known, build, had
    cdef Py_ssize_t min_bytes = remember_min_bytes()
    if pos < 0 or end > m.length or pos > end:
        raise ValueError("decode range outside mapping")
    if max_records <= 0 or max_data <= 0:
        raise ValueError("max_records and max_data must be positive")
    cols._require_unviewed()
    if max_data > (1 << 30):
        max_data = 1 << 30      # Arrow int32 offsets: keep every buffer well below 2 GiB
    p = m.ptr()
    m.pin()
    try:
        while True:
            hs = parse_header(p, pos, end, &h, &why)
            if hs == H_END:
                return (pos, next_offset, ColumnsStatus.END)
            if hs == H_CORRUPT:
                raise corrupt(why.decode("ascii"), pos)
            if h.last_offset < min_offset:
                pos += h.size
                continue
            if h.magic == 2 and h.base_offset >= stop_offset:
                return (pos, h.base_offset, ColumnsStatus.STOP)
            # A batch large enough for a record table (usable_batch) has its CRC verified once
            # per mapping, as _decode's record path does: the table remembered for it says so.
            # A whole-batch decode here builds that table as it validates the records.
            tab = NULL
            known = build = had = False
            if usable_with(m, &h, min_bytes):
                tab = <BatchRecords*>m.remembered(pos)
                had = tab != NULL
                build = not had and min_offset <= h.base_offset and not cols.offsets_only
                known = had and tab.crc_ok and tab.header.size == h.size \
                    and tab.header.base_offset == h.base_offset
                tab = NULL      # not used past Python code (see Mapping.remembered)
            # (or a read-only refresh checked it in a pread copy: Mapping.note_crc_verified)
            known = known or m is not None and m.crc_known(pos, h.size)
            if verify_crc and not known:
                with nogil:
                    ok = crc_ok(p, pos, &h, &s, &c)
                if not ok:
                    raise corrupt(f"CRC mismatch (stored {s:#010x}, computed {c:#010x})", pos)
                if had:
                    _mark_verified(m, pos, &h)
            if h.magic == 2:
                if h.attrs & CONTROL_BIT:
                    pos += h.size
                    next_offset = h.last_offset + 1
                    continue
                if h.count > h.last_offset - h.base_offset + 1:
                    raise corrupt(f"record count {h.count} exceeds the batch's offset range", pos)
                codec = h.attrs & CODEC_MASK
                if codec > 4:
                    raise corrupt(f"invalid compression codec {codec}", pos)
                if cols.offsets_only and h.count == h.last_offset - h.base_offset + 1:
                    # no gaps: the offsets are base .. last, known without the records (their
                    # bytes are covered by the CRC checked above); a compacted batch (fewer
                    # records than offsets) goes the record-by-record way below
                    r = _offset_run(cols, &h, min_offset, stop_offset, max_records, &next_offset)
                elif codec == 0:
                    if build:
                        tab = new_table(&h, &tab_bytes)
                    with nogil:
                        r = _cols_v2(cols, p, pos + V2_OVERHEAD, pos + h.size, h.base_offset,
                                     h.base_timestamp, h.max_timestamp,
                                     h.last_offset - h.base_offset, h.count,
                                     (h.attrs & TS_TYPE_BIT) != 0, min_offset, stop_offset,
                                     max_records, max_data, &next_offset, &why, tab)
                    if tab != NULL:
                        if r == C_DONE:
                            tab.crc_ok = verify_crc
                            if not m.remember(pos, tab, tab_bytes):
                                free(tab)
                        else:
                            free(tab)
                        tab = NULL
                else:
                    inner = decompress_value(codec, p + pos + V2_OVERHEAD, h.size - V2_OVERHEAD, pos)
                    mv = inner
                    n = mv.shape[0]
                    rp = &mv[0] if n else &_empty_byte
                    with nogil:
                        r = _cols_v2(cols, rp, 0, n, h.base_offset, h.base_timestamp,
                                     h.max_timestamp, h.last_offset - h.base_offset, h.count,
                                     (h.attrs & TS_TYPE_BIT) != 0,
                                     min_offset, stop_offset, max_records, max_data,
                                     &next_offset, &why, NULL)
                if r == C_CORRUPT:
                    raise corrupt(why.decode("ascii"), pos)
                if r == C_NOMEM:
                    raise MemoryError()
                if r == C_STOP:
                    return (pos, next_offset, ColumnsStatus.STOP)
                if r == C_LIMIT:
                    return (pos, next_offset, ColumnsStatus.LIMIT)
            else:
                # v0/v1 messages (a compressed wrapper holds several): rare, decoded as Records
                tmp = []
                decode_legacy(p, pos, &h, min_offset if min_offset > next_offset else next_offset,
                              NO_LIMIT, tmp, pos, verify_crc, 0, 0, NO_TIMESTAMP, False)
                for o in tmp:
                    rec = <Record>o
                    if rec.offset >= stop_offset:
                        return (pos, rec.offset, ColumnsStatus.STOP)
                    if cols.count >= max_records or (cols.count > 0 and cols._data_bytes() > max_data):
                        return (pos, rec.offset, ColumnsStatus.LIMIT)
                    kp = <const uint8_t*>PyBytes_AS_STRING(rec.key) if rec.key is not None else &_empty_byte
                    vp = <const uint8_t*>PyBytes_AS_STRING(rec.value) if rec.value is not None else &_empty_byte
                    if cols.add(rec.offset, rec.timestamp, rec.timestamp_type, kp,
                                len(rec.key) if rec.key is not None else -1, vp,
                                len(rec.value) if rec.value is not None else -1) < 0:
                        raise MemoryError()
                    if cols.headers and cols.end_headers(0) < 0:
                        raise MemoryError()
            pos += h.size
            next_offset = h.last_offset + 1
            min_offset = next_offset if next_offset > min_offset else min_offset
    finally:
        m.unpin_checked()
