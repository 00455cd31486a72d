# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Log compaction's byte work: the dedupe map (Kafka's SkimpyOffsetMap, MurmurHash3-128 keys)
and batch filtering (MemoryRecords.filterTo: copy unchanged batches, rebuild changed ones,
tombstone horizons)."""
from libc.stdint cimport uint8_t, uint16_t, uint32_t, uint64_t, int32_t, int64_t
from libc.string cimport memcpy, memset
from libc.stdlib cimport malloc, free
from cpython.bytes cimport PyBytes_FromStringAndSize, PyBytes_AS_STRING

from kstore._format cimport *
from kstore._mapping cimport Mapping
from kstore._record cimport Record
from kstore._decode cimport decode_batch, decompress_value

import numpy as np

cdef enum:
    _TXN_ABORTED = 1
    _TXN_MARKER_GOES = 2
    _TXN_KEEP_EMPTY = 4
#: cleaner_txn.py's actions (bits) for a batch with a producer id, by its base offset: an aborted
#: transaction's data, a marker whose transaction has no data left in the cleaned range, and an
#: active producer's last batch (kept, emptied if need be)
TXN_ABORTED = _TXN_ABORTED
TXN_MARKER_GOES = _TXN_MARKER_GOES
TXN_KEEP_EMPTY = _TXN_KEEP_EMPTY

cdef extern from "_murmur3.h" nogil:
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


cdef Py_ssize_t _map_v2_records(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, int64_t base,
                                int32_t count, int64_t first_dirty, OffsetMap omap) noexcept nogil:
    """Put every keyed record with offset >= first_dirty into the map; 1 when the map is full
    before one of them (Kafka checks before each put), -1 if malformed."""
    cdef int32_t i
    cdef RecordFields f
    for i in range(count):
        if record_fields(p, pos, end, &f) < 0:
            return -1
        if f.key_len >= 0 and base + f.off_delta >= first_dirty:
            if omap.size >= omap.capacity:
                return 1
            omap._put(p + f.key_pos, f.key_len, base + f.off_delta)
        pos = f.end
    return 0


def build_offset_map(Mapping m, Py_ssize_t start, Py_ssize_t end, int64_t first_dirty,
                     OffsetMap omap, dict txn=None, int64_t next_offset=-1):
    """Kafka's buildOffsetMapForSegment: put the keyed records of [start, end) with offset >=
    first_dirty, batch by batch, until a batch would overfill the map. Control batches and the
    batches of aborted transactions (txn[base offset] & TXN_ABORTED, see cleaner_txn.py) are
    skipped; every batch read moves the map's latest offset to its last offset (Kafka's
    updateLatestOffset), so the cleaned range ends after them, and data read to its end moves it
    to next_offset - 1 (the offset after the segment: Kafka's fast-forward over a compacted
    gap). The map is full, as Kafka's, before a keyed record it has no room for: the records
    put before it, in its batch too, stay mapped. Returns (next_position, full)."""
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
            hs = parse_header(p, pos, end, &h, &why)
            if hs != H_OK:
                if hs == H_CORRUPT:
                    raise corrupt(why.decode("ascii"), pos)
                if next_offset - 1 > omap.latest_offset:
                    omap.latest_offset = next_offset - 1
                return (pos, False)
            if h.last_offset < first_dirty:
                pos += h.size
                continue
            if (h.magic == 2 and (h.attrs & CONTROL_BIT)) or \
                    (txn is not None and h.magic == 2 and (h.attrs & TXN_BIT) and
                     (<int>txn.get(h.base_offset, 0)) & _TXN_ABORTED):
                if h.last_offset > omap.latest_offset:
                    omap.latest_offset = h.last_offset     # Kafka's updateLatestOffset
                pos += h.size
                continue
            require_crc(p, pos, &h)
            if h.magic == 2 and (h.attrs & CODEC_MASK) == 0:
                with nogil:
                    rc = _map_v2_records(p, pos + V2_OVERHEAD, pos + h.size, h.base_offset,
                                         h.count, first_dirty, omap)
                if rc < 0:
                    raise corrupt("malformed record while building the offset map", pos)
                if rc == 1:
                    return (pos, True)
            else:
                del tmp[:]
                decode_batch(p, pos, &h, first_dirty, NO_LIMIT, tmp, True, False)
                for o in tmp:
                    r = <Record>o
                    if r.key is not None:
                        if omap.size >= omap.capacity:
                            return (pos, True)
                        omap._put(<const uint8_t*>PyBytes_AS_STRING(r.key), len(r.key), r.offset)
            if h.last_offset > omap.latest_offset:
                omap.latest_offset = h.last_offset         # past compacted gaps, as Kafka's
            pos += h.size
    finally:
        m.unpin_checked()


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
                           int64_t* records_read, bint keep_all) noexcept nogil:
    """Pass 1 of the filter, without the GIL: for each kept record store (start, end,
    offset-delta position, timestamp) in ranges. Returns the number kept, or -1 if malformed."""
    cdef int32_t i
    cdef Py_ssize_t q = 0, kept = 0
    cdef RecordFields f
    for i in range(count):
        if record_fields(rp, q, rn, &f) < 0:
            return -1
        records_read[0] += 1
        if keep_all or _keep(omap, base_offset + f.off_delta, rp + f.key_pos, f.key_len,
                             f.value_len < 0, retain_deletes):
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
    crc = crc32c_update(0, out + 21, w - 21)
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
                   Py_ssize_t max_out, CleanStats stats, dict txn=None):
    """Kafka's MemoryRecords.filterTo over [start, end): returns (next_position, bytes).

    Unchanged batches are copied byte for byte; changed v2 batches are rebuilt with the same base
    and last offsets; a v2 batch that keeps tombstones gets a delete horizon (now +
    delete.retention.ms) if it has none, and past its horizon its tombstones go. The batch whose
    last offset is final_offset is kept even if empty. Stops before exceeding max_out bytes.
    txn (cleaner_txn.py: bits by batch base offset) drops an aborted transaction's batches
    (TXN_ABORTED) and lets a marker whose transaction has no data left go (TXN_MARKER_GOES):
    past its delete horizon, else kept with one set, as Kafka's cleanInto; other markers stay.
    A batch with TXN_KEEP_EMPTY (an active producer's last) is kept even if emptied.
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
    cdef bint retain_deletes, has_horizon, tomb_kept, set_horizon, lat, is_control, drop
    cdef int txn_action
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
            hs = parse_header(p, pos, end, &h, &why)
            if hs != H_OK:
                if hs == H_CORRUPT:
                    raise corrupt(why.decode("ascii"), pos)
                break
            # bounded by input and output bytes: each call holds the GIL only briefly
            if pos > start and (len(out) + h.size > max_out or pos - start >= max_out):
                break
            # verified before anything is copied or rebuilt: a rebuilt batch gets a fresh CRC,
            # which must never launder corrupt bytes into valid-looking data
            require_crc(p, pos, &h)
            stats.bytes_read += h.size
            if h.magic < 2:
                _filter_legacy(p, pos, &h, omap, legacy_retain_deletes, final_offset, out, stats)
                pos += h.size
                continue
            txn_action = 0
            if txn is not None and <int64_t>ld64(p + pos + 43) >= 0:     # a producer id
                txn_action = txn.get(h.base_offset, 0)
            is_control = (h.attrs & CONTROL_BIT) != 0
            if is_control and not (txn_action & _TXN_MARKER_GOES):
                # a marker whose transaction still has data (or another control batch) stays
                out += PyBytes_FromStringAndSize(<const char*>(p + pos), h.size)
                stats.batches_copied += 1
                stats.bytes_written += h.size
                stats.last_offset = h.last_offset
                pos += h.size
                continue
            has_horizon = (h.attrs & HORIZON_BIT) != 0
            retain_deletes = (not has_horizon) or now < h.base_timestamp
            # an aborted transaction's data goes; a marker that may go does past its horizon
            drop = (txn_action & _TXN_ABORTED) != 0 or (is_control and not retain_deletes)
            lat = (h.attrs & TS_TYPE_BIT) != 0
            # decode the records region (decompressing if needed)
            if (h.attrs & CODEC_MASK) == 0:
                rp = p + pos + V2_OVERHEAD
                rn = h.size - V2_OVERHEAD
                inner = None
            else:
                inner = decompress_value(h.attrs & CODEC_MASK, p + pos + V2_OVERHEAD,
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
            if drop:
                nk = 0
                rr = h.count
            else:
                with nogil:
                    nk = _scan_keep(rp, rn, h.count, h.base_offset, h.base_timestamp, omap,
                                    retain_deletes, ranges, cap, &tomb_kept, &max_ts, &rr,
                                    is_control)
            stats.records_read += rr
            if nk < 0:
                free(ranges)
                raise corrupt("malformed record while cleaning", pos)
            stats.records_kept += nk
            if tomb_kept:
                stats.tombstones_kept += 1
            # a kept marker of a transaction with no data left gets a horizon, as tombstones
            set_horizon = (tomb_kept or (is_control and nk > 0)) and not has_horizon
            if nk == h.count and nk > 0 and not set_horizon:
                free(ranges)
                out += PyBytes_FromStringAndSize(<const char*>(p + pos), h.size)
                stats.batches_copied += 1
                stats.bytes_written += h.size
                stats.last_offset = h.last_offset
                _track_max(stats, h.max_timestamp, h.last_offset)
                pos += h.size
                continue
            if nk == 0 and h.last_offset != final_offset and not (txn_action & _TXN_KEEP_EMPTY):
                # empty, or emptied: gone (an empty batch of an earlier clean too), as Kafka's
                free(ranges)
                stats.batches_dropped += 1
                pos += h.size
                continue
            # rebuild (same base/last offsets; timestamps re-based on a new horizon) in C without
            # the GIL; a compressed batch then gets its records region compressed again
            new_base_ts = now + delete_retention_ms if set_horizon else h.base_timestamp
            attrs_new = h.attrs | (HORIZON_BIT if set_horizon else 0)
            if nk == 0:
                # Kafka's DefaultRecordBatch.writeEmptyHeader: no codec, no delete horizon, base
                # timestamp -1 (the max timestamp stays)
                attrs_new = attrs_new & ~(CODEC_MASK | HORIZON_BIT)
                new_base_ts = -1
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
                    payload = compress(attrs_new & CODEC_MASK,
                                        PyBytes_FromStringAndSize(<const char*>(obuf + V2_OVERHEAD),
                                                                  wn - V2_OVERHEAD), None, 2)
                    st32(obuf + 8, <uint32_t>(V2_OVERHEAD - LOG_OVERHEAD + len(payload)))
                    crc = crc32c_update(0, obuf + 21, V2_OVERHEAD - 21)
                    crc = crc32c_update(crc, <const uint8_t*>PyBytes_AS_STRING(payload), len(payload))
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
        m.unpin_checked()
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
    decode_batch(p, pos, h, -1, NO_LIMIT, tmp, True, False)
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
