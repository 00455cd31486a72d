"""Reads that decode only what a query needs: a Columns without keys/values/timestamps (the core),
a user schema naming a subset of the Kafka source's columns (Spark), and counts answered from
batch headers, which must equal a full decode's on compacted topics (offset gaps, compressed
batches) and transactional ones (control batches)."""
import gzip

import pytest

import kstore
from kstore import _core
from tests.broker_dirs import CONTROL, TRANSACTIONAL, control_key, end_txn_marker, v2_batch, \
    write_partition

pa = pytest.importorskip("pyarrow")
from kstore.arrow import columns_for, iter_batches, kafka_schema  # noqa: E402

GZIP = 1


def _gz(body: bytes) -> bytes:
    return gzip.compress(body)


def compacted_log() -> tuple[bytes, list[int]]:
    """A compacted partition's segment: a full batch, batches with holes (one gzip'd), a full
    one; returns (bytes, the offsets that hold records)."""
    batches, offs = [], []

    def add(base, deltas, last_delta=None, **kw):
        recs = [(d, d, b"k%d" % (base + d), b"v%d" % (base + d)) for d in deltas]
        batches.append(v2_batch(base, recs, last_delta=last_delta, **kw))
        offs.extend(base + d for d in deltas)

    add(0, range(5))                                  # 0..4, no gaps
    add(5, [1, 3, 4], last_delta=6)                   # 6, 8, 9 of 5..11
    add(12, [0, 2, 7], last_delta=9, attrs=GZIP, codec_payload=_gz)   # 12, 14, 19 of 12..21
    add(22, [], last_delta=3)                         # every record cleaned away: 22..25 empty
    add(26, range(4), attrs=GZIP, codec_payload=_gz)  # 26..29, compressed, no gaps
    return b"".join(batches), offs


def transactional_log() -> tuple[bytes, list[int]]:
    """Transactional batches with commit markers (control batches, one offset each)."""
    t = TRANSACTIONAL
    marker = [(0, 0, control_key(1), end_txn_marker(3))]
    out = [v2_batch(0, [(i, i, b"a", b"x%d" % i) for i in range(3)], attrs=t, producer_id=7),
           v2_batch(3, marker, attrs=t | CONTROL, producer_id=7),
           v2_batch(4, [(i, i, b"b", b"y%d" % i) for i in range(4)], attrs=t, producer_id=7),
           v2_batch(8, marker, attrs=t | CONTROL, producer_id=7),
           v2_batch(9, [(0, 0, b"c", b"z")])]
    return b"".join(out), [0, 1, 2, 4, 5, 6, 7, 9]


@pytest.fixture
def broker_store(tmp_path):
    """A store holding topic `cmp` (one compacted partition) and `txn` (one transactional)."""
    root = str(tmp_path / "store")
    cb, coffs = compacted_log()
    tb, toffs = transactional_log()
    write_partition(root, "cmp-0", cb)
    write_partition(root, "txn-0", tb)
    return root, {"cmp": coffs, "txn": toffs}


def _offsets(store, topic, start, stop, **kw):
    with kstore.StoreReader(store) as r:
        schema = pa.schema([kafka_schema().field("offset")])
        return [o for b in iter_batches(r.log(topic, 0), topic, 0, start, stop, schema=schema, **kw)
                for o in b.column(0).to_pylist()]


def test_columns_flags():
    c = _core.Columns(False, keys=False, values=False, timestamps=False)
    assert c.offsets_only and not c.keys and not c.values and not c.timestamps
    assert not _core.Columns().offsets_only
    assert not _core.Columns(True, keys=False, values=False, timestamps=False).offsets_only
    sub = columns_for(pa.schema([kafka_schema().field("value"), kafka_schema().field("offset")]))
    assert (sub.keys, sub.values, sub.timestamps, sub.headers) == (False, True, False, False)


@pytest.mark.parametrize("topic", ["cmp", "txn"])
def test_offsets_only_equals_full_decode(broker_store, topic):
    """Every [start, stop) and batch size: the offsets-only read yields exactly the offsets of
    the full decode (gaps skipped, control batches left out, limits honoured)."""
    store, want = broker_store
    with kstore.StoreReader(store) as r:
        full = [o for b in iter_batches(r.log(topic, 0), topic, 0, 0, 1 << 62)
                for o in b.column("offset").to_pylist()]
    assert full == want[topic]
    end = want[topic][-1] + 1
    for start in range(end + 1):
        for stop in range(start, end + 2):
            expect = [o for o in want[topic] if start <= o < stop]
            for batch_records in (1, 2, 3, 1 << 16):
                got = _offsets(store, topic, start, stop, batch_records=batch_records)
                assert got == expect, (start, stop, batch_records)


