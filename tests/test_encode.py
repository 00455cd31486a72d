"""kstore._encode: BatchBuilder's batches field by field (v2, v1, v0, compressed) and its input
validation."""
import gzip
import struct
import zlib

import pytest

import kstore
from kstore import _core
from kstore.errors import CorruptRecordError, InvalidRecordError, UnsupportedCodecError
from batch_helpers import ANY_TS, CRC32C, NOW, build


# -- v2 layout -------------------------------------------------------------------------------
def test_v2_batch_layout_field_by_field():
    b = build([(b"key", b"value", NOW + 5), (None, None, NOW + 2, [("h", b"x"), ("n", None)])],
              base=42)
    raw = b.getvalue()
    (base_offset, length, epoch, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch,
     base_seq, count) = struct.unpack(">qiibIhiqqqhii", raw[:61])
    assert base_offset == 42
    assert length == len(raw) - 12
    assert epoch == -1
    assert magic == 2
    assert crc == CRC32C(raw[21:])
    assert attrs == 0
    assert last_delta == 1
    assert base_ts == NOW + 5
    assert max_ts == NOW + 5
    assert (pid, pepoch, base_seq) == (-1, -1, -1)
    assert count == 2
    # record 0: len, attrs 0, tsDelta 0, offDelta 0, keyLen 3, key, valLen 5, value, 0 headers
    body0 = bytes([0, 0, 0, 6]) + b"key" + bytes([10]) + b"value" + bytes([0])
    assert raw[61] == len(body0) * 2          # zig-zag varint
    assert raw[62:62 + len(body0)] == body0
    r1 = raw[62 + len(body0):]
    # record 1: tsDelta -3 → zig-zag 5, offDelta 1 → 2, key -1 → 1, value -1 → 1, 2 headers
    body1 = bytes([0, 5, 2, 1, 1, 4]) + bytes([2]) + b"h" + bytes([2]) + b"x" + bytes([2]) + b"n" + bytes([1])
    assert r1[0] == len(body1) * 2
    assert r1[1:] == body1


def test_v2_log_append_time_sets_bit_and_max_timestamp():
    raw = build([(b"k", b"v", 5)], lat=True).getvalue()
    attrs, = struct.unpack(">h", raw[21:23])
    assert attrs & 8
    assert struct.unpack(">q", raw[35:43])[0] == NOW
    rec = _core.decode_batches(raw)[0]
    assert rec.timestamp == NOW and rec.timestamp_type == 1


def test_v2_gzip_batch_round_trip_and_layout():
    recs = [(b"k%d" % i, b"v" * 50, NOW + i) for i in range(20)]
    raw = build(recs, codec=1, base=7).getvalue()
    assert struct.unpack(">h", raw[21:23])[0] & 7 == 1
    inner = gzip.decompress(raw[61:])
    plain = build(recs, base=7).getvalue()
    assert inner == plain[61:]
    out = _core.decode_batches(raw)
    assert [(r.offset, r.key, r.value, r.timestamp) for r in out] == \
        [(7 + i, k, v, t) for i, (k, v, t) in enumerate(recs)]


# -- v1 / v0 layout --------------------------------------------------------------------------
def test_v1_message_layout_field_by_field():
    raw = build([(b"ab", b"cde", NOW)], magic=1, base=9).getvalue()
    offset, size, crc, magic, attrs, ts, klen = struct.unpack(">qiIbbqi", raw[:30])
    assert offset == 9
    assert size == len(raw) - 12 == 22 + 2 + 3
    assert crc == zlib.crc32(raw[16:])
    assert (magic, attrs, ts, klen) == (1, 0, NOW, 2)
    assert raw[30:32] == b"ab"
    assert struct.unpack(">i", raw[32:36])[0] == 3
    assert raw[36:] == b"cde"


