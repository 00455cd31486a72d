"""The tail of a topic deletion, retried until it completes (Kafka's controller keeps retrying
a topic deletion until it is done: TopicDeletionManager).

After delete_topic's renames, what else names the topic is forgotten (cleaner-offset-checkpoint
entries; every group's committed offsets, tombstoned: onPartitionsDeleted) and only then is the
deletion record dropped from the topic config. A tail that fails (an offsets flock held past its
timeout, an unreadable offsets-topic.json, an I/O error) leaves the record, and the name stays
"marked for deletion": a running writable LogManager retries it on its scheduler every
`retry_interval_ms` and once, synchronously, when create_topic meets the name. The task's
attempt waits at most TASK_LOCK_WAIT_S in all for offsets flocks other processes hold, and
not past the manager's close(): it is put off to the next beat, as Kafka's controller retries
on its next event instead of blocking (create_topic's retry waits the coordinator's 30 s). One
tail runs at a time (`_lock`, in locks.py's order): a caller that waited for a retry begun
after its call takes that retry's outcome instead of running another (a task's attempt, which
may give up early, is no outcome to take). The manager's close() waits for the tail in flight
and none runs after it (it would write to a store no longer locked).
"""
from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from kstore.broker_config import BrokerConfig
from kstore.checkpoint import CLEANER_OFFSET_CHECKPOINT, drop_topic_entries
from kstore.errors import KStoreError, KStoreStateError
from kstore.fileio import FileOps
from kstore.log_dir_failure import LogDirFailureChannel
from kstore.task_wait import TASK_LOCK_WAIT_S, PutOff, held_too_long, task_pause
from kstore.topic_admin import TopicAdmin
from kstore.topics import TopicConfigs

if TYPE_CHECKING:
    from kstore.cleaner import LogCleaner

log = logging.getLogger("kstore.manager")

#: the scheduler's name of the retry task, beside kafka-delete-logs
RETRY_TASK = "kafka-topic-deletion-retry"
#: the shortest retry period: kstore's kafka-delete-logs beat (file.delete.delay.ms may be 0)
MIN_RETRY_MS = 1000
__all__ = ["RETRY_TASK", "MIN_RETRY_MS", "TASK_LOCK_WAIT_S", "retry_interval_ms", "TopicDeletions"]


def retry_interval_ms(cfg: BrokerConfig) -> int:
    """The retry task's period: file.delete.delay.ms, the beat of a deletion's other background
    step (Kafka's deleteLogs runs again that long after finding nothing due); at least 1 s,
    kstore's kafka-delete-logs period, as the delay may be 0."""
    return max(MIN_RETRY_MS, cfg.log_config().file_delete_delay_ms)


