# cython: language_level=3, boundscheck=False, wraparound=False
# cython: embedsignature=True
"""A partition directory's listing split in one compiled pass: start-up reads ~30 names per
partition (a thousand partitions: tens of thousands of names), and a Python call per name
(files.parse_name) was a tenth of an unclean start-up's time."""
from libc.stdint cimport int64_t, uint64_t


cdef int64_t _plain_base(str name) except -2:
    """The base offset of a name that starts with 20 ASCII digits, -1 if it does not or if
    they exceed 2^63-1 (files.parse_name refuses those by name)."""
    cdef Py_ssize_t i
    cdef int d
    cdef uint64_t base = 0
    if len(name) < 21:
        return -1
    for i in range(20):
        d = <int>(<Py_UCS4>name[i]) - 48
        if d < 0 or d > 9:
            return -1
        if base > <uint64_t>922337203685477580:
            return -1           # base * 10 + d > 2^63-1 (checked before it could wrap)
        base = base * 10 + <uint64_t>d
        if base > <uint64_t>0x7fffffffffffffff:
            return -1
    return <int64_t>base


def split_listing(list names):
    """(base offsets of the plain `<20 digits>.log` files, sorted; (base, name) of the plain
    `.index`, `.timeindex` and `.txnindex` files; every other name: suffixed, temporary,
    foreign, or 20 digits above 2^63-1), the caller reading the others with
    files.parse_name. The same split as parse_name's fast path for plain names."""
    cdef list logs = [], indexes = [], others = []
    cdef str name, tail
    cdef int64_t base
    for obj in names:
        if type(obj) is not str:
            others.append(obj)
            continue
        name = <str>obj
        base = _plain_base(name)
        if base < 0:
            others.append(name)
            continue
        tail = name[20:]
        if tail == ".log":
            logs.append(base)
        elif tail == ".index" or tail == ".timeindex" or tail == ".txnindex":
            indexes.append((base, name))
        else:
            others.append(name)
    logs.sort()
    return logs, indexes, others
