# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Record decoding: v2 batches (uncompressed or through the codecs) and v0/v1 messages
(a compressed wrapper recursively) into Record objects; the per-segment scan-and-decode loop
of reads (read_range) and decode_batches; and the record tables of large batches, which let a
read or a time lookup in a mapped segment start at its record instead of decoding the batch
(see "Record tables" below)."""
from libc.stdint cimport uint8_t, uint32_t, int32_t, int64_t
from libc.stdlib cimport malloc, free
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8

from kstore._format cimport *
from kstore._mapping cimport Mapping
from kstore._record cimport Record

from kstore.errors import UnsupportedCodecError, RecordTooLargeError
from kstore._format import CODEC_NAMES as _CODEC_NAMES

cdef uint8_t _empty_byte = 0

# ---------------------------------------------------------------------------------------------
# Record tables. The first read of an uncompressed v2 batch of at least REMEMBER_MIN_BYTES in a
# Mapping verifies its CRC and validates every record (the checks of a full decode: lengths
# within the record and batch, varints well formed, offset deltas increasing within the last
# offset delta, header structure, no bytes after the last of `count` records), and the mapping
# remembers the result (Mapping.remember): a BatchRecords block with, for every 4 records
# (GROUP_SIZE), the first one's position and offset delta and the running maximum timestamp.
# Later reads of the batch skip the CRC and start at their record: its group (direct, or with
# compaction gaps a binary search), then at most 3 length varints; time lookups binary-search
# the running maxima. A batch that fails the walk is not remembered and takes the decoding
# path, which raises where it always did. Smaller batches (one record, say) are verified on
# every read: that costs less than a table lookup. Memory: 40 bytes + 4 per record (~4 KiB for
# 1000 records in ~127 KB), under the process-wide cap of kstore._mapping.set_batch_memory_limit
# (measured: groups of 16 records cost ~25% more per point read, one entry per record ~5%
# less for twice the memory).
# ---------------------------------------------------------------------------------------------
cdef Py_ssize_t REMEMBER_MIN_BYTES = 2048


def set_remember_min_bytes(Py_ssize_t n):
    """Batches smaller than n bytes are verified on every read instead of remembered (tests,
    measurements); returns the previous value."""
    global REMEMBER_MIN_BYTES
    old = REMEMBER_MIN_BYTES
    REMEMBER_MIN_BYTES = n
    return old


cdef bint _walk(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, BatchRecords* t) noexcept:
    """Validate every record of the uncompressed v2 batch at pos as a full decode does (except
    that header keys are UTF-8, checked when a record is decoded), filling t if t is not NULL.
    False if anything is malformed."""
    cdef Py_ssize_t q = pos + V2_OVERHEAD, end = pos + h.size, hq, kq, vq
    cdef int32_t i
    cdef int64_t prev = -1, last = h.last_offset - h.base_offset, hcount, j, hk, hv
    cdef RecordFields f
    if h.count > last + 1:
        return False
    for i in range(h.count):
        if record_fields(p, q, end, &f) < 0 or f.off_delta <= prev or f.off_delta > last:
            return False
        prev = f.off_delta
        hq = header_count(p, &f, &hcount)
        if hq < 0:
            return False
        for j in range(hcount):
            hq = next_header(p, hq, &f, &kq, &hk, &vq, &hv)
            if hq < 0:
                return False
        if hq != f.end:
            return False
        if t != NULL:
            table_add(t, i, q - pos, f.off_delta, h.base_timestamp + f.ts_delta)
        q = f.end
    return q == end


cdef bint usable_batch(Mapping m, BatchHeader* h) noexcept:
    return usable_with(m, h, REMEMBER_MIN_BYTES)


cdef inline int check_crc(Mapping m, const uint8_t* p, Py_ssize_t pos, BatchHeader* h) except -1:
    """require_crc, unless a refresh verified this batch in a copy of m's file (Mapping.crc_known)."""
    if m is None or not m.crc_known(pos, h.size):
        require_crc(p, pos, h)
    return 0


cdef Py_ssize_t remember_min_bytes() noexcept:
    return REMEMBER_MIN_BYTES


