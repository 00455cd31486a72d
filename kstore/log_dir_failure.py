"""Log dirs taken offline by I/O errors (Kafka's LogDirFailureChannel).

The one public channel through which the manager, its scheduled tasks and the cleaner report a
failed log dir, check whether a dir is offline and run work that must take its dir offline if
the disk fails. A dir fails once, with the first error, whichever thread meets it.
"""
from __future__ import annotations

import errno
import logging
import threading
import weakref
from typing import Callable, Iterable, Optional, ParamSpec, TypeVar

from kstore.errors import LogDirOfflineError

log = logging.getLogger("kstore.manager")

#: errnos that mean the disk (not one file) failed: they take the whole log dir offline
IO_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG,
                       errno.ENXIO})

# errors at start-up that concern one partition's files, not the disk: that partition is
# isolated (LogManager.failed_partitions); any other OSError takes its whole log dir offline
PARTITION_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.ENOENT, errno.ENOTDIR,
                              errno.EISDIR, errno.ELOOP, errno.ENAMETOOLONG})

P = ParamSpec("P")
R = TypeVar("R")


class LogDirFailureChannel:
    """The offline log dirs of one store and why each went offline.

    Thread-safe. The record is replaced whole under a leaf lock and never changed in place, so
    checks (`is_offline`, `guard`) take no lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()       # a leaf: writers of _offline only
        self._offline: dict[str, str] = {}
        self._listeners: list[weakref.WeakMethod] = []

    def add_listener(self, fn: Callable[[str, str], None]) -> None:
        """Call the bound method fn(dir, error) once a dir goes offline, in the thread that took
        it offline, with no lock of this channel held (the caller may hold a Log's lock: fn must
        take none). Held weakly: its owner usually holds this channel (no cycle)."""
        self._listeners.append(weakref.WeakMethod(fn))

    def mark_offline(self, d: str, exc: BaseException, quiet: bool = False) -> bool:
        """Take d offline because of exc (the first error of a dir is the one kept); logged as an
        ERROR unless quiet. Returns whether this call took it offline."""
        with self._lock:
            if d in self._offline:
                return False
            offline = dict(self._offline)
            offline[d] = str(exc)
            self._offline = offline
        if not quiet:
            log.error("log dir %s is offline: %s", d, exc)
        for ref in self._listeners:
            if (fn := ref()) is None:
                continue
            try:
                fn(d, str(exc))
            except Exception:       # the dir is offline whatever a listener does
                log.exception("a listener of log dir %s going offline failed", d)
        return True

    def is_offline(self, d: str) -> bool:
        return d in self._offline

    def reason(self, d: str) -> Optional[str]:
        """The error that took d offline, or None while it is online."""
        return self._offline.get(d)

    def all_offline(self, dirs: Iterable[str]) -> bool:
        offline = self._offline
        return all(d in offline for d in dirs)

    @property
    def offline_dirs(self) -> dict[str, str]:
        """Every offline dir with the error that took it offline (a snapshot)."""
        return dict(self._offline)

    def summary(self) -> str:
        """`dir: error; dir: error` of every offline dir, for error messages."""
        return "; ".join(f"{d}: {e}" for d, e in self._offline.items())

    def guard(self, d: str, fn: Callable[P, R], *args: P.args, **kw: P.kwargs) -> R:
        """Run fn(*args, **kw) as work on log dir d: LogDirOfflineError at once if d is offline;
        an I/O error of the disk (IO_ERRNOS, or no errno) takes d offline and surfaces as
        LogDirOfflineError; any other OSError is raised as it is."""
        if d in self._offline:
            raise LogDirOfflineError(f"log dir {d} is offline ({self._offline[d]})")
        try:
            return fn(*args, **kw)
        except OSError as e:
            if e.errno in IO_ERRNOS or e.errno is None:
                self.mark_offline(d, e)
                raise LogDirOfflineError(f"log dir {d} went offline: {e}") from e
            raise
