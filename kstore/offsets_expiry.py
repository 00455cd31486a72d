"""The delete-expired-group-metadata task of a writable LogManager (Kafka's GroupMetadataManager
cleanupGroupMetadata, every offsets.retention.check.interval.ms): expire committed offsets, then
compact `__consumer_offsets`, each partition under its writers' flock (group_coordinator.py).

The task never holds its scheduler thread for the coordinator's 30 s lock timeout behind
another process's commit: its attempt waits TASK_LOCK_WAIT_S in all (task_wait.py), then puts
the rest off to the next interval, logged at INFO (naming the step: the expiry, or the
compaction after Kafka's "Removed N expired offsets" line); close() ends the wait at once.
What it wrote stays written (a partition's tombstones are one batch, appended after its look
under the flock), so the next run expires each offset once, from what it reads then. A direct
call (LogManager.expire_group_offsets) waits the coordinator's lock timeout, as before.
"""
from __future__ import annotations

import logging
import threading
from types import MethodType
from typing import Callable, Optional, Sequence, cast

from kstore.broker_config import BrokerConfig
from kstore.fileio import FileOps
from kstore.files import OFFSETS_TOPIC
from kstore.scheduler import weak_task
from kstore.task_wait import TASK_LOCK_WAIT_S, PutOff, held_too_long, task_pause

__all__ = ["EXPIRY_TASK", "OffsetsExpiry"]

log = logging.getLogger("kstore.groups")

#: the scheduler's name of the task: Kafka's (GroupMetadataManager.startup)
EXPIRY_TASK = "delete-expired-group-metadata"


class OffsetsExpiry:
    """One LogManager's offsets expiry: run() for a direct call, task() for its scheduler."""

    def __init__(self, log_dirs: Sequence[str], cfg: BrokerConfig, *, io: FileOps, time) -> None:
        self._dirs = list(log_dirs)
        self._cfg = cfg
        self._io = io
        self._time = time
        self._closing = threading.Event()    # the manager's close() began: the task's wait ends

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def run(self, pause: Optional[Callable[[float], None]] = None,
            expired: Optional[Callable[[int], None]] = None) -> int:
        """Expire, then compact; returns the offsets expired. pause: the task's (its flock
        waits then last TASK_LOCK_WAIT_S in all and raise PutOff); else the 30 s timeout.
        expired: told the count once the expiry is done, before the compaction."""
        from kstore.group_coordinator import GroupCoordinator
        with GroupCoordinator(self._dirs, config=self._cfg, io=self._io, time=self._time,
                              lock_timeout=30.0 if pause is None else TASK_LOCK_WAIT_S) as gc:
            n = gc.expire_offsets(sleep=pause)
            if expired is not None:
                expired(n)
            gc.compact(min_dirty_ratio=self._cfg.log_config().min_cleanable_dirty_ratio, sleep=pause)
        return n

    def scheduled(self) -> Callable[..., None]:
        """What the scheduler runs: task() through a weak reference, a no-op once closing."""
        return weak_task(cast(MethodType, self.task), lambda e: e.closing)

    def task(self) -> None:
        """One scheduled run: what another process's flock keeps from it past
        TASK_LOCK_WAIT_S, or the manager's close(), waits for the next interval."""
        from kstore.group_coordinator import CoordinatorLockTimeout
        if self._closing.is_set():
            return
        start = self._time.milliseconds()
        step = ["expiry of committed offsets"]

        def expired(n: int) -> None:       # Kafka's line, once the expiry is done
            log.info("Removed %d expired offsets in %d milliseconds.", n,
                     self._time.milliseconds() - start)
            step[0] = f"compaction of {OFFSETS_TOPIC}"
        try:
            self.run(task_pause(self._closing, TASK_LOCK_WAIT_S), expired)
        except (PutOff, CoordinatorLockTimeout) as e:
            # a flock wait's own TASK_LOCK_WAIT_S timeout can come first when a pause ends late
            log.info("the %s is put off to the next run: %s", step[0],
                     e if isinstance(e, PutOff) else held_too_long(TASK_LOCK_WAIT_S))

    def close(self) -> None:
        """The manager's close(), first: a task waiting for a flock gives up now; none runs after."""
        self._closing.set()
