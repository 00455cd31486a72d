"""kstore.tools.bench_open: a tiny run of the three open cases gives every figure and checks
what it opened (the kill -9 writer's records all recovered)."""
import io

from kstore.tools import bench_open


def test_bench_open_tiny_run(tmp_path):
    res = bench_open.run(records=3000, partitions=3, segments=2, segment_bytes=16 << 10, runs=2,
                         root=str(tmp_path))
    k9, clean, many = res["kill9_reopen"], res["clean_open"], res["unclean_many"]
    assert len(k9["runs_ms"]) == len(clean["runs_ms"]) == len(many["runs_ms"]) == 2
    assert k9["bytes"] > 3000 * 100 and k9["median_ms"] > 0
    # the CPU time of the timed opens beside their wall time
    assert k9["cpu_median_ms"] > 0 and many["cpu_median_ms"] > 0 and "cpu_median_ms" not in clean
    assert many["partitions"] == 3 and many["bytes"] > 0 and many["gb_per_s"] > 0
    assert "median_ms" in res["lmdb_open"] or "skipped" in res["lmdb_open"]
    out = io.StringIO()
    bench_open.report(res, out)
    text = out.getvalue()
    assert "reopen after kill -9 (3,000)" in text and "unclean 3x2 segments" in text
    assert "target reopen after kill -9" in text
    assert f"CPU {k9['cpu_median_ms']:.1f} ms" in text
