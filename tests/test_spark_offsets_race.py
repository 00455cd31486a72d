"""The offsets-only read (a subset schema without key, value, timestamp and headers: rows from
batch headers) beside a writer in another process that appends, truncates, deletes records
(retention), compacts and deletes and recreates the topic, driven by another thread of this
process while reader threads plan and read as Spark's tasks do (the worker's cached reader
included). Every row returned is a record that existed: offsets below what was ever written,
strictly increasing (no duplicates); over a stable range (the writer held still) the rows are
exactly a full decode's offsets; and a read that fails raises a kstore exception naming the
topic-partition, never a raw OSError / IndexError (a SIGBUS would kill the run)."""
import random
import threading
import time
import traceback

import pytest

pytest.importorskip("pyspark")
pa = pytest.importorskip("pyarrow")

from pyspark.sql.types import IntegerType, LongType, StructField, StructType  # noqa: E402

from kstore.errors import KStoreError  # noqa: E402
from kstore.spark import KStoreDataSource, task_cache  # noqa: E402
from thread_watchdog import join_all  # noqa: E402
from writer_process import WriterProcess  # noqa: E402

OFFSETS_ONLY = StructType([StructField("partition", IntegerType()), StructField("offset", LongType())])
FULL = None                     # the fixed schema: every column decoded
CONFIG = "{'cleanup.policy': 'compact,delete', 'min.cleanable.dirty.ratio': '0.01'}"


def read_offsets(d, schema):
    """Plan and read as Spark would (driver's partitions(), each task's read()): the offsets
    of topic t's partition 0, in order."""
    reader = KStoreDataSource({"path": d, "subscribe": "t"}).reader(schema)
    out = []
    for part in reader.partitions():
        for b in reader.read(part):
            assert b.schema.names == (["partition", "offset"] if schema is not None else
                                      ["key", "value", "topic", "partition", "offset",
                                       "timestamp", "timestampType"])
            out += b.column("offset").to_pylist()
    return out


class Writer(threading.Thread):
    """Drives the writer process through random operations; holds `still` around each one, so
    a reader that takes `still` sees a store nobody changes."""

    def __init__(self, w, seconds):
        super().__init__(name="writer-driver")
        self.w, self.seconds, self.still = w, seconds, threading.Lock()
        self.appended = 0           # records appended over every incarnation of the topic
        self.ops: dict[str, int] = {}
        self.error = None

    def op(self, name, *statements):
        with self.still:
            self.w.run(*statements)
        self.ops[name] = self.ops.get(name, 0) + 1

    def run(self):
        rng = random.Random(17)
        try:
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                r = rng.random()
                if r < 0.55:
                    n = rng.choice([1, 5, 20])       # a batch fits a 1200-byte segment
                    self.appended += n
                    self.op("append", f"lg.append([(b'k%d' % (i % 9), b'v' * 30) for i in range({n})])")
                elif r < 0.67:
                    self.op("truncate", "lg.truncate_to(max(lg.log_start_offset, "
                                        f"lg.log_end_offset - {rng.randint(1, 20)}))")
                elif r < 0.79:
                    self.op("retention", f"lg.delete_records(max(lg.log_start_offset, "
                                         f"lg.log_end_offset - {rng.randint(10, 80)}))",
                            "lg.delete_old_segments()")
                elif r < 0.95:
                    self.op("compaction", "m.clean_now()")
                else:
                    self.op("delete", "m.delete_topic('t')", f"m.create_topic('t', 1, {CONFIG})",
                            "lg = m.log('t', 0)")
                time.sleep(0.002)
        except BaseException as e:      # noqa: BLE001 - reported by the test
            self.error = e


def test_offsets_only_reads_beside_a_writer_that_changes_everything(tmp_path, watchdog):
    watchdog(150)
    task_cache.clear()
    d = str(tmp_path)
    w = WriterProcess(d, d)
    failures: list[BaseException] = []
    counts = {"reads": 0, "rows": 0, "stable": 0, "errors": 0}
    try:
        w.run(f"m.create_topic('t', 1, {CONFIG})", "lg = m.log('t', 0)",
              "for _ in range(5): lg.append([(b'k%d' % (i % 9), b'v' * 30) for i in range(10)])")
        writer = Writer(w, seconds=12)
        writer.appended = 50
        stop = threading.Event()

        def check(offsets):
            assert offsets == sorted(set(offsets)), "offsets repeated or out of order"
            assert all(0 <= o < writer.appended for o in offsets), \
                f"an offset past every record written ({writer.appended})"

        def free_reader():
            """Offsets-only reads with the writer running."""
            while not stop.is_set():
                try:
                    offs = read_offsets(d, OFFSETS_ONLY)
                    check(offs)
                    counts["reads"] += 1
                    counts["rows"] += len(offs)
                except KStoreError as e:
                    counts["errors"] += 1
                    if "t-0" not in str(e):
                        failures.append(AssertionError(f"does not name t-0: {e!r}"))
                except BaseException as e:      # noqa: BLE001 - raw OSError, IndexError, ...
                    failures.append(e)
                    return

        def stable_reader():
            """With the writer held still: offsets-only rows == a full decode's offsets."""
            while not stop.is_set():
                with writer.still:
                    try:
                        a = read_offsets(d, OFFSETS_ONLY)
                        b = read_offsets(d, FULL)
                    except BaseException as e:  # noqa: BLE001 - nothing changes under it
                        failures.append(e)
                        return
                try:
                    check(a)
                    assert a == b, f"offsets-only {len(a)} rows, full decode {len(b)}"
                    counts["stable"] += 1
                except AssertionError as e:
                    failures.append(e)
                    return
                time.sleep(0.01)

        readers = [threading.Thread(target=free_reader, name="free-0"),
                   threading.Thread(target=free_reader, name="free-1"),
                   threading.Thread(target=stable_reader, name="stable")]
        for t in readers + [writer]:
            t.start()
        join_all([writer], 100)
        stop.set()
        join_all(readers, 40)
        assert writer.error is None, writer.error
        assert failures == [], "".join(traceback.format_exception(failures[0]))
        # every kind of change happened, and reads ran through them
        assert set(writer.ops) == {"append", "truncate", "retention", "compaction", "delete"}, writer.ops
        assert counts["reads"] >= 20 and counts["stable"] >= 5 and counts["rows"] > 0, counts
        # at rest, after 10 more records: exactly the full decode's offsets, ending with them
        leo_file = tmp_path.parent / (tmp_path.name + ".leo")       # outside the log dir
        w.run("lg.append([(b'k%d' % i, b'end') for i in range(10)])",
              f"open({str(leo_file)!r}, 'w').write(str(lg.log_end_offset))")
        leo = int(leo_file.read_text())
        final = read_offsets(d, OFFSETS_ONLY)
        assert final == read_offsets(d, FULL)
        assert final[-10:] == list(range(leo - 10, leo))
        print("offsets race:", counts, writer.ops)
    finally:
        w.close()
        task_cache.clear()
