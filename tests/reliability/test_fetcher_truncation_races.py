"""Consumers in their own processes beside a writer process that cuts its tail and appends
again (reliability tier; KIP-320 in fetcher.py). The writer (a LogManager, 1200-byte segments)
appends batches of 1-5 records whose values name their generation, and one time in ten cuts
1-40 records off the tail with truncate_to (each cut starts a new leader epoch), for 3 s, then
appends END. Readers from the start until END: a Consumer (read_uncommitted) with 1, 7 or 500
records a poll, an AsyncConsumer, and `kstore consume --follow`. For every offset of the final
log, the last record a reader returned there is the final one: none skipped (before, a reader
whose position was past a cut went on from it and never returned the records appended again
below it), and every record returned was written."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

import kstore

WRITER = r"""
import json, random, sys, time
import kstore
d, seconds, seed = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)
m = kstore.LogManager(d, {"log.segment.bytes": "1200"})
m.create_topic("t", 1)
lg = m.log("t", 0)
print("ready", flush=True)
written, n, cuts = [], 0, 0
stop = time.monotonic() + seconds
while time.monotonic() < stop:
    vals = [b"%d-%d" % (n, i) for i in range(rng.randrange(1, 6))]
    first = lg.append([(b"k", v) for v in vals]).first_offset
    written += [(first + i, v.decode()) for i, v in enumerate(vals)]
    if rng.random() < 0.1 and lg.log_end_offset > 50:
        lg.truncate_to(lg.log_end_offset - rng.randrange(1, 40))
        cuts += 1
    n += 1
    if rng.random() < 0.05:
        time.sleep(0.002)
written.append((lg.append([(b"k", b"END")]).first_offset, "END"))
print(json.dumps([written, cuts]), flush=True)
sys.stdin.readline()
m.close()
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
    return out and out[-1][1] == "END"

if mode == "consumer":
    with kstore.Consumer(d, auto_offset_reset="earliest",
                         max_poll_records=rng.choice([1, 7, 500])) as c:
        c.assign([TP("t", 0)])
        while not done() and time.monotonic() < deadline:
            for recs in c.poll(100).values():
                out += [(r.offset, r.value.decode()) for r in recs]
elif mode == "async":
    async def main():
        async with kstore.AsyncConsumer(d, auto_offset_reset="earliest") as c:
            c.assign([TP("t", 0)])
            while not done() and time.monotonic() < deadline:
                got = await c.getmany(timeout_ms=200, max_records=rng.choice([1, 9, 500]))
                for recs in got.values():
                    out.extend((r.offset, r.value.decode()) for r in recs)
    asyncio.run(main())
else:                                        # consume --follow: SIGTERM once END is printed
    p = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic",
                          "t", "--from-beginning", "--print-offset", "--print-key",
                          "--key-separator", "|", "--follow", "--timeout-ms", "60000"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    for line in p.stdout:
        o, _k, v = line.decode().rstrip("\n").split("|", 2)
        out.append((int(o[len("Offset:"):]), v))
        if v == "END":
            p.send_signal(signal.SIGTERM)
            break
    p.wait(30)
print(json.dumps(out))
"""


@pytest.mark.parametrize("seed", [3, 4])
def test_every_consumer_returns_what_is_appended_again_below_its_position(tmp_path, watchdog, seed):
    watchdog(240)
    d = str(tmp_path / "data")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    w = subprocess.Popen([sys.executable, "-c", WRITER, d, "3", str(seed)], cwd=str(tmp_path),
                         env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    readers = {}
    try:
        assert w.stdout.readline() == "ready\n", w.stderr.read()
        for mode in ("consumer", "async", "cli"):
            readers[mode] = subprocess.Popen([sys.executable, "-c", READER, d, mode, str(seed)],
                                             cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True)
        line = w.stdout.readline()
        assert line, w.stderr.read()
        written, cuts = json.loads(line)
        got = {}
        for mode, p in readers.items():
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, (mode, err[-3000:])
            got[mode] = [tuple(r) for r in json.loads(out)]
        with kstore.StoreReader(d) as st:
            final = {r.offset: r.value.decode() for r in st.log("t", 0)}
        w.stdin.write("\n")
        w.stdin.flush()
        assert w.wait(30) == 0, w.stderr.read()
    finally:
        for p in [w, *readers.values()]:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()
    assert cuts > 5
    ever = {tuple(x) for x in written}
    for mode, recs in got.items():
        assert recs and recs[-1][1] == "END", (mode, recs[-3:])
        assert [r for r in recs if r not in ever] == [], mode          # as written
        last = {}
        for o, v in recs:
            last[o] = v
        assert {o: v for o, v in last.items() if o in final} == final, mode   # none skipped
