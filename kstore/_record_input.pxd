# cython: language_level=3
"""The common shape of an input record, recognised in C (BatchBuilder.build's fast path in
kstore/_encode.pyx): a tuple (key, value[, timestamp[, headers]]) whose key and value are exact
bytes or None, whose timestamp is an exact int inside the topic's window or None, and which has
no headers. Anything else (Record, lists, other bytes-likes, headers, a value that fails a
check) is not "plain": the builder's general path takes it and validates it with the usual
messages. Inline and raising nothing: no Python call and no reference count per record."""
from libc.stdint cimport uint8_t, int64_t
from cpython.object cimport PyObject
from cpython.tuple cimport PyTuple_GET_SIZE, PyTuple_GET_ITEM, PyTuple_CheckExact
from cpython.bytes cimport PyBytes_CheckExact, PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.long cimport PyLong_CheckExact

cdef extern from "Python.h":
    # on an exact int it cannot fail: out of range sets *overflow and raises nothing
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) noexcept


cdef struct PlainRecord:
    const uint8_t* key       # NULL with klen -1 for a None key
    Py_ssize_t klen
    const uint8_t* value
    Py_ssize_t vlen
    int64_t ts


cdef inline bint _plain_blob(PyObject* o, const uint8_t** p, Py_ssize_t* n) noexcept:
    if o == <PyObject*>None:
        p[0] = NULL
        n[0] = -1
        return True
    if PyBytes_CheckExact(<object>o):
        p[0] = <const uint8_t*>PyBytes_AS_STRING(<object>o)
        n[0] = PyBytes_GET_SIZE(<object>o)
        return True
    return False


cdef inline bint plain_record(PyObject* item, bint require_key, bint log_append_time, int64_t now,
                              int64_t ts_min, int64_t ts_max, PlainRecord* r) noexcept:
    """Fill r and return True if item (a borrowed reference) has the plain shape and passes
    every check; False sends it to the general path. A missing or None timestamp, and any
    timestamp under LogAppendTime, is `now` (unchecked, as on the general path)."""
    cdef Py_ssize_t n
    cdef PyObject* t
    cdef PyObject* h
    cdef int overflow = 0
    if not PyTuple_CheckExact(<object>item):
        return False
    n = PyTuple_GET_SIZE(<object>item)
    if n < 2 or n > 4:
        return False
    if not _plain_blob(PyTuple_GET_ITEM(<object>item, 0), &r.key, &r.klen) or \
            (require_key and r.klen < 0) or \
            not _plain_blob(PyTuple_GET_ITEM(<object>item, 1), &r.value, &r.vlen):
        return False
    r.ts = now
    if n > 2 and not log_append_time:
        t = PyTuple_GET_ITEM(<object>item, 2)
        if t != <PyObject*>None:
            if not PyLong_CheckExact(<object>t):
                return False
            r.ts = PyLong_AsLongLongAndOverflow(<object>t, &overflow)
            if overflow or r.ts < 0 or r.ts < ts_min or r.ts > ts_max:
                return False
    if n > 3:
        h = PyTuple_GET_ITEM(<object>item, 3)
        if h != <PyObject*>None and not (PyTuple_CheckExact(<object>h) and PyTuple_GET_SIZE(<object>h) == 0):
            return False
    return True
