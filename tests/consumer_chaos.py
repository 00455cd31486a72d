"""The consumer-group chaos run of issue 15, shared by the reliability test (60 s) and the fast
tier's short variant: N producer threads append to a topic through a LogManager in this process;
3 consumer processes of one group poll it; members are SIGKILLed and restarted at random.

Each member process writes what it does to its own event file with unbuffered O_APPEND writes
(so a kill loses nothing it did before): `A t p position committed` when a partition is assigned
to it (its owner lock held), `V t p` when it is revoked (after the auto-commit, before the
release), `R t p first last` for the records a poll returned. Times are CLOCK_MONOTONIC ns,
shared by every process. The parent samples the group's committed offsets all along and notes
when it killed each member. `check` then proves:
- every record of every partition was returned at least once;
- a member reads a partition only while it owns it, and no two members own one at once (an
  ownership runs from its A to its V, or to the moment before its process was killed);
- a member starts a partition at the group's committed offset and reads it contiguously, so the
  duplicates (counted) are exactly records after a member's last commit;
- committed offsets never go backwards (the samples, and the committed offsets members saw).
"""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

import kstore
from kstore import TopicPartition as TP
from kstore.group_coordinator import GroupCoordinator

TOPIC = "chaos"
GROUP = "chaos"

MEMBER = r"""
import os, sys, time, kstore
d, path = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
now = time.monotonic_ns

def ev(*parts):
    os.write(fd, (" ".join(map(str, parts)) + "\n").encode())

class Listener(kstore.ConsumerRebalanceListener):
    def on_partitions_revoked(self, revoked):
        t = now()
        for tp in revoked:
            ev("V", t, tp.partition)

    def on_partitions_assigned(self, assigned):
        for tp in sorted(assigned):
            committed = c.committed(tp)
            ev("A", now(), tp.partition, c.position(tp), -1 if committed is None else committed)

c = kstore.Consumer(d, "chaos", group_id="chaos", listener=Listener(), auto_offset_reset="earliest",
                    auto_commit_interval_ms=200, session_timeout_ms=2000, heartbeat_interval_ms=100,
                    max_poll_records=200)
ev("S", now(), os.getpid())
while True:
    got = c.poll(200)
    t = now()
    for tp, recs in got.items():
        ev("R", t, tp.partition, recs[0].offset, recs[-1].offset)
"""


@dataclass
class Incarnation:
    slot: int
    path: str
    proc: subprocess.Popen
    killed_ns: int | None = None   # SIGKILL about to be sent: no new owner before this
    dead_ns: int | None = None     # reaped: it held its flocks, and could read, until before this


@dataclass
class Result:
    records: int = 0
    duplicates: int = 0
    kills: int = 0                 # during the run (the final stop kills the rest too)
    incarnations: int = 0
    rebalances: int = 0
    commit_samples: int = 0
    notes: list = field(default_factory=list)


def run(tmp: str, seconds: float, partitions: int = 6, producers: int = 3, members: int = 3,
        seed: int = 0, drain_s: float = 60.0) -> Result:
    rng = random.Random(seed)
    d = os.path.join(tmp, "data")
    logs = os.path.join(tmp, "events")
    os.makedirs(logs)
    m = kstore.LogManager(d)
    m.create_topic(TOPIC, partitions)
    stop = threading.Event()
    errors: list[BaseException] = []
    incs: list[Incarnation] = []
    live: dict[int, Incarnation] = {}
    samples: list[tuple[int, dict]] = []
    kills = 0

    def produce(i: int) -> None:
        r = random.Random(seed * 100 + i)
        n = 0
        try:
            while not stop.is_set():
                k = r.randint(1, 20)
                m.append_batch(TOPIC, r.randrange(partitions),
                               [(b"p%d" % i, b"%d-%d" % (i, n + j)) for j in range(k)])
                n += k
                time.sleep(r.uniform(0.002, 0.02))
        except BaseException as e:       # re-raised by the main thread
            errors.append(e)

    def sample() -> None:
        try:
            with GroupCoordinator([d]) as gc:
                while not stop.is_set():
                    samples.append((time.monotonic_ns(), {tp: o.offset for tp, o in gc.fetch_offsets(GROUP).items()}))
                    time.sleep(0.1)
        except BaseException as e:
            errors.append(e)

    def start(slot: int) -> None:
        path = os.path.join(logs, f"m{len(incs)}.events")
        with open(path + ".err", "wb") as err:
            p = subprocess.Popen([sys.executable, "-c", MEMBER, d, path], cwd=tmp,
                                 stdout=subprocess.DEVNULL, stderr=err)
        inc = Incarnation(slot, path, p)
        incs.append(inc)
        live[slot] = inc

    def kill(inc: Incarnation) -> None:
        inc.killed_ns = time.monotonic_ns()
        inc.proc.send_signal(signal.SIGKILL)
        inc.proc.wait(timeout=30)
        inc.dead_ns = time.monotonic_ns()

    threads = [threading.Thread(target=produce, args=(i,), daemon=True) for i in range(producers)]
    threads.append(threading.Thread(target=sample, daemon=True))
    for t in threads:
        t.start()
    try:
        for s in range(members):
            start(s)
        end = time.monotonic() + seconds
        while time.monotonic() < end and not errors:
            time.sleep(rng.uniform(0.3, 2.0))
            slot = rng.randrange(members)
            inc = live.pop(slot, None)
            if inc is not None:
                kill(inc)
                kills += 1
            time.sleep(rng.uniform(0.0, 0.8))
            start(slot)
        stop.set()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads), "a producer or the sampler is stuck"
        if errors:
            raise errors[0]
        for s in range(members):
            inc = live.get(s)
            if inc is None or inc.proc.poll() is not None:
                start(s)
        ends = {TP(TOPIC, p): m.log(TOPIC, p).log_end_offset for p in range(partitions)}
        # drain: the survivors read (and commit) everything
        deadline = time.monotonic() + drain_s
        with GroupCoordinator([d]) as gc:
            while time.monotonic() < deadline:
                got = {tp: o.offset for tp, o in gc.fetch_offsets(GROUP).items()}
                samples.append((time.monotonic_ns(), got))
                if all(got.get(tp, -1) >= e for tp, e in ends.items()):
                    break
                time.sleep(0.2)
        time.sleep(0.3)
    finally:
        stop.set()
        for inc in list(live.values()):
            if inc.proc.poll() is None:
                kill(inc)
        m.close()
    res = check(incs, ends, samples)
    res.kills = kills
    res.incarnations = len(incs)
    res.commit_samples = len(samples)
    return res


