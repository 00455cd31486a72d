"""The owner of every log in a process (Kafka's LogManager).

Log dirs and their locks, start-up (each dir loaded by log_dir_loader.py), the published
registry of logs (log_registry.py), the scheduled tasks (retention, flush, checkpoints, delayed
deletion), clean shutdown and read-only mode. Topic operations (topic_admin.py), appends by topic
(producer.py) and offline dirs (log_dir_failure.py) are its collaborators; this class wires them
and keeps the public API.

Nothing it holds refers back to it strongly: its scheduled tasks call it through
scheduler.weak_task (a no-op once it is closed or gone), the cleaner keeps a weakref.proxy, the
producer a WeakMethod of _create, and Scheduler.shutdown drops its queue, so a closed
manager, Log or StoreReader is freed by reference counting alone.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence

from kstore.broker_config import BrokerConfig
from kstore.checkpoint import LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT, OffsetCheckpointFile
from kstore.clock import SYSTEM_TIME
from kstore.config import NO_LIMIT, LogConfig
from kstore.errors import (InvalidConfigError, InvalidTopicError, KStoreError, KStoreStateError,
                           LogDirLockedError, LogDirOfflineError, UnusableFileError)
from kstore.fileio import FileOps, get_file_ops
from kstore.files import OFFSETS_TOPIC
from kstore.local_log import LOG_DIR_LOCK
from kstore.log import Log
from kstore.log_deleter import delete_due
from kstore.log_dir_failure import LogDirFailureChannel
from kstore.log_dir_loader import CLEAN_SHUTDOWN_FILE, LogDirLoader
from kstore.log_registry import LogRegistry
from kstore.marker_gate import MarkerGate
from kstore.mounts import warn_unsafe_lock
from kstore.offsets_expiry import EXPIRY_TASK, OffsetsExpiry
from kstore.producer import Producer, RecordMetadata
from kstore.properties import load_properties
from kstore.scheduler import Scheduler, weak_task
from kstore.topic_admin import TopicAdmin
from kstore.topic_deletion import RETRY_TASK, TopicDeletions, retry_interval_ms
from kstore.topics import TopicConfigs

if TYPE_CHECKING:
    from kstore._core import Record
    from kstore.cleaner import CleanerStats, LogCleaner

log = logging.getLogger("kstore.manager")

# The lock hierarchy (every lock in kstore, and the order they are taken in) is kstore/locks.py.

LOCK_FILE = LOG_DIR_LOCK


class LogManager:
    """Durable multi-topic storage over one or more log dirs (Kafka's `log.dirs`).

    Use as a context manager. `config` takes Kafka broker keys (and topic-level defaults through
    their broker synonyms). `read_only=True` takes no lock and writes nothing, so it can read
    beside a process that appends: its topics are those of its open (a `StoreReader` follows
    topics created and deleted later).
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
        seen: dict[str, str] = {}
        for d in dirs:
            canon = os.path.realpath(d)
            if canon in seen:
                raise InvalidConfigError(f"Duplicate log directory found: {seen[canon]}, {d}")
            seen[canon] = d
        self.log_dirs = [os.path.abspath(d) for d in dirs]
        self.read_only = read_only
        self._time = time or SYSTEM_TIME
        # a writable manager's FileOps removes the clean-shutdown markers in the background
        # and holds every change to a file until they are durably gone (marker_gate.py)
        self._io = io or get_file_ops()
        if not read_only:
            self._io = MarkerGate(self._io)
        # the topic registry: replaced whole under its lock (publish), never changed in place, so
        # appends, the scheduled tasks and the cleaner read it without a lock
        self._failures = LogDirFailureChannel()
        self._reg = LogRegistry(self._failures)
        if not read_only:    # a DeleteRecords is checkpointed at once (log_registry.py)
            self._reg.on_log_start = self._task(self.checkpoint_log_start_offsets)
        self._topics = TopicConfigs(self.log_dirs, self._failures, self._io)
        self._locks: dict[str, int] = {}
        self._loaded_clean: dict[str, bool] = {}
        self._logs_to_delete: deque[tuple[str, int]] = deque()
        self.checkpoint_errors: list[str] = []
        self._closed = False
        self._own_scheduler = scheduler is None and not read_only
        self._scheduler = scheduler if scheduler is not None else (
            None if read_only else Scheduler(self._cfg["background.threads"], self._time))
        self._loader = LogDirLoader(self._cfg, self._topics, read_only=read_only, io=self._io,
                                    time=self._time, scheduler=self._scheduler,
                                    on_loaded=self._loaded_one if progress is not None else None)
        self._admin = TopicAdmin(self.log_dirs, self._cfg, self._reg, self._topics, self._failures,
                                 io=self._io, time=self._time, scheduler=self._scheduler,
                                 to_remove=self._logs_to_delete)
        self._deletions = TopicDeletions(self.log_dirs, self._cfg, self._topics, self._admin,
                                         self._failures, io=self._io, time=self._time)
        self._expiry = OffsetsExpiry(self.log_dirs, self._cfg, io=self._io, time=self._time,
                                     failures=self._failures)
        self._producer = Producer(self._reg, self._failures,
                                  auto_create=self._cfg["auto.create.topics.enable"],
                                  create_topic=self._create,
                                  partition_count=self._admin.partition_count)
        self.cleaner: Optional[LogCleaner] = None
        try:
            self._startup()
        except BaseException:
            for lg in self._reg.logs.values():   # a start that failed keeps nothing mapped
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
                    with contextlib.suppress(FileExistsError):    # made meanwhile elsewhere
                        self._io.mkdir(d)
                    self._io.fsync_dir(os.path.dirname(d))
                elif not os.path.isdir(d):
                    raise UnusableFileError(d, "a log dir that is not a directory")
                warn_unsafe_lock(d, self._io, log)
                if not self.read_only:
                    self._acquire_lock(d)
            except LogDirLockedError:
                raise
            except (OSError, UnusableFileError) as e:
                self._failures.mark_offline(d, e, quiet=True)
        self._check_some_dir_online()      # if none is left, the error says why: no log lines
        for d, why in self._failures.offline_dirs.items():
            log.error("log dir %s is offline: %s", d, why)
        self._topics.load(strict=not self.read_only)
        for d in self.log_dirs:
            if not self._failures.is_offline(d):
                self._loader.check_names(d)    # a child that is no partition: refuse to start
        if not self.read_only:
            self._admin.finish_deletions(self._deletions.forget)
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
                cleaner = LogCleaner(self, c["log.cleaner.threads"], c["log.cleaner.dedupe.buffer.size"],
                                     c["log.cleaner.io.buffer.load.factor"],
                                     c["log.cleaner.io.max.bytes.per.second"], c["log.cleaner.backoff.ms"],
                                     self._time, self._io, c["producer.id.expiration.ms"])
                self.cleaner = self._deletions.cleaner = cleaner
                if self._own_scheduler:
                    cleaner.start()

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

    def _acquire_lock(self, d: str) -> None:
        # exclusive: also excludes standalone writable Log.opens of its partitions, which hold
        # it shared (kstore.local_log.LOG_DIR_LOCK)
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
        with self._reg.lock:
            logs, dir_of = dict(self._reg.logs), dict(self._reg.dir_of)
            for tp, lg in res.logs:
                if tp in logs:
                    lg.close_handlers()
                    raise KStoreStateError(
                        f"Duplicate log directories for {tp[0]}-{tp[1]} are found in both "
                        f"{dir_of[tp]} and {d}. Recover or delete one of them.")
                logs[tp] = lg
                dir_of[tp] = d
            self._reg.publish(logs, dir_of, {**self._reg.failed, **res.failed})
        # a partition left unrecovered must be recovered next time: no clean marker then
        self._loaded_clean[d] = res.clean or not res.failed

    def _loaded_one(self) -> None:
        """LogDirLoader's on_loaded, passed only when there is a progress callback."""
        with self._reg.lock:
            self._loaded_count += 1
            if self._progress is not None:
                self._progress(self._loaded_count, self._load_total)

    def _schedule_tasks(self) -> None:
        c, s = self._cfg, self._scheduler
        if s is None:
            return              # read-only: no tasks
        delay = c["log.initial.task.delay.ms"]
        s.schedule("kafka-log-retention", self._task(self.cleanup_logs), delay, c["log.retention.check.interval.ms"])
        flush_iv = c["log.flush.scheduler.interval.ms"]
        if flush_iv < NO_LIMIT:
            s.schedule("kafka-log-flusher", self._task(self.flush_dirty_logs), delay, flush_iv)
        s.schedule("kafka-recovery-point-checkpoint", self._task(self.checkpoint_recovery_offsets), delay,
                   max(1, c["log.flush.offset.checkpoint.interval.ms"]))
        s.schedule("kafka-log-start-offset-checkpoint", self._task(self.checkpoint_log_start_offsets), delay,
                   max(1, c["log.flush.start.offset.checkpoint.interval.ms"]))
        s.schedule("kafka-delete-logs", self._task(self.delete_logs), delay, 1000)
        s.schedule(RETRY_TASK, self._task(self.retry_deletions), delay, retry_interval_ms(c))
        # its waits for other processes' flocks are short, and end at close (offsets_expiry.py)
        s.schedule(EXPIRY_TASK, self._expiry.scheduled(), delay,
                   c["offsets.retention.check.interval.ms"])

    def expire_group_offsets(self) -> int:
        """What the offsets.retention.check.interval.ms task does (offsets_expiry.py), waiting
        the coordinator's lock timeout: expire committed offsets per offsets.retention.minutes,
        then compact __consumer_offsets. Returns the offsets expired."""
        return self._expiry.run()

    def _task(self, fn):
        # through a weak reference: the scheduler the manager holds forms no cycle with it
        return weak_task(fn, lambda m: m._closed)

    @property
    def broker_config(self) -> BrokerConfig:
        """The parsed broker settings (read by the group coordinator: offsets.*)."""
        return self._cfg

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
        return {tp: f"{f.path}: {f.why}" for tp, f in self._reg.failed.items()}

    def topics(self) -> list[str]:
        return sorted(self._reg.parts)

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions in this store, failed ones included (there may be holes: a
        broker's log dirs hold only some partitions of a topic)."""
        return self._reg.partitions(topic)

    def log(self, topic: str, partition: int) -> Log:
        """The partition's log; LogDirOfflineError once its log dir is offline (as Kafka)."""
        return self._reg.online_log(topic, partition)

    def logs(self) -> dict[tuple[str, int], Log]:
        """Every log of an online dir; an offline dir's logs are gone until a restart (Kafka)."""
        return self._reg.online_logs()

    def log_dir_of(self, topic: str, partition: int) -> str:
        return self._reg.log_dir_of(topic, partition)

    def topic_config(self, topic: str) -> LogConfig:
        self.partitions(topic)
        return self._cfg.log_config(self._topics.overrides(topic))

    def _check_writable(self) -> None:
        if self._closed:
            raise KStoreStateError("LogManager is closed")
        if self.read_only:
            raise KStoreStateError("LogManager is read-only")

    # -- topics (topic_admin.py) and appends by topic (producer.py) -------------------------------
    def create_topic(self, name: str, partitions: Optional[int] = None,
                     config: Optional[Mapping[str, Any]] = None) -> None:
        """Create `name` with `partitions` partitions (default num.partitions) and overrides; a
        name whose deletion is pending is refused ("marked for deletion") if a retry fails."""
        self._create(name, partitions, config, retry=True)

    def _create(self, name: str, partitions: Optional[int] = None,
                config: Optional[Mapping[str, Any]] = None, retry: bool = False) -> None:
        """create_topic; the producer's auto-creation holds the registry lock, so it never
        retries a pending deletion (whose lock is above it): the retry task ends that one."""
        self._check_writable()
        if name == OFFSETS_TOPIC:      # never a manager's own log (produce would auto-create it)
            raise InvalidTopicError(f"{OFFSETS_TOPIC} is written only through "
                                    f"kstore.group_coordinator.GroupCoordinator (shared-writer partitions)")
        if retry and self._topics.is_deleting(name):
            self._deletions.retry()        # "marked for deletion" only if this fails too
        self._admin.create_topic(name, partitions, config)

    def add_partitions(self, name: str, count: int) -> list[int]:
        """Grow `name` to `count` partitions in total (Kafka's createPartitions); returns the new ones."""
        self._check_writable()
        return self._admin.add_partitions(name, count)

    def alter_topic_config(self, name: str, config: Mapping[str, Any]) -> LogConfig:
        """Set overrides (a value of None removes one); applied to every partition now and kept."""
        self._check_writable()
        return self._admin.alter_topic_config(name, config)

    def delete_topic(self, name: str) -> None:
        """Rename every partition dir to Kafka's `-delete` name; removed after file.delete.delay.ms.

        Crash-atomic: the intent is first recorded durably in the topic config of every log dir
        ("deleting"), dropped after the renames and the groups' offsets of it are gone; a tail
        that failed is retried (retry_deletions), a crash's is finished by the next start-up."""
        self._check_writable()
        self._deletions.delete(name, self._delete_first)

    def _delete_first(self, name: str) -> None:
        self._admin.delete_topic(name)
        # outside the registry lock: a checkpoint's lock is taken before it (lock hierarchy)
        self.checkpoint_recovery_offsets()
        self.checkpoint_log_start_offsets()

    def retry_deletions(self, wait: bool = False) -> bool:
        """The retry task (topic_deletion.py): complete the deletions whose tail failed (their
        groups' offsets stayed); True if none is left pending. wait: behind one running now,
        and for offsets flocks up to the 30 s timeout (the task gives up after 1 s)."""
        self._check_writable()
        return self._deletions.retry(wait)

    def append(self, topic: str, key: Optional[bytes], value: Optional[bytes], *,
               partition: Optional[int] = None, timestamp: Optional[int] = None,
               headers: Optional[Iterable] = None) -> RecordMetadata:
        """Append one record, choosing the partition as Kafka's default partitioner does:
        murmur2 of the key when there is one, round robin otherwise."""
        self._check_writable()
        return self._producer.append(topic, key, value, partition=partition, timestamp=timestamp,
                                     headers=headers)

    def append_batch(self, topic: str, partition: int, records: Iterable) -> Any:
        """Append records to one partition as one batch (what a producer sends): (key, value[,
        timestamp[, headers]]) tuples. Returns the batch's AppendInfo (offsets, timestamps)."""
        self._check_writable()
        return self._producer.append_batch(topic, partition, records)

    def append_columns(self, topic: str, partition: int, cols: Any, start: int = 0,
                       stop: Optional[int] = None, *, batch_bytes: int = 1 << 20) -> tuple[int, int]:
        """Append rows of columnar input (a _core.ColumnInput) to one partition in batches of
        about batch_bytes (Log.append_columns). Returns (first offset, record count)."""
        self._check_writable()
        return self._producer.append_columns(topic, partition, cols, start, stop,
                                             batch_bytes=batch_bytes)

    def ensure_topic(self, topic: str, partition: Optional[int] = None) -> int:
        """The topic's partition count, creating it first (num.partitions) when it is missing and
        auto.create.topics.enable is on, as a broker does for a producer; UnknownPartitionCountError
        if the store does not know it (partition_count). With `partition` (appends to that one
        only), a count that covers it will do: the count, else the highest partition + 1."""
        return self._producer.ensure(topic, partition)

    def partition_count(self, topic: str) -> Optional[int]:
        """The topic's partition count: as created, grown or set (set_partition_count); for a
        topic an older kstore created, the highest partition + 1; None when the store does not
        know it (a broker's log dirs hold some partitions of a topic, the rest are elsewhere)."""
        return self._admin.partition_count(topic)

    def set_partition_count(self, topic: str, count: int) -> None:
        """Tell the store the partition count of a topic whose log dirs hold some of its
        partitions (a broker's), so that keyed appends map keys as Kafka's partitioner does;
        kept in the topic config file. It must exceed every partition held."""
        self._check_writable()
        self._admin.set_partition_count(topic, count)

    def read(self, topic: str, partition: int, offset: int, max_records: Optional[int] = None,
             max_bytes: int = 1 << 20) -> list[Record]:
        """Log.read of one partition."""
        return self.log(topic, partition).read(offset, max_records, max_bytes)

    # -- compaction ----------------------------------------------------------------------------
    def clean_now(self) -> list[CleanerStats]:
        """Run one cleaner pass now over every eligible compacted log; returns a list of
        CleanerStats (bytes read and written, records removed, duration)."""
        self._check_writable()
        if self.cleaner is None:
            raise KStoreStateError("the log cleaner is disabled (log.cleaner.enable=false)")
        return self.cleaner.run_pass()

    def uncleanable_partitions(self) -> dict[tuple[str, int], str]:
        """Partitions whose cleaning failed, with the error (cleaning skips them); an offline
        dir's and a deleted topic's are forgotten, as Kafka's cleaner forgets them."""
        return self.cleaner.uncleanable_partitions() if self.cleaner else {}

    # -- scheduled tasks (also public) -----------------------------------------------------------
    def _each_log(self):
        # the published registry, lock-free: a slow create_topic never holds up the tasks
        dir_of = self._reg.dir_of
        items = [(tp, lg, dir_of.get(tp)) for tp, lg in self._reg.online_logs().items()]
        return [(tp, lg, d) for tp, lg, d in items if d is not None and not lg.closed]

    def cleanup_logs(self) -> int:
        """Retention for non-compacted logs (compacted ones belong to the cleaner); returns the
        number of segments deleted."""
        total = 0
        failed = []
        for _tp, lg, d in self._each_log():
            if lg.config.compact:
                continue
            try:
                total += self._failures.guard(d, lg.delete_old_segments)
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
                    self._failures.guard(d, lg.flush)
                except (LogDirOfflineError, KStoreStateError):
                    continue

    def checkpoint_recovery_offsets(self) -> None:
        self._checkpoint(RECOVERY_POINT_CHECKPOINT, lambda lg: lg.recovery_point)

    def checkpoint_log_start_offsets(self, log_dir: Optional[str] = None) -> None:
        """Write every log dir's log-start checkpoint, or log_dir's only (a moved start's)."""
        def start(lg):
            segs, s = lg.segments, lg.checkpoint_start
            return s if segs and s > segs[0].base_offset else None
        self._checkpoint(LOG_START_OFFSET_CHECKPOINT, start, log_dir)

    def _checkpoint(self, name: str, value, log_dir: Optional[str] = None) -> None:
        if self.read_only:
            return
        failed = []
        for d in self.log_dirs if log_dir is None else [log_dir]:
            if self._failures.is_offline(d):
                continue
            cp = OffsetCheckpointFile(os.path.join(d, name), self._io)
            # snapshot and write under the file's lock: two writers (the periodic task and
            # delete_topic, say) land in the order they took their snapshots
            with cp.lock:
                dir_of, logs = self._reg.dir_of, self._reg.logs
                entries = {}
                for tp, lg in logs.items():
                    if dir_of.get(tp) == d:
                        v = value(lg)
                        if v is not None:
                            entries[tp] = v
                for tp, f in self._reg.failed.items():
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
        """Remove `-delete` dirs renamed at least file.delete.delay.ms ago; returns how many."""
        return delete_due(self._logs_to_delete, self._io, self._failures, self._time.milliseconds(),
                          self._cfg.log_config().file_delete_delay_ms)

    # -- shutdown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for a topic deletion in flight, flush and close every log, write both
        checkpoints, then the clean-shutdown marker of each dir that started clean or finished
        loading, and release the locks."""
        if self._closed:
            return
        self._closed = True
        try:
            if not self.read_only:
                self._expiry.close()        # the expiry task's flock wait ends now
                self._deletions.close()     # a delete_topic or retry running: it ends first
            if self.cleaner is not None:
                self.cleaner.shutdown()
            if self._own_scheduler and self._scheduler is not None:
                self._scheduler.shutdown()
            if self.read_only:
                for lg in self._reg.logs.values():
                    lg.close_handlers()
                return
            dirs_ok = {d for d in self.log_dirs if not self._failures.is_offline(d)}
            dir_of = self._reg.dir_of
            for tp, lg in list(self._reg.logs.items()):
                d = dir_of.get(tp)
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
