# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Record decoding: v2 batches (uncompressed or through the codecs) and v0/v1 messages
(a compressed wrapper recursively) into Record objects; the per-segment scan-and-decode loop
of reads (read_range) and decode_batches."""
from libc.stdint cimport uint8_t, uint32_t, int32_t, int64_t
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8

from kstore._format cimport *
from kstore._record cimport Record

from kstore.errors import UnsupportedCodecError, RecordTooLargeError
from kstore._format import CODEC_NAMES as _CODEC_NAMES

cdef uint8_t _empty_byte = 0


cdef Py_ssize_t _decode_v2_records(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                                   int64_t base_offset, int64_t base_ts, int64_t max_ts,
                                   int64_t last_delta, int32_t count, bint lat,
                                   int64_t min_offset, Py_ssize_t max_records, list out,
                                   Py_ssize_t err_pos) except -1:
    """Decode `count` v2 records from p[pos:end) into out (skipping offsets < min_offset);
    stops after max_records. Returns the number appended. Offset deltas must increase and stay
    within the batch's last offset delta, so a batch never yields an offset twice or out of its
    range (compaction leaves gaps, never disorder)."""
    cdef int32_t i
    cdef int64_t hcount, hk, hv, j
    cdef Py_ssize_t q, kq, vq
    cdef Py_ssize_t added = 0
    cdef Record r
    cdef list hdrs
    cdef RecordFields f
    cdef int tstype = 1 if lat else 0
    cdef int64_t prev_delta = -1
    for i in range(count):
        if record_fields(p, pos, end, &f) < 0:
            raise corrupt(f"record {i} of the batch: {f.why.decode('ascii')}", err_pos)
        if f.off_delta <= prev_delta or f.off_delta > last_delta:
            raise corrupt(f"record {i} of the batch: offset delta {f.off_delta} after "
                          f"{prev_delta}, last offset delta {last_delta}", err_pos)
        prev_delta = f.off_delta
        if base_offset + f.off_delta < min_offset:
            pos = f.end
            continue
        q = header_count(p, &f, &hcount)
        if q < 0:
            raise corrupt(f"record {i} of the batch: {f.why.decode('ascii')}", err_pos)
        r = Record.__new__(Record)
        if hcount:
            hdrs = []
            for j in range(hcount):
                q = next_header(p, q, &f, &kq, &hk, &vq, &hv)
                if q < 0:
                    raise corrupt(f"record {i} of the batch: {f.why.decode('ascii')}", err_pos)
                try:
                    hks = PyUnicode_DecodeUTF8(<const char*>(p + kq), hk, NULL)
                except UnicodeDecodeError:
                    raise corrupt(f"record {i}: header key is not UTF-8", err_pos)
                hdrs.append((hks, PyBytes_FromStringAndSize(<const char*>(p + vq), hv)
                             if hv >= 0 else None))
            r.headers = tuple(hdrs)
        else:
            r.headers = ()
        if q != f.end:
            raise corrupt(f"record {i}: {f.end - q} unexpected bytes after the headers", err_pos)
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
        raise corrupt(f"{end - pos} bytes remain after the batch's {count} records", err_pos)
    return added

cdef object decompress_value(int codec, const uint8_t* p, Py_ssize_t n, Py_ssize_t err_pos,
                              int magic=2):
    data = PyBytes_FromStringAndSize(<const char*>p, n)
    try:
        return decompress(codec, data, magic)
    except (UnsupportedCodecError, RecordTooLargeError):
        raise
    except Exception as exc:
        raise corrupt(f"cannot decompress {_CODEC_NAMES.get(codec, codec)} data: {exc}", err_pos)

cdef Py_ssize_t decode_legacy(const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                               int64_t min_offset, Py_ssize_t max_records, list out,
                               Py_ssize_t err_pos, bint verify_crc, int depth,
                               int64_t abs_delta, int64_t wrapper_ts, bint wrapper_lat) except -1:
    """Decode one v0/v1 message (a compressed wrapper recursively) into out."""
    cdef Py_ssize_t q = pos + LOG_OVERHEAD + 4 + 2
    cdef int32_t klen, vlen
    cdef int codec = h.attrs & CODEC_MASK
    cdef int64_t ts = NO_TIMESTAMP
    cdef Record r
    cdef Py_ssize_t added = 0, ipos, n
    cdef BatchHeader ih
    cdef const char* why
    cdef const uint8_t* ip
    cdef int hs
    cdef int64_t last_rel, offset
    cdef bint lat = (h.magic == 1) and (h.attrs & TS_TYPE_BIT) != 0
    cdef uint32_t s, c
    if not legacy_lengths_ok(p, pos, h):
        raise corrupt("key/value lengths do not match the message size", err_pos)
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
        r.headers = ()
        out.append(r)
        return 1
    if depth > 0:
        raise corrupt("nested compressed message", err_pos)
    if codec > 3:
        raise corrupt(f"invalid compression codec {codec} for magic {h.magic}", err_pos)
    if vlen < 0:
        raise corrupt("compressed wrapper message has a null value", err_pos)
    inner = decompress_value(codec, p + q, vlen, err_pos, h.magic)
    cdef const uint8_t[::1] mv = inner
    n = mv.shape[0]
    ip = &mv[0] if n else &_empty_byte
    # first pass: find the last inner offset (v1 inner offsets are relative)
    ipos = 0
    last_rel = -1
    while ipos < n:
        hs = parse_header(ip, ipos, n, &ih, &why)
        if hs != H_OK or ih.magic > 1:
            raise corrupt("malformed message inside a compressed wrapper", err_pos)
        last_rel = ih.base_offset
        ipos += ih.size
    ipos = 0
    while ipos < n:
        parse_header(ip, ipos, n, &ih, &why)
        if verify_crc and not crc_ok(ip, ipos, &ih, &s, &c):
            raise corrupt(f"CRC mismatch in a message inside a compressed wrapper "
                           f"(stored {s:#010x}, computed {c:#010x})", err_pos)
        if (ih.attrs & CODEC_MASK) != 0:
            raise corrupt("nested compressed message", err_pos)
        if h.magic == 1:
            # abs = wrapper offset - last relative + relative
            offset = h.base_offset - last_rel + ih.base_offset
        else:
            offset = ih.base_offset
        ih.base_offset = offset
        ih.last_offset = offset
        added += decode_legacy(ip, ipos, &ih, min_offset, max_records - added, out, err_pos,
                                verify_crc, depth + 1, 0, ts if lat else NO_TIMESTAMP, lat)
        if added >= max_records:
            break
        ipos += ih.size
    return added

cdef Py_ssize_t decode_batch(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, int64_t min_offset,
                              Py_ssize_t max_records, list out, bint verify_crc,
                              bint include_control) except -1:
    cdef int codec
    cdef const uint8_t* rp
    cdef Py_ssize_t n
    if verify_crc:
        require_crc(p, pos, h)
    if h.magic < 2:
        return decode_legacy(p, pos, h, min_offset, max_records, out, pos, verify_crc, 0, 0,
                              NO_TIMESTAMP, False)
    if (h.attrs & CONTROL_BIT) and not include_control:
        return 0
    codec = h.attrs & CODEC_MASK
    if h.count > h.last_offset - h.base_offset + 1:
        raise corrupt(f"record count {h.count} exceeds the batch's offset range", pos)
    if codec == 0:
        return _decode_v2_records(p, pos + V2_OVERHEAD, pos + h.size, h.base_offset,
                                  h.base_timestamp, h.max_timestamp,
                                  h.last_offset - h.base_offset, h.count,
                                  (h.attrs & TS_TYPE_BIT) != 0, min_offset, max_records, out, pos)
    if codec > 4:
        raise corrupt(f"invalid compression codec {codec}", pos)
    inner = decompress_value(codec, p + pos + V2_OVERHEAD, h.size - V2_OVERHEAD, pos)
    cdef const uint8_t[::1] mv = inner
    n = mv.shape[0]
    rp = &mv[0] if n else &_empty_byte
    return _decode_v2_records(rp, 0, n, h.base_offset, h.base_timestamp, h.max_timestamp,
                              h.last_offset - h.base_offset, h.count, (h.attrs & TS_TYPE_BIT) != 0, min_offset, max_records,
                              out, pos)

cdef tuple read_range(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, int64_t min_offset,
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
        hs = parse_header(p, pos, end, &h, &why)
        if hs == H_END:
            if strict and pos < end:
                raise corrupt(f"incomplete batch: {why.decode('ascii')}", pos)
            break
        if hs == H_CORRUPT:
            raise corrupt(why.decode("ascii"), pos)
        if h.last_offset < min_offset:
            pos += h.size
            continue
        if used + h.size > max_bytes and (used > 0 or not min_one):
            break
        added += decode_batch(p, pos, &h, min_offset, max_records - added, out, verify_crc,
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


def decode_batches(data, int64_t min_offset=-1, bint verify_crc=True, bint include_control=False):
    """Decode every record in a bytes-like run of batches (e.g. from read_batches or a file);
    control records (transaction markers) only with include_control, as consumers skip them."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0]
    cdef list out = []
    if n == 0:
        return out
    read_range(&mv[0], 0, n, min_offset, NO_LIMIT, NO_LIMIT, verify_crc,
                out, True, True, include_control)
    return out
