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


def test_bench_tail_pins_writer_and_reader_to_two_cpus_it_may_use(tmp_path, watchdog):
    import os
    watchdog(240)
    allowed = sorted(os.sched_getaffinity(0))
    assert bench_tail._cpus(False) == (None, None)
    assert bench_tail._cpus(True) == ((allowed[0], allowed[1]) if len(allowed) >= 2 else (None, None))
    row = bench_tail.run_mode("wait", 20, 1, 200.0, dir_=str(tmp_path), pin=True)
    assert row["records"] == 20 and row["refreshes"] > 0 and 0 < row["p50_us"] <= row["p99_us"]


def test_cpu_after_idle_reports_a_median_per_gap(watchdog):
    watchdog(120)
    row = bench_tail.cpu_after_idle((0.0, 0.001), reps=20)
    assert set(row) == {"mode", "hot_us", "after_1ms_us", "factor_1ms"}
    assert row["mode"] == "cpu_after_idle" and row["hot_us"] > 0 and row["after_1ms_us"] > 0
    assert row["factor_1ms"] == row["after_1ms_us"] / row["hot_us"]
