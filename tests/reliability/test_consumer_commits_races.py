"""A group member woken up at random while its rebalances' commits wait for another process's
offsets flock (held in 0.25 s bursts), beside a second member process that joins and leaves
over and over and a producer thread: every partition's listener calls alternate assigned /
revoked (each ownership given up exactly once), every revoke comes after its partitions'
positions were committed (the wakeup never loses the commit before a revoke), the member reads
each ownership contiguously from where it took the partition, and wakeups ended at least 3
rebalance commits (the path under test was taken: the run goes on, up to 60 s, until they have;
about 30 in 12 s here)."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time

from thread_watchdog import join_all

import kstore
from kstore import Consumer, TopicPartition as TP, WakeupError
from kstore.group_coordinator import GroupCoordinator

RUN_S = 12
GROUP = "g"
# auto-commit every 5 s: a revoke nearly always has positions to commit first
SETTINGS = dict(group_id=GROUP, auto_offset_reset="earliest", heartbeat_interval_ms=100,
                session_timeout_ms=2000, auto_commit_interval_ms=5000)

BURSTS = r"""
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
while not os.path.exists(sys.argv[2]):
    fcntl.flock(fd, fcntl.LOCK_EX)
    time.sleep(0.25)
    fcntl.flock(fd, fcntl.LOCK_UN)
    time.sleep(0.15)
"""

JOINER = r"""
import os, random, sys, time, kstore
d, stop = sys.argv[1], sys.argv[2]
rng = random.Random(3)
while not os.path.exists(stop):
    b = kstore.Consumer(d, "t", group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=100,
                        session_timeout_ms=2000, auto_commit_interval_ms=200)
    end = time.monotonic() + rng.uniform(0.3, 0.8)
    while time.monotonic() < end and not os.path.exists(stop):
        b.poll(timeout_ms=50)
    b.close()
    time.sleep(rng.uniform(0.2, 0.5))
"""


def test_wakeups_during_rebalance_commits_beside_a_joining_process(tmp_path, watchdog):
    watchdog(180)
    d = str(tmp_path / "data")
    stop_file = str(tmp_path / "stop")
    m = kstore.LogManager(d)
    m.create_topic("t", 4)
    with GroupCoordinator(d) as gc:
        gc.commit_offsets(GROUP, {TP("t", 0): 0})          # the group's partition exists
        path = gc.topic.partition_path(gc.partition_for(GROUP))
    reader = GroupCoordinator(d)
    stop = threading.Event()
    events: list = []       # in order: ("A" | "V", tp, position, committed), ("R", tp, first, last)
    c: Consumer

    class Recorder(kstore.ConsumerRebalanceListener):
        def on_partitions_revoked(self, tps) -> None:
            got = reader.fetch_offsets(GROUP, list(tps))
            for tp in sorted(tps):
                events.append(("V", tp, c.position(tp), got[tp].offset if tp in got else None))

        def on_partitions_assigned(self, tps) -> None:
            got = reader.fetch_offsets(GROUP, list(tps))
            for tp in sorted(tps):
                events.append(("A", tp, c.position(tp), got[tp].offset if tp in got else None))

    def produce():
        rng = random.Random(1)
        n = [0] * 4
        while not stop.wait(0.02):
            p = rng.randrange(4)
            m.append_batch("t", p, [(None, b"%d" % (n[p] + i)) for i in range(5)])
            n[p] += 5

    def wake():
        rng = random.Random(2)
        while not stop.wait(rng.uniform(0.005, 0.05)):
            c.wakeup()

    c = Consumer(d, "t", listener=Recorder(), **SETTINGS)
    ended: list = []                        # rebalance commits a wakeup ended (nothing written)
    before_losing = c._maybe_commit_before_losing

    def spy(tps, closing=False, sleep=None):
        try:
            return before_losing(tps, closing, sleep)
        except WakeupError:
            ended.append(sorted(tps))
            raise
    c._maybe_commit_before_losing = spy     # type: ignore[method-assign]
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, "-c", BURSTS, path, stop_file], cwd=str(tmp_path), env=env),
             subprocess.Popen([sys.executable, "-c", JOINER, d, stop_file], cwd=str(tmp_path), env=env)]
    threads = [threading.Thread(target=produce, name="producer"), threading.Thread(target=wake, name="waker")]
    woken = 0
    try:
        for t in threads:
            t.start()
        end, hard_end = time.monotonic() + RUN_S, time.monotonic() + 5 * RUN_S
        # at least RUN_S, and on until wakeups have ended 3 rebalance commits (timing-dependent)
        while time.monotonic() < end or (len(ended) < 3 and time.monotonic() < hard_end):
            try:
                for tp, recs in c.poll(timeout_ms=100).items():
                    events.append(("R", tp, recs[0].offset, recs[-1].offset))
                    assert [r.offset for r in recs] == list(range(recs[0].offset, recs[-1].offset + 1))
            except WakeupError:
                woken += 1
    finally:
        stop.set()
        open(stop_file, "w").close()
        join_all(threads, 20)
        for p in procs:
            assert p.wait(timeout=60) == 0
    final = {tp: c.position(tp) for tp in c.assignment()}
    c.close()
    reader.close()
    m.close()
    assert woken > 0 and len(ended) >= 3, (woken, ended)
    # per partition: assigned / revoked alternate (the close's revoke last); an ownership reads
    # on contiguously from its position at assignment; a revoke finds that position committed
    by_tp: dict = {}
    for kind, tp, a, b in events:
        by_tp.setdefault(tp, []).append((kind, a, b))
    revokes = 0
    for tp, evs in by_tp.items():
        kinds = [k for k, _, _ in evs if k != "R"]
        assert kinds == ["A", "V"] * (len(kinds) // 2), (tp, kinds)
        expected = None
        for kind, a, b in evs:
            if kind == "A":
                assert expected is None and (b is None or a == b), (tp, evs)   # from the commit
                expected = a
            elif kind == "R":
                assert a == expected, (tp, evs)
                expected = b + 1
            else:
                assert a == expected == b, (tp, evs)    # all read, then committed, then revoked
                revokes += 1
                expected = None
    assert revokes >= 8, revokes
    with GroupCoordinator(d) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets(GROUP, list(final)).items()} == final
