"""kstore._decode and kstore._scan on hostile input: corruption is found and reported as
kstore's errors (never a crash); Records pickle."""
import pytest
from hypothesis import given, settings, strategies as st

import kstore
from kstore import _core
from kstore.errors import CorruptRecordError

from batch_helpers import NOW, build, craft_v2, recrc
from mapping_helpers import file_mapping


# -- hostile input ---------------------------------------------------------------------------
def test_crc_flip_detected_with_position():
    raw = build([(b"k", b"v" * 10)]).getvalue() * 2
    bad = bytearray(raw)
    bad[len(raw) // 2 + 70] ^= 1
    with pytest.raises(CorruptRecordError) as ei:
        _core.decode_batches(bytes(bad))
    assert ei.value.position == len(raw) // 2
    assert "CRC mismatch" in str(ei.value)


@pytest.mark.parametrize("delta", [0, 2])
def test_record_offset_deltas_out_of_order_or_past_the_batch_are_corrupt(delta):
    """A CRC-valid batch whose second record repeats offset delta 0 (or claims 2, past the
    batch's last offset delta 1) would yield an offset twice or outside the batch: corrupt."""
    import struct
    raw = bytearray(build([(b"a", b"x"), (b"b", b"y")]).getvalue())
    second = 61 + 1 + raw[61] // 2            # first record: its length varint, then its body
    assert raw[second + 3] == 2               # length, attributes, timestamp delta 0, offset delta 1
    raw[second + 3] = delta * 2               # zig-zag
    struct.pack_into(">I", raw, 17, _core.crc32c(bytes(raw[21:])))
    with pytest.raises(CorruptRecordError) as ei:
        _core.decode_batches(bytes(raw))
    assert f"record 1 of the batch: offset delta {delta} after 0, last offset delta 1" in str(ei.value)
    assert ei.value.position == 0
    cols = _core.Columns()
    with pytest.raises(CorruptRecordError) as ei:
        _core.decode_columns(_core.Mapping.from_bytes(bytes(raw)), 0, len(raw), 0, 1 << 62, cols)
    assert "offset delta is not above the previous one or past the batch's last" in str(ei.value)


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


def test_recover_scan_result_is_typed_and_still_a_dict():
    import tempfile
    raw = build([(b"k", b"v")], base=7).getvalue() + b"\x00" * 40
    with tempfile.TemporaryFile() as f:
        f.write(raw)
        f.flush()
        m = _core.Mapping(f.fileno(), len(raw), False)
        res = _core.recover_scan(m, len(raw), 7, 4096, 10, 10)
        m.close()
    assert isinstance(res, dict) and res.valid_bytes == res["valid_bytes"] == len(raw) - 40
    assert res.next_offset == 8 and res.batches == 1 and res.tail_zero
    assert res.status is _core.ScanStatus.CORRUPT and res["status"] == "corrupt"
    assert {"corrupt": 1}.get(res.status) == 1 and f"{res.status}" == "corrupt"


@pytest.mark.parametrize("tail", [0, 1, 7, 63, 64, 65, 200, 4096 + 13])
def test_recover_scan_tail_zero_sees_one_nonzero_byte_anywhere(tail):
    """tail_zero (a preallocated runway kept, else garbage cut) is checked 64 bytes a step: a
    single nonzero byte at any position of the tail, across the step boundaries and in the
    bytes after the last whole step, makes it False."""
    batch = build([(b"k", b"v")], base=7).getvalue()
    zero = _core.recover_scan(_core.Mapping.from_bytes(batch + bytes(tail)), len(batch) + tail,
                              7, 4096, 10, 10)
    assert zero.valid_bytes == len(batch) and zero.tail_zero
    for at in range(tail):
        raw = bytearray(batch + bytes(tail))
        raw[len(batch) + at] = 0x01
        res = _core.recover_scan(_core.Mapping.from_bytes(bytes(raw)), len(raw), 7, 4096, 10, 10)
        assert (res.valid_bytes, res.next_offset, res.tail_zero) == (len(batch), 8, False), at


# -- record tables: CRC verified once per mapping, reads start at their record ---------------------
NO_LIMIT = 1 << 62


@pytest.fixture(params=["tables", "default", "never"])
def remember(request):
    """Reads with a record table for every batch (threshold 0), with the default threshold
    (2 KiB: the small batches here are verified on every read), and with none: the answers
    must not depend on it."""
    n = {"tables": 0, "default": 2048, "never": 1 << 40}[request.param]
    old = _core.set_remember_min_bytes(n)
    yield request.param
    _core.set_remember_min_bytes(old)


def _fields(recs):
    return [(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, r.headers) for r in recs]


def _read(m, base, offset, max_records=NO_LIMIT, max_bytes=NO_LIMIT, verify_crc=True):
    out = []
    _core.read_at(m, None, 0, base, m.length, offset, max_records, max_bytes, verify_crc, out)
    return out


def _segment(sizes, base=100, value=b"v" * 20):
    """Batches of the given record counts back to back from base, every record tagged by its
    offset, non-monotonic timestamps inside each batch; (raw, records by decode_batches)."""
    raw = b""
    off = base
    for n in sizes:
        recs = [(b"k%d" % (off + i), value + b"%d" % (off + i), NOW + (off + i) * 10 + (7 if i % 3 == 1 else 0) - (5 if i % 5 == 2 else 0),
                 [("h", b"%d" % i)] if i % 4 == 3 else [])
                for i in range(n)]
        raw += build(recs, base=off).getvalue()
        off += n
    return raw, _core.decode_batches(raw)


SIZES = [1, 3, 4, 5, 17, 64, 1, 130]


def test_point_reads_return_exact_records_at_every_offset(tmp_path, remember):
    """Every offset (first, middle, last record of each batch, batch boundaries) with record
    limits 1, 2, 3, 5, all: exactly the records a whole decode gives, cold (first read of
    each batch in the mapping) and warm (its table remembered)."""
    raw, want = _segment(SIZES)
    m, _ = file_mapping(tmp_path, raw)
    for attempt in ("cold", "warm"):
        for o in range(100 - 2, 100 + sum(SIZES)):
            for k in (1, 2, 3, 5) if o % 11 else (1, NO_LIMIT):
                exp = [r for r in want if r.offset >= o][:k]
                assert _fields(_read(m, 100, o, k)) == _fields(exp), (attempt, o, k)
        if remember == "tables":
            assert m.remembered_batches == len(SIZES)
        elif remember == "default":
            assert m.remembered_batches == 2          # the 64- and 130-record batches
        else:
            assert m.remembered_batches == 0
    m.close()


def test_point_reads_within_max_bytes_stop_at_a_batch_boundary(tmp_path, remember):
    raw, want = _segment(SIZES)
    heads = _core.batch_headers(_core.Mapping.from_bytes(raw), 0, len(raw))
    m, _ = file_mapping(tmp_path, raw)
    for o in range(100, 100 + sum(SIZES), 3):
        i = next(j for j, h in enumerate(heads) if h[2] >= o)
        size = heads[i][3]
        for budget, nb in ((1, 1), (size, 1), (size + heads[i + 1][3] if i + 1 < len(heads) else size, 2)):
            last = heads[min(i + nb, len(heads)) - 1][2]
            exp = [r for r in want if o <= r.offset <= last]
            assert _fields(_read(m, 100, o, NO_LIMIT, budget)) == _fields(exp), (o, budget)
    m.close()


def test_compaction_gaps_and_a_last_offset_delta_past_the_last_record(tmp_path, remember):
    """Offset deltas with gaps (a compacted batch): a read of a missing offset starts at the next
    record; past the last record (lastOffsetDelta beyond it) the batch yields nothing and the
    read goes on in the next batch."""
    deltas = [0, 2, 3, 7, 8, 9, 15, 40, 41, 60]
    raw = craft_v2([(d, d % 7, b"k%d" % d, b"x" * 300) for d in deltas], base_offset=10, last_delta=70)
    raw += build([(b"n", b"next")], base=81).getvalue()
    want = _core.decode_batches(raw)
    assert [r.offset for r in want] == [10 + d for d in deltas] + [81]
    m, _ = file_mapping(tmp_path, raw)
    for _ in range(2):
        for o in range(8, 83):
            for k in (1, 2, NO_LIMIT):
                assert _fields(_read(m, 10, o, k)) == _fields([r for r in want if r.offset >= o][:k]), (o, k)
    m.close()


def test_a_batch_crc_is_verified_once_per_mapping(tmp_path, remember):
    """A byte flipped in a batch not yet verified in this mapping: CorruptRecordError at the
    batch's position. Flipped after the batch was verified and remembered: this mapping returns
    the bytes as they now are (the CRC is not computed again: a mapping's bytes below the valid
    size never change under kstore's writers); a new mapping of the file verifies it again."""
    raw, want = _segment([200, 200])
    second = _core.batch_headers(_core.Mapping.from_bytes(raw), 0, len(raw))[1][0]
    m, path = file_mapping(tmp_path, raw, writable=True)
    assert _fields(_read(m, 100, 150, 1)) == _fields([want[50]])          # batch 1 verified
    v = want[60].value
    at = raw.index(v, 0)                                                   # record 60's value
    m.write(at, bytes([v[0] ^ 1]))
    later = raw.index(want[250].value, second)                             # batch 2 not read yet
    m.write(later, bytes([raw[later] ^ 1]))
    if remember == "never":                                               # verified on every read
        with pytest.raises(CorruptRecordError) as e:
            _read(m, 100, 160, 1)
        assert e.value.position == 0
    else:                                                                 # remembered: not re-hashed
        assert _read(m, 100, 160, 1)[0].value == bytes([v[0] ^ 1]) + v[1:]
    with pytest.raises(CorruptRecordError) as e:
        _read(m, 100, 350, 1)
    assert e.value.position == second and "CRC mismatch" in str(e.value)
    m.close()
    fresh, _ = file_mapping(tmp_path, open(path, "rb").read(), name="copy.log")
    with pytest.raises(CorruptRecordError) as e:
        _read(fresh, 100, 160, 1)
    assert e.value.position == 0
    fresh.close()


def test_verify_crc_false_is_honoured_and_a_later_verifying_read_checks(tmp_path, remember):
    """A batch with a wrong CRC reads with verify_crc=False (its table, if any, is marked not
    verified); a later read with verify_crc=True verifies it and raises."""
    raw = bytearray(_segment([200])[0])
    raw[17] ^= 0xFF                                         # the stored CRC
    m, _ = file_mapping(tmp_path, bytes(raw))
    assert [r.offset for r in _read(m, 100, 150, 2, verify_crc=False)] == [150, 151]
    with pytest.raises(CorruptRecordError) as e:
        _read(m, 100, 150, 2)
    assert e.value.position == 0 and "CRC mismatch" in str(e.value)
    m.close()


@given(st.data())
@settings(max_examples=150, deadline=None)
def test_hostile_record_lengths_raise_corrupt_record_error_as_a_decode_does(data):
    """Record length varints (and the bytes around them) of a CRC-valid batch rewritten: a point
    read raises CorruptRecordError or returns what the decoding path (no table) returns, for
    reads before and after the table would be built; never a crash, never other records."""
    raw = bytearray(_segment([60], value=b"w" * 40)[0])
    starts = []
    q = 61
    while q < len(raw):                      # record positions, by their one-byte lengths here
        starts.append(q)
        q += 1 + raw[q] // 2
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.sampled_from(starts))
        raw[i + data.draw(st.integers(0, 3))] = data.draw(st.integers(0, 255))
    recrc(raw)
    offsets = data.draw(st.lists(st.integers(100, 160), min_size=1, max_size=4))
    m = _core.Mapping.from_bytes(bytes(raw))
    oracle = _core.Mapping.from_bytes(bytes(raw))
    old = _core.set_remember_min_bytes(0)
    try:
        for o in offsets:
            k = data.draw(st.sampled_from([1, 3, NO_LIMIT]))
            try:
                got = _fields(_read(m, 100, o, k))
            except CorruptRecordError:
                got = "corrupt"
            _core.set_remember_min_bytes(1 << 40)
            try:
                want = _fields(_read(oracle, 100, o, k))
            except CorruptRecordError:
                want = "corrupt"
            finally:
                _core.set_remember_min_bytes(0)
            assert got == want, (o, k)
    finally:
        _core.set_remember_min_bytes(old)


