"""txn_prefix beside a writer process: read_committed readers placed inside open transactions
(a seek, a committed offset, `kstore consume --offset` in a third process, an AsyncConsumer, a
long-lived Consumer that seeks back and forth) while the writer opens, commits and aborts
transactions of four producers among plain records, rolls, moves the log start inside open
transactions (delete_records; the segment of the earliest open transaction's first batch
kept: see txn_prefix's known limit) and truncates above the last stable offset and the last
marker (so no decided transaction opens again and the LSO never goes down).

The test drives the writer one statement at a time and keeps the log as Kafka's broker would
see it: every record's offset and transaction, each transaction's outcome, and the LSO after
each step. While the writer runs, every record a reader returns must be at its offset, plain or
of a transaction committed in the end, and below the LSO of the step after the one the reader
saw completed when it got it (the LSO only rises here, so that bound is a later state's). At
the end, with a transaction of pid 1 left open in front of committed records and again once it
commits, every kind of reader placed at each of several offsets returns exactly the committed
records from there to the LSO."""
from __future__ import annotations

import ast
import asyncio
import bisect
import os
import random
import subprocess
import sys
import threading

from kstore import AsyncConsumer, Consumer, TopicPartition as TP

from batch_helpers import txn_batch
from writer_process import WriterProcess

NOW = 1_700_000_000_000
T0 = TP("t", 0)
PIDS = (1, 2, 3, 4)
STEPS = 160


class Oracle:
    """The log as the writer made it: records (offset, value, txn), open transactions, outcomes,
    and the LSO after each step."""

    def __init__(self) -> None:
        self.records: list[tuple[int, bytes, object]] = []
        self.where: dict[bytes, tuple[int, object]] = {}   # value -> (offset, txn)
        self.open: dict[int, tuple[int, object]] = {}       # pid -> (first offset, txn)
        self.outcome: dict[object, str] = {}
        self.start = self.end = 0
        self.last_marker = -1
        self.lsos: list[int] = []
        self.truncations: list[int] = []                      # steps that truncated
        self.lock = threading.Lock()

    def lso(self) -> int:
        first = min((f for f, _t in self.open.values()), default=self.end)
        return max(first, self.start)

    def add(self, value: bytes, txn) -> None:
        self.records.append((self.end, value, txn))
        self.where[value] = (self.end, txn)
        self.end += 1

    def step_done(self) -> None:
        with self.lock:
            self.lsos.append(self.lso())

    def steps(self) -> int:
        with self.lock:
            return len(self.lsos)

    def bound(self, k: int) -> int:
        """The LSO after the step following the k steps a reader saw completed (asked once
        every step is done): the most that reader can have seen, the LSO only rising."""
        return self.lsos[min(k, len(self.lsos) - 1)]

    def committed(self, value: bytes) -> bool:
        txn = self.where[value][1]
        return txn is None or self.outcome.get(txn) == "commit"

    def expected(self, pos: int) -> list[tuple[int, bytes]]:
        lso = self.lso()
        return [(o, v) for o, v, _t in self.records
                if max(pos, self.start) <= o < lso and self.committed(v)]


def _writer_step(w: WriterProcess, bases_file: str, o: Oracle, rng: random.Random, n: int) -> None:
    """One random statement; the oracle learns it first (under its lock), so that whatever a
    reader gets from the statement is known."""
    r = rng.random()
    v = b"v%d" % n
    if r < 0.3:
        with o.lock:
            o.add(v, None)
        w.run(f"lg.append([({v!r}, {v!r}, NOW)])")
    elif r < 0.6:
        pid = rng.choice(PIDS)
        with o.lock:
            if pid not in o.open:
                o.open[pid] = (o.end, (pid, n))
            o.add(v, o.open[pid][1])
        w.run(f"lg.append_batches({txn_batch(0, pid, [v], ts=NOW)!r})")
    elif r < 0.8 and o.open:
        pid = rng.choice(sorted(o.open))
        kind = "commit" if rng.random() < 0.7 else "abort"
        with o.lock:
            o.outcome[o.open.pop(pid)[1]] = kind
            o.last_marker = o.end
            o.end += 1
        w.run(f"lg.append_batches({txn_batch(0, pid, control=1 if kind == 'commit' else 0, ts=NOW)!r})")
    elif r < 0.87:
        w.run("lg.roll()")
    elif r < 0.94:
        # inside an open transaction, but not past its first batch's segment (the writer's
        # own list of segments: a reader's listing may lag)
        w.run(f"open({bases_file!r}, 'w').write(repr([s.base_offset for s in lg.segments]))")
        with open(bases_file) as f:
            bases = ast.literal_eval(f.read())
        cap = o.end
        if o.open:
            first = min(f for f, _t in o.open.values())
            i = bisect.bisect_right(bases, first)
            cap = min(cap, bases[i] - 1 if i < len(bases) else cap)
        x = rng.randint(o.start, max(o.start, cap))
        with o.lock:
            o.start = max(o.start, x)
            o.records = [r for r in o.records if r[0] >= o.start]
        w.run(f"lg.delete_records({x})")
    else:
        low = max(o.lso(), o.last_marker + 1, o.start)
        if low < o.end:
            t = rng.randint(low, o.end)
            with o.lock:
                o.truncations.append(len(o.lsos))
                o.records = [r for r in o.records if r[0] < t]
                for pid, (first, _txn) in list(o.open.items()):
                    if first >= t:
                        del o.open[pid]           # its batches all cut: never ended, never read
                o.end = t
            w.run(f"lg.truncate_to({t})")


