"""Consumer group members in 3 processes, killed with SIGKILL and restarted at random for ~20 s.

Each member process logs (one O_APPEND line per event, a system-wide monotonic clock) when it
has taken a partition's owner lock ("acq", logged after taking it) and when it gives one up
("rel", logged before releasing it); a killed process's partitions end at the moment the test
sent SIGKILL (its real end is later: the kernel drops its flocks at exit). From these:

- no partition is owned by two processes at once (the logged intervals are inside the real
  ones, so an overlap of logged intervals is a real one);
- after each death every partition is owned again (by the survivors) within the heartbeat
  interval plus a rebalance: reported as p50/p99 and asserted below the session timeout;
- generations are strictly increasing, in the order the GroupMetadata records were written
  (under group.lock) and as every process saw them;
- join latency (join() call to return, and to owning the whole assignment) is reported.
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TESTS = str(Path(__file__).resolve().parent.parent)
HEARTBEAT_MS = 200
SESSION_MS = 5000
PARTITIONS = {"a": 6, "b": 3}
ALL = {f"{t}-{p}" for t, n in PARTITIONS.items() for p in range(n)}

MEMBER = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from group_helpers import FakeCoordinator
from kstore import _notify
from kstore.group_membership import GroupMember
log_dir, events, record, hb, session = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
counts = json.loads(sys.argv[7])
fd = os.open(events, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
pid = os.getpid()

def emit(kind, **kw):
    kw.update(kind=kind, pid=pid, t=time.monotonic_ns())
    os.write(fd, (json.dumps(kw) + "\n").encode())

if sys.argv[8] == "real":
    from kstore.group_coordinator import GroupCoordinator
    co = GroupCoordinator(log_dir, num_partitions=1)
else:
    co = FakeCoordinator(log_dir, record)
m = GroupMember(co, "chaos", topics=sorted(counts), partitions_for=lambda t: counts[t],
                list_topics=lambda: list(counts), heartbeat_interval_ms=hb, session_timeout_ms=session)

def handle(c):
    for tp in sorted(c.assigned):
        emit("acq", tp=str(tp), gen=c.generation)
    if c.revoked:
        for tp in sorted(c.revoked):
            emit("rel", tp=str(tp), gen=c.generation)
        m.release(c.revoked)
    emit("gen", gen=c.generation, owned=sorted(map(str, m.owned())),
         target=sorted(map(str, m.assignment())))

t0 = time.monotonic_ns()
c = m.join()
emit("joined", dt=time.monotonic_ns() - t0, start=t0)
handle(c)
bell = m.notify_word()
while True:
    armed = bell.arm()
    c = m.poll()
    if c is not None:
        handle(c)
        continue
    _notify.wait_any([bell], [armed], max(0.001, min(m.poll_timeout(), 0.05)))
"""


def spawn(tmp, events, record, coordinator):
    return subprocess.Popen([sys.executable, "-c", MEMBER, TESTS, str(tmp), events, record,
                             str(HEARTBEAT_MS), str(SESSION_MS), json.dumps(PARTITIONS), coordinator],
                            cwd=str(tmp))


def stored_generations(tmp, coordinator, record):
    """The generations of the group's GroupMetadata records in the order they were written:
    the fake coordinator's lines, or the real one's __consumer_offsets-0 records (after the
    kill -9s: a read-only open validates up to the last whole batch)."""
    gens = []
    if coordinator == "fake":
        with open(record) as f:
            for line in f:
                try:
                    gens.append(json.loads(line)["generation"])
                except ValueError:        # a line cut by SIGKILL mid-write
                    pass
        return gens
    from kstore.group_records import GroupKey, parse_group_value, parse_key
    from kstore.log import Log
    with Log.open(os.path.join(str(tmp), "__consumer_offsets-0"), read_only=True) as lg:
        off = lg.log_start_offset
        while off < lg.log_end_offset:
            recs = lg.read(off, 1000)
            for r in recs:
                if isinstance(parse_key(r.key), GroupKey) and r.value is not None:
                    gens.append(parse_group_value(r.value).generation)
            off = recs[-1].offset + 1
    return gens


def wait_joined(events, pid, proc, timeout):
    """Until the member process pid has logged its join (it must not have died)."""
    deadline = time.monotonic() + timeout
    needle = f'"kind": "joined", "pid": {pid}'
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"member {pid} exited with {proc.returncode}"
        try:
            with open(events) as f:
                if needle in f.read():
                    return
        except FileNotFoundError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"member {pid} did not join within {timeout} s")


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


