"""The cleaner killed with -9 mid-clean, and cleaner threads sharing the checkpoint (moved from
test_cleaner.py: crash and race tests, reliability tier)."""
import os
import random
import signal
import subprocess
import sys
import time

from kstore.manager import LogManager

from cleaner_helpers import contents, latest, mgr

NOW = 1_700_000_000_000

CLEAN_CHILD = r"""
import sys, kstore
m = kstore.LogManager(sys.argv[1], {"log.segment.bytes": "3000", "log.cleaner.enable": "true",
                                     "log.segment.delete.delay.ms": "0"})
if "c" not in m.topics():
    m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"})
i = int(sys.argv[2])
while True:
    for _ in range(50):
        m.append("c", b"k%d" % (i % 20), b"v%d" % i, partition=0)
        i += 1
    print(i, flush=True)
    m.clean_now()
"""


def test_kill_9_during_cleaning_loses_no_latest_value(tmp_path):
    rnd = random.Random(3)
    acked = 0
    for _round in range(6):
        p = subprocess.Popen([sys.executable, "-c", CLEAN_CHILD, str(tmp_path), str(acked)],
                             stdout=subprocess.PIPE, cwd=str(tmp_path.parent))
        stop_after = rnd.randint(3, 12)
        for n, line in enumerate(p.stdout):
            acked = int(line)
            if n >= stop_after:
                break
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        with LogManager(str(tmp_path), {"log.cleaner.enable": "false"}) as m:
            lg = m.log("c", 0)
            names = os.listdir(lg.dir)
            assert not [n for n in names if n.endswith((".cleaned", ".swap"))], names
            got = latest(contents(lg))
            # every key still has a value at least as new as the last one acknowledged for it
            # (the child may have appended more before the kill landed)
            for k in range(20):
                last_i = max(i for i in range(acked) if i % 20 == k)
                n = int(got[b"k%d" % k][1][1:])
                assert n % 20 == k and n >= last_i, (k, n, last_i)


def test_cleaner_threads_share_the_checkpoint_without_losing_entries(tmp_path, watchdog):
    """log.cleaner.threads=2: both threads rewrite cleaner-offset-checkpoint; they shared its
    .tmp name (ENOENT, dir offline) and its entries dict (changed during iteration)."""
    import threading
    from thread_watchdog import join_all
    from kstore.checkpoint import OffsetCheckpointFile
    watchdog(60)
    m, t = mgr(tmp_path, {"log.cleaner.threads": "2"})
    with m:
        m.create_topic("c", 8, {"cleanup.policy": "compact"})
        d = str(tmp_path)
        errors = []

        def cleaner_thread(parts):
            try:
                for i in range(150):
                    for p in parts:
                        m.cleaner._update_checkpoint(d, ("c", p), i * 10 + p)
            except Exception as e:       # re-raised below
                errors.append(e)
        threads = [threading.Thread(target=cleaner_thread, args=(ps,)) for ps in ([0, 1, 2, 3], [4, 5, 6, 7])]
        for th in threads:
            th.start()
        join_all(threads, 60)
        assert errors == []
        assert OffsetCheckpointFile(os.path.join(d, "cleaner-offset-checkpoint")).read() == \
            {("c", p): 1490 + p for p in range(8)}
        assert not [n for n in os.listdir(d) if n.endswith(".tmp")]


DAY = 86_400_000
#: the prepared records: keys k0..k3, with v0/v1 tombstones of keys nothing later writes at 3
#: and 7 (segment [0..9], made 10 days old), 13 and 23 (segments modified now)
PREPARED = [(i, {3: b"gone", 7: b"gone-b", 13: b"kept", 23: b"kept-b"}.get(i, b"k%d" % (i % 4)),
             None if i in (3, 7, 13, 23) else b"v%d" % i) for i in range(30)]

LEGACY_READER = r"""
import os, sys, kstore
d, stop = sys.argv[1], sys.argv[2]
prepared = {i: (k, v) for i, k, v in eval(sys.argv[3])}


def written(o):                          # what the writer wrote at o (appended_record's rule)
    if o in prepared:
        return prepared[o]
    i = o - 30
    return b"n%d" % (i % 15), (None if i % 7 == 0 else b"w%d" % i)


reads = 0
parent = os.getppid()
with kstore.StoreReader(d) as r:
    while True:
        if os.getppid() != parent:
            sys.exit("the test is gone")   # never outlive a killed test run (no stop file comes)
        done = os.path.exists(stop)
        lg = r.log("c", 0, refresh=True)
        got = [(x.offset, x.key, x.value) for x in lg.read(lg.log_start_offset, max_bytes=1 << 30)]
        offs = [o for o, _k, _v in got]
        assert offs == sorted(set(offs)), offs
        for o, k, v in got:
            assert (k, v) == written(o), (o, k, v, written(o))
        reads += 1
        if done:
            break
print(reads)
"""


