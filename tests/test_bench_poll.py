"""tools/bench_poll (the consumer's wake-up latency benchmark) runs each mode and accounts for
every record the writer appended (the figures themselves are the report's, not asserted)."""
import pytest

from kstore.tools import bench_poll


@pytest.mark.parametrize("mode", bench_poll.MODES)
def test_each_mode_sees_every_record(mode, tmp_path, watchdog):
    watchdog(120)
    row = bench_poll.run_mode(mode, 30, 2, 300.0, dir_=str(tmp_path))
    assert row["records"] == 60 and row["mode"] == mode
    assert 0 < row["p50_us"] <= row["p99_us"] <= row["p999_us"]
