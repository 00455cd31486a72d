"""The `__consumer_offsets` topic on disk, written by any process (group_coordinator.py reads
and interprets it).

Its partitions are shared-writer partitions: a process appends to one only under an exclusive
flock of the partition directory (the same lock a standalone writable Log takes, so one of those
excludes committers too), waited for up to lock_timeout seconds. A LogManager leaves these
directories out of its registry, so its `.lock` never excludes a committer. The writer opens the
partition as a managed Log (the Log takes no lock itself: the flock is ours) and keeps it between
writes while nobody else wrote: the partition's notification word (`.kstore-notify`, bumped by
every writer after every change) and that file's identity unchanged since our last change;
otherwise the stale Log is dropped without a flush (its idea of the files is not theirs) and the
partition reopened, which recovers a tail a killed writer tore. Partition directories are made
lazily, in the log dir already holding one, else the first.

Under a LogManager its failure channel (log_dir_failure.py) is shared: a partition on an offline
dir is refused before anything is written there (CoordinatorNotAvailableError, Kafka's
coordinator being unavailable), a write's I/O error takes the dir offline as any log's, and a
new partition (and the topic record) goes to the first online dir.

The partition count is fixed once the topic is written: recorded with a topic id in
`<first log dir>/.kstore-groups/offsets-topic.json`, made under a lock file so two first writers
agree; a different explicit count is refused.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time as _time
from typing import Callable, Iterator, Optional, Sequence

from kstore.config import LogConfig
from kstore.errors import (CoordinatorNotAvailableError, InvalidConfigError, KStoreError,
                           LogDirOfflineError)
from kstore.fileio import FileOps
from kstore.files import partition_dirs
from kstore.group_records import OFFSETS_TOPIC
from kstore.log import Log
from kstore.log_dir_failure import LogDirFailureChannel
from kstore.notify import NOTIFY_FILE
from kstore.topics import new_topic_id, write_partition_metadata

__all__ = ["OffsetsTopic", "CoordinatorLockTimeout", "GROUPS_DIR", "TOPIC_FILE"]

log = logging.getLogger("kstore.groups")

#: Per log dir: the offsets topic's record and groups15's per-group directories.
GROUPS_DIR = ".kstore-groups"
#: The offsets topic's partition count and topic id, fixed once written (in GROUPS_DIR).
TOPIC_FILE = "offsets-topic.json"
_TOPIC_FILE_LOCK = "offsets-topic.lock"


class CoordinatorLockTimeout(KStoreError):
    """Another writer held a `__consumer_offsets` partition for longer than lock_timeout."""


def flock_holder(path: str) -> Optional[int]:
    """The pid holding a flock on path, from /proc/locks (Linux), for error messages only."""
    try:
        ino = os.stat(path).st_ino
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(ino):
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


class _Writer:
    """One partition's write side in this coordinator: its Log kept between commits."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: Optional[Log] = None
        self.word = -1                 # the notification word after our last change
        self.notify_ino = -1


