"""kstore.compression: Kafka's framings byte for byte, round trips through logs for every codec
and magic, and interop with an independent implementation (kafka-python's codecs and record
builders, test-only)."""
import struct
import zlib

import pytest

import kstore
from kstore import compression as comp

xxhash = pytest.importorskip("xxhash")
pytest.importorskip("cramjam")

PAYLOAD = b"".join(b"record %d of a fairly compressible payload; " % i for i in range(5000))
CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
@pytest.mark.parametrize("size", [0, 1, 65536, len(PAYLOAD)])
def test_round_trip(codec, size):
    data = PAYLOAD[:size]
    for magic in ((0, 1, 2) if codec != 4 else (2,)):
        z = comp.compress(codec, data, None, magic)
        assert comp.decompress(codec, z, magic) == data
        if size > 1000:
            assert len(z) < len(data) // 3


def test_snappy_is_xerial_framed_in_32k_blocks():
    z = comp.compress(comp.SNAPPY, PAYLOAD)
    assert z[:16] == b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    pos, blocks = 16, 0
    while pos < len(z):
        (n,) = struct.unpack_from(">i", z, pos)
        pos += 4 + n
        blocks += 1
    assert pos == len(z) and blocks == -(-len(PAYLOAD) // 32768)


@pytest.mark.parametrize("magic", [0, 1, 2])
def test_lz4_frame_header_and_v0_checksum_quirk(magic):
    z = comp.compress(comp.LZ4, PAYLOAD, None, magic)
    assert struct.unpack_from("<I", z)[0] == 0x184D2204
    assert (z[4], z[5]) == (0x60, 0x40)               # independent blocks, 64 KiB
    right = (xxhash.xxh32_intdigest(z[4:6]) >> 8) & 0xFF
    broken = (xxhash.xxh32_intdigest(z[0:6]) >> 8) & 0xFF
    assert z[6] == (broken if magic == 0 else right)
    assert z[-4:] == b"\x00\x00\x00\x00"
    if magic == 0:                                     # the quirk is accepted only for v0
        with pytest.raises(ValueError, match="header checksum"):
            comp.decompress(comp.LZ4, z, 2)


def test_lz4_level_changes_output_not_content():
    fast = comp.compress(comp.LZ4, PAYLOAD, 1)
    high = comp.compress(comp.LZ4, PAYLOAD, 17)
    assert comp.decompress(comp.LZ4, fast) == comp.decompress(comp.LZ4, high) == PAYLOAD
    assert len(high) <= len(fast)


def test_corrupt_frames_raise_cleanly():
    for codec in (2, 3, 4):
        z = bytearray(comp.compress(codec, PAYLOAD))
        for cut in (7, len(z) // 2, len(z) - 1):
            with pytest.raises(Exception) as e:
                comp.decompress(codec, bytes(z[:cut]))
            assert not isinstance(e.value, (SystemError, MemoryError))


@pytest.mark.parametrize("name", ["gzip", "snappy", "lz4", "zstd"])
def test_topic_compression_type_and_level(open_log, name):
    lg = open_log({"compression.type": name, "compression.zstd.level": 10,
                   "compression.lz4.level": 12, "compression.gzip.level": 9})
    lg.append([(b"k%d" % i, PAYLOAD[:300]) for i in range(200)])
    raw = bytes(lg.read_batches(0))
    assert struct.unpack_from(">h", raw, 21)[0] & 7 == CODECS[name]
    assert len(raw) < 200 * 300 // 5
    assert [r.value for r in lg.read(0, 1000)] == [PAYLOAD[:300]] * 200


@pytest.mark.parametrize("version,codec", [("0.9.0", "snappy"), ("0.9.0", "lz4"),
                                           ("0.10.2", "lz4"), ("0.10.2", "snappy")])
def test_legacy_formats_with_every_legacy_codec(open_log, version, codec):
    lg = open_log({"message.format.version": version, "compression.type": codec})
    lg.append([(b"a", b"1" * 100, 5), (None, b"2" * 100, 6)])
    lg.append([(b"c", b"3", 7)])
    assert [(r.offset, r.key, r.value) for r in lg.read(0)] == \
        [(0, b"a", b"1" * 100), (1, None, b"2" * 100), (2, b"c", b"3")]


# -- interop with kafka-python -------------------------------------------------------------------
kcodec = pytest.importorskip("kafka.codec")


def test_codecs_interoperate_with_kafka_python():
    assert comp.decompress(2, kcodec.snappy_encode(PAYLOAD)) == PAYLOAD
    assert kcodec.snappy_decode(comp.compress(2, PAYLOAD)) == PAYLOAD
    assert comp.decompress(3, kcodec.lz4_encode(PAYLOAD)) == PAYLOAD       # lz4.frame output
    assert kcodec.lz4_decode(comp.compress(3, PAYLOAD)) == PAYLOAD
    assert comp.decompress(3, kcodec.lz4_encode_old_kafka(PAYLOAD), 0) == PAYLOAD
    assert kcodec.lz4_decode_old_kafka(comp.compress(3, PAYLOAD, None, 0)) == PAYLOAD
    assert comp.decompress(4, kcodec.zstd_encode(PAYLOAD)) == PAYLOAD
    assert kcodec.zstd_decode(comp.compress(4, PAYLOAD)) == PAYLOAD
    assert comp.decompress(1, kcodec.gzip_encode(PAYLOAD)) == PAYLOAD
    assert kcodec.gzip_decode(comp.compress(1, PAYLOAD)) == PAYLOAD


def _kafka_python_segment(magic, codec, batches=5, per=20):
    """Batches built by kafka-python's record builders, laid out as a .log with real offsets;
    returns (bytes, expected [(offset, key, value, headers)])."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    from kafka.record.legacy_records import LegacyRecordBatchBuilder
    out, expected, offset = b"", [], 0
    for b in range(batches):
        if magic == 2:
            bld = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
        else:
            bld = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
        for i in range(per):
            key = None if i % 4 == 0 else b"key-%d-%d" % (b, i)
            value = b"value %d %d " % (b, i) * (1 + i % 5)
            headers = [("h", b"%d" % i)] if magic == 2 and i % 3 == 0 else []
            ts = 1_700_000_000_000 + offset if magic else None
            if magic == 2:
                bld.append(i, ts, key, value, headers)
            else:
                bld.append(i, ts, key, value)
            expected.append((offset, key, value, tuple(headers)))
            offset += 1
        raw = bytearray(bld.build())
        if magic == 2 or codec == 0:
            # assign offsets as a broker does: v2 base offset; legacy per-message (absolute)
            pos, o = 0, offset - per
            while pos < len(raw):
                size = struct.unpack_from(">i", raw, pos + 8)[0]
                struct.pack_into(">q", raw, pos, o if magic == 2 else o)
                o += 1
                pos += 12 + size
        else:
            # as a broker stores a legacy compressed wrapper: its last inner offset (v1 inner
            # offsets stay relative) and, for v1, the max inner timestamp (CRC-32 redone)
            struct.pack_into(">q", raw, 0, offset - 1)
            if magic == 1:
                struct.pack_into(">q", raw, 18, 1_700_000_000_000 + offset - 1)
                struct.pack_into(">I", raw, 12, zlib.crc32(bytes(raw[16:])))
        out += bytes(raw)
    return out, expected


@pytest.mark.parametrize("magic,codec", [(2, c) for c in (0, 1, 2, 3, 4)] +
                         [(m, c) for m in (0, 1) for c in (0, 1, 2, 3)])
def test_kstore_reads_kafka_python_batches(tmp_path, magic, codec):
    if magic == 0 and codec:
        pytest.skip("kafka-python's v0 compressed wrappers use relative inner offsets "
                    "(v1 style); brokers rewrite them, so that is not a broker's on-disk form")
    data, expected = _kafka_python_segment(magic, codec)
    d = tmp_path / "t-0"
    d.mkdir()
    (d / "00000000000000000000.log").write_bytes(data)
    with kstore.Log.open(str(d)) as lg:          # no marker: full recovery validates every batch
        assert lg.log_end_offset == len(expected)
        got = [(r.offset, r.key, r.value, r.headers) for c in lg.iter_chunks() for r in c]
        assert got == expected
        assert lg.offset_for_timestamp(1_700_000_000_050) == (50 if magic else None)


@pytest.mark.parametrize("codec", ["uncompressed", "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_reads_kstore_segments(open_log, codec):
    from kafka.record.memory_records import MemoryRecords
    lg = open_log({"compression.type": codec})
    sent = []
    for b in range(4):
        recs = [(b"k%d" % i if i % 3 else None, b"v%d-%d" % (b, i), 1000 + i,
                 [("h", b"x")] if i % 2 else None) for i in range(25)]
        lg.append(recs)
        sent += recs
    lg.flush()
    raw = bytes(lg.read_batches(0, 1 << 30))
    mr = MemoryRecords(raw)
    got = []
    while mr.has_next():
        batch = mr.next_batch()
        assert batch.validate_crc()
        for r in batch:
            got.append((r.offset, r.key, r.value, r.timestamp, list(r.headers)))
    assert got == [(i, k, v, ts, list(h or [])) for i, (k, v, ts, h) in enumerate(sent)]
