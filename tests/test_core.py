"""The compiled core: CRCs, batch encoding (byte layout field by field), decoding, hostile input."""
import gzip
import os
import random
import struct
import zlib

import crcmod.predefined
import pytest
from hypothesis import given, settings, strategies as st

import kstore
from kstore import _core
from kstore.errors import CorruptRecordError, InvalidRecordError, UnsupportedCodecError

CRC32C = crcmod.predefined.mkPredefinedCrcFun("crc-32c")
NOW = 1_700_000_000_000
ANY_TS = (-(1 << 62), 1 << 62)


def build(records, magic=2, base=0, now=NOW, lat=False, codec=0, require_key=False, ts=ANY_TS):
    b = _core.BatchBuilder()
    b.build(records, magic, base, now, lat, ts[0], ts[1], require_key, codec)
    return b


# -- CRC -------------------------------------------------------------------------------------
def test_crc32c_kafka_vector():
    assert kstore.crc32c(b"123456789") == 0xE3069283
    assert _core.crc32c_table(b"123456789") == 0xE3069283


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 1023, 3071, 3072, 3073, 4096, 9216, 65536, 100_003])
def test_crc32c_matches_crcmod_both_paths(n):
    data = random.Random(n).randbytes(n)
    want = CRC32C(data)
    assert kstore.crc32c(data) == want
    assert _core.crc32c_table(data) == want
    if _core.crc32c_implementation() == "sse4.2":
        assert _core.crc32c_hw(data) == want
    # chaining works like zlib.crc32
    assert kstore.crc32c(data[n // 3:], kstore.crc32c(data[: n // 3])) == want


def test_crc32c_unaligned_views():
    data = os.urandom(20000)
    for off in range(9):
        view = memoryview(data)[off:]
        assert kstore.crc32c(view) == CRC32C(bytes(view))


def test_forced_table_path_gives_same_results():
    data = os.urandom(50000)
    want = CRC32C(data)
    try:
        _core._force_table_crc(True)
        assert _core.crc32c_implementation() == "table"
        assert kstore.crc32c(data) == want
        b = build([(b"k", b"v")])
        assert _core.decode_batches(b.getvalue())[0].value == b"v"
    finally:
        _core._force_table_crc(False)


@given(st.binary(max_size=5000))
@settings(max_examples=200, deadline=None)
def test_crc32_and_crc32c_random(data):
    assert kstore.crc32(data) == zlib.crc32(data)
    assert kstore.crc32c(data) == CRC32C(data)


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


# -- hostile input ---------------------------------------------------------------------------
def test_crc_flip_detected_with_position():
    raw = build([(b"k", b"v" * 10)]).getvalue() * 2
    bad = bytearray(raw)
    bad[len(raw) // 2 + 70] ^= 1
    with pytest.raises(CorruptRecordError) as ei:
        _core.decode_batches(bytes(bad))
    assert ei.value.position == len(raw) // 2
    assert "CRC mismatch" in str(ei.value)


def _valid_batch_strategy():
    rec = st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.one_of(st.none(), st.binary(max_size=40)),
                    st.integers(0, 1 << 45))
    return st.tuples(st.lists(rec, min_size=1, max_size=8), st.sampled_from([0, 1, 2]), st.sampled_from([0, 1]))


@given(_valid_batch_strategy(), st.data())
@settings(max_examples=300, deadline=None)
def test_mutated_batches_only_raise_kstore_errors(spec, data):
    recs, magic, codec = spec
    raw = bytearray(build(recs, magic=magic, codec=codec).getvalue())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "set"]))
        if kind == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "truncate" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)):]
        elif kind == "extend":
            raw += data.draw(st.binary(max_size=30))
        elif kind == "set" and len(raw) > 4:
            i = data.draw(st.integers(0, len(raw) - 4))
            raw[i:i + 4] = data.draw(st.binary(min_size=4, max_size=4))
    for verify in (True, False):
        try:
            _core.decode_batches(bytes(raw), verify_crc=verify)
        except kstore.KStoreError:
            pass


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_random_bytes_recover_scan_never_crashes(data):
    import tempfile
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        m = _core.Mapping(f.fileno(), len(data), False)
        res = _core.recover_scan(m, len(data), 0, 4096, 100, 100)
        assert 0 <= res["valid_bytes"] <= len(data)
        if len(data):
            assert _core.batch_headers(m, 0, res["valid_bytes"]) is not None
        m.close()


