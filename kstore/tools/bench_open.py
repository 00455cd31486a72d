"""`kstore bench` open cases: how long a log takes to open, against LMDB's open in the same run.

Three cases, each the median of `runs` timed opens (the state re-made before each):

- kill -9 reopen: a writer process appends `records` records (16-byte keys, 100-byte values,
  1000 per batch: ~127 MB for 1M) to a standalone Log, nothing flushed, and is killed with
  SIGKILL; the timed `Log.open` validates every batch (CRC-32C) and rebuilds both indexes.
- unclean start-up: a LogManager dir of `partitions` partitions x `segments` segments (100-record
  batches, `segment_bytes` per segment), shut down cleanly (recovery-point checkpoint written),
  then reopened by a writer that appends one batch to every partition and is killed: the timed
  `LogManager` open recovers each partition from its recovery point, as Kafka does. Reported as
  GB/s = bytes of the log dir / open time.
- clean open: the 1M-record log after a clean close (`Log.open` then nothing recovered).

Peer: `lmdb.open` of an environment holding the same 1M records (offset -> record).
Every timed open starts from the same state (_settle: written back, no garbage left to
collect from the runs before). The recovering cases also report the opening process's CPU
time (cpu_runs_ms, cpu_median_ms; every thread counted; for the many-partition case also
gb_per_cpu_s): on a machine that others load, it moves far less than the wall time.
"""
from __future__ import annotations

import gc
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import IO, Any, Optional

import kstore
from kstore.tools.workload import VALUE

_KILL_WRITER = r"""
import os, signal, sys
import kstore
from kstore.tools.workload import BASE_TS, VALUE, key
d, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
lg = kstore.Log.open(d)
for b in range(n // per):
    lg.append([(key(b * per + i), VALUE, BASE_TS + b) for i in range(per)])
os.kill(os.getpid(), signal.SIGKILL)
"""

_MANY_WRITER = r"""
import os, signal, sys
from kstore.fileio import FileOps
from kstore.manager import LogManager
from kstore.tools.workload import BASE_TS, VALUE, key
root, parts, segs, seg_bytes, build = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                       int(sys.argv[4]), sys.argv[5] == "build")
# retention off: the records carry BASE_TS (2023), and a build longer than the first retention
# pass would otherwise lose its oldest segments
cfg = {"log.segment.bytes": str(seg_bytes), "log.cleaner.enable": "false", "log.retention.ms": "-1"}

class NoSync(FileOps):
    # building only: 10,000 segment rolls' fsyncs would take minutes; the data stays in the
    # page cache either way, which is what the timed open reads
    def fsync(self, fd): pass
    def fsync_dir(self, path): pass
    def map_flush(self, mapping, start=0, end=-1): pass

m = LogManager(root, cfg, io=NoSync() if build else None)
rows = [(key(i), VALUE, BASE_TS + i) for i in range(100)]
if build:
    m.create_topic("t", parts)
    for p in range(parts):
        lg = m.log("t", p)
        while len(lg.segments) < segs:
            lg.append(rows)
    m.close()
else:
    for p in range(parts):
        m.log("t", p).append(rows)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _child(code: str, *args: Any) -> None:
    """Run code in a child Python with this process's kstore first on its path."""
    env = dict(os.environ)
    here = os.path.dirname(os.path.dirname(os.path.abspath(kstore.__file__)))
    env["PYTHONPATH"] = here + os.pathsep + env.get("PYTHONPATH", "")
    # run outside any source checkout: `-c` puts the working directory first on sys.path, and a
    # checkout's kstore/ (no built core) would shadow the installed package
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], env=env, cwd=tempfile.gettempdir(),
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=1800)
    if p.returncode not in (0, -signal.SIGKILL):
        raise RuntimeError(f"bench writer failed ({p.returncode}): {p.stderr.decode()[-2000:]}")