def _events(inc: Incarnation) -> list[list[str]]:
    try:
        with open(inc.path) as f:
            text = f.read()
    except FileNotFoundError:
        return []                        # killed before it started
    lines = text.split("\n")
    # a kill may cut the last line short: only whole lines count
    return [ln.split() for ln in lines[:-1] if ln]


def check(incs: list[Incarnation], ends: dict, samples: list) -> Result:
    res = Result()
    owned: dict[int, list[tuple[int, int, int]]] = defaultdict(list)   # p -> (start, end, inc)
    # where a member may log a read: as owned, but a killed member keeps its flocks and may still
    # log one between the kill being sent and its death (its end there is dead_ns, not killed_ns)
    may_read: dict[int, list[tuple[int, int, int]]] = defaultdict(list)
    reads: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)   # p -> (t, first, last, inc)
    starts: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # p -> (t, position, committed)
    for n, inc in enumerate(incs):
        with open(inc.path + ".err") as f:
            err = f.read()
        assert "Traceback" not in err, f"member {n} failed:\n{err}"
        open_at: dict[int, int] = {}
        last_read: dict[int, int] = {}
        for ev in _events(inc):
            kind, t = ev[0], int(ev[1])
            if kind == "A":
                p, pos, committed = int(ev[2]), int(ev[3]), int(ev[4])
                assert p not in open_at, f"member {n} was assigned {p} twice"
                open_at[p] = t
                res.rebalances += 1
                if committed >= 0:
                    assert pos == committed, f"member {n} started {p} at {pos}, not at the commit {committed}"
                starts[p].append((t, pos, committed))
                last_read[p] = pos - 1
            elif kind == "V":
                p = int(ev[2])
                owned[p].append((open_at.pop(p), t, n))
                may_read[p].append(owned[p][-1])
            elif kind == "R":
                p, first, last = int(ev[2]), int(ev[3]), int(ev[4])
                assert p in open_at, f"member {n} read {p} without owning it"
                assert first == last_read[p] + 1, \
                    f"member {n} read {p} from {first} after {last_read[p]} (not contiguous)"
                last_read[p] = last
                reads[p].append((t, first, last, n))
        end = inc.killed_ns if inc.killed_ns is not None else time.monotonic_ns()
        for p, t in open_at.items():
            owned[p].append((t, end, n))
            may_read[p].append((t, inc.dead_ns if inc.dead_ns is not None else end, n))
    for p, spans in owned.items():
        spans.sort()
        for (_s1, e1, n1), (s2, _e2, n2) in zip(spans, spans[1:]):
            assert s2 >= e1, f"partition {p} owned by members {n1} and {n2} at once"
    for p, rs in reads.items():
        for t, _f, _l, n in rs:
            assert any(s <= t <= e and m == n for s, e, m in may_read[p]), \
                f"member {n} read {p} outside its ownership"
    for tp, e in ends.items():
        count = [0] * e
        for _t, first, last, _n in reads.get(tp.partition, []):
            for o in range(first, min(last, e - 1) + 1):
                count[o] += 1
        missing = [o for o, c in enumerate(count) if c == 0]
        assert not missing, f"{tp}: {len(missing)} records never consumed (first {missing[:5]})"
        res.records += e
        res.duplicates += sum(c - 1 for c in count if c > 1)
    for p, ss in starts.items():                 # the commits members saw, in time order
        ss.sort()
        seen = [c for _t, _pos, c in ss if c >= 0]
        assert seen == sorted(seen), f"partition {p}: committed offsets went backwards {seen}"
    best: dict = {}
    for _t, offs in sorted(samples, key=lambda s: s[0]):
        for tp, o in offs.items():
            assert o >= best.get(tp, -1), f"{tp}: committed offset went back from {best[tp]} to {o}"
            best[tp] = o
    return res
