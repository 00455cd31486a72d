"""kstore.tools.progress: bars only on a terminal, erased when done; LogManager's loading progress."""
import io

import kstore
from kstore.tools.progress import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_silent_off_a_terminal():
    s = io.StringIO()
    with Progress("x", 100, "B", stream=s) as bar:
        bar.update(50)
        bar.update(50)
    assert s.getvalue() == "" and bar.done == 100


def test_drawn_on_a_terminal_and_erased(monkeypatch):
    monkeypatch.delenv("KSTORE_NO_PROGRESS", raising=False)
    s = Tty()
    with Progress("dumping", 2048, "B", stream=s, interval=0) as bar:
        bar.update(1024)
    out = s.getvalue()
    assert out.startswith("\rdumping [##############--------------]  50.0% 1.0 KiB/2.0 KiB ")
    assert out.endswith("\r\x1b[K")


def test_env_turns_bars_off_on_a_terminal(monkeypatch):
    monkeypatch.setenv("KSTORE_NO_PROGRESS", "1")
    s = Tty()
    with Progress("x", 10, stream=s, interval=0) as bar:
        bar.update(5)
    assert s.getvalue() == ""


def test_counter_without_total_shows_rate_and_note():
    bar = Progress("kstore bench", None, "phases", enabled=False)
    bar.update(3, note="sqlite writes")
    line = bar.line()
    assert line.startswith("kstore bench 3 phases ") and line.endswith("/s  sqlite writes")


def test_log_manager_reports_partitions_loaded(tmp_path):
    d = str(tmp_path / "s")
    with kstore.LogManager(d, {"log.cleaner.enable": False}) as m:
        m.create_topic("a", 3)
        m.create_topic("b", 2)
    calls = []
    with kstore.LogManager(d, {"log.cleaner.enable": False}, progress=lambda i, n: calls.append((i, n))):
        pass
    assert calls == [(1, 5), (2, 5), (3, 5), (4, 5), (5, 5)]
