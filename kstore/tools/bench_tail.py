"""`kstore bench --tail`: append in one process, seen by a reader in another.

A writer process appends at a steady rate, one record per batch (16-byte key, 100-byte value)
or 1000-record batches; a reader process opens the partition read-only (StoreReader) and loops
on `wait_for` + `read`. Each value starts with the writer's CLOCK_MONOTONIC time in ns (the one
clock both processes share), so the reader measures append-to-visible latency per record from
the call of append ("p50"...: what the issue's table measured) and, through the times the writer
stores in a shared array as each append returns, from its return to the records being handed to
the application by read() ("ret p50"...: the latency a consumer sees beyond the producer's own
call; a 1000-record append takes ~0.2-0.5 ms of its own, counted only in the first). In
the same run and at the same rate, the same two kinds of process pass the timestamps over a
plain pipe (the reference: the cost of one cross-process wake-up), and the reader waits with
spin (busy-waits first: lowest latency, a busy core). Reported: p50/p99/p99.9 latency, the
reader's CPU time per second while data flows and while idle (getrusage), and the time its
refreshes took (what a read-only log spends learning the new data: full and tail refreshes).
The reader drops the records it handled before it waits again, as a consumer loop does once it
has processed them: freeing a 1000-record batch (~40-50 µs) is then not counted in the next
batch's latency. With pin (the default of run), the writer runs on the first CPU this process
may use and the reader on the second (the figures then do not depend on where the scheduler
puts them).
"""
from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import resource
import shutil
import tempfile
import time
from typing import Any, Optional, Sequence

_CLOCK = time.CLOCK_MONOTONIC
KEY = b"k" * 16
IDLE_S = 1.0
POLL_S = 0.1          # mode "poll": what `consume --follow` slept between polls before wait_for


def _now() -> int:
    return time.clock_gettime_ns(_CLOCK)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _pace(start: float, i: int, rate: float) -> None:
    """Sleep until the i-th tick of a steady rate."""
    delay = start + i / rate - time.monotonic()
    if delay > 0:
        time.sleep(delay)


def _pin(cpu: Optional[int]) -> None:
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})


def _cpus(pin: bool) -> tuple[Optional[int], Optional[int]]:
    """(writer's CPU, reader's CPU): the first two this process may use, if pin and there are
    two; else (None, None)."""
    cpus = sorted(os.sched_getaffinity(0)) if pin and hasattr(os, "sched_getaffinity") else []
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else (None, None)


def _writer(mode: str, path: str, n: int, batch: int, rate: float, conn, ready, go,
            returned, core: Optional[int] = None) -> None:
    """Appends (or, mode "pipe", sends) n batches at rate per second; returned[i]: the
    CLOCK_MONOTONIC ns when the i-th append (send) returned."""
    _pin(core)
    from kstore.log import Log
    pad = b"v" * 92
    lg = None if mode in ("pipe", "bell", "bellspin") else Log.open(path)
    bell = _bell(path) if mode in ("bell", "bellspin") else None
    ready.set()
    go.wait(60)
    start = time.monotonic()
    for i in range(n):
        _pace(start, i, rate)
        ts = _now().to_bytes(8, "little")
        if bell is not None:
            bell.bump_end(int.from_bytes(ts, "little"), 0, 0)
        elif lg is None:
            conn.send_bytes(ts)
        else:
            lg.append([(KEY, ts + pad)] * batch)
        returned[i] = _now()
    if lg is not None:
        time.sleep(IDLE_S + 0.5)        # the reader measures its idle CPU meanwhile
        lg.close()


