"""Running the Spark connector on a cluster: the store's identity, checked by every task, and
what a filesystem must give for each part.

The deployment model: the store's log dirs lie on shared storage mounted at the same path on
every node (NFS, CephFS, Lustre, a cloud file share). Tasks read lock-free through their own
read-only StoreReader; the driver is the only writer (its commits take the store's flock) and
stages on the store (``<first log dir>/.kstore-staging/``). A node that mounts nothing, or
something else, at that path would otherwise read an empty store as "retention deleted it" (or
as 0 rows with failOnDataLoss=false) and stage writes on its own disk, so:

- the driver takes the store's identity when it plans (``identify``): per log dir, Kafka's
  ``meta.properties`` ``cluster.id``/``directory.id`` when it has them, else kstore's
  ``.kstore-id`` (created once, atomically: tmp written and fsynced, then linked, never
  replaced), and puts it into every task;
- each task checks it (``check``) before it opens the store or stages a byte: a missing dir,
  one without an identity (an empty mount point) or with another identity raises
  StoreNotVisibleError naming the task's host and the path, whatever failOnDataLoss says.

A store the driver cannot add an identity file to (a read-only mount) gets none: its tasks
then check that the dirs exist and that the partition they read is there.

The check runs once per task (a stat and a read of a few bytes per log dir) and caches nothing,
so a store replaced or unmounted between two tasks is seen by the next one.
"""
from __future__ import annotations

import errno
import os
import re
import socket
import stat
import uuid
from dataclasses import dataclass
from typing import Optional, Sequence

from kstore.errors import (InvalidConfigError, StoreNotVisibleError, UnsafeFilesystemError,
                           UnusableFileError)
from kstore import mounts
from kstore.fileio import FileOps, get_file_ops
from kstore.properties import parse_properties

ID_FILE = ".kstore-id"
META_PROPERTIES = "meta.properties"
_MAX_ID_BYTES = 4096                 # an identity or meta.properties file is far smaller
_KSTORE_ID = re.compile(r"[0-9a-f]{32}")
# errors that mean "this process may not write here": the store is read-only to the driver
_CANNOT_WRITE = {errno.EROFS, errno.EACCES, errno.EPERM}


@dataclass(frozen=True)
class StoreIdentity:
    """What a task needs to tell that the store it opens is the one the driver planned on:
    the log dirs, each one's identity (None where none could be read or created) and the
    driver's host (for the error)."""
    dirs: tuple[str, ...]
    ids: tuple[Optional[str], ...]
    driver_host: str

    def __post_init__(self) -> None:
        if len(self.dirs) != len(self.ids):
            raise ValueError("one identity per log dir")


def _read_small(io: FileOps, path: str) -> Optional[bytes]:
    """The bytes of a small file, None if absent; UnusableFileError if it is too big to be
    what it claims (hostile input is never read whole)."""
    try:
        fd = io.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = io.pread(fd, _MAX_ID_BYTES + 1, 0)
    finally:
        io.close(fd)
    if len(data) > _MAX_ID_BYTES:
        raise UnusableFileError(path, f"larger than {_MAX_ID_BYTES} bytes: not a store identity")
    return data


def read_id(d: str, io: Optional[FileOps] = None) -> Optional[str]:
    """A log dir's identity: ``kafka:<cluster.id>/<directory.id>`` from Kafka's
    meta.properties (KRaft) when it names a directory.id, else ``kstore:<32 hex>`` from
    .kstore-id; None when it has neither. A malformed identity file raises UnusableFileError
    naming it."""
    io = io or get_file_ops()
    meta = _read_small(io, os.path.join(d, META_PROPERTIES))
    if meta is not None:
        path = os.path.join(d, META_PROPERTIES)
        try:                      # ISO-8859-1, as Kafka's Utils.loadProps reads it
            props = parse_properties(meta.decode("latin-1"), path)
        except InvalidConfigError as e:
            raise UnusableFileError(path, f"not a properties file Kafka reads ({e})") from e
        dir_id = props.get("directory.id", "").strip()
        if dir_id:
            return f"kafka:{props.get('cluster.id', '').strip()}/{dir_id}"
    raw = _read_small(io, os.path.join(d, ID_FILE))
    if raw is None:
        return None
    text = raw.decode("ascii", "replace").strip()
    if not _KSTORE_ID.fullmatch(text):
        raise UnusableFileError(os.path.join(d, ID_FILE), "not a kstore store identity "
                                "(32 lowercase hex digits)")
    return f"kstore:{text}"


def create_id(d: str, io: Optional[FileOps] = None) -> str:
    """d's identity, creating .kstore-id if d has none: a new id written to a temp file,
    fsynced and linked to its name (never replacing one another process linked first, whose
    id is then returned), then the directory fsynced."""
    io = io or get_file_ops()
    have = read_id(d, io)
    if have is not None:
        return have
    new = uuid.uuid4().hex
    path = os.path.join(d, ID_FILE)
    tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp"
    fd = io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            io.pwrite(fd, (new + "\n").encode(), 0)
            io.fsync(fd)
        finally:
            io.close(fd)
        try:
            io.link(tmp, path)
        except FileExistsError:
            pass                          # another process won the race: its id is the id
    finally:
        io.unlink(tmp)
    io.fsync_dir(d)
    got = read_id(d, io)
    if got is None:                       # removed under us: refuse rather than guess
        raise UnusableFileError(path, "vanished while it was created")
    return got