@pytest.mark.parametrize("coordinator", ["fake", "real"])
def test_three_members_killed_and_restarted(tmp_path, watchdog, reliability_counts, coordinator):
    """coordinator "real": GroupCoordinator, each generation's record appended to
    __consumer_offsets under its partition flock by processes that get killed mid-append."""
    watchdog(180)
    events = str(tmp_path / "events.jsonl")
    record = str(tmp_path / "generations.jsonl")
    rnd = random.Random(int(os.environ.get("KSTORE_CHAOS_SEED", "1515")))
    procs = [spawn(tmp_path, events, record, coordinator) for _ in range(3)]
    kills: dict[int, int] = {}            # pid -> monotonic ns when SIGKILL was sent
    deaths = []                           # (t_kill, pid)
    end = time.monotonic() + float(os.environ.get("KSTORE_CHAOS_SECONDS", "20"))
    try:
        while time.monotonic() < end:
            i = rnd.randrange(3)
            p = procs[i]
            # kill members, not interpreters starting up (~1-3 s on a loaded machine)
            wait_joined(events, p.pid, p, 30)
            time.sleep(rnd.uniform(0.1, 0.9))
            if p.poll() is None:
                t = time.monotonic_ns()
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=30)
                kills[p.pid] = t
                deaths.append((t, p.pid))
            if rnd.random() < 0.8:        # mostly restart at once; sometimes stay one short
                procs[i] = spawn(tmp_path, events, record, coordinator)
            else:
                time.sleep(rnd.uniform(0.2, 0.8))
                procs[i] = spawn(tmp_path, events, record, coordinator)
        time.sleep(2.0)                   # let the last generation settle
    finally:
        t_end = time.monotonic_ns()
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(timeout=30)
                kills[p.pid] = t_end
    evs = []
    with open(events) as f:
        for line in f:
            try:
                evs.append(json.loads(line))
            except ValueError:            # a line cut by SIGKILL mid-write
                pass
    evs.sort(key=lambda e: e["t"])

    # 1. no partition owned by two processes at once
    intervals: dict[str, list] = {tp: [] for tp in ALL}
    for e in evs:
        if e["kind"] == "acq":
            intervals[e["tp"]].append([e["t"], None, e["pid"]])
        elif e["kind"] == "rel":
            for iv in reversed(intervals[e["tp"]]):
                if iv[2] == e["pid"] and iv[1] is None:
                    iv[1] = e["t"]
                    break
    for tp, ivs in intervals.items():
        for iv in ivs:
            if iv[1] is None:
                iv[1] = kills.get(iv[2], t_end)
        ivs.sort()
        for a, b in zip(ivs, ivs[1:]):
            assert a[2] == b[2] or a[1] <= b[0], f"{tp} owned by {a[2]} and {b[2]} at once: {a} {b}"
        for a in ivs:                       # non-adjacent overlaps too
            for b in ivs:
                if a is not b and a[2] != b[2]:
                    assert a[1] <= b[0] or b[1] <= a[0], f"{tp} owned by {a[2]} and {b[2]} at once"

    # 2. after each death, every partition owned again (coverage of all 9 by live processes)
    def owners_at(t):
        return {tp for tp, ivs in intervals.items() if any(s <= t < e for s, e, _ in ivs)}
    takeover = []
    measurable = 0
    acq_times = sorted({e["t"] for e in evs if e["kind"] == "acq"})
    for t_kill, _pid in deaths:
        lost = {tp for tp, ivs in intervals.items() if any(p == _pid and s < t_kill <= e for s, e, p in ivs)}
        if not lost:
            continue                      # killed before it owned anything: nothing to take over
        if not any(e["kind"] == "joined" and e["t"] < t_kill and kills.get(e["pid"], t_end) > t_kill
                   for e in evs):
            continue                      # no other member yet (all still starting up)
        measurable += 1
        nxt = [t for t, _ in deaths if t > t_kill]
        limit = nxt[0] if nxt else t_end
        done = next((t for t in acq_times if t_kill < t < limit and owners_at(t) == ALL), None)
        if done is not None:
            takeover.append((done - t_kill) / 1e6)
            if os.environ.get("KSTORE_CHAOS_DEBUG") and done - t_kill > HEARTBEAT_MS * 1e6:
                print("SLOW", _pid, [(round((e["t"] - t_kill) / 1e6, 1), e["pid"], e["kind"], e.get("tp"), e.get("gen"))
                                     for e in evs if t_kill - 50e6 < e["t"] <= done])
    # a death whose takeover a next kill cut short is not measured
    assert measurable >= 5 and len(takeover) >= measurable // 2, (len(takeover), measurable, len(deaths))
    assert max(takeover) < SESSION_MS, takeover

    # 3. generations strictly increasing, as written and as each process saw them
    gens = stored_generations(tmp_path, coordinator, record)
    assert gens == sorted(set(gens)) and len(gens) > len(deaths)
    seen: dict[int, int] = {}
    for e in evs:
        if e["kind"] == "gen":
            assert e["gen"] >= seen.get(e["pid"], 0), e
            seen[e["pid"]] = e["gen"]

    # 4. join latency: join() itself, and join() to owning the whole assignment
    joins = [e["dt"] / 1e6 for e in evs if e["kind"] == "joined"]
    full = []
    started = {e["pid"]: e["start"] for e in evs if e["kind"] == "joined"}
    done_pids = set()
    for e in evs:
        if e["kind"] == "gen" and e["pid"] not in done_pids and e["target"] and e["owned"] == e["target"]:
            done_pids.add(e["pid"])
            full.append((e["t"] - started[e["pid"]]) / 1e6)
    figures = {
        "deaths": len(deaths), "generations": len(gens),
        "takeover_ms_p50": round(pct(takeover, 0.5), 1), "takeover_ms_p99": round(pct(takeover, 0.99), 1),
        "takeover_ms_max": round(max(takeover), 1), "heartbeat_ms": HEARTBEAT_MS,
        "join_ms_p50": round(pct(joins, 0.5), 2), "join_ms_p99": round(pct(joins, 0.99), 2),
        "join_to_owned_ms_p50": round(pct(full, 0.5), 1), "join_to_owned_ms_p99": round(pct(full, 0.99), 1),
    }
    print("group chaos:", figures, sorted(round(x) for x in takeover))
    reliability_counts[f"group_membership_chaos_{coordinator}"] = figures
