"""The columnar decode (decode_columns, Log.read_columns, iter_batches) verifies a batch's CRC once
per mapping, sharing _decode's record tables: a whole-batch decode builds the table as it
validates the records and marks it verified; later reads of the batch in that mapping (columnar
or record) skip the CRC. A new mapping (the file replaced by a truncation, deleted and created
again) verifies again; batches too small for a table are verified on every read."""
import os
import struct

import pytest

import kstore
from kstore import _core

pytest.importorskip("pyarrow")
from kstore.arrow import columns_to_batch, iter_batches, kafka_schema
from kstore.config import NO_LIMIT
from kstore.errors import CorruptRecordError, OffsetOutOfRangeError

from batch_helpers import NOW, build
from mapping_helpers import file_mapping

BIG = 1 << 62


def _raw(counts, base=0, tag=b"v"):
    """Batches of the given record counts from offset base; record o has key k<o>, a value
    tagged by o and a timestamp that goes up and down (for the time lookups)."""
    raw = b""
    off = base
    for n in counts:
        recs = [(b"k%07d" % (off + i), tag * 100 + b"%07d" % (off + i),
                 NOW + (off + i) * 10 + (25 if i % 7 == 3 else 0)) for i in range(n)]
        raw += build(recs, base=off).getvalue()
        off += n
    return raw


def _cols(m, start=0, stop=BIG, verify_crc=True, max_records=NO_LIMIT):
    cols = _core.Columns()
    status = _core.decode_columns(m, 0, m.length, start, stop, cols, max_records=max_records,
                                  verify_crc=verify_crc)
    b = columns_to_batch(cols, "t", 0, kafka_schema(), copy=True)
    return status, b.column("offset").to_pylist(), b.column("value").to_pylist()


def _positions(raw):
    return [h[0] for h in _core.batch_headers(_core.Mapping.from_bytes(raw), 0, len(raw))]


def test_a_batch_crc_is_verified_once_per_mapping_by_the_columnar_decode(tmp_path):
    """Two 1000-record batches (tables) and a 3-record one (no table). After one full read, a
    byte changed in batch 0 reads as it now is (not hashed again); a change in the small batch
    raises at its position on the next read; a new mapping of the file raises at batch 0."""
    raw = _raw([1000, 1000, 3])
    pos = _positions(raw)
    m, path = file_mapping(tmp_path, raw, writable=True)
    before = _core.batch_memory()[0]
    status, offs, vals = _cols(m)
    assert status == (m.length, 2003, "end") and offs == list(range(2003))
    assert m.remembered_batches == 2 and _core.batch_memory()[0] > before
    at = raw.index(b"v" * 100 + b"%07d" % 10)
    m.write(at, b"w")
    assert _cols(m)[2][10] == b"w" + b"v" * 99 + b"0000010"
    out: list = []
    _core.read_at(m, None, 0, 0, m.length, 10, 1, NO_LIMIT, True, out)
    assert out[0].value == b"w" + b"v" * 99 + b"0000010"    # the record path shares the mark
    small = raw.index(b"v" * 100 + b"%07d" % 2001)
    m.write(small, b"w")
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as e:
        _cols(m)
    assert e.value.position == pos[2]
    m.close()
    assert _core.batch_memory()[0] == before
    fresh, _ = file_mapping(tmp_path, open(path, "rb").read(), name="copy.log", writable=True)
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as e:
        _cols(fresh)
    assert e.value.position == 0
    fresh.close()


