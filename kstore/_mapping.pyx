# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Mapping: a shared mmap of a file whose buffer exports and scans are counted, so close() never
unmaps memory that a view, a numpy array or a running nogil scan still uses; and what readers
remember about the batches they verified in it (see "remembered batches" below)."""
from libc.stdint cimport uint8_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from libc.errno cimport errno
from posix.mman cimport mmap, munmap, msync, PROT_READ, PROT_WRITE, MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FAILED, MS_SYNC

cdef extern from "sys/mman.h" nogil:
    int madvise(void* addr, size_t length, int advice)

cdef int MADV_POPULATE_WRITE_ = 23       # linux/mman.h, Linux 5.14+

cdef extern from "_sigbus.h" nogil:
    int ks_install()
    int* ks_register(void* start, size_t length, long long* slot)
    int ks_unregister(long long slot)
from posix.unistd cimport sysconf, _SC_PAGESIZE
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.buffer cimport PyBuffer_FillInfo

import errno as errno_mod
import os

from kstore.errors import CorruptRecordError

cdef uint8_t _empty_byte = 0
cdef Py_ssize_t PAGE = sysconf(_SC_PAGESIZE)

# ---------------------------------------------------------------------------------------------
# Remembered batches. A mapping's bytes below a segment's valid size never change while it is
# mapped (the writer appends past the size, truncation and compaction replace the file, which
# gets a new Mapping), so what a reader learned about a batch at a position (its CRC verified,
# where its records start: kstore._decode builds the block) stays true for the mapping's life.
# The table is freed with the mapping. Memory: the blocks of every live mapping count against
# one process-wide cap; a mapping that would pass it forgets its own batches first and, still
# over, does not remember the new one (its reads verify and walk the batch as if new).
# Every table operation runs with the GIL held and without releasing it: threads never see one
# half done.
# ---------------------------------------------------------------------------------------------
cdef Py_ssize_t _table_bytes = 0                 # held by all live mappings of the process
cdef Py_ssize_t _table_limit = 64 << 20          # the cap (set_batch_memory_limit)


def set_batch_memory_limit(Py_ssize_t nbytes):
    """Cap the memory all mappings of the process may hold for remembered batches (default
    64 MiB); 0 turns remembering off. Returns the previous cap."""
    global _table_limit
    if nbytes < 0:
        raise ValueError("negative memory limit")
    old = _table_limit
    _table_limit = nbytes
    return old


def batch_memory():
    """(bytes held for remembered batches by all live mappings, the cap)."""
    return _table_bytes, _table_limit


cdef inline Py_ssize_t _slot(Py_ssize_t pos, Py_ssize_t cap) noexcept:
    return <Py_ssize_t>((<uint64_t>pos * <uint64_t>0x9E3779B97F4A7C15ULL) >> 40) & (cap - 1)


cdef BatchTable* _new_table(Py_ssize_t cap) noexcept:
    cdef BatchTable* t = <BatchTable*>calloc(1, sizeof(BatchTable))
    if t == NULL:
        return NULL
    t.slots = <TableSlot*>calloc(cap, sizeof(TableSlot))
    if t.slots == NULL:
        free(t)
        return NULL
    t.cap = cap
    t.nbytes = sizeof(BatchTable) + cap * sizeof(TableSlot)
    return t


cdef void _put(BatchTable* t, Py_ssize_t pos, void* block) noexcept:
    """Insert into a table with a free slot (the caller keeps the load at most one half)."""
    cdef Py_ssize_t i = _slot(pos, t.cap)
    while t.slots[i].key != 0:
        i = (i + 1) & (t.cap - 1)
    t.slots[i].key = pos + 1
    t.slots[i].val = block
    t.used += 1

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
            # a file mapping: guarded against SIGBUS (a failure to install leaves it unguarded,
            # as it was before the guard existed)
            if ks_install() == 0:
                self.poison = <int*>ks_register(p, <size_t>length, &self.guard_slot)

    cdef void _unmap(self) noexcept:
        if self.table != NULL:
            self.forget_batches()
        self._unguard()
        if self.addr != NULL:
            munmap(self.addr, <size_t>self.length)
            self.addr = NULL

    cdef void _unguard(self) noexcept:
        if self.poison != NULL:
            self.poison = NULL
            ks_unregister(self.guard_slot)
            self.guard_slot = -1

    cdef int check_written(self) except -1:
        if self.poisoned():
            raise OSError(errno_mod.EIO, "the file was truncated under the writer's mapping by "
                          "another process: the append is not in it")
        return 0

    def check_intact_for_writer(self):
        """check_written for a writer that wrote past this mapping (a pwrite): OSError(EIO) once
        the mapping read zeros where another process truncated the file (what it holds of the
        file, and so the appends it acknowledged before, are no longer what the writer wrote)."""
        self.check_written()

    cdef int raise_truncated(self) except -1:
        raise CorruptRecordError(
            "the file shrank under its mapping (another process truncated it); what was read "
            "from past its new end is not data")

    @property
    def intact(self):
        """False once a touch past the file's end found it truncated by another process (the
        SIGBUS guard replaced the page by zeros instead of letting the process die)."""
        return not self.poisoned()

    def note_crc_verified(self, Py_ssize_t start, Py_ssize_t end):
        """[start, end) of this mapping holds whole batches whose CRCs were just verified in a
        copy read from the same file (a read-only refresh's pread): later reads of a batch wholly
        inside skip its CRC. Bytes below a segment's valid size never change while it is mapped
        (see "remembered batches"), so this stays true for the mapping's life. A range that
        starts where the last one ends extends it; any other replaces it."""
        if start < 0 or end < start or end > self.length:
            raise ValueError(f"range [{start}, {end}) outside the mapping's {self.length} bytes")
        if start == self.crc_hi and self.crc_hi > self.crc_lo:
            self.crc_hi = end
        elif end > start:
            self.crc_lo, self.crc_hi = start, end

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
        """Unmap now, or as soon as the last view is released. The remembered batches go as
        soon as no scan is running (views do not use them)."""
        self.closing = True
        if self.pins == 0:
            self.forget_batches()
        if self.exports == 0 and self.pins == 0:
            self._unmap()

    cdef bint remember(self, Py_ssize_t pos, void* block, Py_ssize_t nbytes) noexcept:
        global _table_bytes
        cdef BatchTable* t = self.table
        cdef BatchTable* bigger
        cdef Py_ssize_t i, extra = nbytes
        if self.closing or pos < 0 or self.remembered(pos) != NULL:
            return False
        if t == NULL:
            extra += sizeof(BatchTable) + 16 * sizeof(TableSlot)
        elif 2 * (t.used + 1) > t.cap:
            extra += t.cap * sizeof(TableSlot)
        if _table_bytes + extra > _table_limit:
            self.forget_batches()        # evict this mapping's batches: the new one may be hotter
            t = NULL
            extra = nbytes + sizeof(BatchTable) + 16 * sizeof(TableSlot)
            if _table_bytes + extra > _table_limit:
                return False
        if t == NULL:
            t = _new_table(16)
            if t == NULL:
                return False
            self.table = t
            _table_bytes += t.nbytes
        elif 2 * (t.used + 1) > t.cap:
            bigger = _new_table(2 * t.cap)
            if bigger == NULL:
                return False
            for i in range(t.cap):
                if t.slots[i].key != 0:
                    _put(bigger, t.slots[i].key - 1, t.slots[i].val)
            bigger.nbytes += t.nbytes - sizeof(BatchTable) - t.cap * sizeof(TableSlot)
            _table_bytes += bigger.nbytes - t.nbytes
            free(t.slots)
            free(t)
            self.table = t = bigger
        _put(t, pos, block)
        t.nbytes += nbytes
        _table_bytes += nbytes
        return True

    cdef void forget_batches(self) noexcept:
        global _table_bytes
        cdef BatchTable* t = self.table
        cdef Py_ssize_t i
        if t == NULL:
            return
        self.table = NULL
        for i in range(t.cap):
            if t.slots[i].key != 0:
                free(t.slots[i].val)
        _table_bytes -= t.nbytes
        free(t.slots)
        free(t)

    @property
    def remembered_batches(self):
        """How many batches this mapping remembers (tests, diagnostics)."""
        return self.table.used if self.table != NULL else 0

    def __dealloc__(self):
        self.forget_batches()
        self._unguard()
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

    def populate_write(self, Py_ssize_t start, Py_ssize_t end):
        """Pre-fault the pages covering [start, end) writable (MADV_POPULATE_WRITE), so later
        stores there take no page fault; the bytes are unchanged. The range must lie inside
        the file (past its end the kernel fails with EFAULT, raised as OSError). Returns False
        where the kernel lacks the advice (EINVAL) or the mapping is read-only."""
        cdef Py_ssize_t a
        cdef int rc
        if not self.writable or self.addr == NULL or self.closing:
            return False
        if start < 0 or end > self.length or start > end:
            raise ValueError(f"populate of [{start}, {end}) outside mapping of {self.length}")
        a = (start // PAGE) * PAGE
        if end <= a:
            return True
        self.pin()
        try:
            with nogil:
                rc = madvise(self.addr + a, <size_t>(end - a), MADV_POPULATE_WRITE_)
        finally:
            self.unpin()
        if rc != 0:
            e = errno
            if e == 22:      # EINVAL: no MADV_POPULATE_WRITE on this kernel
                return False
            raise OSError(e, os.strerror(e))
        return True

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
        self.check_written()

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
        data = PyBytes_FromStringAndSize(<const char*>(self.ptr() + pos), n)
        self.check_intact()
        return data