def test_legacy_tombstones_cleaned_beside_an_appender_and_a_reader(tmp_path, watchdog):
    """v0/v1 tombstones have no delete horizon of their own: the cleaner takes the mtime of the
    segment holding the first dirty offset (15, inside [10..19], modified now) minus
    delete.retention.ms (1 day), as Kafka's logSegments(0, firstDirtyOffset).last, and drops
    the tombstones of segments modified before it ([0..9], 10 days old: 3 and 7). Here the
    cleaner thread (20 ms backoff) cleans again and again (4 more first dirty offsets) while a
    thread appends v1 records and tombstones (rolling 1500-byte segments) and another process
    reads the whole log each time, checking that every record is what was written at its
    offset, in order; 3 and 7 are gone from the first clean on. After the writer stops, a roll
    and a last clean: the log is exactly each key's latest record but the old segment's
    tombstones (the recent ones, 13, 23 and the appender's, stay: newer than the horizon).
    (Not clean_now() in the loop: beside the thread and a writer it waited minutes, the thread
    taking the log again each time before it could.)"""
    import threading
    import time
    from kstore.checkpoint import CLEANER_OFFSET_CHECKPOINT
    from thread_watchdog import join_all
    watchdog(120)
    topic = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0", "segment.bytes": "1500",
             "message.format.version": "0.10.2", "delete.retention.ms": str(DAY)}
    m, _t = mgr(tmp_path, {"log.segment.bytes": "1000000"})
    with m:
        m.create_topic("c", 1, topic)
        lg = m.log("c", 0)
        for i, k, v in PREPARED:
            if i and i % 10 == 0:
                lg.roll()
            lg.append([(k, v, NOW)])
        lg.roll()
        assert [s.base_offset for s in lg.segments] == [0, 10, 20, 30]
        assert lg.read_batches(0, 100)[16] == 1            # magic 1: v1 message sets
    with open(os.path.join(tmp_path, CLEANER_OFFSET_CHECKPOINT), "w") as f:
        f.write("0\n1\nc 0 15\n")
    now = time.time()
    for base, age_days in ((0, 10), (10, 0), (20, 0)):
        os.utime(os.path.join(tmp_path, "c-0", "%020d.log" % base),
                 (now - age_days * 86400, now - age_days * 86400))
    stop_file = str(tmp_path / "stop")
    # a real scheduler (MockScheduler is not for threads) and the cleaner's own thread too
    m = LogManager(str(tmp_path), {"log.segment.bytes": "1000000", "log.cleaner.backoff.ms": "20",
                                   "log.segment.delete.delay.ms": "0",
                                   "log.cleaner.dedupe.buffer.size": str(1 << 20)})
    written = {i: (k, v) for i, k, v in PREPARED}
    stop = threading.Event()
    errors: list[BaseException] = []
    with m:
        lg = m.log("c", 0)

        def append():
            try:
                i = 0
                while not stop.is_set():
                    k, v = b"n%d" % (i % 15), (None if i % 7 == 0 else b"w%d" % i)
                    assert lg.append([(k, v, NOW)]).first_offset == 30 + i
                    written[30 + i] = (k, v)
                    i += 1
                    time.sleep(0.001)       # a few hundred a second: the cleaner keeps up
            except BaseException as e:      # reported below
                errors.append(e)
        reader = subprocess.Popen([sys.executable, "-c", LEGACY_READER, str(tmp_path), stop_file,
                                   repr(PREPARED)], stdout=subprocess.PIPE, text=True,
                                  cwd=str(tmp_path.parent))
        writer = threading.Thread(target=append, daemon=True)
        writer.start()
        try:
            dirty = {15}                  # the first dirty offsets the cleaner thread moved to
            while len(dirty) < 5 or len(written) < 400:
                assert not errors
                now_dirty = m.cleaner.first_dirty_offset(("c", 0))
                got = contents(lg)
                if now_dirty != 15:       # cleaned once: the old tombstones are gone for good
                    assert not {3, 7} & {o for o, _k, _v in got}
                dirty.add(now_dirty)
                time.sleep(0.02)
        finally:
            stop.set()
            join_all([writer], 30)
            open(stop_file, "w").close()
            out, _ = reader.communicate(timeout=60)
        assert not errors and reader.returncode == 0 and int(out) > 0
        lg.roll()
        m.clean_now()
        final = contents(lg)
    last: dict[bytes, int] = {}
    for o in sorted(written):
        last[written[o][0]] = o
    expect = [(o, written[o][0], written[o][1]) for o in sorted(last.values()) if o not in (3, 7)]
    assert final == expect
    assert (13, b"kept", None) in final and (23, b"kept-b", None) in final