class OffsetsTopic:
    """The partitions of `__consumer_offsets` in log_dirs and their shared-writer protocol."""

    def __init__(self, log_dirs: Sequence[str], *, num_partitions: Optional[int],
                 default_partitions: int, config: LogConfig, io: FileOps, time,
                 lock_timeout: float, failures: Optional[LogDirFailureChannel] = None) -> None:
        self.log_dirs = list(log_dirs)
        self._failures = failures
        self._io = io
        self._time = time
        self._config = config
        self.lock_timeout = lock_timeout
        self._mutex = threading.Lock()          # _writers (a leaf)
        self._writers: dict[int, _Writer] = {}
        self._paths: dict[int, str] = {}
        self.closed = False
        recorded = self._read_topic_file()
        if recorded is not None:
            n = recorded["num_partitions"]
            if num_partitions is not None and num_partitions != n:
                raise InvalidConfigError(
                    f"{OFFSETS_TOPIC} has {n} partitions in {self.log_dirs} (fixed when it was "
                    f"created), not {num_partitions}")
            self._topic_id = recorded.get("topic_id")
        else:
            n = num_partitions if num_partitions is not None else default_partitions
            self._topic_id = None
        if n < 1:
            raise InvalidConfigError(f"offsets.topic.num.partitions must be >= 1, got {n}")
        self.num_partitions: int = n
        self._recorded = recorded is not None

    def partition_path(self, p: int) -> str:
        path = self._paths.get(p)
        if path is not None:
            return path
        name = f"{OFFSETS_TOPIC}-{p}"
        for d in self.log_dirs:
            cand = os.path.join(d, name)
            if self._io.exists(cand):
                self._paths[p] = cand
                return cand
        return os.path.join(self._home(), name)

    def _home(self) -> str:
        """Where a new partition and the topic record go: the first log dir, or the first
        online one under a LogManager (Kafka places a new log in a live dir only)."""
        if self._failures is not None:
            for d in self.log_dirs:
                if not self._failures.is_offline(d):
                    return d
        return self.log_dirs[0]

    def existing_partitions(self) -> list[int]:
        found = []
        for d in self.log_dirs:
            if not self._io.exists(d):
                continue
            for (topic, p), path in partition_dirs(self._io, d):
                if topic == OFFSETS_TOPIC and p not in found:
                    if p >= self.num_partitions:
                        raise InvalidConfigError(
                            f"{path} exists but {OFFSETS_TOPIC} has {self.num_partitions} "
                            f"partitions here; pass num_partitions (offsets.topic.num.partitions)")
                    self._paths.setdefault(p, path)
                    found.append(p)
        return sorted(found)

    # -- the topic record ----------------------------------------------------------------------
    def _read_topic_file(self) -> Optional[dict]:
        for d in self.log_dirs:
            path = os.path.join(d, GROUPS_DIR, TOPIC_FILE)
            if self._io.exists(path):
                try:
                    rec = json.loads(self._io.read_file(path))
                    n = rec["num_partitions"]
                    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                        raise ValueError(f"num_partitions {n!r}")
                    return rec
                except (ValueError, KeyError, TypeError) as e:
                    raise KStoreError(f"unreadable {path}: {e}") from None
        return None

    def _ensure_recorded(self) -> None:
        """Record the partition count (and a topic id) before the first write, under a lock
        file so two first writers agree; a different count recorded meanwhile is refused."""
        if self._recorded:
            return
        d = os.path.join(self._home(), GROUPS_DIR)
        self._mkdir(d)
        fd = self._wait_lock(os.path.join(d, _TOPIC_FILE_LOCK), directory=False,
                             what=f"{OFFSETS_TOPIC}'s record in {d}")
        try:
            rec = self._read_topic_file()
            if rec is None:
                rec = {"version": 0, "num_partitions": self.num_partitions,
                       "topic_id": new_topic_id()}
                self._io.write_atomic(os.path.join(d, TOPIC_FILE), json.dumps(rec).encode())
            elif rec["num_partitions"] != self.num_partitions:
                raise InvalidConfigError(
                    f"{OFFSETS_TOPIC} was created with {rec['num_partitions']} partitions in "
                    f"{self.log_dirs} meanwhile, not {self.num_partitions}")
            self._topic_id = rec.get("topic_id")
            self._recorded = True
        finally:
            self._io.unlock(fd)

    def _mkdir(self, path: str) -> None:
        """Make path (and a missing log dir above it), durably."""
        if self._io.exists(path):
            return
        parent = os.path.dirname(path)
        if parent != path and not self._io.exists(parent):
            self._mkdir(parent)
        try:
            self._io.mkdir(path)
        except FileExistsError:
            return
        self._io.fsync_dir(os.path.dirname(path))

    # -- the shared-writer protocol ------------------------------------------------------------
    def _wait_lock(self, path: str, *, directory: bool, what: str,
                   sleep: Optional[Callable[[float], None]] = None) -> int:
        """flock path exclusively, waiting up to lock_timeout (polling: 0.2 ms doubling to 20 ms).
        sleep: called for each pause instead of time.sleep; it may raise (a Consumer's wakeup)."""
        deadline = _time.monotonic() + self.lock_timeout
        pause = 0.0002
        while True:
            fd = self._io.try_lock(path, directory=directory)
            if fd is not None:
                return fd
            if _time.monotonic() >= deadline:
                pid = flock_holder(path)
                holder = f" (held by pid {pid})" if pid is not None else ""
                raise CoordinatorLockTimeout(
                    f"timed out after {self.lock_timeout} s waiting for {what}{holder}")
            (sleep or _time.sleep)(pause)
            pause = min(pause * 2, 0.02)

    @staticmethod
    def _acquire(lock: threading.Lock, sleep: Optional[Callable[[float], None]]) -> None:
        """lock.acquire(); with sleep, tried in the same pauses as the flock, so the wait for
        another thread's commit through this coordinator ends on a wakeup too."""
        if sleep is None:
            lock.acquire()
            return
        pause = 0.0002
        while not lock.acquire(blocking=False):
            sleep(pause)
            pause = min(pause * 2, 0.02)

    def _writer(self, p: int) -> _Writer:
        with self._mutex:
            w = self._writers.get(p)
            if w is None:
                w = self._writers[p] = _Writer()
            return w

    @contextlib.contextmanager
    def locked(self, p: int, *, reopen: bool = False,
               sleep: Optional[Callable[[float], None]] = None) -> Iterator[Log]:
        """The partition's writable Log, with its flock held for the block. reopen: open it
        afresh even if our kept Log is current (recovery of what a crash left, for readers that
        met it). sleep: the waits' pauses (_wait_lock). A block that raises leaves the kept Log
        to be reopened next time."""
        if self.closed:
            raise KStoreError(f"{OFFSETS_TOPIC} of {self.log_dirs} is closed")
        self.check_online(p)
        self._ensure_recorded()
        w = self._writer(p)
        self._acquire(w.lock, sleep)
        try:
            path = self.partition_path(p)
            self.check_online(p)        # it may have gone offline while we waited
            if w.log is None and not self._io.exists(path):
                self._mkdir(os.path.dirname(path))
                self._mkdir(path)
                self._paths[p] = path
            fd = self._wait_lock(path, directory=True, what=f"the writer's lock of {path}",
                                 sleep=sleep)
            try:
                if reopen:
                    w.word = -1
                kept = w.log
                lg = self._writable(p, w, path)
                if lg is not kept and self._topic_id:
                    write_partition_metadata(self._io, path, self._topic_id)
                try:
                    yield lg
                except BaseException as e:
                    w.word = -1           # a failed or partial write: never reuse that Log
                    if self._failures is not None and isinstance(e, LogDirOfflineError):
                        raise CoordinatorNotAvailableError(
                            f"The coordinator is not available: the write to {path} failed "
                            f"and took its log dir offline: {e}") from e
                    raise
                bell = lg.notifier.bell
                # bit 0 is a waiter's armed bit (a reader waiting here): only the count matters
                w.word = bell.load() | 1 if bell.shared else -1
            finally:
                self._io.unlock(fd)
        finally:
            w.lock.release()

    def check_online(self, p: int) -> None:
        """CoordinatorNotAvailableError if the partition's log dir (or, before the topic is
        recorded, the dir the record goes to: every dir is offline) is offline: nothing is
        written."""
        if self._failures is None:
            return
        path = self.partition_path(p)
        for d in dict.fromkeys([os.path.dirname(path)] + ([] if self._recorded else [self._home()])):
            why = self._failures.reason(d)
            if why is not None:
                raise CoordinatorNotAvailableError(
                    f"The coordinator is not available: {path} is in log dir {d}, which is "
                    f"offline ({why})")

    def wait_writers(self, p: int, *, sleep: Optional[Callable[[float], None]] = None) -> None:
        """Wait for the append in flight on an existing partition, if any (take its flock and
        drop it): a commit checked before a topic deletion was recorded has landed on return.
        sleep: the waits' pauses (_wait_lock)."""
        w = self._writer(p)
        self._acquire(w.lock, sleep)
        try:
            path = self.partition_path(p)
            self._io.unlock(self._wait_lock(path, directory=True, what=f"the writer's lock of {path}",
                                            sleep=sleep))
        finally:
            w.lock.release()

    def _still_ours(self, w: _Writer, path: str) -> bool:
        """Whether our kept Log still describes the partition (flock held): nobody bumped its
        notification word since our last change and the word's file is the one we mapped."""
        lg = w.log
        if lg is None or lg.closed or w.word == -1:
            return False
        bell = lg.notifier.bell
        try:
            ino = self._io.stat_path(os.path.join(path, NOTIFY_FILE)).st_ino
        except OSError:
            return False
        return bell.shared and not bell.closed and bell.load() | 1 == w.word and ino == w.notify_ino

    def _writable(self, p: int, w: _Writer, path: str) -> Log:
        """Our Log of the partition if nobody else changed it since our last write, else a
        fresh open (recovering a tail a killed writer tore)."""
        if self._still_ours(w, path):
            return w.log  # type: ignore[return-value]  # checked by _still_ours
        if w.log is not None:
            w.log.close_handlers()     # stale: its idea of the files is not theirs any more
            w.log = None
        lg = Log.open(path, self._config, clean_shutdown=False, recovery_point=0, io=self._io,
                      time=self._time)
        w.log = lg
        if (failures := self._failures) is not None:      # its I/O error fails its dir
            d = os.path.dirname(path)

            def failed(e: OSError) -> None:
                failures.mark_offline(d, e)
            lg.failure_listener = failed
        lg.attach_bell()        # the notification file mapped now (lazily made): its inode is ours
        try:
            w.notify_ino = self._io.stat_path(os.path.join(path, NOTIFY_FILE)).st_ino
        except OSError:
            w.notify_ino = -1
        return lg

    def close(self, sleep: Optional[Callable[[float], None]] = None) -> None:
        """Close every writable Log: one nobody else wrote since is closed cleanly (flushed,
        its runway trimmed) under the flock; a stale one is dropped, and so is one whose flock
        did not come (lock_timeout, or sleep raised: a closing consumer's deadline)."""
        with self._mutex:
            writers = dict(self._writers)
            self.closed = True
        for p, w in writers.items():
            with w.lock:
                lg = w.log
                if lg is None:
                    continue
                path = self.partition_path(p)
                try:
                    fd = self._wait_lock(path, directory=True, what=f"the writer's lock of {path}",
                                         sleep=sleep)
                except (OSError, KStoreError) as e:
                    log.warning("closing %s without a flush: %s", lg.dir, e)
                    lg.close_handlers()
                    w.log = None
                    continue
                try:
                    if self._still_ours(w, path):
                        lg.close()
                    else:
                        lg.close_handlers()
                finally:
                    w.log = None
                    self._io.unlock(fd)
