"""Every reader beside a compacting transactional writer, each in its own process (reliability
tier). The writer (a LogManager, 1500-byte segments, the cleaner thread at 50 ms backoff,
delete.retention.ms 100) appends plain records and tombstones, four producers' transactions
(four in ten aborted), and runs of markers of empty transactions, for 3 s; the compact,delete
variant also moves the log start with delete_records and retention.bytes. Readers from the
start until the writer's END record: Consumer read_uncommitted and read_committed, a group
member closed and reopened every few polls (resuming at its commits), AsyncConsumer.getmany,
a StoreReader tail loop (fetch or iter_chunks, then wait_for at fetch's position), `kstore
consume --follow` at both isolation levels and with --group.

Each reader's records come in offset order, each once, each as written; and every record the
log holds once the writer is done (a StoreReader's view, at or after where the reader started)
was returned: a record still in the log was in it all along, so a reader that passed it lost it.
read_committed readers return no aborted record and every committed one still in the log.
Before read_skip, the tail loop stalled for good once the log ended in markers (the view never
refreshed); the consumers' reads past markers and emptied batches are the ones read_skip makes."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from batch_helpers import TXN_BATCH_SOURCE

import kstore

WRITER = TXN_BATCH_SOURCE + r"""
import json, random, struct, sys, time
import kstore
d, seconds, seed, mode = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


cfg = {"log.segment.bytes": "1500", "log.segment.delete.delay.ms": "0", "log.cleaner.threads": "1",
       "log.cleaner.backoff.ms": "50", "log.initial.task.delay.ms": "0",
       "log.retention.check.interval.ms": "100"}
topic = {"cleanup.policy": mode, "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "100"}
if mode != "compact":
    topic["retention.bytes"] = "20000"
rng = random.Random(seed)
outcome, open_txn, n, where = {}, {}, 0, []
with kstore.LogManager(d, cfg) as m:
    m.create_topic("t", 1, topic)
    lg = m.log("t", 0)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r, pid = rng.random(), rng.randrange(1, 5)
        if r < 0.35:
            v, k = "p%d" % n, "k%d" % rng.randrange(20)
            tomb = rng.random() < 0.1
            where.append((lg.append([(k.encode(), None if tomb else v.encode())]).first_offset, k,
                          None if tomb else v))
        elif r < 0.7:
            vals = [(b"k%d" % rng.randrange(20), ("t%d-%d" % (pid, n + i)).encode())
                    for i in range(rng.randrange(1, 4))]
            n += len(vals)
            first, _count = lg.append_batches(batch(pid, vals))
            where += [(first + i, k.decode(), v.decode()) for i, (k, v) in enumerate(vals)]
            open_txn.setdefault(pid, []).extend(v.decode() for _k, v in vals)
        elif r < 0.97:
            if pid in open_txn:
                abort = rng.random() < 0.4
                lg.append_batches(batch(pid, [], control=0 if abort else 1))
                outcome.update((v, "a" if abort else "c") for v in open_txn.pop(pid))
            elif rng.random() < 0.3:                 # markers of transactions with no data
                lg.append_batches(b"".join(batch(pid + 10, [], control=1)
                                           for _ in range(rng.randrange(1, 30))))
        elif mode != "compact" and rng.random() < 0.3:
            lg.delete_records(max(lg.log_start_offset, lg.log_end_offset - rng.randrange(5, 60)))
        n += 1
        if rng.random() < 0.05:
            time.sleep(0.002)
    for pid in list(open_txn):
        lg.append_batches(batch(pid, [], control=1))
        outcome.update((v, "c") for v in open_txn.pop(pid))
    where.append((lg.append([(b"end", b"END")]).first_offset, "end", "END"))
    lg.roll()
    m.clean_now()
    print(json.dumps([outcome, where]), flush=True)
    sys.stdin.readline()                 # the readers are done: close
"""

READER = r"""
import asyncio, json, random, signal, subprocess, sys, time
import kstore
from kstore import TopicPartition as TP
d, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
out = []
deadline = time.monotonic() + 60

def done():
    return out and out[-1][2] == "END"

def add(recs):
    out.extend((r.offset, r.key and r.key.decode(), r.value and r.value.decode()) for r in recs)

if mode in ("ru", "rc"):
    with kstore.Consumer(d, auto_offset_reset="earliest", max_poll_records=rng.choice([1, 7, 500]),
                         isolation_level="read_committed" if mode == "rc" else "read_uncommitted") as c:
        c.assign([TP("t", 0)])
        while not done() and time.monotonic() < deadline:
            for recs in c.poll(200).values():
                add(recs)
            if rng.random() < 0.05:
                time.sleep(0.3)          # a slow consumer: the cleaner runs meanwhile
elif mode == "group":                    # closed and opened again: resumes at its commits
    while not done() and time.monotonic() < deadline:
        with kstore.Consumer(d, group_id="g", auto_offset_reset="earliest",
                             max_poll_records=rng.choice([1, 7, 500])) as c:
            c.subscribe(["t"])
            for _ in range(rng.randrange(1, 6)):
                for recs in c.poll(100).values():
                    add(recs)
elif mode == "async":
    async def main():
        async with kstore.AsyncConsumer(d, auto_offset_reset="earliest") as c:
            c.assign([TP("t", 0)])
            while not done() and time.monotonic() < deadline:
                got = await c.getmany(timeout_ms=200, max_records=rng.choice([1, 9, 500]))
                for recs in got.values():
                    add(recs)
    asyncio.run(main())
elif mode == "tail":
    with kstore.StoreReader(d) as st:
        lg = st.log("t", 0)
        pos = lg.log_start_offset
        while not done() and time.monotonic() < deadline:
            budget = rng.choice([100, 5000, 1 << 20])
            try:
                if rng.random() < 0.5:          # iter_chunks to the end, then fetch's position
                    for chunk in lg.iter_chunks(pos, max_bytes=budget):
                        add(chunk)
                        pos = chunk[-1].offset + 1
                recs, pos = lg.fetch(pos, max_bytes=budget)
                add(recs)
            except kstore.OffsetOutOfRangeError:
                pos = lg.log_start_offset
                continue
            if not recs and not done():
                lg.wait_for(pos, 0.2)
else:                                    # consume --follow, more options after the mode
    # stopped with SIGTERM once END is printed (exit 143, as Kafka's console consumer); its
    # timeout is only a safety net, far above this test's pauses under load (race_readers.py)
    p = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                          "--from-beginning", "--follow", "--print-offset", "--print-key",
                          "--key-separator", "|", "--timeout-ms", "60000"] + sys.argv[4:],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stopped = False
    for line in p.stdout:
        o, k, v = line.decode().rstrip("\n").split("|", 2)
        if not stopped:
            out.append((int(o[len("Offset:"):]), None if k == "null" else k, None if v == "null" else v))
        if v == "END" and not stopped:
            p.send_signal(signal.SIGTERM)
            stopped = True
    err = p.stderr.read()
    assert p.wait(90) == (143 if stopped else 0), err[-2000:]
