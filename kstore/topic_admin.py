"""Topic administration over a store's log dirs: create topics, add partitions, alter topic
configs and delete topics (what Kafka's controller does for CreateTopics, CreatePartitions,
IncrementalAlterConfigs and DeleteTopics), each published whole to the log registry.

Deletion is crash-atomic: recorded in the topic config file first, the record dropped last
(after the partitions' renames and the groups' committed offsets: topic_deletion.py), finished by
the next start-up (finish_deletions) if it was cut short.
"""
from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from kstore.broker_config import BrokerConfig
from kstore.config import LogConfig
from kstore.errors import (InvalidTopicError, LogDirOfflineError, TopicExistsError,
                           UnusableFileError)
from kstore.fileio import FileOps
from kstore.files import delete_dir_name, partition_dirs
from kstore.log import Log
from kstore.log_dir_failure import LogDirFailureChannel
from kstore.log_registry import LogRegistry
from kstore.topics import TopicConfigs, topics_collide, validate_topic_name, write_partition_metadata

log = logging.getLogger("kstore.manager")


class TopicAdmin:
    """The topic operations of one writable LogManager. Every change holds the registry lock;
    the caller checks that the store is open and writable."""

    def __init__(self, log_dirs: Sequence[str], cfg: BrokerConfig, registry: LogRegistry,
                 topics: TopicConfigs, failures: LogDirFailureChannel, *, io: FileOps, time: Any,
                 scheduler: Any, to_remove: deque[tuple[str, int]]):
        self._dirs = list(log_dirs)
        self._cfg = cfg
        self._reg = registry
        self._topics = topics
        self._failures = failures
        self._io = io
        self._time = time
        self._scheduler = scheduler
        self._to_remove = to_remove       # (`-delete` dir, renamed at ms): the manager removes them

    def finish_deletions(self, forget: Callable[[list[str]], bool]) -> None:
        """Complete the topic deletions a crash cut short (delete_topic records the intent in
        the topic config before its first rename): rename every partition left of those topics
        to its `-delete` name, forget(topics) what else names them (committed offsets), then
        drop the record. A dir that is offline, or forget returning False, keeps it pending.
        Writable stores only (a read-only one shows no partition of a topic being deleted)."""
        if not self._topics.deleting:
            return
        done = True
        for d in self._dirs:
            if self._failures.is_offline(d):
                done = False
                continue
            try:
                moved = False
                for (topic, p), path in partition_dirs(self._io, d):
                    if self._topics.is_deleting(topic):
                        target = os.path.join(d, delete_dir_name(topic, p))
                        self._io.rename(path, target)
                        # the time of the rename, which every later start-up queues it with
                        self._io.set_mtime_ms(target, self._time.milliseconds())
                        moved = True
                if moved:
                    self._io.fsync_dir(d)
            except (OSError, UnusableFileError) as e:
                self._failures.mark_offline(d, e)
                done = False
        deleting = list(self._topics.deleting)
        if done and forget(deleting):
            log.info("finished the deletion of topic(s) %s cut short before", deleting)
            self._topics.finish_deletions(deleting)

    def finish_deletion(self, names: list[str]) -> bool:
        """Drop the record of delete_topic(names) once their committed offsets are gone too: the
        record is what makes a start-up after a crash finish the whole deletion, and until it
        goes the name cannot be created again ("marked for deletion", as Kafka's). False (kept)
        while a log dir is offline: its partitions may still need their rename."""
        with self._reg.lock:
            if self._failures.offline_dirs:
                return False
            self._topics.finish_deletions(names)
            return True

    def create_topic(self, name: str, partitions: Optional[int] = None,
                     config: Optional[Mapping[str, Any]] = None) -> None:
        """Create `name` with `partitions` partitions (default num.partitions) and overrides."""
        validate_topic_name(name)
        partitions = self._cfg["num.partitions"] if partitions is None else partitions
        if not isinstance(partitions, int) or partitions < 1:
            raise InvalidTopicError(f"Number of partitions must be at least 1, got {partitions!r}")
        overrides = dict(config or {})
        cfg = self._cfg.log_config(overrides)          # validates
        with self._reg.lock:
            if name in self._reg.parts:
                raise TopicExistsError(f"Topic '{name}' already exists.")
            if self._topics.is_deleting(name):
                raise TopicExistsError(f"Topic '{name}' is marked for deletion.")
            if any(topics_collide(name, t) for t in self._reg.parts):
                raise InvalidTopicError(f"Topic '{name}' collides with an existing topic ('.' and '_' are equivalent)")
            self._topics.add_topic(name, cfg.overrides, partitions)
            self._topics.persist()
            self._create_partitions(name, range(partitions), cfg)

    def _create_partitions(self, topic: str, partitions: Iterable[int], cfg: LogConfig) -> None:
        """Create partitions (_lock held) and publish them together, so that no appender sees
        the topic with fewer partitions than it is created with (keys would go astray)."""
        logs, dir_of = dict(self._reg.logs), dict(self._reg.dir_of)
        try:
            for p in partitions:
                self._create_partition(topic, p, cfg, logs, dir_of)
        finally:
            self._reg.publish(logs, dir_of)

    def _least_loaded_dirs(self, dir_of: dict) -> list[str]:
        counts = {d: 0 for d in self._dirs if not self._failures.is_offline(d)}
        for d in dir_of.values():
            if d in counts:
                counts[d] += 1
        return sorted(counts, key=lambda d: (counts[d], self._dirs.index(d)))

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
        with self._reg.lock:
            # the count recorded (created, grown or set); else, with holes, the highest + 1
            have = self._topics.partition_count(name) or self._reg.partitions(name)[-1] + 1
            if count <= have:
                raise InvalidTopicError(
                    f"Topic currently has {have} partitions, which is higher than or equal "
                    f"to the requested {count}.")
            cfg = self._cfg.log_config(self._topics.overrides(name))
            new = list(range(have, count))
            self._topics.set_partition_count(name, count)
            self._topics.persist()
            self._create_partitions(name, new, cfg)
            return new

    def partition_count(self, topic: str) -> Optional[int]:
        """LogManager.partition_count: as recorded, else highest + 1 for a topic an older kstore
        created (it has a topic id), else None (a broker's partitions: count unknown)."""
        n = self._topics.partition_count(topic)
        if n is None and self._topics.created_here(topic):
            parts = self._reg.parts.get(topic)
            n = parts[-1] + 1 if parts else None
        return n

    def set_partition_count(self, topic: str, count: int) -> None:
        """LogManager.set_partition_count, kept in the topic config file."""
        with self._reg.lock:
            parts = self._reg.partitions(topic)
            if not isinstance(count, int) or isinstance(count, bool) or count <= parts[-1]:
                raise InvalidTopicError(f"partition count {count!r} of {topic!r} must exceed its "
                                        f"highest partition {parts[-1]}")
            self._topics.set_partition_count(topic, count)
            self._topics.persist()

    def alter_topic_config(self, name: str, config: Mapping[str, Any]) -> LogConfig:
        """Set overrides (a value of None removes one); applied now to every partition of an
        online dir (Kafka's updateTopicConfig: currentLogs) and kept in the online dirs' topic
        config, which an offline dir's partitions load when the store is reopened."""
        with self._reg.lock:
            self._reg.partitions(name)
            overrides = dict(self._topics.overrides(name) or {})
            for k, v in config.items():
                if v is None:
                    overrides.pop(k, None)
                else:
                    overrides[k] = v
            cfg = self._cfg.log_config(overrides)
            self._topics.set_overrides(name, cfg.overrides)
            self._topics.persist()
            for (t, _p), lg in self._reg.online_logs().items():
                if t == name:
                    lg.update_config(cfg)
            return cfg

    def delete_topic(self, name: str) -> None:
        """Rename every partition dir to Kafka's `-delete` name; removed after file.delete.delay.ms.

        Crash-atomic: the intent is first recorded durably in the topic config of every log dir
        ("deleting"); a crash after that is finished by the next start-up before anything loads,
        so the topic comes back whole or not at all."""
        with self._reg.lock:
            parts = self._reg.partitions(name)
            self._topics.record_deletion(name)
            if self._failures.all_offline(self._dirs):
                raise LogDirOfflineError(f"could not record the deletion of {name}: every log dir "
                                         f"is offline: {self._failures.offline_dirs}")
            # unpublished first: appenders get UnknownTopicError, not a half-deleted topic
            logs, dir_of = dict(self._reg.logs), dict(self._reg.dir_of)
            failed = dict(self._reg.failed)
            gone: list[tuple[int, Optional[Log], str, str]] = []
            for p in parts:
                tp = (name, p)
                lg = logs.pop(tp, None)
                if lg is not None:
                    gone.append((p, lg, dir_of.pop(tp), lg.dir))
                else:
                    f = failed.pop(tp)            # isolated: its dir goes all the same
                    gone.append((p, None, f.dir, f.path))
            self._reg.publish(logs, dir_of, failed)
            touched = set()
            for p, lg, d, path in gone:
                if lg is not None:
                    lg.close_handlers()
                if self._failures.is_offline(d):
                    continue               # finished by the start-up that finds it online
                target = os.path.join(d, delete_dir_name(name, p))
                now = self._time.milliseconds()
                try:
                    self._io.rename(path, target)
                    touched.add(d)
                    # the dir's mtime records when it was renamed: a start-up before the
                    # delay is over queues it with that time, not its own (LogDirLoader)
                    self._io.set_mtime_ms(target, now)
                except OSError as e:
                    self._failures.mark_offline(d, e)
                    raise LogDirOfflineError(f"could not delete {name}-{p}: {e}") from e
                self._to_remove.append((target, now))
            for d in sorted(touched):
                try:
                    self._io.fsync_dir(d)
                except OSError as e:
                    self._failures.mark_offline(d, e)
                    raise LogDirOfflineError(f"could not delete {name}: {e}") from e
            # the record stays until the caller's finish_deletion: committed offsets go first
