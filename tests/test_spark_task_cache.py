"""kstore.spark.task_cache: a Spark worker's reader and decode buffers reused from one task to
the next must read exactly what a fresh open would, whatever the writer (another process) did
in between: appends, rolls, retention, truncation, a topic deleted and created again; a failed
read never returns its reader to the cache; threads never share one; idle readers are closed."""
import os
import threading
import time

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from kstore.arrow import ColumnsPool, kafka_schema  # noqa: E402
from kstore.errors import DataLossError  # noqa: E402
from kstore.spark import task_cache  # noqa: E402
from kstore.spark.options import ReadOptions  # noqa: E402
from kstore.spark.read import KStoreRange, read_range  # noqa: E402
from thread_watchdog import join_all  # noqa: E402
from writer_process import WriterProcess  # noqa: E402

SUBSET = pa.schema([pa.field("offset", pa.int64()), pa.field("value", pa.binary())])


@pytest.fixture(autouse=True)
def empty_cache():
    task_cache.clear()
    yield
    task_cache.clear()


def rows(d, start, end, schema=SUBSET, partition=0, **opts):
    o = ReadOptions.parse({"path": d, "subscribe": "t", **opts}, False)
    out = []
    for b in read_range(o, KStoreRange("t", partition, start, end), schema):
        out += list(zip(*(b.column(n).to_pylist() for n in ("offset", "value"))))
    return out


def vals(lo, hi, tag="r"):
    return [(o, b"%s%d" % (tag.encode(), o)) for o in range(lo, hi)]


def append_stmt(lo, hi, tag="r"):
    return f"for o in range({lo}, {hi}): lg.append([(None, b'{tag}%d' % o)])"


def test_the_reader_is_reused_and_sees_every_change_of_the_writer(tmp_path, watchdog):
    """One cached reader across tasks (never two); after each of the writer's changes the next
    task reads exactly the records a fresh reader reads."""
    watchdog(90)
    d = str(tmp_path)
    w = WriterProcess(d, d)
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", append_stmt(0, 50))
        assert rows(d, 0, 50) == vals(0, 50)
        assert task_cache.idle_count() == 1
        first = task_cache._idle[(d,)][0].reader      # the same object serves the next tasks

        w.run(append_stmt(50, 120))                    # appends and rolls (1200-byte segments)
        assert rows(d, 40, 120) == vals(40, 120)

        w.run("lg.delete_records(70)", "lg.delete_old_segments()")     # retention
        start = min(o for o, _ in rows(d, 0, 120, failOnDataLoss="false"))
        assert 60 <= start <= 70
        assert rows(d, start, 120) == vals(start, 120)
        assert task_cache._idle[(d,)][0].reader is first
        with pytest.raises(DataLossError, match="are gone"):
            rows(d, 0, 120)
        assert task_cache.idle_count() == 0         # the failed read closed its reader
        assert first._logs == {}

        w.run("lg.truncate_to(100)", append_stmt(100, 110, "n"))   # truncation, other records
        assert rows(d, start, 110) == vals(start, 100) + vals(100, 110, "n")

        w.run("m.delete_topic('t')")
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", append_stmt(0, 5, "x"))
        # the same path, another directory: nothing of the old partition (its log start 60+)
        assert rows(d, 0, 5) == vals(0, 5, "x")
        assert task_cache.idle_count() == 1
    finally:
        w.close()


def test_threads_each_get_their_own_reader(tmp_path, watchdog):
    """Four threads reading at once while another process appends: every read is an exact
    prefix of what was written, no reader is used by two threads at a time (each checkout
    takes it out of the cache), and at most MAX_IDLE stay cached."""
    watchdog(120)
    d = str(tmp_path)
    w = WriterProcess(d, d)
    errors, in_use, lock = [], set(), threading.Lock()
    real_store = task_cache.store

    def checked_store(paths):
        cm = real_store(paths)

        class Guard:
            def __enter__(self):
                e = cm.__enter__()
                with lock:
                    assert id(e.reader) not in in_use, "a reader used by two reads at once"
                    in_use.add(id(e.reader))
                self.e = e
                return e

            def __exit__(self, *exc):
                with lock:
                    in_use.discard(id(self.e.reader))
                return cm.__exit__(*exc)
        return Guard()

    task_cache.store = checked_store
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", append_stmt(0, 20))
        stop = threading.Event()

        def reader():
            try:
                while not stop.is_set():
                    got = rows(d, 0, 1 << 40)
                    assert got == vals(0, len(got)) and len(got) >= 20
            except BaseException as e:       # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=reader, name=f"r{i}") for i in range(4)]
        for t in threads:
            t.start()
        for lo in range(20, 200, 20):
            w.run(append_stmt(lo, lo + 20))
        time.sleep(0.2)
        stop.set()
        join_all(threads, 60)
        assert errors == []
        assert rows(d, 0, 1 << 40) == vals(0, 200)
        assert 1 <= task_cache.idle_count() <= task_cache.MAX_IDLE
    finally:
        task_cache.store = real_store
        w.close()


def test_idle_readers_are_closed(tmp_path, monkeypatch, watchdog):
    watchdog(60)
    d = str(tmp_path)
    w = WriterProcess(d, d)
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", append_stmt(0, 10))
        monkeypatch.setattr(task_cache, "IDLE_SECONDS", 0.05)
        assert rows(d, 0, 10) == vals(0, 10)
        entry = task_cache._idle[(d,)][0]
        deadline = time.monotonic() + 20
        while task_cache.idle_count() and time.monotonic() < deadline:
            time.sleep(0.02)                     # the timer's sweep
        assert task_cache.idle_count() == 0
        assert entry.reader._logs == {}         # closed: its mappings and descriptors released
        assert rows(d, 0, 10) == vals(0, 10)     # a new one is opened
    finally:
        w.close()


def test_a_forked_child_starts_empty(tmp_path):
    d = str(tmp_path)
    w = WriterProcess(d, d)
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", append_stmt(0, 3))
        assert rows(d, 0, 3) == vals(0, 3)
        r, wfd = os.pipe()
        pid = os.fork()
        if pid == 0:        # pragma: no cover - the child reports through the pipe
            try:
                n = task_cache.idle_count()
                ok = rows(d, 0, 3) == vals(0, 3)
                os.write(wfd, b"%d %d" % (n, ok))
            finally:
                os._exit(0)
        os.close(wfd)
        out = os.read(r, 64)
        os.close(r)
        os.waitpid(pid, 0)
        assert out == b"0 1"
        assert task_cache.idle_count() == 1
    finally:
        w.close()


def test_columns_pool_never_hands_out_a_buffer_a_live_batch_uses():
    from kstore import _core
    pool = ColumnsPool(size=2)
    schema = kafka_schema()
    a = pool.take(schema)
    views = a.views()                   # a batch over a's memory is alive
    b = pool.take(schema)
    assert b is not a
    del views
    assert pool.take(schema) is a       # released: reused
    c1, c2 = pool.take(schema), pool.take(SUBSET)
    assert isinstance(c2, _core.Columns) and c2.values and not c2.keys and not c2.timestamps
    assert c1 is a                      # another kind has its own buffers
