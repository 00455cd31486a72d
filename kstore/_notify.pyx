# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""Bell: the notification word of a partition (its `.kstore-notify` file, notify.py), mapped
shared by the writer and by every waiting reader, in any process.

The page starts with a header (native byte order; the page is never shared between machines):

    0   8  magic b"KSNOTIFY"
    8   4  version (1)
    12  4  the futex word: bit 0 "a waiter is armed", bits 1..31 a change counter
    16  8  hint: the log end offset        } written by the writer before each bump; a reader
    24  8  hint: the active segment's base } uses them only to skip a refresh that cannot
    32  8  hint: the log start offset      } find anything, never as data
    40  8  the writer's pid (informative)
    48  8  hint: the active segment's size (bytes of whole batches the writer appended)
    56  8  the list stamp: changed by every change of the log other than an append (a roll,
           truncation, deletion, swap, new log start) and by every writer's open
    64  8  the pid that wrote the stamp: a writer of an older kstore (which does not keep the
           stamp) rewrites the pid at 40 only, so the stamp is ignored until they agree again

A read-only reader that listed the segments while the stamp was S, and sees it still S with
the same active base, learns an append by validating the bytes from its valid end to the size
hint through its kept descriptor (ro_refresh.py): no directory listing, no stat.

The writer bumps the word after every change of the log end, in one atomic step that also
clears the waiter bit; only when the bit was set does it make a syscall (FUTEX_WAKE). Before an
append it may pre-wake (prewake: clear the bit, FUTEX_WAKE, the counter unchanged); a sleeper
that wakes to its armed value less the bit settles (spins, yielding) for the bump. A waiter
arms (sets the bit), checks its condition, then sleeps with FUTEX_WAIT on the armed value, in
bounded slices, with the GIL released and the mapping pinned (close() unmaps after the last
sleeper leaves).
"""
from libc.stdint cimport uint8_t, uint32_t, uint64_t, int64_t
from libc.string cimport memcmp, memcpy
from libc.stdlib cimport malloc, free
from libc.errno cimport EAGAIN

from kstore._mapping cimport Mapping

cdef extern from "_notify.h" nogil:
    struct kn_waitv:
        uint64_t val
        uint64_t uaddr
        uint32_t flags
        uint32_t reserved
    uint32_t kn_load(uint32_t* w)
    int64_t kn_load64(int64_t* p)
    void kn_store64(int64_t* p, int64_t v)
    uint32_t kn_arm(uint32_t* w)
    uint32_t kn_bump(uint32_t* w)
    int kn_wake(uint32_t* w)
    uint32_t kn_prewake(uint32_t* w)
    int kn_settle(uint32_t* w, uint32_t armed, int64_t ns)
    int kn_wait(uint32_t* w, uint32_t val, int64_t timeout_ns)
    int kn_spin(uint32_t* w, uint32_t val, int64_t ns)
    int kn_wait_any(kn_waitv* v, unsigned n, int64_t timeout_ns)

import os

#: The file's size: one page, all of it mapped.
SIZE = 4096
MAGIC = b"KSNOTIFY"
cdef const char* _MAGIC = b"KSNOTIFY"
VERSION = 1
#: futex_waitv's limit on the words of one wait.
WAIT_ANY_MAX = 128

cdef int64_t _ns(double seconds) noexcept:
    if seconds <= 0:
        return 0
    if seconds > 1e9:
        return <int64_t>1e18
    return <int64_t>(seconds * 1e9)


cdef class Bell:
    """The header page of a notification file, through a Mapping of at least SIZE bytes that
    the Bell keeps mapped (pinned) for as long as it lives: a thread sleeping on the word holds
    the Bell, so the memory cannot go away under it. `shared` is False for a private page (a
    writer whose file could not be used: only this process's waiters hear it)."""
    cdef Mapping mapping
    cdef uint8_t* base
    cdef uint32_t* word
    cdef readonly bint shared
    cdef readonly bint closed

    def __cinit__(self, Mapping mapping, bint shared=True):
        if mapping.length < SIZE:
            raise ValueError(f"a notification mapping needs {SIZE} bytes, not {mapping.length}")
        self.base = <uint8_t*>mapping.ptr()
        mapping.pin()
        self.mapping = mapping
        self.word = <uint32_t*>(self.base + 12)
        self.shared = shared

    def __dealloc__(self):
        if self.mapping is not None and not self.closed:
            self.mapping.unpin()

    def close(self):
        """Unmap the page (a closing log: a writable shared mapping would count as a file open
        for writing, e.g. against a read-only remount). A thread sleeping on the word keeps it
        mapped until it wakes; afterwards every method is a no-op: load/arm 0, hints -1,
        sleep and spin return at once."""
        if not self.closed:
            self.closed = True
            self.mapping.close()
            self.mapping.unpin()

    @staticmethod
    def private():
        """A Bell on a private anonymous page (header written): in-process waiters only."""
        cdef Bell b = Bell(Mapping.from_bytes(bytes(SIZE)), False)
        b.init_header()
        return b

    @property
    def valid(self) -> bool:
        """Whether the header is a notification file's (magic and version)."""
        cdef uint32_t version
        if self.closed:
            return False
        memcpy(&version, self.base + 8, 4)
        return memcmp(self.base, _MAGIC, 8) == 0 and version == VERSION

    def init_header(self, int64_t pid=0):
        """The writer's: magic, version and pid (the word and hints are kept: waiters may be
        sleeping on the word)."""
        cdef uint32_t version = VERSION
        if self.closed:
            return
        memcpy(self.base, _MAGIC, 8)
        memcpy(self.base + 8, &version, 4)
        kn_store64(<int64_t*>(self.base + 40), pid)
        self._restamp(pid)

    cdef void _restamp(self, int64_t pid) noexcept:
        # the list stamp moves on (a writer's open may have completed swaps, removed files)
        cdef int64_t stamp = kn_load64(<int64_t*>(self.base + 56))
        kn_store64(<int64_t*>(self.base + 56), stamp + 1 if 0 < stamp < (1LL << 62) else 1)
        kn_store64(<int64_t*>(self.base + 64), pid)

    cpdef void bump_end(self, int64_t log_end, int64_t active_base, int64_t active_size) noexcept:
        """After an append (the hot path): store the end, active base and active size hints,
        bump, and wake only if a waiter is armed."""
        if self.closed:
            return
        kn_store64(<int64_t*>(self.base + 16), log_end)
        kn_store64(<int64_t*>(self.base + 24), active_base)
        kn_store64(<int64_t*>(self.base + 48), active_size)
        if kn_bump(self.word):
            kn_wake(self.word)

    cpdef void ring(self, int64_t log_end, int64_t active_base, int64_t log_start,
                    int64_t active_size) noexcept:
        """After any other change of the log (roll, truncation, a new log start, close): the
        hints, a new list stamp, bump."""
        if self.closed:
            return
        kn_store64(<int64_t*>(self.base + 16), log_end)
        kn_store64(<int64_t*>(self.base + 24), active_base)
        kn_store64(<int64_t*>(self.base + 32), log_start)
        kn_store64(<int64_t*>(self.base + 48), active_size)
        self._restamp(kn_load64(<int64_t*>(self.base + 40)))
        if kn_bump(self.word):
            kn_wake(self.word)

    cpdef bint prewake(self) noexcept:
        """Before an append (Log.append): if a waiter is armed, clear the bit and wake the
        sleepers now, the counter unchanged, so that their wake-up overlaps the append; they
        spin (sleep's settle) for the bump, which then needs no syscall. A load when nobody
        waits. True if it woke anyone."""
        if self.closed:
            return False
        return kn_prewake(self.word) != 0

    def nudge(self):
        """Bump the word without changing a hint (a closing reader wakes the file's other
        sleepers: they look again)."""
        if not self.closed and kn_bump(self.word):
            kn_wake(self.word)

    def tail(self) -> tuple:
        """(list stamp, active base, active size) as the writer last stored them; the stamp is
        -1 when it cannot be used (never written, or not by the writer whose pid the page
        holds: an older kstore writer, which does not keep it)."""
        if self.closed:
            return (-1, -1, -1)
        return (self._stamp(), kn_load64(<int64_t*>(self.base + 24)),
                kn_load64(<int64_t*>(self.base + 48)))

    cdef int64_t _stamp(self):
        """The list stamp, or -1 unless the pid that wrote it is the page's writer's."""
        cdef int64_t stamp = kn_load64(<int64_t*>(self.base + 56))
        cdef int64_t owner = kn_load64(<int64_t*>(self.base + 64))
        if owner <= 0 or stamp <= 0 or owner != kn_load64(<int64_t*>(self.base + 40)):
            return -1
        return stamp

    def load(self) -> int:
        """The word now."""
        return 0 if self.closed else kn_load(self.word)

    def arm(self) -> int:
        """Set the waiter bit; the word as armed (check the condition, then sleep on it)."""
        return 0 if self.closed else kn_arm(self.word)

    def hints(self) -> tuple:
        """(log end offset, active segment base, log start offset) as the writer last stored."""
        if self.closed:
            return (-1, -1, -1)
        return (kn_load64(<int64_t*>(self.base + 16)), kn_load64(<int64_t*>(self.base + 24)),
                kn_load64(<int64_t*>(self.base + 32)))

    def woken(self) -> tuple:
        """A waiter just woken: (word as re-armed, log end hint, list stamp, active base, active
        size), arm() + hints()[0] + tail() in one call and that order (the size is stored
        after the other hints), for the append-to-visible path (notify.LogNotifier.woken)."""
        cdef uint32_t w
        cdef int64_t end
        if self.closed:
            return (0, -1, -1, -1, -1)
        w = kn_arm(self.word)
        end = kn_load64(<int64_t*>(self.base + 16))
        return (w, end, self._stamp(), kn_load64(<int64_t*>(self.base + 24)),
                kn_load64(<int64_t*>(self.base + 48)))

    def sleep(self, uint32_t armed, double timeout, double settle=0.0) -> int:
        """FUTEX_WAIT while the word is `armed`, at most timeout seconds, GIL released. 0 woken,
        EAGAIN changed already, ETIMEDOUT, EINTR, ENOSYS (no futex on this system). settle: when
        woken by a writer's pre-wake (the word is `armed` less the waiter bit), spin up to that
        many seconds more for its bump (still without the GIL)."""
        cdef int r
        cdef int64_t ns = _ns(timeout), sns = _ns(settle)
        if self.closed:
            return 0
        self.mapping.pin()
        with nogil:
            r = kn_wait(self.word, armed, ns)
            if sns > 0 and (r == 0 or r == EAGAIN):
                kn_settle(self.word, armed, sns)
        self.mapping.unpin()
        return r

    def spin(self, uint32_t value, double seconds) -> bool:
        """Busy-wait (GIL released) at most seconds for the word to differ from value."""
        cdef int r
        cdef int64_t ns = _ns(seconds)
        if self.closed:
            return True
        self.mapping.pin()
        with nogil:
            r = kn_spin(self.word, value, ns)
        self.mapping.unpin()
        return r != 0


def wait_any(list bells, list values, double timeout, double settle=0.002) -> int:
    """futex_waitv: sleep until any bell's word differs from its value (each armed first), at
    most timeout seconds, GIL released. 0 woken, EAGAIN changed already, ETIMEDOUT, EINTR,
    ENOSYS (kernel before 5.16, or not Linux: the caller waits another way). settle: as
    Bell.sleep's, for each word found pre-woken (one wake-up per append, not two)."""
    cdef Py_ssize_t n = len(bells), i
    cdef kn_waitv* v
    cdef Bell b
    cdef int r
    cdef int64_t ns = _ns(timeout), sns = _ns(settle)
    if n != len(values):
        raise ValueError("one value per bell")
    if n == 0 or n > WAIT_ANY_MAX:
        raise ValueError(f"wait_any takes 1 to {WAIT_ANY_MAX} bells, not {n}")
    held = [<Bell?>x for x in bells]
    for b in held:
        if b.closed:
            return 0
    v = <kn_waitv*>malloc(n * sizeof(kn_waitv))
    if v == NULL:
        raise MemoryError()
    for i in range(n):
        b = held[i]
        v[i].val = <uint32_t>values[i]
        v[i].uaddr = <uint64_t><size_t>b.word
        b.mapping.pin()
    try:
        with nogil:
            r = kn_wait_any(v, <unsigned>n, ns)
            if sns > 0 and (r == 0 or r == EAGAIN):
                for i in range(n):
                    kn_settle(<uint32_t*><size_t>v[i].uaddr, <uint32_t>v[i].val, sns)
    finally:
        free(v)
        for b in held:
            b.mapping.unpin()
    return r
