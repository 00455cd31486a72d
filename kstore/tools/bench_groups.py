"""Commit latency of the group coordinator: `python -m kstore.tools.bench_groups [--json]`.

- warm: one process, one GroupCoordinator, commit_offsets of 10 partitions per call (one batch
  of 10 OffsetCommit records), p50/p99; fetch_offsets of the group after each; beside it, in
  the same run, LMDB putting the same 10 keys in one write transaction (sync off: both leave the
  data in the page cache) as the peer's figure and the ratio.
- fresh: a new interpreter per sample, timing GroupCoordinator() + the first commit (the
  partition opened and recovered), and `import kstore` separately.
- contended: two coordinators (two descriptors: two processes' worth of flocks) alternating on
  one partition, so every commit finds the other's write and reopens the partition.
Figures are microseconds except where named _ms.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

from kstore.group_coordinator import GroupCoordinator
from kstore.group_records import OffsetAndMetadata
from kstore.topic_partition import TopicPartition

FRESH = r"""
import sys, time
t0 = time.perf_counter_ns()
from kstore.group_coordinator import GroupCoordinator
from kstore import TopicPartition as TP
t1 = time.perf_counter_ns()
gc = GroupCoordinator(sys.argv[1])
gc.commit_offsets("workers", {TP("events", p): 5 + p for p in range(10)})
t2 = time.perf_counter_ns()
gc.close()
print((t1 - t0) // 1000, (t2 - t1) // 1000)
"""


def _pct(xs: list[int], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000 if s else 0.0


def _offsets(i: int) -> dict[TopicPartition, OffsetAndMetadata]:
    return {TopicPartition("events", p): OffsetAndMetadata(i * 1000 + p) for p in range(10)}


def _store(d: str) -> str:
    """Store d with the topic the benchmark commits offsets of (events, 10 partitions)."""
    from kstore.manager import LogManager
    with LogManager(d) as m:
        m.create_topic("events", 10)
    return d


def warm(n: int, d: str) -> dict[str, float]:
    commits, fetches = [], []
    with GroupCoordinator(d) as gc:
        for i in range(n):
            offs = _offsets(i)
            t0 = time.perf_counter_ns()
            gc.commit_offsets("workers", offs)
            t1 = time.perf_counter_ns()
            gc.fetch_offsets("workers")
            t2 = time.perf_counter_ns()
            commits.append(t1 - t0)
            fetches.append(t2 - t1)
    skip = n // 20                          # the first commits open the partition
    out = {"commit_p50": _pct(commits[skip:], .5), "commit_p99": _pct(commits[skip:], .99),
           "fetch_p50": _pct(fetches[skip:], .5), "fetch_p99": _pct(fetches[skip:], .99)}
    try:
        import lmdb
    except ImportError:
        return out
    env = lmdb.open(tempfile.mkdtemp(dir=d), map_size=1 << 30, sync=False, metasync=False)
    peer = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        with env.begin(write=True) as txn:
            for p in range(10):
                txn.put(b"workers/events/%d" % p, b"%d" % (i * 1000 + p))
        peer.append(time.perf_counter_ns() - t0)
    env.close()
    out["lmdb_p50"] = _pct(peer[skip:], .5)
    out["lmdb_p99"] = _pct(peer[skip:], .99)
    out["ratio_p50"] = out["commit_p50"] / out["lmdb_p50"] if out["lmdb_p50"] else 0.0
    return out


def fresh(n: int, d: str) -> dict[str, float]:
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("workers", _offsets(0))
    imports, firsts = [], []
    for _ in range(n):
        out = subprocess.run([sys.executable, "-c", FRESH, d], capture_output=True, text=True,
                             check=True, timeout=120, cwd=d).stdout.split()
        imports.append(int(out[0]) * 1000)
        firsts.append(int(out[1]) * 1000)
    return {"import_ms_p50": _pct(imports, .5) / 1000, "first_commit_ms_p50": _pct(firsts, .5) / 1000,
            "first_commit_ms_p99": _pct(firsts, .99) / 1000}


def contended(n: int, d: str) -> dict[str, float]:
    ts = []
    with GroupCoordinator(d) as a, GroupCoordinator(d) as b:
        for i in range(n):
            gc = a if i % 2 else b
            offs = _offsets(i)
            t0 = time.perf_counter_ns()
            gc.commit_offsets("workers", offs)
            ts.append(time.perf_counter_ns() - t0)
    skip = n // 20
    return {"commit_p50": _pct(ts[skip:], .5), "commit_p99": _pct(ts[skip:], .99)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kstore.tools.bench_groups", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=2000, help="warm commits (default 2000)")
    ap.add_argument("--fresh", type=int, default=20, help="fresh processes (default 20)")
    ap.add_argument("--contended", type=int, default=500, help="alternating commits (default 500)")
    ap.add_argument("--dir", help="where to write (default a temporary dir, removed after)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    root = a.dir or tempfile.mkdtemp(prefix="kstore-bench-groups-")
    try:
        res = {"warm": warm(a.commits, _store(tempfile.mkdtemp(dir=root))),
               "fresh": fresh(a.fresh, _store(tempfile.mkdtemp(dir=root))) if a.fresh else {},
               "contended": contended(a.contended, _store(tempfile.mkdtemp(dir=root))) if a.contended else {}}
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    if a.json:
        print(json.dumps(res))
    else:
        for k, v in res.items():
            print(f"{k:<10} " + "  ".join(f"{n}={x:.1f}" for n, x in v.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
