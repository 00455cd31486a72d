# cython: language_level=3
"""The common shape of an input record, recognised in C (BatchBuilder.build's fast path in
kstore/_encode.pyx): a tuple (key, value[, timestamp[, headers]]) whose key and value are exact
bytes or None, whose timestamp is an exact int inside the topic's window or None, and which has
no headers. Anything else (Record, lists, other bytes-likes, headers, a value that fails a
check) is not "plain": the builder's general path takes it and validates it with the usual
messages. Inline and raising nothing: no Python call and no reference count per record."""
cimport cython
from libc.stdint cimport uint8_t, int64_t, uint64_t
from libc.string cimport memcpy, memmove
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_GET_ITEM, PyTuple_CheckExact
from cpython.bytes cimport PyBytes_CheckExact, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.long cimport PyLong_CheckExact

cdef extern from "Python.h":
    # on an exact int it cannot fail: out of range sets *overflow and raises nothing
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) noexcept

cdef extern from *:
    """
    #include <string.h>
    /* An exact int's value when it is non-negative and fits two 30-bit digits (every
       millisecond timestamp until the year 36812), read from CPython 3.11's digits without a
       call; -1 otherwise (the caller then asks PyLong_AsLongLongAndOverflow). */
    static inline long long ks_small_nonneg_long(PyObject *o) {
    #if PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
        Py_ssize_t n = Py_SIZE(o);
        const digit *d = ((PyLongObject *)o)->ob_digit;
        if (n == 2) return (long long)d[0] | ((long long)d[1] << 30);
        if (n == 1) return (long long)d[0];
        if (n == 0) return 0;
    #endif
        (void)o;
        return -1;
    }
    #define ks_prefetch(p) __builtin_prefetch((const void *)(p), 0, 3)

    /* n bytes from s to d (no overlap), n >= 0: fixed-size moves the compiler makes plain
       loads and stores of, overlapping at the tail, never touching a byte outside either
       range; memcpy past 128 bytes. A key or value of the usual few to 100 bytes is a handful
       of instructions instead of a libc call. */
    static inline void ks_copy(uint8_t *d, const uint8_t *s, Py_ssize_t n) {
        if (n > 128) { memcpy(d, s, (size_t)n); return; }
        if (n > 64) {
            memcpy(d, s, 64); memcpy(d + n - 64, s + n - 64, 64);
        } else if (n > 32) {
            memcpy(d, s, 32); memcpy(d + n - 32, s + n - 32, 32);
        } else if (n >= 16) {
            memcpy(d, s, 16); memcpy(d + n - 16, s + n - 16, 16);
        } else if (n >= 8) {
            memcpy(d, s, 8); memcpy(d + n - 8, s + n - 8, 8);
        } else if (n >= 4) {
            memcpy(d, s, 4); memcpy(d + n - 4, s + n - 4, 4);
        } else {
            for (Py_ssize_t i = 0; i < n; i++) d[i] = s[i];
        }
    }

    /* A zig-zagged varint at p[pos] (the loop's bytes), the one- and two-byte cases (lengths,
       deltas and offsets under 8192) without the loop; returns the position after it. */
    static inline Py_ssize_t ks_vput(uint8_t *p, Py_ssize_t pos, unsigned long long u) {
        if (u < 0x80) { p[pos] = (uint8_t)u; return pos + 1; }
        if (u < 0x4000) { p[pos] = (uint8_t)(u | 0x80); p[pos + 1] = (uint8_t)(u >> 7); return pos + 2; }
        while (u >= 0x80) { p[pos++] = (uint8_t)((u & 0x7f) | 0x80); u >>= 7; }
        p[pos] = (uint8_t)u;
        return pos + 1;
    }
    """
    long long ks_small_nonneg_long(PyObject* o) noexcept nogil
    void ks_prefetch(const void* p) noexcept nogil
    void ks_copy(uint8_t* d, const uint8_t* s, Py_ssize_t n) noexcept nogil
    Py_ssize_t ks_vput(uint8_t* p, Py_ssize_t pos, unsigned long long u) noexcept nogil
    int __builtin_clzll(unsigned long long x) noexcept nogil


cdef struct PlainRecord:
    const uint8_t* key       # NULL with klen -1 for a None key
    Py_ssize_t klen
    const uint8_t* value
    Py_ssize_t vlen
    int64_t ts


cdef inline bint _plain_blob(PyObject* o, const uint8_t** p, Py_ssize_t* n) noexcept:
    if o == <PyObject*>None:
        p[0] = NULL
        n[0] = -1
        return True
    if PyBytes_CheckExact(<object>o):
        p[0] = <const uint8_t*>PyBytes_AS_STRING(<object>o)
        n[0] = PyBytes_GET_SIZE(<object>o)
        return True
    return False


