"""A bound on every wait in the concurrency tests: if a test outlives its watchdog, every thread's
stack is dumped to stderr (and to the file named by KSTORE_WATCHDOG_DUMP, if set) and the process
exits non-zero, so a deadlock fails the run with the evidence instead of hanging CI."""
from __future__ import annotations

import faulthandler
import os
import sys
import threading
import traceback


def dump_all_stacks(out=None) -> str:
    """Every live thread's stack, as text (also written to out if given)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"--- thread {names.get(ident, '?')} ({ident}) ---\n")
        parts.extend(traceback.format_stack(frame))
    text = "".join(parts)
    if out is not None:
        out.write(text)
        out.flush()
    return text


class Watchdog:
    """Context manager: dumps all stacks and exits the process (code 70) after `seconds`.

    The dump runs from faulthandler's C watchdog thread, so it fires even when every Python
    thread is stuck on a lock."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __enter__(self) -> "Watchdog":
        path = os.environ.get("KSTORE_WATCHDOG_DUMP")
        self._file = open(path, "a") if path else None
        faulthandler.dump_traceback_later(self.seconds, repeat=False,
                                          file=self._file or sys.stderr, exit=True)
        return self

    def __exit__(self, *exc) -> None:
        faulthandler.cancel_dump_traceback_later()
        if self._file is not None:
            self._file.close()


def join_all(threads, timeout: float) -> None:
    """Join threads within timeout in total; a thread still alive fails with every stack."""
    import time
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        raise AssertionError(f"threads still running after {timeout:.0f} s: {alive}\n"
                             + dump_all_stacks())


def run_threads(seconds: float, *targets) -> None:
    """Run each target(stop) on its own thread for about `seconds` (less if one fails), join
    them within 30 s (stacks dumped otherwise) and re-raise the first error on this thread."""
    stop = threading.Event()
    errors = []

    def wrap(fn):
        def run():
            try:
                fn(stop)
            except BaseException as e:      # re-raised on the caller's thread
                errors.append(e)
                stop.set()
        return run
    threads = [threading.Thread(target=wrap(t), name=f"t{i}", daemon=True) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    stop.wait(seconds)
    stop.set()
    join_all(threads, 30)
    if errors:
        raise errors[0]
