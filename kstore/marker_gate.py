"""The clean-shutdown marker removed in the background after a clean open.

A clean open must remove the marker durably (unlink, then fsync the directory) before any byte
of a data file changes: a crash after a partial writeback with the marker still on disk would
load as clean and skip the recovery that the changed files need (KAFKA-10471). The directory
fsync is most of a clean open's cost (2-10 ms on a disk; the rest is ~1 ms), so
`MarkerGate`, a FileOps in front of the log's (or LogManager's) own, checks the marker is a
regular file (a hostile one is refused at once, naming it), then unlinks it and fsyncs the
directory on a thread (an unlink right after the close that wrote the marker waits ~5 ms for
the journal), and holds back every operation that changes a file or a name (writes,
truncations, allocations, renames, unlinks, creations: the `_GATED` methods) until they are
done; reads, maps, locks and fsyncs pass. An append never changes a
byte of a mapping without such a call first: after a clean close the active `.log` is trimmed to
its data, so the first append grows the runway (`zero_fill`) before it copies, and an index
reserves its blocks (`allocate`) or resizes (`truncate`) before its first entry.

If the fsync fails, every later gated operation raises its OSError (the log then fails as for
any write error) and the marker may come back after a power loss: nothing was changed, so
loading as clean stays right. A FileOps that says it is not thread-safe (`thread_safe =
False`: the crash harness's model of the disk) is called by one thread at a time while the
removal runs, so its model sees the operations in one order.
"""
from __future__ import annotations

import _thread
import os
import threading
from typing import Any, Callable, Optional

from kstore.fileio import FileOps

#: FileOps methods that change a file or a directory entry: they wait for the removal
_GATED = ("pwrite", "truncate", "allocate", "zero_fill", "rename", "unlink", "mkdir", "rmdir",
          "map_write", "set_mtime_ms", "write_atomic")
_CHANGES = os.O_CREAT | os.O_TRUNC


class MarkerGate(FileOps):
    """A FileOps that makes a clean-shutdown marker's removal durable in the background
    (remove_later) and every changing operation wait until it is."""

    def __init__(self, inner: FileOps) -> None:
        self.inner = inner
        self.intercept_map_writes = inner.intercept_map_writes
        self._busy = False                      # a removal is running or failed
        self._pending: list[threading.Event] = []     # one per removal, set when it ends
        self._error: Optional[BaseException] = None
        self._lock = threading.Lock()           # the thread list and the error
        # a FileOps that models the disk (the crash harness's, thread_safe = False) sees one
        # call at a time while a removal runs
        self._serial = None if getattr(inner, "thread_safe", True) else threading.RLock()

    def remove_later(self, marker: str, dir_: str) -> None:
        """Unlink marker and fsync dir_ on a thread; changing operations wait for both. A
        hostile marker (a FIFO, a symlink: FileOps.open refuses it) is refused now."""
        self._inner_call("close", self._inner_call("open", marker, os.O_RDONLY))
        done = threading.Event()

        def run() -> None:
            try:
                try:
                    self._inner_call("unlink", marker)
                except FileNotFoundError:
                    pass
                self._inner_call("fsync_dir", dir_)
            except BaseException as e:     # raised by the next changing operation
                with self._lock:
                    self._error = e
            finally:
                done.set()
        with self._lock:
            self._pending.append(done)
            self._busy = True
        # a bare thread: Thread.start() would wait for it to signal that it runs (a context
        # switch, ~1 ms on a loaded machine), which is what this saves the open from
        _thread.start_new_thread(run, ())

    def _inner_call(self, name: str, *args: Any, **kw: Any) -> Any:
        serial = self._serial
        if serial is not None and self._busy:
            with serial:
                return getattr(self.inner, name)(*args, **kw)
        return getattr(self.inner, name)(*args, **kw)

    def wait(self) -> None:
        """Return once every marker removal begun is durable; raise its error if one failed."""
        with self._lock:
            pending = list(self._pending)
        for done in pending:
            done.wait()
        with self._lock:
            if self._error is not None:
                raise self._error
            self._pending = [d for d in self._pending if not d.is_set()]
            self._busy = bool(self._pending)

    @property
    def pending(self) -> bool:
        """A removal is running (or failed)."""
        return self._busy

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if self._busy and flags & _CHANGES:
            self.wait()
        return self._inner_call("open", path, flags, mode)

    def for_hints(self) -> FileOps:
        """Hint files (the notification page) are not what the marker vouches for: their
        changes need not wait. A FileOps that is not thread-safe (the crash harness's model)
        keeps seeing one call at a time, so it gets the gate."""
        return self if self._serial is not None else self.inner.for_hints()

    def __getattr__(self, name: str) -> Any:
        # whatever else the wrapped FileOps offers (a test's mark(), say)
        return getattr(self.inner, name)


def _gated(name: str) -> Callable[..., Any]:
    def call(self: MarkerGate, *args: Any, **kw: Any) -> Any:
        if self._busy:
            self.wait()
        return self._inner_call(name, *args, **kw)
    call.__name__ = name
    call.__doc__ = f"FileOps.{name}, once every marker removal is durable."
    return call


def _passed(name: str) -> Callable[..., Any]:
    def call(self: MarkerGate, *args: Any, **kw: Any) -> Any:
        return self._inner_call(name, *args, **kw)
    call.__name__ = name
    call.__doc__ = f"FileOps.{name} of the wrapped FileOps."
    return call


#: the others: every other public method of FileOps that MarkerGate does not define (derived,
#: so a method added to FileOps later reaches the wrapped FileOps too, never FileOps' own
#: default); open is gated only when it creates or cuts
_PASSED = tuple(n for n, v in vars(FileOps).items()
                if callable(v) and not n.startswith("_") and n not in _GATED
                and n not in vars(MarkerGate))
for _name in _GATED:
    setattr(MarkerGate, _name, _gated(_name))
for _name in _PASSED:
    setattr(MarkerGate, _name, _passed(_name))


def gate_for(io: FileOps, *, standalone: bool, read_only: bool) -> FileOps:
    """The FileOps a writable standalone Log uses: io behind a MarkerGate (its load removes the
    marker through it); io itself for a managed or read-only log (the manager gates its own)."""
    if not standalone or read_only or isinstance(io, MarkerGate):
        return io
    return MarkerGate(io)


def remove_marker(io: FileOps, marker: str, dir_: str) -> None:
    """Remove a clean-shutdown marker durably before any file changes: in the background behind
    io's gate if it has one, else now (unlink, fsync the directory)."""
    if isinstance(io, MarkerGate):
        io.remove_later(marker, dir_)
        return
    io.unlink(marker)
    io.fsync_dir(dir_)
