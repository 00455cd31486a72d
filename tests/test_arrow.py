"""kstore.arrow and the core's columnar paths: bulk decode to Arrow equals the record reader,
columnar encode equals the record encoder byte for byte, staged batches re-base exactly."""
import struct

import numpy as np
import pytest

import kstore
from kstore import _core
from kstore.partitioner import murmur2 as py_murmur2

pa = pytest.importorskip("pyarrow")
ka = pytest.importorskip("kstore.arrow")


def records(n, start=0):
    out = []
    for j in range(start, start + n):
        key = None if j % 7 == 3 else b"k%d" % j
        value = None if j % 11 == 5 else b"v" * (j % 40)
        headers = [("h%d" % (j % 3), b"x" * (j % 4)), ("n", None)] if j % 5 == 0 else None
        out.append((key, value, 1_600_000_000_000 + j, headers))
    return out


def table_of(batches):
    return pa.Table.from_batches(batches, schema=ka.kafka_schema(True)) if batches else None


def expected_rows(lg, start, stop, topic="t", partition=0):
    rows = []
    for chunk in lg.iter_chunks(start):
        for r in chunk:
            if r.offset >= stop:
                return rows
            rows.append({"key": r.key, "value": r.value, "topic": topic, "partition": partition,
                         "offset": r.offset, "timestamp_ms": r.timestamp,
                         "timestampType": r.timestamp_type,
                         "headers": [{"key": k, "value": v} for k, v in r.headers] or None})
    return rows


def actual_rows(batches):
    out = []
    for b in batches:
        for row in b.to_pylist():
            ts = row.pop("timestamp")
            row["timestamp_ms"] = int(ts.timestamp() * 1000) if ts is not None else None
            out.append(row)
    return out


@pytest.mark.parametrize("config", [
    {"segment.bytes": 4096},
    {"segment.bytes": 1 << 20, "compression.type": "gzip"},
    {"segment.bytes": 8192, "message.timestamp.type": "LogAppendTime"},
])
def test_iter_batches_equals_record_reader(open_log, config):
    lg = open_log(config)
    for i in range(40):
        lg.append(records(25, i * 25))
    assert len(lg.segments) > 1 or config.get("compression.type")
    for start, stop, per_batch in [(0, 1000, 1 << 16), (13, 977, 100), (500, 501, 7), (999, 5000, 3)]:
        got = list(ka.iter_batches(lg, "t", 0, start, stop, include_headers=True,
                                   batch_records=per_batch))
        assert all(b.num_rows <= per_batch for b in got)
        assert actual_rows(got) == expected_rows(lg, start, stop)


def test_iter_batches_schema_and_types(open_log):
    lg = open_log()
    lg.append([(b"k", b"v", 1234, [("a", b"b")])])
    (b,) = ka.iter_batches(lg, "clicks", 3, 0, 10, include_headers=True)
    assert b.schema == ka.kafka_schema(True)
    assert b.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert b.column("timestamp").cast(pa.int64()).to_pylist() == [1234000]
    assert b.column("topic").to_pylist() == ["clicks"]
    assert b.column("partition").to_pylist() == [3]
    (b,) = ka.iter_batches(lg, "clicks", 3, 0, 10)
    assert b.schema.names == ["key", "value", "topic", "partition", "offset", "timestamp",
                              "timestampType"]


def test_decode_columns_limits_resume_exactly(open_log):
    lg = open_log({"segment.bytes": 1 << 20})
    for _i in range(10):
        lg.append([(b"k", b"x" * 100) for _ in range(50)])
    cols = _core.Columns()
    seen = []
    offset = 0
    while offset < lg.log_end_offset:
        cols.clear()
        nxt = lg.read_columns(offset, 1 << 62, cols, max_records=1 << 20, max_data=1000)
        arr = cols.arrays()
        assert 1 <= cols.count <= 10          # ~1000 bytes of data: 9 or 10 records of 101
        assert arr["offset"][0] == offset
        seen += arr["offset"].tolist()
        offset = nxt
    assert seen == list(range(500))