def _ts_oracle(raw, ts, start):
    for r in _core.decode_batches(raw):
        if r.timestamp >= ts and r.offset >= start:
            return (r.offset, r.timestamp)
    return None


def test_time_lookups_give_kafkas_answers_on_non_monotonic_timestamps(tmp_path, remember):
    """The first record with timestamp >= target and offset >= start, in offset order (Kafka's
    fetchOffsetByTimestamp after its index lookups), over batches whose timestamps go up and
    down, with every start offset."""
    import random
    rnd = random.Random(5)
    raw = b""
    off = 0
    for n in (1, 7, 90, 3, 200):
        recs = [(b"k", b"v" * 30, NOW + rnd.randrange(0, 400)) for _ in range(n)]
        raw += build(recs, base=off).getvalue()
        off += n
    m, _ = file_mapping(tmp_path, raw)
    for start in (0, 1, 5, 8, 50, 97, 98, 150, 300):
        for ts in list(range(NOW - 1, NOW + 402, 7)) + [NOW + 399, NOW + 400]:
            assert _core.find_offset_by_timestamp(m, 0, len(raw), ts, start) == _ts_oracle(raw, ts, start), (start, ts)
    m.close()


def test_time_lookups_on_log_append_time_control_legacy_and_compressed_batches(tmp_path, remember):
    """LogAppendTime: every record has the batch's max timestamp; a control batch's record
    counts, as in Kafka's FileRecords.searchForTimestamp (consumers skip it, the time lookup
    does not); v0/v1 messages and compressed batches are decoded as before."""
    lat = build([(b"a", b"x" * 300, NOW)] * 20, base=0, lat=True, now=NOW + 50).getvalue()
    control = bytearray(craft_v2([(0, 0, b"\x00\x00\x00\x00", b"\x00" * 300)], base_offset=20, base_ts=NOW + 60, attrs=32))
    v1 = b"".join(build([(b"k", b"v", NOW + 70 + i)], magic=1, base=21 + i).getvalue() for i in range(3))
    v0 = build([(b"k", b"v")], magic=0, base=24).getvalue()
    comp = build([(b"c", b"y" * 300, NOW + 80 + i % 3) for i in range(30)], base=25, codec=1).getvalue()
    tail = build([(b"t", b"z" * 300, NOW + 200)] * 10, base=55).getvalue()
    raw = lat + bytes(control) + v1 + v0 + comp + tail
    m, _ = file_mapping(tmp_path, raw)
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW, 0) == (0, NOW + 50)
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW + 50, 7) == (7, NOW + 50)
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW + 51, 0) == (20, NOW + 60)   # the marker
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW + 61, 0) == (21, NOW + 70)
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW + 72, 0) == (23, NOW + 72)
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW + 81, 0) == _ts_oracle(raw, NOW + 81, 0)
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW + 81, 40) == _ts_oracle(raw, NOW + 81, 40)
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW + 83, 0) == (55, NOW + 200)
    assert _core.find_offset_by_timestamp(m, 0, len(raw), NOW + 201, 0) is None
    m.close()


