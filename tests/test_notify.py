"""Log.wait_for and notify.wait_any: the notification file, wake-ups by threads and processes,
timeouts, the writer's restart, roll, truncation, topic delete and re-create, hostile files,
many waiters, closed logs. No timing assertions beyond "returned before its timeout"."""
from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import kstore
from kstore import _notify, notify
from kstore.errors import KStoreStateError, UnknownTopicError
from kstore.notify import NOTIFY_FILE, wait_any
from kstore.reader import StoreReader
from thread_watchdog import join_all
from writer_process import WriterProcess


def header(path: str) -> tuple:
    """(magic, version, word, end hint, base hint, start hint, pid) of a notification file."""
    with open(os.path.join(path, NOTIFY_FILE), "rb") as f:
        return struct.unpack("=8sIIqqqq", f.read(48))


def later(seconds: float, fn) -> threading.Thread:
    t = threading.Thread(target=lambda: (time.sleep(seconds), fn()))
    t.start()
    return t


def test_the_writer_makes_the_notification_file_and_keeps_its_hints(tmp_path):
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path, {"segment.bytes": 200}) as lg:
        # a fresh partition's open makes it (one ring: the empty log's hints, a bump); a
        # partition that has one maps it at its first change or wait (test_notify_lazy.py)
        magic, version, word, end, base, start, pid = header(path)
        assert (magic, version, word, end, base, start, pid) == (b"KSNOTIFY", 1, 2, 0, 0, 0, os.getpid())
        assert os.path.getsize(os.path.join(path, NOTIFY_FILE)) == 4096
        lg.append([(b"k", b"v" * 50)])
        for _ in range(4):
            lg.append([(b"k", b"v" * 50)])
        # one bump per append, no waiter armed: the counter moved on, the bit is clear
        bases = [s.base_offset for s in lg.segments]
        _m, _v, word, end, base, start, _p = header(path)
        assert (word, end, base, start) == (word - word % 2, 5, bases[-1], 0)
        assert word >= 10 and len(bases) > 1      # each roll bumps as well
        lg.delete_records(3)
        assert header(path)[3:6] == (5, lg.segments[-1].base_offset, 3)
        lg.truncate_to(4)
        assert header(path)[3:6] == (4, lg.segments[-1].base_offset, 3)
    # a restarted writer maps the same file and goes on counting
    before = header(path)[2]
    ino = os.stat(os.path.join(path, NOTIFY_FILE)).st_ino
    with kstore.Log.open(path) as lg:
        assert header(path)[2] == before         # the open leaves the page alone
        lg.append([(b"k", b"v")])
        assert os.stat(os.path.join(path, NOTIFY_FILE)).st_ino == ino
        # the first append attaches (one ring) and bumps
        assert header(path)[2] == before + 4 and header(path)[3] == 5


def test_an_armed_word_is_cleared_by_the_next_bump():
    b = _notify.Bell.private()
    w = b.load()
    armed = b.arm()
    assert armed == w | 1 and b.load() == armed and b.arm() == armed
    b.bump_end(7, 0, 130)
    assert b.load() == (w | 1) + 1 and b.hints() == (7, 0, 0)
    assert b.tail() == (-1, 0, 130)            # a private page's stamp has no owner: unusable
    assert b.sleep(armed, 5.0) != 0            # the word changed: EAGAIN at once
    assert b.spin(b.load(), 0.001) is False


def test_woken_is_arm_then_the_end_hint_then_tail_in_one_call(tmp_path):
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path) as lg:
        lg.append([(b"k", b"v")] * 3)
        bell = lg.attach_bell()
        w = bell.load()
        woken = bell.woken()
        assert woken == (w | 1, 3, bell.tail()[0], 0, lg.active_segment.size)
        assert woken[2] > 0 and bell.load() == w | 1          # armed; a writer's stamp is usable
    b = _notify.Bell.private()
    b.bump_end(7, 0, 130)
    assert b.woken() == (b.load(), 7, -1, 0, 130)             # no owner: the stamp is -1
    b.close()
    assert b.woken() == (0, -1, -1, -1, -1)


def test_a_pre_wake_clears_the_waiter_bit_and_keeps_the_counter():
    b = _notify.Bell.private()
    w = b.load()
    assert b.prewake() is False and b.load() == w          # nobody armed: nothing changes
    armed = b.arm()
    assert b.prewake() is True and b.load() == armed & ~1   # the counter is the same
    assert b.prewake() is False and b.load() == armed & ~1
    assert b.sleep(armed, 5.0) == errno.EAGAIN             # the word changed: at once
    b.bump_end(9, 0, 130)                                  # the append's bump: counter + 1
    assert b.load() == (armed & ~1) + 2 and b.hints()[0] == 9


