"""Which mount holds a path, and whether the store's flock means anything there.

One rule for the whole library: a LogManager warns about a log dir where it does not hold, and
the Spark sink refuses to commit into one (spark/deploy.py). flock excludes writers on other
nodes wherever the filesystem carries it to the server: every local filesystem, NFSv4 (locks are
in the protocol) and NFSv3 with lockd. It does not on an NFS mount with local locks (``nolock``,
which the kernel shows as ``local_lock=all``, or ``local_lock=flock``): each client grants flock
by itself, so writers on two nodes would both hold the store's lock.

Mounts come from ``/proc/self/mountinfo`` (per-mount and superblock options, the mount namespace
of this process), else ``/proc/self/mounts``; the longest mount point that is a prefix of the
path's real path wins. Both are read through FileOps, so tests give fake lines.
"""
from __future__ import annotations

import logging
import os
from typing import NamedTuple, Optional

from kstore.errors import UnusableFileError
from kstore.fileio import FileOps, get_file_ops

MOUNTINFO = "/proc/self/mountinfo"
MOUNTS = "/proc/self/mounts"
#: NFS mount options under which flock is granted by the client alone.
LOCAL_LOCK_OPTIONS = frozenset({"nolock", "local_lock=all", "local_lock=flock"})


class Mount(NamedTuple):
    """A mount: its mount point, filesystem type and options ("" and empty when unknown)."""
    point: str
    fstype: str
    options: frozenset[str]


NO_MOUNT = Mount("", "", frozenset())


def _unescape(field: str) -> str:
    """Mount points in /proc are octal-escaped (space \\040, tab \\011, newline \\012, \\\\)."""
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and all(c in "01234567" for c in field[i + 1:i + 4]):
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """Mounts from /proc/self/mountinfo lines: ``id parent maj:min root point opts [tags] -
    fstype source superopts``; options are the per-mount and the superblock ones together.
    Lines that do not have that shape are skipped."""
    out = []
    for line in text.splitlines():
        f = line.split()
        try:
            sep = f.index("-", 6)
        except ValueError:
            continue
        if len(f) < sep + 3:
            continue
        opts = set(f[5].split(","))
        if len(f) > sep + 3:
            opts.update(f[sep + 3].split(","))
        out.append(Mount(_unescape(f[4]), f[sep + 1], frozenset(opts)))
    return out


def parse_mounts(text: str) -> list[Mount]:
    """Mounts from /proc/self/mounts lines: ``source point fstype opts dump pass``."""
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4:
            out.append(Mount(_unescape(f[1]), f[2], frozenset(f[3].split(","))))
    return out


def _mounts(io: FileOps) -> list[Mount]:
    for path, parse in ((MOUNTINFO, parse_mountinfo), (MOUNTS, parse_mounts)):
        try:
            return parse(io.read_file(path).decode("utf-8", "replace"))
        except (OSError, UnusableFileError):
            continue
    return []


def mount_of(path: str, io: Optional[FileOps] = None) -> Mount:
    """The mount holding path (its real path; the longest mount point that is a prefix of it),
    or NO_MOUNT where the mount tables cannot be read."""
    path = os.path.realpath(path)
    best = NO_MOUNT
    for m in _mounts(io or get_file_ops()):
        mnt = m.point
        if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best.point):
            best = m        # ">=": the later of two mounts on one point is the visible one
    return best


def unsafe_lock_reason(path: str, io: Optional[FileOps] = None) -> Optional[str]:
    """Why the store's flock at path does not exclude writers on other nodes, or None where it
    does (every local filesystem, NFSv4, NFSv3 with lockd). A path that does not exist yet is
    judged by its parent directory's mount."""
    io = io or get_file_ops()
    if not io.exists(path):
        path = os.path.dirname(os.path.abspath(path)) or "."
    m = mount_of(path, io)
    if not m.fstype.startswith("nfs"):
        return None
    local = sorted(m.options & LOCAL_LOCK_OPTIONS)
    if not local:
        return None
    return (f"it is on an NFS mount ({m.point}) whose locks are local to this client "
            f"({', '.join(local)})")


def warn_unsafe_lock(path: str, io: Optional[FileOps], log: logging.Logger) -> bool:
    """Log a warning (to log) when the store's lock at path does not keep out writers on other
    nodes (unsafe_lock_reason); whether it did. A LogManager calls it for each log dir."""
    why = unsafe_lock_reason(path, io)
    if why is None:
        return False
    log.warning("log dir %s: %s, so its lock does not keep out writers on other nodes; mount it "
                "with locking (NFSv4, or NFSv3 with lockd) or keep one node writing", path, why)
    return True