print(json.dumps(out))
"""

READERS = {"ru": [], "rc": [], "group": [], "async": [], "tail": [], "cli": [],
           "cli-rc": ["--isolation-level", "read_committed"], "cli-group": ["--group", "cg"]}


def _check(name: str, recs: list, written: dict, outcome: dict, final: list) -> None:
    assert recs and recs[-1][2] == "END", (name, recs[-3:])
    offsets = [o for o, _k, _v in recs]
    assert offsets == sorted(set(offsets)), name                 # in order, each once
    assert [(o, k, v) for o, k, v in recs if written.get(o) != (k, v)] == [], name
    rc = name in ("rc", "cli-rc")
    if rc:
        assert [r for r in recs if r[2] is not None and outcome.get(r[2], "c") != "c"] == [], name
    need = [r for r in final if r[0] >= recs[0][0] and (not rc or r[2] is None or outcome.get(r[2], "c") == "c")]
    have = set(recs)
    assert [r for r in need if r not in have] == [], name          # none lost


@pytest.mark.parametrize("mode", ["compact", "compact,delete"])
def test_every_reader_beside_a_compacting_transactional_writer(tmp_path, watchdog, mode):
    watchdog(240)
    d = str(tmp_path / "data")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    seed = 7 if mode == "compact" else 9
    w = subprocess.Popen([sys.executable, "-c", WRITER, d, "3", str(seed), mode], cwd=str(tmp_path),
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    readers = {}
    try:
        assert w.stdout.readline() == "ready\n", w.stderr.read()
        for name, extra in READERS.items():
            readers[name] = subprocess.Popen(
                [sys.executable, "-c", READER, d, "cli" if name.startswith("cli") else name,
                 str(seed), *extra], cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
        line = w.stdout.readline()
        assert line, w.stderr.read()
        outcome, where = json.loads(line)
        got = {}
        for name, p in readers.items():
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (name, err[-3000:])
            got[name] = [tuple(x) for x in json.loads(out)]
        w.stdin.write("\n")
        w.stdin.flush()
        assert w.wait(30) == 0, w.stderr.read()
    finally:
        for p in [w, *readers.values()]:
            if p.poll() is None:
                p.kill()
                p.wait()
    with kstore.StoreReader(d) as st:
        lg = st.log("t", 0)
        final = [(r.offset, r.key and r.key.decode(), r.value and r.value.decode()) for r in lg]
    written = {o: (k, v) for o, k, v in where}
    assert sum(v == "a" for v in outcome.values()) > 20
    assert len(final) < len(where) // 2                     # the cleaner removed records
    for name, recs in got.items():
        _check(name, recs, written, outcome, final)
