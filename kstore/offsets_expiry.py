"""The delete-expired-group-metadata task of a writable LogManager (Kafka's GroupMetadataManager
cleanupGroupMetadata, every offsets.retention.check.interval.ms): expire committed offsets, then
compact `__consumer_offsets`, each partition under its writers' flock (group_coordinator.py).

The task never holds its scheduler thread for the coordinator's 30 s lock timeout behind
another process's commit: its attempt waits TASK_LOCK_WAIT_S in all (task_wait.py), then puts
the rest off to the next interval; close() ends the wait at once. Each step goes round robin:
a run starts where the last one was put off, just after the partition it waited for (that one
comes last), so a process holding an early partition at every run cannot starve the later ones:
every partition another process does not hold is visited within one run per partition held.
Logged: Kafka's "Removed N expired offsets in X milliseconds." (what this run expired, also when
the rest was put off), then at INFO how many partitions each step put off. What it wrote stays
written (a partition's tombstones are one batch, appended after its look under the flock), so
the next run expires each offset once, from what it reads then. A direct call
(LogManager.expire_group_offsets) waits the coordinator's lock timeout, as before.
"""
from __future__ import annotations

import logging
import threading
from types import MethodType
from typing import Callable, Optional, Sequence, cast

from kstore.broker_config import BrokerConfig
from kstore.errors import CoordinatorNotAvailableError
from kstore.fileio import FileOps
from kstore.files import OFFSETS_TOPIC
from kstore.log_dir_failure import LogDirFailureChannel
from kstore.scheduler import weak_task
from kstore.task_wait import TASK_LOCK_WAIT_S, PutOff, held_too_long, task_pause

__all__ = ["EXPIRY_TASK", "OffsetsExpiry"]

log = logging.getLogger("kstore.groups")

#: the scheduler's name of the task: Kafka's (GroupMetadataManager.startup)
EXPIRY_TASK = "delete-expired-group-metadata"
#: the task's two steps, as its log lines name them
EXPIRY = "expiry of committed offsets"
COMPACTION = f"compaction of {OFFSETS_TOPIC}"


class OffsetsExpiry:
    """One LogManager's offsets expiry: run() for a direct call, task() for its scheduler."""

    def __init__(self, log_dirs: Sequence[str], cfg: BrokerConfig, *, io: FileOps, time,
                 failures: Optional[LogDirFailureChannel] = None) -> None:
        self._dirs = list(log_dirs)
        self._failures = failures
        self._cfg = cfg
        self._io = io
        self._time = time
        self._closing = threading.Event()    # the manager's close() began: the task's wait ends
        self._start = {EXPIRY: 0, COMPACTION: 0}   # the partition each step's next run starts at

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    def run(self) -> int:
        """A direct call: expire, then compact, every partition (the coordinator's 30 s flock
        waits); returns the offsets expired."""
        from kstore.group_coordinator import GroupCoordinator
        with GroupCoordinator(self._dirs, config=self._cfg, io=self._io, time=self._time,
                              failures=self._failures) as gc:
            n = gc.expire_offsets()
            gc.compact(min_dirty_ratio=self._cfg.log_config().min_cleanable_dirty_ratio)
        return n

    def scheduled(self) -> Callable[..., None]:
        """What the scheduler runs: task() through a weak reference, a no-op once closing."""
        return weak_task(cast(MethodType, self.task), lambda e: e.closing)

    def task(self) -> None:
        """One scheduled run: each step round robin from where its last run stopped; what
        another process's flock keeps from it past TASK_LOCK_WAIT_S, or the manager's
        close(), waits for the next interval."""
        from kstore.group_coordinator import GroupCoordinator
        if self._closing.is_set():
            return
        start = self._time.milliseconds()
        pause = task_pause(self._closing, TASK_LOCK_WAIT_S)
        ratio = self._cfg.log_config().min_cleanable_dirty_ratio
        with GroupCoordinator(self._dirs, config=self._cfg, io=self._io, time=self._time,
                              lock_timeout=TASK_LOCK_WAIT_S, failures=self._failures) as gc:
            parts = sorted(gc.topic.existing_partitions())
            n, put_off = self._round(EXPIRY, parts, lambda p: gc.expire_offsets(sleep=pause, partitions=[p]))
            log.info("Removed %d expired offsets in %d milliseconds.", n,
                     self._time.milliseconds() - start)      # Kafka's line, once the expiry is done
            if put_off:
                log.info("%s", put_off)
            if not self._closing.is_set():     # the partitions free now, even past a put-off expiry
                _, put_off = self._round(COMPACTION, parts, lambda p: gc.compact(
                    min_dirty_ratio=ratio, sleep=pause, partitions=[p]))
                if put_off:
                    log.info("%s", put_off)

    def _round(self, step: str, parts: list[int], do: Callable[[int], int]) -> tuple[int, Optional[str]]:
        """do(p) for each partition from step's start on, wrapping (round robin): the sum, and
        the line to log if it was put off at some p (the step's next run starts after p, and
        p is its last)."""
        from kstore.group_coordinator import CoordinatorLockTimeout
        first = self._start[step]
        order = [p for p in parts if p >= first] + [p for p in parts if p < first]
        total = 0
        for i, p in enumerate(order):
            try:
                total += do(p)
            except CoordinatorNotAvailableError:
                continue          # on an offline dir: not this store's to change until a restart
            except (PutOff, CoordinatorLockTimeout) as e:
                # a flock wait's own TASK_LOCK_WAIT_S timeout can come first when a pause ends late
                self._start[step] = p + 1
                why = e if isinstance(e, PutOff) else held_too_long(TASK_LOCK_WAIT_S)
                return total, (f"the {step} is put off to the next run for {len(order) - i} of "
                               f"{len(order)} partitions (from {OFFSETS_TOPIC}-{p}): {why}")
        return total, None

    def close(self) -> None:
        """The manager's close(), first: a task waiting for a flock gives up now; none runs after."""
        self._closing.set()
