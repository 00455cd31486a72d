"""The files of a consumer group's membership: names, locks and the atomic group state file.

A group lives in `<log dir of its __consumer_offsets partition>/.kstore-groups/<encoded id>/`
(a dot name: no partition-dir parser takes it for a partition):

    group.lock            flock'd exclusively by the process changing the group (a rebalance,
                          a join, a leave); holds the holder's pid (informative)
    state-<generation>.json  the group state: generation, protocol, leader, members, the
                          plan. Each generation's is written to a temp file and renamed to its
                          new name under group.lock (the older ones then removed), so it is
                          never seen half-written, even after a kill -9 mid-write
    .kstore-notify        the group bell: a notification page in `_notify`'s format, rung after
                          every new generation and every release of a partition
    members/<member>      one per live member, flock'd by it for its whole life (the kernel drops
                          the flock when the process dies, kill -9 included: liveness IS the
                          flock); holds the member's metadata (JSON). It appears only already
                          locked (written under a dot name, locked, then renamed)
    owners/<topic>-<p>    a partition's owner lock, flock'd by the member reading it. Never
                          removed (removing a lock file races with its next locker)

Names are encoded reversibly (`encode_name`). Nothing here is needed across a machine crash
(every member is gone then), so nothing is fsynced; a lost or garbled state is rebuilt
from the live members, its generation continued from the group's last GroupMetadata record.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

from kstore.errors import InvalidConfigError, KStoreError
from kstore.fileio import FileOps, get_file_ops
from kstore.group_records import MemberMetadata, assignment_bytes, subscription_bytes
from kstore.topic_partition import TopicPartition

if TYPE_CHECKING:
    from kstore.group_coordinator import GroupCoordinator

__all__ = ["GROUPS_DIR", "STATE_FILE", "LOCK_FILE", "MEMBERS_DIR", "OWNERS_DIR", "encode_name",
           "decode_name", "GroupLockTimeoutError", "GroupDir", "live_members"]

log = logging.getLogger("kstore.group")

GROUPS_DIR = ".kstore-groups"
STATE_FILE = "state-%020d.json"
_STATE_NAME = re.compile(r"state-(\d{20})\.json")
LOCK_FILE = "group.lock"
BELL_FILE = ".kstore-notify"           # notify.NOTIFY_FILE: writer_bell makes it
MEMBERS_DIR = "members"
OWNERS_DIR = "owners"
#: encoded names longer than this are cut and suffixed with a hash of the whole name
NAME_CAP = 180
_SAFE = re.compile(r"[A-Za-z0-9_.-]")
#: the most a state or member file may hold (a hostile file is not read whole)
MAX_FILE_BYTES = 16 << 20


class GroupLockTimeoutError(KStoreError):
    """A group's group.lock stayed held by another process past the wait's limit."""


def encode_name(name: str) -> str:
    """A file name for any non-empty string: characters outside [A-Za-z0-9._-] (and a leading
    dot) percent-encoded as their UTF-8 bytes; past NAME_CAP characters cut, then "~" and 32
    hex digits of the name's SHA-256 ("~" is never left bare by the encoding)."""
    if not isinstance(name, str) or not name:
        raise InvalidConfigError(f"a group or member id must be a non-empty string, not {name!r}")
    out = []
    for i, ch in enumerate(name):
        if _SAFE.fullmatch(ch) and not (i == 0 and ch == "."):
            out.append(ch)
        else:
            out.extend(f"%{b:02X}" for b in ch.encode("utf-8", "surrogatepass"))
    enc = "".join(out)
    if len(enc) > NAME_CAP:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        enc = enc[:NAME_CAP - 33].rstrip("%0123456789ABCDEF") + "~" + digest
    return enc


def decode_name(enc: str) -> Optional[str]:
    """The string encode_name made enc from; None for a hashed (cut) name or a name
    encode_name does not make."""
    if "~" in enc:
        return None
    try:
        raw = bytearray()
        i = 0
        while i < len(enc):
            if enc[i] == "%":
                raw.append(int(enc[i + 1:i + 3], 16))
                i += 3
            else:
                raw += enc[i].encode("ascii")
                i += 1
        name = raw.decode("utf-8", "surrogatepass")
    except (ValueError, UnicodeError):
        return None
    return name if name and encode_name(name) == enc else None


def _json_or_none(data: bytes, path: str) -> Optional[dict]:
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeError):
        obj = None
    if not isinstance(obj, dict):
        log.warning("%s is not a group file (%d bytes): ignored", path, len(data))
        return None
    return obj


