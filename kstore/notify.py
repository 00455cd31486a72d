"""Blocking waits for new data, across threads and processes: `Log.wait_for` and `wait_any`.

Each partition directory holds a notification file, NOTIFY_FILE (one page; its layout is in
`_notify.pyx`). The writer maps it shared and, after every change of the log end (append, roll,
truncation, a new log start, close), stores its end offset, active segment base and log start
as hints and bumps the page's 32-bit futex word: one atomic instruction, and a FUTEX_WAKE
syscall only when a waiter has armed the word. A waiter, in any process, arms the word, checks
its condition (a read-only log refreshes first if the hints say it can learn something), then
sleeps on the armed value with FUTEX_WAIT, GIL released: no polling, ~0 CPU while idle.
Why a futex: one on a shared file mapping wakes a sleeper in any process, while inotify sees no
writes made through a mapping and an eventfd cannot be shared by unrelated processes.
The writer maps an existing file at its first change or first wait, not at its open (a
start-up of many partitions pays nothing for logs no one changes or waits on); until then the
page is the previous writer's, as true as it was while no writer ran (LogNotifier.attach_writer).
A partition without one (fresh) makes it at open, so that readers can sleep on it at once.

The wake-up (the kernel bringing an idle CPU back and scheduling the sleeper: 15-30 µs here) is
overlapped with the append: Log.append starts with a pre-wake (Bell.prewake: if the waiter bit
is set, clear it and FUTEX_WAKE, the counter unchanged), and a waiter that wakes to find its
armed value less the bit spins (yielding its CPU) up to SETTLE_S for the append's bump, which
then needs no syscall. A pre-wake whose append fails ends in a settle that times out: the
waiter re-arms and sleeps. A woken read-only waiter learns the append through
Log.refresh_tail (one pread of the new bytes, validated) and leaves the index copies for its
next idle moment (Log.catch_up_index, before it sleeps again).

Nothing here is trusted for correctness: the hints only let a reader skip a refresh that cannot
find anything, every sleep is a bounded slice (SLICE_S) after which a read-only waiter re-opens
the file if it was replaced and compares the hints again, and it refreshes at least every
RECHECK_S whatever they say (a writer restart keeps the file; a
topic deleted and re-created brings a new one). A notification file that is missing, too
small, not a regular file, unwritable or not a notification file is ignored: the wait then polls
every POLL_S. Outside Linux (no futex) waits poll the same way.

The file is not Kafka's: a broker ignores unknown files in a partition directory, kstore's
loader, cleaner and read-only scans look only at segment names, and topic deletion removes it
with the directory. It need not be durable (never fsynced): a lost one is made again.
"""
from __future__ import annotations

import errno
import logging
import os
import threading
import time
import weakref
from typing import Optional, Protocol, Sequence

from kstore import _notify
from kstore.errors import KStoreError, KStoreStateError
from kstore.fileio import FileOps

__all__ = ["NOTIFY_FILE", "SLICE_S", "RECHECK_S", "POLL_S", "SETTLE_S", "LogNotifier", "ring_hints", "wait_any", "woken_past",
           "writer_bell"]

log = logging.getLogger("kstore.notify")

#: The notification file of a partition directory.
NOTIFY_FILE = ".kstore-notify"
#: Longest single sleep: a read-only waiter then re-checks the file and the hints.
SLICE_S = 1.0
#: A read-only waiter refreshes at least this often even when the word and hints say nothing
#: changed (they are not trusted for correctness); a refresh costs ~0.5-30 ms today.
RECHECK_S = 5.0
#: The sleep between looks when no notification word can be used.
POLL_S = 0.05
#: How long a waiter woken by a writer's pre-wake (Bell.prewake, at the start of Log.append)
#: spins for the append's bump before it re-arms and sleeps: a few single-record appends
#: (~5-50 µs) and most 1000-record ones (~0.2-0.4 ms); spent only while an append is under
#: way, never while idle. 2 ms measured worse: batch p99 4.6 -> 8.1 ms on a loaded machine (a
#: spinner that yields its CPU can lose it for a scheduler slice).
SETTLE_S = 0.0003

_Bell = _notify.Bell


class _Based(Protocol):
    @property
    def base_offset(self) -> int: ...
    @property
    def size(self) -> int: ...


class WaitableLog(Protocol):
    """What a wait needs of a log (kstore.Log)."""
    dir: str
    read_only: bool
    notifier: "LogNotifier"

    @property
    def closed(self) -> bool: ...
    @property
    def log_end_offset(self) -> int: ...
    @property
    def log_start_offset(self) -> int: ...
    @property
    def active_segment(self) -> "_Based": ...
    @property
    def segments(self) -> Sequence: ...
    def refresh(self, log_start_offset: Optional[int] = None, *,
                tail: Optional[tuple[int, int]] = None) -> None: ...
    def refresh_tail(self, base: int, size: int) -> bool: ...
    def note_log_start(self, offset: int) -> None: ...
    def catch_up_index(self) -> None: ...
    def attach_bell(self) -> _notify.Bell: ...

