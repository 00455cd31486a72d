"""The published map of a store's logs (Kafka's LogManager.currentLogs): which partitions exist,
the Log and log dir of each, and the partitions isolated at start-up.

Copy-on-write: a change builds new dicts under `lock` and publishes them; a published dict is
never changed again, so appends, the scheduled tasks and the cleaner read it without a lock.
"""
from __future__ import annotations

import functools
import threading
import weakref
from typing import TYPE_CHECKING, Callable, NoReturn, Optional

from kstore.errors import LogDirOfflineError, PartitionLoadError, UnknownTopicError
from kstore.log_dir_failure import LogDirFailureChannel

if TYPE_CHECKING:
    from kstore.log import Log
    from kstore.log_dir_loader import FailedPartition

TopicPartition = tuple[str, int]


class LogRegistry:
    """The logs of one LogManager. Read the attributes without a lock (each is a published dict,
    never changed); change them only through `publish`, holding `lock`.

    `lock` is LogManager's registry lock in the lock hierarchy (below checkpoint_lock, above
    Log._flush_lock): create/delete/add/alter topics and start-up's publishing hold it.
    """

    def __init__(self, failures: LogDirFailureChannel) -> None:
        self.lock = threading.RLock()
        self.logs: dict[TopicPartition, Log] = {}
        self.dir_of: dict[TopicPartition, str] = {}
        self.parts: dict[str, tuple[int, ...]] = {}
        self.failed: dict[TopicPartition, FailedPartition] = {}
        #: set by the LogManager: writes one log dir's log-start checkpoint (a DeleteRecords is
        #: visible to other processes' StoreReaders at their next refresh, not 60 s later)
        self.on_log_start: Optional[Callable[[str], None]] = None
        # every log of a dir that goes offline refuses writes (Kafka's partitions of a failed
        # log dir go offline), whichever log's I/O error took the dir down
        self._failures = failures
        failures.add_listener(self._dir_offline)

    def log_failed(self, d: str, e: OSError) -> None:
        """A log of d failed on e, whatever its errno: d goes offline, every log in it with it
        (Kafka's maybeHandleIOException: a log's IOException is its dir's). A failed log is
        closed unflushed and untrimmed, so its dir must not be marked clean; and the channel's
        guard would take d offline at the next write anyway (the refusal is an EIO)."""
        self._failures.mark_offline(d, e)

    def _dir_offline(self, d: str, why: str) -> None:
        """The channel's listener: lock-free (published dicts), as a failing write may call it
        holding its Log's lock."""
        dir_of = self.dir_of
        for tp, lg in self.logs.items():
            if dir_of.get(tp) == d:
                lg.fail(f"log dir {d} is offline: {why}")

    def publish(self, logs: dict[TopicPartition, Log], dir_of: dict[TopicPartition, str],
                failed: Optional[dict[TopicPartition, FailedPartition]] = None) -> None:
        """Install new dicts (`lock` held); readers may hold the old ones, so the published dicts
        are never changed again. dir_of goes first: a partition readers find in logs always has
        its dir. A topic's partitions include the ones isolated at start-up (failed): they
        exist, they just cannot be used."""
        if failed is not None:
            self.failed = failed
        parts: dict[str, list[int]] = {}
        for t, p in sorted(set(logs) | set(self.failed)):
            parts.setdefault(t, []).append(p)
        if (on_start := self.on_log_start) is not None:
            for tp, lg in logs.items():      # a moved start rewrites its own dir's file only
                lg.log_start_listener = functools.partial(on_start, dir_of[tp])
        me = weakref.ref(self)               # weak: a log is held by this registry (no cycle)
        for tp, lg in logs.items():          # a log's own I/O error takes its dir offline
            lg.failure_listener = functools.partial(_log_failed, me, dir_of[tp])
        self.dir_of = dir_of
        self.logs = logs
        self.parts = {t: tuple(ps) for t, ps in parts.items()}
        for d, why in self._failures.offline_dirs.items():   # gone offline as these were made
            self._dir_offline(d, why)

    def online_logs(self) -> dict[TopicPartition, Log]:
        """The logs whose dir is online (Kafka's currentLogs: handleLogDirFailure removes a failed
        dir's logs, so allLogs, the cleaner and the scheduled tasks never see them again)."""
        dir_of, offline = self.dir_of, self._failures.offline_dirs
        return {tp: lg for tp, lg in self.logs.items() if dir_of.get(tp) not in offline}

    def partitions(self, topic: str) -> list[int]:
        """The topic's partitions, failed ones included; UnknownTopicError if it has none."""
        parts = self.parts.get(topic)
        if not parts:
            raise UnknownTopicError(f"unknown topic {topic!r}")
        return list(parts)

    def log(self, topic: str, partition: int) -> Log:
        """The partition's log; the error of raise_missing if it is not loaded."""
        try:
            return self.logs[(topic, partition)]
        except KeyError:
            pass
        self.raise_missing(topic, partition)

    def online_log(self, topic: str, partition: int) -> Log:
        """The partition's log for a reader: LogDirOfflineError naming the partition and its dir
        if that dir is offline (Kafka's fetch of an offline dir's partition: KAFKA_STORAGE_ERROR
        until a restart); else as log()."""
        lg, d = self.log_and_dir(topic, partition)
        if (why := self._failures.reason(d)) is not None:
            raise LogDirOfflineError(f"partition {topic}-{partition} is offline: its log dir {d} "
                                     f"is offline ({why}); reopen the store once the disk is fixed")
        return lg

    def log_dir_of(self, topic: str, partition: int) -> str:
        """The partition's log dir; the error of raise_missing if it is not loaded."""
        try:
            return self.dir_of[(topic, partition)]
        except KeyError:
            pass
        self.raise_missing(topic, partition)

    def log_and_dir(self, topic: str, partition: int) -> tuple[Log, str]:
        """The partition's log and log dir; a kstore error naming what is missing if it is not
        loaded (failed at start-up, not in this store, or deleted since the caller looked)."""
        tp = (topic, partition)
        try:
            return self.logs[tp], self.dir_of[tp]
        except KeyError:
            pass
        self.raise_missing(topic, partition)

    def raise_missing(self, topic: str, partition: int) -> NoReturn:
        """Raise the error for a partition that is not loaded: failed at start-up, or not here."""
        f = self.failed.get((topic, partition))
        if f is not None:
            raise PartitionLoadError(f"partition {topic}-{partition} failed to load at start-up "
                                     f"and is isolated: {f.path}: {f.why}")
        try:
            parts = self.partitions(topic)
        except UnknownTopicError:
            raise UnknownTopicError(f"unknown topic partition {topic}-{partition}") from None
        raise UnknownTopicError(f"partition {partition} of topic {topic!r} is not in this store "
                                f"(its log dirs hold partitions {parts})")


def _log_failed(registry: weakref.ref[LogRegistry], d: str, e: OSError) -> None:
    """A published log's failure_listener: LogRegistry.log_failed if the registry lives."""
    if (reg := registry()) is not None:
        reg.log_failed(d, e)
