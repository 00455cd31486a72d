"""A crash-state harness on kstore's I/O layer (ALICE / CrashMonkey style, after SQLite's crash VFS
and RocksDB's FaultInjectionTestFS).

`TracingOps` is a FileOps that runs a workload on real files while modelling what is durable:
file data becomes durable at fsync / mmap flush, directory entries at an fsync of their
directory. Before every operation it snapshots the tree, so for each operation index k it can
materialise

- the process-kill state (everything handed to the OS survives), and
- power-loss states: the durable directory entries plus an in-order prefix of the metadata
  operations not yet made durable, and for file data one of: only synced data ("synced"), all
  of it ("all"), a torn prefix of the unsynced bytes ("torn"), unsynced bytes read back as
  zeros ("zero"), or each unsynced 512-byte sector new, zeroed or garbage ("garbage").

Workloads note what they were promised with `mark(name, value)` (e.g. "flushed" after flush()
returns); a checker gets the marks made before the crash point.

Durability is the model's, not the disk's: fsync, mmap flush and directory fsync record what
became durable and skip the real system call (`NoSyncOps`, which the fault tests use too).
"""
from __future__ import annotations

import hashlib
import os
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from kstore.fileio import FileOps

SECTOR = 512
DATA_MODES = ("synced", "all", "torn", "zero", "garbage")


@dataclass
class Snapshot:
    """The modelled state just before operation `k`."""
    k: int
    op: str
    files: dict                 # file id -> current bytes (for every file reachable now)
    names: dict                 # dir id -> {name: id} as the process sees it
    durable_names: dict         # dir id -> {name: id} as the disk has it
    durable_data: dict          # file id -> bytes at its last fsync
    pending: list               # metadata operations not yet durable, in order
    dirs: frozenset             # ids that are directories
    marks: dict = field(default_factory=dict)


class NoSyncOps(FileOps):
    """FileOps without real fsync, msync or directory fsync, for tests that model durability
    themselves or never lose power: there a sync only costs time (~13 ms each on this disk,
    hundreds per workload). Each still fails as the real one would on a bad descriptor or a
    missing directory, so kstore sees the same errors; reads see what was written either way
    (one page cache)."""

    def fsync(self, fd):
        os.fstat(fd)

    def map_flush(self, mapping, start=0, end=-1):
        pass

    def fsync_dir(self, path):
        os.close(os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)))


