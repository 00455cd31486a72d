"""kstore.tools.bench_open: a tiny run of the three open cases gives every figure and checks
what it opened (the kill -9 writer's records all recovered)."""
import io
import statistics

import pytest

from kstore.tools import bench_open


def test_bench_open_tiny_run(tmp_path, monkeypatch):
    settled = []
    real = bench_open._settle
    monkeypatch.setattr(bench_open, "_settle", lambda: (settled.append(1), real()))
    res = bench_open.run(records=3000, partitions=3, segments=2, segment_bytes=16 << 10, runs=2,
                         root=str(tmp_path))
    k9, clean, many = res["kill9_reopen"], res["clean_open"], res["unclean_many"]
    assert len(k9["runs_ms"]) == len(clean["runs_ms"]) == len(many["runs_ms"]) == 2
    assert k9["bytes"] > 3000 * 100 and k9["median_ms"] > 0
    # the CPU time of the timed opens beside their wall time
    assert k9["cpu_median_ms"] > 0 and many["cpu_median_ms"] > 0 and "cpu_median_ms" not in clean
    # every timed open starts settled (written back, garbage collected): 2 runs of each case
    lm = "median_ms" in res["lmdb_open"]
    assert len(settled) == 2 * (3 + lm)
    assert len(k9["cpu_runs_ms"]) == len(many["cpu_runs_ms"]) == 2
    assert abs(many["cpu_median_ms"] - statistics.median(many["cpu_runs_ms"])) <= 0.002
    assert many["gb_per_cpu_s"] == pytest.approx(many["bytes"] / many["cpu_median_ms"] / 1e6,
                                                 rel=1e-2, abs=2e-3)
    assert many["partitions"] == 3 and many["bytes"] > 0 and many["gb_per_s"] > 0
    assert "median_ms" in res["lmdb_open"] or "skipped" in res["lmdb_open"]
    out = io.StringIO()
    bench_open.report(res, out)
    text = out.getvalue()
    assert "reopen after kill -9 (3,000)" in text and "unclean 3x2 segments" in text
    assert "target reopen after kill -9" in text
    assert f"CPU {k9['cpu_median_ms']:.1f} ms" in text