def test_partial_unverified_and_limited_reads_do_not_mark_a_batch(tmp_path):
    """A read starting inside a batch, one cut by max_records and one with verify_crc=False
    leave no verified mark: a corrupt batch 0 still raises on the next verifying read."""
    raw = bytearray(_raw([1000, 1000]))
    raw[17] ^= 0xFF                                   # batch 0's stored CRC
    m, _ = file_mapping(tmp_path, bytes(raw), writable=True)
    for start in (1, 500, 999):
        with pytest.raises(CorruptRecordError, match="CRC mismatch") as e:
            _cols(m, start)
        assert e.value.position == 0
    assert _cols(m, verify_crc=False)[1] == list(range(2000))
    assert m.remembered_batches == 2                  # built, marked not verified
    with pytest.raises(CorruptRecordError, match="CRC mismatch") as e:
        _cols(m)
    assert e.value.position == 0
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        _core.read_at(m, None, 0, 0, m.length, 5, 1, NO_LIMIT, True, [])
    m.close()
    good = _raw([1000, 1000])
    m, _ = file_mapping(tmp_path, good, name="good.log", writable=True)
    status, offs, _v = _cols(m, max_records=700)      # stops inside batch 0: no table
    assert status[2] == "limit" and offs == list(range(700)) and m.remembered_batches == 0
    m.close()


def test_tables_built_by_the_columnar_decode_answer_reads_and_time_lookups(tmp_path):
    """The record tables the columnar decode builds are the ones _decode builds: point reads at
    every 37th offset and time lookups give the answers of a decode without tables."""
    raw = _raw([1000, 1000, 500])
    want = _core.decode_batches(raw)
    m, _ = file_mapping(tmp_path, raw)
    _cols(m)
    assert m.remembered_batches == 3
    for o in range(0, 2500, 37):
        got = []
        _core.read_at(m, None, 0, 0, m.length, o, 3, NO_LIMIT, True, got)
        assert [(r.offset, r.timestamp, r.key, r.value) for r in got] == \
            [(r.offset, r.timestamp, r.key, r.value) for r in want[o:o + 3]], o
    for ts in range(NOW - 5, NOW + 25_040, 997):
        exp = next(((r.offset, r.timestamp) for r in want if r.timestamp >= ts), None)
        assert _core.find_offset_by_timestamp(m, 0, m.length, ts, 0) == exp, ts
    m.close()


def _store_with(tmp_path, tag, counts=(1000, 1000, 1000)):
    store = str(tmp_path / "store")
    mgr = kstore.LogManager(store, {"log.segment.bytes": 300_000})   # two batches a segment
    mgr.create_topic("t", 1)
    lg = mgr.log("t", 0)
    _append(lg, 0, counts, tag)
    return store, mgr, lg


def _append(lg, off, counts, tag):
    for n in counts:
        lg.append([(b"k%07d" % (off + i), tag * 100 + b"%07d" % (off + i)) for i in range(n)])
        off += n


def _read_all(reader):
    """(offsets, values) of every record, through iter_batches: of the writer's Log, or of a
    StoreReader's log (refreshed first)."""
    lg = reader.log("t", 0, refresh=True) if isinstance(reader, kstore.StoreReader) else reader
    offs, vals = [], []
    for b in iter_batches(lg, "t", 0, 0, NO_LIMIT):
        offs += b.column("offset").to_pylist()
        vals += b.column("value").to_pylist()
    return offs, vals


def _corrupt_crc_at(lg, offset):
    """Flip the stored CRC of the batch holding offset in its segment's file: (position, file)."""
    seg = [s for s in lg.segments if s.base_offset <= offset][-1]
    heads = _core.batch_headers(seg.mapping(), 0, seg.size)
    pos = next(h[0] for h in heads if h[1] <= offset <= h[2])
    fd = os.open(seg.log_path, os.O_RDWR)
    try:
        crc = os.pread(fd, 4, pos + 17)
        os.pwrite(fd, struct.pack(">I", struct.unpack(">I", crc)[0] ^ 0xFFFF), pos + 17)
    finally:
        os.close(fd)
    return pos, seg.log_path