cdef BatchRecords* batch_records(Mapping m, const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                                 bint verify_crc, bint* owned) except? NULL:
    """The record table of the batch at pos (see usable_batch): remembered, or verified (CRC
    first if verify_crc, raising on a mismatch), walked and remembered now. NULL when the batch's records
    are malformed (the caller decodes, which raises where the fault is) or memory is short.
    owned: the caller must free the table (the mapping did not take it)."""
    cdef BatchRecords* t = <BatchRecords*>m.remembered(pos)
    cdef Py_ssize_t nbytes
    owned[0] = False
    if t != NULL and t.header.size == h.size and t.header.base_offset == h.base_offset:
        if verify_crc and not t.crc_ok:
            check_crc(m, p, pos, h)
            t.crc_ok = True
        return t
    if verify_crc:
        check_crc(m, p, pos, h)
    t = new_table(h, &nbytes)
    if t == NULL:
        return NULL
    if not _walk(p, pos, h, t):
        free(t)
        return NULL
    t.crc_ok = verify_crc
    owned[0] = not m.remember(pos, t, nbytes)
    return t


cdef Py_ssize_t record_at(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, BatchRecords* t,
                          int64_t delta, int32_t* index) noexcept:
    """Position of the first record of the batch at pos whose offset delta >= delta (its index
    into index): its group (direct without compaction gaps, else a binary search), then at
    most GROUP_SIZE - 1 records skipped by their length varints (or offset deltas, with gaps).
    -1 if no record qualifies, -2 if the bytes no longer parse (they changed under the
    mapping)."""
    cdef Py_ssize_t q, end = pos + h.size
    cdef int32_t g, lo, hi, i, stop
    cdef int64_t rlen
    cdef RecordFields f
    if delta <= 0:
        index[0] = 0
        return pos + V2_OVERHEAD
    if t.dense:
        if delta >= t.header.count:
            return -1
        g = <int32_t>(delta >> GROUP_SHIFT)
        q = pos + t.groups[g].rpos
        i = g << GROUP_SHIFT
        stop = <int32_t>delta
        while i < stop:
            q = get_varlong(p, q, end, &rlen, 5)
            if q < 0 or rlen <= 0 or rlen > end - q:
                return -2
            q += rlen
            i += 1
        index[0] = i
        return q
    lo = 0                                   # the last group starting at or below delta
    hi = t.ngroups
    while hi - lo > 1:
        g = (lo + hi) >> 1
        if t.groups[g].off_delta <= delta:
            lo = g
        else:
            hi = g
    q = pos + t.groups[lo].rpos
    i = lo << GROUP_SHIFT
    while i < t.header.count:
        if record_fields(p, q, end, &f) < 0:
            return -2
        if f.off_delta >= delta:
            index[0] = i
            return q
        q = f.end
        i += 1
    return -1


cdef int find_ts_in_batch(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, BatchRecords* t,
                          int64_t ts, int64_t start_offset, int64_t* found_offset,
                          int64_t* found_ts) noexcept:
    """The first record of the uncompressed v2 batch at pos (validated: a table, or _walk) with
    offset >= start_offset and timestamp >= ts, without decoding it: 1 with found_offset and
    found_ts set, 0 if none, -1 if the bytes no longer parse. With t, the running maxima find
    the group of the first record at or above ts (binary search) once no record before the
    group has reached ts. LogAppendTime batches: every record has the batch's max timestamp."""
    cdef Py_ssize_t q, end = pos + h.size
    cdef int32_t i = 0, g, lo, hi
    cdef int64_t delta = start_offset - h.base_offset
    cdef bint lat = (h.attrs & TS_TYPE_BIT) != 0
    cdef RecordFields f
    if lat and h.max_timestamp < ts:
        return 0
    if t != NULL:
        q = record_at(p, pos, h, t, delta, &i)
        if q < 0:
            return 0 if q == -1 else -1
    else:
        q = pos + V2_OVERHEAD
    while i < h.count:
        if t != NULL and not lat and (i & (GROUP_SIZE - 1)) == 0:
            g = i >> GROUP_SHIFT
            if g == 0 or t.groups[g - 1].run_max_ts < ts:
                # nothing before group g reached ts: the first group whose running max does
                lo = g
                hi = t.ngroups
                while lo < hi:
                    g = (lo + hi) >> 1
                    if t.groups[g].run_max_ts < ts:
                        lo = g + 1
                    else:
                        hi = g
                if lo >= t.ngroups:
                    return 0
                i = lo << GROUP_SHIFT
                q = pos + t.groups[lo].rpos
        if record_fields(p, q, end, &f) < 0:
            return -1
        if f.off_delta >= delta and (lat or h.base_timestamp + f.ts_delta >= ts):
            found_offset[0] = h.base_offset + f.off_delta
            found_ts[0] = h.max_timestamp if lat else h.base_timestamp + f.ts_delta
            return 1
        q = f.end
        i += 1
    return 0