def test_v0_message_layout():
    raw = build([(None, b"x")], magic=0, base=3).getvalue()
    offset, size, crc, magic, attrs, klen, vlen = struct.unpack(">qiIbbii", raw[:26])
    assert (offset, size, magic, attrs, klen, vlen) == (3, 15, 0, 0, -1, 1)
    assert crc == zlib.crc32(raw[16:])
    assert _core.decode_batches(raw)[0].timestamp == -1


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_gzip_wrapper_offsets(magic):
    recs = [(b"k%d" % i, b"v%d" % i, NOW + i) for i in range(5)]
    raw = build(recs, magic=magic, base=100, codec=1).getvalue()
    wrapper_offset, = struct.unpack(">q", raw[:8])
    assert wrapper_offset == 104
    inner = gzip.decompress(raw[12 + (22 if magic == 1 else 14):])
    first_inner, = struct.unpack(">q", inner[:8])
    assert first_inner == (0 if magic == 1 else 100)   # v1 relative, v0 absolute
    out = _core.decode_batches(raw)
    assert [r.offset for r in out] == [100, 101, 102, 103, 104]
    assert [r.value for r in out] == [b"v%d" % i for i in range(5)]


def test_legacy_headers_rejected():
    with pytest.raises(InvalidRecordError, match="headers need message format v2"):
        build([(b"k", b"v", NOW, [("h", b"x")])], magic=1)


# -- input validation ------------------------------------------------------------------------
@pytest.mark.parametrize("bad,msg", [
    ([(b"k",)], "record 0"),
    ([("k", b"v")], "key must be bytes-like"),
    ([(b"k", 5)], "value must be bytes-like"),
    ([(b"k", b"v", "x")], "timestamp must be an int"),
    ([(b"k", b"v", -5)], "negative"),
    ([42], "expected a"),
    ([(b"k", b"v", NOW, [("h", "str")])], "header value"),
    ([(b"k", b"v", NOW, [(1, b"x")])], "header key"),
])
def test_bad_records_raise_invalid_record(bad, msg):
    with pytest.raises(InvalidRecordError, match=msg):
        build(bad)


def test_timestamp_window_and_key_requirement():
    with pytest.raises(InvalidRecordError, match="outside the allowed range"):
        build([(b"k", b"v", 10)], ts=(100, 200))
    with pytest.raises(InvalidRecordError, match="require a key"):
        build([(None, b"v")], require_key=True)


def test_record_objects_and_bytes_like_inputs():
    recs = [kstore.Record(b"k", bytearray(b"v"), NOW, [("h", b"1")]), (memoryview(b"kk"), b"vv")]
    out = _core.decode_batches(build(recs).getvalue())
    assert out[0].key == b"k" and out[0].value == b"v" and out[0].headers == (("h", b"1"),)
    assert out[1].key == b"kk" and out[1].timestamp == NOW


def test_missing_codec_names_codec_and_extra(monkeypatch):
    import kstore.compression as comp
    raw = bytearray(build([(b"k", b"v")]).getvalue())
    raw[22] = (raw[22] & ~7) | 2          # snappy
    raw[17:21] = struct.pack(">I", CRC32C(bytes(raw[21:])))
    monkeypatch.setattr(comp, "_cramjam", None)
    with pytest.raises(UnsupportedCodecError, match=r"'snappy' needs the kstore\[compression\] extra"):
        _core.decode_batches(bytes(raw))
    monkeypatch.undo()
    if comp.available(2):                 # with the codec: garbage is corruption, not a crash
        with pytest.raises(CorruptRecordError, match="cannot decompress snappy"):
            _core.decode_batches(bytes(raw))


# -- the fast path (exact tuples of bytes/None and an int) against the general path ---------
def _mixed_records(n=300):
    out = []
    for i in range(n):
        k = None if i % 7 == 0 else b"k%05d" % i
        v = None if i % 11 == 0 else bytes([i % 251]) * (i % 300)
        ts = None if i % 13 == 0 else NOW + (i * 37) % 1000 - 500
        out.append((k, v) if i % 5 == 0 else (k, v, ts) if i % 3 else (k, v, ts, None if i % 2 else ()))
    return out


