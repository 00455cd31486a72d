"""Offset checkpoint files (Kafka's OffsetCheckpointFile): recovery-point-offset-checkpoint,
log-start-offset-checkpoint, cleaner-offset-checkpoint.

Format: a version line `0`, a count line, then `topic partition offset` lines, single spaces,
`\\n` line ends. Written atomically (temp file, fsync, rename, fsync of the directory). A malformed
file raises CheckpointError naming the path and the reason; callers treat it as absent.

Writers of one file hold its `lock` from taking their snapshot to the end of the write, so an
older snapshot never replaces a newer one (a log start offset going backwards would bring
deleted records back after a crash).
"""
from __future__ import annotations

import os
import threading
from typing import Mapping, Optional

from kstore.errors import KStoreError, UnusableFileError
from kstore.fileio import FileOps, get_file_ops

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
VERSION = 0


class CheckpointError(KStoreError):
    """A checkpoint file that cannot be trusted."""


_locks_guard = threading.Lock()
_locks: dict[str, threading.Lock] = {}


def checkpoint_lock(path: str) -> threading.Lock:
    """The process-wide lock of the checkpoint file at path (one per file, made on first use).
    A leaf in the lock hierarchy except for the registry lock a snapshot may take."""
    key = os.path.abspath(path)
    with _locks_guard:
        lk = _locks.get(key)
        if lk is None:
            lk = _locks[key] = threading.Lock()
        return lk


class OffsetCheckpointFile:
    """One checkpoint file mapping (topic, partition) to an offset."""

    def __init__(self, path: str, io: Optional[FileOps] = None):
        self.path = path
        self._io = io or get_file_ops()

    @property
    def lock(self) -> threading.Lock:
        """Hold it from taking the snapshot to the end of write() (see the module docstring)."""
        return checkpoint_lock(self.path)

    def write(self, offsets: Mapping[tuple[str, int], int]) -> None:
        lines = [str(VERSION), str(len(offsets))]
        for (topic, partition), offset in sorted(offsets.items()):
            lines.append(f"{topic} {partition} {offset}")
        self._io.write_atomic(self.path, ("\n".join(lines) + "\n").encode("utf-8"))

    def read(self) -> dict[tuple[str, int], int]:
        """The entries; {} for a missing or empty file; CheckpointError if malformed."""
        if not self._io.exists(self.path):
            return {}
        try:
            text = self._io.read_file(self.path).decode("utf-8")
        except UnicodeDecodeError as e:
            raise CheckpointError(f"malformed checkpoint {self.path}: not UTF-8 ({e})") from None
        except UnusableFileError as e:       # a symlink or FIFO: refused, treated as malformed
            raise CheckpointError(f"malformed checkpoint: {e}") from None
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if not lines:
            return {}
        if lines[0].strip() != str(VERSION):
            raise CheckpointError(f"malformed checkpoint {self.path}: unrecognised version {lines[0]!r}")
        if len(lines) < 2:
            return {}
        try:
            count = int(lines[1])
        except ValueError:
            raise CheckpointError(f"malformed checkpoint {self.path}: bad count line {lines[1]!r}") from None
        entries = lines[2:]
        if count < 0 or len(entries) != count:
            raise CheckpointError(
                f"malformed checkpoint {self.path}: expected {count} entries but found {len(entries)}")
        out = {}
        for n, line in enumerate(entries, start=3):
            parts = line.split(" ")
            if len(parts) != 3:
                raise CheckpointError(f"malformed checkpoint {self.path}: line {n} {line!r} has {len(parts)} fields")
            topic, part, off = parts
            try:
                p, o = int(part), int(off)
            except ValueError:
                raise CheckpointError(f"malformed checkpoint {self.path}: line {n} {line!r} is not numeric") from None
            if p < 0:
                raise CheckpointError(f"malformed checkpoint {self.path}: line {n} has a negative partition")
            out[(topic, p)] = o
        return out


def drop_topic_entries(path: str, io: FileOps, topic: str) -> None:
    """Rewrite the checkpoint file at path without the entries of `topic` (a deleted topic),
    under its lock; a missing or malformed file is left as it is (read as absent anyway)."""
    cp = OffsetCheckpointFile(path, io)
    with cp.lock:
        try:
            entries = cp.read()
        except CheckpointError:
            return
        if any(t == topic for t, _p in entries):
            cp.write({tp: o for tp, o in entries.items() if tp[0] != topic})
