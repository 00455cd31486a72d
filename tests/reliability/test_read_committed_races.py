"""Every reader, each in its own process, beside a transactional writer whose log start moves and
whose tail is cut (reliability tier). The writer (a LogManager, 1200-byte segments, retention
checks every 100 ms) appends plain records, four producers' transactions (four in ten
aborted; more at the end if fewer than 4 records were) and runs of markers of empty
transactions, for 3 s, and moves the log start:
delete_records inside an open transaction, inside a run of markers or near the end,
truncate_fully_and_start_at past the end, and retention.bytes / retention.ms ("delete"; the
"compact,delete" variant cleans at min.cleanable.dirty.ratio 0 as well); the "truncate" variant
cuts the tail with truncate_to at or past the last stable offset (inside an open transaction:
what no read_committed reader may have returned yet), and transactions whose marker was cut are
open again. The log ends in END then a run of markers.

Readers from the start until END: Consumer read_uncommitted and read_committed, a group member
closed and reopened every few polls, AsyncConsumer, a StoreReader tail loop, `kstore consume
--follow` (plain, read_committed, --group); and plain `kstore consume --isolation-level
read_committed` runs again and again, each of which must exit. Each reader's records come in
offset order, each once, each as written; none lost (a record the final log holds at or after
the reader's first was returned); read_committed ones return no record of a transaction not
committed. After END a reader polls on for 1 s: no record, and little CPU (no spin). Once the
writer is done, a plain read_committed consume prints exactly the committed records present."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from batch_helpers import TXN_BATCH_SOURCE
from race_readers import RC, READER, READERS

import kstore

WRITER = TXN_BATCH_SOURCE + r"""
import json, random, sys, time
import kstore
d, seconds, seed, mode = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = {"log.segment.bytes": "1200", "log.segment.delete.delay.ms": "0", "log.cleaner.threads": "1",
       "log.cleaner.backoff.ms": "50", "log.initial.task.delay.ms": "0",
       "log.retention.check.interval.ms": "100"}
topic = {"cleanup.policy": "delete" if mode == "truncate" else mode}
if mode != "truncate":
    topic.update({"retention.bytes": "15000", "retention.ms": "2500"})
if "compact" in mode:
    topic.update({"min.cleanable.dirty.ratio": "0", "delete.retention.ms": "100"})
rng = random.Random(seed)
where = []                       # (offset, key, value) of every record acknowledged
txns = []                        # [pid, [(offset, value)], marker offset or None, aborted]
open_txn = {}                    # pid -> its txns entry
bases = []                       # (first, last offset) of each batch (truncate mode)
n = 0

def floor(lg):
    # the lowest cut no read_committed reader can have read past: the last stable offset, and
    # past the marker of every transaction with data below it (a cut marker reopens its data)
    lso = min([t[1][0][0] for t in open_txn.values() if t[1]], default=lg.log_end_offset)
    return max([lso] + [t[2] + 1 for t in txns if t[2] is not None and t[1] and t[1][0][0] < lso])

def cut(x):
    # truncate_to(x): records at or past x are gone; a transaction whose marker went is open again
    # (whole batches: the one holding x goes, as Kafka's)
    global where, bases
    x = min([b for b, last in bases if last >= x], default=x)
    bases = [bl for bl in bases if bl[0] < x]
    where = [w for w in where if w[0] < x]
    open_txn.clear()
    for t in txns:
        t[1] = [dv for dv in t[1] if dv[0] < x]
        if t[2] is not None and t[2] >= x:
            t[2], t[3] = None, False
        if t[2] is None and t[1]:
            open_txn[t[0]] = t