def test_fast_path_writes_the_bytes_the_general_path_writes():
    recs = _mixed_records()
    fast = build(recs).getvalue()
    # lists, Records and bytearrays take the general path: the batch must be byte-identical
    assert build([list(r) for r in recs]).getvalue() == fast
    assert build([tuple(bytearray(x) if isinstance(x, bytes) else x for x in r) for r in recs]).getvalue() == fast
    assert build(tuple(recs)).getvalue() == fast
    # shapes mixed record by record: every other record through the general path
    mixed = [list(r) if i % 2 else r for i, r in enumerate(recs)]
    assert build(mixed).getvalue() == fast
    out = _core.decode_batches(fast)
    assert [(r.key, r.value) for r in out] == [(r[0], r[1]) for r in recs]
    assert [r.timestamp for r in out] == [NOW if len(r) < 3 or r[2] is None else r[2] for r in recs]
    assert CRC32C(fast[21:]) == struct.unpack(">I", fast[17:21])[0]


@pytest.mark.parametrize("bad,msg", [
    ((b"k", b"v", 1 << 70), "record 3: timestamp must be an int"),
    ((b"k", b"v", -1), "record 3: timestamp -1 is negative"),
    ((b"k", b"v", True), None),                       # a bool is an int (the general path)
    ((b"k", bytearray(b"v"), NOW + 1), None),
    ((b"k", b"v", NOW, [("h", b"x")]), None),
    ((b"k", "str"), "record 3: value must be bytes-like or None, not str"),
    ((1, b"v"), "record 3: key must be bytes-like or None, not int"),
])
def test_record_checks_in_the_middle_of_a_batch(bad, msg):
    recs = [(b"a", b"1", NOW), (b"b", b"2", NOW), (None, b"3")] + [bad] + [(b"z", b"9", NOW)]
    if msg is None:
        b = build(recs)
        assert b.count == 5 and len(_core.decode_batches(b.getvalue())) == 5
    else:
        with pytest.raises(InvalidRecordError, match=msg):
            build(recs)


def test_window_and_key_checks_name_the_record_in_a_batch():
    recs = [(b"k", b"v", 150)] * 4 + [(b"k", b"v", 201)]
    with pytest.raises(InvalidRecordError, match=r"record 4: timestamp 201 is outside the allowed range \[100, 200\]"):
        build(recs, ts=(100, 200))
    assert build(recs[:4] + [(b"k", b"v", None)], ts=(100, 200)).max_timestamp == NOW   # None is now, unchecked
    with pytest.raises(InvalidRecordError, match="record 2: compacted topics"):
        build([(b"k", b"v")] * 2 + [(None, b"v")], require_key=True)
    lat = build([(b"k", b"v", 1 << 70), (b"k", b"v", "ignored")], lat=True)   # LogAppendTime: not read
    assert lat.max_timestamp == NOW and lat.count == 2


def test_growing_buffer_keeps_earlier_records():
    recs = [(b"k%d" % i, b"x" * 5000, NOW + i) for i in range(300)]    # 1.5 MB: many reallocs
    out = _core.decode_batches(build(recs).getvalue())
    assert [(r.key, r.value, r.timestamp) for r in out] == recs


def test_buffer_view_survives_a_build_that_grows_the_buffer():
    """memoryview(builder) is the encoded batch without a copy (what a segment pwrites); a
    view kept alive (e.g. by a traceback) across a build that must grow the buffer still reads
    the bytes it was taken over, and the build succeeds."""
    b = _core.BatchBuilder()
    b.build([(b"k", b"v", NOW)], 2, 0, NOW, False, ANY_TS[0], ANY_TS[1], False, 0)
    first = b.getvalue()
    view = memoryview(b)
    assert view.readonly and bytes(view) == first
    b.build([(b"k", b"x" * 300_000, NOW)], 2, 1, NOW, False, ANY_TS[0], ANY_TS[1], False, 0)
    assert bytes(view) == first
    assert _core.decode_batches(b.getvalue())[0].value == b"x" * 300_000
    view.release()
    b.build([(b"k", b"y" * 900_000, NOW)], 2, 2, NOW, False, ANY_TS[0], ANY_TS[1], False, 0)
    assert bytes(memoryview(b)) == b.getvalue()