def _reader(mode: str, store: str, n: int, batch: int, spin: float, conn, ready, out,
            core: Optional[int] = None) -> None:
    _pin(core)
    lat: list[int] = []
    handed: list[tuple[int, int, int]] = []     # (first offset, records, when read() returned)
    refresh_ns: list[int] = []
    total = n * batch
    if mode == "pipe":
        ready.set()
        cpu0, t0 = _cpu(), time.monotonic()
        for i in range(n):
            ts = int.from_bytes(conn.recv_bytes(), "little")
            now = _now()
            lat.append(now - ts)
            handed.append((i * batch, 1, now))
        cpu, wall = _cpu() - cpu0, time.monotonic() - t0
        out.put({"lat": lat, "cpu": cpu, "wall": wall, "idle_cpu": None, "refresh": [],
                 "handed": handed})
        return
    if mode in ("bell", "bellspin"):
        bell = _bell(os.path.join(store, "t-0"))
        ready.set()
        cpu0, t0 = _cpu(), time.monotonic()
        seen = 0
        while len(lat) < n:
            armed = bell.arm()
            end = bell.hints()[0]
            if end != seen:
                lat.append(_now() - end)
                seen = end
                continue
            if mode == "bellspin" and bell.spin(armed, spin):
                continue
            if bell.sleep(armed, 1.0) == errno.ETIMEDOUT and lat:
                break                   # the writer is done (rings that came together count once)
        cpu, wall = _cpu() - cpu0, time.monotonic() - t0
        out.put({"lat": lat, "cpu": cpu, "wall": wall, "idle_cpu": None, "refresh": [],
                 "handed": []})
        return
    from kstore.reader import StoreReader
    with StoreReader(store) as s:
        lg = s.log("t", 0)

        def timed(plain):
            def call(*a, **kw):
                t = _now()
                try:
                    return plain(*a, **kw)
                finally:
                    refresh_ns.append(_now() - t)
            return call
        lg.refresh = timed(lg.refresh)                  # type: ignore[method-assign]  # measured
        lg.refresh_tail = timed(lg.refresh_tail)        # type: ignore[method-assign]  # (a woken waiter's)
        ready.set()
        nxt = 0
        cpu0, t0 = _cpu(), time.monotonic()
        deadline = time.monotonic() + 30 + total / 1000
        while nxt < total and time.monotonic() < deadline:
            if mode == "poll":           # before wait_for: read (refreshing at the end), sleep
                recs = lg.read(nxt, max_bytes=1 << 22)
                if not recs:
                    time.sleep(POLL_S)
                    continue
            elif not lg.wait_for(nxt, timeout=30, spin=spin if mode == "spin" else 0.0):
                break
            else:
                recs = lg.read(nxt, max_bytes=1 << 22)
            now = _now()
            lat.extend(now - int.from_bytes((r.value or b"")[:8], "little") for r in recs)
            if recs:
                handed.append((recs[0].offset, len(recs), now))
            nxt = recs[-1].offset + 1 if recs else nxt
            recs = []                   # handled: dropped before the next wait (see above)
        cpu, wall = _cpu() - cpu0, time.monotonic() - t0
        c0 = _cpu()
        if mode == "poll":
            end = time.monotonic() + IDLE_S
            while time.monotonic() < end:
                lg.read(nxt)
                time.sleep(POLL_S)
        else:
            lg.wait_for(nxt, timeout=IDLE_S)       # nothing comes: ~0 CPU
        idle = _cpu() - c0
    out.put({"lat": lat, "cpu": cpu, "wall": wall, "idle_cpu": idle, "refresh": refresh_ns,
             "handed": handed})


def _bell(path: str):
    """The notification word alone (mode "bell": the wake-up without a log): the writer's
    timestamp travels as the end-offset hint."""
    from kstore.fileio import get_file_ops
    from kstore.notify import writer_bell
    os.makedirs(path, exist_ok=True)
    return writer_bell(get_file_ops(), path)


