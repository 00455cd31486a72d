"""The cleaner killed with -9 mid-clean, and cleaner threads sharing the checkpoint (moved from
test_cleaner.py: crash and race tests, reliability tier)."""
import os
import random
import signal
import subprocess
import sys

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