class TracingOps(NoSyncOps):
    """Runs operations for real and records, before each one, a Snapshot of the model."""

    #: its model is not guarded: kstore.marker_gate calls it from one thread at a time
    thread_safe = False

    def __init__(self, root: str):
        self.root = os.path.abspath(root)
        self._next = 0
        self.dirs: set = set()
        self.names: dict = {}
        self.durable_names: dict = {}
        self.durable_data: dict = {}
        self.pending: list = []
        self.snapshots: list[Snapshot] = []
        self.marks: list = []          # (k, name, value)
        self._fd_path: dict = {}
        self._map_path: dict = {}
        self.root_id = self._new_id(is_dir=True)
        self._adopt(self.root, self.root_id)
        self.last_content: dict = {}

    # -- the model ---------------------------------------------------------------------------
    def _new_id(self, is_dir=False) -> int:
        self._next += 1
        if is_dir:
            self.dirs.add(self._next)
            self.names[self._next] = {}
        return self._next

    def _adopt(self, path: str, dir_id: int) -> None:
        """Take an existing tree as durable (the state before the workload)."""
        for name in sorted(os.listdir(path)):
            p = os.path.join(path, name)
            if os.path.isdir(p):
                i = self._new_id(is_dir=True)
                self.names[dir_id][name] = i
                self._adopt(p, i)
            else:
                i = self._new_id()
                self.names[dir_id][name] = i
                with open(p, "rb") as f:
                    self.durable_data[i] = f.read()
        self.durable_names[dir_id] = dict(self.names[dir_id])

    def _resolve(self, path: str, create_parent=False):
        """(parent dir id, name, id or None) for an absolute path under root."""
        rel = os.path.relpath(os.path.abspath(path), self.root)
        if rel.startswith(".."):
            return None, None, None
        parts = [] if rel == "." else rel.split(os.sep)
        if not parts:
            return None, None, self.root_id
        d = self.root_id
        for p in parts[:-1]:
            d = self.names.get(d, {}).get(p)
            if d is None:
                return None, None, None
        return d, parts[-1], self.names.get(d, {}).get(parts[-1])

    def _id_of(self, path: str):
        return self._resolve(path)[2]

    def _walk_files(self):
        """(id, real path) of every file reachable now."""
        stack = [(self.root_id, self.root)]
        while stack:
            d, p = stack.pop()
            for n, i in self.names[d].items():
                q = os.path.join(p, n)
                if i in self.dirs:
                    stack.append((i, q))
                else:
                    yield i, q

    def _snap(self, op: str) -> None:
        files = {}
        for i, p in self._walk_files():
            try:
                with open(p, "rb") as f:
                    files[i] = f.read()
            except OSError:
                files[i] = self.last_content.get(i, b"")
            self.last_content[i] = files[i]
        self.snapshots.append(Snapshot(
            k=len(self.snapshots), op=op, files=files,
            names={d: dict(n) for d, n in self.names.items()},
            durable_names={d: dict(n) for d, n in self.durable_names.items()},
            durable_data=dict(self.durable_data), pending=list(self.pending),
            dirs=frozenset(self.dirs),
            marks=self._marks_now()))

    def _marks_now(self) -> dict:
        out = {}
        for _k, name, value in self.marks:
            out[name] = value
        return out

    def mark(self, name: str, value) -> None:
        """The workload was promised something (e.g. flushed up to an offset) before this point."""
        self.marks.append((len(self.snapshots), name, value))

    def _make_durable(self, i: int, path: str) -> None:
        with open(path, "rb") as f:
            self.durable_data[i] = f.read()

    # -- FileOps -----------------------------------------------------------------------------
    def open(self, path, flags, mode=0o644):
        self._snap("open")
        parent, name, i = self._resolve(path)
        fd = super().open(path, flags, mode)
        if parent is not None:
            if i is None and flags & os.O_CREAT:
                i = self._new_id()
                self.names[parent][name] = i
                self.pending.append(("create", parent, name, i))
            self._fd_path[fd] = path
        return fd

    def close(self, fd):
        self._fd_path.pop(fd, None)
        return super().close(fd)

    def pwrite(self, fd, data, offset):
        self._snap("pwrite")
        return super().pwrite(fd, data, offset)

    def truncate(self, fd, length):
        self._snap("truncate")
        return super().truncate(fd, length)

    def allocate(self, fd, offset, length):
        self._snap("allocate")
        return super().allocate(fd, offset, length)

    def zero_fill(self, fd, offset, length):
        self._snap("zero_fill")
        return FileOps.zero_fill(self, fd, offset, length)

    def fsync(self, fd):
        self._snap("fsync")
        super().fsync(fd)
        path = self._fd_path.get(fd)
        i = self._id_of(path) if path else None
        if i is not None:
            self._make_durable(i, path)

    def map(self, fd, length, writable):
        m = super().map(fd, length, writable)
        if fd in self._fd_path:
            self._map_path[id(m)] = self._fd_path[fd]
        return m

    def map_flush(self, mapping, start=0, end=-1):
        self._snap("map_flush")
        super().map_flush(mapping, start, end)
        path = self._map_path.get(id(mapping))
        i = self._id_of(path) if path else None
        if i is not None and os.path.exists(path):
            self._make_durable(i, path)

    def rename(self, src, dst):
        self._snap("rename")
        sp, sn, i = self._resolve(src)
        dp, dn, old = self._resolve(dst)
        super().rename(src, dst)
        if sp is not None and i is not None and dp is not None:
            del self.names[sp][sn]
            self.names[dp][dn] = i
            self.pending.append(("rename", sp, sn, dp, dn, i))

    def unlink(self, path):
        self._snap("unlink")
        parent, name, i = self._resolve(path)
        super().unlink(path)
        if parent is not None and i is not None:
            del self.names[parent][name]
            self.pending.append(("unlink", parent, name, i))

    def mkdir(self, path):
        self._snap("mkdir")
        parent, name, _ = self._resolve(path)
        super().mkdir(path)
        if parent is not None:
            i = self._new_id(is_dir=True)
            self.names[parent][name] = i
            self.durable_names[i] = {}
            self.pending.append(("mkdir", parent, name, i))

    def rmdir(self, path):
        self._snap("rmdir")
        parent, name, i = self._resolve(path)
        super().rmdir(path)
        if parent is not None and i is not None:
            del self.names[parent][name]
            self.pending.append(("unlink", parent, name, i))

    def fsync_dir(self, path):
        self._snap("fsync_dir")
        super().fsync_dir(path)
        d = self._id_of(path)
        if d is not None and d in self.dirs:
            self.durable_names[d] = dict(self.names[d])
            self.pending = [p for p in self.pending if not _touches(p, d)]

    def finish(self) -> None:
        """A last snapshot: the state after the workload's final operation."""
        self._snap("end")


