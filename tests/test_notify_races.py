"""Log.wait_for and wait_any of a read-only log (notify.py) beside the store's writer in another
process (tests/writer_process.py): what a waiter learns from the writer's page besides the log
end, and waits whose outcome depends on the exact interleaving of the two processes."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

import pytest

import kstore
from kstore import segment_ro
from kstore.errors import KStoreStateError, OffsetOutOfRangeError
from thread_watchdog import join_all
from writer_process import WriterProcess

CFG = "{'segment.bytes': 1200, 'file.delete.delay.ms': 0}"


def _value(incarnation: int, offset: int) -> bytes:
    return b"e%d-o%d-" % (incarnation, offset) + b"v" * 30


def _append(w: WriterProcess, incarnation: int, start: int, n: int) -> None:
    recs = [(None, _value(incarnation, o)) for o in range(start, start + n)]
    w.run(*(f"lg.append({recs[i:i + 10]!r})" for i in range(0, n, 10)))


@pytest.fixture
def writer(tmp_path):
    w = WriterProcess(str(tmp_path), str(tmp_path))
    w.run(f"m.create_topic('t', 1, {CFG})", "lg = m.log('t', 0)")
    yield w
    assert w.close() == 0


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    return t, out


@pytest.mark.parametrize("wait", ["wait_for", "wait_any"])
def test_a_waiter_learns_the_log_start_of_delete_records(tmp_path, writer, watchdog, wait):
    """The writer process deletes records up to 25 (inside a segment: only the page's log start
    hint says so; the log-start-offset checkpoint is not written) and appends, while a
    read-only log waits for offset 40: the woken waiter's log starts at 25, as the writer's,
    so a read below it raises OffsetOutOfRangeError (Kafka's answer to a fetch below the log
    start) and a read at it returns offsets 25..40 exactly. Before, the read-only log kept
    its start at the first segment's base and returned the deleted records."""
    watchdog(60)
    _append(writer, 1, 0, 40)
    with kstore.StoreReader(str(tmp_path)) as store:
        ro = store.log("t", 0)
        assert (ro.log_start_offset, ro.log_end_offset) == (0, 40)
        if wait == "wait_for":
            t, out = _in_thread(lambda: ro.wait_for(40, timeout=30))
        else:
            t, out = _in_thread(lambda: kstore.notify.wait_any([ro], [40], timeout=30))
        writer.run("lg.delete_records(25)")
        _append(writer, 1, 40, 1)
        join_all([t], 40)
        assert out == [True] if wait == "wait_for" else out == [[0]]
        assert (ro.log_start_offset, ro.log_end_offset) == (25, 41)
        with pytest.raises(OffsetOutOfRangeError):
            ro.read(24)
        assert [(r.offset, r.value) for r in ro.read(25)] == [(o, _value(1, o)) for o in range(25, 41)]
        # the checkpoint, written later, says the same
        writer.run("m.checkpoint_log_start_offsets()")
        store.refresh()
        assert store.offsets("t", 0) == (25, 41)


