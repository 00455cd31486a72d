"""A standalone log's saved start: the two small JSON files it keeps in its partition directory
(a LogManager's logs have the log-start-offset-checkpoint instead), written atomically and read
bounded, since bytes from disk are hostile.

- STANDALONE_CLEAN_MARKER, written by a clean close: the log needs no recovery; its start.
- LOG_START_FILE, written whenever DeleteRecords or a truncation moves the start: read at an
  open after a crash, so the records below it never come back.

A partition may switch between standalone and managed use: a standalone open without files of
its own takes its log dir's checkpoint entry, and a managed open carries these files' start
into the checkpoint before removing them (records deleted stay deleted, either way).
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

from kstore.checkpoint import LOG_START_OFFSET_CHECKPOINT, CheckpointError, OffsetCheckpointFile
from kstore.errors import KStoreError
from kstore.fileio import FileOps
from kstore.files import PARTITION_DIR

log = logging.getLogger("kstore.log")

INT64_MAX = (1 << 63) - 1
#: Written in a standalone (unmanaged) log's directory by close(); its presence at open means
#: the log was closed cleanly. Kafka brokers ignore unknown files in a partition directory.
STANDALONE_CLEAN_MARKER = ".kstore-clean-shutdown"
#: A standalone log's start after a DeleteRecords or truncation moved it (what a LogManager's
#: log-start-offset-checkpoint holds for its logs), read at an open without the marker
LOG_START_FILE = ".kstore-log-start"
#: a LogManager's clean-shutdown marker in a log dir (Kafka's): a standalone writable open of one
#: of its partitions removes it, since the dir's logs need recovery once that writer changed one
MANAGER_CLEAN_MARKER = ".kafka_cleanshutdown"
#: the most either file may hold: anything longer is not one save_log_start wrote
MAX_BYTES = 4096


def save_log_start(io: FileOps, dir_: str, start: int, name: str = LOG_START_FILE) -> None:
    """A standalone log's start, saved atomically where its next open reads it: the start file
    (read after a crash) or, at a clean close, the clean-shutdown marker."""
    io.write_atomic(os.path.join(dir_, name),
                    json.dumps({"version": 0, "log_start_offset": start}).encode())


def read_saved_start(io: FileOps, path: str, what: str) -> tuple[bool, Optional[int]]:
    """A file save_log_start wrote, read bounded (MAX_BYTES): (True, its start, None if it has
    none), or (False, None) with a warning if it does not hold one (torn, hostile, too large,
    a bad start, gone): the segments' base offsets still bound the start."""
    try:
        fd = io.open(path, os.O_RDONLY)
        try:
            data = io.pread(fd, MAX_BYTES + 1, 0)
        finally:
            io.close(fd)
        info = json.loads(data.decode()) if len(data) <= MAX_BYTES else None
        if isinstance(info, dict):
            start = info.get("log_start_offset")
            if start is None or (type(start) is int and 0 <= start <= INT64_MAX):
                return True, start
    except (ValueError, OSError, UnicodeDecodeError):
        pass
    log.warning("ignoring unreadable %s %s", what, path)
    return False, None


def checkpointed_start(io: FileOps, dir_: str) -> Optional[int]:
    """A standalone open without start files of its own: the start its log dir's
    log-start-offset-checkpoint holds for it (a LogManager's life of the partition, since which
    no standalone one moved the start), None if none (or not in a log dir)."""
    tp = partition_of(dir_)
    if tp is None:
        return None
    try:
        return OffsetCheckpointFile(_checkpoint_path(dir_), io).read().get(tp)
    except (CheckpointError, OSError, KStoreError):
        return None         # ignored, as a LogManager ignores it: the segments bound the start


def carry_to_manager(io: FileOps, dir_: str, names: list[str],
                     checkpointed: Optional[int]) -> Optional[int]:
    """A managed open of a partition a standalone Log used since its LogManager last held it:
    the start that life saved (names: the start files present, the marker's first) replaces the
    older checkpointed one, and is written into the log dir's checkpoint now, before the
    caller removes the files, so no crash loses it. Returns the start to load with."""
    start = None
    for name in names:
        ok, saved = read_saved_start(io, os.path.join(dir_, name), name)
        if ok and saved is not None:
            start = saved
            break
    tp = partition_of(dir_)
    if start is None or tp is None:
        return checkpointed
    cp = OffsetCheckpointFile(_checkpoint_path(dir_), io)
    with cp.lock:
        try:
            entries = cp.read()
        except CheckpointError:
            entries = {}        # the manager ignores it too; its next checkpoint is whole
        if entries.get(tp) != start:
            entries[tp] = start
            cp.write(entries)
    return start


def partition_of(dir_: str) -> Optional[tuple[str, int]]:
    """(topic, partition) a partition directory's name says, None if it is not one."""
    m = PARTITION_DIR.match(os.path.basename(os.path.abspath(dir_)))
    return (m.group(1), int(m.group(2))) if m else None


def _checkpoint_path(dir_: str) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(dir_)), LOG_START_OFFSET_CHECKPOINT)


def read_only_start(io: FileOps, dir_: str) -> Optional[int]:
    """Where a read-only open of dir_ starts at least: its log dir's checkpoint entry (a
    LogManager's DeleteRecords inside a segment shows nowhere else) when the directory has no
    start files of its own, as a standalone writable open (LogLoader); None otherwise."""
    if io.exists(os.path.join(dir_, STANDALONE_CLEAN_MARKER)) or io.exists(os.path.join(dir_, LOG_START_FILE)):
        return None         # a standalone writer's: refresh() reads LOG_START_FILE itself
    return checkpointed_start(io, dir_)
