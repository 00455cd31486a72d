"""Time sources: the system clock, and a MockTime that tests advance by hand (Kafka's MockTime)."""
from __future__ import annotations

import time as _time


class SystemTime:
    """Wall-clock milliseconds and monotonic nanoseconds."""

    def milliseconds(self) -> int:
        return _time.time_ns() // 1_000_000

    def nanoseconds(self) -> int:
        return _time.monotonic_ns()

    def sleep(self, ms: int) -> None:
        _time.sleep(ms / 1000)


class MockTime(SystemTime):
    """A clock that only moves when told to."""

    def __init__(self, ms: int = 1_600_000_000_000, auto_tick_ms: int = 0):
        self._ms = ms
        self._ns = 0
        self.auto_tick_ms = auto_tick_ms

    def milliseconds(self) -> int:
        v = self._ms
        self._ms += self.auto_tick_ms
        return v

    def nanoseconds(self) -> int:
        return self._ns + self._ms * 1_000_000

    def sleep(self, ms: int) -> None:
        self._ms += ms

    def advance(self, ms: int) -> None:
        self._ms += ms


SYSTEM_TIME = SystemTime()