def test_a_start_hint_of_a_deleted_incarnation_is_not_applied_to_the_new_one(tmp_path, writer,
                                                                             watchdog):
    """A waiter whose log learnt the start 25 from delete_records; the writer deletes records to
    30, deletes the topic and makes it again with 3 records: the same read-only Log, waiting on
    (its first catch-up still on the old page, whose stamp moved: a full refresh, which lists
    the new directory), follows the new directory from its own start 0 (the old page's hint,
    30, is not the new log's) and reads 0..2 of the new incarnation exactly."""
    watchdog(60)
    _append(writer, 1, 0, 40)
    ro = kstore.Log.open(str(tmp_path / "t-0"), read_only=True)
    try:
        t, out = _in_thread(lambda: ro.wait_for(40, timeout=30))
        writer.run("lg.delete_records(25)")
        _append(writer, 1, 40, 1)
        join_all([t], 40)
        assert out == [True] and ro.log_start_offset == 25
        # the old page's stamp and start move again (to 30) before the topic goes
        writer.run("lg.delete_records(30)", "m.delete_topic('t')", f"m.create_topic('t', 1, {CFG})",
                   "lg = m.log('t', 0)")
        _append(writer, 2, 0, 3)
        # the new log ends at 3: a wait for 41 times out, having caught up on both pages
        assert ro.wait_for(41, timeout=1.5) is False
        assert (ro.log_start_offset, ro.log_end_offset) == (0, 3)
        got = [(r.offset, r.value) for r in ro.read(0)]
        assert got == [(o, _value(2, o)) for o in range(3)]
    finally:
        ro.close()


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_log_closed_while_its_waiter_catches_up_keeps_no_descriptor(tmp_path, writer, watchdog):
    """300 times: a read-only log, a thread waiting on it in 2 ms slices (each slice's catch-up
    a full refresh: the writer process appends, rolls and deletes records without pause), and
    this thread closing the log at a random moment. The waiter ends with KStoreStateError and
    no descriptor, mapping or kept-descriptor count outlives the closed logs. Before, a
    refresh that had passed the closed check when close() ran listed the segments again on the
    closed log and kept its last .log open (18 descriptors and KEPT slots leaked in 300), and a
    notification page mapped by the waiter's slice re-check while close() ran stayed mapped
    (one in two runs)."""
    watchdog(120)
    d = str(tmp_path / "t-0")
    _append(writer, 1, 0, 10)
    before, kept = _fds(), segment_ro.KEPT.count
    churn = ("def churn():\n while not stop.is_set():\n  lg.append([(None, b'x' * 100)])\n"
             "  if lg.log_end_offset % 100 == 0: lg.delete_records(lg.log_end_offset - 20)\n"
             "  time.sleep(0.0003)\n")
    writer.run("import threading, time; stop = threading.Event()", f"exec({churn!r})",
               "th = threading.Thread(target=churn, daemon=True); th.start()")
    rnd = random.Random(7)
    closed: list = []
    try:
        for _ in range(300):
            ro = kstore.Log.open(d, read_only=True)

            def wait_on(lg: kstore.Log = ro) -> str:
                try:
                    while True:
                        lg.wait_for(1 << 40, timeout=0.002)
                except KStoreStateError as e:
                    return str(e)
            t, out = _in_thread(wait_on)
            time.sleep(rnd.random() * 0.004)
            ro.close()
            join_all([t], 30)
            assert out == [f"log {d} is closed"]
            closed.append(ro)          # alive: what they hold is not freed by the collector
    finally:
        writer.run("stop.set(); th.join()")
    assert (_fds(), segment_ro.KEPT.count) == (before, kept)
    assert [ln for ln in open("/proc/self/maps") if d in ln] == []
    with pytest.raises(KStoreStateError, match="is closed"):
        closed[0].refresh()


def _parse(value: bytes) -> tuple[int, int]:
    """(generation, offset) a value names (b"g<generation>-o<offset>-...")."""
    g, o = value.split(b"-")[:2]
    return int(g[1:]), int(o[1:])


