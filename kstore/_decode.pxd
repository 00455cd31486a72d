# cython: language_level=3
"""Record decoding for the other extension modules (kstore/_decode.pyx)."""
from libc.stdint cimport uint8_t, int64_t

from kstore._format cimport BatchHeader

# Decode the records of the batch at p[pos:] (header parsed into h) with offset >= min_offset
# into out, at most max_records; CRC first if verify_crc; control batches only with
# include_control. Returns the number appended; raises CorruptRecordError.
cdef Py_ssize_t decode_batch(const uint8_t* p, Py_ssize_t pos, BatchHeader* h, int64_t min_offset,
                             Py_ssize_t max_records, list out, bint verify_crc,
                             bint include_control) except -1
# One v0/v1 message (a compressed wrapper recursively) into out; errors at err_pos.
cdef Py_ssize_t decode_legacy(const uint8_t* p, Py_ssize_t pos, BatchHeader* h,
                              int64_t min_offset, Py_ssize_t max_records, list out,
                              Py_ssize_t err_pos, bint verify_crc, int depth,
                              int64_t abs_delta, int64_t wrapper_ts, bint wrapper_lat) except -1
# The decompressed bytes of p[0:n) (codec errors become CorruptRecordError at err_pos).
cdef object decompress_value(int codec, const uint8_t* p, Py_ssize_t n, Py_ssize_t err_pos,
                             int magic=*)
# Decode batches from pos until end / max_records / max_bytes: (next_position,
# next_offset_hint, bytes_used); see _decode.pyx.
cdef tuple read_range(const uint8_t* p, Py_ssize_t pos, Py_ssize_t end, int64_t min_offset,
                      Py_ssize_t max_records, Py_ssize_t max_bytes, bint verify_crc, list out,
                      bint strict, bint min_one, bint include_control=*)
