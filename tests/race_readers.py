"""The readers of the transactional race tests (test_read_committed_races,
test_topic_deletion_txn_races), each run in its own process: READER is the child script
(argv: log dir, mode, seed, extra `kstore consume` options), which reads topic t partition 0
from its start until the END record and prints JSON [records as (offset, key, value), records
polled in the 1 s after END (ru, rc), the plain consume runs (once-rc), CPU seconds of that 1 s,
consume's stderr]; READERS maps each reader's name to its extra options, RC names the
read_committed ones."""

READER = r"""
import asyncio, json, os, random, signal, subprocess, sys, time
import kstore
from kstore import TopicPartition as TP
d, mode, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = random.Random(seed)
out, after, runs, errs = [], [], [], []
deadline = time.monotonic() + 60
rc = mode.endswith("rc")

def done():
    return out and out[-1][2] == "END"

def add(recs, to=out):
    if recs and not to:                  # the first: says so (a file beside the log dir)
        open("%s-started-%d" % (d, os.getpid()), "w").close()
    to.extend((r.offset, r.key and r.key.decode(), r.value and r.value.decode()) for r in recs)

def consumer(**kw):
    return kstore.Consumer(d, auto_offset_reset="earliest", max_poll_records=rng.choice([1, 7, 500]),
                           isolation_level="read_committed" if rc else "read_uncommitted", **kw)

class Rec(tuple):
    offset, key, value = property(lambda r: r[0]), property(lambda r: r[1]), property(lambda r: r[2])

def cli(*extra, follow=False):
    # --follow: stopped with SIGTERM once END is printed (exit 143, as Kafka's); its timeout is
    # only a safety net, far above the pauses the tests make (all readers starting, a clean)
    more = ["--follow", "--timeout-ms", "60000"] if follow else []
    p = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                          "--from-beginning", "--print-offset", "--print-key", "--key-separator", "|",
                          *more, *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    got = []
    stopped = False
    for line in p.stdout:
        o, k, v = line.decode().rstrip("\n").split("|", 2)
        rec = Rec((int(o[len("Offset:"):]), k != "null" and k.encode(), v != "null" and v.encode()))
        add([rec], got)
        if follow and v == "END" and not stopped:
            p.send_signal(signal.SIGTERM)
            stopped = True
    err = p.stderr.read()
    assert p.wait(90) == (143 if stopped else 0), err[-2000:]
    errs.append(err.decode()[-1500:])
    return [(o, k or None, v or None) for o, k, v in got]

cpu = 0.0
if mode in ("ru", "rc"):
    with consumer() as c:
        c.assign([TP("t", 0)])
        while not done() and time.monotonic() < deadline:
            for recs in c.poll(200).values():
                add(recs)
            if rng.random() < 0.05:
                time.sleep(0.3)          # a slow consumer: the start moves meanwhile
        t0, c0 = time.monotonic(), time.process_time()
        while time.monotonic() < t0 + 1:
            for recs in c.poll(200).values():
                add(recs, after)
        cpu = time.process_time() - c0
elif mode.startswith("group"):           # closed and opened again: resumes at its commits
    while not done() and time.monotonic() < deadline:
        with consumer(group_id="g" + mode) as c:
            c.subscribe(["t"])
            for _ in range(rng.randrange(1, 6)):
                for recs in c.poll(100).values():
                    add(recs)
elif mode.startswith("async"):
    async def main():
        async with kstore.AsyncConsumer(d, auto_offset_reset="earliest",
                isolation_level="read_committed" if rc else "read_uncommitted") as c:
            c.assign([TP("t", 0)])
            while not done() and time.monotonic() < deadline:
                got = await c.getmany(timeout_ms=200, max_records=rng.choice([1, 9, 500]))
                for recs in got.values():
                    add(recs)
    asyncio.run(main())
elif mode == "tail":                     # (a topic deleted and re-created: read from its start)
    with kstore.StoreReader(d) as st:
        seen, pos = None, 0
        while not done() and time.monotonic() < deadline:
            try:
                lg = st.log("t", 0, refresh=True)
                if (lg, lg.incarnation) != seen:
                    seen, pos = (lg, lg.incarnation), lg.log_start_offset
                for chunk in lg.iter_chunks(pos, max_bytes=rng.choice([100, 5000, 1 << 20])):
                    add(chunk)
                    pos = chunk[-1].offset + 1
                if not done():
                    lg.wait_for(pos, 0.2)
            except kstore.OffsetOutOfRangeError:
                pos = lg.log_start_offset
            except (kstore.UnknownTopicError, kstore.KStoreStateError):
                st.refresh()             # deleted: found again once re-created
                time.sleep(0.05)
elif mode == "once-rc":                  # plain consume, no --follow: must exit, again and again
    while time.monotonic() < deadline and not (runs and runs[-1] and runs[-1][-1][2] == "END"):
        runs.append(cli("--isolation-level", "read_committed"))
    out = [r for run in runs for r in run]
else:                                    # consume --follow, more options after the mode
    for r in cli(*sys.argv[4:], follow=True):
        out.append(r)
        if r[2] == "END":
            break
print(json.dumps([out, after, runs, cpu, errs]))
"""

READERS = {"ru": [], "rc": [], "group": [], "group-rc": [], "async": [], "async-rc": [],
           "tail": [], "cli": [], "cli-rc": ["--isolation-level", "read_committed"],
           "cli-group": ["--group", "cg"], "once-rc": []}
RC = {"rc", "group-rc", "async-rc", "cli-rc", "once-rc"}