def _check(name: str, got: list, k: int, o: Oracle, errors: list) -> None:
    """got: (offset, value) pairs one reader returned, in order, before it saw more than k
    steps done (checked once the writer is done)."""
    bound = o.bound(k)
    offs = [off for off, _v in got]
    if offs != sorted(set(offs)):
        errors.append((name, "out of order or twice", got))
    for off, v in got:
        if v not in o.where or o.where[v][0] != off:
            errors.append((name, "not at its offset", off, v))
        elif not o.committed(v):
            errors.append((name, "not committed", off, v, o.where[v][1]))
        elif off >= bound:
            errors.append((name, "at or past the LSO", off, v, bound, k))


def _place(o: Oracle, rng: random.Random) -> int:
    """An offset inside an open transaction if one is open (past its first), else any."""
    lo, hi = o.lso(), o.end
    return rng.randint(lo + 1, hi) if hi > lo else rng.randint(o.start, hi)


def _cli(d: str, pos: int, cwd: str) -> tuple[int, list, bytes]:
    r = subprocess.run([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                        "--partition", "0", "--offset", str(pos), "--isolation-level",
                        "read_committed", "--print-offset"], cwd=cwd, capture_output=True,
                       timeout=60, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    out = []
    for ln in r.stdout.decode().splitlines():
        off, v = ln.split("\t", 1)
        out.append((int(off[len("Offset:"):]), v.encode()))
    return r.returncode, out, r.stderr


def _poll(c, n=2) -> list:
    return [(r.offset, r.value) for _ in range(n) for recs in c.poll(50).values() for r in recs]


def _readers(d: str, cwd: str, o: Oracle, done: threading.Event, errors: list, counts: dict,
             results: list):
    def seeker(seed):
        rng = random.Random(seed)
        while not done.is_set():
            with o.lock:
                pos = _place(o, rng)
            with Consumer(d, isolation_level="read_committed") as c:
                c.assign([T0])
                c.seek(T0, pos)
                got = _poll(c)
            results.append(("seek", got, o.steps()))
            counts["seek"] += 1

    def follower(seed):
        rng = random.Random(seed)
        with Consumer(d, isolation_level="read_committed", auto_offset_reset="earliest") as c:
            c.assign([T0])
            while not done.is_set():
                if rng.random() < 0.2:
                    with o.lock:
                        pos = _place(o, rng)
                    c.seek(T0, pos)
                got = _poll(c, 1)
                results.append(("follow", got, o.steps()))
                counts["follow"] += 1

    def cli(seed):
        rng = random.Random(seed)
        while not done.is_set():
            with o.lock:
                pos = _place(o, rng)
                cut = len(o.truncations)
            rc, got, err = _cli(d, pos, cwd)
            if rc != 0:
                with o.lock:
                    if len(o.truncations) == cut or b"past the log end" not in err:
                        errors.append(("cli", "failed", pos, err[-500:]))
                continue
            results.append(("cli", got, o.steps()))
            counts["cli"] += 1

    def asyncr(seed):
        rng = random.Random(seed)

        async def main():
            async with AsyncConsumer(d, isolation_level="read_committed") as c:
                c.assign([T0])
                while not done.is_set():
                    with o.lock:
                        pos = _place(o, rng)
                    c.seek(T0, pos)
                    got = [(r.offset, r.value) for recs in (await c.getmany(timeout_ms=50)).values()
                           for r in recs]
                    results.append(("async", got, o.steps()))
                    counts["async"] += 1
        asyncio.run(main())

    def guard(fn, seed):
        try:
            fn(seed)
        except Exception as e:            # a reader's failure fails the test, with its cause
            errors.append((fn.__name__, "raised", repr(e)))
    return [threading.Thread(target=guard, args=(fn, i), name=fn.__name__, daemon=True)
            for i, fn in enumerate((seeker, follower, cli, asyncr))]


def _all_agree(d: str, cwd: str, o: Oracle, positions: list[int]) -> None:
    for pos in positions:
        want = o.expected(pos)
        with Consumer(d, isolation_level="read_committed") as c:
            c.assign([T0])
            c.seek(T0, pos)
            assert _poll(c, 4) == want, ("seek", pos)
        with Consumer(d, group_id="g", enable_auto_commit=False) as c:
            c.assign([T0])
            c.commit({T0: pos})
        with Consumer(d, group_id="g", isolation_level="read_committed") as c:
            c.assign([T0])
            assert _poll(c, 4) == want, ("committed", pos)
        rc, got, err = _cli(d, pos, cwd)
        assert (rc, got) == (0, want), ("cli", pos, err)

        async def main(pos):
            async with AsyncConsumer(d, isolation_level="read_committed") as c:
                c.assign([T0])
                c.seek(T0, pos)
                return [(r.offset, r.value) for _ in range(4)
                        for recs in (await c.getmany(timeout_ms=50)).values() for r in recs]
        assert asyncio.run(main(pos)) == want, ("async", pos)


def test_readers_placed_inside_open_transactions_beside_a_writer(tmp_path, watchdog):
    watchdog(300)
    seed = int(os.environ.get("KSTORE_RACE_SEED", "17"))
    rng = random.Random(seed)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    o = Oracle()
    done = threading.Event()
    errors: list = []
    counts = {"seek": 0, "follow": 0, "cli": 0, "async": 0}
    results: list = []
    threads = []
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)")
        for n in range(10):                   # plain records first: something to read
            o.add(b"p%d" % n, None)
            w.run(f"lg.append([(b'p{n}', b'p{n}', NOW)])")
            o.step_done()
        threads = _readers(d, str(tmp_path), o, done, errors, counts, results)
        for t in threads:
            t.start()
        for n in range(STEPS):
            _writer_step(w, str(tmp_path / "bases"), o, rng, n)
            o.step_done()
        # the end: pid 1's transaction open in front of committed records of the others
        with o.lock:
            for pid in sorted(o.open):
                o.outcome[o.open.pop(pid)[1]] = "commit"
                w.run(f"lg.append_batches({txn_batch(0, pid, control=1, ts=NOW)!r})")
                o.end += 1
            o.open[1] = (o.end, (1, "last"))
            o.add(b"hung", o.open[1][1])
            w.run(f"lg.append_batches({txn_batch(0, 1, [b'hung'], ts=NOW)!r})")
            for n, pid in enumerate((2, 3, 2)):
                v = b"late%d" % n
                o.add(v, (pid, "late", n))
                o.outcome[(pid, "late", n)] = "commit"
                o.end += 1
                o.add(b"q%d" % n, None)
                w.run(f"lg.append_batches({txn_batch(0, pid, [v], ts=NOW)!r})",
                      f"lg.append_batches({txn_batch(0, pid, control=1, ts=NOW)!r})",
                      f"lg.append([(b'q{n}', b'q{n}', NOW)])")
        o.step_done()
        done.set()
        for t in threads:
            t.join(90)
        assert not any(t.is_alive() for t in threads)
        for name, got, k in results:
            _check(name, got, k, o, errors)
        assert errors == []
        assert all(n > 0 for n in counts.values()), counts
        first = o.open[1][0]
        positions = sorted({o.start, first, first + 1, first + 3, o.end})
        assert o.expected(first + 1) == [] and o.lso() == first
        _all_agree(d, str(tmp_path), o, positions)
        w.run(f"lg.append_batches({txn_batch(0, 1, control=1, ts=NOW)!r})")
        o.outcome[o.open.pop(1)[1]] = "commit"
        o.end += 1
        assert [v for _o, v in o.expected(first)][:2] == [b"hung", b"late0"]
        _all_agree(d, str(tmp_path), o, positions)
    finally:
        done.set()
        for t in threads:
            t.join(30)
        assert w.close() == 0
