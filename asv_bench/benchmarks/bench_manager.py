"""asv: LogManager open time for 1,000 partitions x 10 segments, clean and unclean, and recovery
throughput on 1 MiB segments. Targets (issue 3): clean open <= 1 s; recovery >= 1 GB/s."""
import os
import tempfile
import time

import kstore

QUIET = {"log.initial.task.delay.ms": "3600000"}


def _build(root, partitions, segment_bytes, appends_per_partition, batch):
    """A store of `partitions` partitions of 100-byte records appended `batch` at a time."""
    with kstore.LogManager(root, {"log.segment.bytes": str(segment_bytes), **QUIET}) as m:
        m.create_topic("t", partitions)
        records = [(b"k" * 16, b"v" * 100, 1_700_000_000_000)] * batch
        for p in range(partitions):
            lg = m.log("t", p)
            for _ in range(appends_per_partition):
                lg.append(records)


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
        _build(root, 1000, 20000, 10, 150)       # 10 segments of ~19 KB each
        return root

    # only the open is timed: closing after a full recovery fsyncs every segment, a separate cost
    def setup(self, root):
        self.m = None

    def teardown(self, root):
        if self.m is not None:
            self.m.close()

    def time_open_after_clean_shutdown(self, root):
        self.m = kstore.LogManager(root, QUIET)

    def time_open_after_unclean_shutdown_with_checkpoint(self, root):
        _unclean(root, keep_checkpoint=True)
        self.m = kstore.LogManager(root, QUIET)

    def time_open_after_unclean_shutdown_full_recovery(self, root):
        _unclean(root, keep_checkpoint=False)
        self.m = kstore.LogManager(root, QUIET)


class RecoveryThroughput:
    timeout = 900
    number = 1
    repeat = 3

    def setup_cache(self):
        root = os.path.join(tempfile.mkdtemp(prefix="kstore-asv-"), "logs")
        _build(root, 20, 1 << 20, 70, 1000)     # ~9 segments of 1 MiB each
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