def test_record_pickles_and_compares():
    import pickle
    r = _core.decode_batches(build([(b"k", b"v", NOW, [("a", b"b")])], base=5).getvalue())[0]
    r2 = pickle.loads(pickle.dumps(r))
    assert r2 == r and r2.offset == 5 and r2.headers == (("a", b"b"),)


# -- split_lines: the console producer's line splitter --------------------------------------
def _rows_of(part):
    """(key, value) pairs of one partition's split_lines output."""
    count, key, value = part
    vo, vd = value[0].tolist(), bytes(value[1])
    if key is None:
        return [(None, vd[vo[i]:vo[i + 1]]) for i in range(count)]
    ko, kd = key[0].tolist(), bytes(key[1])
    return [(kd[ko[i]:ko[i + 1]], vd[vo[i]:vo[i + 1]]) for i in range(count)]


def test_split_lines_keys_partitions_and_partial_lines():
    from kstore.partitioner import partition_for_key
    data = b"a\tx\r\nbb\tyy\n\tz\nc\t\nlast\tpartial"
    consumed, lines, parts, bad = _core.split_lines(data, b"\t", 3, -1, 0, False)
    assert (consumed, lines, bad) == (len(data) - len(b"last\tpartial"), 4, -1)
    want = {}
    for k, v in [(b"a", b"x"), (b"bb", b"yy"), (b"", b"z"), (b"c", b"")]:
        want.setdefault(partition_for_key(k, 3), []).append((k, v))
    assert {p: _rows_of(x) for p, x in enumerate(parts) if x} == want
    consumed, lines, parts, bad = _core.split_lines(data, b"\t", 3, -1, 0, True)
    assert (consumed, lines) == (len(data), 5)
    assert (b"last", b"partial") in _rows_of(parts[partition_for_key(b"last", 3)])
    # a fixed partition; unkeyed lines go to the sticky one, blank lines are empty values
    _c, _l, parts, _b = _core.split_lines(b"k::v\nk2::v2::w\n", b"::", 4, 2, 0, True)
    assert [p is None for p in parts] == [True, True, False, True]
    assert _rows_of(parts[2]) == [(b"k", b"v"), (b"k2", b"v2::w")]
    _c, lines, parts, _b = _core.split_lines(b"v1\n\nv3\n", None, 2, -1, 1, True)
    assert lines == 3 and parts[0] is None and _rows_of(parts[1]) == [(None, b"v1"), (None, b""), (None, b"v3")]
    assert _core.split_lines(b"no newline yet", None, 1, -1, 0, False)[:2] == (0, 0)


def test_split_lines_stops_before_a_line_without_the_separator():
    data = b"k:v\nk2:v2\noops\nk3:v3\n"
    consumed, lines, parts, bad = _core.split_lines(data, b":", 1, -1, 0, True)
    assert (lines, bad, consumed) == (2, (10, 14), 10)
    assert data[bad[0]:bad[1]] == b"oops"
    assert _rows_of(parts[0]) == [(b"k", b"v"), (b"k2", b"v2")]


def test_split_lines_rejects_bad_arguments():
    with pytest.raises(ValueError):
        _core.split_lines(b"x\n", b"", 1, -1, 0, True)
    with pytest.raises(ValueError):
        _core.split_lines(b"x\n", None, 2, 2, 0, True)
    with pytest.raises(ValueError):
        _core.split_lines(b"x\n", None, 2, -1, 2, True)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([None, b"\t", b":", b"ab"]), st.integers(1, 4),
       st.booleans())
def test_split_lines_matches_a_python_model(data, sep, n, final):
    from kstore.partitioner import partition_for_key
    consumed, lines, parts, bad = _core.split_lines(data, sep, n, -1, n - 1, final)
    body = data if final else data[: data.rfind(b"\n") + 1]
    model = body.split(b"\n")
    if model and model[-1] == b"" and (not final or body.endswith(b"\n") or not body):
        model.pop()
    want, ok = {}, 0
    for line in model:
        line = line[:-1] if line.endswith(b"\r") else line
        if sep is not None:
            if sep not in line:
                break
            k, v = line.split(sep, 1)
            want.setdefault(partition_for_key(k, n), []).append((k, v))
        else:
            want.setdefault(n - 1, []).append((None, line))
        ok += 1
    assert lines == ok
    assert (bad == -1) == (ok == len(model))
    assert {p: _rows_of(x) for p, x in enumerate(parts) if x} == want