def _touches(op, d) -> bool:
    if op[0] == "rename":
        return op[3] == d            # durable once its destination directory is synced
    return op[1] == d


# -- materialising states ---------------------------------------------------------------------
def _apply_meta(names: dict, op) -> None:
    kind = op[0]
    if kind in ("create", "mkdir"):
        _, parent, name, i = op
        names.setdefault(parent, {})[name] = i
        if kind == "mkdir":
            names.setdefault(i, {})
    elif kind == "unlink":
        _, parent, name, i = op
        if names.get(parent, {}).get(name) == i:
            del names[parent][name]
    elif kind == "rename":
        _, sp, sn, dp, dn, i = op
        if names.get(sp, {}).get(sn) == i:
            del names[sp][sn]
        names.setdefault(dp, {})[dn] = i


def _unsynced_sectors(durable: bytes, current: bytes, start: int):
    """(start, end) of each sector of current that differs from the durable bytes."""
    for s in range(start, len(current), SECTOR):
        e = min(s + SECTOR, len(current))
        if s >= len(durable) or durable[s:e] != current[s:e]:
            yield s, e


def _data(mode: str, durable: bytes, current: bytes, rng: random.Random) -> bytes:
    """A file's bytes after a power loss, by data mode (see the module docstring)."""
    if mode == "synced":
        return durable
    if mode == "all" or durable == current:
        return current
    n = min(len(durable), len(current))
    diff = np.flatnonzero(np.frombuffer(durable, np.uint8, n) != np.frombuffer(current, np.uint8, n))
    start = int(diff[0]) if len(diff) else n          # the first byte not synced
    if mode == "torn":
        cut = start + (len(current) - start) // 2
        cut -= (cut - start) % SECTOR if cut - start > SECTOR else 0
        return current[:cut] + durable[cut:]
    out = bytearray(current)
    for s, e in _unsynced_sectors(durable, current, start):
        c = 1 if mode == "zero" else rng.randrange(3)     # garbage: new, zero or random
        if c == 1:
            out[s:e] = bytes(e - s)
        elif c == 2:
            out[s:e] = rng.randbytes(e - s)
    return bytes(out)


