"""Progress bars for long command-line work (recovery, dump-log, bench, bulk produce).

Drawn on stderr only when it is a terminal, at most ten times a second, and erased when done, so
pipes, logs and CI output never see them. No dependency: one line of text with a carriage return.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import IO, Optional


def _fmt(n: float, unit: str) -> str:
    if unit == "B":
        for u in ("B", "KiB", "MiB", "GiB", "TiB"):
            if abs(n) < 1024 or u == "TiB":
                return f"{n:.0f} {u}" if u == "B" else f"{n:.1f} {u}"
            n /= 1024
    return f"{n:,.0f}{(' ' + unit) if unit else ''}"


class Progress:
    """A bar over `total` units (None: a counter with a rate). Use as a context manager."""

    WIDTH = 28

    def __init__(self, desc: str, total: Optional[float] = None, unit: str = "", *,
                 stream: Optional[IO] = None, enabled: Optional[bool] = None, interval: float = 0.1):
        self.desc = desc
        self.total = total
        self.unit = unit
        self.done = 0.0
        self.note = ""                     # what is being done now, shown after the figures
        self._stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = _is_terminal(self._stream) and os.environ.get("KSTORE_NO_PROGRESS") is None
        self.enabled = enabled
        self._interval = interval
        self._t0 = time.monotonic()
        self._last = 0.0
        self._lock = threading.Lock()
        self._drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: float = 1, note: Optional[str] = None) -> None:
        """Add n units of work done (thread-safe); note replaces the text after the figures."""
        with self._lock:
            self.done += n
            if note is not None:
                self.note = note
            if self.enabled:
                now = time.monotonic()
                if now - self._last >= self._interval:
                    self._last = now
                    self._draw(now)

    def set(self, done: float, total: Optional[float] = None) -> None:
        """Set the absolute amount done (and optionally a new total)."""
        with self._lock:
            if total is not None:
                self.total = total
            self.done = done
        self.update(0)

    def line(self, now: Optional[float] = None) -> str:
        """The text of the bar as it would be drawn now."""
        now = time.monotonic() if now is None else now
        elapsed = max(now - self._t0, 1e-9)
        rate = _fmt(self.done / elapsed, self.unit) + "/s" + (f"  {self.note}" if self.note else "")
        if self.total:
            frac = min(1.0, self.done / self.total)
            filled = int(frac * self.WIDTH)
            bar = "#" * filled + "-" * (self.WIDTH - filled)
            return (f"{self.desc} [{bar}] {frac * 100:5.1f}% {_fmt(self.done, self.unit)}"
                    f"/{_fmt(self.total, self.unit)} {rate}")
        return f"{self.desc} {_fmt(self.done, self.unit)} {rate}"

    def _draw(self, now: float) -> None:
        try:
            self._stream.write("\r" + self.line(now)[:200] + "\x1b[K")
            self._stream.flush()
            self._drawn = True
        except (OSError, ValueError):
            self.enabled = False

    def close(self) -> None:
        """Erase the bar (nothing was ever drawn off a terminal)."""
        with self._lock:
            if self._drawn:
                try:
                    self._stream.write("\r\x1b[K")
                    self._stream.flush()
                except (OSError, ValueError):
                    pass
                self._drawn = False
            self.enabled = False


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False