def _sleeper(b, armed: int, settle: float, seen: list) -> threading.Thread:
    def run():
        r = b.sleep(armed, 10.0, settle)
        seen.append((r, b.load()))
    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_sleeper_woken_by_a_pre_wake_settles_on_the_bump(watchdog):
    watchdog(60)
    b = _notify.Bell.private()
    armed = b.arm()
    seen: list = []
    t = _sleeper(b, armed, 5.0, seen)
    time.sleep(0.1)
    assert b.prewake() is True
    time.sleep(0.2)                    # the writer's append under way: the sleeper spins
    assert seen == []
    b.bump_end(3, 0, 200)
    join_all([t], 20)
    # it returned only after the bump (woken at the pre-wake, or EAGAIN if not asleep yet)
    assert seen[0][0] in (0, errno.EAGAIN) and seen[0][1] == (armed & ~1) + 2


def test_wait_any_woken_by_a_pre_wake_settles_on_the_bump(watchdog):
    # one wake-up per append for futex_waitv sleepers too (the async waiter, fetchers)
    watchdog(60)
    b1, b2 = _notify.Bell.private(), _notify.Bell.private()
    a1, a2 = b1.arm(), b2.arm()
    seen: list = []
    t = threading.Thread(target=lambda: seen.append(
        (_notify.wait_any([b1, b2], [a1, a2], 10.0, 5.0), b1.load(), b2.load())))
    t.start()
    time.sleep(0.1)
    assert b2.prewake() is True
    time.sleep(0.2)
    assert seen == []
    b2.bump_end(4, 0, 100)
    join_all([t], 20)
    r, w1, w2 = seen[0]
    if r != errno.ENOSYS:              # (a kernel without futex_waitv: the caller polls)
        assert r in (0, errno.EAGAIN) and (w1, w2) == (a1, (a2 & ~1) + 2)


def test_a_pre_wake_without_a_bump_ends_the_settling(watchdog):
    watchdog(60)
    b = _notify.Bell.private()
    armed = b.arm()
    seen: list = []
    t = _sleeper(b, armed, 0.05, seen)
    time.sleep(0.1)
    assert b.prewake() is True         # an append that then fails: no bump comes
    join_all([t], 20)
    assert seen[0][0] in (0, errno.EAGAIN) and seen[0][1] == armed & ~1


@pytest.mark.parametrize("read_only", [False, True])
def test_a_waiter_pre_woken_by_a_failed_append_still_wakes_on_the_next(tmp_path, watchdog,
                                                                      read_only):
    watchdog(60)
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path, {"max.message.bytes": 1000}) as lg, \
            kstore.Log.open(path, read_only=True) as ro:
        lg.append([(b"k", b"a")])
        waiter = ro if read_only else lg
        got: list = []
        t = threading.Thread(target=lambda: got.append(waiter.wait_for(1, timeout=20)))
        t.start()
        time.sleep(0.2)
        with pytest.raises(kstore.RecordTooLargeError):
            lg.append([(b"k", b"x" * 2000)])      # pre-wakes the waiter, then no bump
        time.sleep(0.2)
        assert got == [] and lg.log_end_offset == 1
        lg.append([(b"k", b"b")])
        join_all([t], 20)
        assert got == [True]
        assert [(r.offset, r.value) for r in waiter.read(1)] == [(1, b"b")]


def test_wait_for_returns_at_once_when_the_data_is_there(tmp_path):
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path) as lg, kstore.Log.open(path, read_only=True) as ro:
        lg.append([(b"k", b"v")] * 3)
        assert lg.wait_for(2, timeout=0) is True
        assert ro.wait_for(2, timeout=0) is True        # it refreshes first
        assert ro.log_end_offset == 3
        assert lg.wait_for(3, timeout=0) is False and ro.wait_for(3, timeout=0) is False


def test_wait_for_times_out(tmp_path, watchdog):
    watchdog(60)
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path) as lg, kstore.Log.open(path, read_only=True) as ro:
        for w in (lg, ro):
            t0 = time.monotonic()
            assert w.wait_for(0, timeout=0.05) is False
            assert time.monotonic() - t0 >= 0.05
            assert w.wait_for(0, timeout=0.05, spin=0.01) is False


