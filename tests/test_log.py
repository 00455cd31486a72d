"""Log (Kafka's UnifiedLogTest): round trips, append limits, reads, offsets by timestamp, columnar
appends; reads racing a truncation, made deterministic by patching the core's read."""
import hashlib
import os
import struct

import pytest

import numpy as np

import kstore
from kstore import _core
from kstore.clock import MockTime
from kstore.errors import (InvalidRecordError, KStoreStateError,
                           OffsetOutOfRangeError, RecordTooLargeError)

from log_helpers import NOW, log_with_stale_index_entry, tagged_value, values
from tests.golden_bytes import epoch_back_to_unknown


# -- round trips --------------------------------------------------------------------------------
SHAPES = [
    (b"k", b"v"),
    (b"k", b"v", NOW),
    (b"k", b"v", NOW + 1, [("h1", b"x"), ("h2", None), ("ключ", b"\x00\xff")]),
    (None, b"no key", NOW),
    (b"tombstone", None, NOW),
    (b"", b"", NOW),
    (None, None, NOW),
    (b"big", os.urandom(300_000), NOW),
    kstore.Record(b"rk", b"rv", NOW + 2, [("a", b"b")]),
]


@pytest.mark.parametrize("config", [
    {}, {"compression.type": "gzip"}, {"message.timestamp.type": "LogAppendTime"},
])
def test_round_trip_every_shape(open_log, config):
    log = open_log(config)
    info = log.append(SHAPES)
    assert (info.first_offset, info.last_offset, info.record_count) == (0, len(SHAPES) - 1, len(SHAPES))
    got = log.read(0)
    assert [r.offset for r in got] == list(range(len(SHAPES)))
    for r, s in zip(got, SHAPES):
        if isinstance(s, kstore.Record):
            s = (s.key, s.value, s.timestamp, s.headers)
        assert (r.key, r.value) == (s[0], s[1])
        if config.get("message.timestamp.type") == "LogAppendTime":
            assert r.timestamp == info.log_append_time and r.timestamp_type == 1
        elif len(s) > 2:
            assert r.timestamp == s[2]
        if len(s) > 3:
            assert r.headers == tuple(tuple(h) for h in s[3])


@pytest.mark.parametrize("version,magic", [("0.10.2", 1), ("0.10.0-IV1", 1), ("0.9.0", 0), ("2.8", 2)])
def test_message_format_version_selects_magic(open_log, log_dir, version, magic):
    log = open_log({"message.format.version": version})
    log.append([(b"k", b"v", NOW), (b"k2", b"v2", NOW + 1)])
    log.append([(b"k3", b"v3", NOW + 2)])
    raw = bytes(log.read_batches(0))
    assert raw[16] == magic
    assert values(log) == [b"v", b"v2", b"v3"]
    assert [r.offset for r in log.read(1)] == [1, 2]
    if magic:
        assert log.offset_for_timestamp(NOW + 1) == 1


def test_legacy_gzip_append_and_read(open_log):
    log = open_log({"message.format.version": "0.10.1", "compression.type": "gzip"})
    log.append([(b"a", b"1", NOW), (b"b", b"2", NOW + 5)])
    log.append([(b"c", b"3", NOW + 9)])
    assert [(r.offset, r.value, r.timestamp) for r in log.read(0)] == \
        [(0, b"1", NOW), (1, b"2", NOW + 5), (2, b"3", NOW + 9)]
    assert [r.offset for r in log.read(1)] == [1, 2]


# -- append validation ----------------------------------------------------------------------------------
def test_record_too_large(open_log):
    log = open_log({"max.message.bytes": 500})
    with pytest.raises(RecordTooLargeError, match="max.message.bytes"):
        log.append([(None, b"x" * 600)])
    log2 = open_log({"segment.bytes": 300}, path=os.path.join(os.path.dirname(log.dir), "t-1"))
    with pytest.raises(RecordTooLargeError, match="segment.bytes"):
        log2.append([(None, b"x" * 400)])
    assert log.log_end_offset == 0 and log2.log_end_offset == 0