cdef inline bint plain_record(PyObject* item, bint require_key, bint log_append_time, int64_t now,
                              int64_t ts_min, int64_t ts_max, PlainRecord* r) noexcept:
    """Fill r and return True if item (a borrowed reference) has the plain shape and passes
    every check; False sends it to the general path. A missing or None timestamp, and any
    timestamp under LogAppendTime, is `now` (unchecked, as on the general path)."""
    cdef Py_ssize_t n
    cdef PyObject* t
    cdef PyObject* h
    cdef int overflow = 0
    if not PyTuple_CheckExact(<object>item):
        return False
    n = PyTuple_GET_SIZE(<object>item)
    if n < 2 or n > 4:
        return False
    if not _plain_blob(PyTuple_GET_ITEM(<object>item, 0), &r.key, &r.klen) or \
            (require_key and r.klen < 0) or \
            not _plain_blob(PyTuple_GET_ITEM(<object>item, 1), &r.value, &r.vlen):
        return False
    r.ts = now
    if n > 2 and not log_append_time:
        t = PyTuple_GET_ITEM(<object>item, 2)
        if t != <PyObject*>None:
            if not PyLong_CheckExact(<object>t):
                return False
            r.ts = ks_small_nonneg_long(t)
            if r.ts < 0:
                r.ts = PyLong_AsLongLongAndOverflow(<object>t, &overflow)
            if overflow or r.ts < 0 or r.ts < ts_min or r.ts > ts_max:
                return False
    if n > 3:
        h = PyTuple_GET_ITEM(<object>item, 3)
        if h != <PyObject*>None and not (PyTuple_CheckExact(<object>h) and PyTuple_GET_SIZE(<object>h) == 0):
            return False
    return True


# ---------------------------------------------------------------------------------------------
# A run of plain records encoded as v2 records in one pass (BatchBuilder._build_v2's fast path)
# ---------------------------------------------------------------------------------------------
cdef struct PlainRun:
    Py_ssize_t pos          # where the next record goes in the buffer
    Py_ssize_t need         # > 0: the run stopped for room; the buffer must hold this many bytes
    int64_t base_ts         # record 0's timestamp (the batch's base timestamp)
    int64_t max_ts


#: bytes a plain record may take beyond its key and value: its length's varint (written 2 bytes
#: in, then moved), attributes, the timestamp delta's, offset delta's, key and value lengths'
#: varints (10 bytes each at most, whatever the lengths), header count:
#: 10 + 2 + 1 + 10 + 10 + 10 + 10 + 1, written out because Cython's overflowcheck (the fuzz
#: build) cannot compile arithmetic in an enum
cdef enum:
    RECORD_SLACK = 54


@cython.overflowcheck(False)    # zig-zag wraps on purpose
cdef inline uint64_t _zz(int64_t v) noexcept nogil:
    return (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)


cdef inline Py_ssize_t _vsize(uint64_t u) noexcept nogil:
    """Bytes of an (already zig-zagged) varint: its significant bits / 7, rounded up, >= 1
    (bits * 9 + 64 >> 6 is that for 1..64 bits); no loop, no division."""
    return ((64 - __builtin_clzll(u | 1)) * 9 + 64) >> 6


cdef inline Py_ssize_t plain_run(PyObject** items, Py_ssize_t i, Py_ssize_t n, uint8_t* buf,
                                 Py_ssize_t cap, bint require_key, bint log_append_time,
                                 int64_t now, int64_t ts_min, int64_t ts_max,
                                 PlainRun* st) noexcept:
    """Encode items[i:n] (borrowed references of the caller's list or tuple) as v2 records
    (no headers) at st.pos while they are plain and fit below cap; returns the index of the
    first record not written (n when all were). It stops at a record that is not plain (the
    general path takes it) or, with st.need set, at one that does not fit. One pass per
    record: the tuple's items read in C, fields written after a provisional two-byte length
    (moved when the length's varint has another size), key and value copied once inline;
    the tuples a few records ahead are prefetched (they are scattered over the heap). The
    bytes are exactly put_record_head's (kstore/_format.pxd)."""
    cdef PlainRecord r
    cdef Py_ssize_t pos = st.pos, q, body, lead, kl, vl
    cdef uint64_t zb
    cdef PyObject* ahead
    while i < n:
        if i + 8 < n:
            ks_prefetch(items[i + 8])
        if i + 4 < n:
            ahead = items[i + 4]
            if PyTuple_CheckExact(<object>ahead) and PyTuple_GET_SIZE(<object>ahead) >= 3:
                ks_prefetch(PyTuple_GET_ITEM(<object>ahead, 0))
                ks_prefetch(PyTuple_GET_ITEM(<object>ahead, 2))
        if not plain_record(items[i], require_key, log_append_time, now, ts_min, ts_max, &r):
            break
        kl = r.klen if r.klen > 0 else 0
        vl = r.vlen if r.vlen > 0 else 0
        if pos + kl + vl + RECORD_SLACK > cap:      # room for the largest encoding
            st.need = pos + kl + vl + RECORD_SLACK
            break
        if i == 0:
            st.base_ts = r.ts
        if r.ts > st.max_ts:
            st.max_ts = r.ts
        # the fields after a provisional two-byte length (the usual one: bodies of 64 to 8191
        # bytes), moved if the length's varint turns out another size
        q = pos + 2
        buf[q] = 0                              # attributes
        q = ks_vput(buf, q + 1, _zz(r.ts - st.base_ts))
        q = ks_vput(buf, q, <uint64_t>i << 1)
        q = ks_vput(buf, q, _zz(r.klen))
        if kl:
            ks_copy(buf + q, r.key, kl)
            q += kl
        q = ks_vput(buf, q, _zz(r.vlen))
        if vl:
            ks_copy(buf + q, r.value, vl)
            q += vl
        buf[q] = 0                              # header count
        q += 1
        body = q - pos - 2
        zb = <uint64_t>body << 1
        if zb >= 0x80 and zb < 0x4000:
            buf[pos] = <uint8_t>(zb | 0x80)
            buf[pos + 1] = <uint8_t>(zb >> 7)
            pos = q
        else:
            lead = _vsize(zb)
            memmove(buf + pos + lead, buf + pos + 2, body)
            ks_vput(buf, pos, zb)
            pos += lead + body
        i += 1
    st.pos = pos
    return i
