# cython: language_level=3
"""Mapping's C-level interface for the other extension modules (kstore/_mapping.pyx)."""
from libc.stdint cimport uint8_t, uint64_t


# What a Mapping remembers about the batches read from it (see _mapping.pyx, "remembered
# batches"): an open-addressing table from a batch's position to a block the reader built
# (malloc'd, opaque here; freed with the table). Touched only with the GIL held.
cdef struct TableSlot:
    Py_ssize_t key          # batch position + 1; 0 = empty slot
    void* val

cdef struct BatchTable:
    TableSlot* slots
    Py_ssize_t cap          # slots, a power of two
    Py_ssize_t used
    Py_ssize_t nbytes       # memory held: blocks, slots and this struct


cdef class Mapping:
    cdef uint8_t* addr
    cdef readonly Py_ssize_t length
    cdef readonly bint writable
    cdef int exports
    cdef int pins
    cdef bint closing
    cdef BatchTable* table
    # [crc_lo, crc_hi): whole batches whose CRCs a read-only refresh verified in a pread copy of
    # this mapping's file (note_crc_verified); reads of a batch wholly inside skip its CRC
    cdef Py_ssize_t crc_lo
    cdef Py_ssize_t crc_hi
    # the SIGBUS guard (_sigbus.h): this range's flag, set when a page past the file's end (the
    # file was truncated by another process) was replaced by zeros; NULL when unguarded
    cdef int* poison
    cdef long long guard_slot

    # unmap now (the guard's slot first): no view, pin or scan left
    cdef void _unmap(self) noexcept
    cdef void _unguard(self) noexcept

    # True once a touch past the file's end read zeros instead of dying of SIGBUS: nothing read
    # from this mapping since can be trusted (check_intact raises)
    cdef inline bint poisoned(self) noexcept:
        return self.poison != NULL and self.poison[0] != 0

    # CorruptRecordError if poisoned (readers: after reading, before using what they read)
    cdef inline int check_intact(self) except -1:
        if self.poisoned():
            self.raise_truncated()
        return 0

    # the CorruptRecordError of a poisoned mapping (always raises)
    cdef int raise_truncated(self) except -1

    # OSError(EIO) if poisoned (writers: after a copy into the mapping, which went to zeros)
    cdef int check_written(self) except -1

    # The block remembered for the batch at pos, or NULL. Valid until the caller runs Python
    # code (an object allocation may run a finalizer that reads this mapping and evicts it):
    # copy what is needed out first.
    cdef inline void* remembered(self, Py_ssize_t pos) noexcept:
        cdef BatchTable* t = self.table
        cdef Py_ssize_t i
        if t == NULL:
            return NULL
        i = <Py_ssize_t>((<uint64_t>pos * <uint64_t>0x9E3779B97F4A7C15ULL) >> 40) & (t.cap - 1)
        while t.slots[i].key != 0:
            if t.slots[i].key == pos + 1:
                return t.slots[i].val
            i = (i + 1) & (t.cap - 1)
        return NULL

    # Remember block (nbytes, malloc'd) for the batch at pos: True when the table took it
    # (and frees it later), False when it did not (closing mapping, memory cap, no memory):
    # the caller keeps and frees it.
    cdef bint remember(self, Py_ssize_t pos, void* block, Py_ssize_t nbytes) noexcept
    # Free every remembered block (at unmap, or to make room under the cap).
    cdef void forget_batches(self) noexcept

    # True if the batch at pos (size bytes) lies wholly in the range note_crc_verified gave.
    cdef inline bint crc_known(self, Py_ssize_t pos, Py_ssize_t size) noexcept:
        return self.crc_lo <= pos and pos + size <= self.crc_hi

    # pin() / unpin() bracket a scan that reads the memory (with or without the GIL): close()
    # defers the unmap until the last pin and buffer export are gone.
    cdef inline void pin(self) noexcept:
        self.pins += 1

    cdef inline void unpin(self) noexcept:
        self.pins -= 1
        if self.closing and self.pins == 0 and self.exports == 0:
            self._unmap()

    # unpin() at the end of a scan whose results the caller is about to use: raises (see
    # check_intact) if the scan read zeros where another process had truncated the file
    cdef inline int unpin_checked(self) except -1:
        cdef bint bad = self.poisoned()
        self.unpin()
        if bad:
            self.raise_truncated()
        return 0

    # The first byte (a valid pointer to an empty string for an empty mapping); raises
    # ValueError once closed. Valid while the caller holds a pin or the GIL without releasing it.
    cdef inline const uint8_t* ptr(self) except NULL:
        if self.closing:
            raise ValueError("mapping is closed")
        if self.addr == NULL:
            return <const uint8_t*>""
        return self.addr
