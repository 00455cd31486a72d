"""The writer's notification page is attached lazily: a writable log's open leaves an existing
`.kstore-notify` alone (no byte written; a partition without one makes it at open, as
before), and its first change (append, roll,
truncation, a new log start) or first wait maps it, rewriting pid, list stamp and hints before
the change is made. Waiters of the previous incarnation are woken by the new writer's first
append; an open whose recovery cut a torn tail attaches at once (the stamp moves on before any
reader can rely on it); a file that cannot be used gives the same warning and private Bell as
an eager open did. Every wait is bounded; SLICE_S/RECHECK_S are raised so that only the word
can wake a sleeper in time (a wake by the slice would time the wait out instead)."""
from __future__ import annotations

import logging
import os
import signal
import struct
import subprocess
import sys
import textwrap
import threading

import pytest

import kstore
from kstore import notify
from kstore.fileio import FileOps
from kstore.notify import NOTIFY_FILE
from thread_watchdog import join_all


def page(path: str) -> dict:
    """The header fields of path's notification file (layout: _notify.pyx)."""
    with open(os.path.join(path, NOTIFY_FILE), "rb") as f:
        raw = f.read(72)
    magic, version, word, end, base, start, pid, size, stamp, owner = struct.unpack("=8sIIqqqqqqq", raw)
    return dict(magic=magic, word=word, end=end, base=base, start=start, pid=pid, size=size,
                stamp=stamp, owner=owner, raw=raw)


def page_bytes(path: str) -> bytes:
    with open(os.path.join(path, NOTIFY_FILE), "rb") as f:
        return f.read()


@pytest.fixture
def slices(monkeypatch):
    """Sleepers wake only by the word within a test's 20 s waits."""
    monkeypatch.setattr(notify, "SLICE_S", 60.0)
    monkeypatch.setattr(notify, "RECHECK_S", 60.0)


def _previous_incarnation(path: str) -> dict:
    """A log of offsets 0..2 whose writer attached its page and then died (no clean close)."""
    lg = kstore.Log.open(path, {"segment.bytes": 100_000})
    for i in range(3):
        lg.append([(b"k", b"v%d" % i)])
    lg.close_handlers()                 # as kill -9: no marker, the page keeps its bytes
    return page(path)


@pytest.mark.parametrize("first", ["append", "roll", "truncate_to", "delete_records", "wait"])
def test_the_open_leaves_the_page_alone_and_the_first_change_attaches(tmp_path, first):
    path = str(tmp_path / "t-0")
    _previous_incarnation(path)
    before = page_bytes(path)
    ino = os.stat(os.path.join(path, NOTIFY_FILE)).st_ino
    lg = kstore.Log.open(path, {"segment.bytes": 100_000})      # unclean: recovery ran
    try:
        assert page_bytes(path) == before                          # nothing written at open
        if first == "append":
            lg.append([(b"k", b"v3")])
        elif first == "roll":
            lg.roll()
        elif first == "truncate_to":
            lg.truncate_to(2)
        elif first == "delete_records":
            lg.delete_records(1)
        else:
            assert lg.wait_for(lg.log_end_offset, timeout=0) is False
        p = page(path)
        assert os.stat(os.path.join(path, NOTIFY_FILE)).st_ino == ino    # the same file, reused
        assert (p["magic"], p["pid"], p["owner"]) == (b"KSNOTIFY", os.getpid(), os.getpid())
        assert p["stamp"] > struct.unpack_from("=q", before, 56)[0]      # a new list stamp
        assert p["word"] > struct.unpack_from("=I", before, 12)[0]        # the word kept, bumped
        # the hints are this writer's now: exact end, active base, start, active size
        segs = lg.segments
        assert (p["end"], p["base"], p["start"], p["size"]) == (
            lg.log_end_offset, segs[-1].base_offset, lg.log_start_offset, segs[-1].size)
        assert p["end"] == {"append": 4, "roll": 3, "truncate_to": 2, "delete_records": 3,
                            "wait": 3}[first]
    finally:
        lg.close()


def test_a_partition_without_a_page_gets_one_at_open(tmp_path):
    """A fresh partition (or one whose page was removed) makes it at open, as before: readers
    find it and sleep on its word from the writer's first append on."""
    path = str(tmp_path / "t-0")
    with kstore.Log.open(path) as lg:
        p = page(path)
        assert (p["magic"], p["end"], p["base"], p["start"], p["pid"], p["owner"]) == (
            b"KSNOTIFY", 0, 0, 0, os.getpid(), os.getpid())
        lg.append([(b"k", b"a")])
    os.unlink(os.path.join(path, NOTIFY_FILE))
    with kstore.Log.open(path) as lg:
        p = page(path)
        assert (p["end"], p["base"], p["start"], p["size"], p["pid"]) == (
            1, 0, 0, lg.segments[-1].size, os.getpid())