cdef int batch_offset_for_timestamp(Mapping m, const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                                    int64_t ts, int64_t start_offset, bint verify_crc,
                                    int64_t* found_offset, int64_t* found_ts) except -2:
    """find_ts_in_batch over a batch read from m (CRC verified once per mapping, or on each call
    for a small batch): 1 found, 0 none, -1 when this path cannot answer (not an uncompressed
    v2 data batch, or malformed records: the caller decodes, raising where the fault is)."""
    cdef BatchRecords* t = NULL
    cdef bint owned = False
    cdef int r
    if h.magic != 2 or (h.attrs & CODEC_MASK) != 0 or (h.attrs & CONTROL_BIT):
        return -1
    if usable_batch(m, h):
        t = batch_records(m, p, pos, h, verify_crc, &owned)
        if t == NULL:
            return -1
    else:
        if verify_crc:
            check_crc(m, p, pos, h)
        if not _walk(p, pos, h, NULL):
            return -1
    r = find_ts_in_batch(p, pos, h, t, ts, start_offset, found_offset, found_ts)
    if owned:
        free(t)
    return r



cdef Py_ssize_t _decode_v2_records(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                                   int64_t base_offset, int64_t base_ts, int64_t max_ts,
                                   int64_t last_delta, int32_t count, bint lat,
                                   int64_t min_offset, Py_ssize_t max_records, list out,
                                   Py_ssize_t err_pos, BatchRecords* table=NULL,
                                   int32_t first=0, int32_t epoch=-1) except -1:
    """Decode `count` v2 records from p[pos:end) into out (skipping offsets < min_offset);
    stops after max_records. Returns the number appended. Offset deltas must increase and stay
    within the batch's last offset delta, so a batch never yields an offset twice or out of its
    range (compaction leaves gaps, never disorder). With table (a whole batch decoded from its
    first record, err_pos its position), fills the table as it goes. first: the index
    in the batch of the record at pos (error messages). epoch: the batch's partitionLeaderEpoch,
    each record's leader_epoch (Kafka's ConsumerRecord.leaderEpoch)."""
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
            raise corrupt(f"record {first + i} of the batch: {f.why.decode('ascii')}", err_pos)
        if f.off_delta <= prev_delta or f.off_delta > last_delta:
            raise corrupt(f"record {first + i} of the batch: offset delta {f.off_delta} after "
                          f"{prev_delta}, last offset delta {last_delta}", err_pos)
        prev_delta = f.off_delta
        if table != NULL:
            table_add(table, i, pos - err_pos, f.off_delta, base_ts + f.ts_delta)
        if base_offset + f.off_delta < min_offset:
            pos = f.end
            continue
        q = header_count(p, &f, &hcount)
        if q < 0:
            raise corrupt(f"record {first + i} of the batch: {f.why.decode('ascii')}", err_pos)
        r = Record.__new__(Record)
        if hcount:
            hdrs = []
            for j in range(hcount):
                q = next_header(p, q, &f, &kq, &hk, &vq, &hv)
                if q < 0:
                    raise corrupt(f"record {first + i} of the batch: {f.why.decode('ascii')}", err_pos)
                try:
                    hks = PyUnicode_DecodeUTF8(<const char*>(p + kq), hk, NULL)
                except UnicodeDecodeError:
                    raise corrupt(f"record {first + i}: header key is not UTF-8", err_pos)
                hdrs.append((hks, PyBytes_FromStringAndSize(<const char*>(p + vq), hv)
                             if hv >= 0 else None))
            r.headers = tuple(hdrs)
        else:
            r.headers = ()
        if q != f.end:
            raise corrupt(f"record {first + i}: {f.end - q} unexpected bytes after the headers", err_pos)
        r.offset = base_offset + f.off_delta
        r.timestamp = max_ts if lat else base_ts + f.ts_delta
        r.key = PyBytes_FromStringAndSize(<const char*>(p + f.key_pos), f.key_len) \
            if f.key_len >= 0 else None
        r.value = PyBytes_FromStringAndSize(<const char*>(p + f.value_pos), f.value_len) \
            if f.value_len >= 0 else None
        r.timestamp_type = tstype
        r.leader_epoch = epoch
        out.append(r)
        added += 1
        pos = f.end
        if added >= max_records:
            return added
    if pos != end:
        raise corrupt(f"{end - pos} bytes remain after the batch's {first + count} records",
                      err_pos)
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
    cdef int64_t last_rel, offset, prev = -1
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
        r.leader_epoch = -1               # v0/v1: no leader epoch
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
        if offset > h.base_offset or offset <= prev:
            # Kafka gives a wrapper its last message's offset (lookups find batches by it), and
            # its messages increasing offsets
            raise corrupt(f"message inside a compressed wrapper has offset {offset}, after "
                          f"{prev}, the wrapper's being {h.base_offset}", err_pos)
        prev = offset
        ih.base_offset = offset
        ih.last_offset = offset
        added += decode_legacy(ip, ipos, &ih, min_offset, max_records - added, out, err_pos,
                                verify_crc, depth + 1, 0, ts if lat else NO_TIMESTAMP, lat)
        if added >= max_records:
            break
        ipos += ih.size
    return added

