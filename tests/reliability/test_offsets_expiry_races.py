"""kstore.offsets_expiry beside other work (reliability tier): the running LogManager's
delete-expired-group-metadata task (every 100 ms, on the real scheduler) expires 30 groups' offsets
committed two minutes ago while a process commits group "live" in a loop and holds its
partition's flock in bursts of 1.5 s (longer than the task's 1 s bound), and threads of this
process commit other groups. Every old offset is tombstoned exactly once, no fresh one is, the
last commit of each committer is what is read, and close() returns promptly; the watchdog bounds
the whole test."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time

from thread_watchdog import join_all

import kstore
from kstore import LogManager, TopicPartition as TP
from kstore.group_coordinator import GroupCoordinator
from kstore.group_records import OffsetAndMetadata, OffsetKey, parse_key

GENEROUS_S = 60
OLD = [f"old-{i}" for i in range(30)]

COMMITTER = r"""
import fcntl, os, sys, time
from kstore import TopicPartition as TP
from kstore.group_coordinator import GroupCoordinator
d, seconds = sys.argv[1], float(sys.argv[2])
with GroupCoordinator(d) as gc:
    path = gc.topic.partition_path(gc.partition_for("live"))
    deadline, i = time.monotonic() + seconds, 0
    while time.monotonic() < deadline:
        i += 1
        gc.commit_offsets("live", {TP("t", 0): i})
        if i % 50 == 0:                  # a burst: the flock held past the task's bound
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            time.sleep(1.5)
            os.close(fd)
print(i, flush=True)
"""


def _tombstones(d: str) -> dict:
    out: dict = {}
    for name in sorted(os.listdir(d)):
        if name.startswith("__consumer_offsets-"):
            with kstore.Log.open(os.path.join(d, name), read_only=True) as lg:
                for rec in lg.read(0, 1_000_000, max_bytes=1 << 30):
                    k = parse_key(rec.key)
                    if isinstance(k, OffsetKey) and rec.value is None:
                        out[k.group] = out.get(k.group, 0) + 1
    return out


def test_the_expiry_task_beside_committers_and_a_flock_holder(tmp_path, watchdog, caplog):
    watchdog(180)
    caplog.set_level(logging.INFO, logger="kstore.groups")
    d = str(tmp_path / "data")
    cfg = {"log.initial.task.delay.ms": 0, "offsets.retention.minutes": 1,
           "offsets.retention.check.interval.ms": 100, "background.threads": 1}
    with LogManager(d, {"log.initial.task.delay.ms": 3_600_000}) as m0:
        m0.create_topic("t", 2)
        m0.append_batch("t", 0, [(None, b"x")] * 10)
    past = int(time.time() * 1000) - 120_000
    with GroupCoordinator(d) as gc:
        for g in OLD:
            gc.commit_offsets(g, {TP("t", 0): OffsetAndMetadata(3, commit_timestamp=past),
                                  TP("t", 1): OffsetAndMetadata(4, commit_timestamp=past)})
    child = subprocess.Popen([sys.executable, "-c", COMMITTER, d, "6"], cwd=str(tmp_path),
                             env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    stop = threading.Event()
    last: dict = {}

    def commits(name: str) -> None:
        with GroupCoordinator(d) as gc:
            i = 0
            while not stop.is_set():
                i += 1
                gc.commit_offsets(name, {TP("t", 1): i})
                last[name] = i
                time.sleep(0.005)
    threads = [threading.Thread(target=commits, args=(f"fresh-{k}",), name=f"fresh-{k}")
               for k in range(2)]
    m = LogManager(d, cfg)
    try:
        for t in threads:
            t.start()
        out, err = child.communicate(timeout=GENEROUS_S)
        assert child.returncode == 0, err
        deadline = time.monotonic() + GENEROUS_S
        while time.monotonic() < deadline:
            with GroupCoordinator(d) as gc:
                if not any(gc.fetch_offsets(g) for g in OLD):
                    break
            time.sleep(0.1)
        stop.set()
        join_all(threads, GENEROUS_S)
    finally:
        stop.set()
        t0 = time.monotonic()
        m.close()
        closed_in = time.monotonic() - t0
    assert closed_in < 20                    # never behind a lock timeout (30 s)
    with GroupCoordinator(d) as gc:
        assert {g: gc.fetch_offsets(g) for g in OLD} == {g: {} for g in OLD}
        assert {tp: o.offset for tp, o in gc.fetch_offsets("live").items()} == {TP("t", 0): int(out)}
        for name, i in last.items():
            assert {tp: o.offset for tp, o in gc.fetch_offsets(name).items()} == {TP("t", 1): i}
    assert _tombstones(d) == {g: 2 for g in OLD}
    put_off = [r.getMessage() for r in caplog.records if "put off" in r.getMessage()]
    shape = re.compile(r"the (expiry of committed offsets|compaction of __consumer_offsets) is put off to "
                       r"the next run for (\d+) of (\d+) partitions \(from __consumer_offsets-\d+\): "
                       r"(offsets flocks held by others for 1 s|the LogManager is closing)")
    assert put_off and all(shape.fullmatch(p) for p in put_off), put_off
    assert all(1 <= int(n) <= int(of) for n, of in (shape.fullmatch(p).group(2, 3) for p in put_off))
