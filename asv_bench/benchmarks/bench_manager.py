"""asv: LogManager open time for 1,000 partitions x 10 segments, clean and unclean, and recovery
throughput on 1 MiB segments. Targets (issue 3): clean open <= 1 s; recovery >= 1 GB/s."""
import os
import shutil
import tempfile
import time

import kstore

SMALL = {"log.segment.bytes": "20000", "log.initial.task.delay.ms": "3600000"}
QUIET = {"log.initial.task.delay.ms": "3600000"}


def _build_small(root):
    with kstore.LogManager(root, SMALL) as m:
        m.create_topic("t", 1000)
        rec = [(b"k" * 16, b"v" * 100, 1_700_000_000_000)] * 150
        for p in range(1000):
            lg = m.log("t", p)
            for _ in range(10):
                lg.append(rec)


def _build_large(root):
    with kstore.LogManager(root, {"log.segment.bytes": str(1 << 20), **QUIET}) as m:
        m.create_topic("t", 20)
        batch = [(b"k" * 16, b"v" * 100, 1_700_000_000_000)] * 1000
        for p in range(20):
            lg = m.log("t", p)
            for _ in range(70):
                lg.append(batch)


def _unclean(root, keep_checkpoint):
    for name in (".kafka_cleanshutdown",) + (() if keep_checkpoint else ("recovery-point-offset-checkpoint",)):
        path = os.path.join(root, name)
        if os.path.exists(path):
            os.unlink(path)


class OpenManyPartitions:
    timeout = 900
    number = 1
    repeat = 3

    def setup_cache(self):
        root = os.path.join(tempfile.mkdtemp(prefix="kstore-asv-"), "logs")
        _build_small(root)
        return root

    def time_open_after_clean_shutdown(self, root):
        kstore.LogManager(root, QUIET).close()

    def time_open_after_unclean_shutdown_with_checkpoint(self, root):
        _unclean(root, keep_checkpoint=True)
        kstore.LogManager(root, QUIET).close()

    def time_open_after_unclean_shutdown_full_recovery(self, root):
        _unclean(root, keep_checkpoint=False)
        kstore.LogManager(root, QUIET).close()


class RecoveryThroughput:
    timeout = 900
    number = 1
    repeat = 3

    def setup_cache(self):
        root = os.path.join(tempfile.mkdtemp(prefix="kstore-asv-"), "logs")
        _build_large(root)
        return root

    def track_full_recovery_gb_per_s(self, root):
        size = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(root)
                   for f in fs if f.endswith(".log"))
        _unclean(root, keep_checkpoint=False)
        t0 = time.perf_counter()
        m = kstore.LogManager(root, QUIET)
        dt = time.perf_counter() - t0
        m.close()
        return size / dt / 1e9
    track_full_recovery_gb_per_s.unit = "GB/s"