cdef Py_ssize_t _decode_remembered(Mapping m, const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                                   int64_t min_offset, Py_ssize_t max_records, list out,
                                   bint verify_crc) except -2:
    """decode_batch for a batch with a record table (see usable_batch): a whole-batch decode
    builds the table as it validates; a partial one starts at its record. -1: decode it the usual way
    (malformed records, no memory)."""
    cdef BatchRecords* t = <BatchRecords*>m.remembered(pos)
    cdef Py_ssize_t nbytes, n, q
    cdef int32_t i = 0, count
    cdef bint owned
    if (t == NULL or t.header.size != h.size or t.header.base_offset != h.base_offset) and \
            min_offset <= h.base_offset and max_records >= h.count:
        if verify_crc:
            check_crc(m, p, pos, h)
        t = new_table(h, &nbytes)
        if t == NULL:
            return -1
        try:
            n = _decode_v2_records(p, pos + V2_OVERHEAD, pos + h.size, h.base_offset,
                                   h.base_timestamp, h.max_timestamp,
                                   h.last_offset - h.base_offset, h.count,
                                   (h.attrs & TS_TYPE_BIT) != 0, min_offset, NO_LIMIT, out, pos, t,
                                   0, ld32(p + pos + 12))
        except BaseException:
            free(t)
            raise
        t.crc_ok = verify_crc
        if not m.remember(pos, t, nbytes):
            free(t)
        return n
    t = batch_records(m, p, pos, h, verify_crc, &owned)
    if t == NULL:
        return -1
    q = record_at(p, pos, h, t, min_offset - h.base_offset, &i)
    count = t.header.count
    if owned:
        free(t)
    # the table is not touched below: decoding allocates objects, which may run any code
    if q == -1:
        return 0
    if q < 0:
        raise corrupt(f"the batch's records no longer parse (changed after it was verified)", pos)
    return _decode_v2_records(p, q, pos + h.size, h.base_offset, h.base_timestamp,
                              h.max_timestamp, h.last_offset - h.base_offset, count - i,
                              (h.attrs & TS_TYPE_BIT) != 0, min_offset, max_records, out, pos,
                              NULL, i, ld32(p + pos + 12))


cdef Py_ssize_t decode_batch(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, int64_t min_offset,
                              Py_ssize_t max_records, list out, bint verify_crc,
                              bint include_control) except -1:
    return decode_batch_in(None, p, pos, h, min_offset, max_records, out, verify_crc,
                           include_control)