def test_a_waiter_on_the_previous_writers_page_is_woken_by_the_first_append(tmp_path, watchdog,
                                                                             slices):
    """(a): a read-only waiter sleeping on the page since before the restart."""
    watchdog(60)
    path = str(tmp_path / "t-0")
    old = _previous_incarnation(path)
    with kstore.Log.open(path, read_only=True) as ro:
        assert ro.log_end_offset == 3
        out: list = []
        t = threading.Thread(target=lambda: out.append(ro.wait_for(3, timeout=20)))
        t.start()
        lg = kstore.Log.open(path)
        try:
            raw = page(path)["raw"]                  # still the dead writer's page (the
            assert raw[:12] + raw[16:] == old["raw"][:12] + old["raw"][16:]   # waiter bit aside)
            lg.append([(b"k", b"new")])
            join_all([t], 30)
            assert out == [True]
            assert [(r.offset, r.value) for r in ro.read(3)] == [(3, b"new")]
            assert ro.log_end_offset == 4
        finally:
            lg.close()


def test_a_waiter_arriving_before_the_first_append_sees_it(tmp_path, watchdog, slices):
    """(b): the reader opens and sleeps after the restart, before anything changed."""
    watchdog(60)
    path = str(tmp_path / "t-0")
    _previous_incarnation(path)
    lg = kstore.Log.open(path)
    try:
        with kstore.Log.open(path, read_only=True) as ro:
            assert ro.wait_for(3, timeout=0) is False
            out: list = []
            t = threading.Thread(target=lambda: out.append(ro.wait_for(3, timeout=20)))
            t.start()
            lg.append([(b"k", b"new"), (b"k", b"new2")])
            join_all([t], 30)
            assert out == [True]
            assert [(r.offset, r.value) for r in ro.read(3)] == [(3, b"new"), (4, b"new2")]
    finally:
        lg.close()


def test_a_reader_of_a_fresh_partition_sleeps_on_its_page_from_the_start(tmp_path, watchdog,
                                                                         slices):
    """(b) for a fresh partition: the writer's open made the page; the first append wakes."""
    watchdog(60)
    path = str(tmp_path / "t-0")
    lg = kstore.Log.open(path)
    try:
        assert page(path)["pid"] == os.getpid()
        with kstore.Log.open(path, read_only=True) as ro:
            out: list = []
            t = threading.Thread(target=lambda: out.append(ro.wait_for(0, timeout=20)))
            t.start()
            lg.append([(b"k", b"first")])
            join_all([t], 30)
            assert out == [True]
            assert [(r.offset, r.value) for r in ro.read(0)] == [(0, b"first")]
    finally:
        lg.close()