def _pct(xs: list[int], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000.0


def run_mode(mode: str, n: int, batch: int, rate: float, spin: float = 0.0,
             dir_: Optional[str] = None, pin: bool = False) -> dict[str, Any]:
    """One writer and one reader process; latencies in µs, CPU in seconds per second. pin:
    writer and reader each on a CPU of its own (_cpus)."""
    wcpu, rcpu = _cpus(pin)
    ctx = mp.get_context("spawn")
    root = tempfile.mkdtemp(prefix="kstore-tail-", dir=dir_)
    path = os.path.join(root, "t-0")
    try:
        if mode not in ("pipe", "bell", "bellspin"):
            from kstore.log import Log
            Log.open(path).close()
        rconn, wconn = ctx.Pipe(duplex=False)
        w_ready, r_ready, go = ctx.Event(), ctx.Event(), ctx.Event()
        out = ctx.Queue()
        returned = ctx.Array("q", n, lock=False)
        w = ctx.Process(target=_writer, args=(mode, path, n, batch, rate, wconn, w_ready, go,
                                              returned, wcpu))
        w.start()
        w_ready.wait(60)
        r = ctx.Process(target=_reader, args=(mode, root, n, batch, spin, rconn, r_ready, out,
                                              rcpu))
        r.start()
        r_ready.wait(60)
        time.sleep(0.2)
        go.set()
        res = out.get(timeout=max(120.0, 3 * n / rate))
        w.join(60)
        r.join(60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    lat, wall = res["lat"], res["wall"] or 1e-9
    ref = res["refresh"]
    ret = [now - returned[(o + k) // batch] for o, count, now in res["handed"] for k in range(count)]
    return {"mode": mode, "batches": n, "batch": batch, "rate": rate, "records": len(lat),
            "p50_us": _pct(lat, 0.5), "p99_us": _pct(lat, 0.99), "p999_us": _pct(lat, 0.999),
            "ret_p50_us": _pct(ret, 0.5), "ret_p99_us": _pct(ret, 0.99),
            "reader_cpu_per_s": res["cpu"] / wall,
            "idle_cpu_per_s": None if res["idle_cpu"] is None else res["idle_cpu"] / IDLE_S,
            "refreshes": len(ref), "refresh_p50_us": _pct(ref, 0.5), "refresh_p99_us": _pct(ref, 0.99)}


def _after_idle(gaps: Sequence[float], reps: int, cpu: Optional[int], out) -> None:
    """The same work (CRC-32C of 16 KiB, hot in cache) timed back to back and right after a
    sleep of each gap, on the reader's CPU: what an idle vCPU costs a woken process's first
    microseconds (cache refills, a clock ramping up), which every wake-up above pays."""
    _pin(cpu)
    from kstore import _crc
    buf = bytes(16 << 10)
    res = {}
    for gap in gaps:
        xs = []
        for _ in range(reps):
            if gap:
                time.sleep(gap)
            t = _now()
            _crc.crc32c(buf)
            xs.append(_now() - t)
        res[gap] = _pct(xs, 0.5)
    out.put(res)


def cpu_after_idle(gaps: Sequence[float] = (0.0, 0.001, 0.01), reps: int = 300,
                   pin: bool = True) -> dict[str, Any]:
    """_after_idle in a fresh process: {"mode": "cpu_after_idle", "hot_us": ..., then for each
    gap g > 0 "after_<g ms>ms_us" and "factor_<g ms>ms"} (medians)."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_after_idle, args=(list(gaps), reps, _cpus(pin)[1], out))
    p.start()
    res = out.get(timeout=120)
    p.join(60)
    hot = res[0.0] if 0.0 in res else float("nan")
    row: dict[str, Any] = {"mode": "cpu_after_idle", "hot_us": hot}
    for g, v in res.items():
        if g:
            row[f"after_{g * 1000:g}ms_us"] = v
            row[f"factor_{g * 1000:g}ms"] = v / hot if hot else float("nan")
    return row


def run(n: int = 2000, rate: float = 1000.0, batches: int = 600, batch_rate: float = 100.0,
        spin: float = 0.005, dir_: Optional[str] = None, pin: bool = True) -> list[dict[str, Any]]:
    """Every mode in one run: 1000-record batches (as producers write: the realistic case,
    first), then single records. A batch's records share one latency, so the batched p99 is
    a batch's: 600 batches make it the 7th worst (of 200 it was the 3rd worst: a noisy
    estimate on a host whose wake-ups drift)."""
    out = []
    for mode in ("pipe", "wait", "spin"):
        out.append(run_mode(mode, batches, 1000, batch_rate, spin, dir_, pin))
    for mode in ("pipe", "bell", "bellspin", "wait", "spin", "poll"):
        out.append(run_mode(mode, n, 1, rate, spin, dir_, pin))
    out.append(cpu_after_idle((0.0, 1 / rate, 1 / batch_rate), pin=pin))
    return out


def print_report(rows: Sequence[dict[str, Any]]) -> None:
    print("append in process A -> visible to a reader in process B (CLOCK_MONOTONIC in the value)")
    print(f"{'mode':<6} {'batch':>5} {'rate/s':>7} {'records':>8} {'p50 µs':>9} {'p99 µs':>9} "
          f"{'p99.9 µs':>9} {'ret p50':>8} {'ret p99':>8} {'cpu/s':>6} {'idle':>6} "
          f"{'refresh p50/p99 µs':>20}")
    for r in rows:
        if r["mode"] == "cpu_after_idle":
            continue
        idle = "-" if r["idle_cpu_per_s"] is None else f"{r['idle_cpu_per_s']:.3f}"
        ref = "-" if not r["refreshes"] else f"{r['refresh_p50_us']:.0f}/{r['refresh_p99_us']:.0f}"
        print(f"{r['mode']:<6} {r['batch']:>5} {r['rate']:>7.0f} {r['records']:>8} {r['p50_us']:>9.1f} "
              f"{r['p99_us']:>9.1f} {r['p999_us']:>9.1f} {r['ret_p50_us']:>8.1f} {r['ret_p99_us']:>8.1f} "
              f"{r['reader_cpu_per_s']:>6.3f} {idle:>6} {ref:>20}")
    print("p50..p99.9: from the call of append; ret: from its return to read() handing the "
          "records over (can be < 0: visible before append returned)")
    print("pipe: the same two processes passing the timestamp over a pipe (the reference); bell: "
          "the notification word alone (futex wake, no log; bellspin: spinning on it first); spin: wait_for(spin=...) busy-waits first; "
          "poll: read + 100 ms sleeps (consume --follow before wait_for)")
    for r in rows:
        if r["mode"] == "cpu_after_idle":
            after = ", ".join(f"{k[6:-3]} {v:.1f} µs ({r['factor_' + k[6:-3]]:.1f}x)"
                              for k, v in r.items() if k.startswith("after_"))
            print(f"the reader's CPU after idling: CRC-32C of 16 KiB hot {r['hot_us']:.1f} µs; "
                  f"right after a sleep of {after}: every wake-up above pays this")


def main(records: Optional[int] = None, as_json: bool = False, dir_: Optional[str] = None) -> int:
    """The `kstore bench --tail` entry (records: single-record appends; default 2000 at 1000/s)."""
    rows = run(n=records or 2000, dir_=dir_)
    if as_json:
        print(json.dumps(rows, indent=2))
    else:
        print_report(rows)
    return 0
