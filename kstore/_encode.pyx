# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""BatchBuilder: encodes an append (records, or rows of a ColumnInput) into a reusable scratch
buffer as one v2 batch or v0/v1 messages, validating every record; re-bases staged batches."""
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int16_t, int32_t, int64_t
from libc.string cimport memcpy
from libc.stdlib cimport malloc, realloc, free
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.buffer cimport PyObject_CheckBuffer, PyBuffer_FillInfo
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_GET_ITEM
from cpython.object cimport PyObject
from cpython.sequence cimport PySequence_Fast_ITEMS, PySequence_Fast_GET_SIZE

from kstore._format cimport *
from kstore._mapping cimport Mapping
from kstore._record cimport Record, AppendInfo
from kstore._column_input cimport ColumnInput
from kstore._record_input cimport PlainRun, plain_run

from kstore.errors import InvalidRecordError, UnsupportedCodecError

cdef uint8_t _empty_byte = 0


# ---------------------------------------------------------------------------------------------
# BatchBuilder: encodes appends into a reusable scratch buffer (v2 batch, or v0/v1 messages)
# ---------------------------------------------------------------------------------------------
cdef inline int _bytes_arg(object o, const uint8_t** p, Py_ssize_t* n, list keep) except -1:
    """Point p/n at a bytes-like object's data; None gives n = -1."""
    if o is None:
        n[0] = -1
        p[0] = NULL
        return 0
    if type(o) is bytes:
        p[0] = <const uint8_t*>PyBytes_AS_STRING(o)
        n[0] = PyBytes_GET_SIZE(o)
        return 0
    if isinstance(o, str) or not PyObject_CheckBuffer(o):
        raise TypeError(type(o).__name__)
    b = bytes(o)     # bytearray, memoryview, numpy bytes... (copy; rare path)
    keep.append(b)
    p[0] = <const uint8_t*>PyBytes_AS_STRING(b)
    n[0] = PyBytes_GET_SIZE(b)
    return 0


cdef inline int _key_value(Py_ssize_t i, object key, object value, bint require_key,
                           const uint8_t** kp, Py_ssize_t* klen, const uint8_t** vp,
                           Py_ssize_t* vlen, list keep) except -1:
    """Record i's key and value as pointers and lengths (-1 for None), checked as every message
    format requires: bytes-like or None, and a key on compacted topics."""
    try:
        _bytes_arg(key, kp, klen, keep)
    except TypeError:
        raise InvalidRecordError(f"record {i}: key must be bytes-like or None, not {type(key).__name__}")
    try:
        _bytes_arg(value, vp, vlen, keep)
    except TypeError:
        raise InvalidRecordError(f"record {i}: value must be bytes-like or None, not {type(value).__name__}")
    if require_key and klen[0] < 0:
        raise InvalidRecordError(f"record {i}: compacted topics (cleanup.policy=compact) require a key")
    return 0


cdef inline int _check_window(Py_ssize_t i, int64_t ts, int64_t ts_min, int64_t ts_max) except -1:
    """A CreateTime timestamp must lie in [ts_min, ts_max] (the window the topic's
    message.timestamp.before.max.ms / message.timestamp.after.max.ms allow around now)."""
    if ts < ts_min or ts > ts_max:
        raise InvalidRecordError(
            f"record {i}: timestamp {ts} is outside the allowed range [{ts_min}, {ts_max}] "
            f"(message.timestamp.before.max.ms / message.timestamp.after.max.ms)")
    return 0