_CHILD = textwrap.dedent(r"""
    import os, signal, sys, kstore
    path, tear = sys.argv[1], sys.argv[2] == "tear"
    lg = kstore.Log.open(path)
    for i in range(3):
        lg.append([(b"k", b"v%d" % i)])
    print("ready", flush=True)
    sys.stdin.readline()
    if tear:           # a batch half written when the kill lands: past every hint
        seg = lg.segments[-1]
        with open(os.path.join(path, "%020d.log" % seg.base_offset), "r+b") as f:
            f.seek(seg.size)             # where the next batch goes (the zero runway's start)
            f.write(b"\0\0\0\0\0\0\0\3\0\0\1\0" + b"\x55" * 40)
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("tear", [False, True])
def test_a_writer_restarted_after_kill_9(tmp_path, watchdog, slices, tear):
    """(c) and (d) across processes: a writer killed (mid-append with tear); the reader in
    this process listed under the dead writer's stamp and sleeps on its page. Without a torn
    tail the new open leaves the page alone (its hints are still true: the log end the reader
    knows); with one, the recovery cut it and the open attached at once: new pid, new stamp,
    before any append. Either way the first append wakes the reader with exact offsets."""
    watchdog(90)
    path = str(tmp_path / "t-0")
    # cwd: not the checkout, whose unbuilt kstore/ would shadow the installed package (CI)
    child = subprocess.Popen([sys.executable, "-c", _CHILD, path, "tear" if tear else "-"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                             cwd=str(tmp_path))
    try:
        assert child.stdout.readline().strip() == "ready"
        dead = page(path)
        assert (dead["pid"], dead["owner"], dead["end"]) == (child.pid, child.pid, 3)
        with kstore.Log.open(path, read_only=True) as ro:
            assert ro.wait_for(2, timeout=0) is True        # listed under the child's stamp
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.wait(timeout=30) == -signal.SIGKILL
            out: list = []
            t = threading.Thread(target=lambda: out.append(ro.wait_for(4, timeout=20)))
            t.start()
            lg = kstore.Log.open(path)
            try:
                assert lg.log_end_offset == 3
                p = page(path)
                if tear:
                    rep = lg.recovery_report[-1]
                    assert rep.truncated_bytes > 0 and not rep.tail_zero and rep.valid_bytes == dead["size"]
                    assert (p["pid"], p["owner"]) == (os.getpid(), os.getpid())
                    assert p["stamp"] > dead["stamp"]
                    assert (p["end"], p["size"]) == (3, lg.segments[-1].size)
                else:
                    assert p["raw"][:12] + p["raw"][16:] == dead["raw"][:12] + dead["raw"][16:]
                    assert p["end"] <= lg.log_end_offset and p["size"] <= lg.segments[-1].size
                lg.append([(b"k", b"v3")])
                lg.append([(b"k", b"v4")])
                join_all([t], 30)
                assert out == [True]
                assert [(r.offset, r.value) for r in ro.read(0)] == [
                    (i, b"v%d" % i) for i in range(5)]
            finally:
                lg.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)


def test_waiters_beside_the_first_append_roll_and_truncation_in_threads(tmp_path, watchdog, slices):
    """Threads race the attach: a waiter's first wait against the writer's first append, roll
    and truncation: the page is mapped once, and every waiter wakes with the exact records."""
    watchdog(120)
    for i in range(25):
        path = str(tmp_path / f"t-{i}")
        lg = kstore.Log.open(path)
        try:
            go = threading.Barrier(4)
            out: list = []

            def wait(lg=lg, go=go, out=out):
                go.wait(10)
                out.append(lg.wait_for(0, timeout=20))

            def append(lg=lg, go=go):
                go.wait(10)
                lg.append([(b"k", b"a"), (b"k", b"b")])

            def roll(lg=lg, go=go):
                go.wait(10)
                lg.roll()

            threads = [threading.Thread(target=f) for f in (wait, wait, append, roll)]
            for t in threads:
                t.start()
            join_all(threads, 30)
            assert out == [True, True]
            assert [(r.offset, r.value) for r in lg.read(0)] == [(0, b"a"), (1, b"b")]
            p = page(path)
            assert (p["pid"], p["end"]) == (os.getpid(), 2)
            assert p["base"] == lg.segments[-1].base_offset
        finally:
            lg.close()


class _NoNotify(FileOps):
    """A disk that refuses the notification file (EACCES: root ignores file modes)."""

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if path.endswith(NOTIFY_FILE):
            raise PermissionError(13, "Permission denied", path)
        return super().open(path, flags, mode)


@pytest.mark.parametrize("kind", ["permission", "symlink", "directory", "fresh permission"])
def test_errors_of_the_first_attach_warn_then_and_leave_a_private_bell(tmp_path, watchdog, caplog,
                                                                      kind):
    """A page that cannot be used warns once, when it is first attached: at the first change
    (a page present) or at the open (none present), and leaves a private Bell."""
    watchdog(60)
    path = str(tmp_path / "t-0")
    os.makedirs(path)
    outside = str(tmp_path / "outside")
    with open(outside, "wb") as fh:
        fh.write(b"x" * 10)
    io = None
    if "permission" in kind:
        io = _NoNotify()
        if kind == "permission":
            open(os.path.join(path, NOTIFY_FILE), "wb").close()    # a page present: lazy
    elif kind == "symlink":
        os.symlink(outside, os.path.join(path, NOTIFY_FILE))
    else:
        os.mkdir(os.path.join(path, NOTIFY_FILE))
    with caplog.at_level(logging.WARNING, logger="kstore.notify"):
        lg = kstore.Log.open(path, io=io)
        try:
            warned = [r for r in caplog.records if "no notification file" in r.message]
            assert len(warned) == (1 if kind == "fresh permission" else 0)
            out: list = []
            t = threading.Thread(target=lambda: out.append(lg.wait_for(0, timeout=20)))
            t.start()
            lg.append([(b"k", b"a")])
            join_all([t], 30)
            assert out == [True]
            warned = [r for r in caplog.records if "no notification file" in r.message]
            assert len(warned) == 1 and path in warned[0].getMessage()
            lg.append([(b"k", b"b")])                    # tried once: no second warning
            assert len([r for r in caplog.records if "no notification file" in r.message]) == 1
            assert [r.value for r in lg.read(0)] == [b"a", b"b"]
        finally:
            lg.close()
    assert open(outside, "rb").read() == b"x" * 10


@pytest.mark.parametrize("close", ["close", "close_handlers"])
def test_a_loaded_writers_close_moves_the_word_even_without_a_change(tmp_path, close):
    """Another writer's open may recover and its close trims: a kept writer that checks the
    word before reusing its view of the files (offsets_topic._still_ours) must see it move,
    as it did when the page was mapped at open."""
    path = str(tmp_path / "t-0")
    before = _previous_incarnation(path)
    lg = kstore.Log.open(path, {"segment.bytes": 100_000})
    assert page(path)["raw"] == before["raw"]
    getattr(lg, close)()
    p = page(path)
    assert p["word"] >> 1 > before["word"] >> 1 and p["pid"] == os.getpid()
    assert (p["end"], p["base"], p["start"]) == (3, 0, 0)

