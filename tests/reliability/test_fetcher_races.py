"""read_committed fetching beside a writer process (reliability tier): the writer (a LogManager
on the real scheduler, 2000-byte segments) interleaves four producers' transactions, aborts about
four in ten, and writes plain records between them, for 4 s; the compacted variant also runs the
cleaner (compact,delete, 100 ms backoff) on the same log. Two read_committed consumers and one
read_uncommitted consumer, each in its own thread of this process, read from the start until the
writer's last record. A read_committed consumer returns exactly the committed and plain records,
each once, in offset order; read_uncommitted returns every data record. Every wait is bounded by
the watchdog. Once the writer is done (and has cleaned), a fresh read_committed read finds each
key's last committed value as the last of the key, and no aborted record."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from batch_helpers import TXN_BATCH_SOURCE
from thread_watchdog import join_all

import kstore
from kstore import TopicPartition as TP

WRITER = TXN_BATCH_SOURCE + r"""
import json, os, random, struct, sys, time
import kstore
d, seconds, compact = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"


cfg = {"log.segment.bytes": "2000", "log.segment.delete.delay.ms": "0",
       "log.cleaner.backoff.ms": "100", "log.initial.task.delay.ms": "0"}
topic = {"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": "0.1",
         "delete.retention.ms": "300"} if compact else {}
rng = random.Random(27)
outcome, open_txn, n, where = {}, {}, 0, []
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
            outcome[v] = "c"
        elif r < 0.75:
            vals = [(b"k%d" % rng.randrange(20), ("t%d-%d" % (pid, n + i)).encode())
                    for i in range(rng.randrange(1, 4))]
            n += len(vals)
            first, _count = lg.append_batches(batch(pid, vals))
            where += [(first + i, k.decode(), v.decode()) for i, (k, v) in enumerate(vals)]
            open_txn.setdefault(pid, []).extend(v.decode() for _k, v in vals)
        elif pid in open_txn:
            abort = rng.random() < 0.4
            lg.append_batches(batch(pid, [], control=0 if abort else 1))
            outcome.update((v, "a" if abort else "c") for v in open_txn.pop(pid))
        n += 1
    for pid in list(open_txn):
        lg.append_batches(batch(pid, [], control=1))
        outcome.update((v, "c") for v in open_txn.pop(pid))
    lg.append([(b"end", b"END")])
    if compact:
        lg.roll()
        m.clean_now()                   # (beside the cleaner thread's own passes)
    print(json.dumps([outcome, where]), flush=True)
    sys.stdin.readline()                # the readers are done: close
"""


def _read(d: str, iso: str, out: list, errors: list) -> None:
    try:
        with kstore.Consumer(d, auto_offset_reset="earliest", isolation_level=iso) as c:
            c.assign([TP("t", 0)])
            while not out or out[-1][2] != b"END":
                for recs in c.poll(200).values():
                    out.extend((r.offset, r.key, r.value) for r in recs)
    except BaseException as e:       # reported by the test
        errors.append(e)


@pytest.mark.parametrize("compact", [False, True], ids=["delete", "compact"])
def test_read_committed_consumers_beside_a_transactional_writer(tmp_path, watchdog, compact):
    watchdog(120)
    d = str(tmp_path / "data")
    child = subprocess.Popen([sys.executable, "-c", WRITER, d, "4", "1" if compact else "0"],
                             cwd=str(tmp_path), env=dict(os.environ), stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n", child.stderr.read()
        got: dict[str, list] = {"rc1": [], "rc2": [], "ru": []}
        errors: list = []
        threads = [threading.Thread(target=_read, args=(d, "read_uncommitted" if k == "ru" else
                                                        "read_committed", got[k], errors), name=k)
                   for k in got]
        for t in threads:
            t.start()
        line = child.stdout.readline()
        assert line, child.stderr.read()
        outcome, where = json.loads(line)
        join_all(threads, 60)
        assert errors == []
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.wait(30) == 0, child.stderr.read()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert outcome and sum(v == "a" for v in outcome.values()) > 50
    for k in ("rc1", "rc2"):
        recs = got[k]
        offsets = [o for o, _k, _v in recs]
        assert offsets == sorted(set(offsets)), k            # each once, in offset order
        assert all(outcome[v.decode()] == "c" for _o, _k, v in recs[:-1]), k
        if not compact:
            # every committed record, none missing
            assert {v.decode() for _o, _k, v in recs[:-1]} == {v for v, o in outcome.items() if o == "c"}
    if not compact:
        with kstore.Log.open(os.path.join(d, "t-0"), read_only=True) as lg:
            every = [(r.offset, r.key, r.value) for r in lg]
        assert got["ru"] == every
        assert got["rc1"] == got["rc2"] == [r for r in every if outcome.get(r[2].decode(), "c") == "c"]
    else:
        # a key's values come in offset order
        for k in ("rc1", "rc2"):
            last: dict = {}
            for o, key, _v in got[k]:
                assert o > last.get(key, -1)
                last[key] = o
        # after the cleaning, each key's last committed value is the last a reader finds
        latest = {}
        for _o, key, v in sorted(where):
            if outcome[v] == "c":
                latest[key] = v
        fresh: list = []
        _read(d, "read_committed", fresh, errors)
        assert errors == [] and fresh[-1][2] == b"END"
        found = {}
        for _o, key, v in fresh[:-1]:
            assert outcome[v.decode()] == "c"
            found[key.decode()] = v.decode()
        assert found == latest
        assert len(fresh) < len(got["rc1"])           # the cleaning removed records