with kstore.LogManager(d, cfg) as m:
    m.create_topic("t", 1, topic)
    lg = m.log("t", 0)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r, pid = rng.random(), rng.randrange(1, 5)
        if r < 0.3:
            v, k = "p%d" % n, "k%d" % rng.randrange(20)
            where.append((lg.append([(k.encode(), v.encode())]).first_offset, k, v))
            bases.append((where[-1][0], where[-1][0]))
        elif r < 0.62:
            vals = [(b"k%d" % rng.randrange(20), ("t%d-%d" % (pid, n + i)).encode())
                    for i in range(rng.randrange(1, 4))]
            n += len(vals)
            first, _count = lg.append_batches(batch(pid, vals))
            bases.append((first, first + len(vals) - 1))
            where += [(first + i, k.decode(), v.decode()) for i, (k, v) in enumerate(vals)]
            if pid not in open_txn:
                open_txn[pid] = [pid, [], None, False]
                txns.append(open_txn[pid])
            open_txn[pid][1] += [(first + i, v.decode()) for i, (_k, v) in enumerate(vals)]
        elif r < 0.88:
            if pid in open_txn:
                abort = rng.random() < 0.4
                t = open_txn.pop(pid)
                t[2], _c = lg.append_batches(batch(pid, [], control=0 if abort else 1))
                t[3] = abort
                bases.append((t[2], t[2]))
            elif rng.random() < 0.3:                 # markers of transactions with no data
                k = rng.randrange(1, 30)
                first, _c = lg.append_batches(b"".join(batch(pid + 10, [], control=1)
                                                       for _ in range(k)))
                bases.extend((first + i, first + i) for i in range(k))
        elif mode == "truncate":
            lo, end = floor(lg), lg.log_end_offset
            x = rng.randrange(lo, end + 1) if lo < end else end
            if x < end and min([b for b, last in bases if last >= x], default=x) >= lo:
                lg.truncate_to(x)
                cut(x)
        else:
            end, s = lg.log_end_offset, rng.random()
            opened = [t[1][0][0] for t in open_txn.values() if t[1]]
            if s < 0.05:
                lg.truncate_fully_and_start_at(end + rng.randrange(0, 3))
                open_txn.clear()                     # their data is gone
            elif s < 0.5 and opened:                 # inside an open transaction
                lg.delete_records(max(lg.log_start_offset, rng.randrange(min(opened), end + 1)))
            else:
                lg.delete_records(max(lg.log_start_offset, end - rng.randrange(0, 40)))
        n += 1
        if rng.random() < 0.05:
            time.sleep(0.002)
    for pid in list(open_txn):
        t = open_txn.pop(pid)
        t[2], _c = lg.append_batches(batch(pid, [], control=1))
    while sum(len(t[1]) for t in txns if t[3]) <= 3:     # aborted records, however slow the run
        pid = rng.randrange(1, 5)
        k, v = "k%d" % rng.randrange(20), "t%d-%d" % (pid, n)
        n += 1
        first, _c = lg.append_batches(batch(pid, [(k.encode(), v.encode())]))
        where.append((first, k, v))
        txns.append([pid, [(first, v)], lg.append_batches(batch(pid, [], control=0))[0], True])
    if mode != "truncate":               # (time retention would remove END before a slow reader)
        m.alter_topic_config("t", dict(topic, **{"retention.ms": "-1"}))
    where.append((lg.append([(b"end", b"END")]).first_offset, "end", "END"))
    lg.append_batches(b"".join(batch(11, [], control=1) for _ in range(25)))
    outcome = {}
    for t in txns:
        for _o, v in t[1]:
            outcome[v] = "a" if t[3] else "c"
    print(json.dumps([outcome, where]), flush=True)
    sys.stdin.readline()                 # the readers are done: close
