"""The owner of every log in a process (Kafka's LogManager).

Log dirs and their locks, topics and partitions, startup (clean-shutdown marker, checkpoints,
parallel recovery), the scheduled tasks (retention, flush, checkpoints, delayed deletion),
producer-style appends with Kafka's default partitioner, and taking a log dir offline on I/O errors.
"""
from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Optional, Sequence

from kstore.broker_config import BrokerConfig
from kstore.checkpoint import (LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                               OffsetCheckpointFile)
from kstore.clock import SYSTEM_TIME
from kstore.config import LogConfig
from kstore.errors import (InvalidConfigError, InvalidTopicError, KStoreError, KStoreStateError,
                           LogDirLockedError, LogDirOfflineError, PartitionLoadError,
                           TopicExistsError, UnknownTopicError, UnusableFileError)
from kstore.fileio import FileOps, get_file_ops
from kstore.files import delete_dir_name, partition_dirs
from kstore.log import LOG_DIR_LOCK, Log
from kstore.log_dir_failure import PARTITION_ERRNOS, LogDirFailureChannel
from kstore.log_dir_loader import CLEAN_SHUTDOWN_FILE, FailedPartition, LogDirLoader
from kstore.partitioner import partition_for_key
from kstore.properties import load_properties
from kstore.scheduler import Scheduler
from kstore.topics import TopicConfigs, topics_collide, validate_topic_name, write_partition_metadata

log = logging.getLogger("kstore.manager")

# Lock hierarchy (every lock in kstore). A thread holding a lock may take only locks listed
# below it, never one above; leaves take nothing. Readers (Log.read, StoreReader) take none.
#
#   Cleaner.lock                  one clean at a time per OffsetMap (cleaner thread vs clean_now)
#   LogCleaner._lock (= _done)    in-progress set; grab computes cleanable ranges under it
#   checkpoint_lock(path)         one per checkpoint file: snapshot + atomic write (checkpoint.py);
#                                 never taken under LogManager._lock (delete_topic writes after)
#   LogManager._lock              registry changes (create/delete/add/alter topics), offline dirs;
#                                 appends and the scheduled tasks read the registry without it
#   Log._flush_lock               one flush of a log at a time; its fsyncs run under this only
#   Log._lock                     the append lock: in-memory state, the segment list, the bytes
#                                 of an append. No fsync/msync waits and no scheduler hand-off
#                                 under it: flushes, a roll's flush (or its scheduling), the
#                                 retention dir fsync and delayed unlinks run after it is released
#                                 (Log._after_write). Exceptions: close(), the trim fsync of a roll
#                                 of a fully flushed log, truncate_fully_and_start_at's and the
#                                 cleaner swap's first directory fsync
#   LogSegment._lock              a segment's mapping and descriptors (its flush fsyncs under it)
#   AbstractIndex._lock           an index's mapping, entries and length
#   leaves: Scheduler._cv (tasks run without it), Throttler._lock, progress bars' lock,
#           the checkpoint-lock registry guard
#
# Order that matters most: _flush_lock before Log._lock (a flush holds the first while waiting
# for the second, so nothing under Log._lock may flush); LogManager._lock before Log._lock
# (delete_topic closes logs under it, so Log code never calls into the manager).

LOCK_FILE = LOG_DIR_LOCK
DELETE_DIR_SUFFIX = "-delete"


class RecordMetadata(NamedTuple):
    """Where a producer-style append landed."""
    topic: str
    partition: int
    offset: int
    timestamp: int


def _is_fs_nfs(path: str) -> bool:
    try:
        with open("/proc/mounts") as f:
            mounts = [line.split()[:3] for line in f]
    except OSError:
        return False
    path = os.path.realpath(path)
    best, fstype = "", ""
    for m in mounts:
        if len(m) == 3 and (path == m[1] or path.startswith(m[1].rstrip("/") + "/")) and len(m[1]) > len(best):
            best, fstype = m[1], m[2]
    return fstype.startswith("nfs")


