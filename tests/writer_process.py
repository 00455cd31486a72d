"""A store's one writer in a child process, driven statement by statement, so that tests can
put readers (threads, read-only logs and managers, `kstore consume --follow`) beside a real
second process and still decide exactly when it appends, rolls, truncates, deletes or compacts."""
from __future__ import annotations

import subprocess
import sys

WRITER = r"""
import sys, kstore
from kstore.manager import LogManager
from kstore.clock import MockTime
from kstore.scheduler import MockScheduler
NOW = 1_700_000_000_000
t = MockTime(NOW)
m = LogManager(sys.argv[1], {"log.segment.bytes": "1200", "log.segment.delete.delay.ms": "0",
                             "log.retention.check.interval.ms": "1000000000"},
               time=t, scheduler=MockScheduler(t))
for line in sys.stdin:
    exec(line)
    print("ok", flush=True)
"""


class WriterProcess:
    """A LogManager (mock clock and scheduler) in a child process that runs the statements it
    is sent: the store's one writer, beside readers in the test process."""

    def __init__(self, log_dir, cwd):
        self.p = subprocess.Popen([sys.executable, "-c", WRITER, log_dir], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=cwd)

    def run(self, *statements) -> None:
        for st in statements:
            self.p.stdin.write(st + "\n")
            self.p.stdin.flush()
            assert self.p.stdout.readline().strip() == "ok", st

    def close(self) -> int:
        self.run("m.close()")
        self.p.stdin.close()
        return self.p.wait(timeout=30)