"""

def _committed(r, outcome) -> bool:
    return r[2] is None or r[2][0] != "t" or outcome.get(r[2]) == "c"


def _check(name, recs, ever, outcome, final) -> None:
    assert recs and recs[-1][2] == "END", (name, recs[-3:])
    offsets = [o for o, _k, _v in recs]
    assert offsets == sorted(set(offsets)), name                 # in order, each once
    assert [r for r in recs if r not in ever] == [], name        # as written
    if name in RC:
        assert [r for r in recs if not _committed(r, outcome)] == [], name
    need = [r for r in final if r[0] >= recs[0][0] and (name not in RC or _committed(r, outcome))]
    have = set(recs)
    assert [r for r in need if r not in have] == [], name          # none lost


def _final(d: str) -> list:
    with kstore.StoreReader(d) as st:
        return [(r.offset, r.key and r.key.decode(), r.value and r.value.decode())
                for r in st.log("t", 0)]


def _run(tmp_path, mode, seed, names):
    d = str(tmp_path / "data")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    w = subprocess.Popen([sys.executable, "-c", WRITER, d, "3", str(seed), mode], cwd=str(tmp_path),
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    readers = {}
    try:
        assert w.stdout.readline() == "ready\n", w.stderr.read()
        for name in names:
            readers[name] = subprocess.Popen(
                [sys.executable, "-c", READER, d, "cli" if name.startswith("cli") else name,
                 str(seed), *READERS[name]], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
        line = w.stdout.readline()
        assert line, w.stderr.read()
        outcome, where = json.loads(line)
        got = {}
        for name, p in readers.items():
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (name, err[-3000:])
            got[name] = json.loads(out)
        for _ in range(5):           # (time retention may remove more meanwhile: again)
            final = _final(d)
            plain = subprocess.run([sys.executable, "-m", "kstore", "consume", "--log-dirs", d,
                                    "--topic", "t", "--from-beginning", "--print-offset",
                                    "--print-key", "--key-separator", "|", "--isolation-level",
                                    "read_committed"], capture_output=True, text=True, timeout=60,
                                   env=env)
            if _final(d) == final:
                break
        w.stdin.write("\n")
        w.stdin.flush()
        assert w.wait(30) == 0, w.stderr.read()
        if os.environ.get("KSTORE_RACE_DUMP"):           # for a failure's analysis
            with open(os.environ["KSTORE_RACE_DUMP"], "w") as f:
                json.dump([outcome, where, got], f)
    finally:
        for p in [w, *readers.values()]:
            if p.poll() is None:
                p.kill()
                p.wait()
    ever = {tuple(x) for x in where}
    assert plain.returncode == 0, plain.stderr
    printed = []
    for ln in plain.stdout.splitlines():
        o, k, v = ln.split("|", 2)
        printed.append((int(o[len("Offset:"):]), None if k == "null" else k, None if v == "null" else v))
    expect = [r for r in final if _committed(r, outcome)]
    assert (sorted(set(printed) - set(expect)), sorted(set(expect) - set(printed))) == ([], [])
    assert printed == expect
    assert sum(v == "a" for v in outcome.values()) > 3
    for name, (recs, after, runs, cpu, errs) in got.items():
        recs = [tuple(r) for r in recs]
        if not recs or recs[-1][2] != "END":
            print(name, errs)                                     # consume's stderr
        assert after == [], name
        assert cpu < 0.5, (name, cpu)                             # idle: no spin
        if name == "once-rc":
            for run in runs:
                run = [tuple(r) for r in run]
                assert [o for o, _k, _v in run] == sorted({o for o, _k, _v in run})
                assert [r for r in run if r not in ever or not _committed(r, outcome)] == []
            recs = [tuple(r) for r in runs[-1]]
        _check(name, recs, ever, outcome, final)


@pytest.mark.parametrize("mode", ["delete", "compact,delete"])
def test_every_reader_beside_log_start_moves_in_transactions(tmp_path, watchdog, mode):
    watchdog(240)
    _run(tmp_path, mode, int(os.environ.get("KSTORE_RACE_SEED", "11")), list(READERS))


def test_read_committed_readers_beside_truncation_inside_transactions(tmp_path, watchdog):
    watchdog(240)
    _run(tmp_path, "truncate", int(os.environ.get("KSTORE_RACE_SEED", "13")),
         ["rc", "group-rc", "async-rc", "cli-rc", "once-rc"])