@pytest.mark.parametrize("who", ["writer", "store_reader"])
@pytest.mark.parametrize("how", ["truncate", "delete"])
def test_a_replaced_or_recreated_segment_is_verified_again(tmp_path, how, who):
    """A reader (the writer's Log itself, or a StoreReader) verifies and remembers every batch
    (segments [0, 1000], [2000]); the writer then cuts the log to 1000 (segment 0's file
    replaced by a shorter copy) or deletes every segment and starts again at 0, and appends
    batches of the same sizes at the same positions, the one at 1000 (where the old file had a
    verified batch) with a wrong CRC. The next read raises at that batch, naming file and
    position, and never returns the old rows or the corrupt batch's; with the bad batch cut
    off again it returns the new rows."""
    store, mgr, lg = _store_with(tmp_path, b"a")
    with kstore.StoreReader(store) as r:
        reader = lg if who == "writer" else r
        offs, vals = _read_all(reader)
        assert offs == list(range(3000)) and vals[1500] == b"a" * 100 + b"0001500"
        assert _read_all(reader)[0] == offs                     # remembered, verified
        assert [s.base_offset for s in lg.segments] == [0, 2000]
        assert lg.segments[0].mapping().remembered_batches == (2 if who == "writer" else 0)
        if how == "truncate":
            lg.truncate_to(1000)
            kept = b"a"
        else:
            lg.truncate_fully_and_start_at(0)
            _append(lg, 0, [1000], b"b")
            kept = b"b"
        _append(lg, 1000, [1000, 1000], b"b")
        lg.flush()
        pos, path = _corrupt_crc_at(lg, 1000)
        with pytest.raises(CorruptRecordError) as e:
            _read_all(reader)
        assert e.value.position == pos and os.path.basename(path) in str(e.value)
        assert "CRC mismatch" in str(e.value)
        lg.truncate_to(1000)
        _append(lg, 1000, [1000, 1000], b"c")
        offs, vals = _read_all(reader)
        assert offs == list(range(3000))
        assert vals[999] == kept * 100 + b"0000999" and vals[1999] == b"c" * 100 + b"0001999"
    mgr.close()


def test_threads_reading_columns_beside_appends_rolls_and_truncations(tmp_path, watchdog):
    """Three threads read the whole log through the writer's Log (one mapping a segment, so
    they build, share and use the same record tables) and two through a StoreReader, while the
    writer appends 1000-record batches, rolls, and cuts the last 2000 offsets off and writes
    them again (same bytes, new files) four times. Every read returns offsets 0..n-1 with
    each record's own value, or OffsetOutOfRangeError when a cut took the offset it was at
    (then it reads again); the writer's last read sees everything."""
    import threading
    from thread_watchdog import join_all
    watchdog(120)
    store, mgr, lg = _store_with(tmp_path, b"a", counts=(1000,))
    stop = threading.Event()
    errors: list = []
    reads = [0] * 5

    def reader(i, src):
        try:
            while not stop.is_set():
                try:
                    offs, vals = _read_all(src)
                except OffsetOutOfRangeError:
                    continue
                assert offs == list(range(len(offs))), (offs[:3], len(offs))
                for o in range(0, len(offs), 97):
                    assert vals[o] == b"a" * 100 + b"%07d" % o, o
                reads[i] += 1
        except BaseException as e:       # noqa: BLE001 - reported below
            errors.append(e)
            stop.set()

    with kstore.StoreReader(store) as r:
        threads = [threading.Thread(target=reader, args=(i, lg if i < 3 else r)) for i in range(5)]
        for t in threads:
            t.start()
        try:
            for _cut in range(4):
                _append(lg, lg.log_end_offset, [1000, 1000, 1000], b"a")
                end = lg.log_end_offset
                lg.truncate_to(end - 2000)       # a batch boundary
                _append(lg, lg.log_end_offset, [end - lg.log_end_offset], b"a")
                assert lg.log_end_offset == end
        finally:
            stop.set()
            join_all(threads, 60)
    assert not errors, errors[0]
    assert min(reads) >= 1
    offs, vals = _read_all(lg)
    assert offs == list(range(13_000)) and vals[12_345] == b"a" * 100 + b"0012345"
    mgr.close()


