"""The one I/O layer every kstore file operation goes through.

Segments, indexes and checkpoints never call ``os`` directly: they call a ``FileOps``. The
default implementation is thin; tests swap in a subclass (``set_file_ops`` or the ``io=``
argument of ``Log.open``) to record operations, inject crashes, torn writes and ENOSPC.

A segment append of 16 KiB or more (segment.PWRITE_MIN_BYTES) is a ``pwrite`` here like any
other. A smaller one is a memcpy from the compiled core into the segment's mapping and is not an
individual call here; a FileOps that sets ``intercept_map_writes = True`` makes segments route
those writes through ``map_write`` instead, so a crash harness sees every byte written.
"""
from __future__ import annotations

import errno
import fcntl
import itertools
import os
import stat
import struct
import sys
from typing import Any, Optional

from kstore._core import Mapping, pread_validate, validate_batches
from kstore.errors import UnusableFileError


_ZEROS = bytes(1 << 20)
_MEMORY_FS = {0x01021994, 0x858458F6}      # TMPFS_MAGIC, RAMFS_MAGIC (linux/magic.h)
_fstatfs: Any = None                         # libc's fstatfs through ctypes, loaded on first use
# never follow a symlink at the last component, never block on a FIFO (or a device) at open
_OPEN_FLAGS = (getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_NONBLOCK", 0))
# what open() fails with when the path is a symlink (ELOOP under O_NOFOLLOW), a directory
# opened for writing, a FIFO opened write-only without a reader (ENXIO) or a device
_SPECIAL_ERRNOS = {errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENODEV, errno.EMLINK}


def file_kind(mode: int) -> str:
    """A file type in words, for error messages."""
    for test, name in ((stat.S_ISLNK, "symbolic link"), (stat.S_ISDIR, "directory"),
                       (stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"),
                       (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "regular file" if stat.S_ISREG(mode) else "special file"

_tmp_seq = itertools.count()      # next() is atomic under the GIL


def _refuse_special(path: str) -> None:
    """Raise UnusableFileError if path exists and is not a regular file (its open failed)."""
    try:
        st_mode = os.lstat(path).st_mode
    except OSError:
        return
    if not stat.S_ISREG(st_mode):
        raise UnusableFileError(path, f"a {file_kind(st_mode)}, not a regular file")


def _open_regular(path: str, flags: int, mode: int = 0o644) -> int:
    """os.open of a regular file only (see FileOps.open)."""
    try:
        fd = os.open(path, flags | _OPEN_FLAGS, mode)
    except OSError as e:
        if e.errno in _SPECIAL_ERRNOS:
            _refuse_special(path)
        raise
    try:
        st_mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISREG(st_mode):
        os.close(fd)
        raise UnusableFileError(path, f"a {file_kind(st_mode)}, not a regular file")
    return fd


class FileOps:
    """Default, pass-through file operations (POSIX)."""

    intercept_map_writes = False

    # -- files -----------------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        """Open (or create) a regular file. A symlink, FIFO, socket, device or directory at path
        is refused with UnusableFileError, without following it or blocking on it (O_NOFOLLOW,
        O_NONBLOCK, then fstat): a hostile file must neither hang kstore nor redirect its writes."""
        return _open_regular(path, flags, mode)

    def check_dir(self, path: str) -> None:
        """Raise UnusableFileError if path is anything but a real directory (a symlink to one
        too): a partition found by a directory scan must not lead kstore outside its log dir.
        A path that is gone is left to the caller's open to report, as before."""
        try:
            st_mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(st_mode):
            raise UnusableFileError(path, f"a {file_kind(st_mode)}, not a directory")

    def close(self, fd: int) -> None:
        os.close(fd)

    def pwrite(self, fd: int, data, offset: int) -> None:
        """Write all of data at offset (loops over short writes)."""
        view = memoryview(data)
        while len(view):
            n = os.pwrite(fd, view, offset)
            if n <= 0:
                raise OSError(errno.EIO, "short write")
            view = view[n:]
            offset += n

    def pread(self, fd: int, n: int, offset: int) -> bytes:
        return os.pread(fd, n, offset)

    def pread_validate(self, fd: int, n: int, offset: int, base_offset: int,
                       prev_last_offset: int) -> tuple[int, int, int, int, int]:
        """(bytes read, then validate_batches' first four) of the n bytes at offset: one C call,
        no copy, the GIL released (a read-only log's tail refresh). A subclass that overrides
        pread (fault injection) has it called here instead, so it sees this read too."""
        if type(self).pread is not FileOps.pread:
            data = self.pread(fd, n, offset)
            valid, last, mts, moff, _ = validate_batches(data, base_offset, prev_last_offset)
            return len(data), valid, last, mts, moff
        return pread_validate(fd, n, offset, base_offset, prev_last_offset)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)

    def allocate(self, fd: int, offset: int, length: int) -> None:
        """Reserve blocks so that later writes through a mapping cannot hit ENOSPC (SIGBUS)."""
        if length <= 0:
            return
        try:
            os.posix_fallocate(fd, offset, length)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
            # no fallocate on this filesystem: extend with explicit zeros
            self.pwrite(fd, b"\0" * length, offset)

    def zero_fill(self, fd: int, offset: int, length: int) -> None:
        """Extend a file with written zeros. Unlike fallocate's unwritten extents, the blocks
        are initialised, so the first store through a mapping costs a minor fault rather than
        an extent conversion (~10x cheaper on ext4), and a full disk fails here, not as SIGBUS."""
        chunk = _ZEROS
        while length > 0:
            n = min(length, len(chunk))
            self.pwrite(fd, chunk[:n] if n < len(chunk) else chunk, offset)
            offset += n
            length -= n

    def for_hints(self) -> "FileOps":
        """The FileOps for files no load or recovery reads (hints never fsynced: a partition's
        `.kstore-notify` page). A FileOps in front of another that holds back changes until the
        clean-shutdown marker's removal is durable (marker_gate) lets these through at once."""
        return self

    def memory_backed(self, fd: int) -> bool:
        """Whether fd's file system keeps file data in memory only (tmpfs, ramfs: fstatfs).
        There, fallocate allocates zeroed pages that a write then fills (two passes), so a
        segment lets its pwrites grow the file instead; on disk file systems it reserves
        blocks only and makes the writes cheaper. False where it cannot be told."""
        global _fstatfs
        if _fstatfs is None:
            _fstatfs = False
            if sys.platform.startswith("linux"):
                import ctypes
                try:
                    _fstatfs = ctypes.CDLL(None, use_errno=True).fstatfs
                except (OSError, AttributeError):
                    pass
        if not _fstatfs:
            return False
        import ctypes
        buf = ctypes.create_string_buffer(256)      # struct statfs; f_type is its first word
        if _fstatfs(fd, buf) != 0:
            return False
        return struct.unpack_from("l", buf.raw)[0] in _MEMORY_FS

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def stat(self, fd: int) -> os.stat_result:
        """fstat: a read-only reader compares (st_dev, st_ino) to notice a replaced file."""
        return os.fstat(fd)

    # -- names -----------------------------------------------------------------------------
    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def link(self, src: str, dst: str) -> None:
        """A second name for a file; FileExistsError if dst exists. Unlike rename it never
        replaces: a file published this way (tmp written and fsynced, then linked) is created
        atomically and only once, however many processes race to create it."""
        os.link(src, dst, follow_symlinks=False)

    def unlink(self, path: str) -> None:
        """Remove a regular file. Anything else kstore would remove by its name (an orphaned
        index, a leftover .deleted) is refused with UnusableFileError: a hostile file is left
        for its owner, never deleted as kstore's own."""
        _refuse_special(path)
        os.unlink(path)

    def mkdir(self, path: str) -> None:
        os.mkdir(path)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except NotADirectoryError:
            raise UnusableFileError(path, "not a directory") from None

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def stat_path(self, path: str, follow_symlinks: bool = False) -> os.stat_result:
        """stat of a path without opening it: a read-only view's cheap look at a file it
        validated (not following a symlink: one put there is a different file) or at its
        partition directory (followed, as listdir follows it)."""
        return os.stat(path, follow_symlinks=follow_symlinks)

    def getsize(self, path: str) -> int:
        return os.path.getsize(path)

    def getmtime_ms(self, path: str) -> int:
        return os.stat(path).st_mtime_ns // 1_000_000

    def set_mtime_ms(self, path: str, ms: int) -> None:
        os.utime(path, ns=(ms * 1_000_000, ms * 1_000_000))

    # -- locks -----------------------------------------------------------------------------
    def try_lock(self, path: str, *, shared: bool = False, directory: bool = False) -> Optional[int]:
        """flock path without waiting: a directory, or a lock file (created if missing). Returns
        the descriptor that holds the lock until unlock(), or None if another open file
        description (this process or another) holds a conflicting lock."""
        cloexec = getattr(os, "O_CLOEXEC", 0)
        if directory:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | cloexec)
            except OSError as e:
                if e.errno == errno.ENOTDIR:
                    raise UnusableFileError(path, "not a directory") from None
                if e.errno == errno.ELOOP:
                    raise UnusableFileError(path, "a symbolic link, not a directory") from None
                raise
        else:
            # a lock file is a regular file, never followed through a symlink (the lock would
            # create or take a file outside the log dir) nor waited on (a FIFO). Opened as
            # FileOps.open does, but not through it: fault-injecting FileOps see no lock files
            try:
                fd = _open_regular(path, os.O_RDWR | os.O_CREAT)
            except OSError as e:
                if e.errno not in (errno.EACCES, errno.EPERM, errno.EROFS) or not os.path.isfile(path):
                    raise
                fd = _open_regular(path, os.O_RDONLY)      # flock needs no write access
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    def unlock(self, fd: int) -> None:
        """Release a lock taken by try_lock and close its descriptor."""
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # -- mappings --------------------------------------------------------------------------
    def map(self, fd: int, length: int, writable: bool) -> Mapping:
        return Mapping(fd, length, writable)

    def map_flush(self, mapping: Mapping, start: int = 0, end: int = -1) -> None:
        mapping.flush(start, end)

    def populate(self, mapping: Mapping, start: int, end: int) -> bool:
        """Pre-fault a writable mapping's pages over [start, end) (MADV_POPULATE_WRITE: the
        pretoucher's, kstore/pretouch.py), so the writer's later copy there takes no page
        fault. Changes no byte; the range must lie inside the file. False where unsupported."""
        return mapping.populate_write(start, end)

    def map_write(self, mapping: Mapping, position: int, data) -> None:
        """Slow path used when intercept_map_writes is set."""
        mapping.write(position, data)

    # -- helpers built on the primitives -----------------------------------------------------
    def write_atomic(self, path: str, data: bytes) -> None:
        """tmp file, write, fsync, rename over path, fsync the directory. The temp name is
        unique to this call (two writers of one file never share it) and ends in `.tmp`, which
        loading removes."""
        tmp = f"{path}.{os.getpid()}-{next(_tmp_seq)}.tmp"
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.pwrite(fd, data, 0)
            self.fsync(fd)
        finally:
            self.close(fd)
        self.rename(tmp, path)
        self.fsync_dir(os.path.dirname(os.path.abspath(path)))

    def read_file(self, path: str) -> bytes:
        fd = self.open(path, os.O_RDONLY)
        try:
            out: list[bytes] = []
            pos = 0
            while True:
                b = self.pread(fd, 1 << 20, pos)
                if not b:
                    return b"".join(out)
                out.append(b)
                pos += len(b)
        finally:
            self.close(fd)


_default: FileOps = FileOps()


def get_file_ops() -> FileOps:
    """The FileOps used when none is passed explicitly."""
    return _default


def set_file_ops(ops: Optional[FileOps]) -> FileOps:
    """Install ops as the default (None restores the plain one); returns the previous default."""
    global _default
    prev = _default
    _default = ops if ops is not None else FileOps()
    return prev
