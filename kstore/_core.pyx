# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""kstore's compiled core: the loops that touch segment and index bytes.

Everything here treats bytes from disk as hostile: every length and offset read from a file is
checked against the bounds of the buffer before it is used, and malformed input raises
``kstore.CorruptRecordError`` (never IndexError, struct.error or a crash).  Byte layouts are
Kafka's (docs/format.md); all integers on disk are big-endian.
"""
cimport cython
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int16_t, int32_t, int64_t, uintptr_t
from libc.string cimport memcpy, memset, memcmp, memchr
from libc.stdlib cimport malloc, realloc, free
from libc.errno cimport errno
from posix.mman cimport mmap, munmap, msync, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FAILED, MS_SYNC
from posix.unistd cimport sysconf, _SC_PAGESIZE
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.buffer cimport PyBuffer_FillInfo, PyObject_GetBuffer, PyBuffer_Release, PyBUF_SIMPLE, PyObject_CheckBuffer
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_GET_ITEM
from cpython.unicode cimport PyUnicode_DecodeUTF8
from cpython.long cimport PyLong_FromLongLong

import os
import numpy as np

from kstore.errors import (CorruptRecordError, InvalidRecordError, UnsupportedCodecError,
                           RecordTooLargeError)

cdef extern from "_kstore.h" nogil:
    uint32_t ks_crc32c(uint32_t crc, const unsigned char *p, size_t n)
    uint32_t ks_crc32c_table(uint32_t crc, const unsigned char *p, size_t n)
    uint32_t ks_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
    uint32_t ks_crc32(uint32_t crc, const unsigned char *p, size_t n)
    void ks_fill_tables(uint32_t t[8][256], const uint32_t *base)
    void ks_init_shift()
    int ks_cpu_has_crc32c()
    uint32_t ks_crc32c_tab[8][256]
    uint32_t ks_crc32_tab[8][256]
    int ks_crc32c_use_hw
    int KS_HAVE_HW_CRC

cdef enum:
    LOG_OVERHEAD = 12
    HEADER_UP_TO_MAGIC = 17
    V2_OVERHEAD = 61
    V0_OVERHEAD = 14
    V1_OVERHEAD = 22
    INT32_MAX = 2147483647
    NO_TIMESTAMP = -1
    CODEC_MASK = 7
    TS_TYPE_BIT = 8
    TXN_BIT = 16
    CONTROL_BIT = 32
    HORIZON_BIT = 64
    H_OK = 0
    H_END = 1
    H_CORRUPT = 2
    R_END = 0
    R_CORRUPT = 1
    R_CRC = 2
    R_OFFSET_ORDER = 3
    R_OVERFLOW = 4
    R_BELOW_BASE = 5
    R_PAST_NEXT = 6

# ---------------------------------------------------------------------------------------------
# Format constants (Kafka: LOG_OVERHEAD, RECORD_BATCH_OVERHEAD, LegacyRecord overheads)
# ---------------------------------------------------------------------------------------------
LOG_OVERHEAD_ = LOG_OVERHEAD
RECORD_BATCH_OVERHEAD = V2_OVERHEAD
OFFSET_ENTRY_SIZE = 8
TIME_ENTRY_SIZE = 12
OFFSET_WARM_ENTRIES = 8192 // 8
TIME_WARM_ENTRIES = 8192 // 12

# attribute bits
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

# Python-level codec hooks, installed by kstore.compression at import.
_decompress = None
_compress = None

def _set_codecs(decompress, compress):
    global _decompress, _compress
    _decompress = decompress
    _compress = compress

# ---------------------------------------------------------------------------------------------
# Big-endian loads / stores and zig-zag varints
# ---------------------------------------------------------------------------------------------
cdef inline int32_t ld32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3])

cdef inline uint32_t ldu32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]

cdef inline int16_t ld16(const uint8_t* p) noexcept nogil:
    return <int16_t>((<uint16_t>p[0] << 8) | <uint16_t>p[1])

cdef inline int64_t ld64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t>ldu32(p) << 32) | <uint64_t>ldu32(p + 4))

cdef inline void st32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 24); p[1] = <uint8_t>(v >> 16); p[2] = <uint8_t>(v >> 8); p[3] = <uint8_t>v

cdef inline void st16(uint8_t* p, uint16_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 8); p[1] = <uint8_t>v

cdef inline void st64(uint8_t* p, uint64_t v) noexcept nogil:
    st32(p, <uint32_t>(v >> 32)); st32(p + 4, <uint32_t>v)

@cython.overflowcheck(False)    # zig-zag / hashing wrap on purpose
cdef inline int varint_size(int64_t v) noexcept nogil:
    cdef uint64_t u = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    cdef int n = 1
    while u >= 0x80:
        u >>= 7
        n += 1
    return n

@cython.overflowcheck(False)    # zig-zag / hashing wrap on purpose
cdef inline Py_ssize_t put_varint(uint8_t* p, Py_ssize_t pos, int64_t v) noexcept nogil:
    cdef uint64_t u = (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)
    while u >= 0x80:
        p[pos] = <uint8_t>((u & 0x7f) | 0x80)
        pos += 1
        u >>= 7
    p[pos] = <uint8_t>u
    return pos + 1

@cython.overflowcheck(False)    # zig-zag / hashing wrap on purpose
cdef inline Py_ssize_t get_varlong(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, int64_t* out,
                                   int max_bytes) noexcept nogil:
    """Decode a zig-zag varint at pos; returns the next position or -1 if malformed/truncated."""
    cdef uint64_t u = 0
    cdef int shift = 0
    cdef int n = 0
    cdef uint8_t b
    while True:
        if pos >= end or n >= max_bytes:
            return -1
        b = p[pos]
        pos += 1
        n += 1
        u |= (<uint64_t>(b & 0x7f)) << shift
        if b < 0x80:
            break
        shift += 7
    out[0] = <int64_t>(u >> 1) ^ -(<int64_t>(u & 1))
    return pos

cdef inline Py_ssize_t _blob_size(Py_ssize_t n) noexcept nogil:
    """Encoded size of a varint length and its bytes (n = -1: null, the length alone)."""
    return varint_size(n) + (n if n > 0 else 0)

cdef inline Py_ssize_t _put_blob(uint8_t* b, Py_ssize_t pos, const uint8_t* p,
                                 Py_ssize_t n) noexcept nogil:
    pos = put_varint(b, pos, n)
    if n > 0:
        memcpy(b + pos, p, n)
        pos += n
    return pos

cdef inline Py_ssize_t _record_body_size(int64_t ts_delta, int64_t off_delta, Py_ssize_t klen,
                                         Py_ssize_t vlen, Py_ssize_t hcount,
                                         Py_ssize_t header_bytes) noexcept nogil:
    """A v2 record's size after its length varint; header_bytes = the headers' blobs."""
    return 1 + varint_size(ts_delta) + varint_size(off_delta) + _blob_size(klen) + \
        _blob_size(vlen) + varint_size(hcount) + header_bytes

cdef inline Py_ssize_t _put_record_head(uint8_t* b, Py_ssize_t pos, Py_ssize_t body,
                                        int64_t ts_delta, int64_t off_delta, const uint8_t* kp,
                                        Py_ssize_t klen, const uint8_t* vp, Py_ssize_t vlen,
                                        Py_ssize_t hcount) noexcept nogil:
    """A v2 record up to its header count; the headers follow as key/value blob pairs."""
    pos = put_varint(b, pos, body)
    b[pos] = 0                      # attributes
    pos = put_varint(b, pos + 1, ts_delta)
    pos = put_varint(b, pos, off_delta)
    pos = _put_blob(b, pos, kp, klen)
    pos = _put_blob(b, pos, vp, vlen)
    return put_varint(b, pos, hcount)

# ---------------------------------------------------------------------------------------------
# CRC
# ---------------------------------------------------------------------------------------------
cdef bint _crc_ready = False

def _init_crc_tables(crc32c_table, crc32_table):
    """Seed the slice-by-8 tables from crcmod's CRC-32C and CRC-32 definitions."""
    global _crc_ready, ks_crc32c_use_hw
    cdef uint32_t base[256]
    cdef int i
    if len(crc32c_table) != 256 or len(crc32_table) != 256:
        raise ValueError("CRC tables must have 256 entries")
    for i in range(256):
        base[i] = crc32c_table[i]
    ks_fill_tables(ks_crc32c_tab, base)
    for i in range(256):
        base[i] = crc32_table[i]
    ks_fill_tables(ks_crc32_tab, base)
    ks_init_shift()
    _crc_ready = True
    ks_crc32c_use_hw = 1 if (KS_HAVE_HW_CRC and ks_cpu_has_crc32c()) else 0

def crc32c_implementation():
    """'sse4.2' when the CPU's crc32 instruction is in use, else 'table'."""
    return "sse4.2" if ks_crc32c_use_hw else "table"

def _force_table_crc(bint force):
    """Test hook: use the table path even where the instruction exists."""
    global ks_crc32c_use_hw
    ks_crc32c_use_hw = 0 if force else (1 if (KS_HAVE_HW_CRC and ks_cpu_has_crc32c()) else 0)

def crc32c(data, uint32_t value=0):
    """CRC-32C (Castagnoli) of a bytes-like object; chainable like zlib.crc32."""
    cdef const uint8_t[::1] mv = data
    cdef uint32_t r
    with nogil:
        r = ks_crc32c(value, &mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])
    return r

def crc32c_table(data, uint32_t value=0):
    """CRC-32C through the software table only (the fallback path)."""
    cdef const uint8_t[::1] mv = data
    cdef uint32_t r
    with nogil:
        r = ks_crc32c_table(value, &mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])
    return r

def crc32c_hw(data, uint32_t value=0):
    """CRC-32C through the crc32 instruction; raises RuntimeError if the CPU lacks it."""
    if not (KS_HAVE_HW_CRC and ks_cpu_has_crc32c()):
        raise RuntimeError("this CPU/build has no crc32 instruction")
    cdef const uint8_t[::1] mv = data
    cdef uint32_t r
    with nogil:
        r = ks_crc32c_hw(value, &mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])
    return r

def crc32(data, uint32_t value=0):
    """CRC-32 (IEEE, as zlib.crc32): the checksum of Kafka v0/v1 messages."""
    cdef const uint8_t[::1] mv = data
    cdef uint32_t r
    with nogil:
        r = ks_crc32(value, &mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])
    return r

# ---------------------------------------------------------------------------------------------
# Mapping: a shared mmap of a file, with buffer exports counted so close() never unmaps
# memory that a view, a numpy array or a running nogil scan still uses.
# ---------------------------------------------------------------------------------------------
cdef uint8_t _empty_byte = 0
cdef Py_ssize_t PAGE = sysconf(_SC_PAGESIZE)

