"""One StoreReader shared by threads of a process, beside the store's writer in another process
(tests/writer_process.py): every thread gets the same Log of a partition, none is left open,
and concurrent refresh() calls after a topic's deletion and re-creation raise nothing."""
from __future__ import annotations

import os
import threading

import kstore
from thread_watchdog import join_all
from writer_process import WriterProcess

CFG = "{'segment.bytes': 1200, 'file.delete.delay.ms': 0}"
THREADS = 6


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _value(incarnation: int, offset: int) -> bytes:
    return b"e%d-o%d-" % (incarnation, offset) + b"v" * 30


def _append(w: WriterProcess, incarnation: int, start: int, n: int) -> None:
    recs = [(None, _value(incarnation, o)) for o in range(start, start + n)]
    w.run(*(f"lg.append({recs[i:i + 10]!r})" for i in range(0, n, 10)))


def _on_threads(fn, n: int = THREADS) -> list:
    """fn(i) on n threads released together; their results, in thread order (the first error
    re-raised here)."""
    bar = threading.Barrier(n)
    out: list = [None] * n
    errors: list = []

    def run(i: int) -> None:
        try:
            bar.wait(30)
            out[i] = fn(i)
        except BaseException as e:      # re-raised on the test's thread
            errors.append(e)
    ts = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(n)]
    for t in ts:
        t.start()
    join_all(ts, 60)
    if errors:
        raise errors[0]
    return out


def test_threads_first_use_of_a_partition_share_one_log_and_tail_it_exactly(tmp_path, watchdog):
    """Six threads ask a fresh StoreReader for the same partition at once, then each tails it
    with wait_for + read while the writer process appends 120 more records: every thread gets
    the same Log, reads offsets 0..199 exactly once each, in order, with the values written,
    and after close() no descriptor is left open. Before, each thread opened its own Log and
    five were never closed (their kept .log descriptors leaked, one per extra open)."""
    watchdog(120)
    root = str(tmp_path)
    w = WriterProcess(root, root)
    try:
        w.run(f"m.create_topic('t', 1, {CFG})", "lg = m.log('t', 0)")
        _append(w, 1, 0, 80)
        for _round in range(3):
            before = _fds()
            store = kstore.StoreReader(root)
            logs = _on_threads(lambda i, s=store: s.log("t", 0))
            assert all(lg is logs[0] for lg in logs)
            store.close()
            del logs
            assert _fds() == before
        store = kstore.StoreReader(root)
        end = 200

        def tail(i: int) -> list:
            lg, pos, got = store.log("t", 0), 0, []
            while pos < end:
                assert lg.wait_for(pos, timeout=30), f"thread {i}: no record {pos} in 30 s"
                for r in lg.read(pos, max_records=7):
                    got.append((r.offset, r.value))
                    pos = r.offset + 1
            return got
        out: list = []
        t = threading.Thread(target=lambda: out.append(_on_threads(tail)), daemon=True)
        t.start()
        _append(w, 1, 80, 120)
        join_all([t], 90)
        assert len(out) == 1 and len(out[0]) == THREADS
        for got in out[0]:
            assert got == [(o, _value(1, o)) for o in range(end)]
        store.close()
    finally:
        assert w.close() == 0


def test_concurrent_refreshes_after_a_re_creation_each_see_the_new_topic(tmp_path, watchdog):
    """A hundred times, the writer deletes the topic and creates it again; then six threads call refresh() on the
    StoreReader that had the old partition open, at once, and read it: each reads the new
    incarnation's records exactly, and the old Log is closed. Before, two threads dropping the
    same stale Log raised a raw KeyError."""
    watchdog(120)
    root = str(tmp_path)
    w = WriterProcess(root, root)
    try:
        w.run(f"m.create_topic('t', 1, {CFG})", "lg = m.log('t', 0)")
        _append(w, 1, 0, 20)
        for incarnation in range(2, 102):
            store = kstore.StoreReader(root)
            old = store.log("t", 0)
            assert [r.value for r in old.read(0)][:1] == [_value(incarnation - 1, 0)]
            w.run("m.delete_topic('t')", f"m.create_topic('t', 1, {CFG})", "lg = m.log('t', 0)")
            _append(w, incarnation, 0, 5)

            def look(i: int, s: kstore.StoreReader = store) -> list:
                s.refresh()
                return [(r.offset, r.value) for r in s.log("t", 0).read(0)]
            for got in _on_threads(look):
                assert got == [(o, _value(incarnation, o)) for o in range(5)]
            assert old.closed
            store.close()
    finally:
        assert w.close() == 0