class LogManager:
    """Durable multi-topic storage over one or more log dirs (Kafka's `log.dirs`).

    Use as a context manager. `config` takes Kafka broker keys (and topic-level defaults through
    their broker synonyms). `read_only=True` takes no lock and writes nothing, so it can read
    beside a process that appends.
    """

    def __init__(self, log_dirs: str | os.PathLike | Sequence[str | os.PathLike] | None = None,
                 config: Optional[Mapping[str, Any]] = None, *, read_only: bool = False,
                 time=None, scheduler=None, io: Optional[FileOps] = None,
                 progress: Optional[Callable[[int, int], None]] = None):
        self._cfg = BrokerConfig(config)
        self._progress = progress          # called (partitions loaded, total) during startup
        self._loaded_count = 0
        self._load_total = 0
        if log_dirs is None:
            dirs = self._cfg.log_dirs
        elif isinstance(log_dirs, (str, os.PathLike)):
            dirs = [os.fspath(log_dirs)]
        else:
            dirs = [os.fspath(d) for d in log_dirs]
        if not dirs:
            raise InvalidConfigError("log.dirs is empty")
        seen = {}
        for d in dirs:
            canon = os.path.realpath(d)
            if canon in seen:
                raise InvalidConfigError(f"Duplicate log directory found: {seen[canon]}, {d}")
            seen[canon] = d
        self.log_dirs = [os.path.abspath(d) for d in dirs]
        self.read_only = read_only
        self._time = time or SYSTEM_TIME
        self._io = io or get_file_ops()
        self._lock = threading.RLock()
        # the topic registry: replaced whole under _lock (_publish), never changed in place, so
        # appends, the scheduled tasks and the cleaner read it without a lock
        self._logs: dict[tuple[str, int], Log] = {}
        self._dir_of: dict[tuple[str, int], str] = {}
        self._parts: dict[str, tuple[int, ...]] = {}
        self._failures = LogDirFailureChannel()
        # bound once: the append methods call it on every append
        self._guard = self._failures.guard
        self._topics = TopicConfigs(self.log_dirs, self._failures, self._io)
        self._failed: dict[tuple[str, int], FailedPartition] = {}   # isolated at start-up
        self._locks: dict[str, int] = {}
        self._loaded_clean: dict[str, bool] = {}
        self._logs_to_delete: deque[tuple[str, int]] = deque()
        self._rr = itertools.count()
        self.checkpoint_errors: list[str] = []
        self._closed = False
        self._own_scheduler = scheduler is None and not read_only
        self._scheduler = scheduler if scheduler is not None else (
            None if read_only else Scheduler(self._cfg["background.threads"], self._time))
        self._loader = LogDirLoader(self._cfg, self._topics, read_only=read_only, io=self._io,
                                    time=self._time, scheduler=self._scheduler,
                                    on_loaded=self._loaded_one if progress is not None else None)
        self.cleaner = None
        try:
            self._startup()
        except BaseException:
            for lg in self._logs.values():       # a start that failed keeps nothing mapped
                lg.close_handlers()
            self._release_locks()
            if self._own_scheduler and self._scheduler is not None:
                self._scheduler.shutdown()
            raise

    @classmethod
    def from_properties(cls, path: str | os.PathLike, **overrides) -> "LogManager":
        """A LogManager configured by a Java-properties server.properties file.

        Keyword overrides use underscores for dots (log_dirs=..., read_only=True passes through).
        """
        props = load_properties(os.fspath(path))
        kw = {}
        for k in ("read_only", "time", "scheduler", "io"):
            if k in overrides:
                kw[k] = overrides.pop(k)
        for k, v in overrides.items():
            props[k.replace("_", ".")] = v if not isinstance(v, (list, tuple)) else ",".join(map(str, v))
        return cls(None, props, **kw)

    # -- startup -----------------------------------------------------------------------------
    def _startup(self) -> None:
        for d in self.log_dirs:
            try:
                if not self._io.exists(d):
                    if self.read_only:
                        raise KStoreError(f"log dir {d} does not exist (read-only manager)")
                    os.makedirs(os.path.dirname(d), exist_ok=True)
                    self._io.mkdir(d)
                    self._io.fsync_dir(os.path.dirname(d))
                elif not os.path.isdir(d):
                    raise UnusableFileError(d, "a log dir that is not a directory")
                if _is_fs_nfs(d):
                    log.warning("log dir %s is on NFS: its lock is not reliable; use a local filesystem", d)
                if not self.read_only:
                    self._acquire_lock(d)
            except LogDirLockedError:
                raise
            except (OSError, UnusableFileError) as e:
                self._failures.mark_offline(d, e, quiet=True)
        self._check_some_dir_online()      # if none is left, the error says why: no log lines
        for d, why in self._failures.offline_dirs.items():
            log.error("log dir %s is offline: %s", d, why)
        self._topics.load()
        self._finish_deletions()
        self._check_some_dir_online()
        live = [d for d in self.log_dirs if not self._failures.is_offline(d)]
        if self._progress is not None:
            self._load_total = sum(len(self._scan(d)) for d in live)
        with ThreadPoolExecutor(max_workers=len(live)) as pool:
            list(pool.map(self._load_dir, live))
        self._check_some_dir_online()
        if not self.read_only:
            self._schedule_tasks()
            c = self._cfg
            if c["log.cleaner.enable"]:
                from kstore.cleaner import LogCleaner
                self.cleaner = LogCleaner(self, c["log.cleaner.threads"], c["log.cleaner.dedupe.buffer.size"],
                                          c["log.cleaner.io.buffer.load.factor"],
                                          c["log.cleaner.io.max.bytes.per.second"], c["log.cleaner.backoff.ms"],
                                          self._time, self._io)
                if self._own_scheduler:
                    self.cleaner.start()

    def _check_some_dir_online(self) -> None:
        """Start-up fails, with every dir's reason, when no log dir is left online."""
        if self._failures.all_offline(self.log_dirs):
            raise LogDirOfflineError("every log dir is offline: " +
                                     self._failures.summary())

    def _scan(self, d: str) -> list:
        """LogDirLoader.partitions(d); [] if d is offline."""
        try:
            return self._loader.partitions(d)
        except (OSError, UnusableFileError) as e:
            self._failures.mark_offline(d, e)
            return []

    def _finish_deletions(self) -> None:
        """Complete the topic deletions a crash cut short (delete_topic records the intent in
        the topic config before its first rename): rename every partition left of those topics
        to its `-delete` name, then drop the record. A dir that is offline keeps it pending."""
        if not self._topics.deleting or self.read_only:
            return
        done = True
        for d in self.log_dirs:
            if self._failures.is_offline(d):
                done = False
                continue
            try:
                moved = False
                for (topic, p), path in partition_dirs(self._io, d):
                    if self._topics.is_deleting(topic):
                        self._io.rename(path, os.path.join(d, delete_dir_name(topic, p)))
                        moved = True
                if moved:
                    self._io.fsync_dir(d)
            except (OSError, UnusableFileError) as e:
                self._failures.mark_offline(d, e)
                done = False
        if done:
            deleting = list(self._topics.deleting)
            log.info("finished the deletion of topic(s) %s cut short before", deleting)
            self._topics.finish_deletions(deleting)

    def _acquire_lock(self, d: str) -> None:
        # exclusive: also excludes standalone writable Log.opens of its partitions, which hold
        # it shared (kstore.log.LOG_DIR_LOCK)
        fd = self._io.try_lock(os.path.join(d, LOCK_FILE))
        if fd is None:
            raise LogDirLockedError(
                f"Failed to acquire lock on file .lock in {d}. A Kafka instance (or a writable "
                f"kstore Log of one of its partitions) in another process or thread is using "
                f"this directory.")
        self._locks[d] = fd

    def _release_locks(self) -> None:
        # the .lock file itself stays: unlinking it would let a waiter and a newcomer both
        # "hold" the lock (KAFKA-6647)
        for d, fd in list(self._locks.items()):
            try:
                self._io.unlock(fd)
            except OSError:
                pass
            del self._locks[d]

    def _load_dir(self, d: str) -> None:
        res = self._loader.load(d)
        self.checkpoint_errors.extend(res.checkpoint_errors)
        self._logs_to_delete.extend(res.to_delete)
        if res.error is not None:
            self._failures.mark_offline(d, res.error)
            return
        with self._lock:
            logs, dir_of = dict(self._logs), dict(self._dir_of)
            for tp, lg in res.logs:
                if tp in logs:
                    lg.close_handlers()
                    raise KStoreStateError(
                        f"Duplicate log directories for {tp[0]}-{tp[1]} are found in both "
                        f"{dir_of[tp]} and {d}. Recover or delete one of them.")
                logs[tp] = lg
                dir_of[tp] = d
            self._failed.update(res.failed)
            self._publish(logs, dir_of)
        # a partition left unrecovered must be recovered next time: no clean marker then
        self._loaded_clean[d] = res.clean or not res.failed

    def _loaded_one(self) -> None:
        with self._lock:
            self._loaded_count += 1
            self._progress(self._loaded_count, self._load_total)

    def _schedule_tasks(self) -> None:
        c, s = self._cfg, self._scheduler
        delay = c["log.initial.task.delay.ms"]
        s.schedule("kafka-log-retention", self._task(self.cleanup_logs), delay, c["log.retention.check.interval.ms"])
        flush_iv = c["log.flush.scheduler.interval.ms"]
        if flush_iv < (1 << 62):
            s.schedule("kafka-log-flusher", self._task(self.flush_dirty_logs), delay, flush_iv)
        s.schedule("kafka-recovery-point-checkpoint", self._task(self.checkpoint_recovery_offsets), delay,
                   max(1, c["log.flush.offset.checkpoint.interval.ms"]))
        s.schedule("kafka-log-start-offset-checkpoint", self._task(self.checkpoint_log_start_offsets), delay,
                   max(1, c["log.flush.start.offset.checkpoint.interval.ms"]))
        s.schedule("kafka-delete-logs", self._task(self.delete_logs), delay, 1000)

    def _task(self, fn):
        def run():
            if not self._closed:
                fn()
        return run

    # -- offline handling ----------------------------------------------------------------------
    @property
    def log_dir_failure_channel(self) -> LogDirFailureChannel:
        """Where anyone working on this store's dirs (the cleaner included) reports a dir that
        failed, checks one, or runs work that must take its dir offline on an I/O error."""
        return self._failures

    @property
    def offline_dirs(self) -> dict[str, str]:
        """Log dirs taken offline, with the error that did it."""
        return self._failures.offline_dirs

    # -- topics --------------------------------------------------------------------------------
    @property
    def failed_partitions(self) -> dict[tuple[str, int], str]:
        """Partitions that failed to load at start-up, with the reason (their log dir stays
        online; each is left untouched on disk and raises PartitionLoadError when used)."""
        with self._lock:
            return {tp: f"{f.path}: {f.why}" for tp, f in self._failed.items()}

    def _publish(self, logs: dict, dir_of: dict) -> None:
        """Install new registry dicts (_lock held); readers may hold the old ones, so the
        published dicts are never changed again. _dir_of goes first: a partition readers find
        in _logs always has its dir. A topic's partitions include the ones isolated at start-up
        (failed_partitions): they exist, they just cannot be used."""
        parts: dict[str, list[int]] = {}
        for t, p in sorted(set(logs) | set(self._failed)):
            parts.setdefault(t, []).append(p)
        self._dir_of = dir_of
        self._logs = logs
        self._parts = {t: tuple(ps) for t, ps in parts.items()}

    def topics(self) -> list[str]:
        return sorted(self._parts)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions in this store, failed ones included (there may be holes: a
        broker's log dirs hold only some partitions of a topic)."""
        parts = self._parts.get(topic)
        if not parts:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        return list(parts)

    def log(self, topic: str, partition: int) -> Log:
        try:
            return self._logs[(topic, partition)]
        except KeyError:
            pass
        self._raise_missing(topic, partition)

    def _raise_missing(self, topic: str, partition: int):
        """The error for a partition that is not loaded: failed at start-up, or not here."""
        f = self._failed.get((topic, partition))
        if f is not None:
            raise PartitionLoadError(f"partition {topic}-{partition} failed to load at start-up "
                                     f"and is isolated: {f.path}: {f.why}")
        try:
            parts = self.partitions(topic)
        except UnknownTopicError:
            raise UnknownTopicError(f"unknown topic partition {topic}-{partition}") from None
        raise UnknownTopicError(f"partition {partition} of topic {topic!r} is not in this store "
                                f"(its log dirs hold partitions {parts})")

    def logs(self) -> dict[tuple[str, int], Log]:
        return dict(self._logs)

    def log_dir_of(self, topic: str, partition: int) -> str:
        try:
            return self._dir_of[(topic, partition)]
        except KeyError:
            pass
        self._raise_missing(topic, partition)

    def topic_config(self, topic: str) -> LogConfig:
        self.partitions(topic)
        return self._cfg.log_config(self._topics.overrides(topic))

    def _check_writable(self) -> None:
        if self._closed:
            raise KStoreStateError("LogManager is closed")
        if self.read_only:
            raise KStoreStateError("LogManager is read-only")

    def create_topic(self, name: str, partitions: Optional[int] = None,
                     config: Optional[Mapping[str, Any]] = None) -> None:
        """Create `name` with `partitions` partitions (default num.partitions) and overrides."""
        self._check_writable()
        validate_topic_name(name)
        partitions = self._cfg["num.partitions"] if partitions is None else partitions
        if not isinstance(partitions, int) or partitions < 1:
            raise InvalidTopicError(f"Number of partitions must be at least 1, got {partitions!r}")
        overrides = dict(config or {})
        cfg = self._cfg.log_config(overrides)          # validates
        with self._lock:
            if name in self._parts:
                raise TopicExistsError(f"Topic '{name}' already exists.")
            if self._topics.is_deleting(name):
                raise TopicExistsError(f"Topic '{name}' is marked for deletion.")
            if any(topics_collide(name, t) for t in self._parts):
                raise InvalidTopicError(f"Topic '{name}' collides with an existing topic ('.' and '_' are equivalent)")
            self._topics.add_topic(name, cfg.overrides)
            self._topics.persist()
            self._create_partitions(name, range(partitions), cfg)

    def _create_partitions(self, topic: str, partitions: Iterable[int], cfg: LogConfig) -> None:
        """Create partitions (_lock held) and publish them together, so that no appender sees
        the topic with fewer partitions than it is created with (keys would go astray)."""
        logs, dir_of = dict(self._logs), dict(self._dir_of)
        try:
            for p in partitions:
                self._create_partition(topic, p, cfg, logs, dir_of)
        finally:
            self._publish(logs, dir_of)

    def _least_loaded_dirs(self, dir_of: dict) -> list[str]:
        counts = {d: 0 for d in self.log_dirs if not self._failures.is_offline(d)}
        for d in dir_of.values():
            if d in counts:
                counts[d] += 1
        return sorted(counts, key=lambda d: (counts[d], self.log_dirs.index(d)))

    def _create_partition(self, topic: str, partition: int, cfg: LogConfig, logs: dict,
                          dir_of: dict) -> Log:
        last_error = None
        for d in self._least_loaded_dirs(dir_of):
            path = os.path.join(d, f"{topic}-{partition}")
            try:
                lg = Log.open(path, cfg, recovery_point=0, clean_shutdown=True, io=self._io,
                              time=self._time, scheduler=self._scheduler)
                write_partition_metadata(self._io, path, self._topics.topic_id(topic))
            except OSError as e:
                self._failures.mark_offline(d, e)
                last_error = e
                continue
            logs[(topic, partition)] = lg
            dir_of[(topic, partition)] = d
            return lg
        why = last_error if last_error is not None else \
            "every log dir is offline: " + self._failures.summary()
        raise LogDirOfflineError(f"no log dir could take {topic}-{partition}: {why}")

    def add_partitions(self, name: str, count: int) -> list[int]:
        """Grow `name` to `count` partitions in total (Kafka's createPartitions); returns the new ones."""
        self._check_writable()
        with self._lock:
            have = self.partitions(name)[-1] + 1       # with holes: the highest + 1
            if count <= have:
                raise InvalidTopicError(
                    f"Topic currently has {have} partitions, which is higher than or equal "
                    f"to the requested {count}.")
            cfg = self.topic_config(name)
            new = list(range(have, count))
            self._create_partitions(name, new, cfg)
            return new

    def alter_topic_config(self, name: str, config: Mapping[str, Any]) -> LogConfig:
        """Set overrides (a value of None removes one); applied to every partition now and kept."""
        self._check_writable()
        with self._lock:
            self.partitions(name)
            overrides = dict(self._topics.overrides(name) or {})
            for k, v in config.items():
                if v is None:
                    overrides.pop(k, None)
                else:
                    overrides[k] = v
            cfg = self._cfg.log_config(overrides)
            self._topics.set_overrides(name, cfg.overrides)
            self._topics.persist()
            for (t, _p), lg in self._logs.items():
                if t == name:
                    lg.update_config(cfg)
            return cfg

    def delete_topic(self, name: str) -> None:
        """Rename every partition dir to Kafka's `-delete` name; removed after file.delete.delay.ms.

        Crash-atomic: the intent is first recorded durably in the topic config of every log dir
        ("deleting"); a crash after that is finished by the next start-up before anything loads,
        so the topic comes back whole or not at all."""
        self._check_writable()
        with self._lock:
            parts = self.partitions(name)
            self._topics.record_deletion(name)
            if self._failures.all_offline(self.log_dirs):
                raise LogDirOfflineError(f"could not record the deletion of {name}: every log dir "
                                         f"is offline: {self._failures.offline_dirs}")
            # unpublished first: appenders get UnknownTopicError, not a half-deleted topic
            logs, dir_of = dict(self._logs), dict(self._dir_of)
            gone = []
            for p in parts:
                tp = (name, p)
                lg = logs.pop(tp, None)
                if lg is not None:
                    gone.append((p, lg, dir_of.pop(tp), lg.dir))
                else:
                    f = self._failed.pop(tp)      # isolated: its dir goes all the same
                    gone.append((p, None, f.dir, f.path))
            self._publish(logs, dir_of)
            touched = set()
            for p, lg, d, path in gone:
                if lg is not None:
                    lg.close_handlers()
                if self._failures.is_offline(d):
                    continue               # finished by the start-up that finds it online
                target = os.path.join(d, delete_dir_name(name, p))
                try:
                    self._io.rename(path, target)
                    touched.add(d)
                except OSError as e:
                    self._failures.mark_offline(d, e)
                    raise LogDirOfflineError(f"could not delete {name}-{p}: {e}") from e
                self._logs_to_delete.append((target, self._time.milliseconds()))
            for d in sorted(touched):
                try:
                    self._io.fsync_dir(d)
                except OSError as e:
                    self._failures.mark_offline(d, e)
                    raise LogDirOfflineError(f"could not delete {name}: {e}") from e
            if not self._failures.offline_dirs:
                self._topics.finish_deletions([name])
        # outside _lock: a checkpoint's lock is taken before _lock (see the lock hierarchy)
        self.checkpoint_recovery_offsets()
        self.checkpoint_log_start_offsets()

    # -- appends and reads ---------------------------------------------------------------------
    def append(self, topic: str, key: Optional[bytes], value: Optional[bytes], *,
               partition: Optional[int] = None, timestamp: Optional[int] = None,
               headers: Optional[Iterable] = None) -> RecordMetadata:
        """Append one record, choosing the partition as Kafka's default partitioner does:
        murmur2 of the key when there is one, round robin otherwise."""
        self._check_writable()
        parts = self._ensure_partitions(topic)
        n = parts[-1] + 1
        if partition is None:
            if key is not None:
                partition = partition_for_key(bytes(key), n)
            elif len(parts) == n and not self._failed:
                partition = next(self._rr) % n
            else:       # holes or isolated partitions: round robin over those that work
                here = [p for p in parts if (topic, p) in self._logs] or parts
                partition = here[next(self._rr) % len(here)]
        elif not 0 <= partition < n:
            raise UnknownTopicError(f"partition {partition} of {topic!r} does not exist ({n} partitions)")
        lg, d = self._log_and_dir(topic, partition)
        info = self._guard(d, lg.append, [(key, value, timestamp, headers)])
        ts = info.log_append_time if info.log_append_time >= 0 else info.max_timestamp
        return RecordMetadata(topic, partition, info.first_offset, ts)

    def append_batch(self, topic: str, partition: int, records: Iterable):
        """Append records to one partition as one batch (what a producer sends): (key, value[,
        timestamp[, headers]]) tuples. Returns the batch's AppendInfo (offsets, timestamps)."""
        self._check_writable()
        n = self.ensure_topic(topic)
        if not 0 <= partition < n:
            raise UnknownTopicError(f"partition {partition} of {topic!r} does not exist ({n} partitions)")
        lg, d = self._log_and_dir(topic, partition)
        return self._guard(d, lg.append, records)

    def append_columns(self, topic: str, partition: int, cols, start: int = 0,
                       stop: Optional[int] = None, *, batch_bytes: int = 1 << 20) -> tuple[int, int]:
        """Append rows of columnar input (a _core.ColumnInput) to one partition in batches of
        about batch_bytes (Log.append_columns). Returns (first offset, record count)."""
        self._check_writable()
        n = self.ensure_topic(topic)
        if not 0 <= partition < n:
            raise UnknownTopicError(f"partition {partition} of {topic!r} does not exist ({n} partitions)")
        lg, d = self._log_and_dir(topic, partition)
        return self._guard(d, lg.append_columns, cols, start, stop, batch_bytes=batch_bytes)

    def _log_and_dir(self, topic: str, partition: int) -> tuple[Log, str]:
        """The partition's log and log dir, from the lock-free registry; a kstore error naming
        what is missing if it is not loaded (failed at start-up, not in this store, or deleted
        since the caller looked it up)."""
        tp = (topic, partition)
        try:
            return self._logs[tp], self._dir_of[tp]
        except KeyError:
            pass
        self._raise_missing(topic, partition)

    def ensure_topic(self, topic: str) -> int:
        """The topic's partition count, creating it first (num.partitions) when it is missing and
        auto.create.topics.enable is on, as a broker does for a producer. With holes (a broker's
        dirs hold some partitions only) it is the highest partition + 1, so keys map as Kafka's."""
        return self._ensure_partitions(topic)[-1] + 1

    def _ensure_partitions(self, topic: str) -> tuple[int, ...]:
        """The topic's partitions (lock-free), auto-creating the topic first as ensure_topic does."""
        parts = self._parts.get(topic)
        if parts is None:
            if not self._cfg["auto.create.topics.enable"]:
                raise UnknownTopicError(f"unknown topic {topic!r} (auto.create.topics.enable=false)")
            with self._lock:
                if topic not in self._parts:
                    self.create_topic(topic)
                parts = self._parts[topic]
        return parts

    def read(self, topic: str, partition: int, offset: int, max_records: Optional[int] = None,
             max_bytes: int = 1 << 20):
        return self.log(topic, partition).read(offset, max_records, max_bytes)

    # -- compaction ----------------------------------------------------------------------------
    def clean_now(self):
        """Run one cleaner pass now over every eligible compacted log; returns a list of
        CleanerStats (bytes read and written, records removed, duration)."""
        self._check_writable()
        if self.cleaner is None:
            raise KStoreStateError("the log cleaner is disabled (log.cleaner.enable=false)")
        return self.cleaner.run_pass()

    def uncleanable_partitions(self) -> dict[tuple[str, int], str]:
        """Partitions whose cleaning failed, with the error (cleaning skips them)."""
        return dict(self.cleaner.uncleanable) if self.cleaner else {}

    # -- scheduled tasks (also public) -----------------------------------------------------------
    def _each_log(self):
        # the published registry, lock-free: a slow create_topic never holds up the tasks
        dir_of, logs = self._dir_of, self._logs
        items = [(tp, lg, dir_of.get(tp)) for tp, lg in logs.items()]
        return [(tp, lg, d) for tp, lg, d in items
                if d is not None and not self._failures.is_offline(d) and not lg.closed]

    def cleanup_logs(self) -> int:
        """Retention for non-compacted logs (compacted ones belong to the cleaner); returns the
        number of segments deleted."""
        total = 0
        failed = []
        for _tp, lg, d in self._each_log():
            if lg.config.compact:
                continue
            try:
                total += self._guard(d, lg.delete_old_segments)
            except LogDirOfflineError as e:
                failed.append(str(e))      # the other dirs go on; the caller hears of it below
            except KStoreStateError:
                continue        # closed by a concurrent delete_topic
        if failed:
            raise LogDirOfflineError("retention failed: " + "; ".join(failed))
        return total

    def flush_dirty_logs(self) -> None:
        """Flush every log whose last flush is at least flush.ms ago."""
        now = self._time.milliseconds()
        for _tp, lg, d in self._each_log():
            if now - lg.last_flush_time >= lg.config.flush_ms:
                try:
                    self._guard(d, lg.flush)
                except (LogDirOfflineError, KStoreStateError):
                    continue

    def checkpoint_recovery_offsets(self) -> None:
        self._checkpoint(RECOVERY_POINT_CHECKPOINT, lambda lg: lg.recovery_point)

    def checkpoint_log_start_offsets(self) -> None:
        def start(lg):
            segs = lg.segments
            return lg.log_start_offset if segs and lg.log_start_offset > segs[0].base_offset else None
        self._checkpoint(LOG_START_OFFSET_CHECKPOINT, start)

    def _checkpoint(self, name: str, value) -> None:
        if self.read_only:
            return
        failed = []
        for d in self.log_dirs:
            if self._failures.is_offline(d):
                continue
            cp = OffsetCheckpointFile(os.path.join(d, name), self._io)
            # snapshot and write under the file's lock: two writers (the periodic task and
            # delete_topic, say) land in the order they took their snapshots
            with cp.lock:
                dir_of, logs = self._dir_of, self._logs
                entries = {}
                for tp, lg in logs.items():
                    if dir_of.get(tp) == d:
                        v = value(lg)
                        if v is not None:
                            entries[tp] = v
                for tp, f in list(self._failed.items()):
                    kept = f.checkpointed(name)
                    if f.dir == d and kept is not None:
                        entries[tp] = kept               # isolated: kept as it was read
                try:
                    cp.write(entries)
                except OSError as e:
                    self._failures.mark_offline(d, e)
                    failed.append(f"{d}: {e}")
        if failed and not self._closed:
            raise LogDirOfflineError(f"could not write {name}; log dir(s) now offline: " + "; ".join(failed))

    def delete_logs(self) -> int:
        """Remove `-delete` dirs queued at least file.delete.delay.ms ago; returns how many."""
        delay = self._cfg.log_config().file_delete_delay_ms
        now = self._time.milliseconds()
        n = 0
        while self._logs_to_delete and self._logs_to_delete[0][1] + delay <= now:
            path, _ = self._logs_to_delete.popleft()
            try:
                self._io.check_dir(path)         # never follow a symlink out of the log dir
                for name in self._io.listdir(path):
                    self._io.unlink(os.path.join(path, name))
                self._io.rmdir(path)
                self._io.fsync_dir(os.path.dirname(path))
                n += 1
            except FileNotFoundError:
                n += 1
            except UnusableFileError as e:
                log.error("not removing deleted partition %s: %s", path, e)
            except OSError as e:
                if e.errno in PARTITION_ERRNOS:     # e.g. a directory inside: not a disk fault
                    log.error("could not remove deleted partition %s: %s", path, e)
                else:
                    self._failures.mark_offline(os.path.dirname(path), e)
        return n

    # -- shutdown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close every log, write both checkpoints, then the clean-shutdown marker of
        each dir that started clean or finished loading, and release the locks."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.cleaner is not None:
                self.cleaner.shutdown()
            if self._own_scheduler and self._scheduler is not None:
                self._scheduler.shutdown()
            if self.read_only:
                for lg in self._logs.values():
                    lg.close_handlers()
                return
            dirs_ok = {d for d in self.log_dirs if not self._failures.is_offline(d)}
            for tp, lg in list(self._logs.items()):
                d = self._dir_of.get(tp)
                if d is None:
                    continue       # unpublished by a delete_topic in flight, which closes it
                try:
                    if self._failures.is_offline(d):
                        lg.close_handlers()
                    else:
                        lg.close()
                except OSError as e:
                    self._failures.mark_offline(d, e)
                    lg.close_handlers()
            self.checkpoint_recovery_offsets()
            self.checkpoint_log_start_offsets()
            for d in dirs_ok:
                if self._failures.is_offline(d) or not self._loaded_clean.get(d):
                    continue
                try:
                    self._io.write_atomic(os.path.join(d, CLEAN_SHUTDOWN_FILE),
                                          json.dumps({"version": 0, "brokerEpoch": 0}).encode())
                except OSError as e:
                    self._failures.mark_offline(d, e)
        finally:
            self._closed = True
            self._release_locks()
        failed = {d: e for d, e in self._failures.offline_dirs.items() if d in dirs_ok}
        if failed:
            # the store is closed and unlocked, but not cleanly: say so (the next open recovers)
            raise LogDirOfflineError("log dir(s) went offline while closing: " +
                                     "; ".join(f"{d}: {e}" for d, e in failed.items()))

    def __enter__(self) -> "LogManager":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LogManager({self.log_dirs!r}, topics={len(self.topics())}, read_only={self.read_only})"
