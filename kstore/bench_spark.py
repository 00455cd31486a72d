"""`kstore bench --spark`: Spark reading a kstore topic against the same rows in Parquet, and
the rate of writing a DataFrame into a topic, in one local SparkSession.

Workload: N records (default 1,000,000) of 16-byte keys and 100-byte values in P partitions
(default 2, one per core of local[2]). The read job is the same for both sources: every column
of every row through Spark's `noop` sink. The Parquet copy holds the same seven columns, one
file per partition, written by pyarrow. Figures are medians of `repeats` runs after a warm-up;
the ratio is kstore's rate over Parquet's in the same run.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Optional

import kstore
from kstore.bench import BASE_TS, VALUE, _key


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
    import pyarrow.parquet as pq
    from kstore.arrow import iter_batches
    store = os.path.join(root, "store")
    with kstore.LogManager(store, {"log.segment.bytes": 256 << 20}) as m:
        m.create_topic("bench", partitions)
        per = n // partitions
        for p in range(partitions):
            lg = m.log("bench", p)
            for s in range(0, per, 1000):
                lg.append([(_key(i), VALUE, BASE_TS + i) for i in range(s, min(per, s + 1000))])
    parquet = os.path.join(root, "parquet")
    os.makedirs(parquet)
    with kstore.StoreReader(store) as r:
        for p in range(partitions):
            batches = list(iter_batches(r.log("bench", p), "bench", p, 0, 1 << 62))
            import pyarrow as pa
            pq.write_table(pa.Table.from_batches(batches), os.path.join(parquet, f"part-{p}.parquet"))
    return store


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(n: int = 1_000_000, partitions: int = 2, cores: int = 2, repeats: int = 3,
        dir_: Optional[str] = None, quiet: bool = False) -> dict:
    root = tempfile.mkdtemp(prefix="kstore-spark-bench-", dir=dir_)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr, flush=True))
    try:
        say(f"building {n:,} records in {partitions} partitions and their Parquet copy ...")
        store = _build(root, n, partitions)
        say(f"starting local[{cores}] ...")
        spark = _session(cores)
        try:
            kdf = spark.read.format("kstore").option("subscribe", "bench").load(store)
            pdf = spark.read.parquet(os.path.join(root, "parquet"))
            assert kdf.count() == pdf.count() == n // partitions * partitions

            def read(df):
                return lambda: df.write.format("noop").mode("overwrite").save()

            for df in (kdf, pdf):       # warm-up: JVM, Python workers, page cache
                read(df)()
            k_times, p_times, w_times = [], [], []
            for i in range(repeats):
                k_times.append(_timed(read(kdf)))
                p_times.append(_timed(read(pdf)))
                say(f"  read run {i + 1}: kstore {k_times[-1]:.2f} s, parquet {p_times[-1]:.2f} s")
            # the write source is cached, so the write runs time the sink, not a Parquet scan
            src = pdf.select("key", "value").repartition(cores).cache()
            src.count()
            for i in range(repeats):
                w = (src.write.format("kstore").mode("append").option("topic", f"out{i}")
                     .option("kstore.num.partitions", str(partitions)))
                w_times.append(_timed(lambda: w.save(store)))
                say(f"  write run {i + 1}: {w_times[-1]:.2f} s")
        finally:
            spark.stop()
        rows = n // partitions * partitions
        k, p, w = (statistics.median(t) for t in (k_times, p_times, w_times))
        return {
            "records": rows, "partitions": partitions, "cores": cores,
            "kstore_read_s": k_times, "parquet_read_s": p_times, "kstore_write_s": w_times,
            "kstore_read_rec_s": rows / k, "kstore_read_rec_s_per_core": rows / k / cores,
            "parquet_read_rec_s": rows / p, "kstore_over_parquet": p / k,
            "kstore_write_rec_s": rows / w,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_report(out: dict, file=sys.stdout) -> None:
    p = lambda *a: print(*a, file=file)   # noqa: E731
    p(f"Spark local[{out['cores']}], {out['records']:,} records (100-byte values), "
      f"{out['partitions']} partitions; medians of {len(out['kstore_read_s'])} runs")
    p(f"  read kstore : {out['kstore_read_rec_s']:,.0f} rec/s "
      f"({out['kstore_read_rec_s_per_core']:,.0f} per core)")
    p(f"  read parquet: {out['parquet_read_rec_s']:,.0f} rec/s")
    p(f"  kstore / parquet: {out['kstore_over_parquet']:.2f}x")
    p(f"  write kstore: {out['kstore_write_rec_s']:,.0f} rec/s")
    per_core = out["kstore_read_rec_s_per_core"]
    p(f"  [{'ok' if per_core >= 1e6 else 'SHORT'}] read >= 1M rec/s per core: {per_core:,.0f}")
    r = out["kstore_over_parquet"]
    p(f"  [{'ok' if r >= 2 else 'SHORT'}] stretch: read >= 2x parquet: {r:.2f}x")