@pytest.mark.parametrize("spin", [0.0, 0.2])
def test_wait_for_wakes_on_another_threads_append(tmp_path, watchdog, spin):
    watchdog(60)
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path) as lg, kstore.Log.open(path, read_only=True) as ro:
        lg.append([(b"k", b"a")])
        for waiter in (lg, ro):
            n = lg.log_end_offset
            t = later(0.1, lambda n=n: lg.append([(b"k", b"x%d" % n)]))
            assert waiter.wait_for(n, timeout=20, spin=spin) is True
            assert [r.value for r in waiter.read(n)] == [b"x%d" % n]
            join_all([t], 20)


def test_wait_for_wakes_on_another_process_append_roll_truncation_and_restart(tmp_path, watchdog):
    watchdog(120)
    d = str(tmp_path)
    w = WriterProcess(d, d)
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", "lg.append([(b'k', b'r0')])")
        with StoreReader(d) as store:
            ro = store.log("t", 0)
            assert ro.wait_for(0, timeout=0) is True

            def expect(offset, step, values):
                t = later(0.1, lambda: w.run(step))
                assert ro.wait_for(offset, timeout=20) is True
                join_all([t], 30)
                assert [r.value for r in ro.read(offset)] == values

            expect(1, "lg.append([(b'k', b'r1')])", [b"r1"])
            expect(2, "lg.roll(); lg.append([(b'k', b'r2')])", [b"r2"])
            assert ro.segments[-1].base_offset == 2
            # truncated below what the reader saw, then appended past it: new records
            expect(3, "lg.truncate_to(1); lg.append([(b'k', b'n1'), (b'k', b'n2'), (b'k', b'n3')])",
                   [b"n3"])
            assert [r.value for r in ro.read(1)] == [b"n1", b"n2", b"n3"]
            # the writer restarts: a new process maps the same file and keeps bumping it
            assert w.close() == 0
            w = WriterProcess(d, d)
            w.run("lg = m.log('t', 0)")
            expect(4, "lg.append([(b'k', b'after')])", [b"after"])
    finally:
        assert w.close() == 0


def test_a_waiter_notices_its_topic_deleted_and_re_created(tmp_path, watchdog, monkeypatch):
    watchdog(120)
    monkeypatch.setattr(notify, "SLICE_S", 0.2)
    d = str(tmp_path)
    w = WriterProcess(d, d)
    try:
        w.run("m.create_topic('t', 1)", "m.log('t', 0).append([(b'k', b'old')])")
        with StoreReader(d) as store:
            ro = store.log("t", 0)
            assert ro.wait_for(0, timeout=0) is True
            # deleted, nothing re-created: the wait notices within a slice
            t = later(0.1, lambda: w.run("m.delete_topic('t')"))
            with pytest.raises(UnknownTopicError):
                ro.wait_for(1, timeout=30)
            join_all([t], 30)
        w.run("m.create_topic('t', 1)", "m.log('t', 0).append([(b'k', b'new0')])")
        with StoreReader(d) as store:
            ro = store.log("t", 0)
            assert ro.wait_for(0, timeout=0) is True
            # deleted and re-created while waiting: the new file and segments are found
            t = later(0.1, lambda: w.run(
                "m.delete_topic('t'); m.create_topic('t', 1); "
                "m.log('t', 0).append([(b'k', b'a'), (b'k', b'b'), (b'k', b'c')])"))
            assert ro.wait_for(1, timeout=30) is True
            join_all([t], 30)
            assert [r.value for r in ro.read(0)] == [b"a", b"b", b"c"]
    finally:
        assert w.close() == 0


def _hostile(path: str, kind: str, outside: str) -> None:
    f = os.path.join(path, NOTIFY_FILE)
    if kind == "symlink":
        os.symlink(outside, f)
    elif kind == "short":
        with open(f, "wb") as fh:
            fh.write(b"KSNOTIFY")
    elif kind == "garbage":
        with open(f, "wb") as fh:
            fh.write(os.urandom(4096))
    elif kind == "directory":
        os.mkdir(f)
    elif kind == "fifo":
        os.mkfifo(f)