def test_record_tables_free_with_the_mapping_and_stay_under_the_cap(tmp_path):
    raw, want = _segment([200] * 6)
    before = _core.batch_memory()[0]
    m, _ = file_mapping(tmp_path, raw)
    _read(m, 100, 100)
    assert m.remembered_batches == 6 and _core.batch_memory()[0] > before
    one = (_core.batch_memory()[0] - before)
    m.close()
    assert _core.batch_memory()[0] == before
    old = _core.set_batch_memory_limit(before + one // 3)
    try:
        m, _ = file_mapping(tmp_path, raw, name="b.log")
        for o in range(100, 1300, 37):
            assert _fields(_read(m, 100, o, 2)) == _fields(want[o - 100:o - 98])
            assert _core.batch_memory()[0] <= before + one // 3
        assert 0 < m.remembered_batches < 6
        m.close()
        assert _core.batch_memory()[0] == before
    finally:
        _core.set_batch_memory_limit(old)


def _v0(offset: int, value: bytes, attrs: int = 0) -> bytes:
    """A magic-0 message (Kafka's legacy format): no key; CRC-32 over magic to the end."""
    import struct
    import zlib
    body = struct.pack(">bbi", 0, attrs, -1) + struct.pack(">i", len(value)) + value
    return struct.pack(">qi", offset, 4 + len(body)) + struct.pack(">I", zlib.crc32(body)) + body


def test_a_legacy_wrapper_holding_an_offset_past_its_own_is_corrupt(tmp_path):
    """A v0 gzip wrapper at offset 0 holding a message at offset 256 (a fuzz find): Kafka gives a
    wrapper its last message's offset, and lookups find a batch by it, so iteration returned 256
    while read(256) returned the next batch's 257. Now decoding it is a CorruptRecordError naming
    the file and position; the batches after it read as before."""
    import gzip
    d = tmp_path / "t-0"
    d.mkdir()
    wrapper = _v0(0, gzip.compress(_v0(256, b"inner")), attrs=1)
    (d / "00000000000000000000.log").write_bytes(wrapper + craft_v2([(0, 0, None, b"v")], 257))
    with kstore.Log.open(str(d)) as lg:
        assert lg.log_end_offset == 258
        with pytest.raises(CorruptRecordError, match=r"message inside a compressed wrapper has "
                           r"offset 256, after -1, the wrapper's being 0 \(.*00000000000000000000\.log, position 0\)"):
            lg.read(0)
        assert [(r.offset, r.value) for r in lg.read(1)] == [(257, b"v")]
    ok = _v0(256, gzip.compress(_v0(255, b"a") + _v0(256, b"b")), attrs=1)
    assert [(r.offset, r.value) for r in _core.decode_batches(ok, -1, True)] == [(255, b"a"), (256, b"b")]


def test_markers_passed_over_are_still_crc_checked():
    """Control and empty batches yield no records and cost no byte budget, but a corrupt one
    still fails the read (CRCs are verified on read)."""
    from batch_helpers import txn_batch
    data = craft_v2([(0, 0, b"k", b"v")], 3)
    markers = txn_batch(0, 4, control=1) + craft_v2([], 1, last_delta=0) + txn_batch(2, 4, control=0)
    assert [(r.offset, r.value) for r in _core.decode_batches(markers + data, -1, True)] == [(3, b"v")]
    bad = bytearray(markers)
    bad[-1] ^= 1                          # the ABORT marker's last byte (its control value)
    with pytest.raises(CorruptRecordError, match="CRC"):
        _core.decode_batches(bytes(bad) + data, -1, True)


def test_a_legacy_wrapper_reaching_below_the_batch_before_it_yields_only_what_follows(tmp_path):
    """A v0 wrapper at 8 holding messages 4..8 after a v2 batch of 1..5 (a fuzz find): its
    messages below 6 are skipped, as Kafka's consumer skips offsets below its position, so a
    read and iteration give 1..8 once each, in order (they gave 1..5, 4..8). Messages of one
    wrapper whose offsets do not increase are a CorruptRecordError."""
    import gzip
    d = tmp_path / "t-0"
    d.mkdir()
    wrapper = _v0(8, gzip.compress(b"".join(_v0(o, b"w%d" % o) for o in range(4, 9))), attrs=1)
    v2 = craft_v2([(i, 0, None, b"b%d" % (i + 1)) for i in range(5)], 1)
    (d / "00000000000000000001.log").write_bytes(v2 + wrapper)
    with kstore.Log.open(str(d)) as lg:
        want = [(o, b"b%d" % o) for o in range(1, 6)] + [(o, b"w%d" % o) for o in range(6, 9)]
        assert [(r.offset, r.value) for r in lg.read(1)] == want
        assert [(r.offset, r.value) for r in lg] == want
        assert [(r.offset, r.value) for r in lg.read(5, max_records=2)] == want[4:6]
    bad = _v0(8, gzip.compress(_v0(7, b"a") + _v0(6, b"b") + _v0(8, b"c")), attrs=1)
    with pytest.raises(CorruptRecordError, match="has offset 6, after 7"):
        _core.decode_batches(bad, -1, True)


def test_records_carry_their_batchs_leader_epoch(tmp_path):
    """Every record read carries its batch's partitionLeaderEpoch (Kafka's
    ConsumerRecord.leaderEpoch), plain and gzip batches, a whole-batch decode and a read that
    starts inside a batch; -1 for v0/v1 messages and for records built as input; pickled."""
    import gzip
    import pickle
    from broker_dirs import v2_batch, write_partition
    recs = [(i, 0, b"k", b"v%d" % i) for i in range(3)]
    data = (v2_batch(0, recs, leader_epoch=7)
            + v2_batch(3, recs, leader_epoch=9, attrs=1, codec_payload=gzip.compress)
            + v2_batch(6, [(0, 0, b"k", b"w" * 3000)] * 1, leader_epoch=11))
    d = write_partition(str(tmp_path), "t-0", data)
    with kstore.Log.open(d, read_only=True) as lg:
        assert [(r.offset, r.leader_epoch) for r in lg.read(0)] == \
            [(0, 7), (1, 7), (2, 7), (3, 9), (4, 9), (5, 9), (6, 11)]
        assert [(r.offset, r.leader_epoch) for r in lg.read(1, 1)] == [(1, 7)]
        assert [(r.offset, r.leader_epoch) for r in lg.read(4, 1)] == [(4, 9)]
        assert pickle.loads(pickle.dumps(lg.read(6)[0])).leader_epoch == 11
    legacy = str(tmp_path / "legacy")
    with kstore.Log.open(legacy, {"message.format.version": "0.10.2"}) as lg:
        lg.append([(b"k", b"v")])
        assert [r.leader_epoch for r in lg.read(0)] == [-1]
    assert kstore.Record(b"k", b"v").leader_epoch == -1