def test_decode_columns_skips_control_batches():
    b = _core.BatchBuilder()
    b.build([(b"k", b"v")], 2, 0, 0, False, 0, 1 << 62, False, 0)
    data = bytearray(b.getvalue())
    ctrl = bytearray(data)
    struct.pack_into(">q", ctrl, 0, 1)
    struct.pack_into(">h", ctrl, 21, 32)        # control bit
    struct.pack_into(">I", ctrl, 17, kstore.crc32c(bytes(ctrl[21:])))
    third = bytearray(data)
    struct.pack_into(">q", third, 0, 2)
    m = _core.Mapping.from_bytes(bytes(data + ctrl + third))
    cols = _core.Columns()
    pos, nxt, status = _core.decode_columns(m, 0, m.length, 0, 1 << 62, cols)
    assert status == "end" and pos == m.length and nxt == 3
    assert cols.arrays()["offset"].tolist() == [0, 2]


def test_decode_columns_rejects_bad_crc_with_position():
    b = _core.BatchBuilder()
    b.build([(b"k", b"v")] * 3, 2, 0, 0, False, 0, 1 << 62, False, 0)
    good = b.getvalue()
    b.build([(b"k", b"v")] * 3, 2, 3, 0, False, 0, 1 << 62, False, 0)
    bad = bytearray(b.getvalue())
    bad[-1] ^= 1
    m = _core.Mapping.from_bytes(good + bytes(bad))
    with pytest.raises(kstore.CorruptRecordError, match="CRC") as e:
        _core.decode_columns(m, 0, m.length, 0, 1 << 62, _core.Columns())
    assert e.value.position == len(good)


@pytest.mark.parametrize("cut", [61, 65, 69, 85])
def test_decode_columns_malformed_record_is_corrupt(cut):
    b = _core.BatchBuilder()
    b.build([(b"key", b"value" * 3)] * 2, 2, 0, 0, False, 0, 1 << 62, False, 0)
    data = bytearray(b.getvalue())
    data[cut] = 0x7f if cut < 85 else 0x80    # a negative length, or a varint running on
    struct.pack_into(">I", data, 17, kstore.crc32c(bytes(data[21:])))
    m = _core.Mapping.from_bytes(bytes(data))
    with pytest.raises(kstore.CorruptRecordError):
        _core.decode_columns(m, 0, m.length, 0, 1 << 62, _core.Columns(True))


def test_legacy_messages_decode_to_columns(open_log):
    lg = open_log({"message.format.version": "0.10.2", "compression.type": "gzip"})
    lg.append([(b"a", b"1", 5), (None, b"2", 6)])
    lg2_rows = expected_rows(lg, 0, 10)
    assert actual_rows(list(ka.iter_batches(lg, "t", 0, 0, 10, include_headers=True))) == lg2_rows


# -- columnar encode -----------------------------------------------------------------------------
def batch_from(rows):
    return pa.RecordBatch.from_pydict({
        "key": pa.array([r[0] for r in rows], pa.binary()),
        "value": pa.array([r[1] for r in rows], pa.binary()),
        "timestamp": pa.array([r[2] * 1000 for r in rows], pa.timestamp("us", tz="UTC")),
        "headers": pa.array([None if r[3] is None else [{"key": k, "value": v} for k, v in r[3]]
                             for r in rows], ka.HEADER_TYPE),
    })


@pytest.mark.parametrize("codec", [0, 1])
def test_build_columns_matches_build_byte_for_byte(codec):
    rows = records(300)
    cols = ka.column_input(batch_from(rows))
    a, b = _core.BatchBuilder(), _core.BatchBuilder()
    for lo, hi in [(0, 300), (17, 18), (100, 250)]:
        norm = [(k, v, ts, [(hk, hv) for hk, hv in (h or [])]) for k, v, ts, h in rows[lo:hi]]
        a.build(norm, 2, 42, 0, False, 0, 1 << 62, False, codec)
        b.build_columns(lo, hi, cols, 42, 0, False, 0, 1 << 62, False, codec)
        assert b.getvalue() == a.getvalue()
        assert (b.count, b.last_offset, b.max_timestamp) == (a.count, a.last_offset, a.max_timestamp)


