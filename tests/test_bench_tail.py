"""kstore bench --tail (tools/bench_tail.py): every mode delivers every record, small runs."""
import pytest

from kstore.tools import bench_tail


@pytest.mark.parametrize("mode,n,batch", [("pipe", 30, 1), ("bell", 30, 1), ("spin", 30, 1),
                                          ("wait", 3, 1000)])
def test_bench_tail_modes_see_every_record(tmp_path, watchdog, mode, n, batch):
    watchdog(240)
    row = bench_tail.run_mode(mode, n, batch, 200.0, spin=0.002, dir_=str(tmp_path))
    # the bare word counts wake-ups, and rings that come together count once
    assert row["records"] == n * batch if mode != "bell" else 0 < row["records"] <= n
    assert (row["mode"], row["batches"], row["batch"]) == (mode, n, batch)
    assert 0 < row["p50_us"] <= row["p99_us"] <= row["p999_us"]
    # from the append's return: at most the latency from its call (nan for the bare word)
    assert (row["ret_p50_us"] <= row["p50_us"]) if mode != "bell" else row["ret_p50_us"] != row["ret_p50_us"]
    assert (row["idle_cpu_per_s"] is None) == (mode in ("pipe", "bell"))
    assert (row["refreshes"] > 0) == (mode not in ("pipe", "bell"))
    assert list(tmp_path.iterdir()) == []            # its store removed
