# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Record and AppendInfo: the value types appends take and reads return."""
cimport cython
from libc.stdint cimport int64_t

cdef tuple EMPTY_HEADERS = ()     # (CPython has one empty tuple)


@cython.freelist(2048)
@cython.no_gc
cdef class Record:
    """One record: offset, timestamp (ms, -1 if none), key, value (None = tombstone), headers;
    read from a log, also leader_epoch: its batch's partition leader epoch (-1 for v0/v1).

    As an input to Log.append only key, value, timestamp and headers matter; offset is -1.
    """
    # fields: see _record.pxd

    def __init__(self, key, value, timestamp=None, headers=None, *, int64_t offset=-1,
                 int timestamp_type=0):
        self.key = key
        self.value = value
        self.timestamp = -1 if timestamp is None else timestamp
        self.headers = EMPTY_HEADERS if not headers else tuple(tuple(h) for h in headers)
        self.offset = offset
        self.timestamp_type = timestamp_type if timestamp is not None else -1
        self.leader_epoch = -1

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
                               self.timestamp_type, self.leader_epoch))

def _make_record(offset, timestamp, key, value, headers, timestamp_type, leader_epoch=-1):
    cdef Record r = Record.__new__(Record)
    r.offset = offset
    r.timestamp = timestamp
    r.key = key
    r.value = value
    r.headers = headers
    r.timestamp_type = timestamp_type
    r.leader_epoch = leader_epoch
    return r

@cython.freelist(64)
@cython.no_gc
cdef class AppendInfo:
    """What an append did: offsets assigned, timestamps, size on disk."""
    # fields: see _record.pxd

    def __repr__(self):
        return (f"AppendInfo(first_offset={self.first_offset}, last_offset={self.last_offset}, "
                f"max_timestamp={self.max_timestamp}, log_append_time={self.log_append_time}, "
                f"record_count={self.record_count}, size={self.size})")

def empty_append_info(int64_t next_offset):
    """AppendInfo of an append with no records (nothing written)."""
    cdef AppendInfo a = AppendInfo.__new__(AppendInfo)
    a.first_offset = next_offset
    a.last_offset = next_offset - 1
    a.max_timestamp = -1
    a.log_append_time = -1
    a.record_count = 0
    a.size = 0
    return a

# ---------------------------------------------------------------------------------------------
# BatchBuilder: encodes appends into a reusable scratch buffer (v2 batch, or v0/v1 messages)