class GroupDir:
    """A group's directory and the operations on its files (see the module doc); every one
    through `io`. Stateless apart from the paths: each caller holds its own descriptors."""

    def __init__(self, io: FileOps, log_dir: str, group_id: str):
        self.io = io
        self.group_id = group_id
        self.path = os.path.join(log_dir, GROUPS_DIR, encode_name(group_id))
        self.members = os.path.join(self.path, MEMBERS_DIR)
        self.owners = os.path.join(self.path, OWNERS_DIR)

    def make(self, timeout: float = 30.0, interrupt: Optional[Callable[[], None]] = None) -> None:
        """Create the directories that are missing (racing creators are fine); the group's own
        only under the groups dir's flock (lock_groups_dir, its wait as lock's), so an admin
        holding that flock sees the group absent until it lets go (a member's first join)."""
        self._mkdir(os.path.dirname(self.path))
        if not self.exists():
            fd = self.lock_groups_dir(timeout, interrupt)
            try:
                self._mkdir(self.path)
            finally:
                self.io.unlock(fd)
        for d in (self.members, self.owners):
            self._mkdir(d)

    def _mkdir(self, d: str) -> None:
        try:
            self.io.mkdir(d)
        except FileExistsError:
            self.io.check_dir(d)

    def exists(self) -> bool:
        return self.io.exists(self.path)

    def bell_ident(self) -> Optional[tuple[int, int]]:
        """(st_dev, st_ino) of the group bell's file (None: missing): a member re-maps its
        bell when the file it mapped was replaced (the directory removed and made again)."""
        try:
            st = self.io.stat_path(os.path.join(self.path, BELL_FILE))
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    # -- group.lock --------------------------------------------------------------------------
    def lock(self, timeout: float, interrupt: Optional[Callable[[], None]] = None) -> int:
        """Take group.lock, waiting at most timeout seconds (polls from 0.2 ms up to 10 ms: a
        holder's work is short and bounded; interrupt() is called before each pause and may
        raise, a Consumer's wakeup). Returns the descriptor to pass to unlock."""
        path = os.path.join(self.path, LOCK_FILE)
        fd = self._wait_flock(path, False, timeout, interrupt)
        if fd is None:
            holder = (self._read_small(path, 32) or b"").strip().decode("ascii", "replace")
            raise GroupLockTimeoutError(
                f"{path}: group {self.group_id!r} locked by another process"
                f"{' (pid ' + holder + ')' if holder.isdigit() else ''} for more than {timeout:g} s")
        try:       # fixed width, never truncated: a truncation costs a journal entry
            self.io.pwrite(fd, b"%-12d" % os.getpid(), 0)
        except OSError:
            pass                       # the pid is informative only
        return fd

    def lock_groups_dir(self, timeout: float, interrupt: Optional[Callable[[], None]] = None) -> int:
        """Flock the groups dir (`.kstore-groups`, made if missing) itself, as lock waits: a
        group's directory is made only under it (make), so its holder decides about a group
        that has none without a member joining meanwhile, and leaves nothing behind."""
        parent = os.path.dirname(self.path)
        self._mkdir(parent)
        fd = self._wait_flock(parent, True, timeout, interrupt)
        if fd is None:
            raise GroupLockTimeoutError(f"{parent}: locked by another process (making or deleting "
                                        f"a group) for more than {timeout:g} s")
        return fd

    def _wait_flock(self, path: str, directory: bool, timeout: float,
                    interrupt: Optional[Callable[[], None]]) -> Optional[int]:
        """try_lock path until it is had (its descriptor) or timeout seconds passed (None)."""
        deadline = time.monotonic() + timeout
        pause = 0.0002
        while True:
            fd = self.io.try_lock(path, directory=directory)
            if fd is not None:
                return fd
            if time.monotonic() >= deadline:
                return None
            if interrupt is not None:
                interrupt()
            time.sleep(pause)
            pause = min(pause * 2, 0.01)

    def unlock(self, fd: int) -> None:
        self.io.unlock(fd)

    # -- the group state ---------------------------------------------------------------------
    def state_files(self) -> list[tuple[int, str]]:
        """(generation, path) of every state file, newest first."""
        out = []
        for name in self._list(self.path):
            m = _STATE_NAME.fullmatch(name)
            if m:
                out.append((int(m.group(1)), os.path.join(self.path, name)))
        out.sort(reverse=True)
        return out

    def newest_generation(self) -> int:
        """The highest generation a state file is named after (0: none), readable or not."""
        files = self.state_files()
        return files[0][0] if files else 0

    def read_state(self) -> Optional[dict]:
        """The newest group state, or None (none, or the newest unreadable or not a group
        state, or not of the generation its name says: a caller then rebuilds it). A file
        removed between the listing and its open (a newer one was written) is looked for again."""
        for _ in range(8):
            files = self.state_files()
            if not files:
                return None
            gen, path = files[0]
            data = self._read_small(path, MAX_FILE_BYTES, missing_ok=True)
            if data is None:
                continue
            state = _json_or_none(data, path)
            if state is None or not _valid_state(state) or state["generation"] != gen:
                if state is not None:
                    log.warning("%s: not a group state of generation %d: ignored", path, gen)
                return None
            return state
        return None

    def write_state(self, state: dict) -> None:
        """Publish a new generation's state (caller holds group.lock): a temp file renamed to a
        NEW name, state-<generation>.json (never over an existing file: a reader sees a whole
        file or none, and ext4 makes a rename over a file cost ~2 ms), then the older ones
        removed. A temp file left by a killed writer goes at the next `clean_temps`."""
        gen = state["generation"]
        tmp = os.path.join(self.path, f".state.{os.getpid()}.tmp")
        fd = self.io.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            self.io.pwrite(fd, json.dumps(state, separators=(",", ":")).encode(), 0)
        finally:
            self.io.close(fd)
        self.io.rename(tmp, os.path.join(self.path, STATE_FILE % gen))
        for old, path in self.state_files():
            if old < gen:
                try:
                    self.io.unlink(path)
                except (OSError, KStoreError):
                    pass

    def clean_temps(self) -> None:
        """Remove temp files of killed writers (caller holds group.lock: no live writer makes
        a state temp file, and a member's temp file is flock'd until it is renamed)."""
        for d in (self.path, self.members):
            for name in self._list(d):
                if not (name.startswith(".") and name.endswith(".tmp")):
                    continue
                p = os.path.join(d, name)
                fd = self.io.try_lock(p) if d == self.members else None
                if d == self.members and fd is None:
                    continue
                try:
                    self.io.unlink(p)
                except (OSError, KStoreError):
                    pass
                finally:
                    if fd is not None:
                        self.io.unlock(fd)

    # -- members -----------------------------------------------------------------------------
    def add_member(self, member_id: str, meta: dict) -> int:
        """Create this member's file, locked (the descriptor holds the flock until the member
        leaves or its process dies): written under a dot name, locked, renamed into place, so
        no scan ever sees it unlocked."""
        enc = encode_name(member_id)
        tmp = os.path.join(self.members, f".{enc}.tmp")
        fd = self.io.try_lock(tmp)
        if fd is None:
            raise KStoreError(f"{tmp}: member file locked by another member")
        try:
            if self.io.size(fd):                 # a dead joiner's leftover
                self.io.truncate(fd, 0)
            self.io.pwrite(fd, json.dumps(meta, separators=(",", ":")).encode(), 0)
            self.io.rename(tmp, os.path.join(self.members, enc))
        except BaseException:
            self.io.unlock(fd)
            raise
        return fd

    def update_member(self, fd: int, meta: dict) -> int:
        """Replace a member's file with new metadata (caller holds group.lock): a new file made
        as add_member makes one, renamed over the old while the old one's flock is still held,
        so a scan sees one or the other, locked. Returns the new descriptor (the old closed)."""
        new = self.add_member(meta["member_id"], meta)
        self.io.unlock(fd)
        return new

    def remove_member(self, member_id: str, fd: int) -> None:
        """A leaving member: unlink its file while still locking it, then drop the lock."""
        try:
            self.io.unlink(os.path.join(self.members, encode_name(member_id)))
        except FileNotFoundError:
            pass
        finally:
            self.io.unlock(fd)

    def scan_members(self, reap: bool) -> list[dict]:
        """The live members' metadata (files whose flock another description holds), in join
        order. A file found unlocked belongs to a dead member: removed if reap (the caller
        holds group.lock), else skipped. Unreadable live files are skipped with a warning."""
        live = []
        for name in self._list(self.members):
            if name.startswith("."):
                continue
            p = os.path.join(self.members, name)
            try:
                fd = self.io.try_lock(p)
            except (OSError, KStoreError) as e:
                log.warning("member file %s unusable (%s): ignored", p, e)
                continue
            if fd is not None:                    # nobody holds it: its member is dead
                try:
                    if reap:
                        self.io.unlink(p)
                except (OSError, KStoreError):
                    pass
                finally:
                    self.io.unlock(fd)
                continue
            meta = _json_or_none(self._read_small(p, MAX_FILE_BYTES) or b"", p)
            if meta is not None and _valid_member(meta) and encode_name(meta["member_id"]) == name:
                live.append(meta)
        live.sort(key=lambda m: (m["joined_ms"], m["member_id"]))
        return live

    def is_alive(self, member_id: str) -> bool:
        """Whether member_id's file is locked by someone (its member alive). A non-blocking
        flock attempt: open, flock, close."""
        p = os.path.join(self.members, encode_name(member_id))
        if not self.io.exists(p):
            return False
        fd = self.io.try_lock(p)
        if fd is None:
            return True
        self.io.unlock(fd)
        return False

    # -- owner locks -------------------------------------------------------------------------
    def try_own(self, topic: str, partition: int) -> Optional[int]:
        """Take a partition's owner lock without waiting: its descriptor, or None while another
        member (this process or another) holds it."""
        return self.io.try_lock(os.path.join(self.owners, encode_name(f"{topic}-{partition}")))

    # -- helpers -----------------------------------------------------------------------------
    def _list(self, d: str) -> list[str]:
        try:
            return sorted(self.io.listdir(d))
        except FileNotFoundError:
            return []

    def _read_small(self, path: str, limit: int, missing_ok: bool = False) -> Optional[bytes]:
        """Up to limit bytes of path; b"" if unreadable (logged), or if missing (None instead
        with missing_ok)."""
        try:
            fd = self.io.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None if missing_ok else b""
        except (OSError, KStoreError) as e:
            log.warning("%s unreadable (%s): ignored", path, e)
            return b""
        try:
            return self.io.pread(fd, limit, 0)
        except OSError as e:
            log.warning("%s unreadable (%s): ignored", path, e)
            return b""
        finally:
            self.io.close(fd)


