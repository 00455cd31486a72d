"""Consumer wake-up latency: an append in one process, returned by `Consumer.poll` in another.

The same measurement as `kstore bench --tail` (tools/bench_tail.py) with the consumer API on
the reading side: a writer process appends at a steady rate (one record per batch, 16-byte key,
100-byte value, or 1000-record batches), each value starting with the writer's CLOCK_MONOTONIC
time in ns; the reader process is a `kstore.Consumer` (assign mode, StoreReader underneath)
blocked in poll(timeout_ms), an `AsyncConsumer` awaiting getmany (its wait goes through the
process's waiter thread), or the reference: `Log.wait_for` + `read` on the same read-only log
(bench --tail's "wait" mode). Reported: p50/p99/p99.9 append-to-returned latency in µs, and the
reader's CPU per second of run. Run: `python -m kstore.tools.bench_poll [--json]`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import resource
import shutil
import tempfile
import time
from typing import Any, Optional

KEY = b"k" * 16
MODES = ("wait", "consumer", "async")


def now_ns() -> int:
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def writer(path: str, n: int, batch: int, rate: float, ready, go) -> None:
    """n appends of batch records at rate per second, each value stamped with the clock."""
    from kstore.log import Log
    pad = b"v" * 92
    with Log.open(path) as lg:
        ready.set()
        go.wait(60)
        start = time.monotonic()
        for i in range(n):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            lg.append([(KEY, now_ns().to_bytes(8, "little") + pad)] * batch)
        time.sleep(0.5)


def reader(mode: str, store: str, total: int, ready, out) -> None:
    from kstore import AsyncConsumer, Consumer, TopicPartition
    from kstore.reader import StoreReader
    lat: list[int] = []
    tp = TopicPartition("t", 0)
    deadline = time.monotonic() + 60 + total / 1000

    def seen(recs) -> None:
        t = now_ns()
        lat.extend(t - int.from_bytes((r.value or b"")[:8], "little") for r in recs)

    if mode == "wait":
        with StoreReader(store) as s:
            lg = s.log("t", 0)
            ready.set()
            nxt = 0
            cpu0, t0 = cpu_s(), time.monotonic()
            while nxt < total and time.monotonic() < deadline:
                if lg.wait_for(nxt, timeout=5):
                    recs = lg.read(nxt, max_bytes=1 << 22)
                    seen(recs)
                    nxt = recs[-1].offset + 1 if recs else nxt
    elif mode == "consumer":
        with Consumer(store, auto_offset_reset="earliest", max_poll_records=100000) as c:
            c.assign([tp])
            c.poll(0)
            ready.set()
            cpu0, t0 = cpu_s(), time.monotonic()
            while len(lat) < total and time.monotonic() < deadline:
                for recs in c.poll(timeout_ms=5000).values():
                    seen(recs)
    else:
        async def run() -> tuple[float, float]:
            async with AsyncConsumer(store, auto_offset_reset="earliest", max_poll_records=100000) as c:
                c.assign([tp])
                await c.getmany(timeout_ms=0)
                ready.set()
                c0, s0 = cpu_s(), time.monotonic()
                while len(lat) < total and time.monotonic() < deadline:
                    for recs in (await c.getmany(timeout_ms=5000)).values():
                        seen(recs)
                return c0, s0
        cpu0, t0 = asyncio.run(run())
    out.put({"lat": lat, "cpu": cpu_s() - cpu0, "wall": time.monotonic() - t0})


def pct(xs: list[int], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000.0


def run_mode(mode: str, n: int, batch: int, rate: float, dir_: Optional[str] = None) -> dict[str, Any]:
    """One writer process and one reader process of the given mode; latencies in µs."""
    ctx = mp.get_context("spawn")
    root = tempfile.mkdtemp(prefix="kstore-poll-", dir=dir_)
    path = os.path.join(root, "t-0")
    try:
        from kstore.log import Log
        Log.open(path).close()
        w_ready, r_ready, go = ctx.Event(), ctx.Event(), ctx.Event()
        out = ctx.Queue()
        w = ctx.Process(target=writer, args=(path, n, batch, rate, w_ready, go))
        w.start()
        w_ready.wait(60)
        r = ctx.Process(target=reader, args=(mode, root, n * batch, r_ready, out))
        r.start()
        r_ready.wait(60)
        time.sleep(0.2)
        go.set()
        res = out.get(timeout=max(120.0, 3 * n / rate))
        w.join(60)
        r.join(60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lat = res["lat"]
    return {"mode": mode, "batches": n, "batch": batch, "rate": rate, "records": len(lat),
            "p50_us": pct(lat, 0.5), "p99_us": pct(lat, 0.99), "p999_us": pct(lat, 0.999),
            "reader_cpu_per_s": res["cpu"] / (res["wall"] or 1e-9)}


def run(n: int = 2000, rate: float = 1000.0, batches: int = 200, batch_rate: float = 100.0,
        modes=MODES, dir_: Optional[str] = None) -> list[dict[str, Any]]:
    """Every mode, interleaved: 1000-record batches first (the realistic case), then single
    records."""
    rows = [run_mode(m, batches, 1000, batch_rate, dir_) for m in modes]
    rows += [run_mode(m, n, 1, rate, dir_) for m in modes]
    return rows


def print_report(rows) -> None:
    print("append in process A -> returned by poll in process B (CLOCK_MONOTONIC in the value)")
    print(f"{'mode':<9} {'batch':>5} {'rate/s':>7} {'records':>8} {'p50 µs':>9} {'p99 µs':>9} "
          f"{'p99.9 µs':>9} {'cpu/s':>6}")
    for r in rows:
        print(f"{r['mode']:<9} {r['batch']:>5} {r['rate']:>7.0f} {r['records']:>8} {r['p50_us']:>9.1f} "
              f"{r['p99_us']:>9.1f} {r['p999_us']:>9.1f} {r['reader_cpu_per_s']:>6.3f}")
    print("wait: Log.wait_for + read on a StoreReader log (bench --tail's reference); consumer: "
          "Consumer.poll(timeout_ms=5000); async: AsyncConsumer.getmany through the waiter thread")


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2000, help="single-record appends (at 1000/s)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = run(n=args.records)
    print(json.dumps(rows, indent=2)) if args.json else print_report(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
