"""Background task scheduling (Kafka's KafkaScheduler) and a MockScheduler that tests drive by hand."""
from __future__ import annotations

import heapq
import itertools
import logging
import threading
import weakref
from types import MethodType
from typing import Any, Callable, Optional

log = logging.getLogger("kstore.scheduler")


def weak_task(method: MethodType, skip: Callable[[Any], bool]) -> Callable[..., None]:
    """A task calling a bound method through a weak reference to its object (weakref.WeakMethod):
    the scheduler's queue does not keep the object alive, so an object that holds the scheduler
    (a LogManager) forms no reference cycle with it. A no-op once the object is gone or while
    skip(object) is true (closed)."""
    ref = weakref.WeakMethod(method)

    def run(*args: Any) -> None:
        fn = ref()
        if fn is not None and not skip(fn.__self__):
            fn(*args)
    return run


class ScheduledTask:
    """A task in a scheduler's queue; cancel() keeps it from running again."""
    __slots__ = ("name", "fn", "due", "period", "cancelled", "seq")

    def __init__(self, name, fn, due, period, seq):
        self.name, self.fn, self.due, self.period, self.seq = name, fn, due, period, seq
        self.cancelled = False

    def __lt__(self, other):
        return (self.due, self.seq) < (other.due, other.seq)

    def cancel(self) -> None:
        self.cancelled = True


class Scheduler:
    """Runs one-shot and periodic tasks on `threads` daemon threads (background.threads).

    A task that raises is logged and, if periodic, runs again at its next time.
    """

    def __init__(self, threads: int = 1, time=None, name: str = "kstore-scheduler"):
        from kstore.clock import SYSTEM_TIME
        self._time = time or SYSTEM_TIME
        self._heap: list[ScheduledTask] = []
        self._cv = threading.Condition()
        self._seq = itertools.count()
        self._running = True
        self._threads = [threading.Thread(target=self._run, name=f"{name}-{i}", daemon=True)
                         for i in range(max(1, threads))]
        for t in self._threads:
            t.start()

    def schedule(self, name: str, fn: Callable[[], object], delay_ms: int = 0,
                 period_ms: Optional[int] = None) -> ScheduledTask:
        with self._cv:
            task = ScheduledTask(name, fn, self._time.milliseconds() + max(0, delay_ms), period_ms, next(self._seq))
            heapq.heappush(self._heap, task)
            self._cv.notify()
            return task

    def schedule_once(self, name: str, fn: Callable[[], object], delay_ms: int = 0) -> ScheduledTask:
        return self.schedule(name, fn, delay_ms, None)

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._running and (not self._heap or self._heap[0].due > self._time.milliseconds()):
                    timeout = None if not self._heap else max(0.0, (self._heap[0].due - self._time.milliseconds()) / 1000)
                    self._cv.wait(timeout=min(timeout, 1.0) if timeout is not None else 1.0)
                if not self._running:
                    return
                task = heapq.heappop(self._heap)
            if task.cancelled:
                continue
            try:
                task.fn()
            except Exception:
                log.exception("scheduled task %s failed", task.name)
            if task.period is not None and not task.cancelled:
                with self._cv:
                    task.due = self._time.milliseconds() + task.period
                    heapq.heappush(self._heap, task)

    def shutdown(self) -> None:
        with self._cv:
            self._running = False
            self._cv.notify_all()
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout=30)
        with self._cv:
            # never run now; a queued task's closure may hold what holds this scheduler (a
            # Log's flush after a roll): dropped, no reference cycle outlives the shutdown
            self._heap.clear()


class MockScheduler:
    """A scheduler on a MockTime: tasks run only in tick()/advance(), in due order, on the
    calling thread (Kafka's MockScheduler)."""

    def __init__(self, time):
        self._time = time
        self._heap: list[ScheduledTask] = []
        self._seq = itertools.count()

    def schedule(self, name: str, fn: Callable[[], object], delay_ms: int = 0,
                 period_ms: Optional[int] = None) -> ScheduledTask:
        task = ScheduledTask(name, fn, self._time.milliseconds() + max(0, delay_ms), period_ms, next(self._seq))
        heapq.heappush(self._heap, task)
        return task

    def schedule_once(self, name: str, fn: Callable[[], object], delay_ms: int = 0) -> ScheduledTask:
        return self.schedule(name, fn, delay_ms, None)

    def tick(self) -> int:
        """Run every task due now; returns how many ran."""
        ran = 0
        now = self._time.milliseconds()
        while self._heap and self._heap[0].due <= now:
            task = heapq.heappop(self._heap)
            if task.cancelled:
                continue
            task.fn()
            ran += 1
            if task.period is not None and not task.cancelled:
                task.due = now + task.period if task.period > 0 else now + 1
                heapq.heappush(self._heap, task)
        return ran

    def advance(self, ms: int) -> int:
        """Move the clock forward and run what became due."""
        self._time.sleep(ms)
        return self.tick()

    def pending(self) -> list[str]:
        """Names of the tasks queued, next due first."""
        return [t.name for t in sorted(self._heap) if not t.cancelled]

    def shutdown(self) -> None:
        self._heap.clear()
