# cython: language_level=3
"""ColumnInput for BatchBuilder (kstore/_column_input.pyx): its checked buffers and inline
per-row lengths (-1: null)."""
from libc.stdint cimport uint8_t, int32_t, int64_t


cdef class ColumnInput:
    cdef readonly Py_ssize_t n
    cdef list _keep
    cdef const int32_t* koff
    cdef const uint8_t* kdat
    cdef const uint8_t* kval
    cdef const int32_t* voff
    cdef const uint8_t* vdat
    cdef const uint8_t* vval
    cdef const int64_t* ts
    cdef Py_ssize_t ts_n
    cdef const int32_t* hoff
    cdef Py_ssize_t hoff_n
    cdef const uint8_t* hval
    cdef Py_ssize_t hval_n
    cdef const int32_t* hkoff
    cdef const uint8_t* hkdat
    cdef const int32_t* hvoff
    cdef const uint8_t* hvdat
    cdef const uint8_t* hvval

    cdef inline Py_ssize_t key_len(self, Py_ssize_t i) noexcept nogil:
        if self.koff == NULL or (self.kval != NULL and not self.kval[i]):
            return -1
        return self.koff[i + 1] - self.koff[i]

    cdef inline Py_ssize_t value_len(self, Py_ssize_t i) noexcept nogil:
        if self.voff == NULL or (self.vval != NULL and not self.vval[i]):
            return -1
        return self.voff[i + 1] - self.voff[i]

    cdef inline Py_ssize_t hk_len(self, Py_ssize_t j) noexcept nogil:
        return self.hkoff[j + 1] - self.hkoff[j]

    cdef inline Py_ssize_t hv_len(self, Py_ssize_t j) noexcept nogil:
        if self.hvval != NULL and not self.hvval[j]:
            return -1
        return self.hvoff[j + 1] - self.hvoff[j]
