# cython: language_level=3
"""Kafka's record format for the extension modules, in one place (LevelDB's log_format.h and
coding.h): sizes and attribute bits, big-endian loads/stores, zig-zag varints, the v2 record
layout, the batch header parse and THE batch validity check used by validation, recovery and
the read-only refresh. The helpers are inline (compiled into each user: no call across
modules); the error paths and codec hooks at the end are _format.pyx's."""
cimport cython
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int16_t, int32_t, int64_t
from libc.string cimport memcpy

from kstore._crc cimport crc32c_update, crc32_update

cdef extern from *:
    """
    #define KS_NO_LIMIT (((Py_ssize_t)1) << 62)
    """
    # "no limit" for a record or byte budget: kstore.config.NO_LIMIT
    const Py_ssize_t NO_LIMIT "KS_NO_LIMIT"

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
    R_VALID = 7         # check_batch: the batch is valid where it lies

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

cdef inline Py_ssize_t blob_size(Py_ssize_t n) noexcept nogil:
    """Encoded size of a varint length and its bytes (n = -1: null, the length alone)."""
    return varint_size(n) + (n if n > 0 else 0)

cdef inline Py_ssize_t put_blob(uint8_t* b, Py_ssize_t pos, const uint8_t* p,
                                 Py_ssize_t n) noexcept nogil:
    pos = put_varint(b, pos, n)
    if n > 0:
        memcpy(b + pos, p, n)
        pos += n
    return pos

cdef inline Py_ssize_t record_body_size(int64_t ts_delta, int64_t off_delta, Py_ssize_t klen,
                                         Py_ssize_t vlen, Py_ssize_t hcount,
                                         Py_ssize_t header_bytes) noexcept nogil:
    """A v2 record's size after its length varint; header_bytes = the headers' blobs."""
    return 1 + varint_size(ts_delta) + varint_size(off_delta) + blob_size(klen) + \
        blob_size(vlen) + varint_size(hcount) + header_bytes

cdef inline Py_ssize_t put_record_head(uint8_t* b, Py_ssize_t pos, Py_ssize_t body,
                                        int64_t ts_delta, int64_t off_delta, const uint8_t* kp,
                                        Py_ssize_t klen, const uint8_t* vp, Py_ssize_t vlen,
                                        Py_ssize_t hcount) noexcept nogil:
    """A v2 record up to its header count; the headers follow as key/value blob pairs."""
    pos = put_varint(b, pos, body)
    b[pos] = 0                      # attributes
    pos = put_varint(b, pos + 1, ts_delta)
    pos = put_varint(b, pos, off_delta)
    pos = put_blob(b, pos, kp, klen)
    pos = put_blob(b, pos, vp, vlen)
    return put_varint(b, pos, hcount)

# ---------------------------------------------------------------------------------------------
# Batch headers (v2 batch or v0/v1 message): shallow parse, CRC, validity
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


# status codes of parse_header
cdef inline int parse_header(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, BatchHeader* h,
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


cdef inline bint crc_ok(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, uint32_t* stored,
                         uint32_t* computed) noexcept nogil:
    if h.magic == 2:
        stored[0] = ldu32(p + pos + 17)
        computed[0] = crc32c_update(0, p + pos + 21, h.size - 21)
    else:
        stored[0] = ldu32(p + pos + 12)
        computed[0] = crc32_update(0, p + pos + 16, h.size - 16)
    return stored[0] == computed[0]


cdef inline bint legacy_lengths_ok(const uint8_t* p, Py_ssize_t pos, BatchHeader* h) noexcept nogil:
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


cdef inline int check_batch(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, BatchHeader* h,
                            int64_t base_offset, int64_t prev_last, bint have_prev,
                            int64_t upper_bound, bint verify_crc, const char** why,
                            uint32_t* stored, uint32_t* computed) noexcept nogil:
    """Kafka's batch validity rules, the one copy (validate_batches, recover_scan): parse the
    header at pos and return R_VALID, or why the batch is not valid there: R_END (no whole
    batch: the end of the data, a torn append or zero padding; why set), R_CORRUPT (why set),
    R_CRC (stored / computed set), R_BELOW_BASE (an offset below base_offset), R_OFFSET_ORDER
    (offsets do not follow prev_last, when have_prev), R_PAST_NEXT (reaches upper_bound, the
    next segment's base offset, when >= 0: base offsets lie outside the CRC, so a flipped bit
    there is caught only this way) or R_OVERFLOW (more than 2^31-1 above base_offset)."""
    cdef int hs = parse_header(p, pos, end, h, why)
    if hs == H_END:
        return R_END
    if hs == H_CORRUPT:
        return R_CORRUPT
    if verify_crc and not crc_ok(p, pos, h, stored, computed):
        return R_CRC
    if h.magic < 2 and not legacy_lengths_ok(p, pos, h):
        why[0] = "key/value lengths do not match the message size"
        return R_CORRUPT
    if h.base_offset < base_offset:
        return R_BELOW_BASE
    if have_prev and ((h.magic == 2 and h.base_offset <= prev_last) or h.last_offset <= prev_last):
        return R_OFFSET_ORDER
    if upper_bound >= 0 and h.last_offset >= upper_bound:
        return R_PAST_NEXT
    if h.last_offset - base_offset > INT32_MAX:
        return R_OVERFLOW
    return R_VALID

# ---------------------------------------------------------------------------------------------
# v2 records: the one record parser of the readers and the cleaner
# ---------------------------------------------------------------------------------------------
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


cdef inline Py_ssize_t record_fields(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
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


cdef inline Py_ssize_t header_count(const uint8_t* p, RecordFields* f, int64_t* n) noexcept nogil:
    """Read the header count after the value: the position of the first header, or -1."""
    cdef Py_ssize_t q = get_varlong(p, f.value_pos + (f.value_len if f.value_len > 0 else 0),
                                    f.end, n, 5)
    if q < 0 or n[0] < 0 or n[0] > f.end - q:
        f.why = "malformed header count"
        return -1
    return q


cdef inline Py_ssize_t next_header(const uint8_t* p, Py_ssize_t q, RecordFields* f,
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


# ---------------------------------------------------------------------------------------------
# Implemented in _format.pyx (error paths and the codec hooks: not inline)
# ---------------------------------------------------------------------------------------------
# CorruptRecordError(msg) with .position set
cdef object corrupt(str msg, Py_ssize_t position)
# raise corrupt(...) at pos unless the batch's stored CRC matches its bytes
cdef int require_crc(const uint8_t* p, Py_ssize_t pos, BatchHeader* h) except -1
# the codecs registered by kstore.compression (set_codecs): compress / decompress bytes
cdef object compress(int codec, object data, object level, int magic)
cdef object decompress(int codec, object data, int magic)