def identify(paths: Sequence[str], create: bool = True, make_dirs: bool = False,
             io: Optional[FileOps] = None) -> StoreIdentity:
    """The driver's side: the identity of each log dir of the store, created where missing if
    `create` (left None where the driver may not write: a read-only store). `make_dirs` creates
    missing log dirs first (a write to a new store: its tasks stage in the first one)."""
    io = io or get_file_ops()
    ids: list[Optional[str]] = []
    for d in paths:
        if make_dirs and not io.exists(d):
            os.makedirs(os.path.dirname(os.path.abspath(d)), exist_ok=True)
            try:
                io.mkdir(d)
            except FileExistsError:
                pass
            io.fsync_dir(os.path.dirname(os.path.abspath(d)))
        ident = read_id(d, io) if io.exists(d) else None
        if ident is None and create and io.exists(d):
            try:
                ident = create_id(d, io)
            except OSError as e:
                if e.errno not in _CANNOT_WRITE:
                    raise
        ids.append(ident)
    return StoreIdentity(tuple(paths), tuple(ids), socket.gethostname())


def check(ident: StoreIdentity, partition_dir: Optional[str] = None,
          io: Optional[FileOps] = None) -> None:
    """The task's side, before it opens the store or stages: StoreNotVisibleError (naming this
    host and the path) unless every log dir exists here with the identity the driver saw.
    Where the driver found no identity (a read-only store), `partition_dir` (e.g. "t-0"), if
    given, must exist in one of the dirs."""
    io = io or get_file_ops()
    host = socket.gethostname()
    for d, want in zip(ident.dirs, ident.ids):
        try:
            st = io.stat_path(d, follow_symlinks=True)
        except FileNotFoundError:
            raise StoreNotVisibleError(host, d, f"the log dir does not exist on this host "
                                       f"(the driver, on {ident.driver_host}, planned on it)") from None
        except OSError as e:
            raise StoreNotVisibleError(host, d, f"the log dir cannot be read here: {e}") from e
        if not stat.S_ISDIR(st.st_mode):
            raise StoreNotVisibleError(host, d, "not a directory on this host")
        if want is None:
            continue
        try:
            got = read_id(d, io)
        except (OSError, UnusableFileError) as e:
            raise StoreNotVisibleError(host, d, f"its identity cannot be read: {e}") from e
        if got is None:
            raise StoreNotVisibleError(
                host, d, f"the directory there has no store identity ({ID_FILE}): it is empty "
                f"or another directory, not the store the driver (on {ident.driver_host}) "
                "planned on (the shared storage is not mounted here)")
        if got != want:
            raise StoreNotVisibleError(
                host, d, f"it is another store (identity {got}; the driver, on "
                f"{ident.driver_host}, planned on {want})")
    if partition_dir is not None and all(i is None for i in ident.ids):
        if not any(io.exists(os.path.join(d, partition_dir)) for d in ident.dirs):
            raise StoreNotVisibleError(
                host, ",".join(ident.dirs), f"partition {partition_dir} is in none of the log "
                f"dirs here, while the driver (on {ident.driver_host}) planned a read of it")


def mount_of(path: str, io: Optional[FileOps] = None) -> tuple[str, str, frozenset[str]]:
    """(mount point, filesystem type, mount options) of the mount holding path (kstore.mounts);
    ("", "", {}) where the mount tables cannot be read."""
    return tuple(mounts.mount_of(path, io))     # type: ignore[return-value]


def check_writer_fs(paths: Sequence[str], io: Optional[FileOps] = None) -> None:
    """Refuse to commit into a store whose locks do not exclude writers on other nodes: an NFS
    mount with local locks (``nolock``, shown as ``local_lock=all`` or ``local_lock=flock``),
    where flock is granted by each client alone. NFSv4 (locks in the protocol) and NFSv3 with
    lockd pass; so does every local filesystem. The rule is kstore.mounts', which a LogManager
    also warns by."""
    for d in paths:
        why = mounts.unsafe_lock_reason(d, io)
        if why is not None:
            raise UnsafeFilesystemError(
                f"log dir {d}: {why}: writers on two nodes would both hold the store's lock. "
                "Mount it with locking (NFSv4, or NFSv3 with lockd) to commit writes to it")


def check_end(ident: StoreIdentity, partition: str, visible_end: int, planned_end: int) -> None:
    """A task on another host than the driver's that sees a partition end below the end the
    driver planned: the writer's appends are not visible here yet (shared storage shows one
    node's writes to another once they reach the server: NFS close-to-open, after the
    writer's flush), or the partition was truncated. Reading on would return fewer rows than
    planned, silently (and a streaming query would checkpoint past them), so it fails naming
    host, path and offsets. On the driver's host it is a truncation, left to the caller."""
    host = socket.gethostname()
    if visible_end >= planned_end or host == ident.driver_host:
        return
    raise StoreNotVisibleError(
        host, ",".join(ident.dirs),
        f"partition {partition} ends at offset {visible_end} here, while the driver (on "
        f"{ident.driver_host}) planned a read up to {planned_end}: the writer's appends are not "
        "visible on this host yet (flush them to the shared storage: flush.ms/flush.messages "
        "or Log.flush) or the partition was truncated")
