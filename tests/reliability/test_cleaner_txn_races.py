"""The cleaner on transactional data beside readers and a writer in other processes (reliability
tier): a writer process (a LogManager with a cleaner thread at 50 ms backoff, 1500-byte segments,
and clean_now() from its own thread every 50 appends) interleaves four producers' transactions,
aborts about four in ten, writes plain records and tombstones between them, and moves the log
start (delete_records) to segment bases below every open transaction now and then. Two
read_committed consumers and a read_uncommitted one, each in its own process, read from the
start until the writer's last record. Checked: each reader's records are what the writer wrote
at those offsets, each once, in offset order; a read_committed one returns no aborted record;
after the writer's last clean (all transactions closed), a fresh read of the log below the first
uncleanable offset holds no aborted record and each key at most once, as its last committed
value there, and a fresh read_committed read ends each key at its last committed value."""
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
d, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])


cfg = {"log.segment.bytes": "1500", "log.segment.delete.delay.ms": "0",
       "log.cleaner.backoff.ms": "50", "log.initial.task.delay.ms": "0"}
topic = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.05", "delete.retention.ms": "200"}
rng = random.Random(seed)
outcome, open_txn, n, where, moves = {}, {}, 0, [], 0
with kstore.LogManager(d, cfg) as m:
    m.create_topic("t", 1, topic)
    lg = m.log("t", 0)
    print("ready", flush=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r, pid = rng.random(), rng.randrange(1, 5)
        k = b"k%d" % rng.randrange(15)
        if r < 0.25:
            v = None if rng.random() < 0.15 else b"p%d" % n
            where.append((lg.append([(k, v)]).first_offset, k.decode(), v and v.decode()))
            if v:
                outcome[v.decode()] = "c"
        elif r < 0.7:
            vals = [(b"k%d" % rng.randrange(15), ("t%d-%d" % (pid, n + i)).encode())
                    for i in range(rng.randrange(1, 4))]
            n += len(vals)
            first, _count = lg.append_batches(batch(pid, vals))
            where += [(first + i, k2.decode(), v.decode()) for i, (k2, v) in enumerate(vals)]
            open_txn.setdefault(pid, (first, []))[1].extend(v.decode() for _k, v in vals)
        elif r < 0.97 and pid in open_txn:
            abort = rng.random() < 0.4
            lg.append_batches(batch(pid, [], control=0 if abort else 1))
            outcome.update((v, "a" if abort else "c") for v in open_txn.pop(pid)[1])
        elif r >= 0.97:
            lso = min([f for f, _v in open_txn.values()] + [lg.log_end_offset])
            bases = [s.base_offset for s in lg.segments if s.base_offset <= lso]
            if len(bases) > 2:
                lg.delete_records(bases[-2])
                moves += 1
        n += 1
        if n % 50 == 0:
            m.clean_now()
    for pid in list(open_txn):
        lg.append_batches(batch(pid, [], control=1))
        outcome.update((v, "c") for v in open_txn.pop(pid)[1])
    where.append((lg.append([(b"end", b"END")]).first_offset, "end", "END"))
    outcome["END"] = "c"
    lg.roll()
    m.clean_now()
    print(json.dumps([outcome, where, lg.active_segment.base_offset, lg.log_start_offset, moves,
                      m.uncleanable_partitions() == {}]), flush=True)
    sys.stdin.readline()                # the readers are done: close
"""

READER = r"""
import json, sys
import kstore
d, iso = sys.argv[1], sys.argv[2]
out = []
with kstore.Consumer(d, auto_offset_reset="earliest", isolation_level=iso) as c:
    tp = kstore.TopicPartition("t", 0)
    c.assign([tp])
    while not out or out[-1][2] != "END":
        for recs in c.poll(200).values():
            out.extend((r.offset, r.key.decode(), r.value and r.value.decode()) for r in recs)
print(json.dumps(out), flush=True)
"""


def _spawn(tmp_path, *args):
    return subprocess.Popen([sys.executable, "-c", *args], cwd=str(tmp_path), env=dict(os.environ),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _fresh(d: str, iso: str) -> list:
    out: list = []
    with kstore.Consumer(d, auto_offset_reset="earliest", isolation_level=iso) as c:
        c.assign([kstore.TopicPartition("t", 0)])
        while not out or out[-1][2] != "END":
            for recs in c.poll(200).values():
                out.extend((r.offset, r.key.decode(), r.value and r.value.decode()) for r in recs)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_cleaning_transactions_beside_reader_and_writer_processes(tmp_path, watchdog, seed):
    watchdog(150)
    d = str(tmp_path / "data")
    writer = _spawn(tmp_path, WRITER, d, "4", str(seed))
    readers = {}
    try:
        assert writer.stdout.readline() == "ready\n", writer.stderr.read()
        readers = {k: _spawn(tmp_path, READER, d, "read_uncommitted" if k == "ru" else "read_committed")
                   for k in ("rc1", "rc2", "ru")}
        line = writer.stdout.readline()
        assert line, writer.stderr.read()
        outcome, where, active, start, moves, no_uncleanable = json.loads(line)
        got = {}
        for k, p in readers.items():
            out, err = p.communicate(timeout=90)
            assert p.returncode == 0, err
            got[k] = json.loads(out)
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert writer.wait(30) == 0, writer.stderr.read()
        fresh_rc, fresh_ru = _fresh(d, "read_committed"), _fresh(d, "read_uncommitted")
    finally:
        for p in [writer, *readers.values()]:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert no_uncleanable and moves > 0 and sum(v == "a" for v in outcome.values()) > 30
    written = {o: (k, v) for o, k, v in where}
    for name, recs in [*got.items(), ("fresh_rc", fresh_rc), ("fresh_ru", fresh_ru)]:
        offsets = [o for o, _k, _v in recs]
        assert offsets == sorted(set(offsets)), name               # each once, in offset order
        assert [r for r in recs if written.get(r[0]) != tuple(r[1:])] == [], name
        if name != "ru" and name != "fresh_ru":
            assert [r for r in recs[:-1] if r[2] is not None and outcome[r[2]] != "c"] == [], name
    # below the first uncleanable offset: no aborted record, each key once, its last committed
    # value there (a tombstone may have gone past its horizon)
    below = [(o, k, v) for o, k, v in fresh_ru if o < active]
    assert all(v is None or outcome[v] == "c" for _o, _k, v in below)
    assert len({k for _o, k, _v in below}) == len(below)
    last: dict = {}
    for o, k, v in sorted(where):
        if start <= o < active and (v is None or outcome[v] == "c"):
            last[k] = v
    assert {k: v for _o, k, v in below} == {k: v for k, v in last.items() if v is not None or
                                             k in {k2 for _o, k2, _v in below}}
    # a fresh read_committed read: each key ends at its last committed value
    final: dict = {}
    for o, k, v in sorted(where):
        if o >= start and (v is None or outcome[v] == "c"):
            final[k] = v
    found = {}
    for _o, k, v in fresh_rc:
        found[k] = v
    assert {k: v for k, v in found.items() if v is not None} == {k: v for k, v in final.items()
                                                                 if v is not None}
