"""kstore.tools.bench_spark (`kstore bench --spark`): the three sources hold the same rows, and
the count query runs over all three of them, and the run cleans up after itself in a session it
was given."""
import os

import pytest

pytest.importorskip("pyspark")


def test_bench_spark_sources_hold_the_same_rows(spark, tmp_path):
    from kstore.tools import bench_spark     # imports pyspark
    out = bench_spark.run(4000, partitions=2, repeats=1, warmup=0, dir_=str(tmp_path),
                          quiet=True, spark=spark)       # raises if the sources' rows differ
    assert out["records"] == 4000
    assert len(out["kstore_read_s"]) == len(out["parquet_read_s"]) == len(out["ceiling_read_s"]) == 1
    assert out["kstore_over_ceiling"] == out["ceiling_read_s"][0] / out["kstore_read_s"][0]
    # the count query beside the full read: three sources, same rows (run() checks the counts)
    assert len(out["kstore_count_s"]) == len(out["kstore_count_subset_s"]) == \
        len(out["parquet_count_s"]) == 1
    assert out["kstore_count_subset_over_parquet"] == \
        out["parquet_count_s"][0] / out["kstore_count_subset_s"][0]
    assert out["count_subset_speedup"] == out["kstore_count_s"][0] / out["kstore_count_subset_s"][0]
    assert out["kstore_count_subset_rec_s"] == 4000 / out["kstore_count_subset_s"][0]
    # CPU time of the session's JVM and Python workers per run, and what it gives per core
    assert len(out["kstore_read_cpu_s"]) == len(out["ceiling_read_cpu_s"]) == 1
    assert out["kstore_read_cpu_s"][0] > 0
    assert out["kstore_read_rec_cpu_s"] == 4000 / out["kstore_read_cpu_s"][0]
    assert out["kstore_over_ceiling_cpu"] == out["ceiling_read_cpu_s"][0] / out["kstore_read_cpu_s"][0]
    assert len(out["kstore_read_py_cpu_s"]) == 1 and out["kstore_read_py_cpu_s"][0] >= 0
    assert out["warmup_rounds"] == 0 and out["warmup_kstore_s"] == [] and len(out["load_avg"]) == 2
    assert os.listdir(str(tmp_path)) == []                  # cleaned up
    assert spark.range(3).count() == 3                      # the session is left running


def test_warm_up_runs_on_while_times_still_fall(monkeypatch):
    """At least `warmup` rounds, then on while the last round of a watched source was more than
    5% faster than its best earlier one, up to max_warmup."""
    from kstore.tools import bench_spark
    falling = iter([5.0, 4.0, 3.0, 2.0, 1.9, 1.95, 1.0, 1.0])
    monkeypatch.setattr(bench_spark, "_timed", lambda fn: (fn(), 0.0, 0.0))
    times = bench_spark._warm({"kstore": lambda: next(falling), "ceiling": lambda: 1.0}, 3, 15,
                              ("kstore", "ceiling"))
    assert times["kstore"] == [5.0, 4.0, 3.0, 2.0, 1.9]      # 1.9 is within 5% of 2.0: stop
    capped = bench_spark._warm({"kstore": iter(range(100, 0, -10)).__next__}, 2, 6, ("kstore",))
    assert capped["kstore"] == [100, 90, 80, 70, 60, 50]
    assert bench_spark._warm({"kstore": lambda: 1.0}, 0, 15, ("kstore",)) == {"kstore": []}


def test_tree_cpu_counts_a_busy_child():
    """_tree_cpu sums the CPU time of this process's descendants (Spark's JVM and workers)."""
    import subprocess
    import sys
    import time
    from kstore.tools import bench_spark
    before = bench_spark._tree_cpu(os.getpid())
    gone = {1 << 30: (10_000, True)}        # a process that went away is left out
    p = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                          "while time.process_time() - t < 0.3: pass\ntime.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while bench_spark._cpu_between({**before, **gone},
                                       bench_spark._tree_cpu(os.getpid()))[1] < 0.25:
            assert time.monotonic() < deadline, "the child's CPU time never showed"
            time.sleep(0.05)
    finally:
        p.kill()
        p.wait(timeout=30)
