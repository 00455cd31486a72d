"""Read-only segments beside a writer process: retention, compaction and corruption under a
read-only Log."""
import os

import pytest

import kstore
from kstore import _core
from writer_process import WriterProcess
from kstore.errors import CorruptRecordError, OffsetOutOfRangeError

from log_helpers import NOW


def test_read_only_reader_goes_on_past_segments_retention_deleted(tmp_path, watchdog):
    """Defect 7: a segment that retention deleted after the reader listed it made reads raise
    a raw FileNotFoundError. Now a read of a deleted offset raises OffsetOutOfRangeError, and
    reads (read, read_columns, offset_for_timestamp) of what remains go on."""
    watchdog(60)
    w = WriterProcess(str(tmp_path), str(tmp_path))
    try:
        w.run("m.create_topic('t', 1)",
              "lg = m.log('t', 0)",
              "for o in range(60): lg.append([(None, b'%d.' % o * 20, NOW + o)])")
        ro = kstore.Log.open(str(tmp_path / "t-0"), read_only=True)
        bases = [s.base_offset for s in ro.segments]
        assert len(bases) >= 6 and ro.log_end_offset == 60
        assert not ro.segments[1].ro_scanned and not ro.segments[3].ro_scanned
        gone, kept = bases[1] + 1, bases[3] + 1
        w.run(f"lg.delete_records({bases[3]})", "lg.delete_old_segments()")
        assert sorted(n for n in os.listdir(tmp_path / "t-0") if n.endswith(".log"))[0] == \
            "%020d.log" % bases[3]
        with pytest.raises(OffsetOutOfRangeError, match=f"offset {gone} is out of range .* log start offset {bases[3]}"):
            ro.read(gone, max_records=2)
        assert [(r.offset, r.value) for r in ro.read(kept, max_records=2)] == \
            [(kept, b"%d." % kept * 20), (kept + 1, b"%d." % (kept + 1) * 20)]
        assert ro.log_start_offset == bases[3]
        with pytest.raises(OffsetOutOfRangeError):
            ro.read_columns(gone, gone + 5, _core.Columns(False))
        assert ro.offset_for_timestamp(NOW + gone) == bases[3]
        assert [r.offset for c in ro.iter_chunks() for r in c] == list(range(bases[3], 60))
    finally:
        assert w.close() == 0


def test_read_only_refresh_reads_segments_compaction_rewrote(tmp_path, watchdog):
    """Defect 8: after the cleaner swapped compacted segments in (new files, same base-offset
    names), refresh() kept the old mappings: the reader served the superseded records. Now it
    reads the rewritten segments, and a read of an offset whose segment compaction removed goes
    on at the next record."""
    watchdog(60)
    w = WriterProcess(str(tmp_path), str(tmp_path))
    try:
        w.run("m.create_topic('c', 1, {'cleanup.policy': 'compact'})",
              "lg = m.log('c', 0)",
              "for i in range(120): lg.append([(b'k%d' % (i % 7), b'v%d' % i, NOW)])")
        ro = kstore.Log.open(str(tmp_path / "c-0"), read_only=True)
        before = [(r.offset, r.key, r.value) for c in ro.iter_chunks() for r in c]
        assert before == [(i, b"k%d" % (i % 7), b"v%d" % i) for i in range(120)]
        active = ro.segments[-1].base_offset
        second = ro.segments[1].base_offset
        w.run("m.clean_now()")
        ro.refresh()
        after = [(r.offset, r.key, r.value) for c in ro.iter_chunks() for r in c]
        # below the active segment only each key's latest value (as of the cleaned range) stays
        latest = {}
        for off, k, v in before:
            if off < active:
                latest[k] = (off, k, v)
        assert after == sorted(latest.values()) + [b for b in before if b[0] >= active]
        assert ro.log_end_offset == 120
        # an offset of a segment merged away: the read goes on at the next surviving record
        fresh = kstore.Log.open(str(tmp_path / "c-0"), read_only=True)
        nxt = next(a for a in after if a[0] >= second + 1)
        assert [(r.offset, r.key, r.value) for r in fresh.read(second + 1, max_records=1)] == [nxt]
        assert [(r.offset, r.key, r.value) for r in ro.read(second + 1, max_records=1)] == [nxt]
    finally:
        assert w.close() == 0