def test_build_columns_validates():
    cols = ka.column_input(batch_from([(None, b"v", 5, None)]))
    b = _core.BatchBuilder()
    with pytest.raises(kstore.InvalidRecordError, match="require a key"):
        b.build_columns(0, 1, cols, 0, 10, False, 0, 100, True, 0)
    with pytest.raises(kstore.InvalidRecordError, match="outside the allowed range"):
        b.build_columns(0, 1, cols, 0, 10, False, 6, 100, False, 0)
    with pytest.raises(ValueError, match="outside"):
        b.build_columns(0, 2, cols, 0, 10, False, 0, 100, False, 0)
    with pytest.raises(ValueError, match="offsets"):
        _core.ColumnInput(2, value=(np.array([0, 5, 3], np.int32), b"abcde", None))
    with pytest.raises(ValueError, match="outside"):
        _core.ColumnInput(1, value=(np.array([0, 9], np.int32), b"abc", None))


def test_column_input_accepts_strings_slices_and_no_key():
    rb = pa.RecordBatch.from_pydict({"value": pa.array(["x", "yy", None, "zzz"])}).slice(1, 3)
    cols = ka.column_input(rb)
    b = _core.BatchBuilder()
    b.build_columns(0, 3, cols, 0, 7, False, 0, 100, False, 0)
    got = [(r.key, r.value, r.timestamp) for r in _core.decode_batches(b.getvalue())]
    assert got == [(None, b"yy", 7), (None, None, 7), (None, b"zzz", 7)]


KAFKA_MURMUR2 = {  # clients' UtilsTest.testMurmur2
    b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971, b"abc": 479470107,
}


def test_murmur2_matches_kafka_vectors():
    for key, h in KAFKA_MURMUR2.items():
        assert _core.murmur2(key) == h == py_murmur2(key)
    keys = list(KAFKA_MURMUR2) + [None]
    hashes = ka.key_hashes(pa.RecordBatch.from_pydict(
        {"key": pa.array(keys, pa.binary()), "value": pa.array([b""] * len(keys))}))
    partitions = np.where(hashes >= 0, hashes % 7, -1)
    assert partitions.tolist() == [(h & 0x7FFFFFFF) % 7 for h in KAFKA_MURMUR2.values()] + [-1]


def test_split_rows_respects_budget():
    from kstore.log import split_rows      # the sink's row budgeting (lives with Log)
    sizes = np.array([10, 10, 50, 5, 5, 5, 100, 1], dtype=np.int64)
    assert split_rows(sizes, 0, 8, 25) == [(0, 2), (2, 3), (3, 6), (6, 7), (7, 8)]
    assert split_rows(sizes, 3, 5, 1000) == [(3, 5)]
    assert split_rows(sizes, 4, 4, 10) == []


