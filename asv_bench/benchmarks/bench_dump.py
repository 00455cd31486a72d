"""asv: `kstore dump-log` throughput over one ~12 MB segment (batch headers with CRCs checked,
every record, keys and values printed) and over its offset index."""
import argparse
import io
import os
import shutil
import tempfile

import kstore
from kstore.tools import dump

N = 100_000
VALUE = b"v" * 100


def _args(**kw):
    a = dict(files="", print_data_log=False, deep_iteration=False, verify_index_only=False,
             index_sanity_check=False, max_bytes=-1, json=False)
    a.update(kw)
    return argparse.Namespace(**a)


class DumpLog:
    timeout = 300

    def setup(self):
        self.dir = tempfile.mkdtemp()
        part = os.path.join(self.dir, "t-0")
        with kstore.Log.open(part, {"segment.bytes": 1 << 30}) as lg:
            for s in range(0, N, 100):
                lg.append([(b"key-%d" % i, VALUE, 1_700_000_000_000 + i) for i in range(s, s + 100)])
        self.log = os.path.join(part, "00000000000000000000.log")
        self.index = os.path.join(part, "00000000000000000000.index")
        self.size = os.path.getsize(self.log)

    def teardown(self):
        shutil.rmtree(self.dir)

    def time_batches(self):
        """1,000 batch headers, CRC-32C verified (kafka-dump-log's default)."""
        dump.main(_args(files=self.log), out=io.StringIO())

    def time_print_data_log(self):
        """100,000 records printed with keys and values (--print-data-log)."""
        dump.main(_args(files=self.log, print_data_log=True), out=io.StringIO())

    def time_verify_index(self):
        """Every offset-index entry checked against the .log (--verify-index-only)."""
        dump.main(_args(files=self.index, verify_index_only=True), out=io.StringIO())

    def track_print_data_log_mb_per_s(self):
        """--print-data-log throughput in MB of segment per second."""
        import time
        best = None
        for _ in range(3):
            t0 = time.perf_counter()
            dump.main(_args(files=self.log, print_data_log=True), out=io.StringIO())
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        return self.size / best / 1e6

    track_print_data_log_mb_per_s.unit = "MB/s"
