# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Mapping: a shared mmap of a file whose buffer exports and scans are counted, so close() never
unmaps memory that a view, a numpy array or a running nogil scan still uses."""
from libc.stdint cimport uint8_t
from libc.string cimport memcpy, memset
from libc.errno cimport errno
from posix.mman cimport mmap, munmap, msync, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FAILED, MS_SYNC
from posix.unistd cimport sysconf, _SC_PAGESIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.buffer cimport PyBuffer_FillInfo

import os

cdef uint8_t _empty_byte = 0
cdef Py_ssize_t PAGE = sysconf(_SC_PAGESIZE)

cdef class Mapping:
    """A MAP_SHARED mapping of the first `length` bytes of a file descriptor.

    The mapping may be longer than the file (the segment writer maps `segment.bytes` and grows the
    file underneath with fallocate); callers must only touch bytes below the file's length.
    Views (memoryview, numpy.frombuffer) keep the memory mapped after close() until released.
    """
    # fields and the inline pin() / unpin() / ptr() are declared in _mapping.pxd

    def __cinit__(self, int fd, Py_ssize_t length, bint writable=False):
        cdef void* p
        cdef int prot = PROT_READ
        self.addr = NULL
        self.length = 0
        self.writable = writable
        if length < 0:
            raise ValueError("negative mapping length")
        if length > 0:
            if writable:
                prot = prot | PROT_WRITE
            p = mmap(NULL, <size_t>length, prot, MAP_SHARED, fd, 0)
            if p == MAP_FAILED:
                e = errno
                raise OSError(e, os.strerror(e))
            self.addr = <uint8_t*>p
            self.length = length

    @staticmethod
    def from_bytes(data):
        """A read-only Mapping holding a private anonymous copy of data (used where a file may
        shrink under us, e.g. a read-only view of another process's active index)."""
        cdef const uint8_t[::1] mv = data
        cdef Py_ssize_t n = mv.shape[0]
        cdef Mapping m = Mapping.__new__(Mapping, -1, 0, False)
        cdef void* p
        if n > 0:
            p = mmap(NULL, <size_t>n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
            if p == MAP_FAILED:
                e = errno
                raise OSError(e, os.strerror(e))
            memcpy(p, &mv[0], n)
            m.addr = <uint8_t*>p
            m.length = n
        return m

    @property
    def closed(self):
        return self.closing

    def close(self):
        """Unmap now, or as soon as the last view is released."""
        self.closing = True
        if self.exports == 0 and self.pins == 0:
            self._unmap()

    def __dealloc__(self):
        if self.addr != NULL:
            munmap(self.addr, <size_t>self.length)
            self.addr = NULL

    def __getbuffer__(self, Py_buffer* buffer, int flags):
        if self.closing:
            raise BufferError("mapping is closed")
        PyBuffer_FillInfo(buffer, self, <void*>(self.addr if self.addr != NULL else &_empty_byte),
                          self.length, 0 if self.writable else 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* buffer):
        self.exports -= 1
        if self.closing and self.exports == 0 and self.pins == 0:
            self._unmap()

    def flush(self, Py_ssize_t start=0, Py_ssize_t end=-1):
        """msync(MS_SYNC) the pages covering [start, end)."""
        cdef Py_ssize_t a, b
        cdef int rc
        if self.addr == NULL:
            return
        if end < 0 or end > self.length:
            end = self.length
        if start < 0:
            start = 0
        if end <= start:
            return
        a = (start // PAGE) * PAGE
        b = end
        with nogil:
            rc = msync(self.addr + a, <size_t>(b - a), MS_SYNC)
        if rc != 0:
            e = errno
            raise OSError(e, os.strerror(e))

    def write(self, Py_ssize_t pos, data):
        """Copy a bytes-like object into the mapping at pos (bounds-checked)."""
        cdef const uint8_t[::1] mv = data
        cdef Py_ssize_t n = mv.shape[0]
        if not self.writable:
            raise ValueError("mapping is read-only")
        if pos < 0 or pos + n > self.length:
            raise ValueError(f"write of {n} bytes at {pos} outside mapping of {self.length}")
        if n:
            memcpy(<void*>(self.ptr() + pos), &mv[0], n)

    def zero(self, Py_ssize_t start, Py_ssize_t end):
        """Zero [start, end) (used to wipe a truncated tail in place)."""
        if not self.writable:
            raise ValueError("mapping is read-only")
        if start < 0 or end > self.length or start > end:
            raise ValueError("zero range outside mapping")
        if end > start:
            memset(<void*>(self.ptr() + start), 0, end - start)

    def read(self, Py_ssize_t pos, Py_ssize_t n):
        """Copy n bytes at pos out as bytes."""
        if pos < 0 or n < 0 or pos + n > self.length:
            raise ValueError(f"read of {n} bytes at {pos} outside mapping of {self.length}")
        return PyBytes_FromStringAndSize(<const char*>(self.ptr() + pos), n)

