"""asv suites for kstore's hot paths. Run: cd asv_bench && asv run -E existing --quick"""
import os
import random
import shutil
import tempfile

import kstore
from kstore import _core

KEY = b"k" * 16
VALUE = b"v" * 100
TS = 1_700_000_000_000
N = 100_000


def _fill(path, n, batch):
    log = kstore.Log.open(path, {"index.interval.bytes": 4096})
    for start in range(0, n, batch):
        log.append([(KEY, VALUE, TS + i) for i in range(start, min(n, start + batch))])
    return log


class Append:
    timeout = 300

    def setup(self):
        self.dir = tempfile.mkdtemp()
        self.log = kstore.Log.open(os.path.join(self.dir, "t-0"))
        self.one = [(KEY, VALUE, TS)]
        self.batch = [(KEY, VALUE, TS + i) for i in range(1000)]
        probe = kstore.Log.open(os.path.join(self.dir, "probe-0"))
        probe.append(self.batch)
        probe.close()
        with open(os.path.join(self.dir, "probe-0", "0" * 20 + ".log"), "rb") as f:
            self.batch_bytes = f.read()           # one encoded 1000-record batch
        self.fd = os.open(os.path.join(self.dir, "floor"), os.O_WRONLY | os.O_CREAT)

    def teardown(self):
        self.log.close()
        os.close(self.fd)
        shutil.rmtree(self.dir)

    def time_append_single_record(self):
        append = self.log.append
        one = self.one
        for _ in range(1000):
            append(one)

    def time_append_1000_record_batch(self):
        self.log.append(self.batch)

    def time_write_1000_record_batch_bytes(self):
        """The floor under the batch append: write() of the same batch's bytes, nothing else."""
        os.write(self.fd, self.batch_bytes)


class AppendColumns:
    """100,000 records as Arrow-layout columns (Log.append_columns, the bulk path kstore produce
    uses) against the same rows as tuples through Log.append, both in ~1 MiB batches."""
    timeout = 300

    def setup(self):
        import numpy as np
        self.dir = tempfile.mkdtemp()
        self.cols_log = kstore.Log.open(os.path.join(self.dir, "c-0"), {"segment.bytes": 1 << 30})
        self.rows_log = kstore.Log.open(os.path.join(self.dir, "r-0"), {"segment.bytes": 1 << 30})
        n = N
        offsets = lambda width: np.arange(n + 1, dtype=np.int32) * width  # noqa: E731
        self.cols = _core.ColumnInput(
            n, key=(offsets(len(KEY)), np.frombuffer(KEY * n, np.uint8), None),
            value=(offsets(len(VALUE)), np.frombuffer(VALUE * n, np.uint8), None),
            timestamps=np.arange(TS, TS + n, dtype=np.int64))
        per = (1 << 20) // (32 + len(KEY) + len(VALUE))
        self.batches = [[(KEY, VALUE, TS + i) for i in range(s, min(n, s + per))]
                        for s in range(0, n, per)]

    def teardown(self):
        self.cols_log.close()
        self.rows_log.close()
        shutil.rmtree(self.dir)

    def time_append_columns_100k(self):
        self.cols_log.append_columns(self.cols, batch_bytes=1 << 20)

    def time_append_tuples_100k(self):
        for b in self.batches:
            self.rows_log.append(b)


class Read:
    """1000 point reads and 1000 time lookups on two logs of the same 100k records: written 1000
    records per batch, as producers write (the realistic case), and one record per batch."""
    timeout = 300

    def setup(self):
        self.dir = tempfile.mkdtemp()
        self.single = _fill(os.path.join(self.dir, "s-0"), N, 1)
        self.batched = _fill(os.path.join(self.dir, "b-0"), N, 1000)
        rnd = random.Random(1)
        self.offsets = [rnd.randrange(N) for _ in range(1000)]
        self.stamps = [TS + rnd.randrange(N) for _ in range(1000)]

    def teardown(self):
        self.single.close()
        self.batched.close()
        shutil.rmtree(self.dir)

    def time_random_read_by_offset(self):
        read = self.batched.read
        for o in self.offsets:
            read(o, 1)

    def time_random_read_by_offset_single_record_batches(self):
        read = self.single.read
        for o in self.offsets:
            read(o, 1)

    def time_sequential_read(self):
        for _ in self.batched:
            pass

    def time_time_lookup(self):
        f = self.batched.offset_for_timestamp
        for ts in self.stamps:
            f(ts)

    def time_time_lookup_single_record_batches(self):
        f = self.single.offset_for_timestamp
        for ts in self.stamps:
            f(ts)


class Recovery:
    timeout = 300

    def setup(self):
        self.dir = tempfile.mkdtemp()
        self.log = _fill(os.path.join(self.dir, "r-0"), N, 1000)

    def teardown(self):
        self.log.close()
        shutil.rmtree(self.dir)

    def time_segment_recovery(self):
        self.log.active_segment.recover()


class IndexSearch:
    def setup(self):
        self.dir = tempfile.mkdtemp()
        idx = kstore.OffsetIndex(os.path.join(self.dir, "0.index"), 0, 8 * 1_000_000)
        import numpy as np
        raw = np.zeros(1_000_000, dtype=_core.OFFSET_DTYPE)
        raw["relative_offset"] = np.arange(0, 2_000_000, 2)
        raw["position"] = np.arange(1_000_000)
        idx.load_entries(raw)
        self.idx = idx
        rnd = random.Random(2)
        self.targets = [rnd.randrange(2_000_000) for _ in range(1000)]

    def teardown(self):
        self.idx.close_handler()
        shutil.rmtree(self.dir)

    def time_offset_index_floor_search(self):
        lookup = self.idx.lookup
        for t in self.targets:
            lookup(t)


class Crc:
    def setup(self):
        self.buf = os.urandom(64 << 10)

    def time_crc32c_64k(self):
        _core.crc32c(self.buf)

    def track_crc32c_gb_per_s(self):
        import time
        t = time.perf_counter()
        for _ in range(2000):
            _core.crc32c(self.buf)
        return 2000 * len(self.buf) / (time.perf_counter() - t) / 1e9
    track_crc32c_gb_per_s.unit = "GB/s"