@pytest.mark.parametrize("kind", ["symlink", "short", "garbage", "directory", "fifo"])
def test_a_hostile_notification_file_is_refused_or_repaired(tmp_path, watchdog, kind):
    """Before the writer opens: it repairs a short or garbage file (its own kind of file) and
    refuses anything else (its threads still wake; readers in other processes poll)."""
    watchdog(60)
    path = str(tmp_path / "t-0")
    outside = str(tmp_path / "outside")
    with open(outside, "wb") as fh:
        fh.write(b"x" * 10)
    os.makedirs(path)
    _hostile(path, kind, outside)
    with kstore.Log.open(path) as lg, kstore.Log.open(path, read_only=True) as ro:
        f = os.path.join(path, NOTIFY_FILE)
        if kind in ("short", "garbage"):      # untouched until the first change or wait
            assert os.path.getsize(f) < 4096 or header(path)[:2] != (b"KSNOTIFY", 1)
        for waiter in (lg, ro):
            n = lg.log_end_offset
            t = later(0.05, lambda n=n: lg.append([(b"k", b"v%d" % n)]))
            assert waiter.wait_for(n, timeout=20) is True
            assert [r.value for r in waiter.read(n)] == [b"v%d" % n]
            join_all([t], 20)
        if kind in ("short", "garbage"):
            assert header(path)[:2] == (b"KSNOTIFY", 1)
            assert header(path)[3] == 2 and os.path.getsize(f) == 4096
    assert open(outside, "rb").read() == b"x" * 10       # never written through the symlink


@pytest.mark.parametrize("kind", ["garbage", "short", "symlink", "lying hints"])
def test_a_notification_file_spoiled_under_the_reader_is_outwaited_by_slicing(
        tmp_path, watchdog, monkeypatch, kind):
    """After the writer opened: the file replaced by garbage (the writer bumps the old one), or
    hints that always match the reader and a word that never moves: the wait still returns
    when data arrives (a poll, or the refresh every RECHECK_S)."""
    watchdog(60)
    monkeypatch.setattr(notify, "SLICE_S", 0.2)
    monkeypatch.setattr(notify, "RECHECK_S", 0.5)
    path = str(tmp_path / "t-0")
    outside = str(tmp_path / "outside")
    with open(outside, "wb") as fh:
        fh.write(os.urandom(8192))
    with kstore.Log.open(path) as lg, kstore.Log.open(path, read_only=True) as ro:
        lg.append([(b"k", b"a")])
        assert ro.wait_for(0, timeout=0) is True
        f = os.path.join(path, NOTIFY_FILE)
        if kind == "lying hints":
            # a second "writer" that never bumps: a fresh file whose hints equal the reader's
            # state and stay so
            tmp = f + ".x"
            with open(tmp, "wb") as fh:
                fh.write(struct.pack("=8sIIqqqq", b"KSNOTIFY", 1, 0, 1, 0, 0, 0).ljust(4096, b"\0"))
            os.replace(tmp, f)
            ro.wait_for(5, timeout=0.3)       # maps it
        else:
            os.unlink(f)
            _hostile(path, kind, outside)
        t = later(0.1, lambda: lg.append([(b"k", b"b")]))
        assert ro.wait_for(1, timeout=20) is True
        assert [r.value for r in ro.read(1)] == [b"b"]
        join_all([t], 20)


READER = textwrap.dedent("""
    import sys
    from kstore.reader import StoreReader
    with StoreReader(sys.argv[1]) as s:
        lg = s.log("t", 0)
        print("waiting", lg.log_end_offset, flush=True)
        ok = lg.wait_for(int(sys.argv[2]), timeout=60)
        print(ok, [r.value.decode() for r in lg.read(int(sys.argv[2]))], flush=True)
""")


def test_many_waiters_in_threads_and_processes_are_all_woken(tmp_path, watchdog):
    watchdog(120)
    d = str(tmp_path)
    path = os.path.join(d, "t-0")
    with kstore.Log.open(path) as lg:
        lg.append([(b"k", b"first")])
        env = dict(os.environ, PYTHONSAFEPATH="1")
        procs = [subprocess.Popen([sys.executable, "-c", READER, d, "1"], stdout=subprocess.PIPE,
                                  text=True, env=env) for _ in range(3)]
        try:
            for p in procs:
                assert p.stdout.readline().split() == ["waiting", "1"]
            results: list = []
            with StoreReader(d) as store:
                ro = store.log("t", 0)
                threads = [threading.Thread(target=lambda w=w: results.append(w.wait_for(1, timeout=60)))
                           for w in [lg] * 4 + [ro] * 4]
                for t in threads:
                    t.start()
                time.sleep(0.2)
                lg.append([(b"k", b"second")])
                join_all(threads, 60)
            assert results == [True] * 8
            for p in procs:
                out, _ = p.communicate(timeout=60)
                assert out.strip() == "True ['second']"
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(timeout=30)


