"""A store's one writer in a child process, driven statement by statement, so that tests can
put readers (threads, read-only logs and managers, `kstore consume --follow`) beside a real
second process and still decide exactly when it appends, rolls, truncates, deletes or compacts."""
from __future__ import annotations

import collections
import queue
import subprocess
import sys
import threading

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
    is sent: the store's one writer, beside readers in the test process.

    Every reply is waited for at most `timeout` seconds (per statement): a writer that does not
    answer is killed and the run fails with its stderr; one that dies or answers anything but
    "ok" (a statement raised) fails it the same way. Two daemon threads read the child's stdout
    (the replies) and stderr (its last lines kept for those messages)."""

    def __init__(self, log_dir, cwd, timeout: float = 120):
        self.timeout = timeout
        self.p = subprocess.Popen([sys.executable, "-c", WRITER, log_dir], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)
        self._replies: queue.Queue = queue.Queue()
        self._stderr: collections.deque = collections.deque(maxlen=200)
        self._pumps = [threading.Thread(target=self._pump, args=(self.p.stdout, self._replies.put),
                                        daemon=True, name="writer-stdout"),
                       threading.Thread(target=self._pump, args=(self.p.stderr, self._stderr.append),
                                        daemon=True, name="writer-stderr")]
        for t in self._pumps:
            t.start()

    @staticmethod
    def _pump(stream, put) -> None:
        """Hand each line of stream to put, then None at its end."""
        for line in stream:
            put(line)
        put(None)

    def stderr(self) -> str:
        """The child's last lines on stderr (all of them once it has exited)."""
        if self.p.poll() is not None:
            self._pumps[1].join(5)
        return "".join(x for x in list(self._stderr) if x is not None)

    def _fail(self, why: str) -> AssertionError:
        return AssertionError(f"{why}; the writer's stderr:\n{self.stderr()}")

    def run(self, *statements) -> None:
        for st in statements:
            try:
                self.p.stdin.write(st + "\n")
                self.p.stdin.flush()
            except (BrokenPipeError, OSError):
                self.p.wait(timeout=10)
                raise self._fail(f"{st!r}: the writer exited ({self.p.returncode})") from None
            try:
                reply = self._replies.get(timeout=self.timeout)
            except queue.Empty:
                self.p.kill()
                self.p.wait(timeout=10)
                raise self._fail(f"{st!r}: no reply from the writer in {self.timeout} s (killed)") from None
            if reply is None:
                self.p.wait(timeout=10)
                raise self._fail(f"{st!r}: the writer exited ({self.p.returncode})")
            if reply.strip() != "ok":
                raise self._fail(f"{st!r}: the writer answered {reply!r}")

    def close(self) -> int:
        """m.close() in the writer, then its exit code (at once if it has exited already)."""
        if self.p.poll() is None:
            self.run("m.close()")
            self.p.stdin.close()
        return self.p.wait(timeout=30)
