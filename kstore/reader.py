"""A read-only view of a store for another process (Spark tasks, command-line readers).

Partition directories are discovered by scanning the log dirs on every refresh() and opened
read-only on first use, so a reader takes no lock, writes nothing, opens only what it reads and
sees the topics, partitions and records that the owning process adds (and the segments its
retention deletes). A topic whose deletion is recorded in the topic config file is not offered.
"""
from __future__ import annotations

import os
import threading
from typing import NamedTuple, Optional, Sequence

from kstore.checkpoint import LOG_START_OFFSET_CHECKPOINT, CheckpointError, OffsetCheckpointFile
from kstore.config import LogConfig
from kstore.errors import KStoreError, KStoreStateError, UnknownTopicError
from kstore.fileio import FileOps, get_file_ops
from kstore.files import partition_dirs
from kstore.log import Log
from kstore.topics import TopicConfigFile

TopicPartition = tuple[str, int]


class LogOffsets(NamedTuple):
    """A partition's offset range: records are at [log_start_offset, log_end_offset)."""
    log_start_offset: int
    log_end_offset: int


def split_log_dirs(log_dirs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Log dirs from a comma-separated string or a sequence, made absolute."""
    if isinstance(log_dirs, (str, os.PathLike)):
        parts = [p.strip() for p in os.fspath(log_dirs).split(",")]
    else:
        parts = [os.fspath(p).strip() for p in log_dirs]
    dirs = [os.path.abspath(p) for p in parts if p]
    if not dirs:
        raise KStoreError("no log dirs given")
    return dirs


class StoreReader:
    """Read-only access to the partitions under one or more log dirs. Use as a context manager.

    Threads may share one: `_lock` (locks.py) makes a partition's first open, refresh() and
    close() one at a time, so every thread gets the same Log and none is left unclosed."""

    def __init__(self, log_dirs: str | os.PathLike | Sequence[str | os.PathLike], *,
                 io: Optional[FileOps] = None):
        self.log_dirs = split_log_dirs(log_dirs)
        self._io = io or get_file_ops()
        self._paths: dict[TopicPartition, str] = {}
        self._starts: dict[TopicPartition, int] = {}
        self._logs: dict[TopicPartition, Log] = {}
        self._lock = threading.Lock()
        self.refresh()

    def __enter__(self) -> "StoreReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def refresh(self) -> None:
        """Rescan the log dirs for partitions and re-read the log-start-offset checkpoints and
        the topic config file (the partitions of a topic being deleted are left out). A writing
        LogManager checkpoints a DeleteRecords before the call returns (a standalone writer
        saves it in the partition directory), so the next refresh (then `log(..., refresh=True)`
        or `offsets`) has its start."""
        with self._lock:
            self._rescan()

    def _rescan(self) -> None:
        """refresh() under _lock."""
        paths: dict[TopicPartition, str] = {}
        starts: dict[TopicPartition, int] = {}
        for d in self.log_dirs:
            if not self._io.exists(d):
                raise KStoreError(f"log dir {d} does not exist")
        topic_file = TopicConfigFile.read(self.log_dirs, self._io)
        deleting = set(topic_file.deleting) if topic_file is not None else set()
        for d in self.log_dirs:
            for tp, path in partition_dirs(self._io, d):
                if tp[0] in deleting:
                    continue
                if tp in paths:
                    raise KStoreStateError(
                        f"Duplicate log directories for {tp[0]}-{tp[1]} are found in both "
                        f"{os.path.dirname(paths[tp])} and {d}. Recover or delete one of them.")
                paths[tp] = path
            try:
                starts.update(OffsetCheckpointFile(os.path.join(d, LOG_START_OFFSET_CHECKPOINT),
                                                   self._io).read())
            except (CheckpointError, OSError):
                pass          # the segments' own base offsets still bound the start
        # a topic deleted and re-created under the same path is a new log, never the old one's
        # state (its log start): a log whose last listing was of another directory (device,
        # inode) is dropped; one that already followed the new directory (its refresh found
        # it: Log.incarnation) is kept, so readers that saw that happen do not see it again
        for tp in list(self._logs):
            now_at = paths.get(tp)
            if now_at != self._logs[tp].dir or self._ident(now_at) != self._logs[tp].dir_identity:
                self._logs.pop(tp).close_handlers()
        self._paths = paths
        self._starts = starts

    def _ident(self, path: Optional[str]) -> Optional[tuple[int, int]]:
        """(device, inode) of a partition directory, None if it is gone."""
        if path is None:
            return None
        try:
            st = self._io.stat_path(path)
        except FileNotFoundError:
            return None
        return st.st_dev, st.st_ino

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self._paths})

    def partitions(self, topic: Optional[str] = None) -> list[TopicPartition]:
        """Every (topic, partition), or one topic's, sorted."""
        return sorted(tp for tp in self._paths if topic is None or tp[0] == topic)

    def log(self, topic: str, partition: int, *, refresh: bool = False) -> Log:
        """The partition's log, opened read-only on first use; refresh=True picks up what the
        writer appended (or deleted) since."""
        tp = (topic, partition)
        lg = self._logs.get(tp)
        if lg is None:
            with self._lock:
                lg = self._logs.get(tp)      # another thread may have opened it meanwhile
                if lg is None:
                    lg = self._open(tp)
        elif refresh:
            lg.refresh(self._starts.get(tp))
        return lg

    def _open(self, tp: TopicPartition) -> Log:
        """Open tp's log read-only and keep it (_lock held)."""
        path = self._paths.get(tp)
        if path is None:
            raise UnknownTopicError(f"unknown topic partition {tp[0]}-{tp[1]} in {self.log_dirs}")
        self._io.check_dir(path)     # a symlinked partition dir would lead outside the store
        lg = Log.open(path, LogConfig(), read_only=True, log_start_offset=self._starts.get(tp),
                      io=self._io)
        self._logs[tp] = lg
        return lg

    def offsets(self, topic: str, partition: int, *, refresh: bool = True) -> LogOffsets:
        """(log start offset, log end offset)."""
        lg = self.log(topic, partition, refresh=refresh)
        return LogOffsets(lg.log_start_offset, lg.log_end_offset)

    def close(self) -> None:
        with self._lock:
            for lg in self._logs.values():
                lg.close_handlers()
            self._logs.clear()