@pytest.mark.parametrize("field", ["length", "magic", "crc", "base_offset", "last_delta"])
def test_a_corrupt_header_in_a_rolled_segment_raises_naming_file_and_position(tmp_path, field):
    """Batch 1000 of the rolled segment [0, 1000] with a header field rewritten (its length past
    the segment, an unknown magic, a wrong stored CRC, a base offset below the previous batch's
    last, a last offset delta the CRC no longer matches): a StoreReader's columnar read (the
    Spark path) yields only the exact rows before it, if any, then raises CorruptRecordError
    naming the segment file and the batch's position; never other rows."""
    store, mgr, lg = _store_with(tmp_path, b"a")
    seg = lg.segments[0]
    assert [s.base_offset for s in lg.segments] == [0, 2000]
    pos = _core.batch_headers(seg.mapping(), 0, seg.size)[1][0]
    mgr.close()
    at, data = {"length": (8, struct.pack(">i", 1 << 30)), "magic": (16, b"\x07"),
                "crc": (17, b"\x00\x00\x00\x00"), "base_offset": (0, struct.pack(">q", 500)),
                "last_delta": (23, struct.pack(">i", 998))}[field]
    fd = os.open(seg.log_path, os.O_RDWR)
    try:
        os.pwrite(fd, data, pos + at)
    finally:
        os.close(fd)
    offs: list = []
    vals: list = []
    with kstore.StoreReader(store) as r:
        lg_ro = r.log("t", 0)
        with pytest.raises(CorruptRecordError) as e:
            for b in iter_batches(lg_ro, "t", 0, 0, NO_LIMIT):
                offs += b.column("offset").to_pylist()
                vals += b.column("value").to_pylist()
    assert e.value.position == pos and os.path.basename(seg.log_path) in str(e.value)
    assert offs == list(range(len(offs))) and len(offs) in (0, 1000)
    assert vals == [b"a" * 100 + b"%07d" % o for o in offs]


def test_a_corrupt_big_batch_followed_by_valid_ones_in_the_last_segment_raises(tmp_path):
    """Batch 1000 of three ~127 KB batches in the active segment has a wrong CRC and a valid
    batch follows it (longer than the 64 KiB first look): corruption, not a batch still being
    written. A StoreReader's columnar read returns the exact rows before it, then raises
    CorruptRecordError naming file and position (it used to end the log there silently)."""
    store = str(tmp_path / "store")
    mgr = kstore.LogManager(store, {"log.segment.bytes": 64 << 20})
    mgr.create_topic("t", 1)
    lg = mgr.log("t", 0)
    _append(lg, 0, [1000, 1000, 1000], b"a")
    lg.flush()
    pos, path = _corrupt_crc_at(lg, 1000)
    offs: list = []
    with kstore.StoreReader(store) as r:
        with pytest.raises(CorruptRecordError, match="CRC mismatch") as e:
            for b in iter_batches(r.log("t", 0), "t", 0, 0, NO_LIMIT):
                offs += b.column("offset").to_pylist()
                assert b.column("value").to_pylist()[-1] == b"a" * 100 + b"%07d" % offs[-1]
    assert e.value.position == pos and os.path.basename(path) in str(e.value)
    assert offs == list(range(len(offs))) and len(offs) in (0, 1000)
    mgr.close()


def test_batches_a_refresh_checked_are_not_hashed_again(tmp_path):
    """A read-only refresh checks new batches' CRCs in a pread copy and marks their range in the
    mapping (Mapping.note_crc_verified): the columnar decode trusts that range, large batch or
    small, and hashes what lies outside it."""
    raw = _raw([1000, 3, 1000])
    pos = _positions(raw)
    m, path = file_mapping(tmp_path, raw, writable=True)
    m.note_crc_verified(pos[0], pos[2])          # batches 0 and 1, not 2
    for o in (10, 1001, 1500):
        m.write(raw.index(b"v" * 100 + b"%07d" % o), b"w")
    status, offs, vals = _cols(m, stop=1003)
    assert status == (pos[2], 1003, "stop") and offs == list(range(1003))
    assert (vals[10], vals[1001]) == (b"w" + b"v" * 99 + b"0000010", b"w" + b"v" * 99 + b"0001001")
    assert vals[11] == b"v" * 100 + b"0000011"
    with pytest.raises(CorruptRecordError, match=f"CRC mismatch.*position {pos[2]}"):
        _cols(m)
