"""Index blocks reserved as written zeros (index.py _ensure_allocated(zero_fill=True)) beside a
reader in another process: the writer (tests/writer_process.py) appends single-record batches
with an index entry each (index.interval.bytes=1), so its offset and time indexes cross many
64 KiB blocks, and rolls; this process reads them read-only while it does (a thread), and
checks every entry it can see against what the writer's appends must have put there (every
batch the same size: entry i of a segment is offset base+i+1 at position (i+1)*size, time
NOW+base+i+1), so a zero-filled block read as entries, a torn entry or a short copy fails; then
offset and timestamp lookups and reads at every offset it can see, and at the end the same
lookups on a fresh open must agree with what the reader found."""
from __future__ import annotations

import threading

import numpy as np

from kstore import StoreReader
from kstore.log import Log
from thread_watchdog import join_all
from writer_process import WriterProcess

NOW = 1_700_000_000_000
CHUNK = 4000
CHUNKS = 18              # 72000 entries per index: 9 blocks of the offset index, 14 of the time one
CFG = "{'index.interval.bytes': 1, 'segment.bytes': 2_500_000}"


def _check_segment(seg, size: int, leo: int) -> int:
    """Every entry the read-only segment shows, exactly; returns how many."""
    base = seg.base_offset
    oi, ti = seg.offset_index, seg.time_index
    n = oi.entries
    arr = oi.entries_array()[:n]
    i = np.arange(1, n + 1)
    assert (arr["relative_offset"] == i).all(), f"offset entries of {base}: {arr[:4]}...{arr[-4:]}"
    assert (arr["position"] == i * size).all(), f"positions of {base}"
    tarr = ti.entries_array()[:ti.entries]
    j = np.arange(1, len(tarr) + 1)
    assert (tarr["relative_offset"] == j).all() and (tarr["timestamp"] == NOW + base + j).all(), \
        f"time entries of {base}"
    assert n == 0 or base + n < leo                        # no entry past what was appended
    return n


def _lookups(ro, offsets, size):
    """(offset, position, found timestamp offset, first record read) at each offset."""
    out = []
    for o in offsets:
        recs = ro.read(o, max_records=1)           # (validates the segment: copies its entries)
        assert recs[0].offset == o and recs[0].key == b"k%015d" % o and recs[0].timestamp == NOW + o
        seg = next(s for s in reversed(ro.segments) if s.base_offset <= o)
        io, ipos = seg.offset_index.lookup(o)
        assert ipos == (io - seg.base_offset) * size and io <= o, (o, io, ipos)
        found = seg.find_offset_by_timestamp(NOW + o, seg.base_offset)
        assert found is not None and found[0] == o, (o, found)
        out.append((o, io, ipos, found))
    return out


def test_index_blocks_beside_a_reader(tmp_path, watchdog):
    watchdog(600)
    root = str(tmp_path)
    w = WriterProcess(root, root)
    stop = threading.Event()
    errors: list[BaseException] = []
    seen: dict[int, tuple] = {}
    counts = {"entries": 0, "passes": 0}
    try:
        w.run(f"m.create_topic('t', 1, {CFG})", "lg = m.log('t', 0)",
              "lg.append([(b'k%015d' % 0, b'v' * 20, NOW)])")
        with StoreReader(root) as store:
            ro = store.log("t", 0)
            assert ro.wait_for(0, timeout=30)
            size = ro.segments[0].size                       # one single-record batch

            def follow():
                try:
                    rng = np.random.default_rng(19)
                    while not stop.is_set():
                        ro.refresh()
                        ro.catch_up_index()
                        leo = ro.log_end_offset
                        for seg in ro.segments:
                            counts["entries"] += _check_segment(seg, size, leo)
                        sample = rng.integers(0, leo, 50)
                        for row in _lookups(ro, sorted(set(int(x) for x in sample)), size):
                            seen[row[0]] = row
                        counts["passes"] += 1
                except BaseException as e:    # reported by the main thread
                    errors.append(e)

            t = threading.Thread(target=follow)
            t.start()
            try:
                for c in range(CHUNKS):
                    a, b = 1 + c * CHUNK, 1 + (c + 1) * CHUNK
                    w.run(f"for o in range({a}, {b}): lg.append([(b'k%015d' % o, b'v' * 20, NOW + o)])")
                    if errors:
                        break
            finally:
                stop.set()
                join_all([t], 120)
            if errors:
                raise errors[0]
            assert counts["passes"] >= 3 and counts["entries"] > 10 * CHUNK, counts
            end = 1 + CHUNKS * CHUNK
            assert ro.wait_for(end - 1, timeout=30)
            assert len(ro.segments) >= 3                      # it rolled
        # a fresh open agrees with every lookup the reader made while the writer appended
        fresh = Log.open(str(tmp_path / "t-0"), read_only=True)
        try:
            again = {row[0]: row for row in _lookups(fresh, sorted(seen), size)}
            _lookups(fresh, [s.base_offset for s in fresh.segments], size)
            for seg in fresh.segments:
                _check_segment(seg, size, end)
            assert sum(s.offset_index.entries for s in fresh.segments[:-1]) == \
                sum(s.size // size - 1 for s in fresh.segments[:-1])
            exact = 0
            for o, (_o, io, _ipos, found) in seen.items():
                _o, fio, _fpos, ffound = again[o]
                base = next(s.base_offset for s in reversed(fresh.segments) if s.base_offset <= o)
                assert fio == (o if o > base else base)          # every batch but a first indexed
                assert found == ffound and io <= fio
                exact += io == fio
            # the reader's entries lag the writer's by at most the copy it had not caught up on
            assert len(seen) > 100 and exact >= len(seen) // 2, (exact, len(seen))
        finally:
            fresh.close()
    finally:
        stop.set()
        assert w.close() == 0
