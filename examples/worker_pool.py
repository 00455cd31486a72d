"""A worker pool over a kstore topic that survives `kill -9` of any worker.

The producer (this process) owns the store through a LogManager and appends jobs to the
6-partition topic "jobs". Each worker is a separate process running a `kstore.Consumer` in the
consumer group "workers": the group shares the partitions among the live workers, and each
worker commits its offsets after it has done the work of a poll (at-least-once). Kill any
worker with SIGKILL: the others notice within the heartbeat interval, take its partitions over
and resume at its last commit, so every job is done, and only the jobs it had done since its
last commit are done twice.

    python examples/worker_pool.py /tmp/pool            # the whole demo; prints a report
    python examples/worker_pool.py worker STORE OUT NAME # one worker (what the demo starts)
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import kstore

TOPIC, GROUP = "jobs", "workers"


def work(store: str, out_dir: str, name: str) -> None:
    """One worker: do each job (here: write its result line), then commit."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))     # a clean stop leaves the group
    results = open(os.path.join(out_dir, f"{name}.txt"), "ab", buffering=0)
    with kstore.Consumer(store, TOPIC, group_id=GROUP, auto_offset_reset="earliest",
                         enable_auto_commit=False, heartbeat_interval_ms=300) as consumer:
        while True:
            batch = consumer.poll(timeout_ms=1000)
            for tp, records in batch.items():
                results.write(b"".join(b"%d %d %s\n" % (tp.partition, r.offset, r.value)
                                       for r in records))
            if batch:
                consumer.commit()          # after the work: a crash redoes at most this poll's


def start_worker(store: str, out_dir: str, name: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), "worker", store, out_dir, name])


def main(base: str, jobs: int = 3000, workers: int = 3) -> dict:
    """Run the demo under base/: returns what happened (jobs, done, done twice, killed)."""
    store, out_dir = os.path.join(base, "store"), os.path.join(base, "results")
    os.makedirs(out_dir, exist_ok=True)
    with kstore.LogManager(store) as m:
        if TOPIC not in m.topics():
            m.create_topic(TOPIC, 6)
        pool = {f"w{i}": start_worker(store, out_dir, f"w{i}") for i in range(workers)}
        try:
            for i in range(jobs):
                m.append(TOPIC, b"job-%d" % i, b"job-%d" % i)
                if i == jobs // 2:
                    time.sleep(1.0)                        # the workers are busy now
                    pool["w0"].send_signal(signal.SIGKILL)  # kill -9 one of them
                    pool["w0"].wait()
                    pool["w0b"] = start_worker(store, out_dir, "w0b")
            ends = {kstore.TopicPartition(TOPIC, p): m.log(TOPIC, p).log_end_offset for p in range(6)}
            from kstore.group_coordinator import GroupCoordinator
            with GroupCoordinator(m) as groups:              # wait until everything is committed
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    done = groups.fetch_offsets(GROUP)
                    if all(tp in done and done[tp].offset >= end for tp, end in ends.items()):
                        break
                    time.sleep(0.2)
        finally:
            for p in pool.values():
                if p.poll() is None:
                    p.terminate()
            for p in pool.values():
                p.wait(timeout=60)
    lines = []
    for f in os.listdir(out_dir):
        with open(os.path.join(out_dir, f), "rb") as fh:
            lines += fh.read().splitlines()
    done_jobs = {ln.split()[2] for ln in lines}
    return {"jobs": jobs, "done": len(done_jobs), "results": len(lines),
            "done_twice": len(lines) - len(set(lines)), "killed": 1}


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        work(*sys.argv[2:5])
    else:
        print(main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/kstore-worker-pool"))
