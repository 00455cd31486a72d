"""gc_pause: cyclic collection paused while log dirs load (LogDirLoader.load), shared by
concurrent loads and nested uses, and the collector left as the caller had it."""
import gc
import os
import threading

import pytest

import kstore
from kstore import gc_pause
from kstore.fileio import FileOps
from thread_watchdog import join_all


@pytest.fixture(autouse=True)
def _gc_on():
    was = gc.isenabled()
    gc.enable()
    yield
    assert not gc_pause.paused()
    (gc.enable if was else gc.disable)()


def test_pause_and_restore():
    with gc_pause.gc_paused():
        assert not gc.isenabled() and gc_pause.paused()
        with gc_pause.gc_paused():          # nested: still paused after the inner one ends
            assert not gc.isenabled()
        assert not gc.isenabled() and gc_pause.paused()
    assert gc.isenabled() and not gc_pause.paused()


def test_restored_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        with gc_pause.gc_paused():
            raise ZeroDivisionError
    assert gc.isenabled()


def test_a_caller_who_disabled_it_keeps_it_disabled():
    gc.disable()
    with gc_pause.gc_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_concurrent_loads_share_one_pause_until_the_last_ends(watchdog):
    watchdog(60)
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def a():
        with gc_pause.gc_paused():
            a_in.set()
            b_in.wait(10)
        a_out.set()

    def b():
        a_in.wait(10)
        with gc_pause.gc_paused():
            b_in.set()
            a_out.wait(10)
            seen["after_a"] = gc.isenabled()     # a ended first: b's load is still paused
    ts = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in ts:
        t.start()
    join_all(ts, 30)
    assert seen == {"after_a": False}
    assert gc.isenabled()


class _Seen(FileOps):
    """Records, at each partition listing, whether the collector was paused."""

    def __init__(self):
        self.paused = []

    def listdir(self, path):
        if os.path.basename(path).startswith("t-"):
            self.paused.append((gc.isenabled(), gc_pause.paused()))
        return super().listdir(path)


def test_manager_start_up_loads_with_the_collector_paused(tmp_path):
    d = str(tmp_path)
    with kstore.LogManager(d, {"log.cleaner.enable": "false"}) as m:
        m.create_topic("t", 3)
        for p in range(3):
            m.log("t", p).append([(b"k", b"v%d" % p, 1)])
    io = _Seen()
    with kstore.LogManager(d, {"log.cleaner.enable": "false"}, io=io) as m:
        assert gc.isenabled() and not gc_pause.paused()
        assert [m.log("t", p).log_end_offset for p in range(3)] == [1, 1, 1]
    assert io.paused and all(p == (False, True) for p in io.paused)


def test_log_dirs_loading_in_parallel_share_the_pause(tmp_path, watchdog):
    """A manager's log dirs load on parallel threads (and two managers start in two threads):
    every partition loads paused, and the collector is back on once all have loaded."""
    watchdog(120)
    roots = [[str(tmp_path / f"m{j}-d{i}") for i in range(2)] for j in range(2)]
    for dirs in roots:
        with kstore.LogManager(dirs, {"log.cleaner.enable": "false"}) as m:
            m.create_topic("t", 4)
            for p in range(4):
                m.log("t", p).append([(b"k", b"v%d" % p, 1)])
    seen = [_Seen(), _Seen()]
    ends = {}

    def start(j):
        with kstore.LogManager(roots[j], {"log.cleaner.enable": "false"}, io=seen[j]) as m:
            ends[j] = sorted(m.log("t", p).log_end_offset for p in range(4))
    ts = [threading.Thread(target=start, args=(j,)) for j in range(2)]
    for t in ts:
        t.start()
    join_all(ts, 60)
    assert ends == {0: [1, 1, 1, 1], 1: [1, 1, 1, 1]}
    assert all(len(s.paused) == 4 and all(p == (False, True) for p in s.paused) for s in seen)
    assert gc.isenabled() and not gc_pause.paused()


def test_a_child_forked_during_a_pause_has_the_collector_back_and_no_pause(watchdog):
    """The child inherits gc.disable() from the pause but none of the loads that would end it."""
    assert gc.isenabled()
    with gc_pause.gc_paused():
        assert not gc.isenabled()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            os.write(w, b"%d%d" % (int(gc.isenabled()), int(gc_pause.paused())))
            os._exit(0)
        os.close(w)
        got = os.read(r, 8)
        os.close(r)
        _, status = os.waitpid(pid, 0)
        assert not gc.isenabled()
        assert gc_pause.paused()
    assert got == b"10"
    assert os.WEXITSTATUS(status) == 0
    assert gc.isenabled() and not gc_pause.paused()
