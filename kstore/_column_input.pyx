# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""ColumnInput: records as Arrow-layout columns (offsets, data, validity), checked once, for
BatchBuilder.build_columns: appends without per-record Python objects."""
from libc.stdint cimport uint8_t, int32_t, int64_t
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.unicode cimport PyUnicode_DecodeUTF8

from kstore._lines cimport murmur2_hash

import numpy as np

cdef uint8_t _empty_byte = 0


# ---------------------------------------------------------------------------------------------
# Columnar input for BatchBuilder.build_columns (Arrow-layout buffers, no per-record objects)
# ---------------------------------------------------------------------------------------------
cdef const int32_t* _check_offsets(object offsets, Py_ssize_t n, Py_ssize_t data_len, str what,
                                   list keep) except? NULL:
    cdef const int32_t[::1] o = offsets
    cdef Py_ssize_t i
    if o.shape[0] != n + 1:
        raise ValueError(f"{what}: {o.shape[0]} offsets for {n} entries (need {n + 1})")
    if o[0] < 0 or o[n] > data_len:
        raise ValueError(f"{what}: offsets [{o[0]}, {o[n]}] run outside {data_len} data bytes")
    for i in range(n):
        if o[i + 1] < o[i]:
            raise ValueError(f"{what}: offsets decrease at entry {i}")
    keep.append(o)
    return &o[0]

cdef const uint8_t* _data_ptr(object data, list keep) except? NULL:
    cdef const uint8_t[::1] d = data
    keep.append(d)
    return &d[0] if d.shape[0] else &_empty_byte

cdef const uint8_t* _valid_ptr(object valid, Py_ssize_t n, str what, list keep) except? NULL:
    if valid is None:
        return NULL
    cdef const uint8_t[::1] v = valid
    if v.shape[0] != n:
        raise ValueError(f"{what}: {v.shape[0]} validity entries for {n} rows")
    keep.append(v)
    return &v[0] if n else &_empty_byte


cdef class ColumnInput:
    """Records as columns for BatchBuilder.build_columns. key / value: None (all null) or
    (offsets int32[n+1], data, valid uint8[n] or None); timestamps: None or int64[n] ms (< 0
    means "now"); headers: None or (list offsets int32[n+1], list valid uint8[n] or None, key
    offsets int32[m+1], key data, value offsets int32[m+1], value data, value valid uint8[m] or
    None). Offsets index their data as in Arrow; all are checked here, once."""
    # fields and the inline key_len / value_len / hk_len / hv_len: see _column_input.pxd

    def __init__(self, Py_ssize_t n, key=None, value=None, timestamps=None, headers=None):
        cdef const int64_t[::1] t
        cdef const int32_t[::1] ho
        cdef Py_ssize_t m, i
        if n < 0:
            raise ValueError("negative row count")
        self.n = n
        self._keep = []
        if key is not None:
            self.kdat = _data_ptr(key[1], self._keep)
            self.koff = _check_offsets(key[0], n, memoryview(key[1]).nbytes, "key", self._keep)
            self.kval = _valid_ptr(key[2], n, "key", self._keep)
        if value is not None:
            self.vdat = _data_ptr(value[1], self._keep)
            self.voff = _check_offsets(value[0], n, memoryview(value[1]).nbytes, "value", self._keep)
            self.vval = _valid_ptr(value[2], n, "value", self._keep)
        if timestamps is not None:
            t = timestamps
            if t.shape[0] != n:
                raise ValueError(f"timestamps: {t.shape[0]} entries for {n} rows")
            self._keep.append(t)
            self.ts = &t[0] if n else NULL
            self.ts_n = n
        if headers is not None:
            lo, lv, hko, hkd, hvo, hvd, hvv = headers
            ho = lo
            if ho.shape[0] != n + 1:
                raise ValueError(f"headers: {ho.shape[0]} list offsets for {n} rows")
            m = ho[n]
            self.hoff = _check_offsets(lo, n, m, "headers", self._keep)
            self.hoff_n = n + 1
            self.hval = _valid_ptr(lv, n, "headers", self._keep)
            self.hval_n = n if lv is not None else 0
            self.hkdat = _data_ptr(hkd, self._keep)
            self.hkoff = _check_offsets(hko, m, memoryview(hkd).nbytes, "header keys", self._keep)
            self.hvdat = _data_ptr(hvd, self._keep)
            self.hvoff = _check_offsets(hvo, m, memoryview(hvd).nbytes, "header values", self._keep)
            self.hvval = _valid_ptr(hvv, m, "header values", self._keep)

    def rows(self, Py_ssize_t start, Py_ssize_t stop):
        """Rows [start, stop) as (key, value, timestamp, headers) tuples for BatchBuilder.build
        (a timestamp < 0 becomes None: now). For the legacy message formats only: the columnar
        path exists to avoid these objects."""
        cdef Py_ssize_t i, j, k, v
        cdef list out = []
        if start < 0 or stop > self.n or start > stop:
            raise ValueError(f"rows [{start}, {stop}) outside the {self.n} input rows")
        for i in range(start, stop):
            k = self.key_len(i)
            v = self.value_len(i)
            key = None if k < 0 else PyBytes_FromStringAndSize(<char*>self.kdat + self.koff[i], k)
            value = None if v < 0 else PyBytes_FromStringAndSize(<char*>self.vdat + self.voff[i], v)
            ts = None if self.ts == NULL or self.ts[i] < 0 else self.ts[i]
            headers = None
            if self.hoff != NULL and (self.hval == NULL or self.hval[i]):
                headers = []
                for j in range(self.hoff[i], self.hoff[i + 1]):
                    hv = None if self.hv_len(j) < 0 else \
                        PyBytes_FromStringAndSize(<char*>self.hvdat + self.hvoff[j], self.hv_len(j))
                    headers.append((PyUnicode_DecodeUTF8(<char*>self.hkdat + self.hkoff[j],
                                                         self.hk_len(j), NULL), hv))
            out.append((key, value, ts, headers))
        return out

    def sizes(self):
        """Per-row upper bound of the encoded record size (int64 numpy array), for splitting
        rows into batches under a byte budget without per-row Python work."""
        out = np.empty(self.n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t i, j, s, k, v
        for i in range(self.n):
            k = self.key_len(i)
            v = self.value_len(i)
            s = 32 + (k if k > 0 else 0) + (v if v > 0 else 0)
            if self.hoff != NULL and (self.hval == NULL or self.hval[i]):
                for j in range(self.hoff[i], self.hoff[i + 1]):
                    s += 10 + self.hk_len(j) + (self.hv_len(j) if self.hv_len(j) > 0 else 0)
            o[i] = s
        return out

    def key_hashes(self):
        """Kafka's default partitioner before the modulo: toPositive(murmur2(key)) of each row's
        key as an int64 array; -1 where the key is null (the caller spreads those)."""
        out = np.empty(self.n, dtype=np.int64)
        cdef int64_t[::1] o = out
        cdef Py_ssize_t i, k
        with nogil:
            for i in range(self.n):
                k = self.key_len(i)
                if k < 0:
                    o[i] = -1
                else:
                    o[i] = murmur2_hash(self.kdat + self.koff[i], k) & 0x7fffffff
        return out