cdef class BatchBuilder:
    """Reusable encoder for one append call. After build(), the encoded bytes are in the buffer
    (see .size, getvalue(), copy_to()), and the attributes describe the batch."""
    cdef uint8_t* buf
    cdef Py_ssize_t cap
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t count
    cdef readonly int64_t base_offset
    cdef readonly int64_t last_offset
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t first_timestamp
    cdef readonly int64_t offset_of_max_timestamp
    cdef readonly Py_ssize_t max_entry_size
    cdef readonly int magic
    cdef public object compression_level    # None: the codec's Kafka default
    cdef int exports                         # live buffer exports (memoryview(builder))
    cdef list retired                        # buffers replaced while exported (addresses)

    def __cinit__(self):
        self.compression_level = None
        self.retired = []
        self.cap = 1 << 16
        self.buf = <uint8_t*>malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.buf)
        if self.retired:
            for p in self.retired:
                free(<void*><size_t>p)

    cdef int _ensure(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t c
        cdef uint8_t* nb
        if need <= self.cap:
            return 0
        c = self.cap
        while c < need:
            c *= 2
        if self.exports:
            # a view (e.g. one a traceback keeps) points into the buffer: move to a new one
            # and free the old when the last view is released
            nb = <uint8_t*>malloc(c)
            if nb == NULL:
                raise MemoryError()
            memcpy(nb, self.buf, self.cap)
            self.retired.append(<size_t>self.buf)
        else:
            nb = <uint8_t*>realloc(self.buf, c)
            if nb == NULL:
                raise MemoryError()
        self.buf = nb
        self.cap = c
        return 0

    def getvalue(self):
        return PyBytes_FromStringAndSize(<char*>self.buf, self.size)

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        """The encoded bytes without a copy (read-only; what the segment pwrites), valid until
        the next build. A build that must grow the buffer while a view lives moves to a new
        one, so the view never dangles."""
        PyBuffer_FillInfo(buffer, self, <void*>self.buf, self.size, 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buffer):
        self.exports -= 1
        if self.exports == 0 and self.retired:
            for p in self.retired:
                free(<void*><size_t>p)
            self.retired = []

    def info(self, int64_t log_append_time):
        """The AppendInfo describing the last build()."""
        cdef AppendInfo a = AppendInfo.__new__(AppendInfo)
        a.first_offset = self.base_offset
        a.last_offset = self.last_offset
        a.max_timestamp = self.max_timestamp
        a.log_append_time = log_append_time
        a.record_count = self.count
        a.size = self.size
        return a

    def copy_to(self, Mapping m, Py_ssize_t pos):
        """memcpy the encoded batch into a writable mapping at pos (OSError: its file was cut)."""
        if not m.writable or pos < 0 or pos + self.size > m.length:
            raise ValueError(f"batch of {self.size} bytes at {pos} outside the writable "
                             f"mapping of {m.length}" if m.writable else "mapping is read-only")
        memcpy(<void*>(m.ptr() + pos), self.buf, self.size)
        m.check_written()

    def build(self, records, int magic, int64_t base_offset, int64_t now, bint log_append_time,
              int64_t ts_min, int64_t ts_max, bint require_key, int codec,
              int32_t leader_epoch=-1):
        """Encode `records` (list/tuple of (key, value[, ts[, headers]]) or Record) as one append.

        CreateTime timestamps must lie in [ts_min, ts_max]; a missing timestamp means `now`.
        Returns the record count (0 writes nothing).
        """
        cdef Py_ssize_t n
        cdef list keep = []
        cdef bint is_list
        if type(records) is list:
            is_list = True
            n = PyList_GET_SIZE(records)
        elif type(records) is tuple:
            is_list = False
            n = PyTuple_GET_SIZE(records)
        else:
            raise TypeError("records must be a list or tuple")
        self.size = 0
        self.count = n
        self.magic = magic
        self.base_offset = base_offset
        self.last_offset = base_offset + n - 1
        self.max_timestamp = NO_TIMESTAMP
        self.first_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.max_entry_size = 0
        if n == 0:
            return 0
        if codec < 0 or codec > 4 or (codec == 4 and magic < 2):
            raise UnsupportedCodecError(f"compression codec {codec} is not valid for magic {magic}")
        if magic == 2:
            self._build_v2(records, is_list, n, base_offset, now, log_append_time, ts_min, ts_max,
                           require_key, codec, leader_epoch, keep)
        elif magic == 1 or magic == 0:
            self._build_legacy(records, is_list, n, magic, base_offset, now, log_append_time,
                               ts_min, ts_max, require_key, codec, keep)
        else:
            raise ValueError(f"unknown magic {magic}")
        return n

    cdef tuple _unpack_slow(self, object item, Py_ssize_t i):
        cdef Record r
        if isinstance(item, Record):
            r = <Record>item
            return (r.key, r.value, None if r.timestamp < 0 else r.timestamp, r.headers)
        if isinstance(item, (tuple, list)) and 2 <= len(item) <= 4:
            t = tuple(item) + (None,) * (4 - len(item))
            return t
        if isinstance(item, (tuple, list)):
            raise InvalidRecordError(
                f"record {i}: expected (key, value[, timestamp[, headers]]), got {len(item)} fields")
        raise InvalidRecordError(
            f"record {i}: expected a (key, value[, timestamp[, headers]]) tuple or "
            f"kstore.Record, got {type(item).__name__}")

    cdef int64_t _timestamp(self, object ts_obj, Py_ssize_t i, int64_t now, bint lat,
                            int64_t ts_min, int64_t ts_max) except? -2:
        cdef int64_t ts
        if lat:
            return now
        if ts_obj is None:
            return now
        try:
            ts = ts_obj
        except (TypeError, OverflowError):
            raise InvalidRecordError(f"record {i}: timestamp must be an int (ms), got {ts_obj!r}")
        if ts < 0:
            raise InvalidRecordError(f"record {i}: timestamp {ts} is negative")
        _check_window(i, ts, ts_min, ts_max)
        return ts

    cdef list _headers(self, object headers, Py_ssize_t i):
        cdef list out = []
        if headers is None:
            return out
        try:
            it = list(headers)
        except TypeError:
            raise InvalidRecordError(f"record {i}: headers must be a sequence of (key, value)")
        for h in it:
            try:
                hk, hv = h
            except (TypeError, ValueError):
                raise InvalidRecordError(f"record {i}: header {h!r} is not a (key, value) pair")
            if isinstance(hk, str):
                hkb = (<str>hk).encode("utf-8")
            elif isinstance(hk, (bytes, bytearray, memoryview)):
                hkb = bytes(hk)
                try:
                    hkb.decode("utf-8")
                except UnicodeDecodeError:
                    raise InvalidRecordError(f"record {i}: header key {hk!r} is not UTF-8")
            else:
                raise InvalidRecordError(f"record {i}: header key must be str, got {type(hk).__name__}")
            if hv is None:
                hvb = None
            elif isinstance(hv, str):
                raise InvalidRecordError(f"record {i}: header value must be bytes or None, not str")
            else:
                try:
                    hvb = bytes(hv)
                except TypeError:
                    raise InvalidRecordError(
                        f"record {i}: header value must be bytes or None, got {type(hv).__name__}")
            out.append((hkb, hvb))
        return out

    cdef int _build_v2(self, object records, bint is_list, Py_ssize_t n, int64_t base_offset,
                       int64_t now, bint lat, int64_t ts_min, int64_t ts_max, bint require_key,
                       int codec, int32_t leader_epoch, list keep) except -1:
        """Encode the records after the 61-byte header. Runs of records of the plain shape
        (_record_input.plain_run: checked and written in C in one pass, no Python call, no
        reference count) alternate with single records of any other shape, and records that
        fail a check, which go through _put_v2_slow: it validates and raises exactly as
        before. Both write the same bytes."""
        cdef Py_ssize_t i = 0
        cdef PyObject** items = PySequence_Fast_ITEMS(records)
        cdef PlainRun st
        st.pos = V2_OVERHEAD
        st.need = 0
        st.base_ts = 0
        st.max_ts = NO_TIMESTAMP
        self._ensure(V2_OVERHEAD + 64)
        while i < n:
            i = plain_run(items, i, n, self.buf, self.cap, require_key, lat, now, ts_min, ts_max, &st)
            if i >= n:
                break
            if st.need:
                self._ensure(st.need)
                st.need = 0
                continue
            st.pos = self._put_v2_slow(<object>items[i], i, st.pos, now, lat, ts_min, ts_max,
                                       require_key, &st.base_ts, &st.max_ts, keep)
            i += 1
            # the general path may run Python code (buffers, headers) that changes the input
            items = PySequence_Fast_ITEMS(records)
            if PySequence_Fast_GET_SIZE(records) != n:
                raise RuntimeError("the records changed size during the append")
        return self._finish_v2(st.pos, n, base_offset, st.base_ts, st.max_ts, lat, codec, leader_epoch)

    cdef Py_ssize_t _put_v2_slow(self, object item, Py_ssize_t i, Py_ssize_t pos, int64_t now,
                                 bint lat, int64_t ts_min, int64_t ts_max, bint require_key,
                                 int64_t* base_ts, int64_t* max_ts, list keep) except -1:
        """Record i of any accepted shape (Record, list, other bytes-likes, headers), with every
        check and error message; returns the position after it."""
        cdef Py_ssize_t klen, vlen, hcount, j, L, hbytes, body
        cdef const uint8_t* kp
        cdef const uint8_t* vp
        cdef object key, value, ts_obj, headers
        cdef int64_t ts
        cdef list hdrs
        cdef bytes hk, hv
        if type(item) is tuple and 2 <= PyTuple_GET_SIZE(item) <= 4:
            L = PyTuple_GET_SIZE(item)
            key = <object>PyTuple_GET_ITEM(item, 0)
            value = <object>PyTuple_GET_ITEM(item, 1)
            ts_obj = <object>PyTuple_GET_ITEM(item, 2) if L > 2 else None
            headers = <object>PyTuple_GET_ITEM(item, 3) if L > 3 else None
        else:
            key, value, ts_obj, headers = self._unpack_slow(item, i)
        _key_value(i, key, value, require_key, &kp, &klen, &vp, &vlen, keep)
        ts = self._timestamp(ts_obj, i, now, lat, ts_min, ts_max)
        if i == 0:
            base_ts[0] = ts
        if ts > max_ts[0]:
            max_ts[0] = ts
        hcount = 0
        hdrs = None
        if headers is not None and (type(headers) is not tuple or PyTuple_GET_SIZE(headers) != 0):
            hdrs = self._headers(headers, i)
            hcount = len(hdrs)
        hbytes = 0
        for j in range(hcount):
            hk = hdrs[j][0]
            hv = hdrs[j][1]
            hbytes += blob_size(len(hk)) + blob_size(-1 if hv is None else len(hv))
        body = record_body_size(ts - base_ts[0], i, klen, vlen, hcount, hbytes)
        self._ensure(pos + body + 10)
        pos = put_record_head(self.buf, pos, body, ts - base_ts[0], i, kp, klen, vp, vlen, hcount)
        for j in range(hcount):
            hk = hdrs[j][0]
            hv = hdrs[j][1]
            pos = put_blob(self.buf, pos, <const uint8_t*>PyBytes_AS_STRING(hk), len(hk))
            if hv is None:
                pos = put_varint(self.buf, pos, -1)
            else:
                pos = put_blob(self.buf, pos, <const uint8_t*>PyBytes_AS_STRING(hv), len(hv))
        if len(keep) > 64:
            del keep[:]
        return pos

    cdef int _finish_v2(self, Py_ssize_t pos, Py_ssize_t n, int64_t base_offset, int64_t base_ts,
                        int64_t max_ts, bint lat, int codec, int32_t leader_epoch) except -1:
        """Compress the records region (self.buf[61:pos]) if asked, then write the v2 batch
        header and its CRC-32C."""
        cdef uint32_t crc
        cdef int16_t attrs
        if codec != 0:
            raw = PyBytes_FromStringAndSize(<char*>self.buf + V2_OVERHEAD, pos - V2_OVERHEAD)
            comp = compress(codec, raw, self.compression_level, 2)
            self._ensure(V2_OVERHEAD + len(comp))
            memcpy(self.buf + V2_OVERHEAD, PyBytes_AS_STRING(comp), len(comp))
            pos = V2_OVERHEAD + len(comp)
        self.size = 0
        self.count = n
        self.magic = 2
        self.base_offset = base_offset
        self.last_offset = base_offset + n - 1
        attrs = <int16_t>(codec | (TS_TYPE_BIT if lat else 0))
        st64(self.buf, <uint64_t>base_offset)
        st32(self.buf + 8, <uint32_t>(pos - LOG_OVERHEAD))
        st32(self.buf + 12, <uint32_t>leader_epoch)
        self.buf[16] = 2
        st16(self.buf + 21, <uint16_t>attrs)
        st32(self.buf + 23, <uint32_t>(n - 1))
        st64(self.buf + 27, <uint64_t>base_ts)
        st64(self.buf + 35, <uint64_t>max_ts)
        st64(self.buf + 43, <uint64_t>(-1))    # producerId
        st16(self.buf + 51, <uint16_t>(-1))    # producerEpoch
        st32(self.buf + 53, <uint32_t>(-1))    # baseSequence
        st32(self.buf + 57, <uint32_t>n)
        with nogil:
            crc = crc32c_update(0, self.buf + 21, pos - 21)
        st32(self.buf + 17, crc)
        self.size = pos
        self.max_entry_size = pos
        self.max_timestamp = max_ts
        self.first_timestamp = base_ts
        # Kafka (3.8+) indexes the batch's last offset for its max timestamp ("shallow" offset)
        self.offset_of_max_timestamp = base_offset + n - 1
        return 0

    def build_columns(self, Py_ssize_t start, Py_ssize_t stop, ColumnInput cols,
                      int64_t base_offset, int64_t now, bint log_append_time, int64_t ts_min,
                      int64_t ts_max, bint require_key, int codec, int32_t leader_epoch=-1):
        """Encode rows [start, stop) of columnar input (Arrow-layout buffers, see ColumnInput)
        as one v2 batch, with build()'s validation and no per-record Python objects.
        Returns the record count."""
        cdef Py_ssize_t n = stop - start, i, pos, body, j, h0, h1, hk, klen, vlen, hcount, hbytes
        cdef int64_t ts, base_ts = 0, max_ts = NO_TIMESTAMP
        self.size = 0
        self.count = 0
        self.magic = 2
        self.base_offset = base_offset
        self.last_offset = base_offset - 1
        self.max_timestamp = NO_TIMESTAMP
        self.first_timestamp = NO_TIMESTAMP
        self.offset_of_max_timestamp = -1
        self.max_entry_size = 0
        if start < 0 or stop > cols.n or n < 0:
            raise ValueError(f"rows [{start}, {stop}) outside the {cols.n} input rows")
        if n == 0:
            return 0
        if codec < 0 or codec > 4:
            raise UnsupportedCodecError(f"compression codec {codec} is not valid")
        if n - 1 > INT32_MAX:
            raise InvalidRecordError("too many records for one batch")
        self._ensure(V2_OVERHEAD + 64)
        pos = V2_OVERHEAD
        for i in range(start, stop):
            klen = cols.key_len(i)
            vlen = cols.value_len(i)
            if require_key and klen < 0:
                raise InvalidRecordError(
                    f"record {i}: compacted topics (cleanup.policy=compact) require a key")
            if log_append_time or cols.ts_n == 0 or cols.ts[i] < 0:
                ts = now
            else:
                ts = cols.ts[i]
                _check_window(i, ts, ts_min, ts_max)
            if i == start:
                base_ts = ts
            if ts > max_ts:
                max_ts = ts
            h0 = h1 = 0
            if cols.hoff_n:
                h0 = cols.hoff[i]
                h1 = cols.hoff[i + 1]
                if cols.hval_n and not cols.hval[i]:
                    h1 = h0
            hcount = h1 - h0
            hbytes = 0
            for j in range(h0, h1):
                hk = cols.hk_len(j)
                if hk < 0:
                    raise InvalidRecordError(f"record {i}: a header key is null")
                hbytes += blob_size(hk) + blob_size(cols.hv_len(j))
            body = record_body_size(ts - base_ts, i - start, klen, vlen, hcount, hbytes)
            self._ensure(pos + body + 10)
            pos = put_record_head(self.buf, pos, body, ts - base_ts, i - start,
                                   cols.kdat + (cols.koff[i] if klen > 0 else 0), klen,
                                   cols.vdat + (cols.voff[i] if vlen > 0 else 0), vlen, hcount)
            for j in range(h0, h1):
                pos = put_blob(self.buf, pos, cols.hkdat + cols.hkoff[j], cols.hk_len(j))
                pos = put_blob(self.buf, pos, cols.hvdat + cols.hvoff[j], cols.hv_len(j))
        self._finish_v2(pos, n, base_offset, base_ts, max_ts, log_append_time, codec, leader_epoch)
        return n

    def load_batch(self, data, Py_ssize_t pos, int64_t new_base_offset, int64_t log_append_time=-1,
                   int32_t leader_epoch=-1):
        """Take the v2 batch at data[pos:] (e.g. staged by build_columns) as this builder's
        append: CRC checked, base offset reassigned (outside the CRC, as a broker assigns
        offsets in place), for leader_epoch >= 0 the partition leader epoch set (outside the
        CRC too) and, for log_append_time >= 0, the LogAppendTime type and max timestamp set
        and the CRC recomputed. Returns the batch's size."""
        cdef const uint8_t[::1] mv = data
        cdef Py_ssize_t n = mv.shape[0]
        cdef const uint8_t* p = &mv[0] if n else &_empty_byte
        cdef BatchHeader h
        cdef const char* why
        cdef uint32_t s, c
        cdef int hs
        if pos < 0 or pos > n:
            raise ValueError(f"position {pos} outside {n} bytes")
        hs = parse_header(p, pos, n, &h, &why)
        if hs != H_OK:
            raise corrupt(f"staged batch: {why.decode('ascii') if hs != H_END or pos < n else 'no batch'}", pos)
        if h.magic != 2:
            raise corrupt(f"staged batch has magic {h.magic}; only v2 batches can be re-based", pos)
        if h.count != h.last_offset - h.base_offset + 1:
            raise corrupt(f"staged batch has {h.count} records for {h.last_offset - h.base_offset + 1} offsets", pos)
        if not crc_ok(p, pos, &h, &s, &c):
            raise corrupt(f"CRC mismatch in a staged batch (stored {s:#010x}, computed {c:#010x})", pos)
        self._ensure(h.size)
        memcpy(self.buf, p + pos, h.size)
        st64(self.buf, <uint64_t>new_base_offset)
        if leader_epoch >= 0:
            st32(self.buf + 12, <uint32_t>leader_epoch)
        self.max_timestamp = h.max_timestamp
        if log_append_time >= 0:
            st16(self.buf + 21, <uint16_t>(h.attrs | TS_TYPE_BIT))
            st64(self.buf + 35, <uint64_t>log_append_time)
            self.max_timestamp = log_append_time
            st32(self.buf + 17, crc32c_update(0, self.buf + 21, h.size - 21))
        self.size = h.size
        self.count = h.count
        self.magic = 2
        self.base_offset = new_base_offset
        self.last_offset = new_base_offset + h.count - 1
        self.first_timestamp = h.base_timestamp
        self.max_entry_size = h.size
        self.offset_of_max_timestamp = self.last_offset
        return h.size

    cdef Py_ssize_t _put_legacy(self, Py_ssize_t pos, int magic, int64_t offset, int attrs,
                                int64_t ts, const uint8_t* kp, Py_ssize_t klen,
                                const uint8_t* vp, Py_ssize_t vlen) except -1:
        cdef Py_ssize_t size = (V1_OVERHEAD if magic == 1 else V0_OVERHEAD) + \
            (klen if klen > 0 else 0) + (vlen if vlen > 0 else 0)
        cdef Py_ssize_t start = pos
        cdef uint32_t crc
        self._ensure(pos + LOG_OVERHEAD + size)
        st64(self.buf + pos, <uint64_t>offset)
        st32(self.buf + pos + 8, <uint32_t>size)
        pos += 16
        self.buf[pos] = <uint8_t>magic
        self.buf[pos + 1] = <uint8_t>attrs
        pos += 2
        if magic == 1:
            st64(self.buf + pos, <uint64_t>ts)
            pos += 8
        st32(self.buf + pos, <uint32_t>klen)
        pos += 4
        if klen > 0:
            memcpy(self.buf + pos, kp, klen)
            pos += klen
        st32(self.buf + pos, <uint32_t>vlen)
        pos += 4
        if vlen > 0:
            memcpy(self.buf + pos, vp, vlen)
            pos += vlen
        crc = crc32_update(0, self.buf + start + 16, pos - start - 16)
        st32(self.buf + start + 12, crc)
        if pos - start > self.max_entry_size:
            self.max_entry_size = pos - start
        return pos

    cdef int _build_legacy(self, object records, bint is_list, Py_ssize_t n, int magic,
                           int64_t base_offset, int64_t now, bint lat, int64_t ts_min,
                           int64_t ts_max, bint require_key, int codec, list keep) except -1:
        cdef Py_ssize_t i, pos = 0, klen, vlen, L
        cdef const uint8_t* kp
        cdef const uint8_t* vp
        cdef object item, key, value, ts_obj, headers
        cdef int64_t ts, max_ts = NO_TIMESTAMP, off, off_max = -1, first_ts = NO_TIMESTAMP
        cdef int attrs = (TS_TYPE_BIT if (lat and magic == 1) else 0)
        for i in range(n):
            item = <object>(PyList_GET_ITEM(records, i) if is_list else PyTuple_GET_ITEM(records, i))
            if type(item) is tuple and 2 <= PyTuple_GET_SIZE(item) <= 4:
                L = PyTuple_GET_SIZE(item)
                key = <object>PyTuple_GET_ITEM(item, 0)
                value = <object>PyTuple_GET_ITEM(item, 1)
                ts_obj = <object>PyTuple_GET_ITEM(item, 2) if L > 2 else None
                headers = <object>PyTuple_GET_ITEM(item, 3) if L > 3 else None
            else:
                key, value, ts_obj, headers = self._unpack_slow(item, i)
            if headers is not None and len(headers) != 0:
                raise InvalidRecordError(
                    f"record {i}: headers need message format v2 (this topic writes v{magic})")
            _key_value(i, key, value, require_key, &kp, &klen, &vp, &vlen, keep)
            if magic == 1:
                ts = self._timestamp(ts_obj, i, now, lat, ts_min, ts_max)
            else:
                ts = NO_TIMESTAMP
            if i == 0:
                first_ts = ts
            if ts > max_ts:
                max_ts = ts
                off_max = base_offset + i
            # compressed: inner offsets are relative (v1) or absolute (v0)
            if codec == 0:
                off = base_offset + i
            else:
                off = i if magic == 1 else base_offset + i
            pos = self._put_legacy(pos, magic, off, attrs, ts, kp, klen, vp, vlen)
            if len(keep) > 64:
                del keep[:]
        if codec != 0:
            raw = PyBytes_FromStringAndSize(<char*>self.buf, pos)
            comp = compress(codec, raw, self.compression_level, magic)
            self.max_entry_size = 0
            wrapper_ts = now if lat else max_ts
            pos = self._put_legacy(0, magic, base_offset + n - 1, attrs | codec, wrapper_ts,
                                   NULL, -1, <const uint8_t*>PyBytes_AS_STRING(comp), len(comp))
            if lat:
                max_ts = now
        self.size = pos
        self.max_timestamp = max_ts
        self.first_timestamp = first_ts
        self.offset_of_max_timestamp = (base_offset + n - 1) if codec != 0 else off_max
        return 0