class TopicDeletions:
    """The deletion tails of one writable LogManager: its delete_topic's, the retry task's and
    create_topic's retry, one at a time."""

    def __init__(self, log_dirs: Sequence[str], cfg: BrokerConfig, topics: TopicConfigs,
                 admin: TopicAdmin, failures: LogDirFailureChannel, *, io: FileOps, time) -> None:
        self._dirs = list(log_dirs)
        self._cfg = cfg
        self._topics = topics
        self._admin = admin
        self._failures = failures
        self._io = io
        self._time = time
        self._lock = threading.Lock()     # one tail at a time (locks.py: TopicDeletions._lock)
        self._retries = 0                 # retries begun (each covers every deletion pending)
        self._closed = False              # the manager's close() ran close(): no tail after it
        self._closing = threading.Event()  # close() began: the task's flock wait ends (locks.py)
        #: the manager's LogCleaner once it has one (it keeps checkpoint entries in memory)
        self.cleaner: Optional[LogCleaner] = None

    def delete(self, name: str, first: Callable[[str], None]) -> bool:
        """delete_topic: first(name) (record, renames, checkpoints), then the tail; True if it
        completed (else it stays recorded, for a retry). One tail at a time."""
        with self._lock:
            if self._closed:
                raise KStoreStateError("LogManager is closed")
            first(name)
            return self._tail([name])

    def retry(self, wait: bool = True) -> bool:
        """Complete every deletion left pending; True if none is left. wait=False (the task):
        return False at once while another tail runs, and put the deletion off (False) when
        offsets flocks stay held past TASK_LOCK_WAIT_S or close() begins. A call that waited
        for a retry (wait=True) begun after it takes that retry's outcome instead of running
        another."""
        if not self._topics.deleting:
            return True
        begun = self._retries
        if not self._lock.acquire(blocking=wait):
            return False
        try:
            if self._closed or (not wait and self._closing.is_set()):
                return False
            pending = list(self._topics.deleting)
            if not pending or self._retries > begun:
                return not pending
            if wait:
                self._retries += 1
            if self._failures.offline_dirs:     # nothing can finish before a restart
                return False
            done = self._tail(pending, None if wait else self._task_pause())
            if done:
                log.info("finished the deletion of topic(s) %s (retried)", pending)
            return done
        finally:
            self._lock.release()

    def close(self) -> None:
        """The manager's close(), first: end the task's wait for an offsets flock, wait for the
        tail in flight, so its renames, tombstones and the record's drop end while the store
        is still locked; no tail runs after it."""
        self._closing.set()
        with self._lock:
            self._closed = True

    def _task_pause(self) -> Callable[[float], None]:
        """The task's attempt's pauses between tries of an offsets flock (task_wait.py): PutOff
        once TASK_LOCK_WAIT_S have passed since the attempt began, or at close()."""
        return task_pause(self._closing, TASK_LOCK_WAIT_S)

    def _tail(self, topics: list[str], pause: Optional[Callable[[float], None]] = None) -> bool:
        """Forget the topics, then drop their deletion record (not while a dir is offline)."""
        return self.forget(topics, pause) and self._admin.finish_deletion(topics)

    def forget(self, topics: list[str], pause: Optional[Callable[[float], None]] = None) -> bool:
        """What else names deleted topics (also at a start-up ending deletions a crash cut
        short): cleaner-offset-checkpoint entries (Kafka's asyncDelete) and every group's
        committed offsets (onPartitionsDeleted: tombstones), so a topic created again under a
        name inherits neither. False if the offsets stay (logged; the deletion stays recorded).
        pause: the task's (_task_pause), whose flock waits are short; else the 30 s timeout."""
        from kstore.group_coordinator import CoordinatorLockTimeout, GroupCoordinator
        for d in [d for d in self._dirs if not self._failures.is_offline(d)]:
            try:
                for t in topics:
                    if self.cleaner is not None:        # it holds the entries in memory too
                        self.cleaner.forget_topic(t, [d])
                    else:
                        drop_topic_entries(os.path.join(d, CLEANER_OFFSET_CHECKPOINT), self._io, t)
            except OSError as e:
                self._failures.mark_offline(d, e)
        try:
            with GroupCoordinator(self._dirs, config=self._cfg, io=self._io, time=self._time,
                                  lock_timeout=30.0 if pause is None else TASK_LOCK_WAIT_S,
                                  failures=self._failures) as gc:
                gc.on_topics_deleted(topics, sleep=pause)
            return True
        except (KStoreError, OSError) as e:
            # the task's flock waits also time out at TASK_LOCK_WAIT_S on their own: when a pause
            # ends late, that timeout comes first; the same give-up
            if isinstance(e, PutOff) or (pause is not None and isinstance(e, CoordinatorLockTimeout)):
                log.info("the deletion of topic(s) %s is put off to the next retry: %s", topics,
                         e if isinstance(e, PutOff) else held_too_long(TASK_LOCK_WAIT_S))
                return False
            log.error("topic(s) %s deleted but their committed offsets could not be removed: %s",
                      topics, e)
            return False