def crash_state(snap: Snapshot, *, kill: bool, mode: str = "all", prefix: int = 0,
                seed: int = 0) -> dict[str, Optional[bytes]]:
    """The state of `snap` as relative path -> bytes (None for a directory), parents first: the
    process-kill state, or the power-loss state with data `mode` and the first `prefix` pending
    metadata operations applied."""
    rng = random.Random(f"{snap.k}/{mode}/{prefix}/{seed}")      # the same garbage in every run
    if kill:
        names = snap.names
    else:
        names = {d: dict(n) for d, n in snap.durable_names.items()}
        for op in snap.pending[:prefix]:
            _apply_meta(names, op)
    out: dict[str, Optional[bytes]] = {}

    def build(d, rel):
        for n, i in names.get(d, {}).items():
            q = os.path.join(rel, n)
            if i in snap.dirs:
                out[q] = None
                build(i, q)
            else:
                cur = snap.files.get(i, snap.durable_data.get(i, b""))
                out[q] = cur if kill else _data(mode, snap.durable_data.get(i, b""), cur, rng)
    build(1, "")          # id 1 is the root
    return out


def write_state(state: dict[str, Optional[bytes]], target: str) -> None:
    """Create a crash_state() under target."""
    os.makedirs(target, exist_ok=True)
    for rel, data in state.items():
        path = os.path.join(target, rel)
        if data is None:
            os.mkdir(path)
        else:
            with open(path, "wb") as f:
                f.write(data)


def state_digest(state: dict[str, Optional[bytes]]) -> str:
    """A digest of the tree a crash_state() writes: its paths, kinds and bytes."""
    h = hashlib.blake2b(digest_size=16)
    for rel in sorted(state):
        data = state[rel]
        h.update(rel.encode() + (b"\0d" if data is None else b"\0f%d\0" % len(data)))
        if data is not None:
            h.update(data)
    return h.hexdigest()


def materialise(snap: Snapshot, target: str, *, kill: bool, mode: str = "all", prefix: int = 0,
                seed: int = 0) -> None:
    """Write the state of `snap` under target (see crash_state)."""
    write_state(crash_state(snap, kill=kill, mode=mode, prefix=prefix, seed=seed), target)


@dataclass
class Tally:
    states: int = 0          # crash states enumerated
    distinct: int = 0        # of which distinct on disk
    kill: int = 0
    power: int = 0


def explore(snapshots: list[Snapshot], workdir: str, check: Callable[[str, Snapshot, str], None], *,
            prefixes: str = "ends", modes=DATA_MODES, stride: int = 1, tally: Optional[Tally] = None,
            seed: int = 0) -> Tally:
    """Materialise every crash state of the snapshots and run check(dir, snapshot, kind) on each
    distinct one (kind is "kill" or "power:<mode>:<prefix>"). prefixes="ends" tries no pending
    metadata operation, all of them and one in between; "all" tries every prefix."""
    tally = tally or Tally()
    seen = set()
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        workdir = tempfile.mkdtemp(prefix="kstore-crash-", dir="/dev/shm")   # tmpfs: ~5x faster
        own = True
    else:
        own = False
    rng = random.Random(seed)
    for snap in snapshots[::stride]:
        variants = [("kill", True, "all", 0)]
        n = len(snap.pending)
        if prefixes == "all":
            ps = list(range(n + 1))
        else:
            ps = sorted({0, n, rng.randint(0, n)})
        for mode in modes:
            for p in ps:
                variants.append((f"power:{mode}:{p}", False, mode, p))
        for kind, kill, mode, p in variants:
            state = crash_state(snap, kill=kill, mode=mode, prefix=p, seed=seed)
            tally.states += 1
            if kill:
                tally.kill += 1
            else:
                tally.power += 1
            # the same bytes on disk under the same promises need checking once: digest the
            # state in memory and write only the distinct ones
            dig = (state_digest(state), repr(sorted(snap.marks.items())))
            if dig in seen:
                continue
            seen.add(dig)
            tally.distinct += 1
            target = os.path.join(workdir, "state")
            shutil.rmtree(target, ignore_errors=True)
            write_state(state, target)
            try:
                check(target, snap, kind)
            except Exception as e:
                raise AssertionError(f"crash before op {snap.k} ({snap.op}), state {kind}: "
                                     f"{type(e).__name__}: {e}") from e
            shutil.rmtree(target, ignore_errors=True)
    if own:
        shutil.rmtree(workdir, ignore_errors=True)
    return tally