def _settle() -> None:
    """Before each timed open, the same starting point for every run: the writer's dirty pages
    written back (os.sync: the kernel's writeback of the hundreds of MB just written would
    otherwise run beside the first open, and 1000 partitions' worth of inodes and pages stay
    cached either way) and the garbage of the previous runs collected (gc.collect: a closed
    Log or LogManager is freed by the cyclic collector, and a pass over the ~80,000 objects of
    a 1000-partition manager, landing in a later run's open, cost that open 0.5 s)."""
    os.sync()
    gc.collect()


def _dir_bytes(root: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for f in files:
            if f.endswith(".log"):
                total += os.path.getsize(os.path.join(dirpath, f))
    return total


def _summary(ms: list[float], cpu: Optional[list[float]] = None) -> dict:
    """Median and spread of wall times; with cpu (the process's CPU time of each run, every
    thread counted), its median too: on a machine others load, the CPU time an open takes
    moves much less than its wall time."""
    out = {"runs_ms": [round(x, 3) for x in ms], "median_ms": round(statistics.median(ms), 3),
           "spread_ms": round(max(ms) - min(ms), 3)}
    if cpu:
        out["cpu_runs_ms"] = [round(x, 3) for x in cpu]
        out["cpu_median_ms"] = round(statistics.median(cpu), 3)
    return out


def _lmdb_open(root: str, records: int, runs: int) -> Optional[dict]:
    try:
        import lmdb
    except ImportError:
        return None
    path = os.path.join(root, "lmdb")
    env = lmdb.open(path, map_size=1 << 34, sync=False, metasync=False)
    with env.begin(write=True) as txn:
        rec = b"\0" * 16 + VALUE
        for i in range(records):
            txn.put(i.to_bytes(8, "big"), rec, append=True)
    env.close()
    ms = []
    for _ in range(runs):
        _settle()
        t = time.perf_counter()
        env = lmdb.open(path, map_size=1 << 34, sync=False, metasync=False)
        with env.begin() as txn:
            txn.get((records - 1).to_bytes(8, "big"))
        ms.append((time.perf_counter() - t) * 1e3)
        env.close()
    return _summary(ms)


def run(records: int = 1_000_000, partitions: int = 1000, segments: int = 10,
        segment_bytes: int = 64 << 10, runs: int = 3, root: Optional[str] = None,
        peers: bool = True, cases: tuple[str, ...] = ("kill9", "clean", "many")) -> dict:
    """Measure the open cases (see the module docstring); returns a dict of per-case timings
    (runs_ms, median_ms, spread_ms) and same-run ratios against LMDB's open."""
    own = root is None
    root = root or tempfile.mkdtemp(prefix="kstore-bench-open-")
    out: dict[str, Any] = {"records": records, "runs": runs}
    try:
        if "kill9" in cases or "clean" in cases:
            d = os.path.join(root, "kill9", "t-0")
            ms, clean_ms, cpu = [], [], []
            for _ in range(runs):
                shutil.rmtree(os.path.dirname(d), ignore_errors=True)
                _child(_KILL_WRITER, d, records, 1000)
                _settle()
                t, c = time.perf_counter(), time.process_time()
                lg = kstore.Log.open(d)
                ms.append((time.perf_counter() - t) * 1e3)
                cpu.append((time.process_time() - c) * 1e3)
                if lg.log_end_offset != records:
                    raise RuntimeError(f"reopen found {lg.log_end_offset} records, not {records}")
                lg.close()
                _settle()
                t = time.perf_counter()
                lg = kstore.Log.open(d)
                clean_ms.append((time.perf_counter() - t) * 1e3)
                lg.close()
            out["kill9_reopen"] = {**_summary(ms, cpu), "bytes": _dir_bytes(os.path.dirname(d))}
            out["clean_open"] = _summary(clean_ms)
        if "many" in cases:
            many = os.path.join(root, "many")
            _child(_MANY_WRITER, many, partitions, segments, segment_bytes, "build")
            ms, rates, cpu = [], [], []
            for _ in range(runs):
                # each run's writer appends to every partition and is killed: its open recovers
                # that, so a run reads a little more than the one before (rates per run)
                _child(_MANY_WRITER, many, partitions, segments, segment_bytes, "kill")
                size = _dir_bytes(many)
                _settle()
                t, c = time.perf_counter(), time.process_time()
                m = kstore.LogManager(many, {"log.segment.bytes": str(segment_bytes),
                                             "log.cleaner.enable": "false",
                                             "log.retention.ms": "-1"})
                ms.append((time.perf_counter() - t) * 1e3)
                cpu.append((time.process_time() - c) * 1e3)
                rates.append(size / (ms[-1] / 1e3) / 1e9)
                m.close()
            out["unclean_many"] = {**_summary(ms, cpu), "partitions": partitions, "segments": segments,
                                   "bytes": size, "gb_per_s": round(statistics.median(rates), 3),
                                   # load-proof: bytes per second of the opening process's CPU
                                   "gb_per_cpu_s": round(size / statistics.median(cpu) / 1e6, 3)}
        if peers:
            lm = _lmdb_open(root, records, runs)
            out["lmdb_open"] = lm if lm is not None else {"skipped": "lmdb is not installed"}
            if lm is not None:
                for k in ("kill9_reopen", "clean_open"):
                    if k in out:
                        out[k]["vs_lmdb_open"] = round(out[k]["median_ms"] / lm["median_ms"], 2)
    finally:
        if own:
            shutil.rmtree(root, ignore_errors=True)
    return out


#: the issue's targets: (key, bound, what)
TARGETS = (("kill9_reopen", "median_ms", "<=", 25.0, "reopen after kill -9, 1M unflushed records"),
           ("unclean_many", "gb_per_s", ">=", 1.0, "unclean start-up, many small segments"))


def report(res: dict, out: IO[str] = sys.stdout) -> None:
    """Print res (from run()) as a table, with the targets met or missed."""
    def line(name: str, r: Optional[dict], extra: str = "") -> None:
        if not r or "median_ms" not in r:
            return
        runs = ", ".join(f"{x:.1f}" for x in r["runs_ms"])
        cpu = f", CPU {r['cpu_median_ms']:.1f} ms" if "cpu_median_ms" in r else ""
        out.write(f"{name:<34}{r['median_ms']:>9.2f} ms  (runs {runs}{cpu}){extra}\n")
    k9 = res.get("kill9_reopen")
    line(f"reopen after kill -9 ({res['records']:,})", k9,
         f"  {k9['bytes'] / 1e6:.0f} MB" + (f", {k9['vs_lmdb_open']}x LMDB open"
                                            if "vs_lmdb_open" in k9 else "") if k9 else "")
    c = res.get("clean_open")
    line("clean open", c, f", {c['vs_lmdb_open']}x LMDB open" if c and "vs_lmdb_open" in c else "")
    many = res.get("unclean_many")
    if many:
        line(f"unclean {many['partitions']}x{many['segments']} segments", many,
             f"  {many['bytes'] / 1e6:.0f} MB, {many['gb_per_s']:.2f} GB/s"
             + (f" ({many['gb_per_cpu_s']:.2f} per CPU s)" if "gb_per_cpu_s" in many else ""))
    line("lmdb open (peer)", res.get("lmdb_open"))
    for case, key_, op, bound, what in TARGETS:
        if case in res:
            v = res[case][key_]
            ok = v <= bound if op == "<=" else v >= bound
            out.write(f"target {what}: {v} {op} {bound}: {'met' if ok else 'MISSED'}\n")


if __name__ == "__main__":
    import argparse
    import json
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=1000)
    ap.add_argument("--segments", type=int, default=10)
    ap.add_argument("--segment-bytes", type=int, default=64 << 10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--root")
    ap.add_argument("--cases", default="kill9,clean,many")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = run(a.records, a.partitions, a.segments, a.segment_bytes, a.runs, a.root,
            cases=tuple(a.cases.split(",")))
    if a.json:
        print(json.dumps(r, indent=1))
    else:
        report(r)
