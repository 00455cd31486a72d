"""kstore.spark.read: a task's read of its offset range (read_range) when the writer, another
process, deletes the topic between two of the Arrow batches it yields: data loss, as Spark's
Kafka source reports a deleted topic (failOnDataLoss), never the store's own exception."""
import threading

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from kstore.errors import DataLossError  # noqa: E402
from kstore.spark import task_cache  # noqa: E402
from kstore.spark.options import ReadOptions  # noqa: E402
from kstore.spark.read import KStoreRange, read_range  # noqa: E402
from thread_watchdog import join_all  # noqa: E402
from writer_process import WriterProcess  # noqa: E402

SUBSET = pa.schema([pa.field("offset", pa.int64()), pa.field("value", pa.binary())])
#: records per partition: more than one Arrow batch of a task (iter_batches' 65,536 records)
N = 140_000
FIRST = 65_536


@pytest.fixture(autouse=True)
def empty_cache():
    task_cache.clear()
    yield
    task_cache.clear()


@pytest.mark.parametrize("fail_on_data_loss", ["false", "true"])
def test_a_topic_deleted_between_a_tasks_batches_is_data_loss(tmp_path, watchdog, caplog,
                                                             fail_on_data_loss):
    """Two tasks (threads) have each yielded their first batch of a partition when the writer
    deletes the topic: failOnDataLoss=false ends each read with a warning, true fails it with
    DataLossError. Before, both raised UnknownTopicError ("partition directory ... was
    deleted") from the next segment's open, which failed the streaming query either way."""
    watchdog(120)
    d = str(tmp_path / "s")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run("m.create_topic('t', 2, {'segment.bytes': 1 << 16})",
              f"[m.append_batch('t', p, [(None, b'p%d-%d' % (p, o)) for o in range(lo, lo + 1000)])"
              f" for p in (0, 1) for lo in range(0, {N}, 1000)]")
        opts = ReadOptions.parse({"path": d, "subscribe": "t", "failOnDataLoss": fail_on_data_loss},
                                 False)
        first: dict = {}
        rest: dict = {}
        ready = [threading.Event(), threading.Event()]
        deleted = threading.Event()

        def task(p: int) -> None:
            gen = read_range(opts, KStoreRange("t", p, 0, N), SUBSET)
            b = next(gen)
            first[p] = (b.column("offset").to_pylist(), b.column("value").to_pylist())
            ready[p].set()
            assert deleted.wait(60)
            try:
                rest[p] = [b.num_rows for b in gen]
            except DataLossError as e:
                rest[p] = e

        threads = [threading.Thread(target=task, args=(p,), name=f"task-{p}") for p in (0, 1)]
        for t in threads:
            t.start()
        assert all(e.wait(60) for e in ready)
        w.run("m.delete_topic('t')")
        deleted.set()
        join_all(threads, 60)
        for p in (0, 1):
            assert first[p] == (list(range(FIRST)), [b"p%d-%d" % (p, o) for o in range(FIRST)])
        if fail_on_data_loss == "false":
            assert rest == {0: [], 1: []}
            assert sorted(r.getMessage() for r in caplog.records if r.name == "kstore.spark") == [
                f"partition t-{p} no longer exists; skipping what is gone (failOnDataLoss=false)"
                for p in (0, 1)]
        else:
            for p in (0, 1):
                assert isinstance(rest[p], DataLossError)
                assert str(rest[p]) == (
                    f"partition t-{p} no longer exists. Some data may have been lost: retention "
                    "deleted it, or the partition was truncated or recreated. If you want the "
                    "query to go on, set the option 'failOnDataLoss' to false.")
    finally:
        assert w.close() == 0
