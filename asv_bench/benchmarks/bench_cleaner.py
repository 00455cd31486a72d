"""asv: cleaner throughput (100-byte values, 10% distinct keys; target >= 200 MB/s) and the p99
of single-record appends to another log while the cleaner runs (target <= 3x its idle p99)."""
import random
import shutil
import tempfile
import threading
import time

import kstore

N = 300_000


def _store():
    root = tempfile.mkdtemp(prefix="kstore-asv-clean-")
    m = kstore.LogManager(root, {"log.segment.bytes": str(64 << 20), "log.initial.task.delay.ms": "3600000",
                                 "log.cleaner.backoff.ms": "100000"})
    m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"})
    m.create_topic("other", 1)
    lg = m.log("c", 0)
    rnd = random.Random(1)
    for _ in range(0, N, 1000):
        lg.append([(b"key-%09d" % rnd.randrange(N // 10), b"v" * 100, 1_700_000_000_000) for _ in range(1000)])
    lg.roll()
    return root, m, lg


def _p99(lg, n):
    one = [(b"k" * 16, b"v" * 100, 1_700_000_000_000)]
    s = []
    pc = time.perf_counter_ns
    for _ in range(n):
        a = pc()
        lg.append(one)
        s.append(pc() - a)
    s.sort()
    return s[int(len(s) * 0.99)]


class Cleaner:
    timeout = 600
    number = 1
    repeat = 3

    def setup(self):
        self.root, self.m, self.lg = _store()

    def teardown(self):
        self.m.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def track_cleaner_mb_per_s_of_log(self):
        size = self.lg.size
        t0 = time.perf_counter()
        self.m.clean_now()
        return size / 1e6 / (time.perf_counter() - t0)
    track_cleaner_mb_per_s_of_log.unit = "MB/s"

    def track_append_p99_during_clean_over_idle(self):
        other = self.m.log("other", 0)
        idle = _p99(other, 20000)
        t = threading.Thread(target=self.m.clean_now)
        t.start()
        during = []
        while t.is_alive():
            during.append(_p99(other, 3000))
        t.join()
        during.sort()
        return (during[len(during) // 2] if during else idle) / idle
    track_append_p99_during_clean_over_idle.unit = "ratio"
