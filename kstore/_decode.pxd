# cython: language_level=3
"""Record decoding for the other extension modules (kstore/_decode.pyx)."""
from libc.stdint cimport uint8_t, uint32_t, int32_t, int64_t
from libc.stdlib cimport malloc

from kstore._format cimport BatchHeader, CODEC_MASK
from kstore._mapping cimport Mapping

cdef enum:
    GROUP_SHIFT = 2
    GROUP_SIZE = 4          # records per group of a record table

# A record table (see _decode.pyx, "Record tables"): per group of GROUP_SIZE records, the first
# one's position (from the batch's start) and offset delta, and the running maximum of the
# timestamps up to the group's end.
cdef struct RecordGroup:
    int64_t run_max_ts
    uint32_t rpos
    int32_t off_delta

cdef struct BatchRecords:
    BatchHeader header       # the batch's header, parsed when the table was built: a read
                             # takes it from here instead of the batch's first cache lines
    int32_t ngroups
    bint crc_ok              # the CRC was verified (a table built with verify_crc=False is not)
    bint dense               # offset delta == index for every record (no compaction gaps)
    RecordGroup* groups      # ngroups entries, in the same allocation

# A batch whose records a table may index: an uncompressed, non-empty v2 batch read from a
# mapping, at least min_bytes long (remembering it beats verifying it again). usable_batch:
# with REMEMBER_MIN_BYTES (set_remember_min_bytes), which remember_min_bytes() returns (a
# caller testing many batches reads it once and tests them inline with usable_with).
cdef inline bint usable_with(Mapping m, BatchHeader* h, Py_ssize_t min_bytes) noexcept:
    return h.size >= min_bytes and h.magic == 2 and (h.attrs & CODEC_MASK) == 0 \
        and h.count > 0 and m is not None
cdef bint usable_batch(Mapping m, BatchHeader* h) noexcept
cdef Py_ssize_t remember_min_bytes() noexcept


cdef inline BatchRecords* new_table(BatchHeader* h, Py_ssize_t* nbytes) noexcept:
    """An empty table for the batch h (nbytes: its size), not verified; NULL without memory.
    Filled by table_add, record by record, by a walk that validates as a full decode does
    (_decode's _walk, its decode path, _columnar's decode)."""
    cdef Py_ssize_t ngroups = (h.count + GROUP_SIZE - 1) >> GROUP_SHIFT
    cdef BatchRecords* t
    nbytes[0] = sizeof(BatchRecords) + ngroups * sizeof(RecordGroup)
    t = <BatchRecords*>malloc(nbytes[0])
    if t == NULL:
        return NULL
    t.header = h[0]
    t.ngroups = <int32_t>ngroups
    t.crc_ok = False
    t.dense = True
    t.groups = <RecordGroup*>(<char*>t + sizeof(BatchRecords))
    return t


cdef inline void table_add(BatchRecords* t, int32_t i, Py_ssize_t rpos, int64_t off_delta,
                           int64_t ts) noexcept nogil:
    """Record i (validated) at rpos into t: called for i = 0, 1, ... count - 1 in order."""
    cdef RecordGroup* g = &t.groups[i >> GROUP_SHIFT]
    if (i & (GROUP_SIZE - 1)) == 0:
        g.rpos = <uint32_t>rpos
        g.off_delta = <int32_t>off_delta
        g.run_max_ts = ts if i == 0 or ts > t.groups[(i >> GROUP_SHIFT) - 1].run_max_ts \
            else t.groups[(i >> GROUP_SHIFT) - 1].run_max_ts
    elif ts > g.run_max_ts:
        g.run_max_ts = ts
    if off_delta != i:
        t.dense = False

# Decode the records of the batch at p[pos:] (header parsed into h) with offset >= min_offset
# into out, at most max_records; CRC first if verify_crc; control batches only with
# include_control. Returns the number appended; raises CorruptRecordError.
cdef Py_ssize_t decode_batch(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, int64_t min_offset,
                             Py_ssize_t max_records, list out, bint verify_crc,
                             bint include_control) except -1
# decode_batch of a batch in m's memory (p = m's bytes): uses and builds m's record tables.
cdef Py_ssize_t decode_batch_in(Mapping m, const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                                int64_t min_offset, Py_ssize_t max_records, list out,
                                bint verify_crc, bint include_control) except -1
# The first record of the batch at pos in m's memory with offset >= start_offset and timestamp
# >= ts, found without decoding: 1 (found_offset, found_ts set), 0 none, -1 when the caller must
# decode instead (v0/v1, compressed, control, malformed). CRC verified once per mapping.
cdef int batch_offset_for_timestamp(Mapping m, const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                                    int64_t ts, int64_t start_offset, bint verify_crc,
                                    int64_t* found_offset, int64_t* found_ts) except -2
# One v0/v1 message (a compressed wrapper recursively) into out; errors at err_pos.
cdef Py_ssize_t decode_legacy(const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                              int64_t min_offset, Py_ssize_t max_records, list out,
                              Py_ssize_t err_pos, bint verify_crc, int depth,
                              int64_t abs_delta, int64_t wrapper_ts, bint wrapper_lat) except -1
# The decompressed bytes of p[0:n) (codec errors become CorruptRecordError at err_pos).
cdef object decompress_value(int codec, const uint8_t* p, Py_ssize_t n, Py_ssize_t err_pos,
                             int magic=*)
# Where read_range stopped: the position and offset to go on from, and the bytes of the batches
# it decoded.
cdef struct RangeResult:
    Py_ssize_t next_position
    int64_t next_offset
    Py_ssize_t used

# Decode batches from pos until end / max_records / max_bytes: (next_position,
# next_offset_hint, bytes_used); see _decode.pyx. read_range_c: the same into res.
cdef int read_range_c(Mapping m, const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                      int64_t min_offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
                      bint verify_crc, list out, bint strict, bint min_one,
                      bint include_control, RangeResult* res) except -1
cdef tuple read_range(Mapping m, const uint8_t* p, Py_ssize_t pos, Py_ssize_t end,
                      int64_t min_offset, Py_ssize_t max_records, Py_ssize_t max_bytes,
                      bint verify_crc, list out, bint strict, bint min_one,
                      bint include_control=*)
