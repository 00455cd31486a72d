"""asv: append in one process -> visible to a read-only reader in another (`kstore bench
--tail`'s measurement, kstore/tools/bench_tail.py), and the reopen after kill -9 (`--open`).
Targets (issue 14): single records p50 <= 50 µs; 1000-record batches p99 <= 1 ms; reopen after
kill -9 with 1M records unflushed <= 25 ms. Each track_ runs its own writer and reader
processes; the pipe between the same two processes is tracked beside them as the host's
wake-up cost (these figures move with it)."""
from kstore.tools import bench_open, bench_tail


class TailLatency:
    timeout = 300
    number = 1
    repeat = 1
    unit = "µs"

    def track_single_record_p50_us(self):
        return bench_tail.run_mode("wait", 2000, 1, 1000.0, pin=True)["p50_us"]

    def track_single_record_pipe_p50_us(self):
        return bench_tail.run_mode("pipe", 2000, 1, 1000.0, pin=True)["p50_us"]

    def track_batch_1000_p99_us(self):
        return bench_tail.run_mode("wait", 600, 1000, 100.0, pin=True)["p99_us"]

    def track_batch_1000_pipe_p99_us(self):
        return bench_tail.run_mode("pipe", 600, 1000, 100.0, pin=True)["p99_us"]


class ReopenAfterKill:
    timeout = 600
    number = 1
    repeat = 1
    unit = "ms"

    def track_reopen_after_kill_9_ms(self):
        return bench_open.run(runs=3, peers=False, cases=("kill9",))["kill9_reopen"]["median_ms"]