def test_timestamp_bounds(open_log):
    t = MockTime(NOW)
    log = open_log({"message.timestamp.before.max.ms": 1000, "message.timestamp.after.max.ms": 10}, time=t)
    log.append([(None, b"ok", NOW - 1000)])
    with pytest.raises(InvalidRecordError, match="outside the allowed range"):
        log.append([(None, b"old", NOW - 1001)])
    with pytest.raises(InvalidRecordError):
        log.append([(None, b"future", NOW + 11)])
    assert log.log_end_offset == 1


def test_compacted_topic_requires_keys(open_log):
    log = open_log({"cleanup.policy": "compact"})
    with pytest.raises(InvalidRecordError, match="require a key"):
        log.append([(b"k", b"v"), (None, b"v")])
    assert log.log_end_offset == 0


def test_closed_log_rejects_appends(open_log):
    log = open_log()
    log.close()
    with pytest.raises(KStoreStateError):
        log.append([(None, b"x")])


def test_empty_append(open_log):
    log = open_log()
    info = log.append([])
    assert info.record_count == 0 and log.log_end_offset == 0


# -- reads ----------------------------------------------------------------------------------------------
def test_read_limits_and_ranges(open_log):
    log = open_log({"segment.bytes": 2000})
    for i in range(100):
        log.append([(None, b"%03d" % i, NOW + i)])
    assert len(log.segments) > 3
    got = log.read(5, max_records=30)
    assert [r.offset for r in got] == list(range(5, 35))          # crosses segments
    assert len(log.read(0, max_bytes=1)) == 1                     # at least one batch
    assert log.read(100) == []
    with pytest.raises(OffsetOutOfRangeError):
        log.read(101)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1)
    assert [r.offset for r in log] == list(range(100))