# the Bell of a log not loaded yet or read-only: rung, never waited on (no mapping per log)
_NOBODY = _Bell.private()


def writer_bell(io: FileOps, dir_: str) -> _notify.Bell:
    """The writer's Bell on dir_'s notification file, made if missing (extended to a page if
    short; its header rewritten, its word kept). A file that cannot be used (a symlink, a
    directory, no permission, a full disk) leaves the log with a private Bell: its own threads
    still wake, other processes poll."""
    path = os.path.join(dir_, NOTIFY_FILE)
    io = io.for_hints()         # a hint: made at once, even while a clean open's marker goes
    try:
        fd = io.open(path, os.O_RDWR | os.O_CREAT)
        try:
            if io.size(fd) < _notify.SIZE:
                io.truncate(fd, _notify.SIZE)
            bell = _Bell(io.map(fd, _notify.SIZE, True))
        finally:
            io.close(fd)
        bell.init_header(os.getpid())
        return bell
    except (OSError, KStoreError, ValueError, TypeError) as e:
        log.warning("no notification file for %s (%s): readers in other processes will poll", dir_, e)
        return _Bell.private()


def _reader_bell(io: FileOps, path: str, ident: Optional[tuple[int, int]],
                 current: Optional[_notify.Bell]) -> tuple[Optional[_notify.Bell], Optional[tuple[int, int]]]:
    """(Bell, (st_dev, st_ino)) of the notification file at path: current if the file is the same
    one, a new mapping if it was replaced, (None, None) if it is unusable (see the module doc)."""
    try:
        fd = io.open(path, os.O_RDWR)
    except (OSError, KStoreError):
        return None, None
    try:
        st = io.stat(fd)
        new = (st.st_dev, st.st_ino)
        if new == ident and current is not None:
            return current, ident
        if st.st_size < _notify.SIZE:
            return None, None
        bell = _Bell(io.map(fd, _notify.SIZE, True))
    except (OSError, KStoreError, ValueError):
        return None, None
    finally:
        io.close(fd)
    return (bell, new) if bell.valid else (None, None)


def ring_hints(segs: Sequence, log_end: int, log_start: int) -> tuple[int, int, int, int]:
    """Bell.ring's arguments for a log whose segment list is segs: (log end, active base, log
    start, active size)."""
    if segs:
        return (log_end, segs[-1].base_offset, log_start, segs[-1].size)
    return (log_end, -1, log_start, 0)


def _state(lg: WaitableLog) -> tuple[int, int, int]:
    """What a reader knows, in the hints' shape: (log end, active base, log start)."""
    try:
        base = lg.active_segment.base_offset
    except IndexError:
        base = -1
    return (lg.log_end_offset, base, lg.log_start_offset)


