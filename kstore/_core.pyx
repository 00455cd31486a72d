# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""kstore's compiled core: the package's entry, and the read fast path (Log.read's log_read and
Log.fetch_offset_by_timestamp's log_offset_for_timestamp over segment views).

The core is one extension module per concept, each importable on its own (kstore._crc,
_mapping, _record, _format, _decode, _scan, _lines, _column_input, _encode, _compact, _columnar);
this module re-exports all their public names, so `kstore._core.X` is what it always was.

Everything in the core treats bytes from disk as hostile: every length and offset read from a
file is checked against the bounds of the buffer before it is used, and malformed input raises
``kstore.CorruptRecordError`` (never IndexError, struct.error or a crash).  Byte layouts are
Kafka's (docs/format.md); all integers on disk are big-endian.
"""
from libc.stdint cimport uint8_t, int64_t
from cpython.list cimport PyList_GET_SIZE, PyList_GET_ITEM
from cpython.long cimport PyLong_CheckExact

from kstore._format cimport *
from kstore._mapping cimport Mapping
from kstore._record cimport Record
from kstore._decode cimport (BatchRecords, RangeResult, batch_offset_for_timestamp,
                             decode_batch_in, read_range_c)
from kstore._scan cimport floor_slot

from kstore.errors import CorruptRecordError

# The public names of every concept module, as kstore._core.X (see the module docstring).
from kstore._crc import (crc32, crc32c, crc32c_hw, crc32c_implementation, crc32c_table,
                         _force_table_crc)
from kstore._record import AppendInfo, empty_append_info, _make_record
from kstore._format import (CODEC_NAMES, OFFSET_DTYPE, OFFSET_ENTRY_SIZE,
                            OFFSET_WARM_ENTRIES, RECORD_BATCH_OVERHEAD, TIME_DTYPE,
                            TIME_ENTRY_SIZE, TIME_WARM_ENTRIES, StrStatus, set_codecs)
from kstore._decode import decode_batches, set_remember_min_bytes
from kstore._mapping import batch_memory, set_batch_memory_limit
from kstore._scan import (batch_headers, find_batch, index_entry, offset_index_floor_slot,
                          offset_index_lookup, put_offset_entry, put_time_entry, recover_scan,
                          RecoverResult, ScanStatus,
                          time_index_floor_slot_by_offset, time_index_lookup, validate_batches,
                          pread_validate)
# the read-only refresh's index copies (segment_ro, index.load_copy)
from kstore._index_copy import IndexCopy, extend_index_copy, index_valid_prefix
from kstore._lines import murmur2, split_lines
from kstore._column_input import ColumnInput
from kstore._encode import BatchBuilder
from kstore._compact import (CleanStats, OffsetMap, TXN_ABORTED, TXN_KEEP_EMPTY, TXN_MARKER_GOES, build_offset_map,
                             filter_batches)
from kstore._columnar import Columns, ColumnsStatus, decode_columns

# cimported above, so not yet Python names of this module
globals().update(Mapping=Mapping, Record=Record)


cdef inline bint _index_usable(Mapping m, Py_ssize_t n, Py_ssize_t esize):
    """An index mapping a reader may search: open (the writer closes one it swaps at a resize or
    roll while reader threads may still hold it) and long enough for its entry count (count and
    mapping are published one after the other). A reader that cannot use it scans instead."""
    return m is not None and not m.closing and 0 <= n and n * esize <= m.length


cdef Py_ssize_t _index_position(Mapping index, Py_ssize_t entries, int64_t base_offset,
                                int64_t offset, Mapping m, const uint8_t* p,
                                Py_ssize_t end) except -1:
    """Position to start scanning for `offset`: the offset index's floor entry, or 0 when the
    index has nothing below offset or its entry is not trustworthy (a position outside the data,
    or a batch there that starts after the indexed offset: a stale or damaged index never makes a
    read skip records)."""
    cdef Py_ssize_t slot, pos
    cdef const uint8_t* ip
    cdef int64_t idx_off
    cdef BatchHeader h
    cdef const char* why
    cdef BatchRecords* t
    if entries <= 0 or offset <= base_offset or not _index_usable(index, entries, 8):
        return 0
    ip = index.ptr()
    slot = floor_slot(ip, entries, 8, 0, False, base_offset, offset, 1024)
    if slot < 0:
        return 0
    pos = ld32(ip + 8 * slot + 4)
    idx_off = base_offset + ld32(ip + 8 * slot)
    if pos <= 0 or pos >= end:
        return 0
    t = <BatchRecords*>m.remembered(pos)
    if t != NULL and t.header.size <= end - pos:
        h = t.header             # a remembered batch: its header without touching its bytes
    elif parse_header(p, pos, end, &h, &why) != H_OK:
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
    return _index_position(index, entries, base_offset, offset, m, m.ptr(), end)


cdef int _read_at(Mapping m, Mapping index, Py_ssize_t index_entries, int64_t base_offset,
                  Py_ssize_t end, int64_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
                  bint verify_crc, list out, bint min_one, RangeResult* res) except -1:
    cdef Py_ssize_t pos
    cdef const uint8_t* p
    if end < 0 or end > m.length:
        raise ValueError("read range outside mapping")
    p = m.ptr()
    pos = _index_position(index, index_entries, base_offset, offset, m, p, end)
    m.pin()
    try:
        return read_range_c(m, p, pos, end, offset, max_records, max_bytes, verify_crc, out,
                            False, min_one, False, res)
    finally:
        m.unpin_checked()


def read_at(Mapping m, Mapping index, Py_ssize_t index_entries, int64_t base_offset,
            Py_ssize_t end, int64_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
            bint verify_crc, list out, bint min_one=True):
    """Segment read in one call: offset-index floor, scan to the batch, decode (see _read_range).
    A floor position outside [0, end] (a damaged index) falls back to a scan from 0."""
    cdef RangeResult r
    _read_at(m, index, index_entries, base_offset, end, offset, max_records, max_bytes,
             verify_crc, out, min_one, &r)
    return (r.next_position, r.next_offset, r.used)


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

    cdef int _read(self, int64_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
                   bint verify_crc, list out, bint min_one, RangeResult* res) except -1:
        cdef Py_ssize_t end = self.size, before = len(out)
        if end > self.log_map.length:
            end = self.log_map.length
        _read_at(self.log_map, self.index.map, self.index.entries, self.base_offset, end,
                 offset, max_records, max_bytes, verify_crc, out, min_one, res)
        if self.corrupt is not None and res.next_position >= end and \
                len(out) - before < max_records and res.used < max_bytes:
            # the read wants the bytes a read-only refresh found invalid: fail as the writer would
            raise corrupt(self.corrupt, end)
        return 0

    def read(self, int64_t offset, Py_ssize_t max_records, Py_ssize_t max_bytes, bint verify_crc,
             list out, bint min_one=True):
        """read_at over this segment; the caller guarantees readiness (see log_read)."""
        cdef RangeResult r
        if not self.ready():
            raise ValueError("segment view is not mapped")
        self._read(offset, max_records, max_bytes, verify_crc, out, min_one, &r)
        return (r.next_position, r.next_offset, r.used)


def log_read(list bases, list views, int64_t offset, Py_ssize_t max_records,
             Py_ssize_t max_bytes, bint verify_crc, list out, Py_ssize_t used=0):
    """Log.read's fast path: bisect the segment, then read across segments within the limits,
    appending records to out.

    The records form one contiguous run of the log: a segment whose next batch does not fit the
    remaining byte budget ends the read there (never a later segment's smaller batch). Returns
    None when done; (-1, offset, bytes used) when offset lies below the first segment (the
    caller's range check is stale); or (segment index, offset, bytes used) when it reached a
    segment that is not mapped or whose index is not loaded (or was closed under it): the caller
    prepares that
    segment and calls again with that offset (the one after the last record read) and byte
    count and the same out, so the records already read are not decoded
    again (a read that crosses S unmapped segments costs O(S), not O(S^2)). min_one (at least one
    batch whatever max_bytes) holds only while nothing was read. CorruptRecordError carries
    .segment, the index of the segment at fault.
    """
    cdef ReadStop stop
    if _log_read(bases, views, offset, max_records, max_bytes, verify_crc, out, used, &stop):
        return None
    return (stop.segment, stop.offset, stop.used)


cdef struct ReadStop:
    Py_ssize_t segment       # the segment to prepare; -1: offset lies below the first one
    int64_t offset           # where to go on
    Py_ssize_t used          # bytes used so far


cdef int _log_read(list bases, list views, int64_t offset, Py_ssize_t max_records,
                   Py_ssize_t max_bytes, bint verify_crc, list out, Py_ssize_t used,
                   ReadStop* stop) except -1:
    """log_read: 1 when done, 0 when stopped (see log_read) with stop set."""
    cdef Py_ssize_t n = PyList_GET_SIZE(bases), lo = 0, hi, mid, i, end
    cdef SegmentView v
    cdef RangeResult res
    cdef int64_t base
    stop.offset = offset
    stop.used = used
    if n == 0 or PyList_GET_SIZE(views) != n:
        stop.segment = 0
        return 0
    hi = n
    while lo < hi:             # bisect_right
        mid = (lo + hi) >> 1
        if offset < <int64_t>(<object>PyList_GET_ITEM(bases, mid)):
            hi = mid
        else:
            lo = mid + 1
    i = lo - 1
    if i < 0:
        # below the first segment: retention or DeleteRecords removed the segment holding it
        # after the caller's range check; -1 sends the caller back to that check
        stop.segment = -1
        return 0
    while i < n:
        v = <SegmentView>PyList_GET_ITEM(views, i)
        if not v.ready():
            # offset stays where the records stopped: the caller's lists may be stale (a
            # truncation closed this segment), so it resumes by offset, never at this base
            stop.segment = i
            stop.offset = offset
            stop.used = used
            return 0
        base = v.base_offset
        if offset < base:
            offset = base      # nothing lies between one segment's end and the next's base
        end = v.size
        if end > v.log_map.length:
            end = v.log_map.length
        try:
            v._read(offset, max_records - len(out), max_bytes - used, verify_crc, out,
                    used == 0, &res)
        except CorruptRecordError as e:
            e.segment = i
            raise
        used += res.used
        if len(out) >= max_records or used >= max_bytes:
            break
        if res.next_position < end:
            break              # the next batch of this segment did not fit: stop here
        if len(out):
            offset = (<Record>out[len(out) - 1]).offset + 1
        i += 1
    return 1


def read_records(log, offset, max_records=None, Py_ssize_t max_bytes=1 << 20, *,
                 bint verify_crc=True):
    """Records from `offset` on: at most max_records, from batches totalling at most max_bytes
    (but always at least one batch; transaction markers and emptied batches, which hold no
    record to return, are passed over outside the budget). Empty when no record lies between
    offset and the log end.

    Log.read, compiled: the usual read (offset inside the range last published, segments
    mapped, the segment list unchanged during the read) is this one call. Everything else (the
    log end, an offset out of range, a read-only log to refresh, a segment to map, a segment
    list changed under the read, a corrupt batch to name) is Log._read_slow's, which starts
    the read again and handles it. It reads the Log's published `_leo`, `_log_start_offset`
    and `_segments` as Log.read did.
    """
    cdef int64_t off
    cdef Py_ssize_t limit
    cdef list out
    cdef ReadStop stop
    cdef int done
    if not PyLong_CheckExact(offset) or not (max_records is None or PyLong_CheckExact(max_records)):
        return log._read_slow(offset, max_records, max_bytes, verify_crc)
    try:
        off = offset
        limit = NO_LIMIT if max_records is None else max_records
    except OverflowError:
        return log._read_slow(offset, max_records, max_bytes, verify_crc)
    if limit < 0 or off >= <int64_t>log._leo or off < <int64_t>log._log_start_offset:
        return log._read_slow(offset, max_records, max_bytes, verify_crc)
    ss = log._segments
    out = []
    try:
        done = _log_read(ss.bases, ss.views, off, limit, max_bytes, verify_crc, out, 0, &stop)
    except CorruptRecordError:
        done = 0               # the slow path reads again and names the file
    if done and log._segments is ss:
        if out or not log.read_only:
            return out
        # read-only, nothing from offset to the end it knows (transaction markers, batches a
        # cleaner emptied): its writer may have appended records after them, which a read at
        # the end would have refreshed to find; a tail loop waiting on an end already past
        # offset would never see them. Refresh, then read again
        log.refresh()
    return log._read_slow(offset, max_records, max_bytes, verify_crc)


# ---------------------------------------------------------------------------------------------
# Timestamp search inside a segment (Kafka LogSegment.findOffsetByTimestamp, after the lookups)
# ---------------------------------------------------------------------------------------------
cdef object _find_ts(Mapping m, Py_ssize_t start, Py_ssize_t end, int64_t ts,
                     int64_t start_offset, bint verify_crc):
    cdef const uint8_t* p = m.ptr()
    cdef BatchHeader h
    cdef const char* why
    cdef Py_ssize_t pos = start
    cdef int hs, found
    cdef int64_t found_offset, found_ts
    cdef list tmp = []
    cdef Record r
    cdef BatchRecords* t
    m.pin()
    try:
        while True:
            t = <BatchRecords*>m.remembered(pos)
            if t != NULL and t.header.size <= end - pos:
                h = t.header     # a remembered batch: its header without touching its bytes
            else:
                hs = parse_header(p, pos, end, &h, &why)
                if hs == H_END:
                    return None
                if hs == H_CORRUPT:
                    raise corrupt(why.decode("ascii"), pos)
            if h.max_timestamp >= ts and h.last_offset >= start_offset:
                # v2 data batches: timestamp deltas walked in place (a record table's groups
                # for a large batch); anything else is decoded as records, control batches'
                # included (Kafka's FileRecords.searchForTimestamp does not skip them)
                found = batch_offset_for_timestamp(m, p, pos, &h, ts, start_offset, verify_crc,
                                                   &found_offset, &found_ts)
                if found == 1:
                    return (found_offset, found_ts)
                if found < 0:
                    del tmp[:]
                    decode_batch_in(m, p, pos, &h, start_offset, NO_LIMIT, tmp, verify_crc, True)
                    for o in tmp:
                        r = <Record>o
                        if r.timestamp >= ts and r.offset >= start_offset:
                            return (r.offset, r.timestamp)
            pos += h.size
    finally:
        m.unpin_checked()


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
            slot = floor_slot(tp, v.tindex.entries, 12, 0, True, 0, ts, 682)
            if slot >= 0:
                off = v.base_offset + ld32(tp + 12 * slot + 8)
        if off < start_offset:
            off = start_offset
        end = v.size
        if end > v.log_map.length:
            end = v.log_map.length
        pos = _index_position(v.index.map, v.index.entries, v.base_offset, off, v.log_map,
                              v.log_map.ptr(), end)
        try:
            r = _find_ts(v.log_map, pos, end, ts, start_offset, verify_crc)
        except CorruptRecordError as e:
            e.segment = i
            raise
        if r is not None:
            return r
    return False