def _is_str_list(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(t, str) for t in x)


def _valid_member(m: Any) -> bool:
    """A member file's metadata has every field the group needs, of the right types."""
    return (isinstance(m, dict) and isinstance(m.get("member_id"), str) and m["member_id"] != ""
            and isinstance(m.get("joined_ms"), int) and _is_str_list(m.get("topics"))
            and _is_str_list(m.get("assignors")) and bool(m["assignors"])
            and isinstance(m.get("client_id"), str) and isinstance(m.get("client_host"), str)
            and isinstance(m.get("session_timeout"), int) and isinstance(m.get("rebalance_timeout"), int)
            and (m.get("group_instance_id") is None or isinstance(m["group_instance_id"], str)))


def _valid_state(s: dict) -> bool:
    """A group state has the fields and types a member relies on."""
    if not (isinstance(s.get("generation"), int) and s["generation"] >= 0
            and isinstance(s.get("members"), list) and all(_valid_member(m) for m in s["members"])
            and isinstance(s.get("assignment"), dict) and isinstance(s.get("partitions"), dict)):
        return False
    for parts in s["assignment"].values():
        if not isinstance(parts, list) or not all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and isinstance(p[1], int)
                for p in parts):
            return False
    return all(isinstance(k, str) and isinstance(v, int) for k, v in s["partitions"].items())


def live_members(coordinator: "GroupCoordinator", group_id: str,
                 io: Optional[FileOps] = None) -> Optional[list[MemberMetadata]]:
    """The group's live members (their member files' flocks held), with their subscriptions
    and their partitions in the current plan. None when no kstore member ever joined the
    group here (no group directory: e.g. a broker's __consumer_offsets, whose GroupMetadata
    record is then all there is to know). Takes no lock (flock attempts only): delete_group,
    offset expiry and the consumer-groups tool call it."""
    gdir = GroupDir(io or get_file_ops(), coordinator.log_dir_for(group_id), group_id)
    if not gdir.exists():
        return None
    state = gdir.read_state() or {}
    plan = state.get("assignment", {})
    return [MemberMetadata(m["member_id"], m.get("group_instance_id"), m["client_id"], m["client_host"],
                           m["rebalance_timeout"], m["session_timeout"], subscription_bytes(m["topics"]),
                           assignment_bytes([TopicPartition(t, p) for t, p in plan.get(m["member_id"], ())]))
            for m in gdir.scan_members(reap=False)]