def test_offsets_only_skips_records_of_gap_free_batches(tmp_path):
    """A gap-free batch is taken from its header: its records are not parsed (a count that the
    CRC covers is trusted), while the full decode of the same bytes parses and refuses them.
    A batch whose CRC does not match is not read by either."""
    recs = [(i, i, b"k", b"v") for i in range(3)]
    good = v2_batch(0, recs)
    # records section replaced by junk of the same length, CRC re-sealed over it
    junk = bytearray(good)
    junk[61:] = b"\xff" * (len(good) - 61)
    import struct
    from tests.broker_dirs import crc32c
    struct.pack_into(">I", junk, 17, crc32c(bytes(junk[21:])))
    root = str(tmp_path / "s")
    write_partition(root, "j-0", bytes(junk) + v2_batch(3, recs))
    assert _offsets(root, "j", 0, 6) == [0, 1, 2, 3, 4, 5]
    with kstore.StoreReader(root) as r, pytest.raises(kstore.CorruptRecordError):
        list(iter_batches(r.log("j", 0), "j", 0, 0, 6))
    bad = bytearray(junk)
    bad[70] ^= 1          # CRC no longer matches: the open ends the log's data there, for both
    root2 = str(tmp_path / "s2")
    write_partition(root2, "j-0", bytes(bad))
    with kstore.StoreReader(root2) as r:
        assert r.offsets("j", 0) == (0, 0)
        assert list(iter_batches(r.log("j", 0), "j", 0, 0, 3)) == []
    assert _offsets(root2, "j", 0, 3) == []


# -- Spark ----------------------------------------------------------------------------------------
def make_store(path, partitions=2, n=300):
    """n records per partition in batches of 7, one record in one-record batches at the end."""
    with kstore.LogManager(path, {"log.segment.bytes": 4096}) as m:
        m.create_topic("t", partitions)
        for p in range(partitions):
            lg = m.log("t", p)
            for s in range(0, n - 1, 7):
                lg.append([(b"k%d" % i, b"p%d-%d" % (p, i), 1000 * i, [("h", b"%d" % i)])
                           for i in range(s, min(s + 7, n - 1))])
            lg.append([(None, None, 1000 * (n - 1))])
    return path


def _load(spark, path, schema=None, **opts):
    r = spark.read.format("kstore").option("subscribe", opts.pop("subscribe", "t"))
    for k, v in opts.items():
        r = r.option(k, v)
    if schema is not None:
        r = r.schema(schema)
    return r.load(path)


def _null_last(row):
    return [(True, 0) if v is None else (False, v) for v in row]


def _rows(df):
    return sorted((tuple(r) for r in df.collect()), key=_null_last)


SUBSETS = ["partition int, offset long", "offset long", "topic string", "value binary, partition int",
           "timestamp timestamp, timestampType int, offset long", "key binary, offset long",
           "headers array<struct<key:string,value:binary>>, offset long"]


def test_subset_schema_equals_full_read_projected(spark, tmp_path):
    path = make_store(str(tmp_path / "s"))
    full = _load(spark, path, includeHeaders="true")
    assert full.count() == 600
    for ddl in SUBSETS:
        df = _load(spark, path, ddl, includeHeaders="true")
        names = [f.name for f in df.schema.fields]
        assert df.columns == names
        assert _rows(df) == _rows(full.select(*names)), ddl
    # split into ranges too: rows stay exact across task boundaries
    df = _load(spark, path, "partition int, offset long", minPartitions="7")
    assert _rows(df) == [(p, o) for p in range(2) for o in range(300)]


def test_count_by_partition_from_offsets(spark, tmp_path, broker_store):
    path = make_store(str(tmp_path / "s"))
    sub = _load(spark, path, "partition int").groupBy("partition").count()
    assert _rows(sub) == [(0, 300), (1, 300)]
    assert _rows(_load(spark, path).groupBy("partition").count()) == [(0, 300), (1, 300)]
    store, want = broker_store
    for topic in ("cmp", "txn"):
        full = _load(spark, store, subscribe=topic)
        for ddl in ("partition int", "partition int, offset long", "topic string"):
            df = _load(spark, store, ddl, subscribe=topic)
            assert df.count() == full.count() == len(want[topic]), (topic, ddl)
        offs = _load(spark, store, "offset long", subscribe=topic)
        assert sorted(r.offset for r in offs.collect()) == want[topic]
        assert _rows(_load(spark, store, "partition int", subscribe=topic)
                     .groupBy("partition").count()) == [(0, len(want[topic]))]