def test_clean_now_is_not_starved_by_the_cleaner_thread(tmp_path, watchdog):
    """A busy writer keeps two compacted partitions (min.cleanable.dirty.ratio 0) dirty and the
    cleaner thread (0 ms backoff) takes one the moment it puts the last one down, so
    clean_now(), waiting for the thread's clean under way to end, waited on (a minute and
    more here). Now the thread takes nothing new while a pass waits or runs: clean_now gets
    its clean after at most the thread's clean under way (counted: the thread's "cleaned"
    logs while clean_now ran), 30 times, beside another process reading the partitions."""
    import logging
    import threading
    from thread_watchdog import join_all
    watchdog(120)
    m = LogManager(str(tmp_path), {"log.segment.bytes": "65536", "log.cleaner.backoff.ms": "0",
                                    "log.segment.delete.delay.ms": "0"})
    m.create_topic("c", 2, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"})
    stop = threading.Event()
    thread_cleans: list[str] = []
    pass_running = threading.Event()

    class Counting(logging.Handler):
        def emit(self, record):
            if (pass_running.is_set() and record.getMessage().startswith("cleaned ")
                    and record.threadName.startswith("kafka-log-cleaner-thread")):
                thread_cleans.append(record.getMessage())

    def append():
        i = 0
        while not stop.is_set():
            m.append("c", b"k%d" % (i % 20), b"v%d" % i, partition=i % 2)
            i += 1
            if i % 200 == 0:                # flat out, but the log's lock and the GIL free
                time.sleep(0.002)           # now and then for the cleans to finish
    reader = subprocess.Popen([sys.executable, "-c", READER_CHILD, str(tmp_path)],
                              stdout=subprocess.DEVNULL, cwd=str(tmp_path.parent))
    handler = Counting(logging.INFO)
    lg = logging.getLogger("kstore.cleaner")
    old_level = lg.level
    lg.setLevel(logging.INFO)
    lg.addHandler(handler)
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    try:
        for _ in range(30):
            done = threading.Event()
            box: dict = {}

            def run(box=box, done=done):
                pass_running.set()
                try:
                    box["stats"] = m.clean_now()
                finally:
                    pass_running.clear()
                    done.set()
            thread_cleans.clear()
            bases = [m.log("c", p).active_segment.base_offset for p in (0, 1)]
            caller = threading.Thread(target=run, daemon=True)
            caller.start()
            while not done.is_set():         # the thread's cleans while the pass waits
                # the thread's clean under way, and one it may have begun as clean_now was
                # called, before the pass was registered: no more
                assert len(thread_cleans) <= 2, f"clean_now starved: {thread_cleans}"
                done.wait(0.01)
            join_all([caller], 30)
            assert "stats" in box           # every log cleaned up to its active segment then
            for p in (0, 1):
                cp = m.cleaner.first_dirty_offset(("c", p))
                assert (m.log("c", p).log_start_offset if cp is None else cp) >= bases[p]
    finally:
        stop.set()
        join_all([writer], 30)
        lg.removeHandler(handler)
        lg.setLevel(old_level)
        reader.kill()
        reader.wait(30)
    m.close()


READER_CHILD = r"""
import os, sys, time
from kstore import StoreReader
from kstore.errors import KStoreError
parent = os.getppid()
with StoreReader(sys.argv[1]) as r:
    while os.getppid() == parent:        # the test run gone: exit
        for p in (0, 1):
            try:
                lg = r.log("c", p, refresh=True)
                lg.read(lg.log_start_offset, 100)
            except KStoreError:          # moved under the read (the cleaner): read again
                pass
        time.sleep(0.01)
"""