cdef class Mapping:
    """A MAP_SHARED mapping of the first `length` bytes of a file descriptor.

    The mapping may be longer than the file (the segment writer maps `segment.bytes` and grows the
    file underneath with fallocate); callers must only touch bytes below the file's length.
    Views (memoryview, numpy.frombuffer) keep the memory mapped after close() until released.
    """
    cdef uint8_t* addr
    cdef readonly Py_ssize_t length
    cdef readonly bint writable
    cdef int exports
    cdef int pins
    cdef bint closing

    def __cinit__(self, int fd, Py_ssize_t length, bint writable=False):
        cdef void* p
        cdef int prot = PROT_READ
        self.addr = NULL
        self.length = 0
        self.writable = writable
        if length < 0:
            raise ValueError("negative mapping length")
        if length > 0:
            if writable:
                prot = prot | PROT_WRITE
            p = mmap(NULL, <size_t>length, prot, MAP_SHARED, fd, 0)
            if p == MAP_FAILED:
                e = errno
                raise OSError(e, os.strerror(e))
            self.addr = <uint8_t*>p
            self.length = length

    @staticmethod
    def from_bytes(data):
        """A read-only Mapping holding a private anonymous copy of data (used where a file may
        shrink under us, e.g. a read-only view of another process's active index)."""
        cdef const uint8_t[::1] mv = data
        cdef Py_ssize_t n = mv.shape[0]
        cdef Mapping m = Mapping.__new__(Mapping, -1, 0, False)
        cdef void* p
        if n > 0:
            p = mmap(NULL, <size_t>n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
            if p == MAP_FAILED:
                e = errno
                raise OSError(e, os.strerror(e))
            memcpy(p, &mv[0], n)
            m.addr = <uint8_t*>p
            m.length = n
        return m

    cdef inline void _unmap(self) noexcept:
        if self.addr != NULL:
            munmap(self.addr, <size_t>self.length)
            self.addr = NULL

    cdef inline void pin(self) noexcept:
        self.pins += 1

    cdef inline void unpin(self) noexcept:
        self.pins -= 1
        if self.closing and self.pins == 0 and self.exports == 0:
            self._unmap()

    cdef inline const uint8_t* ptr(self) except NULL:
        if self.closing:
            raise ValueError("mapping is closed")
        if self.addr == NULL:
            return &_empty_byte
        return self.addr

    @property
    def closed(self):
        return self.closing

    @property
    def in_use(self):
        """True while views or scans still hold the memory."""
        return self.exports > 0 or self.pins > 0

    def close(self):
        """Unmap now, or as soon as the last view is released."""
        self.closing = True
        if self.exports == 0 and self.pins == 0:
            self._unmap()

    def __dealloc__(self):
        if self.addr != NULL:
            munmap(self.addr, <size_t>self.length)
            self.addr = NULL

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        if self.closing:
            raise BufferError("mapping is closed")
        PyBuffer_FillInfo(buffer, self, <void*>(self.addr if self.addr != NULL else &_empty_byte),
                          self.length, 0 if self.writable else 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buffer):
        self.exports -= 1
        if self.closing and self.exports == 0 and self.pins == 0:
            self._unmap()

    def flush(self, Py_ssize_t start=0, Py_ssize_t end=-1):
        """msync(MS_SYNC) the pages covering [start, end)."""
        cdef Py_ssize_t a, b
        cdef int rc
        if self.addr == NULL:
            return
        if end < 0 or end > self.length:
            end = self.length
        if start < 0:
            start = 0
        if end <= start:
            return
        a = (start // PAGE) * PAGE
        b = end
        with nogil:
            rc = msync(self.addr + a, <size_t>(b - a), MS_SYNC)
        if rc != 0:
            e = errno
            raise OSError(e, os.strerror(e))

    def write(self, Py_ssize_t pos, data):
        """Copy a bytes-like object into the mapping at pos (bounds-checked)."""
        cdef const uint8_t[::1] mv = data
        cdef Py_ssize_t n = mv.shape[0]
        if not self.writable:
            raise ValueError("mapping is read-only")
        if pos < 0 or pos + n > self.length:
            raise ValueError(f"write of {n} bytes at {pos} outside mapping of {self.length}")
        if n:
            memcpy(<void*>(self.ptr() + pos), &mv[0], n)

    def zero(self, Py_ssize_t start, Py_ssize_t end):
        """Zero [start, end) (used to wipe a truncated tail in place)."""
        if not self.writable:
            raise ValueError("mapping is read-only")
        if start < 0 or end > self.length or start > end:
            raise ValueError("zero range outside mapping")
        if end > start:
            memset(<void*>(self.ptr() + start), 0, end - start)

    def read(self, Py_ssize_t pos, Py_ssize_t n):
        """Copy n bytes at pos out as bytes."""
        if pos < 0 or n < 0 or pos + n > self.length:
            raise ValueError(f"read of {n} bytes at {pos} outside mapping of {self.length}")
        return PyBytes_FromStringAndSize(<const char*>(self.ptr() + pos), n)

    def is_zero(self, Py_ssize_t start, Py_ssize_t end):
        """True if every byte in [start, end) is zero."""
        cdef const uint8_t* p = self.ptr()
        cdef Py_ssize_t i
        if start < 0 or end > self.length:
            raise ValueError("range outside mapping")
        for i in range(start, end):
            if p[i] != 0:
                return False
        return True

# ---------------------------------------------------------------------------------------------
# Record, AppendInfo
# ---------------------------------------------------------------------------------------------
cdef tuple _EMPTY = ()

@cython.freelist(512)
@cython.no_gc
cdef class Record:
    """One record: offset, timestamp (ms, -1 if none), key, value (None = tombstone), headers.

    As an input to Log.append only key, value, timestamp and headers matter; offset is -1.
    """
    cdef readonly int64_t offset
    cdef readonly int64_t timestamp
    cdef readonly object key
    cdef readonly object value
    cdef readonly tuple headers
    cdef readonly int timestamp_type     # 0 CreateTime, 1 LogAppendTime, -1 none

    def __init__(self, key, value, timestamp=None, headers=None, *, int64_t offset=-1,
                 int timestamp_type=0):
        self.key = key
        self.value = value
        self.timestamp = -1 if timestamp is None else timestamp
        self.headers = _EMPTY if not headers else tuple(tuple(h) for h in headers)
        self.offset = offset
        self.timestamp_type = timestamp_type if timestamp is not None else -1

    def __repr__(self):
        return (f"Record(offset={self.offset}, timestamp={self.timestamp}, key={self.key!r}, "
                f"value={self.value!r}, headers={list(self.headers)!r})")

    def __eq__(self, other):
        if not isinstance(other, Record):
            return NotImplemented
        cdef Record o = other
        return (self.offset == o.offset and self.timestamp == o.timestamp and self.key == o.key
                and self.value == o.value and self.headers == o.headers)

    def __hash__(self):
        return hash((self.offset, self.timestamp, self.key, self.value, self.headers))

    def __reduce__(self):
        return (_make_record, (self.offset, self.timestamp, self.key, self.value, self.headers,
                               self.timestamp_type))

def _make_record(offset, timestamp, key, value, headers, timestamp_type):
    cdef Record r = Record.__new__(Record)
    r.offset = offset
    r.timestamp = timestamp
    r.key = key
    r.value = value
    r.headers = headers
    r.timestamp_type = timestamp_type
    return r

@cython.freelist(64)
@cython.no_gc
cdef class AppendInfo:
    """What an append did: offsets assigned, timestamps, size on disk."""
    cdef readonly int64_t first_offset
    cdef readonly int64_t last_offset
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t log_append_time    # -1 unless message.timestamp.type=LogAppendTime
    cdef readonly Py_ssize_t record_count
    cdef readonly Py_ssize_t size

    def __repr__(self):
        return (f"AppendInfo(first_offset={self.first_offset}, last_offset={self.last_offset}, "
                f"max_timestamp={self.max_timestamp}, log_append_time={self.log_append_time}, "
                f"record_count={self.record_count}, size={self.size})")

def empty_append_info(int64_t next_offset):
    """AppendInfo of an append with no records (nothing written)."""
    cdef AppendInfo a = AppendInfo.__new__(AppendInfo)
    a.first_offset = next_offset
    a.last_offset = next_offset - 1
    a.max_timestamp = NO_TIMESTAMP
    a.log_append_time = -1
    a.record_count = 0
    a.size = 0
    return a

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

# ---------------------------------------------------------------------------------------------
# Columnar input for BatchBuilder.build_columns (Arrow-layout buffers, no per-record objects)
# ---------------------------------------------------------------------------------------------
cdef const int32_t* _check_offsets(object offsets, Py_ssize_t n, Py_ssize_t data_len, str what,
                                   list keep) except? NULL:
    cdef const int32_t[::1] o = offsets
    cdef Py_ssize_t i
    if o.shape[0] != n + 1:
        raise ValueError(f"{what}: {o.shape[0]} offsets for {n} entries (need {n + 1})")
    if o[0] < 0 or o[n] > data_len:
        raise ValueError(f"{what}: offsets [{o[0]}, {o[n]}] run outside {data_len} data bytes")
    for i in range(n):
        if o[i + 1] < o[i]:
            raise ValueError(f"{what}: offsets decrease at entry {i}")
    keep.append(o)
    return &o[0]

cdef const uint8_t* _data_ptr(object data, list keep) except? NULL:
    cdef const uint8_t[::1] d = data
    keep.append(d)
    return &d[0] if d.shape[0] else &_empty_byte

cdef const uint8_t* _valid_ptr(object valid, Py_ssize_t n, str what, list keep) except? NULL:
    if valid is None:
        return NULL
    cdef const uint8_t[::1] v = valid
    if v.shape[0] != n:
        raise ValueError(f"{what}: {v.shape[0]} validity entries for {n} rows")
    keep.append(v)
    return &v[0] if n else &_empty_byte


cdef class ColumnInput:
    """Records as columns for BatchBuilder.build_columns. key / value: None (all null) or
    (offsets int32[n+1], data, valid uint8[n] or None); timestamps: None or int64[n] ms (< 0
    means "now"); headers: None or (list offsets int32[n+1], list valid uint8[n] or None, key
    offsets int32[m+1], key data, value offsets int32[m+1], value data, value valid uint8[m] or
    None). Offsets index their data as in Arrow; all are checked here, once."""
    cdef readonly Py_ssize_t n
    cdef list _keep
    cdef const int32_t* koff
    cdef const uint8_t* kdat
    cdef const uint8_t* kval
    cdef const int32_t* voff
    cdef const uint8_t* vdat
    cdef const uint8_t* vval
    cdef const int64_t* ts
    cdef Py_ssize_t ts_n
    cdef const int32_t* hoff
    cdef Py_ssize_t hoff_n
    cdef const uint8_t* hval
    cdef Py_ssize_t hval_n
    cdef const int32_t* hkoff
    cdef const uint8_t* hkdat
    cdef const int32_t* hvoff
    cdef const uint8_t* hvdat
    cdef const uint8_t* hvval

    def __init__(self, Py_ssize_t n, key=None, value=None, timestamps=None, headers=None):
        cdef const int64_t[::1] t
        cdef const int32_t[::1] ho
        cdef Py_ssize_t m, i
        if n < 0:
            raise ValueError("negative row count")
        self.n = n
        self._keep = []
        if key is not None:
            self.kdat = _data_ptr(key[1], self._keep)
            self.koff = _check_offsets(key[0], n, memoryview(key[1]).nbytes, "key", self._keep)
            self.kval = _valid_ptr(key[2], n, "key", self._keep)
        if value is not None:
            self.vdat = _data_ptr(value[1], self._keep)
            self.voff = _check_offsets(value[0], n, memoryview(value[1]).nbytes, "value", self._keep)
            self.vval = _valid_ptr(value[2], n, "value", self._keep)
        if timestamps is not None:
            t = timestamps
            if t.shape[0] != n:
                raise ValueError(f"timestamps: {t.shape[0]} entries for {n} rows")
            self._keep.append(t)
            self.ts = &t[0] if n else NULL
            self.ts_n = n
        if headers is not None:
            lo, lv, hko, hkd, hvo, hvd, hvv = headers
            ho = lo
            if ho.shape[0] != n + 1:
                raise ValueError(f"headers: {ho.shape[0]} list offsets for {n} rows")
            m = ho[n]
            self.hoff = _check_offsets(lo, n, m, "headers", self._keep)
            self.hoff_n = n + 1
            self.hval = _valid_ptr(lv, n, "headers", self._keep)
            self.hval_n = n if lv is not None else 0
            self.hkdat = _data_ptr(hkd, self._keep)
            self.hkoff = _check_offsets(hko, m, memoryview(hkd).nbytes, "header keys", self._keep)
            self.hvdat = _data_ptr(hvd, self._keep)
            self.hvoff = _check_offsets(hvo, m, memoryview(hvd).nbytes, "header values", self._keep)
            self.hvval = _valid_ptr(hvv, m, "header values", self._keep)

    cdef inline Py_ssize_t key_len(self, Py_ssize_t i) noexcept nogil:
        if self.koff == NULL or (self.kval != NULL and not self.kval[i]):
            return -1
        return self.koff[i + 1] - self.koff[i]

    cdef inline Py_ssize_t value_len(self, Py_ssize_t i) noexcept nogil:
        if self.voff == NULL or (self.vval != NULL and not self.vval[i]):
            return -1
        return self.voff[i + 1] - self.voff[i]

    cdef inline Py_ssize_t hk_len(self, Py_ssize_t j) noexcept nogil:
        return self.hkoff[j + 1] - self.hkoff[j]

    cdef inline Py_ssize_t hv_len(self, Py_ssize_t j) noexcept nogil:
        if self.hvval != NULL and not self.hvval[j]:
            return -1
        return self.hvoff[j + 1] - self.hvoff[j]

    def rows(self, Py_ssize_t start, Py_ssize_t stop):
        """Rows [start, stop) as (key, value, timestamp, headers) tuples for BatchBuilder.build
        (a timestamp < 0 becomes None: now). For the legacy message formats only: the columnar
        path exists to avoid these objects."""
        cdef Py_ssize_t i, j, k, v
        cdef list out = []
        if start < 0 or stop > self.n or start > stop:
            raise ValueError(f"rows [{start}, {stop}) outside the {self.n} input rows")
        for i in range(start, stop):
            k = self.key_len(i)
            v = self.value_len(i)
            key = None if k < 0 else PyBytes_FromStringAndSize(<char*>self.kdat + self.koff[i], k)
            value = None if v < 0 else PyBytes_FromStringAndSize(<char*>self.vdat + self.voff[i], v)
            ts = None if self.ts == NULL or self.ts[i] < 0 else self.ts[i]
            headers = None
            if self.hoff != NULL and (self.hval == NULL or self.hval[i]):
                headers = []
                for j in range(self.hoff[i], self.hoff[i + 1]):
                    hv = None if self.hv_len(j) < 0 else \
                        PyBytes_FromStringAndSize(<char*>self.hvdat + self.hvoff[j], self.hv_len(j))
                    headers.append((PyUnicode_DecodeUTF8(<char*>self.hkdat + self.hkoff[j],
                                                         self.hk_len(j), NULL), hv))
            out.append((key, value, ts, headers))
        return out

    def sizes(self):
        """Per-row upper bound of the encoded record size (int64 numpy array), for splitting
        rows into batches under a byte budget without per-row Python work."""
        out = np.empty(self.n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t i, j, s, h0, h1, k, v
        for i in range(self.n):
            k = self.key_len(i)
            v = self.value_len(i)
            s = 32 + (k if k > 0 else 0) + (v if v > 0 else 0)
            if self.hoff != NULL and (self.hval == NULL or self.hval[i]):
                for j in range(self.hoff[i], self.hoff[i + 1]):
                    s += 10 + self.hk_len(j) + (self.hv_len(j) if self.hv_len(j) > 0 else 0)
            o[i] = s
        return out

    def key_hashes(self):
        """Kafka's default partitioner before the modulo: toPositive(murmur2(key)) of each row's
        key as an int64 array; -1 where the key is null (the caller spreads those)."""
        out = np.empty(self.n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t i, k
        with nogil:
            for i in range(self.n):
                k = self.key_len(i)
                if k < 0:
                    o[i] = -1
                else:
                    o[i] = _murmur2(self.kdat + self.koff[i], k) & 0x7fffffff
        return out


@cython.overflowcheck(False)    # zig-zag / hashing wrap on purpose
cdef inline uint32_t _murmur2(const uint8_t* d, Py_ssize_t length) noexcept nogil:
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


def murmur2(data):
    """Kafka's murmur2 of a bytes-like object, as a signed 32-bit int."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0]
    return <int32_t>_murmur2(&mv[0] if n else &_empty_byte, n)


cdef inline Py_ssize_t _find(const uint8_t* p, Py_ssize_t start, Py_ssize_t end,
                             const uint8_t* pat, Py_ssize_t plen) noexcept nogil:
    """Position of the first pat in p[start:end), or -1."""
    cdef const uint8_t* q
    while end - start >= plen:
        q = <const uint8_t*>memchr(p + start, pat[0], <size_t>(end - start - plen + 1))
        if q == NULL:
            return -1
        start = q - p
        if memcmp(q, pat, <size_t>plen) == 0:
            return start
        start += 1
    return -1


def split_lines(const uint8_t[::1] data, sep, int n_parts, int partition, int sticky,
                bint final):
    """Split text lines (a console producer's input) into per-partition columns, in two nogil
    passes and no per-line Python objects.

    Lines end at \\n (a trailing \\r is dropped); with final=False the bytes after the last
    \\n are left for the next call. sep (bytes or None) splits each line into key and value at
    its first occurrence. A line's partition is `partition` when >= 0, else Kafka's default
    partitioner over its key (toPositive(murmur2) % n_parts) when keyed, else `sticky`.

    Returns (consumed, lines, parts, bad): bytes consumed, lines split, and per partition None
    or (count, key, value) in ColumnInput's form (key None when unkeyed). bad is -1, or the
    (start, end) of the first line without the separator: splitting stopped before it, the
    lines ahead of it are in parts and consumed ends at its start.
    """
    cdef Py_ssize_t n = data.shape[0]
    cdef const uint8_t* p = &data[0] if n else &_empty_byte
    cdef const uint8_t* pat = NULL
    cdef Py_ssize_t plen = 0, limit = 0, nlines = 0, i, j, s, e, k, q, bad_s = -1, bad_e = -1
    cdef const uint8_t* nl
    cdef bytes sepb
    if n_parts <= 0 or partition >= n_parts or not 0 <= sticky < n_parts:
        raise ValueError(f"partition {partition} / sticky {sticky} outside {n_parts} partitions")
    if sep is not None:
        sepb = bytes(sep)
        plen = len(sepb)
        if plen == 0:
            raise ValueError("the key separator must not be empty")
        pat = <const uint8_t*>PyBytes_AS_STRING(sepb)
    # the lines to split: up to the last newline, or everything when final
    with nogil:
        s = 0
        while s < n:
            nl = <const uint8_t*>memchr(p + s, 10, <size_t>(n - s))
            if nl == NULL:
                break
            nlines += 1
            s = (nl - p) + 1
        limit = s
        if final and limit < n:
            nlines += 1
            limit = n
    starts = np.empty(nlines, dtype=np.int64)
    seps = np.empty(nlines, dtype=np.int64)
    ends = np.empty(nlines, dtype=np.int64)
    parts_of = np.empty(nlines, dtype=np.int32)
    counts = np.zeros(n_parts, dtype=np.int64)
    kbytes = np.zeros(n_parts, dtype=np.int64)
    vbytes = np.zeros(n_parts, dtype=np.int64)
    cdef int64_t[::1] st = starts, sp = seps, en = ends, cnt = counts, kb = kbytes, vb = vbytes
    cdef int32_t[::1] pt = parts_of
    cdef int32_t part
    with nogil:
        s = 0
        for i in range(nlines):
            nl = <const uint8_t*>memchr(p + s, 10, <size_t>(limit - s)) if s < limit else NULL
            e = (nl - p) if nl != NULL else limit
            q = e + 1
            if e > s and p[e - 1] == 13:
                e -= 1
            k = -1
            if pat != NULL:
                k = _find(p, s, e, pat, plen)
                if k < 0:
                    bad_s, bad_e = s, e
                    nlines = i
                    limit = s
                    break
            if partition >= 0:
                part = partition
            elif k >= 0:
                part = <int32_t>((_murmur2(p + s, k - s) & 0x7fffffff) % <uint32_t>n_parts)
            else:
                part = sticky
            st[i], sp[i], en[i], pt[i] = s, k, e, part
            cnt[part] += 1
            if k >= 0:
                kb[part] += k - s
                vb[part] += e - (k + plen)
            else:
                vb[part] += e - s
            s = q
    for j in range(n_parts):
        if kb[j] > INT32_MAX or vb[j] > INT32_MAX:
            raise InvalidRecordError("more than 2 GiB of keys or values in one call")
    # one fill pass: every partition's rows go to its own slice of shared buffers, at the row,
    # key byte and value byte its cursor has reached (bases are prefix sums of the counts)
    row_base = np.zeros(n_parts, dtype=np.int64)
    row_base[1:] = np.cumsum(counts + 1)[:n_parts - 1]
    kbase = np.zeros(n_parts, dtype=np.int64)
    kbase[1:] = np.cumsum(kbytes)[:n_parts - 1]
    vbase = np.zeros(n_parts, dtype=np.int64)
    vbase[1:] = np.cumsum(vbytes)[:n_parts - 1]
    voff = np.zeros(nlines + n_parts, dtype=np.int32)
    vdat = np.empty(int(vbytes.sum()), dtype=np.uint8)
    koff = np.zeros(nlines + n_parts, dtype=np.int32) if pat != NULL else voff   # unused unkeyed
    kdat = np.empty(int(kbytes.sum()), dtype=np.uint8) if pat != NULL else vdat
    rows = np.zeros(n_parts, dtype=np.int64)
    kused = np.zeros(n_parts, dtype=np.int64)
    vused = np.zeros(n_parts, dtype=np.int64)
    cdef int64_t[::1] rb = row_base, kbs = kbase, vbs = vbase, rw = rows, ku = kused, vu = vused
    cdef int32_t[::1] ko = koff, vo = voff
    cdef uint8_t[::1] kdm = kdat, vdm = vdat
    cdef uint8_t* kd = &kdm[0] if kdm.shape[0] else NULL      # NULL only when nothing is copied
    cdef uint8_t* vd = &vdm[0] if vdm.shape[0] else NULL
    cdef Py_ssize_t a
    with nogil:
        for i in range(nlines):
            j = pt[i]
            if sp[i] >= 0:
                a = sp[i] - st[i]
                if a:
                    memcpy(kd + kbs[j] + ku[j], p + st[i], <size_t>a)
                ku[j] += a
                ko[rb[j] + rw[j] + 1] = <int32_t>ku[j]
                a = en[i] - (sp[i] + plen)
                if a:
                    memcpy(vd + vbs[j] + vu[j], p + sp[i] + plen, <size_t>a)
            else:
                a = en[i] - st[i]
                if a:
                    memcpy(vd + vbs[j] + vu[j], p + st[i], <size_t>a)
            vu[j] += a
            rw[j] += 1
            vo[rb[j] + rw[j]] = <int32_t>vu[j]
    out = []
    for j in range(n_parts):
        if cnt[j] == 0:
            out.append(None)
            continue
        r0, r1 = row_base[j], row_base[j] + cnt[j] + 1
        value = (voff[r0:r1], vdat[vbase[j]:vbase[j] + vb[j]], None)
        key = (koff[r0:r1], kdat[kbase[j]:kbase[j] + kb[j]], None) if pat != NULL else None
        out.append((int(cnt[j]), key, value))
    bad = -1
    if bad_s >= 0:
        bad = (bad_s, bad_e)
    return limit, nlines, out, bad


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

    def __cinit__(self):
        self.compression_level = None
        self.cap = 1 << 16
        self.buf = <uint8_t*>malloc(self.cap)
        if self.buf == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.buf)

    cdef int _ensure(self, Py_ssize_t need) except -1:
        cdef Py_ssize_t c
        cdef uint8_t* nb
        if need <= self.cap:
            return 0
        c = self.cap
        while c < need:
            c *= 2
        nb = <uint8_t*>realloc(self.buf, c)
        if nb == NULL:
            raise MemoryError()
        self.buf = nb
        self.cap = c
        return 0

    def getvalue(self):
        return PyBytes_FromStringAndSize(<char*>self.buf, self.size)

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
        """memcpy the encoded batch into a writable mapping at pos."""
        if not m.writable:
            raise ValueError("mapping is read-only")
        if pos < 0 or pos + self.size > m.length:
            raise ValueError(f"batch of {self.size} bytes at {pos} exceeds mapping of {m.length}")
        memcpy(<void*>(m.ptr() + pos), self.buf, self.size)

    def build(self, records, int magic, int64_t base_offset, int64_t now, bint log_append_time,
              int64_t ts_min, int64_t ts_max, bint require_key, int codec,
              int32_t leader_epoch=-1):
        """Encode `records` (list/tuple of (key, value[, ts[, headers]]) or Record) as one append.

        CreateTime timestamps must lie in [ts_min, ts_max]; a missing timestamp means `now`.
        Returns the record count (0 writes nothing).
        """
        cdef Py_ssize_t n, i, L
        cdef object item, key, value, ts_obj, headers
        cdef int64_t ts
        cdef int64_t* tss
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
        if ts < ts_min or ts > ts_max:
            raise InvalidRecordError(
                f"record {i}: timestamp {ts} is outside the allowed range [{ts_min}, {ts_max}] "
                f"(message.timestamp.before.max.ms / message.timestamp.after.max.ms)")
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
        cdef Py_ssize_t i, pos, body, klen, vlen, hcount, j, L, hbytes
        cdef const uint8_t* kp
        cdef const uint8_t* vp
        cdef object item, key, value, ts_obj, headers
        cdef int64_t ts, base_ts = 0, max_ts = NO_TIMESTAMP
        cdef int64_t off_max = -1
        cdef list hdrs
        cdef bytes hk, hv
        self._ensure(V2_OVERHEAD + 64)
        pos = V2_OVERHEAD
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
            try:
                _bytes_arg(key, &kp, &klen, keep)
            except TypeError:
                raise InvalidRecordError(f"record {i}: key must be bytes-like or None, not {type(key).__name__}")
            try:
                _bytes_arg(value, &vp, &vlen, keep)
            except TypeError:
                raise InvalidRecordError(f"record {i}: value must be bytes-like or None, not {type(value).__name__}")
            if require_key and klen < 0:
                raise InvalidRecordError(
                    f"record {i}: compacted topics (cleanup.policy=compact) require a key")
            ts = self._timestamp(ts_obj, i, now, lat, ts_min, ts_max)
            if i == 0:
                base_ts = ts
            if ts > max_ts:
                max_ts = ts
                off_max = base_offset + i
            hcount = 0
            hdrs = None
            if headers is not None and (type(headers) is not tuple or PyTuple_GET_SIZE(headers) != 0):
                hdrs = self._headers(headers, i)
                hcount = len(hdrs)
            hbytes = 0
            for j in range(hcount):
                hk = hdrs[j][0]
                hv = hdrs[j][1]
                hbytes += _blob_size(len(hk)) + _blob_size(-1 if hv is None else len(hv))
            body = _record_body_size(ts - base_ts, i, klen, vlen, hcount, hbytes)
            self._ensure(pos + body + 10)
            pos = _put_record_head(self.buf, pos, body, ts - base_ts, i, kp, klen, vp, vlen, hcount)
            for j in range(hcount):
                hk = hdrs[j][0]
                hv = hdrs[j][1]
                pos = _put_blob(self.buf, pos, <const uint8_t*>PyBytes_AS_STRING(hk), len(hk))
                if hv is None:
                    pos = put_varint(self.buf, pos, -1)
                else:
                    pos = _put_blob(self.buf, pos, <const uint8_t*>PyBytes_AS_STRING(hv), len(hv))
            if len(keep) > 64:
                del keep[:]
        return self._finish_v2(pos, n, base_offset, base_ts, max_ts, lat, codec, leader_epoch)

    cdef int _finish_v2(self, Py_ssize_t pos, Py_ssize_t n, int64_t base_offset, int64_t base_ts,
                        int64_t max_ts, bint lat, int codec, int32_t leader_epoch) except -1:
        """Compress the records region (self.buf[61:pos]) if asked, then write the v2 batch
        header and its CRC-32C."""
        cdef uint32_t crc
        cdef int16_t attrs
        if codec != 0:
            raw = PyBytes_FromStringAndSize(<char*>self.buf + V2_OVERHEAD, pos - V2_OVERHEAD)
            comp = _compress(codec, raw, self.compression_level, 2)
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
            crc = ks_crc32c(0, self.buf + 21, pos - 21)
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
        cdef const uint8_t* kp
        cdef const uint8_t* vp
        cdef int err = 0
        cdef Py_ssize_t bad = -1
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
                if ts < ts_min or ts > ts_max:
                    raise InvalidRecordError(
                        f"record {i}: timestamp {ts} is outside the allowed range [{ts_min}, "
                        f"{ts_max}] (message.timestamp.before.max.ms / message.timestamp.after.max.ms)")
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
                hbytes += _blob_size(hk) + _blob_size(cols.hv_len(j))
            body = _record_body_size(ts - base_ts, i - start, klen, vlen, hcount, hbytes)
            self._ensure(pos + body + 10)
            pos = _put_record_head(self.buf, pos, body, ts - base_ts, i - start,
                                   cols.kdat + (cols.koff[i] if klen > 0 else 0), klen,
                                   cols.vdat + (cols.voff[i] if vlen > 0 else 0), vlen, hcount)
            for j in range(h0, h1):
                pos = _put_blob(self.buf, pos, cols.hkdat + cols.hkoff[j], cols.hk_len(j))
                pos = _put_blob(self.buf, pos, cols.hvdat + cols.hvoff[j], cols.hv_len(j))
        self._finish_v2(pos, n, base_offset, base_ts, max_ts, log_append_time, codec, leader_epoch)
        return n

    def load_batch(self, data, Py_ssize_t pos, int64_t new_base_offset, int64_t log_append_time=-1):
        """Take the v2 batch at data[pos:] (e.g. staged by build_columns) as this builder's
        append: CRC checked, base offset reassigned (outside the CRC, as a broker assigns
        offsets in place) and, for log_append_time >= 0, the LogAppendTime type and max
        timestamp set and the CRC recomputed. Returns the batch's size."""
        cdef const uint8_t[::1] mv = data
        cdef Py_ssize_t n = mv.shape[0]
        cdef const uint8_t* p = &mv[0] if n else &_empty_byte
        cdef BatchHeader h
        cdef const char* why
        cdef uint32_t s, c
        cdef int hs
        if pos < 0 or pos > n:
            raise ValueError(f"position {pos} outside {n} bytes")
        hs = _parse_header(p, pos, n, &h, &why)
        if hs != H_OK:
            raise _corrupt(f"staged batch: {why.decode('ascii') if hs != H_END or pos < n else 'no batch'}", pos)
        if h.magic != 2:
            raise _corrupt(f"staged batch has magic {h.magic}; only v2 batches can be re-based", pos)
        if h.count != h.last_offset - h.base_offset + 1:
            raise _corrupt(f"staged batch has {h.count} records for {h.last_offset - h.base_offset + 1} offsets", pos)
        if not _crc_ok(p, pos, &h, &s, &c):
            raise _corrupt(f"CRC mismatch in a staged batch (stored {s:#010x}, computed {c:#010x})", pos)
        self._ensure(h.size)
        memcpy(self.buf, p + pos, h.size)
        st64(self.buf, <uint64_t>new_base_offset)
        self.max_timestamp = h.max_timestamp
        if log_append_time >= 0:
            st16(self.buf + 21, <uint16_t>(h.attrs | TS_TYPE_BIT))
            st64(self.buf + 35, <uint64_t>log_append_time)
            self.max_timestamp = log_append_time
            st32(self.buf + 17, ks_crc32c(0, self.buf + 21, h.size - 21))
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
        crc = ks_crc32(0, self.buf + start + 16, pos - start - 16)
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
            try:
                _bytes_arg(key, &kp, &klen, keep)
            except TypeError:
                raise InvalidRecordError(f"record {i}: key must be bytes-like or None, not {type(key).__name__}")
            try:
                _bytes_arg(value, &vp, &vlen, keep)
            except TypeError:
                raise InvalidRecordError(f"record {i}: value must be bytes-like or None, not {type(value).__name__}")
            if require_key and klen < 0:
                raise InvalidRecordError(
                    f"record {i}: compacted topics (cleanup.policy=compact) require a key")
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
            comp = _compress(codec, raw, self.compression_level, magic)
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

# ---------------------------------------------------------------------------------------------
# Batch headers: shallow iteration over a run of batches (no CRC), used by offset translation
# ---------------------------------------------------------------------------------------------
cdef struct BatchHeader:
    int64_t base_offset      # first offset (v2); for v0/v1 = the entry's offset
    int64_t last_offset
    int32_t size             # total bytes incl. LOG_OVERHEAD
    int magic
    int attrs
    int64_t max_timestamp
    int64_t base_timestamp
    int32_t count

# status codes of _parse_header
cdef inline int _parse_header(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, BatchHeader* h,
                              const char** why) noexcept nogil:
    cdef int64_t size
    cdef int32_t delta
    if end - pos < HEADER_UP_TO_MAGIC:
        why[0] = "fewer than 17 bytes left for a batch header"
        return H_END
    size = ld32(p + pos + 8)
    if size < V0_OVERHEAD:
        why[0] = "record size is smaller than the minimum record overhead (14)"
        return H_CORRUPT
    if pos + LOG_OVERHEAD + size > end:
        why[0] = "the batch runs past the end of the data"
        return H_END
    h.size = <int32_t>(size + LOG_OVERHEAD)
    h.magic = p[pos + 16]
    h.base_offset = ld64(p + pos)
    if h.magic == 2:
        if size < V2_OVERHEAD - LOG_OVERHEAD:
            why[0] = "v2 batch is smaller than the batch header (61 bytes)"
            return H_CORRUPT
        h.attrs = <uint16_t>ld16(p + pos + 21)
        delta = ld32(p + pos + 23)
        if delta < 0:
            why[0] = "negative lastOffsetDelta"
            return H_CORRUPT
        h.last_offset = h.base_offset + delta
        h.base_timestamp = ld64(p + pos + 27)
        h.max_timestamp = ld64(p + pos + 35)
        h.count = ld32(p + pos + 57)
        if h.count < 0:
            why[0] = "negative record count"
            return H_CORRUPT
    elif h.magic == 1 or h.magic == 0:
        if h.magic == 1 and size < V1_OVERHEAD:
            why[0] = "v1 message is smaller than its overhead (22 bytes)"
            return H_CORRUPT
        h.attrs = p[pos + 17]
        h.last_offset = h.base_offset
        h.max_timestamp = ld64(p + pos + 18) if h.magic == 1 else NO_TIMESTAMP
        h.base_timestamp = h.max_timestamp
        h.count = 1
    else:
        why[0] = "unknown magic byte"
        return H_CORRUPT
    return H_OK

cdef inline bint _crc_ok(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, uint32_t* stored,
                         uint32_t* computed) noexcept nogil:
    if h.magic == 2:
        stored[0] = ldu32(p + pos + 17)
        computed[0] = ks_crc32c(0, p + pos + 21, h.size - 21)
    else:
        stored[0] = ldu32(p + pos + 12)
        computed[0] = ks_crc32(0, p + pos + 16, h.size - 16)
    return stored[0] == computed[0]

cdef inline int _require_crc(const uint8_t* p, Py_ssize_t pos, BatchHeader* h) except -1:
    """Raise CorruptRecordError at pos unless the batch's stored CRC matches its bytes."""
    cdef uint32_t s, c
    if not _crc_ok(p, pos, h, &s, &c):
        raise _corrupt(f"CRC mismatch (stored {s:#010x}, computed {c:#010x})", pos)
    return 0

cdef inline bint _legacy_lengths_ok(const uint8_t* p, Py_ssize_t pos, BatchHeader* h) noexcept nogil:
    """Key and value lengths of a v0/v1 message must add up to its size exactly."""
    cdef Py_ssize_t q = pos + LOG_OVERHEAD + (V1_OVERHEAD - 8 if h.magic == 1 else V0_OVERHEAD - 8)
    cdef Py_ssize_t end = pos + h.size
    cdef int32_t klen, vlen
    if q + 4 > end:
        return False
    klen = ld32(p + q)
    if klen < -1 or q + 4 + (klen if klen > 0 else 0) + 4 > end:
        return False
    q += 4 + (klen if klen > 0 else 0)
    vlen = ld32(p + q)
    if vlen < -1:
        return False
    return q + 4 + (vlen if vlen > 0 else 0) == end

def validate_batches(data, int64_t base_offset, int64_t prev_last_offset, bint verify_crc=True):
    """Validate a run of batches held in memory (a pread copy): returns (valid_bytes,
    last_offset (prev_last_offset if none), max_timestamp, offset_of_max_timestamp, complete)
    where complete is False when the data ended inside a batch (more may follow on disk)."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0], pos = 0
    cdef const uint8_t* p = &mv[0] if n else &_empty_byte
    cdef BatchHeader h
    cdef const char* why
    cdef int hs
    cdef uint32_t s, c
    cdef int64_t last = prev_last_offset, max_ts = NO_TIMESTAMP, off_max = -1
    cdef bint complete = True
    while True:
        hs = _parse_header(p, pos, n, &h, &why)
        if hs == H_END:
            complete = (n - pos) == 0 or not (n - pos < HEADER_UP_TO_MAGIC or
                                              pos + LOG_OVERHEAD + ld32(p + pos + 8) > n)
            if n - pos >= 12 and ld32(p + pos + 8) == 0 and ld64(p + pos) == 0:
                complete = True    # zero padding: nothing more to come at this position yet
            break
        if hs == H_CORRUPT:
            break
        if verify_crc and not _crc_ok(p, pos, &h, &s, &c):
            break
        if h.magic < 2 and not _legacy_lengths_ok(p, pos, &h):
            break
        if h.base_offset < base_offset or h.last_offset - base_offset > INT32_MAX:
            break
        if last >= 0 and ((h.magic == 2 and h.base_offset <= last) or h.last_offset <= last):
            break
        if h.max_timestamp > max_ts:
            max_ts = h.max_timestamp
            off_max = h.last_offset
        last = h.last_offset
        pos += h.size
    return (pos, last, max_ts, off_max, complete)


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
        if _parse_header(p, pos, end, &h, &why) != H_OK:
            return -1
        if h.last_offset >= target:
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
    while _parse_header(p, pos, end, &h, &why) == H_OK:
        out.append((pos, h.base_offset, h.last_offset, h.size, h.magic, h.attrs,
                    h.max_timestamp, h.count))
        pos += h.size
    return out

# ---------------------------------------------------------------------------------------------
# Recovery scan (Kafka LogSegment.recover): validate batches, rebuild both indexes
# ---------------------------------------------------------------------------------------------
OFFSET_DTYPE = np.dtype([("relative_offset", ">i4"), ("position", ">i4")])
TIME_DTYPE = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])

def recover_scan(Mapping m, Py_ssize_t end, int64_t base_offset, int64_t index_interval,
                 Py_ssize_t max_offset_entries, Py_ssize_t max_time_entries,
                 bint verify_crc=True, Py_ssize_t start=0, int64_t prev_last_offset=-1,
                 int64_t upper_bound=-1):
    """Validate the batches in [0, end) and compute the index entries Kafka's recover() writes.

    Returns a dict: valid_bytes, next_offset (-1 if no batch), max_timestamp,
    offset_of_max_timestamp, first_batch_timestamp, batches, offset_entries / time_entries
    (big-endian structured arrays in the on-disk layout), status ('end', 'corrupt', 'crc',
    'offset_order', 'overflow', 'below_base'), reason (text) and tail_zero (whether the bytes
    after valid_bytes are all zero, i.e. a preallocated tail rather than garbage).
    Runs without the GIL. `start` / `prev_last_offset` continue a scan from a known valid
    position (the read-only refresh of a segment another process appends to). A batch reaching
    `upper_bound` (the next segment's base offset, if >= 0) is invalid ('past_next'): base
    offsets lie outside the CRC, so a flipped bit there is caught only this way.
    """
    if end < 0 or end > m.length or start < 0 or start > end:
        raise ValueError("scan range outside mapping")
    cdef Py_ssize_t cap_o = max_offset_entries if max_offset_entries > 0 else 0
    cdef Py_ssize_t cap_t = max_time_entries if max_time_entries > 0 else 0
    cdef Py_ssize_t bound = end // (index_interval + 1) + 2
    if cap_o > bound:
        cap_o = bound
    if cap_t > bound:
        cap_t = bound
    oarr = np.zeros(cap_o, dtype=OFFSET_DTYPE)
    tarr = np.zeros(cap_t, dtype=TIME_DTYPE)
    cdef uint8_t[::1] ob = oarr.view(np.uint8) if cap_o else np.zeros(1, np.uint8)
    cdef uint8_t[::1] tb = tarr.view(np.uint8) if cap_t else np.zeros(1, np.uint8)
    cdef uint8_t* op = &ob[0]
    cdef uint8_t* tp = &tb[0]
    cdef Py_ssize_t no = 0, nt = 0
    cdef const uint8_t* p
    cdef Py_ssize_t valid = start, last_entry_pos = start, batches = 0
    cdef int64_t prev_last = prev_last_offset, max_ts = NO_TIMESTAMP, off_max = -1, first_ts = NO_TIMESTAMP
    cdef int64_t last_time_ts = NO_TIMESTAMP, last_time_off = -1
    cdef int status = R_END, hs
    cdef BatchHeader h
    cdef const char* why = ""
    cdef uint32_t stored = 0, computed = 0
    cdef bint have_prev = prev_last_offset >= 0
    cdef bint tail_zero = True
    cdef Py_ssize_t i
    p = m.ptr()
    m.pin()
    try:
        with nogil:
            while True:
                hs = _parse_header(p, valid, end, &h, &why)
                if hs == H_END:
                    status = R_END
                    break
                if hs == H_CORRUPT:
                    status = R_CORRUPT
                    break
                if verify_crc and not _crc_ok(p, valid, &h, &stored, &computed):
                    status = R_CRC
                    break
                if h.magic < 2 and not _legacy_lengths_ok(p, valid, &h):
                    status = R_CORRUPT
                    why = "key/value lengths do not match the message size"
                    break
                if h.base_offset < base_offset:
                    status = R_BELOW_BASE
                    break
                if have_prev and ((h.magic == 2 and h.base_offset <= prev_last) or
                                  h.last_offset <= prev_last):
                    status = R_OFFSET_ORDER
                    break
                if upper_bound >= 0 and h.last_offset >= upper_bound:
                    status = R_PAST_NEXT
                    break
                if h.last_offset - base_offset > INT32_MAX:
                    status = R_OVERFLOW
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
                        last_time_off = off_max
                    last_entry_pos = valid
                prev_last = h.last_offset
                have_prev = True
                valid += h.size
                batches += 1
            for i in range(valid, end):
                if p[i] != 0:
                    tail_zero = False
                    break
    finally:
        m.unpin()
    names = {R_END: "end", R_CORRUPT: "corrupt", R_CRC: "crc", R_OFFSET_ORDER: "offset_order",
             R_OVERFLOW: "overflow", R_BELOW_BASE: "below_base", R_PAST_NEXT: "past_next"}
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
    return {
        "valid_bytes": valid,
        "next_offset": prev_last + 1 if have_prev else -1,
        "max_timestamp": max_ts,
        "offset_of_max_timestamp": off_max,
        "first_batch_timestamp": first_ts,
        "batches": batches,
        "offset_entries": oarr[:no],
        "time_entries": tarr[:nt],
        "status": names[status],
        "reason": reason,
        "tail_zero": tail_zero,
    }

# ---------------------------------------------------------------------------------------------
# Record decoding
# ---------------------------------------------------------------------------------------------
cdef inline object _corrupt(str msg, Py_ssize_t position):
    e = CorruptRecordError(msg)
    e.position = position
    return e

cdef struct RecordFields:
    Py_ssize_t end          # one past the record
    int64_t ts_delta
    Py_ssize_t offd_pos     # where the offset delta starts
    int64_t off_delta
    Py_ssize_t key_pos
    int64_t key_len         # -1 = null
    Py_ssize_t value_pos
    int64_t value_len       # -1 = null (tombstone)
    const char* why         # what is malformed, when a parse fails


cdef inline Py_ssize_t _record_fields(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                                      RecordFields* f) noexcept nogil:
    """Parse a v2 record up to its value, every length checked against the record's bounds:
    returns f.end, or -1 with f.why. The one record parser of the readers and the cleaner."""
    cdef int64_t rlen
    cdef Py_ssize_t q = get_varlong(p, pos, end, &rlen, 5)
    f.why = NULL
    if q < 0 or rlen <= 0 or rlen > end - q:
        f.why = "malformed, empty or oversized record length"
        return -1
    f.end = q + rlen
    q = get_varlong(p, q + 1, f.end, &f.ts_delta, 10)
    if q < 0:
        f.why = "malformed timestamp delta"
        return -1
    f.offd_pos = q
    q = get_varlong(p, q, f.end, &f.off_delta, 5)
    if q < 0 or f.off_delta < 0:
        f.why = "malformed offset delta"
        return -1
    q = get_varlong(p, q, f.end, &f.key_len, 5)
    if q < 0 or f.key_len < -1 or f.key_len > f.end - q:
        f.why = "malformed key length"
        return -1
    f.key_pos = q
    q = get_varlong(p, q + (f.key_len if f.key_len > 0 else 0), f.end, &f.value_len, 5)
    if q < 0 or f.value_len < -1 or f.value_len > f.end - q:
        f.why = "malformed value length"
        return -1
    f.value_pos = q
    return f.end


cdef inline Py_ssize_t _header_count(const uint8_t* p, RecordFields* f, int64_t* n) noexcept nogil:
    """Read the header count after the value: the position of the first header, or -1."""
    cdef Py_ssize_t q = get_varlong(p, f.value_pos + (f.value_len if f.value_len > 0 else 0),
                                    f.end, n, 5)
    if q < 0 or n[0] < 0 or n[0] > f.end - q:
        f.why = "malformed header count"
        return -1
    return q


cdef inline Py_ssize_t _next_header(const uint8_t* p, Py_ssize_t q, RecordFields* f,
                                    Py_ssize_t* kpos, int64_t* klen, Py_ssize_t* vpos,
                                    int64_t* vlen) noexcept nogil:
    """Parse the header at q (key, then value; -1 length = null value): the position after
    it, or -1."""
    q = get_varlong(p, q, f.end, klen, 5)
    if q < 0 or klen[0] < 0 or klen[0] > f.end - q:
        f.why = "malformed header key length"
        return -1
    kpos[0] = q
    q = get_varlong(p, q + klen[0], f.end, vlen, 5)
    if q < 0 or vlen[0] < -1 or vlen[0] > f.end - q:
        f.why = "malformed header value length"
        return -1
    vpos[0] = q
    return q + (vlen[0] if vlen[0] > 0 else 0)


cdef Py_ssize_t _decode_v2_records(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                                   int64_t base_offset, int64_t base_ts, int64_t max_ts,
                                   int32_t count, bint lat, int64_t min_offset,
                                   Py_ssize_t max_records, list out, Py_ssize_t err_pos) except -1:
    """Decode `count` v2 records from p[pos:end) into out (skipping offsets < min_offset);
    stops after max_records. Returns the number appended."""
    cdef int32_t i
    cdef int64_t hcount, hk, hv, j
    cdef Py_ssize_t q, kq, vq
    cdef Py_ssize_t added = 0
    cdef Record r
    cdef list hdrs
    cdef RecordFields f
    cdef int tstype = 1 if lat else 0
    for i in range(count):
        if _record_fields(p, pos, end, &f) < 0:
            raise _corrupt(f"record {i} of the batch: {f.why.decode('ascii')}", err_pos)
        if base_offset + f.off_delta < min_offset:
            pos = f.end
            continue
        q = _header_count(p, &f, &hcount)
        if q < 0:
            raise _corrupt(f"record {i} of the batch: {f.why.decode('ascii')}", err_pos)
        r = Record.__new__(Record)
        if hcount:
            hdrs = []
            for j in range(hcount):
                q = _next_header(p, q, &f, &kq, &hk, &vq, &hv)
                if q < 0:
                    raise _corrupt(f"record {i} of the batch: {f.why.decode('ascii')}", err_pos)
                try:
                    hks = PyUnicode_DecodeUTF8(<const char*>(p + kq), hk, NULL)
                except UnicodeDecodeError:
                    raise _corrupt(f"record {i}: header key is not UTF-8", err_pos)
                hdrs.append((hks, PyBytes_FromStringAndSize(<const char*>(p + vq), hv)
                             if hv >= 0 else None))
            r.headers = tuple(hdrs)
        else:
            r.headers = _EMPTY
        if q != f.end:
            raise _corrupt(f"record {i}: {f.end - q} unexpected bytes after the headers", err_pos)
        r.offset = base_offset + f.off_delta
        r.timestamp = max_ts if lat else base_ts + f.ts_delta
        r.key = PyBytes_FromStringAndSize(<const char*>(p + f.key_pos), f.key_len) \
            if f.key_len >= 0 else None
        r.value = PyBytes_FromStringAndSize(<const char*>(p + f.value_pos), f.value_len) \
            if f.value_len >= 0 else None
        r.timestamp_type = tstype
        out.append(r)
        added += 1
        pos = f.end
        if added >= max_records:
            return added
    if pos != end:
        raise _corrupt(f"{end - pos} bytes remain after the batch's {count} records", err_pos)
    return added

cdef object _decompress_value(int codec, const uint8_t* p, Py_ssize_t n, Py_ssize_t err_pos,
                              int magic=2):
    if _decompress is None:
        raise UnsupportedCodecError("no codecs registered")
    data = PyBytes_FromStringAndSize(<const char*>p, n)
    try:
        return _decompress(codec, data, magic)
    except (UnsupportedCodecError, RecordTooLargeError):
        raise
    except Exception as exc:
        raise _corrupt(f"cannot decompress {CODEC_NAMES.get(codec, codec)} data: {exc}", err_pos)

cdef Py_ssize_t _decode_legacy(const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                               int64_t min_offset, Py_ssize_t max_records, list out,
                               Py_ssize_t err_pos, bint verify_crc, int depth,
                               int64_t abs_delta, int64_t wrapper_ts, bint wrapper_lat) except -1:
    """Decode one v0/v1 message (a compressed wrapper recursively) into out."""
    cdef Py_ssize_t q = pos + LOG_OVERHEAD + 4 + 2
    cdef Py_ssize_t end = pos + h.size
    cdef int32_t klen, vlen
    cdef int codec = h.attrs & CODEC_MASK
    cdef int64_t ts = NO_TIMESTAMP
    cdef Record r
    cdef Py_ssize_t added = 0, ipos, iend, n
    cdef BatchHeader ih
    cdef const char* why
    cdef const uint8_t* ip
    cdef int hs
    cdef int64_t last_rel, offset
    cdef bint lat = (h.magic == 1) and (h.attrs & TS_TYPE_BIT) != 0
    cdef uint32_t s, c
    if not _legacy_lengths_ok(p, pos, h):
        raise _corrupt("key/value lengths do not match the message size", err_pos)
    if h.magic == 1:
        ts = ld64(p + q)
        q += 8
    klen = ld32(p + q)
    q += 4
    key = PyBytes_FromStringAndSize(<const char*>(p + q), klen) if klen >= 0 else None
    q += klen if klen > 0 else 0
    vlen = ld32(p + q)
    q += 4
    if codec == 0:
        offset = h.base_offset + abs_delta
        if offset < min_offset:
            return 0
        r = Record.__new__(Record)
        r.offset = offset
        if wrapper_lat:
            r.timestamp = wrapper_ts
            r.timestamp_type = 1
        else:
            r.timestamp = ts
            r.timestamp_type = (1 if lat else 0) if h.magic == 1 else -1
        r.key = key
        r.value = PyBytes_FromStringAndSize(<const char*>(p + q), vlen) if vlen >= 0 else None
        r.headers = _EMPTY
        out.append(r)
        return 1
    if depth > 0:
        raise _corrupt("nested compressed message", err_pos)
    if codec > 3:
        raise _corrupt(f"invalid compression codec {codec} for magic {h.magic}", err_pos)
    if vlen < 0:
        raise _corrupt("compressed wrapper message has a null value", err_pos)
    inner = _decompress_value(codec, p + q, vlen, err_pos, h.magic)
    cdef const uint8_t[::1] mv = inner
    n = mv.shape[0]
    ip = &mv[0] if n else &_empty_byte
    # first pass: find the last inner offset (v1 inner offsets are relative)
    ipos = 0
    last_rel = -1
    while ipos < n:
        hs = _parse_header(ip, ipos, n, &ih, &why)
        if hs != H_OK or ih.magic > 1:
            raise _corrupt("malformed message inside a compressed wrapper", err_pos)
        last_rel = ih.base_offset
        ipos += ih.size
    ipos = 0
    while ipos < n:
        _parse_header(ip, ipos, n, &ih, &why)
        if verify_crc and not _crc_ok(ip, ipos, &ih, &s, &c):
            raise _corrupt(f"CRC mismatch in a message inside a compressed wrapper "
                           f"(stored {s:#010x}, computed {c:#010x})", err_pos)
        if (ih.attrs & CODEC_MASK) != 0:
            raise _corrupt("nested compressed message", err_pos)
        if h.magic == 1:
            # abs = wrapper offset - last relative + relative
            offset = h.base_offset - last_rel + ih.base_offset
        else:
            offset = ih.base_offset
        ih.base_offset = offset
        ih.last_offset = offset
        added += _decode_legacy(ip, ipos, &ih, min_offset, max_records - added, out, err_pos,
                                verify_crc, depth + 1, 0, ts if lat else NO_TIMESTAMP, lat)
        if added >= max_records:
            break
        ipos += ih.size
    return added

cdef Py_ssize_t _decode_batch(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, int64_t min_offset,
                              Py_ssize_t max_records, list out, bint verify_crc,
                              bint include_control) except -1:
    cdef int codec
    cdef const uint8_t* rp
    cdef Py_ssize_t n
    if verify_crc:
        _require_crc(p, pos, h)
    if h.magic < 2:
        return _decode_legacy(p, pos, h, min_offset, max_records, out, pos, verify_crc, 0, 0,
                              NO_TIMESTAMP, False)
    if (h.attrs & CONTROL_BIT) and not include_control:
        return 0
    codec = h.attrs & CODEC_MASK
    if h.count > h.last_offset - h.base_offset + 1:
        raise _corrupt(f"record count {h.count} exceeds the batch's offset range", pos)
    if codec == 0:
        return _decode_v2_records(p, pos + V2_OVERHEAD, pos + h.size, h.base_offset,
                                  h.base_timestamp, h.max_timestamp, h.count,
                                  (h.attrs & TS_TYPE_BIT) != 0, min_offset, max_records, out, pos)
    if codec > 4:
        raise _corrupt(f"invalid compression codec {codec}", pos)
    inner = _decompress_value(codec, p + pos + V2_OVERHEAD, h.size - V2_OVERHEAD, pos)
    cdef const uint8_t[::1] mv = inner
    n = mv.shape[0]
    rp = &mv[0] if n else &_empty_byte
    return _decode_v2_records(rp, 0, n, h.base_offset, h.base_timestamp, h.max_timestamp,
                              h.count, (h.attrs & TS_TYPE_BIT) != 0, min_offset, max_records,
                              out, pos)

cdef tuple _read_range(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, int64_t min_offset,
                       Py_ssize_t max_records, Py_ssize_t max_bytes, bint verify_crc, list out,
                       bint strict, bint min_one, bint include_control=False):
    """Decode batches from pos until end / max_records / max_bytes (at least one batch if
    min_one); control batches' records only with include_control (dump tools). Returns (next_position, next_offset_hint, bytes_used). A malformed header raises
    if strict."""
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t used = 0, start_len = len(out), added = 0
    cdef int hs
    cdef int64_t next_offset = -1
    while added < max_records:
        hs = _parse_header(p, pos, end, &h, &why)
        if hs == H_END:
            if strict and pos < end:
                raise _corrupt(f"incomplete batch: {why.decode('ascii')}", pos)
            break
        if hs == H_CORRUPT:
            raise _corrupt(why.decode("ascii"), pos)
        if h.last_offset < min_offset:
            pos += h.size
            continue
        if used + h.size > max_bytes and (used > 0 or not min_one):
            break
        added += _decode_batch(p, pos, &h, min_offset, max_records - added, out, verify_crc,
                               include_control)
        used += h.size
        if added >= max_records and len(out) > start_len:
            # stopped inside or at the end of this batch
            next_offset = (<Record>out[len(out) - 1]).offset + 1
            if next_offset > h.last_offset:
                pos += h.size
            return (pos, next_offset, used)
        pos += h.size
        next_offset = h.last_offset + 1
    return (pos, next_offset, used)

cdef inline bint _index_usable(Mapping m, Py_ssize_t n, Py_ssize_t esize):
    """An index mapping a reader may search: open (the writer closes one it swaps at a resize or
    roll while reader threads may still hold it) and long enough for its entry count (count and
    mapping are published one after the other). A reader that cannot use it scans instead."""
    return m is not None and not m.closing and 0 <= n and n * esize <= m.length


cdef Py_ssize_t _index_position(Mapping index, Py_ssize_t entries, int64_t base_offset,
                                int64_t offset, const uint8_t* p, Py_ssize_t end) except -1:
    """Position to start scanning for `offset`: the offset index's floor entry, or 0 when the
    index has nothing below offset or its entry is not trustworthy (a position outside the data,
    or a batch there that starts after the indexed offset: a stale or damaged index never makes a
    read skip records)."""
    cdef Py_ssize_t slot, pos
    cdef const uint8_t* ip
    cdef int64_t idx_off
    cdef BatchHeader h
    cdef const char* why
    if entries <= 0 or offset <= base_offset or not _index_usable(index, entries, 8):
        return 0
    ip = index.ptr()
    slot = _floor_slot(ip, entries, 8, 0, False, base_offset, offset, 1024)
    if slot < 0:
        return 0
    pos = ld32(ip + 8 * slot + 4)
    idx_off = base_offset + ld32(ip + 8 * slot)
    if pos <= 0 or pos >= end:
        return 0
    if _parse_header(p, pos, end, &h, &why) != H_OK:
        return 0
    if h.base_offset > idx_off and not (h.magic < 2 and (h.attrs & CODEC_MASK) != 0):
        return 0
    return pos


def index_position(Mapping index, Py_ssize_t entries, int64_t base_offset, int64_t offset,
                   Mapping m, Py_ssize_t end):
    """Where to start scanning the .log for `offset` (see _index_position): the offset index's
    floor entry, or 0 when the index has nothing trustworthy below offset."""
    if end < 0 or end > m.length:
        raise ValueError("scan end outside mapping")
    return _index_position(index, entries, base_offset, offset, m.ptr(), end)


cdef tuple _read_at(Mapping m, Mapping index, Py_ssize_t index_entries, int64_t base_offset,
                    Py_ssize_t end, int64_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
                    bint verify_crc, list out, bint min_one):
    cdef Py_ssize_t pos
    cdef const uint8_t* p
    if end < 0 or end > m.length:
        raise ValueError("read range outside mapping")
    p = m.ptr()
    pos = _index_position(index, index_entries, base_offset, offset, p, end)
    m.pin()
    try:
        return _read_range(p, pos, end, offset, max_records, max_bytes, verify_crc, out, False, min_one)
    finally:
        m.unpin()


def read_at(Mapping m, Mapping index, Py_ssize_t index_entries, int64_t base_offset,
            Py_ssize_t end, int64_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
            bint verify_crc, list out, bint min_one=True):
    """Segment read in one call: offset-index floor, scan to the batch, decode (see _read_range).
    A floor position outside [0, end] (a damaged index) falls back to a scan from 0."""
    return _read_at(m, index, index_entries, base_offset, end, offset, max_records, max_bytes,
                    verify_crc, out, min_one)


cdef class IndexState:
    """The live state of an offset index that the read fast path needs: its mapping and the
    number of entries in use. Owned and kept current by kstore.index.AbstractIndex."""
    cdef public Mapping map
    cdef public Py_ssize_t entries


cdef class SegmentView:
    """What the read fast path needs of a segment, kept current by kstore.segment.LogSegment:
    the .log mapping (None until mapped), the offset index state (None until loaded), the base
    offset and the logical size."""
    cdef public Mapping log_map
    cdef public IndexState index
    cdef public IndexState tindex
    cdef public int64_t base_offset
    cdef public Py_ssize_t size
    cdef public bint max_ts_known
    cdef public int64_t max_timestamp
    cdef public int64_t offset_of_max_timestamp
    cdef public object corrupt       # read-only views: why the bytes at `size` are invalid, or None

    def __init__(self, int64_t base_offset):
        self.base_offset = base_offset

    def snapshot(self):
        """(log mapping, end) taken together, end clamped to the mapping: a writer that swaps in
        a smaller file publishes the smaller size first, so no pair reaches past a file's end."""
        cdef Py_ssize_t end = self.size
        if self.log_map is None:
            return None, 0
        if end > self.log_map.length:
            end = self.log_map.length
        return self.log_map, end

    cdef inline bint ready(self):
        return self.log_map is not None and self.index is not None and not self.log_map.closing \
            and (self.index.map is not None or self.index.entries == 0)

    @property
    def is_ready(self):
        """Mapped with its index loaded: the read fast path can use it."""
        return self.ready()

    cdef tuple _read(self, int64_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
                     bint verify_crc, list out, bint min_one):
        cdef Py_ssize_t end = self.size, before = len(out)
        cdef tuple res
        if end > self.log_map.length:
            end = self.log_map.length
        res = _read_at(self.log_map, self.index.map, self.index.entries, self.base_offset, end,
                       offset, max_records, max_bytes, verify_crc, out, min_one)
        if self.corrupt is not None and <Py_ssize_t>res[0] >= end and \
                len(out) - before < max_records and <Py_ssize_t>res[2] < max_bytes:
            # the read wants the bytes a read-only refresh found invalid: fail as the writer would
            raise _corrupt(self.corrupt, end)
        return res

    def read(self, int64_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes, bint verify_crc,
             list out, bint min_one=True):
        """read_at over this segment; the caller guarantees readiness (see log_read)."""
        if not self.ready():
            raise ValueError("segment view is not mapped")
        return self._read(offset, max_records, max_bytes, verify_crc, out, min_one)


def log_read(list bases, list views, int64_t offset, Py_ssize_t max_records,
             Py_ssize_t max_bytes, bint verify_crc, list out, Py_ssize_t used=0):
    """Log.read's fast path: bisect the segment, then read across segments within the limits,
    appending records to out.

    The records form one contiguous run of the log: a segment whose next batch does not fit the
    remaining byte budget ends the read there (never a later segment's smaller batch). Returns
    None when done, or (segment index, offset, bytes used) when it reached a segment that is not
    mapped or whose index is not loaded (or was closed under it): the caller prepares that
    segment and calls again with that offset (the one after the last record read) and byte
    count and the same out, so the records already read are not decoded
    again (a read that crosses S unmapped segments costs O(S), not O(S^2)). min_one (at least one
    batch whatever max_bytes) holds only while nothing was read. CorruptRecordError carries
    .segment, the index of the segment at fault.
    """
    cdef Py_ssize_t n = PyList_GET_SIZE(bases), lo = 0, hi, mid, i, end
    cdef SegmentView v
    cdef tuple res
    cdef int64_t base
    if n == 0 or PyList_GET_SIZE(views) != n:
        return (0, offset, used)
    hi = n
    while lo < hi:             # bisect_right
        mid = (lo + hi) >> 1
        if offset < <int64_t>(<object>PyList_GET_ITEM(bases, mid)):
            hi = mid
        else:
            lo = mid + 1
    i = lo - 1
    if i < 0:
        i = 0
    while i < n:
        v = <SegmentView>PyList_GET_ITEM(views, i)
        if not v.ready():
            # offset stays where the records stopped: the caller's lists may be stale (a
            # truncation closed this segment), so it resumes by offset, never at this base
            return (i, offset, used)
        base = v.base_offset
        if offset < base:
            offset = base      # nothing lies between one segment's end and the next's base
        end = v.size
        if end > v.log_map.length:
            end = v.log_map.length
        try:
            res = v._read(offset, max_records - len(out), max_bytes - used, verify_crc, out,
                          used == 0)
        except CorruptRecordError as e:
            e.segment = i
            raise
        used += <Py_ssize_t>res[2]
        if len(out) >= max_records or used >= max_bytes:
            break
        if <Py_ssize_t>res[0] < end:
            break              # the next batch of this segment did not fit: stop here
        if len(out):
            offset = (<Record>out[len(out) - 1]).offset + 1
        i += 1
    return None


def decode_batches(data, int64_t min_offset=-1, bint verify_crc=True, bint include_control=False):
    """Decode every record in a bytes-like run of batches (e.g. from read_batches or a file);
    control records (transaction markers) only with include_control, as consumers skip them."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0]
    cdef list out = []
    if n == 0:
        return out
    _read_range(&mv[0], 0, n, min_offset, <Py_ssize_t>1 << 62, <Py_ssize_t>1 << 62, verify_crc,
                out, True, True, include_control)
    return out

cdef inline Py_ssize_t _floor_slot(const uint8_t* p, Py_ssize_t n, Py_ssize_t esize, int key_off,
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

cdef inline Py_ssize_t _checked_entries(Mapping m, Py_ssize_t n, Py_ssize_t esize) except -2:
    if n < 0 or n * esize > m.length:
        raise ValueError(f"{n} index entries do not fit a mapping of {m.length} bytes")
    return n

def offset_index_floor_slot(Mapping m, Py_ssize_t n, int64_t base_offset, int64_t target):
    """Slot of the largest entry with offset <= target, or -1."""
    _checked_entries(m, n, 8)
    return _floor_slot(m.ptr(), n, 8, 0, False, base_offset, target, 1024)

def offset_index_lookup(Mapping m, Py_ssize_t n, int64_t base_offset, int64_t target):
    """OffsetIndex.lookup: (offset, position) of the floor entry, or (base_offset, 0)."""
    _checked_entries(m, n, 8)
    cdef const uint8_t* p = m.ptr()
    cdef Py_ssize_t s = _floor_slot(p, n, 8, 0, False, base_offset, target, 1024)
    if s < 0:
        return (base_offset, 0)
    return (base_offset + ld32(p + 8 * s), ld32(p + 8 * s + 4))

def time_index_lookup(Mapping m, Py_ssize_t n, int64_t base_offset, int64_t ts):
    """TimeIndex.lookup: (timestamp, offset) of the floor entry by timestamp, or (-1, base)."""
    _checked_entries(m, n, 12)
    cdef const uint8_t* p = m.ptr()
    cdef Py_ssize_t s = _floor_slot(p, n, 12, 0, True, 0, ts, 682)
    if s < 0:
        return (NO_TIMESTAMP, base_offset)
    return (ld64(p + 12 * s), base_offset + ld32(p + 12 * s + 8))

def time_index_floor_slot_by_offset(Mapping m, Py_ssize_t n, int64_t base_offset, int64_t target):
    """Slot of the largest time entry whose offset <= target (TimeIndex.truncateTo), or -1."""
    _checked_entries(m, n, 12)
    return _floor_slot(m.ptr(), n, 12, 8, False, base_offset, target, 682)

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

# ---------------------------------------------------------------------------------------------
# Timestamp search inside a segment (Kafka LogSegment.findOffsetByTimestamp, after the lookups)
# ---------------------------------------------------------------------------------------------
cdef object _find_ts(Mapping m, Py_ssize_t start, Py_ssize_t end, int64_t ts,
                     int64_t start_offset, bint verify_crc):
    cdef const uint8_t* p = m.ptr()
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t pos = start
    cdef int hs
    cdef list tmp = []
    cdef Record r
    m.pin()
    try:
        while True:
            hs = _parse_header(p, pos, end, &h, &why)
            if hs == H_END:
                return None
            if hs == H_CORRUPT:
                raise _corrupt(why.decode("ascii"), pos)
            if h.max_timestamp >= ts and h.last_offset >= start_offset:
                del tmp[:]
                _decode_batch(p, pos, &h, start_offset, <Py_ssize_t>1 << 62, tmp, verify_crc, False)
                for o in tmp:
                    r = <Record>o
                    if r.timestamp >= ts and r.offset >= start_offset:
                        return (r.offset, r.timestamp)
            pos += h.size
    finally:
        m.unpin()


def find_offset_by_timestamp(Mapping m, Py_ssize_t start, Py_ssize_t end, int64_t ts,
                             int64_t start_offset, bint verify_crc=True):
    """First record at or after `start` with timestamp >= ts and offset >= start_offset:
    (offset, timestamp), or None."""
    if start < 0 or end > m.length or start > end:
        raise ValueError("scan range outside mapping")
    return _find_ts(m, start, end, ts, start_offset, verify_crc)


def log_offset_for_timestamp(list views, int64_t ts, int64_t start_offset, bint verify_crc=True):
    """Log.fetch_offset_by_timestamp's fast path over the segment views: the first segment whose
    largest timestamp >= ts, time-index floor, offset-index floor, scan. Returns (offset,
    timestamp), False if no record qualifies, or None when a segment needs preparing first."""
    cdef SegmentView v
    cdef Py_ssize_t i, n = PyList_GET_SIZE(views), slot, pos, end
    cdef int64_t off
    cdef const uint8_t* tp
    cdef const uint8_t* op
    for i in range(n):
        v = <SegmentView>PyList_GET_ITEM(views, i)
        if v.size == 0:
            continue
        if not v.max_ts_known:
            return None
        if v.max_timestamp < ts:
            continue              # also skips segments with no timestamps (v0): nothing to find
        if not v.ready() or v.tindex is None:
            return None
        off = v.base_offset
        if v.tindex.entries > 0 and _index_usable(v.tindex.map, v.tindex.entries, 12):
            tp = v.tindex.map.ptr()
            slot = _floor_slot(tp, v.tindex.entries, 12, 0, True, 0, ts, 682)
            if slot >= 0:
                off = v.base_offset + ld32(tp + 12 * slot + 8)
        if off < start_offset:
            off = start_offset
        end = v.size
        if end > v.log_map.length:
            end = v.log_map.length
        pos = _index_position(v.index.map, v.index.entries, v.base_offset, off,
                              v.log_map.ptr(), end)
        try:
            r = _find_ts(v.log_map, pos, end, ts, start_offset, verify_crc)
        except CorruptRecordError as e:
            e.segment = i
            raise
        if r is not None:
            return r
    return False


# ---------------------------------------------------------------------------------------------
# Log compaction: the dedupe map (Kafka's SkimpyOffsetMap) and batch filtering (filterTo)
# ---------------------------------------------------------------------------------------------
cdef extern from "_kstore.h" nogil:
    void ks_murmur3_128(const unsigned char *data, size_t len, uint64_t out[2])



cdef class OffsetMap:
    """Fixed-size open-addressing table in a numpy buffer: 24-byte slots holding a 128-bit key
    hash and the latest offset seen for that key (Kafka's SkimpyOffsetMap). Filled up to
    load_factor of its slots; collisions between distinct keys are ~2^-128."""
    cdef object buffer
    cdef uint8_t* p
    cdef readonly Py_ssize_t slots
    cdef readonly Py_ssize_t size
    cdef readonly Py_ssize_t capacity
    cdef readonly int64_t latest_offset
    cdef readonly int64_t lookups
    cdef readonly int64_t probes
    cdef bint _used

    def __init__(self, Py_ssize_t memory, double load_factor=0.9):
        cdef uint8_t[::1] view
        if memory < 24 * 2:
            raise ValueError(f"dedupe buffer of {memory} bytes is too small")
        self.slots = memory // 24
        self.capacity = <Py_ssize_t>(self.slots * load_factor)
        if self.capacity < 1:
            self.capacity = 1
        # np.zeros hands out untouched zero pages: a 128 MiB map costs nothing until used
        self.buffer = np.zeros(self.slots * 24, dtype=np.uint8)
        view = self.buffer
        self.p = &view[0]
        self.size = 0
        self.latest_offset = -1
        self._used = False

    def clear(self):
        if self._used:
            memset(self.p, 0, self.slots * 24)
        self.size = 0
        self.latest_offset = -1
        self._used = False

    cdef inline Py_ssize_t _find(self, const uint8_t* key, Py_ssize_t klen, uint64_t* h) noexcept nogil:
        """Slot holding the key's hash, or the empty slot where it would go."""
        cdef Py_ssize_t i, slot
        cdef uint64_t a, b
        ks_murmur3_128(key, klen, h)
        if h[0] == 0 and h[1] == 0:
            h[1] = 1                     # all-zero marks an empty slot
        slot = <Py_ssize_t>(h[0] % <uint64_t>self.slots)
        self.lookups += 1
        while True:
            self.probes += 1
            memcpy(&a, self.p + slot * 24, 8)
            memcpy(&b, self.p + slot * 24 + 8, 8)
            if (a == h[0] and b == h[1]) or (a == 0 and b == 0):
                return slot
            slot += 1
            if slot == self.slots:
                slot = 0

    cdef inline void _put(self, const uint8_t* key, Py_ssize_t klen, int64_t offset) noexcept nogil:
        cdef uint64_t h[2]
        cdef uint64_t a
        self._used = True
        cdef Py_ssize_t slot = self._find(key, klen, h)
        memcpy(&a, self.p + slot * 24, 8)
        if a == 0 and ld64(self.p + slot * 24 + 8) == 0:
            self.size += 1
        memcpy(self.p + slot * 24, h, 16)
        memcpy(self.p + slot * 24 + 16, &offset, 8)
        self.latest_offset = offset

    cdef inline int64_t _get(self, const uint8_t* key, Py_ssize_t klen) noexcept nogil:
        cdef uint64_t h[2]
        cdef uint64_t a, b
        cdef int64_t off
        cdef Py_ssize_t slot = self._find(key, klen, h)
        memcpy(&a, self.p + slot * 24, 8)
        memcpy(&b, self.p + slot * 24 + 8, 8)
        if a == 0 and b == 0:
            return -1
        memcpy(&off, self.p + slot * 24 + 16, 8)
        return off

    def put(self, key, int64_t offset):
        cdef const uint8_t[::1] mv = key
        if self.size >= self.capacity:
            raise ValueError("offset map is full")
        self._put(&mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0], offset)

    def get(self, key):
        cdef const uint8_t[::1] mv = key
        return self._get(&mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])

    @property
    def full(self):
        return self.size >= self.capacity

    @property
    def utilization(self):
        return self.size / self.slots


cdef Py_ssize_t _map_v2_records(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, int64_t base,
                                int32_t count, int64_t first_dirty, OffsetMap omap) noexcept nogil:
    """Put every keyed record with offset >= first_dirty into the map; -1 if malformed."""
    cdef int32_t i
    cdef RecordFields f
    for i in range(count):
        if _record_fields(p, pos, end, &f) < 0:
            return -1
        if f.key_len >= 0 and base + f.off_delta >= first_dirty:
            omap._put(p + f.key_pos, f.key_len, base + f.off_delta)
        pos = f.end
    return 0


def build_offset_map(Mapping m, Py_ssize_t start, Py_ssize_t end, int64_t first_dirty,
                     OffsetMap omap):
    """Kafka's buildOffsetMapForSegment: put the keyed records of [start, end) with offset >=
    first_dirty, batch by batch, until a batch would overfill the map. Control batches are
    skipped. Returns (next_position, full)."""
    if start < 0 or end > m.length or start > end:
        raise ValueError("scan range outside mapping")
    cdef const uint8_t* p = m.ptr()
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t pos = start
    cdef int hs, rc
    cdef list tmp = []
    cdef Record r
    m.pin()
    try:
        while True:
            hs = _parse_header(p, pos, end, &h, &why)
            if hs != H_OK:
                if hs == H_CORRUPT:
                    raise _corrupt(why.decode("ascii"), pos)
                return (pos, False)
            if h.last_offset < first_dirty or (h.magic == 2 and (h.attrs & CONTROL_BIT)):
                pos += h.size
                continue
            if omap.size + h.count > omap.capacity:
                return (pos, True)
            _require_crc(p, pos, &h)
            if h.magic == 2 and (h.attrs & CODEC_MASK) == 0:
                with nogil:
                    rc = _map_v2_records(p, pos + V2_OVERHEAD, pos + h.size, h.base_offset,
                                         h.count, first_dirty, omap)
                if rc < 0:
                    raise _corrupt("malformed record while building the offset map", pos)
            else:
                del tmp[:]
                _decode_batch(p, pos, &h, first_dirty, <Py_ssize_t>1 << 62, tmp, True, False)
                if omap.size + len(tmp) > omap.capacity:
                    return (pos, True)
                for o in tmp:
                    r = <Record>o
                    if r.key is not None:
                        omap._put(<const uint8_t*>PyBytes_AS_STRING(r.key), len(r.key), r.offset)
            pos += h.size
    finally:
        m.unpin()


cdef class CleanStats:
    """Counters of one filter call."""
    cdef public int64_t records_read, records_kept, bytes_read, bytes_written
    cdef public int64_t batches_copied, batches_rebuilt, batches_dropped, tombstones_kept
    cdef public int64_t max_timestamp, offset_of_max_timestamp, last_offset

    def __init__(self):
        self.max_timestamp = -1
        self.offset_of_max_timestamp = -1
        self.last_offset = -1


cdef inline bint _keep(OffsetMap omap, int64_t offset, const uint8_t* key, Py_ssize_t klen,
                       bint is_tombstone, bint retain_deletes) noexcept nogil:
    if offset > omap.latest_offset:
        return True                       # beyond what the map covers: untouched
    if klen < 0:
        return False                      # unkeyed records are dropped from compacted logs
    if offset < omap._get(key, klen):
        return False                      # a later value of the key exists
    return (not is_tombstone) or retain_deletes


cdef Py_ssize_t _scan_keep(const uint8_t* rp, Py_ssize_t rn, int32_t count, int64_t base_offset,
                           int64_t base_ts, OffsetMap omap, bint retain_deletes, int64_t* ranges,
                           Py_ssize_t cap, bint* tomb_kept, int64_t* max_ts,
                           int64_t* records_read) noexcept nogil:
    """Pass 1 of the filter, without the GIL: for each kept record store (start, end,
    offset-delta position, timestamp) in ranges. Returns the number kept, or -1 if malformed."""
    cdef int32_t i
    cdef Py_ssize_t q = 0, kept = 0
    cdef RecordFields f
    for i in range(count):
        if _record_fields(rp, q, rn, &f) < 0:
            return -1
        records_read[0] += 1
        if _keep(omap, base_offset + f.off_delta, rp + f.key_pos, f.key_len, f.value_len < 0,
                 retain_deletes):
            if kept >= cap:
                return -1
            ranges[4 * kept] = q
            ranges[4 * kept + 1] = f.end
            ranges[4 * kept + 2] = f.offd_pos
            ranges[4 * kept + 3] = base_ts + f.ts_delta
            kept += 1
            if f.value_len < 0:
                tomb_kept[0] = True
            if base_ts + f.ts_delta > max_ts[0]:
                max_ts[0] = base_ts + f.ts_delta
        q = f.end
    return kept


cdef Py_ssize_t _rebuild_v2(const uint8_t* batch, const uint8_t* rp, const int64_t* ranges,
                           Py_ssize_t nk, int64_t old_base_ts, int64_t new_base_ts, int attrs,
                           bint lat, int64_t max_ts, uint8_t* out) noexcept nogil:
    """Write a rebuilt uncompressed v2 batch (same base/last offsets) into out; returns its size.
    out must hold 61 + the kept records' bytes + 15 per record."""
    cdef Py_ssize_t w = V2_OVERHEAD, i, a, b, offd_pos, tn, body
    cdef uint8_t tmpv[16]
    cdef uint32_t crc
    memcpy(out, batch, V2_OVERHEAD)
    for i in range(nk):
        a = ranges[4 * i]
        b = ranges[4 * i + 1]
        if new_base_ts == old_base_ts:
            memcpy(out + w, rp + a, b - a)
            w += b - a
        else:
            offd_pos = ranges[4 * i + 2]
            tn = put_varint(tmpv, 0, ranges[4 * i + 3] - new_base_ts)
            body = 1 + tn + (b - offd_pos)
            w = put_varint(out, w, body)
            out[w] = rp[a + _varint_len_nogil(rp, a)]      # attributes byte
            w += 1
            memcpy(out + w, tmpv, tn)
            w += tn
            memcpy(out + w, rp + offd_pos, b - offd_pos)
            w += b - offd_pos
    st32(out + 8, <uint32_t>(w - LOG_OVERHEAD))
    st16(out + 21, <uint16_t>attrs)
    st64(out + 27, <uint64_t>new_base_ts)
    if not lat and nk:
        st64(out + 35, <uint64_t>max_ts)
    st32(out + 57, <uint32_t>nk)
    crc = ks_crc32c(0, out + 21, w - 21)
    st32(out + 17, crc)
    return w


cdef inline Py_ssize_t _varint_len_nogil(const uint8_t* p, Py_ssize_t pos) noexcept nogil:
    cdef Py_ssize_t n = 1
    while p[pos] & 0x80:
        pos += 1
        n += 1
    return n


def filter_batches(Mapping m, Py_ssize_t start, Py_ssize_t end, OffsetMap omap, int64_t now,
                   int64_t delete_retention_ms, bint legacy_retain_deletes, int64_t final_offset,
                   Py_ssize_t max_out, CleanStats stats):
    """Kafka's MemoryRecords.filterTo over [start, end): returns (next_position, bytes).

    Unchanged batches are copied byte for byte; changed v2 batches are rebuilt with the same base
    and last offsets; a v2 batch that keeps tombstones gets a delete horizon (now +
    delete.retention.ms) if it has none, and past its horizon its tombstones go. The batch whose
    last offset is final_offset is kept even if empty. Stops before exceeding max_out bytes.
    """
    if start < 0 or end > m.length or start > end:
        raise ValueError("scan range outside mapping")
    cdef const uint8_t* p = m.ptr()
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t pos = start
    cdef int hs
    cdef bytearray out = bytearray()
    cdef int64_t new_base_ts, max_ts
    cdef bint retain_deletes, has_horizon, tomb_kept, set_horizon, lat
    cdef uint32_t crc
    cdef const uint8_t* rp
    cdef Py_ssize_t rn, cap, nk, wn
    cdef uint8_t* obuf
    cdef int attrs_new
    cdef int64_t* ranges
    cdef int64_t rr
    m.pin()
    try:
        while True:
            hs = _parse_header(p, pos, end, &h, &why)
            if hs != H_OK:
                if hs == H_CORRUPT:
                    raise _corrupt(why.decode("ascii"), pos)
                break
            # bounded by input and output bytes: each call holds the GIL only briefly
            if pos > start and (len(out) + h.size > max_out or pos - start >= max_out):
                break
            # verified before anything is copied or rebuilt: a rebuilt batch gets a fresh CRC,
            # which must never launder corrupt bytes into valid-looking data
            _require_crc(p, pos, &h)
            stats.bytes_read += h.size
            if h.magic < 2:
                _filter_legacy(p, pos, &h, omap, legacy_retain_deletes, final_offset, out, stats)
                pos += h.size
                continue
            if (h.attrs & CONTROL_BIT):
                # no transactions are written by kstore; markers of a broker's data are kept
                out += PyBytes_FromStringAndSize(<const char*>(p + pos), h.size)
                stats.batches_copied += 1
                stats.bytes_written += h.size
                stats.last_offset = h.last_offset
                pos += h.size
                continue
            has_horizon = (h.attrs & HORIZON_BIT) != 0
            retain_deletes = (not has_horizon) or now < h.base_timestamp
            lat = (h.attrs & TS_TYPE_BIT) != 0
            # decode the records region (decompressing if needed)
            if (h.attrs & CODEC_MASK) == 0:
                rp = p + pos + V2_OVERHEAD
                rn = h.size - V2_OVERHEAD
                inner = None
            else:
                inner = _decompress_value(h.attrs & CODEC_MASK, p + pos + V2_OVERHEAD,
                                          h.size - V2_OVERHEAD, pos)
                rp = <const uint8_t*>PyBytes_AS_STRING(inner)
                rn = len(inner)
            # pass 1 (no GIL): which records stay
            cap = h.count if h.count < rn else rn
            if cap < 1:
                cap = 1
            ranges = <int64_t*>malloc(cap * 4 * sizeof(int64_t))
            if ranges == NULL:
                raise MemoryError()
            tomb_kept = False
            max_ts = -1
            rr = 0
            with nogil:
                nk = _scan_keep(rp, rn, h.count, h.base_offset, h.base_timestamp, omap,
                                retain_deletes, ranges, cap, &tomb_kept, &max_ts, &rr)
            stats.records_read += rr
            if nk < 0:
                free(ranges)
                raise _corrupt("malformed record while cleaning", pos)
            stats.records_kept += nk
            if tomb_kept:
                stats.tombstones_kept += 1
            set_horizon = tomb_kept and not has_horizon
            if nk == h.count and not set_horizon:
                free(ranges)
                out += PyBytes_FromStringAndSize(<const char*>(p + pos), h.size)
                stats.batches_copied += 1
                stats.bytes_written += h.size
                stats.last_offset = h.last_offset
                _track_max(stats, h.max_timestamp, h.last_offset)
                pos += h.size
                continue
            if nk == 0 and h.last_offset != final_offset:
                free(ranges)
                stats.batches_dropped += 1
                pos += h.size
                continue
            # rebuild (same base/last offsets; timestamps re-based on a new horizon) in C without
            # the GIL; a compressed batch then gets its records region compressed again
            new_base_ts = now + delete_retention_ms if set_horizon else h.base_timestamp
            attrs_new = h.attrs | (HORIZON_BIT if set_horizon else 0)
            if nk == 0:
                attrs_new = attrs_new & ~CODEC_MASK
            obuf = <uint8_t*>malloc(h.size + rn + nk * 15 + V2_OVERHEAD)
            if obuf == NULL:
                free(ranges)
                raise MemoryError()
            with nogil:
                wn = _rebuild_v2(p + pos, rp, ranges, nk, h.base_timestamp, new_base_ts, attrs_new,
                                 lat, max_ts, obuf)
            free(ranges)
            try:
                if attrs_new & CODEC_MASK:
                    payload = _compress(attrs_new & CODEC_MASK,
                                        PyBytes_FromStringAndSize(<const char*>(obuf + V2_OVERHEAD),
                                                                  wn - V2_OVERHEAD), None, 2)
                    st32(obuf + 8, <uint32_t>(V2_OVERHEAD - LOG_OVERHEAD + len(payload)))
                    crc = ks_crc32c(0, obuf + 21, V2_OVERHEAD - 21)
                    crc = ks_crc32c(crc, <const uint8_t*>PyBytes_AS_STRING(payload), len(payload))
                    st32(obuf + 17, crc)
                    out += PyBytes_FromStringAndSize(<const char*>obuf, V2_OVERHEAD)
                    out += payload
                    wn = V2_OVERHEAD + len(payload)
                else:
                    out += PyBytes_FromStringAndSize(<const char*>obuf, wn)
            finally:
                free(obuf)
            stats.batches_rebuilt += 1
            stats.bytes_written += wn
            stats.last_offset = h.last_offset
            _track_max(stats, h.max_timestamp if (lat or not nk) else max_ts, h.last_offset)
            pos += h.size
    finally:
        m.unpin()
    return (pos, bytes(out))


cdef inline void _track_max(CleanStats stats, int64_t ts, int64_t off):
    if ts > stats.max_timestamp:
        stats.max_timestamp = ts
        stats.offset_of_max_timestamp = off


cdef int _filter_legacy(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, OffsetMap omap,
                        bint retain_deletes, int64_t final_offset, bytearray out,
                        CleanStats stats) except -1:
    """A v0/v1 message: kept or dropped whole. A compressed wrapper is kept whole if any inner
    record must stay (conservative: a latest value is never lost)."""
    cdef list tmp = []
    cdef Record r
    cdef bint keep = False
    cdef const uint8_t* kp
    _decode_batch(p, pos, h, -1, <Py_ssize_t>1 << 62, tmp, True, False)
    for o in tmp:
        r = <Record>o
        stats.records_read += 1
        if r.key is None:
            kp = NULL
        else:
            kp = <const uint8_t*>PyBytes_AS_STRING(r.key)
        if _keep(omap, r.offset, kp, -1 if r.key is None else len(r.key), r.value is None,
                 retain_deletes):
            keep = True
            stats.records_kept += 1
    if keep or h.last_offset == final_offset:
        out += PyBytes_FromStringAndSize(<const char*>(p + pos), h.size)
        stats.batches_copied += 1
        stats.bytes_written += h.size
        stats.last_offset = h.last_offset
        _track_max(stats, h.max_timestamp, h.last_offset)
    else:
        stats.batches_dropped += 1
    return 0


# ---------------------------------------------------------------------------------------------
# Columnar decode: records straight into Arrow-layout buffers (the Spark / Arrow read path)
# ---------------------------------------------------------------------------------------------
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
    pyarrow RecordBatch)."""
    cdef Buf b[16]
    cdef readonly Py_ssize_t count
    cdef readonly Py_ssize_t header_count
    cdef readonly bint headers
    cdef readonly Py_ssize_t live_views    # views() alive: while > 0 the columns are frozen

    def __cinit__(self, bint headers=False):
        memset(self.b, 0, sizeof(self.b))
        self.headers = headers
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

    @property
    def data_bytes(self):
        """Bytes of key, value and header data held."""
        return self._data_bytes()

    cdef inline Py_ssize_t _data_bytes(self) noexcept nogil:
        return self.b[COL_KDAT].n + self.b[COL_VDAT].n + self.b[COL_HKDAT].n + self.b[COL_HVDAT].n

    cdef int add(self, int64_t offset, int64_t ts_ms, int32_t tstype, const uint8_t* k,
                 Py_ssize_t klen, const uint8_t* v, Py_ssize_t vlen) noexcept nogil:
        """One record without its headers (add_header / end_headers follow when headers=True)."""
        cdef Buf* b = self.b
        if (_put_i64(&b[COL_OFFSET], offset) < 0 or _put_i64(&b[COL_TS], ts_ms * 1000) < 0 or
                _put_i32(&b[COL_TSTYPE], tstype) < 0 or
                _put_binary(&b[COL_KDAT], &b[COL_KOFF], &b[COL_KVAL], k, klen) < 0 or
                _put_binary(&b[COL_VDAT], &b[COL_VOFF], &b[COL_VVAL], v, vlen) < 0):
            return -1
        self.count += 1
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
                  int64_t base_offset, int64_t base_ts, int64_t max_ts, int32_t count, bint lat,
                  int64_t min_offset, int64_t stop_offset, Py_ssize_t max_records,
                  Py_ssize_t max_data, int64_t* next_offset, const char** why) noexcept nogil:
    """Decode one v2 batch's records region p[pos:end) into c (see decode_columns)."""
    cdef int32_t i
    cdef int64_t hcount, hk, hv, j, offset
    cdef Py_ssize_t q, kq, vq
    cdef int tstype = 1 if lat else 0
    cdef RecordFields f
    for i in range(count):
        if _record_fields(p, pos, end, &f) < 0:
            why[0] = f.why
            return C_CORRUPT
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
        q = _header_count(p, &f, &hcount)
        if q < 0:
            why[0] = f.why
            return C_CORRUPT
        if c.add(offset, max_ts if lat else base_ts + f.ts_delta, tstype, p + f.key_pos,
                 f.key_len, p + f.value_pos, f.value_len) < 0:
            return C_NOMEM
        for j in range(hcount):
            q = _next_header(p, q, &f, &kq, &hk, &vq, &hv)
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
        pos = f.end
    if pos != end:
        why[0] = "bytes remain after the batch's records"
        return C_CORRUPT
    return C_DONE


def decode_columns(Mapping m, Py_ssize_t pos, Py_ssize_t end, int64_t min_offset,
                   int64_t stop_offset, Columns cols, Py_ssize_t max_records=1 << 62,
                   Py_ssize_t max_data=1 << 62, bint verify_crc=True):
    """Decode the records with min_offset <= offset < stop_offset of the batches in m[pos:end)
    into cols, until cols holds max_records records or about max_data bytes of key/value/header
    data (at least one record). Control batches are skipped, as consumers do.

    Returns (position, next_offset, status): status 'end' (the range is consumed; position is
    end), 'limit' (resume with min_offset=next_offset at position) or 'stop' (stop_offset
    reached). Uncompressed v2 batches are decoded without the GIL; CRCs are verified first.
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
            hs = _parse_header(p, pos, end, &h, &why)
            if hs == H_END:
                return (pos, next_offset, "end")
            if hs == H_CORRUPT:
                raise _corrupt(why.decode("ascii"), pos)
            if h.last_offset < min_offset:
                pos += h.size
                continue
            if h.magic == 2 and h.base_offset >= stop_offset:
                return (pos, h.base_offset, "stop")
            if verify_crc:
                with nogil:
                    ok = _crc_ok(p, pos, &h, &s, &c)
                if not ok:
                    raise _corrupt(f"CRC mismatch (stored {s:#010x}, computed {c:#010x})", pos)
            if h.magic == 2:
                if h.attrs & CONTROL_BIT:
                    pos += h.size
                    next_offset = h.last_offset + 1
                    continue
                if h.count > h.last_offset - h.base_offset + 1:
                    raise _corrupt(f"record count {h.count} exceeds the batch's offset range", pos)
                codec = h.attrs & CODEC_MASK
                if codec == 0:
                    with nogil:
                        r = _cols_v2(cols, p, pos + V2_OVERHEAD, pos + h.size, h.base_offset,
                                     h.base_timestamp, h.max_timestamp, h.count,
                                     (h.attrs & TS_TYPE_BIT) != 0, min_offset, stop_offset,
                                     max_records, max_data, &next_offset, &why)
                else:
                    if codec > 4:
                        raise _corrupt(f"invalid compression codec {codec}", pos)
                    inner = _decompress_value(codec, p + pos + V2_OVERHEAD, h.size - V2_OVERHEAD, pos)
                    mv = inner
                    n = mv.shape[0]
                    rp = &mv[0] if n else &_empty_byte
                    with nogil:
                        r = _cols_v2(cols, rp, 0, n, h.base_offset, h.base_timestamp,
                                     h.max_timestamp, h.count, (h.attrs & TS_TYPE_BIT) != 0,
                                     min_offset, stop_offset, max_records, max_data,
                                     &next_offset, &why)
                if r == C_CORRUPT:
                    raise _corrupt(why.decode("ascii"), pos)
                if r == C_NOMEM:
                    raise MemoryError()
                if r == C_STOP:
                    return (pos, next_offset, "stop")
                if r == C_LIMIT:
                    return (pos, next_offset, "limit")
            else:
                # v0/v1 messages (a compressed wrapper holds several): rare, decoded as Records
                tmp = []
                _decode_legacy(p, pos, &h, min_offset, <Py_ssize_t>1 << 62, tmp, pos, verify_crc,
                               0, 0, NO_TIMESTAMP, False)
                for o in tmp:
                    rec = <Record>o
                    if rec.offset >= stop_offset:
                        return (pos, rec.offset, "stop")
                    if cols.count >= max_records or (cols.count > 0 and cols._data_bytes() > max_data):
                        return (pos, rec.offset, "limit")
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
        m.unpin()