def test_filters_pushed_with_subset_schema(spark, tmp_path):
    path = make_store(str(tmp_path / "s"))
    df = _load(spark, path, "partition int, offset long").filter(
        "partition = 1 AND offset >= 10 AND offset < 25")
    assert _rows(df) == [(1, o) for o in range(10, 25)]
    df = _load(spark, path, "offset long, partition int").filter("offset IN (3, 299, 400)")
    assert _rows(df) == [(3, 0), (3, 1), (299, 0), (299, 1)]
    df = _load(spark, path, "partition int, timestampType int").filter("partition != 0")
    assert df.count() == 300
    df = _load(spark, path, "timestamp timestamp, partition int").filter(
        "timestamp >= timestamp'1970-01-01 00:04:50' AND partition = 0")
    assert df.count() == 10


REFUSED = [
    ("partition int, color string", "column 'color' is not in the kstore source's schema"),
    ("partition long", "column 'partition' is int in the kstore source, not bigint"),
    ("timestamp timestamp_ntz", "column 'timestamp' is timestamp in the kstore source"),
    ("headers array<struct<key:string,value:binary>>", r"'headers'.*includeHeaders=true"),
    ("offset long, offset long", "column 'offset' is named twice"),
]


@pytest.mark.parametrize("ddl, match", REFUSED)
def test_subset_schema_refused_at_planning(spark, tmp_path, ddl, match):
    path = make_store(str(tmp_path / "s"), n=3)
    with pytest.raises(Exception, match=match):
        _load(spark, path, ddl).collect()


@pytest.mark.parametrize("ddl, match", REFUSED)
def test_streaming_refuses_the_schemas_batch_refuses(spark, tmp_path, ddl, match):
    """The streaming reader is planned from the same projection: what the batch path refuses,
    it refuses when Spark asks for it (the query's start), with the same message."""
    from pyspark.sql.types import _parse_datatype_string
    from kstore.errors import InvalidConfigError
    from kstore.spark import KStoreDataSource
    opts = {"path": make_store(str(tmp_path / "s"), n=3), "subscribe": "t"}
    schema = _parse_datatype_string(ddl)
    for make in (KStoreDataSource(opts).reader, KStoreDataSource(opts).streamReader):
        with pytest.raises(InvalidConfigError, match=match):
            make(schema)


def _stream(spark, path, ddl, out, ckpt):
    q = (spark.readStream.format("kstore").option("subscribe", "t")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "50")
         .schema(ddl).load(path).writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    q.awaitTermination(180)
    if q.exception():
        raise q.exception()
    return q


def test_streaming_reads_a_subset_schema_with_restart(spark, tmp_path):
    """readStream with .schema("partition int, offset long") (offsets from batch headers only)
    and with "value binary, offset long" (values decoded, keys not): exact rows, in several micro-batches, and after a
    restart from the checkpoint only the records appended since."""
    path = make_store(str(tmp_path / "s"), n=60)
    for ddl, cols in (("partition int, offset long", ["partition", "offset"]),
                      ("value binary, offset long", ["value", "offset"])):
        tag = cols[0]
        out, ckpt = str(tmp_path / f"out-{tag}"), str(tmp_path / f"ck-{tag}")
        q = _stream(spark, path, ddl, out, ckpt)
        assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 2     # 120 rows, 50 a batch
        # this file's make_store: record 59 of each partition has a null key and value
        want = {"partition": lambda p, i: p,
                "value": lambda p, i: None if i == 59 else b"p%d-%d" % (p, i)}[tag]
        df = spark.read.parquet(out)
        assert df.columns == cols
        got = [(bytes(v) if isinstance(v, bytearray) else v, o) for v, o in _rows(df)]
        assert got == sorted(((want(p, i), i) for p in range(2) for i in range(60)),
                             key=_null_last)
    with kstore.LogManager(path) as m:
        for p in range(2):
            m.log("t", p).append([(b"k%d" % i, b"p%d-%d" % (p, i), 1000 * i) for i in range(60, 65)])
    out, ckpt = str(tmp_path / "out-partition"), str(tmp_path / "ck-partition")
    q = _stream(spark, path, "partition int, offset long", out, ckpt)
    assert sum(p["numInputRows"] for p in q.recentProgress) == 10
    assert _rows(spark.read.parquet(out)) == [(p, i) for p in range(2) for i in range(65)]
