# cython: language_level=3
"""Record and AppendInfo for the other extension modules (kstore/_record.pyx): the decoders
fill a Record's fields directly, the encoder an AppendInfo's."""
from libc.stdint cimport int64_t


cdef class Record:
    cdef readonly int64_t offset
    cdef readonly int64_t timestamp
    cdef readonly object key
    cdef readonly object value
    cdef readonly tuple headers
    cdef readonly int timestamp_type     # 0 CreateTime, 1 LogAppendTime, -1 none
    cdef readonly int leader_epoch       # the batch's partitionLeaderEpoch; -1 none (v0/v1, input)


cdef class AppendInfo:
    cdef readonly int64_t first_offset
    cdef readonly int64_t last_offset
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t log_append_time    # -1 unless message.timestamp.type=LogAppendTime
    cdef readonly Py_ssize_t record_count
    cdef readonly Py_ssize_t size