def test_read_under_max_bytes_never_skips_the_rest_of_a_segment(open_log):
    """A batch that does not fit the remaining byte budget ends the read in its segment; a later
    segment's smaller batch is never returned in its place (20,000 produced, 19,306 consumed)."""
    log = open_log({"segment.bytes": 4000})
    big = [(None, b"B" * 300, NOW)]
    for _i in range(6):                   # segment 0: six ~370-byte batches (offsets 0-5)
        log.append(big)
    log.roll()
    for _i in range(6):                   # segment 1: small batches (offsets 6-11)
        log.append([(None, b"s", NOW)])
    size = len(log.read_batches(0, max_bytes=1))
    got = log.read(0, max_bytes=2 * size + size // 2)     # two big ones fit, the third does not
    assert [r.offset for r in got] == [0, 1]
    got = log.read(4, max_bytes=size + 5)                  # one big one fits, with room for a small
    assert [r.offset for r in got] == [4]
    # every resuming consumer loop sees every record once, in order
    assert [r.offset for chunk in log.iter_chunks(max_bytes=2 * size + size // 2)
            for r in chunk] == list(range(12))
    seen, off = [], 0
    while off < log.log_end_offset:
        chunk = log.read(off, max_bytes=size + 100)
        seen += [r.offset for r in chunk]
        off = chunk[-1].offset + 1
    assert seen == list(range(12))


def test_read_across_unmapped_segments_decodes_each_batch_once(open_log, log_dir, monkeypatch):
    """A read that crosses S segments not mapped yet maps each once and resumes where it stopped:
    O(S) segment reads, not a restart per segment (O(S^2))."""
    lg = open_log({"segment.bytes": 400})
    for i in range(60):
        lg.append([(None, b"%03d" % i, NOW + i)])
    lg.close()
    lg = open_log({"segment.bytes": 400})          # inactive segments open lazily, unmapped
    nsegs = len(lg.segments)
    assert nsegs >= 10
    assert sum(not s.view.is_ready for s in lg.segments) >= nsegs - 1
    calls = []
    import kstore.log as log_mod
    real_log_read = log_mod._log_read

    def counting(*a, **kw):
        calls.append(a[2])
        return real_log_read(*a, **kw)
    monkeypatch.setattr(log_mod, "_log_read", counting)
    got = lg.read(0, max_bytes=1 << 30)
    assert [r.value for r in got] == [b"%03d" % i for i in range(60)]
    # one call to find segment 0 unmapped, then one per segment mapped on the way, each
    # resuming at that segment's base (the active segment is mapped already)
    assert calls == [0] + [s.base_offset for s in lg.segments[:-1]]


def test_read_batches_zero_copy(open_log, log_dir):
    log = open_log()
    log.append([(b"a", b"1")])
    log.append([(b"b", b"2"), (b"c", b"3")])
    view = log.read_batches(1)
    assert isinstance(view, memoryview)
    raw = bytes(view)
    assert struct.unpack(">q", raw[:8])[0] == 1
    assert [r.value for r in _core.decode_batches(raw)] == [b"2", b"3"]
    whole = bytes(log.read_batches(0))
    log.flush()
    with open(os.path.join(log_dir, "00000000000000000000.log"), "rb") as f:
        assert f.read(len(whole)) == whole
    del view



def test_read_batches_takes_whole_batches_within_max_bytes(open_log):
    """read_batches(offset, max_bytes): the batches that fit in max_bytes from the one holding
    offset, at least that one; read_batches now parses only those headers (it parsed every header
    to the segment's end at each call: 18 ms per 1 MiB read in a 14 MB segment of 71-byte
    batches, 10x a read_committed scan's whole cost)."""
    log = open_log()
    for i in range(50):
        log.append([(b"k", b"v" * (i % 7))])
    sizes = []
    pos = 0
    whole = bytes(log.read_batches(0, 1 << 20))
    while pos < len(whole):
        sizes.append(struct.unpack_from(">i", whole, pos + 8)[0] + 12)
        pos += sizes[-1]
    assert len(sizes) == 50
    for start in (0, 7, 49):
        for max_bytes in (0, 1, sizes[start] - 1, sizes[start], sizes[start] + sizes[start + 1] - 1
                          if start < 49 else 5, 1000, 1 << 20):
            want, total = 0, 0
            for n in sizes[start:]:
                if want and total + n > max_bytes:
                    break
                total += n
                want += 1
            view = bytes(log.read_batches(start, max_bytes))
            assert len(view) == total, (start, max_bytes)
            assert struct.unpack(">q", view[:8])[0] == start
            assert [r.offset for r in _core.decode_batches(view)] == list(range(start, start + want))

def test_offset_for_timestamp(open_log):
    log = open_log({"segment.bytes": 1000, "index.interval.bytes": 50})
    for i in range(60):
        log.append([(None, b"v", NOW + i * 10), (None, b"w", NOW + i * 10 + 5)])
    assert log.offset_for_timestamp(NOW) == 0
    assert log.offset_for_timestamp(NOW + 3) == 1
    assert log.offset_for_timestamp(NOW + 100) == 20
    assert log.offset_for_timestamp(NOW + 101) == 21
    assert log.offset_for_timestamp(NOW + 595) == 119
    assert log.offset_for_timestamp(NOW + 596) is None
    assert log.offset_for_timestamp(-1) == 120
    assert log.offset_for_timestamp(-2) == 0
    assert log.offset_for_timestamp(-3) == 119
    log.delete_records(50)
    assert log.offset_for_timestamp(NOW) == 50
    assert log.offset_for_timestamp(-2) == 50


def test_offset_for_timestamp_counts_control_batches_as_kafka(open_log, log_dir):
    """Kafka's searchForTimestamp walks control batches' records too: a KRaft metadata log
    opens with a control batch (LeaderChange at offset 0), so the first offset at its timestamp
    is 0, not the first data record's 1; a commit marker between two data batches is the answer
    for a timestamp between theirs (offset, and the marker's own timestamp)."""
    from broker_dirs import CONTROL, control_key, end_txn_marker, leader_change, v2_batch
    data = (v2_batch(0, [(0, 0, control_key(2), leader_change(1, [1]))], attrs=CONTROL)
            + v2_batch(1, [(0, 0, b"k", b"a"), (1, 0, b"k", b"b")])
            + v2_batch(3, [(0, 0, control_key(1), end_txn_marker(7))], base_ts=NOW + 5, attrs=CONTROL)
            + v2_batch(4, [(0, 0, b"k", b"c")], base_ts=NOW + 10))
    os.makedirs(log_dir)
    with open(os.path.join(log_dir, "00000000000000000000.log"), "wb") as f:
        f.write(data)
    log = open_log()
    assert [r.offset for r in log.read(0)] == [1, 2, 4]          # consumers skip control records
    assert log.fetch_offset_by_timestamp(NOW) == (0, NOW)
    assert log.fetch_offset_by_timestamp(NOW + 1) == (3, NOW + 5)
    assert log.fetch_offset_by_timestamp(NOW + 5) == (3, NOW + 5)
    assert log.fetch_offset_by_timestamp(NOW + 6) == (4, NOW + 10)
    assert log.offset_for_timestamp(NOW + 11) is None
    log.delete_records(1)
    assert log.fetch_offset_by_timestamp(NOW) == (1, NOW)       # from the log start, as Kafka


def test_max_timestamp_lookup_with_out_of_order_timestamps(open_log):
    log = open_log()
    log.append([(None, b"a", NOW + 5), (None, b"b", NOW + 50), (None, b"c", NOW + 7)])
    log.append([(None, b"d", NOW + 8)])
    assert log.fetch_offset_by_timestamp(-3) == (1, NOW + 50)
    assert log.offset_for_timestamp(NOW + 6) == 1


def test_stale_index_entry_never_skips_records(open_log, log_dir):
    """An .index whose entry points at a later batch (stale after a crash, or damaged) must not
    make a read start past the requested offset."""
    log = log_with_stale_index_entry(open_log, log_dir)
    assert [r.offset for r in log.read(6, max_records=3)] == [6, 7, 8]
    assert log.read(5, 1)[0].offset == 5


def _column_input(rows, ts=None):
    """(key, value) rows as a ColumnInput (None keys are null)."""
    n = len(rows)
    koff, voff = np.zeros(n + 1, np.int32), np.zeros(n + 1, np.int32)
    kvalid = np.array([k is not None for k, big_value in rows], np.uint8)
    koff[1:] = np.cumsum([len(k or b"") for k, big_value in rows])
    voff[1:] = np.cumsum([len(v) for _k, v in rows])
    kdat = np.frombuffer(b"".join(k or b"" for k, big_value in rows), np.uint8)
    vdat = np.frombuffer(b"".join(v for _k, v in rows), np.uint8)
    return _core.ColumnInput(n, key=(koff, kdat, kvalid), value=(voff, vdat, None),
                             timestamps=None if ts is None else np.full(n, ts, np.int64))


TS = 1_700_000_000_000


def test_append_columns_writes_the_bytes_append_writes(open_log, tmp_path):
    rows = [(None if i % 5 == 0 else b"k%d" % i, b"v" * (i % 70)) for i in range(500)]
    a = open_log({"segment.bytes": 1 << 20}, path=str(tmp_path / "a-0"))
    b = open_log({"segment.bytes": 1 << 20}, path=str(tmp_path / "b-0"))
    cols = _column_input(rows, TS)
    assert b.append_columns(cols, batch_bytes=4096) == (0, 500)
    ranges = kstore.log.split_rows(cols.sizes(), 0, 500, 4096)
    assert len(ranges) == 9
    for lo, hi in ranges:            # append() of the same rows, cut at the same places
        a.append([(k, v, TS) for k, v in rows[lo:hi]])
    assert bytes(a.read_batches(0, 1 << 30)) == bytes(b.read_batches(0, 1 << 30))
    assert b.append_columns(cols, 100, 110) == (500, 10)
    assert [(r.key, r.value) for r in b.read(500)] == rows[100:110]


def test_append_columns_validates_and_keeps_what_came_before(open_log):
    lg = open_log({"cleanup.policy": "compact"})
    rows = [(b"k%d" % i, b"v") for i in range(10)] + [(None, b"no key")] + [(b"k", b"v")]
    with pytest.raises(kstore.InvalidRecordError):
        lg.append_columns(_column_input(rows), batch_bytes=200)      # 5 rows (35 B) a batch
    assert lg.log_end_offset == 10              # the batches before the bad one stay
    with pytest.raises(kstore.RecordTooLargeError):
        open_log({"max.message.bytes": 100}, path=lg.dir + "x-0").append_columns(
            _column_input([(b"k", b"v" * 200)]))


def test_append_columns_to_a_legacy_format_topic_writes_v1(open_log):
    lg = open_log({"message.format.version": "0.10.2"})
    rows = [(b"k%d" % i, b"v%d" % i) for i in range(20)]
    assert lg.append_columns(_column_input(rows, TS), batch_bytes=100) == (0, 20)
    assert [(r.key, r.value, r.timestamp) for r in lg.read(0)] == [(k, v, TS) for k, v in rows]
    assert bytes(lg.read_batches(0, 1 << 20))[16] == 1          # magic byte of a v1 message


def _append_tagged_until(lg, done):
    """Append batches of 5 records, each value naming its offset, until done() holds."""
    while not done():
        leo = lg.log_end_offset
        lg.append([(None, tagged_value(leo + j), NOW + leo + j) for j in range(5)])


def test_read_columns_of_a_partition_deleted_under_it_is_a_kstore_error(tmp_path, monkeypatch):
    """A columnar read that took a segment just before the partition was closed and its
    directory moved (what LogManager.delete_topic does) opened the segment's lazy index at the
    old path: a raw FileNotFoundError. Now the read sees the log closed (KStoreStateError)."""
    from kstore.segment import LogSegment
    path = str(tmp_path / "t-0")
    cfg = {"segment.bytes": 1024}
    with kstore.Log.open(path, cfg) as lg:
        for o in range(60):
            lg.append([(b"k", b"v%03d" % o, NOW + o)])
    lg = kstore.Log.open(path, cfg)              # clean reopen: indexes open lazily
    original = LogSegment.read_columns

    def deleted_first(seg, *args):
        # the interleaving: the topic is deleted between the reader's pick and its read
        if not lg.closed:
            lg.close_handlers()
            os.rename(path, str(tmp_path / "t-0.0123456789abcdef0123456789abcdef-delete"))
        return original(seg, *args)
    monkeypatch.setattr(LogSegment, "read_columns", deleted_first)
    with pytest.raises(KStoreStateError, match=f"log {path} is closed"):
        lg.read_columns(0, 10, _core.Columns(False))
    assert sorted(os.listdir(tmp_path)) == [".lock", "t-0.0123456789abcdef0123456789abcdef-delete"]


def _slow_reads_only(monkeypatch):
    """Log.read through its Python path (Log._read_slow), whose core calls a test can intercept
    (log._log_read): the compiled fast path (_core.read_records) holds the GIL from its range
    check to its last record, so no other thread changes the segments inside it; a change
    between calls, or from a finalizer run by an allocation, sends it to this path (test_core)."""
    from kstore.log import Log
    monkeypatch.setattr(Log, "read", lambda self, offset, max_records=None, max_bytes=1 << 20,
                        *, verify_crc=True: self._read_slow(offset, max_records, max_bytes, verify_crc))


def test_read_racing_a_truncation_and_new_appends_skips_nothing(open_log, monkeypatch):
    """A read that took the segment list just before a truncation into an earlier segment
    read that segment as cut, jumped to the base of the next (dropped) segment, and, the
    writer having appended past that base meanwhile, went on there: offsets between the cut
    and that base were skipped (the reader-threads test failed so, 'At index 30 diff: 85 !=
    75', about every other run). A read is one contiguous run of offsets, always."""
    import kstore.log as log_module
    lg = open_log({"segment.bytes": 2000})
    _append_tagged_until(lg, lambda: len(lg.segments) >= 3)
    b1 = lg.segments[1].base_offset
    cut = b1 - 10
    real_read, real_prepare = log_module._log_read, log_module.Log._prepare_for_read
    steps = []

    def read_then_truncated(*args):
        if not steps:              # the writer cuts right after the reader took the lists
            steps.append("truncate")
            lg.truncate_to(cut)
        return real_read(*args)

    def prepare_after_appends(self, offset, segs, start):
        if steps == ["truncate"]:  # ... and appends past the dropped segment's base
            steps.append("append")
            _append_tagged_until(lg, lambda: lg.log_end_offset > b1 + 10)
        return real_prepare(self, offset, segs, start)
    monkeypatch.setattr(log_module, "_log_read", read_then_truncated)
    monkeypatch.setattr(log_module.Log, "_prepare_for_read", prepare_after_appends)
    _slow_reads_only(monkeypatch)
    got = [(r.offset, r.value) for r in lg.read(0, max_records=b1 + 5, max_bytes=1 << 30)]
    assert steps == ["truncate", "append"]
    assert [o for o, big_value in got] == list(range(b1 + 5))
    assert all(v == tagged_value(o) for o, v in got)


def test_read_racing_a_truncation_never_reports_its_own_offset_gone(open_log, monkeypatch):
    """A read that took the segment list just before a truncation into an earlier segment
    jumped to the next (dropped) segment's base and, that base now past the log end, raised
    OffsetOutOfRangeError naming it, though the offset asked for is still in the log (a
    consumer then resets to the log start and repeats records). The read is done again on the
    truncated log: the records from the offset to the cut."""
    import kstore.log as log_module
    lg = open_log({"segment.bytes": 2000})
    _append_tagged_until(lg, lambda: len(lg.segments) >= 3)
    b1 = lg.segments[1].base_offset
    cut = b1 - 10
    real_read = log_module._log_read
    steps = []

    def read_then_truncated(*args):
        if not steps:              # the writer cuts right after the reader took the lists
            steps.append("truncate")
            lg.truncate_to(cut)
        return real_read(*args)
    monkeypatch.setattr(log_module, "_log_read", read_then_truncated)
    _slow_reads_only(monkeypatch)
    got = [(r.offset, r.value) for r in lg.read(0, max_bytes=1 << 30)]
    assert steps == ["truncate"] and lg.log_end_offset == cut
    assert [o for o, big_value in got] == list(range(cut))
    assert all(v == tagged_value(o) for o, v in got)


# -- the compiled read (issue 14) ------------------------------------------------------------------
def test_compiled_read_keeps_read_s_signature_and_defaults(open_log):
    import inspect
    from kstore.log import DEFAULT_MAX_BYTES, Log
    sig = inspect.signature(Log.read)
    assert list(sig.parameters) == ["log", "offset", "max_records", "max_bytes", "verify_crc"]
    assert sig.parameters["max_bytes"].default == DEFAULT_MAX_BYTES
    assert sig.parameters["verify_crc"].kind is inspect.Parameter.KEYWORD_ONLY
    lg = open_log()
    lg.append([(b"k%d" % i, b"v" * 3000, NOW + i) for i in range(10)])
    assert [r.offset for r in lg.read(3, 2)] == [3, 4]
    assert [r.offset for r in lg.read(3, max_bytes=1)] == list(range(3, 10))   # at least one batch
    assert lg.read(10) == []
    with pytest.raises(kstore.OffsetOutOfRangeError):
        lg.read(11)
    with pytest.raises(kstore.OffsetOutOfRangeError):
        lg.read(1 << 70)                 # outside int64: the Python path's range check
    assert [r.offset for r in lg.read(np.int64(8))] == [8, 9]


def test_a_truncation_during_the_compiled_read_sends_it_to_the_slow_path(open_log):
    """The compiled read holds the GIL, but an allocation inside it may run a finalizer, which
    may change the log: here a truncation into the segment being read, after the read took its
    segment list. The read notices the new list and reads again: the records of the log as cut,
    nothing from the dropped segment."""
    import gc
    lg = open_log({"segment.bytes": 2000})
    _append_tagged_until(lg, lambda: len(lg.segments) >= 3)
    b1 = lg.segments[1].base_offset
    cut = b1 - 10
    done = []

    class Truncator:
        def __init__(self):
            self.me = self       # a cycle: freed by the collector, inside the read's allocations

        def __del__(self):
            if not done:
                done.append(lg.truncate_to(cut))

    lg.read(0, max_bytes=1 << 30)            # every segment mapped: the read stays compiled
    old = gc.get_threshold()
    gc.collect()
    Truncator()
    gc.set_threshold(1)
    try:
        got = [(r.offset, r.value) for r in lg.read(0, max_bytes=1 << 30)]
    finally:
        gc.set_threshold(*old)
    assert done and lg.log_end_offset == cut
    assert [o for o, _v in got] == list(range(cut))
    assert all(v == tagged_value(o) for o, v in got)


def test_a_corrupt_batch_not_yet_verified_names_file_and_position_after_others_were(open_log, log_dir):
    """Batches large enough to be remembered: one read and verified, then a byte of another one
    flipped on disk (the shared mapping sees it): a read of the second raises naming the file
    and the batch's position; the first still reads (its CRC was verified in this mapping)."""
    lg = open_log()
    for b in range(3):
        lg.append([(b"k", b"%d." % (b * 40 + i) * 30, NOW + b * 40 + i) for i in range(40)])
    assert [r.offset for r in lg.read(5, 1)] == [5]
    seg = lg.segments[0]
    pos = seg.translate_offset(80)
    path = os.path.join(log_dir, "00000000000000000000.log")
    fd = os.open(path, os.O_RDWR)
    try:
        c = os.pread(fd, 1, pos + 200)
        os.pwrite(fd, bytes([c[0] ^ 0x20]), pos + 200)
    finally:
        os.close(fd)
    with pytest.raises(kstore.CorruptRecordError) as e:
        lg.read(85, 1)
    assert e.value.path == path and e.value.position == pos
    assert [r.offset for r in lg.read(6, 2)] == [6, 7]


# -- the append path writes the bytes it always wrote ---------------------------------------
def _golden_workload(path):
    """1000-record batches (pwritten), single records (copied into the mapping), every input
    shape, a roll; fixed clock and timestamps."""
    t = MockTime(GOLDEN_NOW)
    log = kstore.Log.open(path, {"segment.bytes": 4 << 20, "max.message.bytes": 2 << 20}, time=t)
    base = GOLDEN_NOW
    for b in range(30):
        log.append([(b"k%015d" % (b * 1000 + i), bytes([i % 251]) * 100, base + b * 1000 + i)
                    for i in range(1000)])
    log.append([(None, b"v"), (b"k", None), (None, None, base), (bytearray(b"ba"), memoryview(b"mv"), base + 5),
                (b"h", b"x", base + 3, [("hk", b"hv"), ("n", None)]), (b"e", b"y", None, ()),
                kstore.Record(key=b"r", value=b"rv", timestamp=base + 7), [b"l", b"list", base + 2],
                (b"big", b"z" * 70000, base + 10)])
    for i in range(300):
        log.append([(b"s%d" % i, b"single" * (i % 7), base + 100000 + i)])
    log.append([(b"k" * (i % 300), b"v" * (i * 37 % 5000), base - 50 + i * 3) for i in range(500)])
    log.append(tuple((None, b"%d" % i) for i in range(200)))
    log.close()


GOLDEN_NOW = 1_700_000_000_000
# sha256 of each file as main (before the pwrite path and the encoder's fast path) wrote them
GOLDEN = {
    "00000000000000000000.index": (296, "dce7de500733ce00898c79dbac89fee79c85afb14358eb4764e4717add700f6e"),
    "00000000000000000000.log": (3905020, "587a9f9d5466511644f5c8d9c420a5503a4ceca4e4dee1d350a241aa7b7ee999"),
    "00000000000000000000.timeindex": (444, "ae2d375b804b55b341959c3fdc03b395c637821c7ca16ce459057822e2fba789"),
    "00000000000000030309.index": (8, "67bb03e5e8f2de64e7804b8f76c5d9283c3b7f5678ceedd1277db2675831a2ec"),
    "00000000000000030309.log": (1253426, "80e2f48c5d796ff47ba0ec982ce7fad1f1bab03dd8170f34cea6ee1a60234e67"),
    "00000000000000030309.timeindex": (12, "c598b95e9c92801b52d1e3610bdbadd1781e58ed8c6acc73715aa390fcdef314"),
}


def test_append_writes_the_same_bytes_as_before(tmp_path):
    """The bytes main wrote, except that every batch now carries the partition leader epoch
    (0, from the leader-epoch-checkpoint a new partition starts with) where it carried -1: the
    field (outside the CRC) is checked and put back to -1 before hashing."""
    d = str(tmp_path / "g-0")
    _golden_workload(d)
    got = {}
    for name in sorted(os.listdir(d)):
        if name.endswith((".log", ".index", ".timeindex")):
            with open(os.path.join(d, name), "rb") as f:
                data = f.read()
            if name.endswith(".log"):
                data = epoch_back_to_unknown(data)
            got[name] = (len(data), hashlib.sha256(data).hexdigest())
    assert got == GOLDEN
    with open(os.path.join(d, "leader-epoch-checkpoint"), "rb") as f:
        assert f.read() == b"0\n1\n0 0\n"


def test_a_read_passes_over_markers_outside_its_byte_budget(tmp_path):
    """More than max_bytes of transaction markers (a compacted transactional log) before the next
    record: read() returns the records after them, the first one whatever max_bytes (Kafka's at
    least one batch). Before, the markers used up the budget and read() returned [] below the
    log end: a loop of read() and wait_for() spun at the markers forever."""
    from batch_helpers import markers_then_records
    at = markers_then_records(str(tmp_path))
    with kstore.Log.open(str(tmp_path / "t-0")) as lg:
        assert lg.log_end_offset == at + 2
        assert [(r.offset, r.value) for r in lg.read(0)] == [(at, b"plain"), (at + 1, b"next")]
        assert [(r.offset, r.value) for r in lg.read(0, max_bytes=100)] == [(at, b"plain")]
        assert [(r.offset, r.value) for r in lg.read(5, max_records=1)] == [(at, b"plain")]
        assert lg.read(at + 2) == []


def test_a_read_only_tail_loop_over_iter_chunks_finds_records_after_trailing_markers(tmp_path, watchdog):
    """A reader in this process tails a log whose writer (another process) ended it with
    transaction markers: `for chunk in lg.iter_chunks(pos)`, then `lg.wait_for(pos, ...)`, pos
    after the last record. The writer then appends a record; the loop returns it. Before, the
    wait returned at once (the end is past pos, at the markers' end) and the read at pos, below
    the end the read-only view knew, never refreshed it: the loop spun and never saw the record
    (found in a compacted transactional log under a cleaner; read_records now refreshes)."""
    from batch_helpers import txn_batch
    from writer_process import WriterProcess
    watchdog(60)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)", "lg.append([(b'k', b'first')])",
              f"lg.append_batches({b''.join(txn_batch(1 + i, 4, control=1) for i in range(3))!r})")
        with kstore.StoreReader(d) as st:
            lg = st.log("t", 0)
            got, pos = [], 0
            for _ in range(2):
                for chunk in lg.iter_chunks(pos):
                    got += [(r.offset, r.value) for r in chunk]
                    pos = chunk[-1].offset + 1
                assert lg.wait_for(pos, 1)
            assert (got, pos, lg.log_end_offset) == ([(0, b"first")], 1, 4)
            w.run("lg.append([(b'k', b'after')])")
            for _ in range(3):
                for chunk in lg.iter_chunks(pos):
                    got += [(r.offset, r.value) for r in chunk]
                    pos = chunk[-1].offset + 1
            assert got == [(0, b"first"), (4, b"after")]
    finally:
        assert w.close() == 0
