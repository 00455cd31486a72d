"""asv: the columnar paths behind the Spark source and sink (no Spark here: `kstore bench
--spark` measures Spark itself). Needs pyarrow; skipped without it."""
import os
import shutil
import tempfile

import kstore

KEY = b"k" * 16
VALUE = b"v" * 100
TS = 1_700_000_000_000
N = 200_000


class ArrowColumns:
    timeout = 300

    def setup(self):
        try:
            import pyarrow as pa
            from kstore import arrow
        except ImportError:
            raise NotImplementedError("pyarrow is not installed") from None
        self.arrow = arrow
        self.dir = tempfile.mkdtemp()
        self.log = kstore.Log.open(os.path.join(self.dir, "t-0"), {"segment.bytes": 1 << 30})
        for s in range(0, N, 1000):
            self.log.append([(KEY, VALUE, TS + i) for i in range(s, s + 1000)])
        self.table = pa.Table.from_batches(list(arrow.iter_batches(self.log, "t", 0, 0, N)))
        self.batch = self.table.select(["key", "value"]).combine_chunks().to_batches()[0]
        self.cols = arrow.column_input(self.batch)
        self.sizes = self.cols.sizes()
        self.builder = kstore._core.BatchBuilder()

    def teardown(self):
        self.log.close()
        shutil.rmtree(self.dir)

    def time_decode_to_arrow(self):
        """200k records (100-byte values) from segment bytes to RecordBatches."""
        for _ in self.arrow.iter_batches(self.log, "t", 0, 0, N):
            pass

    def time_encode_columns(self):
        """200k rows of Arrow columns into ~1 MiB v2 batches (the Spark sink's staging)."""
        b = self.builder
        for lo, hi in self.arrow.split_rows(self.sizes, 0, N, 1 << 20):
            b.build_columns(lo, hi, self.cols, 0, TS, False, 0, 1 << 62, False, 0)


class CompressedToArrow:
    """50k records in compressed batches of 1000 to RecordBatches, decompression included."""
    params = ["gzip", "snappy", "lz4", "zstd"]
    param_names = ["codec"]
    timeout = 300

    def setup(self, codec):
        try:
            from kstore import arrow
            from kstore.compression import CODEC_IDS, available
        except ImportError:
            raise NotImplementedError("pyarrow is not installed") from None
        if not available(CODEC_IDS[codec]):
            raise NotImplementedError(f"{codec} needs kstore[compression]")
        self.arrow = arrow
        self.dir = tempfile.mkdtemp()
        self.log = kstore.Log.open(os.path.join(self.dir, "t-0"), {"compression.type": codec})
        for s in range(0, N // 4, 1000):
            self.log.append([(KEY, VALUE, TS + i) for i in range(s, s + 1000)])

    def teardown(self, codec):
        self.log.close()
        shutil.rmtree(self.dir)

    def time_decode_to_arrow(self, codec):
        for _ in self.arrow.iter_batches(self.log, "t", 0, 0, N):
            pass
