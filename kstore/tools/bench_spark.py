"""`kstore bench --spark`: Spark reading a kstore topic against the same rows in Parquet, and
the rate of writing a DataFrame into a topic, in one local SparkSession.

Workload: N records (default 1,000,000) of 16-byte keys and 100-byte values in P partitions
(default 2, one per core of local[2]). The read job is the same for every source: every column
of every row through Spark's `noop` sink. Three sources are read in the same session:

- kstore: the `kstore` format, decoding the segments in each task;
- parquet: the same seven columns, one file per partition, written by pyarrow;
- ceiling: the very batches kstore's tasks yield, saved beforehand as Arrow IPC files and
  replayed through a memory map by a Python data source, one task per partition. It is what
  Spark's Python data source path costs with no decoding at all (Spark copies each Arrow batch
  into rows in the JVM), so kstore / ceiling shows how much of a read is kstore's own work.

The count query, `groupBy("partition").count()`, runs over kstore with its fixed schema (every
column decoded), over kstore with the subset schema ``partition int`` (only batch headers read)
and over the Parquet copy.

Each source is read at least `warmup` times first (JIT, Python workers, page cache, the
workers' cached readers), and more, up to `max_warmup`, while the last round's kstore or
ceiling time still fell more than 5% below every earlier round's: the timings have stopped
falling when the runs start (`warmup_rounds` says how many it took, `warmup_*_s` the times).
Figures are medians of `repeats` runs after that, and ratios are of medians from the same run.

Per core, two ways: by wall time (records / median wall seconds / cores) and by CPU time
(records / median CPU seconds of the JVM and its Python workers during the run, i.e. records per
CPU-second spent anywhere in Spark), which another load on a shared machine distorts less: it
does not count the time a task waits for a core. `load_avg` gives the 1-minute load average
before and after the read runs.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import IO, Optional

import kstore
from kstore.tools.workload import BASE_TS, VALUE, key
from kstore.arrow import kafka_schema
from kstore.config import NO_LIMIT
from kstore.errors import UnusableFileError
from kstore.fileio import get_file_ops
from kstore.spark import SCHEMA_DDL

try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("kstore bench --spark needs PySpark: pip install 'kstore[spark]'") from e


class _ArrowFile(InputPartition):
    def __init__(self, path: str):
        self.path = path


class CeilingReader(DataSourceReader):
    """Replays Arrow IPC files through a memory map: batches reach Spark with no decoding."""

    def __init__(self, path: str):
        self.path = path

    def partitions(self):
        return [_ArrowFile(os.path.join(self.path, f)) for f in sorted(os.listdir(self.path))]

    def read(self, partition: InputPartition):
        import pyarrow as pa
        if not isinstance(partition, _ArrowFile):
            return      # Spark's one empty InputPartition(None) when there are no files
        with pa.memory_map(partition.path) as source:
            f = pa.ipc.open_file(source)
            for i in range(f.num_record_batches):
                yield f.get_batch(i)


class CeilingDataSource(DataSource):
    """Format ``kstore_bench_ceiling``: the kstore ranges' batches, already decoded into Arrow
    IPC files (one per partition, same rows and batch sizes), through the same Python data
    source path. What that path costs with no decoding at all."""

    @classmethod
    def name(cls) -> str:
        return "kstore_bench_ceiling"

    def schema(self) -> str:
        return SCHEMA_DDL

    def reader(self, schema) -> CeilingReader:
        return CeilingReader(self.options["path"])


def _session(cores: int):
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYTHONSAFEPATH", "1")   # workers import the installed kstore
    from pyspark.sql import SparkSession
    from kstore.spark import register
    spark = (SparkSession.builder.master(f"local[{cores}]").appName("kstore-bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(cores))
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def _build(root: str, n: int, partitions: int) -> str:
    """The topic, then its rows as Parquet (one file per partition) and as the ceiling's Arrow
    IPC files (the batches kstore's tasks yield)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from kstore.arrow import iter_batches
    store = os.path.join(root, "store")
    with kstore.LogManager(store, {"log.segment.bytes": 256 << 20}) as m:
        m.create_topic("bench", partitions)
        per = n // partitions
        for p in range(partitions):
            lg = m.log("bench", p)
            for s in range(0, per, 1000):
                lg.append([(key(i), VALUE, BASE_TS + i) for i in range(s, min(per, s + 1000))])
    for d in ("parquet", "ceiling"):
        os.makedirs(os.path.join(root, d))
    with kstore.StoreReader(store) as r:
        for p in range(partitions):
            batches = list(iter_batches(r.log("bench", p), "bench", p, 0, NO_LIMIT))
            pq.write_table(pa.Table.from_batches(batches),
                           os.path.join(root, "parquet", f"part-{p}.parquet"))
            with pa.OSFile(os.path.join(root, "ceiling", f"part-{p}.arrow"), "wb") as f, \
                    pa.ipc.new_file(f, kafka_schema()) as w:
                for b in batches:
                    w.write_batch(b)
    return store


def _fingerprint(df) -> tuple:
    """Row count and sums over every column: the sources must agree on all of them."""
    from pyspark.sql import functions as F
    row = df.agg(F.count("*"), F.sum("offset"), F.sum("partition"), F.sum("timestampType"),
                 F.sum(F.unix_micros("timestamp").cast("decimal(38,0)")), F.sum(F.crc32("key")),
                 F.sum(F.crc32("value")), F.sum(F.crc32(F.col("topic").cast("binary")))).first()
    return tuple(row)


def _tree_cpu(root: int) -> dict[int, tuple[int, bool]]:
    """pid -> (CPU clock ticks: user + system with the reaped children's, whether it is a Python
    process) of root's descendants: the JVM that Spark's session runs in and the Python workers
    under it (the driver excluded)."""
    io = get_file_ops()
    for _ in range(20):
        stats = _proc_stats(io)
        tree = _descendants(root, stats)
        # a process that exited and was reaped during the scan may be counted twice (its own
        # line, then in its parent's cutime): scan again until none of the tree went away
        if all(io.exists(f"/proc/{pid}") for pid in tree):
            break
    return {pid: (stats[pid][1], stats[pid][2].startswith("python")) for pid in tree}


def _cpu_between(before: dict[int, tuple[int, bool]], after: dict[int, tuple[int, bool]]
                 ) -> tuple[float, float]:
    """(CPU seconds of the tree, of its Python processes) from one scan to the next, per
    process: what each one still there used meanwhile, all of a new one's. A process gone by
    the second scan is left out (a worker Spark stopped: its time may have gone with it, as
    pyspark's daemon does not wait for its workers), so a run never reads negative."""
    tick = os.sysconf("SC_CLK_TCK")
    total = py = 0
    for pid, (t, is_py) in after.items():
        d = max(0, t - before.get(pid, (0, is_py))[0])
        total += d
        py += d if is_py else 0
    return total / tick, py / tick


def _proc_stats(io) -> dict[int, tuple[int, int, str]]:
    """pid -> (ppid, utime + stime + cutime + cstime in clock ticks, command) of every process."""
    stats = {}
    for name in io.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = io.read_file(f"/proc/{name}/stat").decode("ascii", "replace")
        except (OSError, UnusableFileError):
            continue        # exited meanwhile
        f = text[text.rindex(")") + 2:].split()
        # fields after the command: state ppid ... utime(12) stime(13) cutime(14) cstime(15)
        comm = text[text.find("(") + 1:text.rindex(")")]
        stats[int(name)] = (int(f[1]), sum(int(x) for x in f[11:15]), comm)
    return stats


def _descendants(root: int, stats: dict[int, tuple[int, int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _t, _c) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _timed(fn) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the session's JVM and Python workers, of the Python
    workers alone) of fn()."""
    me = os.getpid()
    before = _tree_cpu(me)
    t0 = time.perf_counter()
    fn()
    t = time.perf_counter() - t0
    return (t, *_cpu_between(before, _tree_cpu(me)))


def _warm(fns: dict, warmup: int, max_warmup: int, watch: tuple[str, ...]) -> dict[str, list[float]]:
    """Run every fn at least `warmup` rounds, and on while the last round's time of a watched
    one fell more than 5% below its best earlier round (up to max_warmup rounds)."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(max(warmup, 0) and max_warmup):
        for name, fn in fns.items():
            times[name].append(_timed(fn)[0])
        if i + 1 >= warmup and all(times[w][-1] >= 0.95 * min(times[w][:-1], default=0)
                                   for w in watch):
            break
    return times


def run(n: int = 1_000_000, partitions: int = 2, cores: int = 2, repeats: int = 5,
        warmup: int = 3, dir_: Optional[str] = None, quiet: bool = False, spark=None,
        max_warmup: int = 15) -> dict:
    """Build the data, measure, clean up. With `spark` given, runs in that session (with the
    kstore source registered) and leaves it running; otherwise starts local[cores] and stops it."""
    root = tempfile.mkdtemp(prefix="kstore-spark-bench-", dir=dir_)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    try:
        say(f"building {n:,} records in {partitions} partitions and their Parquet copy ...")
        store = _build(root, n, partitions)
        own = spark is None
        if own:
            say(f"starting local[{cores}] ...")
            spark = _session(cores)
        try:
            spark.dataSource.register(CeilingDataSource)
            sources = {
                "kstore": spark.read.format("kstore").option("subscribe", "bench").load(store),
                "parquet": spark.read.parquet(os.path.join(root, "parquet")),
                "ceiling": spark.read.format(CeilingDataSource.name())
                .load(os.path.join(root, "ceiling")),
            }
            rows = n // partitions * partitions
            prints = {name: _fingerprint(df) for name, df in sources.items()}
            if len(set(prints.values())) != 1 or prints["kstore"][0] != rows:
                raise AssertionError(f"the sources differ (expected {rows:,} rows): {prints}")

            def read(df):
                return lambda: df.write.format("noop").mode("overwrite").save()

            warm = _warm({name: read(df) for name, df in sources.items()}, warmup, max_warmup,
                         ("kstore", "ceiling"))
            say(f"  {len(warm['kstore'])} warm-up rounds: kstore "
                + " ".join(f"{t:.2f}" for t in warm["kstore"]) + " s; ceiling "
                + " ".join(f"{t:.2f}" for t in warm["ceiling"]) + " s")
            load0 = os.getloadavg()[0]
            times: dict = {name: [] for name in sources}
            cpu: dict = {name: [] for name in sources}
            py_cpu: dict = {name: [] for name in sources}
            for i in range(repeats):        # interleaved, so drift in the host hits all alike
                for name, df in sources.items():
                    t, c, py = _timed(read(df))
                    times[name].append(t)
                    cpu[name].append(c)
                    py_cpu[name].append(py)
                say(f"  read run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s ({cpu[k][-1]:.2f} "
                                                        "CPU s)" for k, v in times.items()))
            load1 = os.getloadavg()[0]
            # the count query, groupBy(partition).count(): kstore with its fixed schema (every
            # column decoded), kstore with the subset schema "partition int" (offsets from batch
            # headers only) and Parquet (which reads only that column)
            counts = {
                "kstore": sources["kstore"],
                "kstore_subset": spark.read.format("kstore").option("subscribe", "bench")
                .schema("partition int").load(store),
                "parquet": sources["parquet"],
            }

            def count(df):
                return lambda: df.groupBy("partition").count().collect()

            per = {tuple(sorted(tuple(r) for r in count(df)())) for df in counts.values()}
            if len(per) != 1 or sum(c for _p, c in next(iter(per))) != rows:
                raise AssertionError(f"the count queries differ (expected {rows:,} rows): {per}")
            _warm({name: count(df) for name, df in counts.items()}, warmup, max_warmup,
                  ("kstore", "kstore_subset"))
            c_times: dict = {name: [] for name in counts}
            for i in range(repeats):
                for name, df in counts.items():
                    c_times[name].append(_timed(count(df))[0])
                say(f"  count run {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s"
                                                        for k, v in c_times.items()))
            # the write source is cached, so the write runs time the sink, not a Parquet scan
            src = sources["parquet"].select("key", "value").repartition(cores).cache()
            src.count()
            w_times = []
            for i in range(repeats):
                w = (src.write.format("kstore").mode("append").option("topic", f"out{i}")
                     .option("kstore.num.partitions", str(partitions)))
                w_times.append(_timed(lambda w=w: w.save(store))[0])
                say(f"  write run {i + 1}: {w_times[-1]:.2f} s")
        finally:
            if own:
                spark.stop()
        k, p, c, w = (statistics.median(t) for t in
                      (times["kstore"], times["parquet"], times["ceiling"], w_times))
        ck, cs, cp = (statistics.median(c_times[x]) for x in ("kstore", "kstore_subset", "parquet"))
        kc, pc, cc = (statistics.median(cpu[x]) for x in ("kstore", "parquet", "ceiling"))
        return {
            "records": rows, "partitions": partitions, "cores": cores, "warmup": warmup,
            "warmup_rounds": len(warm["kstore"]), "warmup_kstore_s": warm["kstore"],
            "warmup_ceiling_s": warm["ceiling"], "warmup_parquet_s": warm["parquet"],
            "load_avg": [load0, load1],
            "kstore_read_cpu_s": cpu["kstore"], "parquet_read_cpu_s": cpu["parquet"],
            "ceiling_read_cpu_s": cpu["ceiling"], "kstore_read_py_cpu_s": py_cpu["kstore"],
            "parquet_read_py_cpu_s": py_cpu["parquet"], "ceiling_read_py_cpu_s": py_cpu["ceiling"],
            "kstore_read_rec_cpu_s": rows / kc, "parquet_read_rec_cpu_s": rows / pc,
            "ceiling_read_rec_cpu_s": rows / cc, "kstore_over_ceiling_cpu": cc / kc,
            "kstore_over_parquet_cpu": pc / kc,
            "kstore_read_s": times["kstore"], "parquet_read_s": times["parquet"],
            "ceiling_read_s": times["ceiling"], "kstore_write_s": w_times,
            "kstore_read_rec_s": rows / k, "kstore_read_rec_s_per_core": rows / k / cores,
            "parquet_read_rec_s": rows / p, "ceiling_read_rec_s": rows / c,
            "kstore_over_parquet": p / k, "kstore_over_ceiling": c / k,
            "ceiling_over_parquet": p / c, "kstore_write_rec_s": rows / w,
            "kstore_count_s": c_times["kstore"], "kstore_count_subset_s": c_times["kstore_subset"],
            "parquet_count_s": c_times["parquet"],
            "kstore_count_rec_s": rows / ck, "kstore_count_subset_rec_s": rows / cs,
            "parquet_count_rec_s": rows / cp,
            "kstore_count_over_parquet": cp / ck, "kstore_count_subset_over_parquet": cp / cs,
            "count_subset_speedup": ck / cs,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_report(out: dict, file: IO[str] = sys.stdout) -> None:
    p = lambda *a: print(*a, file=file)   # noqa: E731
    p(f"Spark local[{out['cores']}], {out['records']:,} records (100-byte values), "
      f"{out['partitions']} partitions; medians of {len(out['kstore_read_s'])} runs after "
      f"{out['warmup']} warm-up runs")
    p(f"  warm-up rounds: {out['warmup_rounds']} (kstore "
      + " ".join(f"{t:.2f}" for t in out["warmup_kstore_s"]) + " s); load average "
      f"{out['load_avg'][0]:.1f} -> {out['load_avg'][1]:.1f}")
    p(f"  read kstore : {out['kstore_read_rec_s']:,.0f} rec/s "
      f"({out['kstore_read_rec_s_per_core']:,.0f} per core by wall time, "
      f"{out['kstore_read_rec_cpu_s']:,.0f} per CPU-second)")
    p(f"  Python workers' CPU per read (medians): kstore "
      f"{statistics.median(out['kstore_read_py_cpu_s']):.3f} s, ceiling "
      f"{statistics.median(out['ceiling_read_py_cpu_s']):.3f} s (the rest is the JVM's)")
    p(f"  read parquet: {out['parquet_read_rec_s']:,.0f} rec/s")
    p(f"  read ceiling: {out['ceiling_read_rec_s']:,.0f} rec/s (Spark's Python data source path, "
      f"no decoding)")
    p(f"  kstore / parquet : {out['kstore_over_parquet']:.2f}x")
    p(f"  kstore / ceiling : {out['kstore_over_ceiling']:.2f}x by wall time, "
      f"{out['kstore_over_ceiling_cpu']:.2f}x by CPU time")
    p(f"  ceiling / parquet: {out['ceiling_over_parquet']:.2f}x (the most any Python data source "
      f"reaches here)")
    p(f"  write kstore: {out['kstore_write_rec_s']:,.0f} rec/s")
    p("  groupBy(partition).count():")
    p(f"    kstore, fixed schema        : {statistics.median(out['kstore_count_s']):.2f} s "
      f"({out['kstore_count_rec_s']:,.0f} rec/s), {out['kstore_count_over_parquet']:.2f}x parquet")
    p(f"    kstore, schema 'partition int': {statistics.median(out['kstore_count_subset_s']):.2f} s "
      f"({out['kstore_count_subset_rec_s']:,.0f} rec/s), "
      f"{out['kstore_count_subset_over_parquet']:.2f}x parquet, "
      f"{out['count_subset_speedup']:.2f}x the fixed schema")
    p(f"    parquet                     : {statistics.median(out['parquet_count_s']):.2f} s "
      f"({out['parquet_count_rec_s']:,.0f} rec/s)")
    per_core = out["kstore_read_rec_s_per_core"]
    p(f"  [{'ok' if per_core >= 1e6 else 'SHORT'}] read >= 1M rec/s per core: {per_core:,.0f}")
    r = out["kstore_over_parquet"]
    p(f"  [{'ok' if r >= 2 else 'SHORT'}] stretch: read >= 2x parquet: {r:.2f}x")