def test_read_only_reader_raises_at_a_bad_batch_followed_by_valid_ones(tmp_path, watchdog):
    """Defect 11, last segment: a batch that fails its CRC with valid batches after it is
    corruption, not a batch still being written: a read reaching it raises CorruptRecordError
    naming the file and position (the reader used to end the log there silently). A torn batch
    followed only by zeros (an append in flight) stays invisible until it is whole."""
    watchdog(60)
    w = WriterProcess(str(tmp_path), str(tmp_path))
    try:
        w.run("m.create_topic('t', 1, {'segment.bytes': 1048576})",
              "lg = m.log('t', 0)",
              "for o in range(20): lg.append([(None, b'v%02d' % o * 30, NOW + o)])",
              "lg.flush()")
        path = str(tmp_path / "t-0" / "00000000000000000000.log")
        ro = kstore.Log.open(str(tmp_path / "t-0"), read_only=True)
        pos = [h[0] for h in _core.batch_headers(ro.segments[0].mapping(), 0, ro.segments[0].size)]
        assert ro.log_end_offset == 20 and len(pos) == 20
        ro.close_handlers()
        with open(path, "r+b") as f:               # one flipped value byte in batch 12
            f.seek(pos[12] + 80)
            b = f.read(1)
            f.seek(pos[12] + 80)
            f.write(bytes([b[0] ^ 0xFF]))
        ro = kstore.Log.open(str(tmp_path / "t-0"), read_only=True)
        assert [r.offset for r in ro.read(3, max_records=9)] == list(range(3, 12))
        assert ro.log_end_offset == 12               # what lies past it is not known here
        for read in (lambda: ro.read(3, max_bytes=1 << 20), lambda: ro.read(12),
                     lambda: ro.read_columns(12, 20, _core.Columns(False))):
            with pytest.raises(CorruptRecordError) as e:
                read()
            assert (e.value.path, e.value.position) == (path, pos[12])
            assert str(e.value) == f"CRC mismatch, followed by valid batches ({path}, position {pos[12]})"
        # a torn batch at the end, zeros after it: invisible, then seen once whole
        w.run("lg.delete_records(0); lg.truncate_to(12)")
        ro = kstore.Log.open(str(tmp_path / "t-0"), read_only=True)
        assert ro.log_end_offset == 12
        w.run("lg.append([(None, b'new' * 30, NOW)])")
        with open(path, "r+b") as f:
            f.seek(pos[12] + 40)
            whole = f.read(60)
            f.seek(pos[12] + 40)
            f.write(bytes(60))                       # the writer's memcpy is half done
        ro.refresh()
        assert ro.log_end_offset == 12 and ro.read(12) == []
        with open(path, "r+b") as f:
            f.seek(pos[12] + 40)
            f.write(whole)
        ro.refresh()
        assert [(r.offset, r.value) for r in ro.read(12)] == [(12, b"new" * 30)]
    finally:
        assert w.close() == 0


def test_reader_threads_beside_refreshes_that_grow_the_index_copies(tmp_path, watchdog):
    """Reader threads (read at random offsets, offset_for_timestamp) use a read-only log's
    index copies while a refresher thread extends them in place and moves them to larger ones
    (index.interval.bytes 60: an entry on almost every append) and an appender thread on a
    writable log appends batches of 1-40 records: every read returns exactly the records
    appended at its offset, every time lookup the first record at or after its timestamp."""
    import random
    import threading
    from race_harness import Race
    watchdog(90)
    path = str(tmp_path / "t-0")
    cfg = {"segment.bytes": 8 << 20, "index.interval.bytes": 60}
    lg = kstore.Log.open(path, cfg)
    ro = kstore.Log.open(path, cfg, read_only=True)
    race = Race()
    lock = threading.Lock()
    next_off = [0]

    def value(o):
        return b"%d;" % o * 10

    def append():
        with lock:
            o = next_off[0]
            n = random.randint(1, 40)
            lg.append([(None, value(o + j), NOW + o + j) for j in range(n)])
            next_off[0] = o + n
        if o > 60000:
            race.stop.set()

    def refresh():
        ro.refresh()

    def reader(seed):
        rng = random.Random(seed)

        def step():
            end = ro.log_end_offset
            if end < 2:
                return
            o = rng.randrange(end)
            got = [(r.offset, r.value, r.timestamp) for r in ro.read(o, max_records=3)]
            assert got and got[0][0] == o, (o, got[:1])
            assert all(g == (x, value(x), NOW + x) for g, x in zip(got, range(o, o + 3))), got
            assert ro.offset_for_timestamp(NOW + o) == o
        return step

    race.spawn("appender", append)
    race.spawn("refresher", refresh)
    for i in range(3):
        race.spawn(f"reader{i}", reader(i))
    try:
        race.run(6)
        race.check()
        ro.refresh()
        w, r = lg.segments[-1], ro.segments[-1]
        assert r.offset_index.entries == w.offset_index.entries > 1000
        assert r.offset_index.entries_array().tobytes() == w.offset_index.entries_array().tobytes()
    finally:
        ro.close()
        lg.close()
