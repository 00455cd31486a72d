"""kill -9 loop against real processes (facts: crash-and-fault-testing §2b): a worker appends to a
deleting topic and a compacted one, with the real scheduler (flushes, checkpoints, retention) and
a cleaner thread, rolling small segments, and is killed at a random moment; the store is then
recovered and checked. KSTORE_SOAK_SECONDS sets the length (60 in CI).

Every record's value is its own offset, so a recovered log proves itself: offsets contiguous
from the log start, each value equal to its offset, and every append the worker acknowledged
(printed after append returned) present, as a process kill keeps what the OS was handed."""
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import kstore

SECONDS = float(os.environ.get("KSTORE_SOAK_SECONDS", "60"))
CFG = {"log.segment.bytes": 2048, "log.index.size.max.bytes": 4096, "log.retention.check.interval.ms": 50,
       "log.flush.interval.ms": 30, "log.flush.scheduler.interval.ms": 20, "log.initial.task.delay.ms": 0,
       "log.flush.offset.checkpoint.interval.ms": 40, "log.flush.start.offset.checkpoint.interval.ms": 40,
       "log.cleaner.backoff.ms": 30, "log.segment.delete.delay.ms": 10, "file.delete.delay.ms": 10}

WORKER = textwrap.dedent("""
    import json, sys, kstore
    root, cfg = sys.argv[1], json.loads(sys.argv[2])
    m = kstore.LogManager(root, cfg)
    if "del" not in m.topics():
        m.create_topic("del", 1, {"retention.bytes": 8192})
        m.create_topic("comp", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.05,
                                   "segment.bytes": 1024})
    print("ready", flush=True)
    i = 0
    while True:
        for t in ("del", "comp"):
            lg = m.log(t, 0)
            o = lg.log_end_offset
            n = 1 + i % 4
            m.append_batch(t, 0, [(b"k%d" % ((o + j) % 13), b"%d" % (o + j)) for j in range(n)])
            print(t, o + n - 1, flush=True)
        i += 1
""")


def check(root, acked):
    with kstore.LogManager(root, {"log.cleaner.enable": False}) as m:
        for t in ("del", "comp"):
            if t not in m.topics():
                continue
            lg = m.log(t, 0)
            recs = [(r.offset, r.key, r.value) for r in lg]
            assert all(v == b"%d" % o for o, _k, v in recs), f"{t}: a record's value is not its offset"
            offs = [o for o, _k, _v in recs]
            if t == "del":
                assert offs == list(range(lg.log_start_offset, lg.log_start_offset + len(offs))), \
                    f"del: offsets not contiguous from {lg.log_start_offset}"
            else:
                assert offs == sorted(set(offs))
                # compaction keeps each key's latest: every acked offset is present or superseded
                latest = {}
                for o, k, _v in recs:
                    latest[k] = o
                for o in range(acked.get(t, -1) + 1):
                    k = b"k%d" % (o % 13)
                    assert o in set(offs) or latest.get(k, -1) > o or o < lg.log_start_offset, \
                        f"comp: acked offset {o} lost"
            assert lg.log_end_offset > acked.get(t, -1), \
                f"{t}: log end {lg.log_end_offset}, acked up to {acked.get(t)}"
            for name in os.listdir(lg.dir):
                assert not name.endswith((".cleaned", ".swap", ".tmp")), name


def test_kill_9_loop(tmp_path, reliability_counts):
    root = str(tmp_path / "store")
    rng = random.Random(11)
    env = dict(os.environ, PYTHONSAFEPATH="1")
    deadline = time.monotonic() + SECONDS
    cycles = 0
    acked: dict[str, int] = {}
    while time.monotonic() < deadline or cycles < 3:
        p = subprocess.Popen([sys.executable, "-c", WORKER, root, json.dumps(CFG)],
                             stdout=subprocess.PIPE, env=env)
        assert p.stdout.readline().strip() == b"ready"
        end = time.monotonic() + rng.uniform(0.05, 0.6)
        os.set_blocking(p.stdout.fileno(), False)
        buf = b""
        while time.monotonic() < end:
            chunk = p.stdout.read() or b""
            buf += chunk
            time.sleep(0.005)
        p.send_signal(signal.SIGKILL)
        p.wait()
        buf += p.stdout.read() or b""
        p.stdout.close()
        for line in buf.decode().splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                acked[parts[0]] = max(acked.get(parts[0], -1), int(parts[1]))
        check(root, acked)
        cycles += 1
    reliability_counts["kill9"] = {"cycles": cycles, "records_acked": sum(v + 1 for v in acked.values()),
                                   "seconds": SECONDS, "records_lost": 0}
    assert acked.get("del", -1) > 100

