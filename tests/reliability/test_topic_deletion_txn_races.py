"""A topic deleted and re-created under the same name while every reader, each in its own
process, reads it (reliability tier). The writer (a LogManager, 1200-byte segments) appends
plain records, four producers' transactions (four in ten aborted) and runs of markers for
1.5 s, aborts the transactions still open and ends the log in a run of markers (the compacted
variant then cleans it: the aborted batches at its end are emptied away); the readers reach
that end and wait there (once each has read a record). It deletes the topic, creates it again, writes the same workload
for 1.5 s, then END and markers.

The readers of test_read_committed_races (Consumer at both isolation levels, a group member
closed and reopened, AsyncConsumer, a StoreReader tail loop, `kstore consume --follow` plain,
read_committed and --group) each return the old topic's records as written there, then the
new topic's: every record of the new topic (read_committed: every committed one), once, in
offset order, all the new log holds (without a cleaner: exactly that); read_committed ones no
aborted record."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from batch_helpers import TXN_BATCH_SOURCE
from race_readers import RC, READER, READERS

import kstore

WRITER = TXN_BATCH_SOURCE + r"""
import json, random, sys, time
import kstore
d, seconds, seed, mode = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = {"log.segment.bytes": "1200", "log.segment.delete.delay.ms": "0", "log.cleaner.threads": "1",
       "log.cleaner.backoff.ms": "50", "log.initial.task.delay.ms": "0", "file.delete.delay.ms": "0"}
topic = {"cleanup.policy": mode}
if mode == "compact":
    topic.update({"min.cleanable.dirty.ratio": "0", "delete.retention.ms": "60000"})
rng = random.Random(seed)
outcome, where, n = {}, [], 0

def work(lg, inc):
    global n
    open_txn = {}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r, pid = rng.random(), rng.randrange(1, 5)
        if r < 0.35:
            v, k = "p%d" % n, "k%d" % rng.randrange(20)
            where.append((inc, lg.append([(k.encode(), v.encode())]).first_offset, k, v))
        elif r < 0.7:
            vals = [(b"k%d" % rng.randrange(20), ("t%d-%d" % (pid, n + i)).encode())
                    for i in range(rng.randrange(1, 4))]
            n += len(vals)
            first, _count = lg.append_batches(batch(pid, vals))
            where.extend((inc, first + i, k.decode(), v.decode()) for i, (k, v) in enumerate(vals))
            open_txn.setdefault(pid, []).extend(v.decode() for _k, v in vals)
        elif pid in open_txn:
            abort = rng.random() < 0.4
            lg.append_batches(batch(pid, [], control=0 if abort else 1))
            outcome.update((v, "a" if abort else "c") for v in open_txn.pop(pid))
        elif rng.random() < 0.3:                     # markers of transactions with no data
            lg.append_batches(b"".join(batch(pid + 10, [], control=1)
                                       for _ in range(rng.randrange(1, 30))))
        n += 1
        if rng.random() < 0.05:
            time.sleep(0.002)
    return open_txn

with kstore.LogManager(d, cfg) as m:
    m.create_topic("t", 1, topic)
    print("ready", flush=True)
    lg = m.log("t", 0)
    for pid, vals in work(lg, 1).items():       # the old topic ends in aborts and markers
        lg.append_batches(batch(pid, [], control=0))
        outcome.update((v, "a") for v in vals)
    lg.append_batches(b"".join(batch(11, [], control=1) for _ in range(20)))
    if mode == "compact":
        lg.roll()
        m.clean_now()
    sys.stdin.readline()                         # the readers are waiting at its end
    m.delete_topic("t")
    time.sleep(rng.random() * 0.3)
    m.create_topic("t", 1, topic)
    lg = m.log("t", 0)
    for pid, vals in work(lg, 2).items():
        lg.append_batches(batch(pid, [], control=1))
        outcome.update((v, "c") for v in vals)
    where.append((2, lg.append([(b"end", b"END")]).first_offset, "end", "END"))
    lg.append_batches(b"".join(batch(11, [], control=1) for _ in range(25)))
    print(json.dumps([outcome, where]), flush=True)
    sys.stdin.readline()                 # the readers are done: close
"""


@pytest.mark.parametrize("mode", ["delete", "compact"])
def test_every_reader_beside_a_transactional_topic_deleted_and_created_again(tmp_path, watchdog, mode):
    watchdog(240)
    d = str(tmp_path / "data")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    seed = int(os.environ.get("KSTORE_RACE_SEED", "17"))
    names = [k for k in READERS if k != "once-rc"]   # (plain consume: no topic, no exit 0)
    w = subprocess.Popen([sys.executable, "-c", WRITER, d, "1.5", str(seed), mode],
                         cwd=str(tmp_path), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    readers = {}
    try:
        assert w.stdout.readline() == "ready\n", w.stderr.read()
        for name in names:
            readers[name] = subprocess.Popen(
                [sys.executable, "-c", READER, d, "cli" if name.startswith("cli") else name,
                 str(seed), *READERS[name]], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 40      # each reader has read a record of the old topic
        while len(list(tmp_path.glob("data-started-*"))) < len(names) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)                       # and reaches its end
        w.stdin.write("\n")
        w.stdin.flush()
        line = w.stdout.readline()
        assert line, w.stderr.read()
        outcome, where = json.loads(line)
        got = {}
        for name, p in readers.items():
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (name, err[-3000:])
            got[name] = json.loads(out)
        with kstore.StoreReader(d) as st:
            final = [(r.offset, r.key and r.key.decode(), r.value and r.value.decode())
                     for r in st.log("t", 0)]
        w.stdin.write("\n")
        w.stdin.flush()
        assert w.wait(30) == 0, w.stderr.read()
    finally:
        for p in [w, *readers.values()]:
            if p.poll() is None:
                p.kill()
                p.wait()
    old = {tuple(x[1:]) for x in where if x[0] == 1}
    new = {tuple(x[1:]) for x in where if x[0] == 2}
    assert sum(v == "a" for v in outcome.values()) > 5 and len(old) > 50 and len(new) > 50

    def committed(r):
        return r[2] is None or r[2][0] != "t" or outcome.get(r[2]) == "c"

    began_old = [k for k, (x, *_r) in got.items() if tuple(x[0]) in old]
    assert len(began_old) == len(got), began_old          # the deletion came under every reader
    for name, (recs, _after, _runs, _cpu, errs) in got.items():
        recs = [tuple(r) for r in recs]
        assert recs and recs[-1][2] == "END", (name, recs[-3:], errs)
        i = next(i for i, r in enumerate(recs) if r not in old)      # where the new topic's begin
        before, after = recs[:i], recs[i:]
        assert [r for r in after if r not in new] == [], name        # the old topic's, then the new
        for part in (before, after):
            assert [o for o, _k, _v in part] == sorted({o for o, _k, _v in part}), name
        if name in RC:
            assert [r for r in recs if not committed(r)] == [], name
        want = [r for r in final if name not in RC or committed(r)]
        assert [r for r in want if r not in set(after)] == [], (name, errs)   # none lost
        if mode == "delete":
            assert after == want, name                     # (the cleaner removes some)
