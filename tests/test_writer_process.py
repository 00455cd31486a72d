"""tests/writer_process.py's WriterProcess bounds every wait for its child: a statement that
hangs, raises or kills the writer fails the run with the writer's stderr, never blocks it."""
import time

import pytest

from writer_process import WriterProcess


def test_replies_are_bounded_and_failures_carry_the_writers_stderr(tmp_path, watchdog):
    watchdog(120)
    d = str(tmp_path)
    w = WriterProcess(d, d, timeout=2)
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", "lg.append([(b'k', b'v')])")
        assert w.close() == 0                  # a clean close: exit code 0
    finally:
        if w.p.poll() is None:
            w.p.kill()

    w = WriterProcess(d, d, timeout=2)
    try:
        start = time.monotonic()
        with pytest.raises(AssertionError, match=r"no reply from the writer in 2 s \(killed\)"):
            w.run("import time; time.sleep(600)")
        assert time.monotonic() - start < 30
        assert w.p.poll() is not None and w.close() != 0
    finally:
        if w.p.poll() is None:
            w.p.kill()

    w = WriterProcess(d, d, timeout=30)
    try:
        with pytest.raises(AssertionError) as ei:
            w.run("raise ValueError('the statement failed: 42')")
        msg = str(ei.value)
        assert "the writer exited (1)" in msg and "ValueError: the statement failed: 42" in msg
        assert w.close() == 1
    finally:
        if w.p.poll() is None:
            w.p.kill()