class LogNotifier:
    """One log's side of the notification file: the writer's Bell (`bell`, bumped by the log
    under its lock) and the waits of any thread on the log, writable or read-only.

    Lock: `_lock` serialises a read-only log's catch-up (hint check and refresh, which takes
    Log._lock below it) and the re-opening of its file; it is never taken under Log._lock."""

    def __init__(self, lg: WaitableLog, io: FileOps, dir_: str):
        self._log: WaitableLog = weakref.proxy(lg)     # the log owns this: no cycle
        self._io = io
        self._path = os.path.join(dir_, NOTIFY_FILE)
        #: a writable log's Bell (private until attach_writer), and every log's in-process one
        self.bell: _notify.Bell = _NOBODY
        self._reader: Optional[_notify.Bell] = None
        self._ident: Optional[tuple[int, int]] = None
        self._checked = float("-inf")       # when the reader last looked at the file
        self._seen = -1                     # the word's counter at the last catch-up
        self._refreshed = time.monotonic()  # about when the log last refreshed (its open)
        # the page's list stamp read before the last full refresh (-1: none usable), and when
        # that refresh was: while the stamp stays the same, appends are learnt from the size hint
        # alone (catch_up), for at most RECHECK_S between full refreshes
        self._stamp = -1
        self._listed = float("-inf")
        self._lock = threading.Lock()
        self.attached = False

    def attach_writer(self) -> _notify.Bell:
        """Map the notification file for writing (tried once; Log.attach_bell, Log._lock held):
        at the writable log's first change, first wait or close, not at its open (unless it
        has no file yet: a fresh partition's readers should find one at once). Until then the
        page is the previous writer's, which a reader may trust as it did while no writer ran:
        its hints are at most the log's (a killed writer's torn bytes lie past them and are
        all a recovery cuts after a kill; an open whose recovery cut any attaches at once). The
        header (pid, a new list stamp) and then the hints are rewritten here, before the change
        that attached is made or a waiter of this process sleeps."""
        if not self.attached:
            self.attached = True
            bell = writer_bell(self._io, os.path.dirname(self._path))
            lg = self._log
            bell.ring(*ring_hints(lg.segments, lg.log_end_offset, lg.log_start_offset))
            self.bell = bell
        return self.bell

    def close(self) -> None:
        """A closing log (lock held): wake its in-process waiters (and, read-only, the file's:
        they check the hints and sleep again), then unmap its pages (a writable shared mapping
        holds the file open for writing; a sleeper keeps it mapped until it wakes)."""
        lg = self._log
        end, base, _, size = ring_hints(lg.segments, lg.log_end_offset, lg.log_start_offset)
        self.bell.bump_end(end, base, size)     # the segment list is unchanged: the same stamp
        reader = self._reader
        if reader is not None:
            reader.nudge()
            reader.close()
        if self.bell is not _NOBODY:
            self.bell.close()

    def current_bell(self, now: float) -> Optional[_notify.Bell]:
        """The Bell to wait on: the writer's own, or a read-only log's file Bell (re-checked
        every SLICE_S; None while there is no usable file)."""
        if not self._log.read_only:
            return self.bell if self.attached else self._log.attach_bell()
        if now - self._checked < SLICE_S:
            return self._reader
        with self._lock:
            self._checked = now
            if self._log.closed:
                return self._reader
            old = self._reader
            bell, ident = _reader_bell(self._io, self._path, self._ident, old)
            if ident != self._ident:
                self._seen = -1          # a new file: its counter and stamp say nothing yet
                self._stamp = -1
            self._reader, self._ident = bell, ident
            if old is not None and old is not bell:
                old.close()              # a sleeper on it keeps it mapped until it wakes
            if bell is not None and self._log.closed:
                bell.close()             # close() ran meanwhile and unmapped only the old one
            return bell

    def catch_up(self, bell: Optional[_notify.Bell], word: int, quiet: bool = False) -> None:
        """A read-only log: refresh unless the word is unchanged since the last catch-up or the
        hints show nothing new; after a quiet slice (quiet) the hints are compared whatever the
        word, and a refresh made anyway if the last is RECHECK_S old; with no Bell, always.
        While the page's list stamp is the one read before the last full refresh (less than
        RECHECK_S ago), the refresh is the tail one: the active base and size hints passed on,
        the new bytes validated through the kept descriptor (ro_refresh.py), no listing. Equal
        hints skip the refresh only under that stamp (or a page without one): a truncation
        followed by appends can restore all three, and the first catch-up learns the stamp.
        A full refresh also takes the page's log start (DeleteRecords inside a segment is known
        from it alone) if the stamp is trusted and the page is still the directory's.
        Writable logs: nothing to do."""
        lg = self._log
        if not lg.read_only:
            return
        counter = word >> 1
        with self._lock:
            self._check_open()            # never a refresh of a closed log
            now = time.monotonic()
            if bell is not None and (not quiet or now - self._refreshed < RECHECK_S):
                if counter == self._seen and not quiet:
                    return
                hints = tuple(bell.hints())   # (before the size: it is stored after them)
                stamp, base, size = bell.tail()
                same = stamp == self._stamp >= 0
                if (same or stamp < 0) and hints == _state(lg):
                    self._seen = counter      # (a moved stamp: a truncation can restore them)
                    return
                if same and now - self._listed < RECHECK_S:
                    self._seen = counter
                    self._refreshed = now
                    lg.refresh(tail=(base, size))
                    if lg.log_end_offset >= hints[0]:
                        return
                    # the size hint does not explain the end hint (a writer that does not
                    # keep them, under a reused pid): the full refresh
            self._seen = counter
            self._refreshed = self._listed = now
            self._stamp = bell.tail()[0] if bell is not None else -1   # before the refresh
            start = bell.hints()[2] if bell is not None and self._stamp >= 0 else -1
            lg.refresh()
            if start > lg.log_start_offset and self._page_is_current():
                lg.note_log_start(start)

    def _page_is_current(self) -> bool:
        """Whether the page mapped is the file now at the path (one stat): its hints are this
        directory's, not those of a deleted incarnation whose directory was renamed away."""
        try:
            st = self._io.stat_path(self._path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._ident

    def woken(self, bell: _notify.Bell, offset: int) -> bool:
        """A read-only waiter just woken (wait, fetcher.wait_logs): catch_up's tail refresh
        without its other checks, when the word moved since the last catch-up and the page's
        stamp is the trusted one and its hints name new bytes in the log's last segment; True
        if the log end then passes offset. False: the wait's loop looks (nothing changed, or
        the full catch-up must). Re-arms the word (the loop sleeps on it or arms it again)."""
        word, end, stamp, base, size = bell.woken()
        if stamp != self._stamp or stamp < 0 or word >> 1 == self._seen:
            return False
        lg = self._log
        with self._lock:
            now = time.monotonic()
            if self._reader is not bell or now - self._listed >= RECHECK_S:
                return False
            if not lg.refresh_tail(base, size):     # (closed, no segment, rolled, torn...)
                return False
            self._refreshed = now
            leo = lg.log_end_offset
            if leo >= end:
                self._seen = word >> 1       # else the loop's catch-up looks again
        return leo > offset

    def _check_open(self) -> None:
        if self._log.closed:
            raise KStoreStateError(f"log {self._log.dir} is closed")

    def wait(self, offset: int, timeout: Optional[float] = None, spin: float = 0.0) -> bool:
        """Log.wait_for: True once the log end is above offset, False after timeout seconds
        (None: no limit). spin: busy-wait up to that many seconds first (lowest latency, one
        core busy meanwhile); then sleep on the word."""
        self._check_open()
        lg = self._log
        if lg.log_end_offset > offset:
            return True
        start = time.monotonic()
        deadline = None if timeout is None else start + max(0.0, timeout)
        spin_until = start + spin if spin > 0 else start
        quiet = False        # a stale read-only log catches up on the word and hints below
        while True:
            self._check_open()
            now = time.monotonic()
            left = SLICE_S if deadline is None else deadline - now
            bell = self.current_bell(now)
            if bell is None:
                self.catch_up(None, 0)
                if lg.log_end_offset > offset:
                    return True
                if left <= 0:
                    return False
                time.sleep(min(left, POLL_S))
                continue
            spinning = now < spin_until
            word = bell.load() if spinning else bell.arm()
            self.catch_up(bell, word, quiet)
            quiet = False
            if lg.log_end_offset > offset:
                return True
            if left <= 0:
                return False
            if spinning:
                bell.spin(word, min(left, spin_until - now))
                continue
            if lg.read_only:
                lg.catch_up_index()    # what the woken path left (the word is armed: no loss)
            r = bell.sleep(word, min(left, SLICE_S), SETTLE_S)
            if (r == 0 or r == errno.EAGAIN) and lg.read_only and self.woken(bell, offset):
                return True
            if r == errno.ETIMEDOUT:
                quiet = True           # a quiet slice: look at the hints whatever the word
            elif r == errno.ENOSYS:
                time.sleep(min(left, POLL_S))
                quiet = True


def woken_past(lg: WaitableLog, bell: Optional[_notify.Bell], offset: int) -> bool:
    """A waiter just woken on bell (lg's current one): whether lg's end passes offset, a
    read-only log learning it by the tail step alone (LogNotifier.woken: the append-to-visible
    path); False leaves the rest to the wait's next catch-up."""
    if lg.read_only and bell is not None and lg.notifier.woken(bell, offset):
        return True
    return lg.log_end_offset > offset


def wait_any(logs: Sequence[WaitableLog], offsets: Sequence[int],
             timeout: Optional[float] = None) -> list[int]:
    """Wait until the end of some logs[i] is above offsets[i]; the indexes i for which it is
    (empty after timeout seconds). One futex_waitv over every log's word (up to 128 logs; more,
    or a kernel without futex_waitv, or a log without a usable word: bounded polls)."""
    if len(logs) != len(offsets):
        raise ValueError("one offset per log")
    notifiers = [lg.notifier for lg in logs]
    start = time.monotonic()
    deadline = None if timeout is None else start + max(0.0, timeout)
    quiet = False
    while True:
        now = time.monotonic()
        left = SLICE_S if deadline is None else deadline - now
        bells: list = []
        words: list = []
        for lg, n in zip(logs, notifiers):
            if lg.closed:
                raise KStoreStateError(f"log {lg.dir} is closed")
            bell = n.current_bell(now)
            word = bell.arm() if bell is not None else 0
            n.catch_up(bell, word, quiet)
            bells.append(bell)
            words.append(word)
        quiet = False
        ready = [i for i, lg in enumerate(logs) if lg.log_end_offset > offsets[i]]
        if ready or left <= 0 or not logs:
            return ready
        r = errno.ENOSYS
        if None not in bells and len(bells) <= _notify.WAIT_ANY_MAX:
            r = _notify.wait_any(bells, words, min(left, SLICE_S), SETTLE_S)
        if r == errno.ETIMEDOUT:
            quiet = True
        elif r == errno.ENOSYS:
            time.sleep(min(left, POLL_S))
            quiet = True