# -- staged batches ------------------------------------------------------------------------------
def test_append_batches_rebases_offsets_and_keeps_bytes(open_log):
    lg = open_log({"segment.bytes": 2048})
    lg.append([(b"a", b"b")])
    b = _core.BatchBuilder()
    staged = b""
    for i in range(30):
        b.build([(b"k%d" % i, b"v" * 30, 1000 + i)] * 3, 2, 0, 0, False, 0, 1 << 62, False, 0)
        staged += b.getvalue()
    first, count = lg.append_batches(staged)
    assert (first, count) == (1, 90)
    assert lg.log_end_offset == 91 and len(lg.segments) > 1
    recs = [r for chunk in lg.iter_chunks(1) for r in chunk]
    assert [r.offset for r in recs] == list(range(1, 91))
    assert [r.key for r in recs] == [b"k%d" % (i // 3) for i in range(90)]
    # bytes after the base offset are those staged (no re-encoding), but for the partition
    # leader epoch a broker's leader sets (0: a new partition's)
    raw = bytes(lg.read_batches(1, 1 << 20))
    assert raw[8:12] == staged[8:12] and raw[16:len(staged) // 30] == staged[16:len(staged) // 30]
    assert struct.unpack(">i", raw[12:16]) == (0,) and struct.unpack(">i", staged[12:16]) == (-1,)
    assert struct.unpack(">q", raw[:8])[0] == 1


def test_append_batches_log_append_time(open_log):
    t = kstore.MockTime(5_000_000)
    lg = open_log({"message.timestamp.type": "LogAppendTime"}, time=t)
    b = _core.BatchBuilder()
    b.build([(b"k", b"v", 7)], 2, 0, 0, False, 0, 1 << 62, False, 0)
    lg.append_batches(b.getvalue())
    (r,) = lg.read(0)
    assert (r.timestamp, r.timestamp_type) == (5_000_000, 1)


def test_append_batches_rejects_corrupt_staging(open_log):
    lg = open_log()
    b = _core.BatchBuilder()
    b.build([(b"k", b"v")], 2, 0, 0, False, 0, 1 << 62, False, 0)
    bad = bytearray(b.getvalue())
    bad[-1] ^= 0xFF
    with pytest.raises(kstore.CorruptRecordError, match="CRC"):
        lg.append_batches(bytes(bad))
    assert lg.log_end_offset == 0
    with pytest.raises(kstore.CorruptRecordError, match="no batch|past the end"):
        lg.append_batches(b.getvalue()[:30])


# -- the read-only store view --------------------------------------------------------------------
def test_store_reader_sees_new_partitions_records_and_starts(tmp_path):
    d = str(tmp_path / "data")
    with kstore.LogManager(d) as m:
        m.create_topic("a", 2)
        m.append("a", b"k", b"v", partition=1)
        with kstore.StoreReader(d) as r:
            assert r.partitions() == [("a", 0), ("a", 1)]
            assert r.offsets("a", 1) == (0, 1)
            m.create_topic("b", 1)
            m.append("a", b"k", b"v", partition=1)
            assert r.offsets("a", 1) == (0, 2)
            r.refresh()
            assert r.topics() == ["a", "b"]
            with pytest.raises(kstore.UnknownTopicError):
                r.log("c", 0)
    with pytest.raises(kstore.KStoreError, match="does not exist"):
        kstore.StoreReader(str(tmp_path / "nope"))


def test_columns_views_are_zero_copy_and_freeze_the_columns(open_log):
    lg = open_log()
    lg.append([(b"k%d" % i, b"v%d" % i) for i in range(10)])
    cols = _core.Columns()
    lg.read_columns(0, 10, cols)
    v = cols.views()
    assert cols.live_views == len(v) == 9
    assert v["offset"].tolist() == list(range(10)) and not v["value_data"].flags.writeable
    assert bytes(v["value_data"][v["value_offsets"][3]:v["value_offsets"][4]]) == b"v3"
    with pytest.raises(BufferError, match="live view"):
        cols.clear()
    with pytest.raises(BufferError, match="live view"):
        lg.read_columns(0, 10, cols)
    a = cols.arrays()                      # copies do not freeze anything
    del v
    assert cols.live_views == 0
    cols.clear()
    assert a["offset"].tolist() == list(range(10))


def test_iter_batches_reuses_buffers_only_once_batches_are_released(open_log):
    lg = open_log({"segment.bytes": 1 << 20})
    for i in range(20):
        lg.append(records(50, i * 50))
    want = expected_rows(lg, 0, 1000)
    # a consumer that sends each batch on (as Spark's worker does) and keeps nothing
    got, addresses = [], set()
    for b in ka.iter_batches(lg, "t", 0, 0, 1000, include_headers=True, batch_records=64):
        got += actual_rows([b])
        addresses.add(b.column("value").buffers()[2].address)
        del b
    assert got == want
    assert len(addresses) <= 3                 # the decode buffers were recycled
    # one that keeps every batch: none is overwritten by a later one
    kept = list(ka.iter_batches(lg, "t", 0, 0, 1000, include_headers=True, batch_records=64))
    assert len({b.column("value").buffers()[2].address for b in kept}) == len(kept)
    assert actual_rows(kept) == want
