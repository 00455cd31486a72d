# cython: language_level=3
"""Mapping's C-level interface for the other extension modules (kstore/_mapping.pyx)."""
from libc.stdint cimport uint8_t
from posix.mman cimport munmap


cdef class Mapping:
    cdef uint8_t* addr
    cdef readonly Py_ssize_t length
    cdef readonly bint writable
    cdef int exports
    cdef int pins
    cdef bint closing

    cdef inline void _unmap(self) noexcept:
        if self.addr != NULL:
            munmap(self.addr, <size_t>self.length)
            self.addr = NULL

    # pin() / unpin() bracket a scan that reads the memory (with or without the GIL): close()
    # defers the unmap until the last pin and buffer export are gone.
    cdef inline void pin(self) noexcept:
        self.pins += 1

    cdef inline void unpin(self) noexcept:
        self.pins -= 1
        if self.closing and self.pins == 0 and self.exports == 0:
            self._unmap()

    # The first byte (a valid pointer to an empty string for an empty mapping); raises
    # ValueError once closed. Valid while the caller holds a pin or the GIL without releasing it.
    cdef inline const uint8_t* ptr(self) except NULL:
        if self.closing:
            raise ValueError("mapping is closed")
        if self.addr == NULL:
            return <const uint8_t*>""
        return self.addr