cdef Py_ssize_t decode_batch_in(Mapping m, const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                                int64_t min_offset, Py_ssize_t max_records, list out,
                                bint verify_crc, bint include_control) except -1:
    cdef int codec
    cdef const uint8_t* rp
    cdef Py_ssize_t n
    if usable_batch(m, h) and (include_control or not (h.attrs & CONTROL_BIT)):
        n = _decode_remembered(m, p, pos, h, min_offset, max_records, out, verify_crc)
        if n >= 0:
            return n
    if verify_crc:
        check_crc(m, p, pos, h)
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
                                  (h.attrs & TS_TYPE_BIT) != 0, min_offset, max_records, out, pos,
                                  NULL, 0, ld32(p + pos + 12))
    if codec > 4:
        raise corrupt(f"invalid compression codec {codec}", pos)
    inner = decompress_value(codec, p + pos + V2_OVERHEAD, h.size - V2_OVERHEAD, pos)
    cdef const uint8_t[::1] mv = inner
    n = mv.shape[0]
    rp = &mv[0] if n else &_empty_byte
    return _decode_v2_records(rp, 0, n, h.base_offset, h.base_timestamp, h.max_timestamp,
                              h.last_offset - h.base_offset, h.count, (h.attrs & TS_TYPE_BIT) != 0, min_offset, max_records,
                              out, pos, NULL, 0, ld32(p + pos + 12))

cdef tuple read_range(Mapping m, const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                      int64_t min_offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
                      bint verify_crc, list out, bint strict, bint min_one,
                      bint include_control=False):
    """Decode batches from pos until end / max_records / max_bytes (at least one batch if
    min_one); control batches' records only with include_control (dump tools). Returns
    (next_position, next_offset_hint, bytes_used). A malformed header raises if strict. p is m's
    memory when m is not None (its record tables are used), else any buffer."""
    cdef RangeResult r
    read_range_c(m, p, pos, end, min_offset, max_records, max_bytes, verify_crc, out, strict,
                 min_one, include_control, &r)
    return (r.next_position, r.next_offset, r.used)


cdef int read_range_c(Mapping m, const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                      int64_t min_offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
                      bint verify_crc, list out, bint strict, bint min_one,
                      bint include_control, RangeResult* res) except -1:
    """read_range with its result in res (no tuple on the point-read path)."""
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t used = 0, start_len = len(out), added = 0
    cdef int hs
    cdef int64_t next_offset = -1
    cdef BatchRecords* t
    while added < max_records:
        t = <BatchRecords*>m.remembered(pos) if m is not None else NULL
        if t != NULL and t.header.size <= end - pos:
            h = t.header         # a remembered batch: its header without touching its bytes
        else:
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
        if h.magic >= 2 and (h.count == 0 or ((h.attrs & CONTROL_BIT) and not include_control)):
            # nothing to return (a transaction marker, a batch a cleaner emptied): passed over
            # outside the byte budget, so a run of them longer than max_bytes never ends a read
            # with no records before the log end (Kafka's consumer fetches again past them)
            if verify_crc:
                check_crc(m, p, pos, &h)
            pos += h.size
            next_offset = h.last_offset + 1
            continue
        if used + h.size > max_bytes and (used > 0 or not min_one):
            break
        # (min_offset rises past each batch: a v0/v1 wrapper whose messages lie below the batch
        # before it yields none of them, as Kafka's consumer skips offsets below its position)
        added += decode_batch_in(m, p, pos, &h, min_offset if min_offset > next_offset else next_offset,
                                 max_records - added, out, verify_crc, include_control)
        used += h.size
        if added >= max_records and len(out) > start_len:
            # stopped inside or at the end of this batch
            next_offset = (<Record>out[len(out) - 1]).offset + 1
            if next_offset > h.last_offset:
                pos += h.size
            res.next_position = pos
            res.next_offset = next_offset
            res.used = used
            return 0
        pos += h.size
        next_offset = h.last_offset + 1
    res.next_position = pos
    res.next_offset = next_offset
    res.used = used
    return 0


def decode_batches(data, int64_t min_offset=-1, bint verify_crc=True, bint include_control=False):
    """Decode every record in a bytes-like run of batches (e.g. from read_batches or a file);
    control records (transaction markers) only with include_control, as consumers skip them."""
    cdef const uint8_t[::1] mv = data
    cdef Py_ssize_t n = mv.shape[0]
    cdef list out = []
    if n == 0:
        return out
    read_range(None, &mv[0], 0, n, min_offset, NO_LIMIT, NO_LIMIT, verify_crc,
               out, True, True, include_control)
    return out