def test_a_closed_logs_wait_raises(tmp_path, watchdog):
    watchdog(60)
    path = str(tmp_path / "t-0")
    for read_only in (False, True):
        lg = kstore.Log.open(path)
        ro = kstore.Log.open(path, read_only=True)
        waiter = ro if read_only else lg
        errors: list = []

        def wait(w=waiter, errors=errors):
            try:
                w.wait_for(0, timeout=30)
            except KStoreStateError as e:
                errors.append(str(e))
        t = threading.Thread(target=wait)
        t.start()
        time.sleep(0.1)
        waiter.close()
        join_all([t], 30)
        assert errors == [f"log {path} is closed"]
        with pytest.raises(KStoreStateError, match="is closed"):
            waiter.wait_for(0, timeout=0)
        lg.close()
        ro.close()


def test_wait_any_returns_the_logs_with_news(tmp_path, watchdog):
    watchdog(60)
    d = str(tmp_path)
    a = kstore.Log.open(os.path.join(d, "t-0"))
    b = kstore.Log.open(os.path.join(d, "t-1"))
    try:
        with StoreReader(d) as store:
            logs = [store.log("t", 0), store.log("t", 1)]
            assert wait_any(logs, [0, 0], timeout=0.05) == []
            t = later(0.1, lambda: b.append([(b"k", b"v")]))
            assert wait_any(logs, [0, 0], timeout=20) == [1]
            join_all([t], 20)
            a.append([(b"k", b"v")])
            assert wait_any(logs + [a], [0, 0, 5], timeout=0) == [0, 1]
    finally:
        a.close()
        b.close()


def test_a_read_only_waiter_refreshes_only_when_the_hints_show_news(tmp_path, watchdog, monkeypatch):
    """Idle slices compare the hints and refresh nothing (after the first catch-up's, which
    learns the page's list stamp); a close (which rings) changes no hint; one append is one
    refresh; RECHECK_S bounds how long a refresh can be skipped."""
    watchdog(60)
    monkeypatch.setattr(notify, "SLICE_S", 0.05)
    monkeypatch.setattr(notify, "RECHECK_S", 3600)
    path = str(tmp_path / "t-0")
    lg = kstore.Log.open(path)
    lg.append([(b"k", b"a")])
    with kstore.Log.open(path, read_only=True) as ro:
        calls: list = []
        plain, tail = ro.refresh, ro.refresh_tail
        ro.refresh = lambda *a, **kw: (calls.append(a), plain(*a, **kw))[1]
        ro.refresh_tail = lambda *a: (calls.append(a), tail(*a))[1]    # a woken waiter's
        assert ro.wait_for(1, timeout=0.3) is False and len(calls) == 1
        t = later(0.05, lambda: lg.append([(b"k", b"b")]))
        assert ro.wait_for(1, timeout=20) is True and len(calls) == 2
        join_all([t], 20)
        lg.close()                                 # rings; nothing new to learn
        assert ro.wait_for(2, timeout=0.2) is False and len(calls) == 2
        monkeypatch.setattr(notify, "RECHECK_S", 0.0)
        assert ro.wait_for(2, timeout=0.2) is False and len(calls) >= 3


def _mapped(path: str) -> bool:
    with open("/proc/self/maps") as f:
        return any(line.rstrip().endswith(path) for line in f)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc")
def test_a_closed_log_unmaps_its_notification_file_and_is_freed_without_a_cycle(tmp_path, watchdog):
    """A writable shared mapping holds the file open for writing (a read-only remount fails
    with EBUSY while it lasts): close unmaps it, in writers and in readers that waited."""
    import weakref
    watchdog(60)
    path = str(tmp_path / "t-0")
    f = os.path.join(path, NOTIFY_FILE)
    lg = kstore.Log.open(path)
    lg.append([(b"k", b"v")])
    ro = kstore.Log.open(path, read_only=True)
    assert ro.wait_for(0, timeout=0) is True and ro.wait_for(1, timeout=0.01) is False
    assert _mapped(f)
    ro.close()
    lg.close()
    assert not _mapped(f)
    gone = weakref.ref(lg)
    del lg
    assert gone() is None                  # freed at once: the notifier holds no cycle


def test_a_read_only_log_manager_waits_on_the_writers_appends(tmp_path, watchdog):
    watchdog(60)
    d = str(tmp_path)
    w = WriterProcess(d, d)
    try:
        w.run("m.create_topic('t', 2)", "m.log('t', 1).append([(b'k', b'a')])")
        with kstore.LogManager(d, read_only=True) as ro:
            lg = ro.log("t", 1)
            assert lg.read_only and lg.wait_for(0, timeout=0) is True
            t = later(0.1, lambda: w.run("m.log('t', 1).append([(b'k', b'b')])"))
            assert lg.wait_for(1, timeout=30) is True
            join_all([t], 30)
            assert [r.value for r in lg.read(1)] == [b"b"]
    finally:
        assert w.close() == 0