@pytest.mark.parametrize("tear", [False, True])
def test_waiters_in_threads_beside_a_writer_killed_and_restarted(tmp_path, watchdog, tear):
    """Three threads share a StoreReader's log and follow it with wait_for + read while the
    writer process appends, is killed -9 (tear: a torn batch then written past its last one,
    as a kill mid-copy leaves), restarted (recovery; the first change attaches its page) and
    truncates its last batch, four times. Every record a thread reads is one written at
    that offset, in offset order without a gap inside a read; a thread past a truncated end
    goes on at the new end (as a consumer resets); at the end every thread reaches the last
    offset and reads the log from 0 exactly as the writer left it."""
    watchdog(150)
    root = str(tmp_path)
    path = os.path.join(root, "t-0")
    ever: dict[int, set] = {}          # offset -> every value written there
    now: list[bytes] = []              # the log as the writer has it
    gen = 0
    errors: list = []
    stop = threading.Event()

    def write(w: WriterProcess, n: int) -> None:
        recs = []
        for _ in range(n):
            o = len(now)
            v = b"g%d-o%d-" % (gen, o) + b"v" * 30
            now.append(v)
            ever.setdefault(o, set()).add(v)
            recs.append((None, v))
        w.run(*(f"lg.append({recs[i:i + 5]!r})" for i in range(0, n, 5)))

    w = WriterProcess(root, root)
    w.run(f"m.create_topic('t', 1, {CFG})", "lg = m.log('t', 0)")
    write(w, 10)
    store = kstore.StoreReader(root)
    final: list = []

    def follow(i: int) -> None:
        lg, pos = store.log("t", 0), 0
        try:
            while not (final and pos >= final[0]):
                if not lg.wait_for(pos, timeout=0.2):
                    continue
                try:
                    recs = lg.read(pos, max_records=50)
                except OffsetOutOfRangeError:
                    assert pos > lg.log_end_offset, (pos, lg.log_start_offset, lg.log_end_offset)
                    pos = lg.log_end_offset            # truncated below pos: on at the new end
                    continue
                for k, r in enumerate(recs):
                    assert r.offset == pos + k, (i, pos, [x.offset for x in recs])
                    assert r.value in ever.get(r.offset, ()), (i, r.offset, r.value[:20])
                if recs:
                    pos = recs[-1].offset + 1
            got = lg.read(0, max_records=None)
            assert [r.value for r in got] == final[1]
        except BaseException as e:      # reported on the test's thread
            errors.append(e)
            stop.set()
    threads = [threading.Thread(target=follow, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    try:
        for _cycle in range(4):
            write(w, 30)
            w.p.kill()
            w.p.wait(timeout=30)
            if tear:
                with kstore.Log.open(path, read_only=True) as ro:
                    seg = ro.active_segment
                    with open(seg.log_path, "r+b") as f:
                        f.seek(seg.size)          # a batch header then garbage: torn mid-copy
                        f.write(b"\0\0\0\0\0\0\0\3\0\0\1\0" + b"\x55" * 40)
            w = WriterProcess(root, root)
            w.run("lg = m.log('t', 0)", f"assert lg.log_end_offset == {len(now)}, lg.log_end_offset",
                  "assert any(r.truncated_bytes and not r.tail_zero for r in lg.recovery_report) "
                  f"== {tear}, lg.recovery_report")
            gen += 1
            del now[-5:]                          # its last batch (whole batches, as Kafka)
            w.run(f"lg.truncate_to({len(now)})")
            assert not stop.is_set(), errors
        write(w, 10)
        final[:] = [len(now), list(now)]
        join_all(threads, 60)
    finally:
        stop.set()
        final[:] = final or [0, []]
        store.close()
        assert w.close() == 0
    if errors:
        raise errors[0]


ROLLS = {"size": "{'segment.bytes': 400}",
         "time": "{'segment.ms': 1000, 'segment.jitter.ms': 0}",
         "index_full": "{'segment.index.bytes': 32, 'index.interval.bytes': 1}"}


@pytest.mark.parametrize("roll", sorted(ROLLS))
def test_a_waiter_follows_every_record_across_rolls(tmp_path, watchdog, roll):
    """The writer process appends 60 one-record batches, rolling by size, by time (its clock
    moved 1.5 s before every fifth append) or because the offset index is full (4 entries),
    while a read-only log in this process waits for each next offset and reads it: every
    record is read once, at its offset, with its value, and the log has rolled at least 5
    times (the waiter's tail refresh meets a new active segment each time)."""
    watchdog(90)
    w = WriterProcess(str(tmp_path), str(tmp_path))
    try:
        w.run(f"m.create_topic('t', 1, {ROLLS[roll]})", "lg = m.log('t', 0)")
        ro = kstore.Log.open(str(tmp_path / "t-0"), read_only=True)

        def follow() -> list:
            got, pos = [], 0
            while pos < 60:
                assert ro.wait_for(pos, timeout=30), f"no record {pos} in 30 s"
                for r in ro.read(pos, max_records=1):
                    got.append((r.offset, r.value))
                    pos = r.offset + 1
            return got
        t, out = _in_thread(follow)
        for o in range(60):
            if roll == "time" and o % 5 == 4:
                w.run("t.sleep(1500)")
            w.run(f"lg.append([(None, {_value(1, o)!r})])")
        join_all([t], 60)
        assert out == [[(o, _value(1, o)) for o in range(60)]]
        assert len(ro.segments) >= 6
        ro.close()
    finally:
        assert w.close() == 0


SECOND_WRITER = r"""
import sys, kstore
from kstore.errors import LogDirLockedError
from kstore.manager import LogManager
root, how = sys.argv[1], sys.argv[2]
try:
    if how == "log":
        kstore.Log.open(root + "/t-0")
    else:
        LogManager(root)
except LogDirLockedError as e:
    print("refused", type(e).__name__)
else:
    print("accepted")
"""


@pytest.mark.parametrize("how", ["log", "manager"])
def test_a_second_writer_is_refused_without_touching_the_waiters_page(tmp_path, writer, watchdog, how):
    """While a read-only log waits for offset 10, another process tries to open the partition
    for writing (a standalone Log.open, or a LogManager on the log dir): it is refused with
    LogDirLockedError, the notification page is byte for byte as it was (no pid, stamp or hint
    written by the refused open), the waiter is still waiting, and the real writer's next
    append wakes it with exactly records 0..10."""
    watchdog(90)
    _append(writer, 1, 0, 10)
    path = tmp_path / "t-0"
    with kstore.Log.open(str(path), read_only=True) as ro:
        t, out = _in_thread(lambda: ro.wait_for(10, timeout=30))
        page = (path / ".kstore-notify").read_bytes()
        r = subprocess.run([sys.executable, "-c", SECOND_WRITER, str(tmp_path), how], cwd=str(tmp_path),
                           capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout) == (0, "refused LogDirLockedError\n"), r.stderr
        now = (path / ".kstore-notify").read_bytes()
        assert now[:12] + now[16:] == page[:12] + page[16:]   # (the word: the waiter's bit)
        assert t.is_alive() and out == []
        _append(writer, 1, 10, 1)
        join_all([t], 40)
        assert out == [True]
        assert [(r.offset, r.value) for r in ro.read(0)] == [(o, _value(1, o)) for o in range(11)]
