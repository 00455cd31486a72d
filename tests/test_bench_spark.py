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
    assert os.listdir(str(tmp_path)) == []                  # cleaned up
    assert spark.range(3).count() == 3                      # the session is left running
