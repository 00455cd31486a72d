"""The writer places offset-index entries where recovery's scan puts them (Kafka's rule: an entry
when more than index.interval.bytes were appended since the last one's batch, counted from the
segment's last entry): after a recovery, a clean open or a truncation the writer counts from
its last entry, not from 0 at the end, so the next unclean open finds the index sound and
leaves it (no write, no truncation, the same file). Lookups land exactly on batch starts."""
from __future__ import annotations

import collections
import os
import struct

import pytest

import kstore
from kstore.fileio import FileOps

NOW = 1_700_000_000_000


class Writes(FileOps):
    """Counts writes and truncations per file suffix."""

    def __init__(self) -> None:
        super().__init__()
        self.c: collections.Counter = collections.Counter()

    def _name(self, fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}").rsplit(".", 1)[-1]

    def pwrite(self, fd, data, pos, *a, **k):
        self.c["pwrite " + self._name(fd)] += 1
        return super().pwrite(fd, data, pos, *a, **k)

    def truncate(self, fd, n, *a, **k):
        self.c["truncate " + self._name(fd)] += 1
        return super().truncate(fd, n, *a, **k)


def _batch(n: int, size: int, ts: int) -> list:
    return [(b"k%07d" % i, b"v" * size, ts) for i in range(n)]


def _indexes(path: str) -> dict:
    """(bytes, inode, mtime) of every .index and .timeindex."""
    out = {}
    for name in sorted(os.listdir(path)):
        if name.endswith((".index", ".timeindex")):
            p = os.path.join(path, name)
            st = os.stat(p)
            out[name] = (open(p, "rb").read(), st.st_ino, st.st_mtime_ns)
    return out


def _check_lookups(lg) -> None:
    """Every index entry names a batch start with its last offset; every offset reads exactly."""
    for seg in lg.segments:
        oi = seg.offset_index
        data = open(seg.log_path, "rb").read()
        starts, pos = {}, 0
        while pos + 61 <= seg.size:              # v2 batch headers: base offset, length, delta
            base, length = struct.unpack_from(">qi", data, pos)
            starts[pos] = base + struct.unpack_from(">i", data, pos + 23)[0]
            pos += 12 + length
        assert pos == seg.size
        for n in range(oi.entries):
            off, p = oi.entry(n)
            assert starts.get(p) == off               # a batch start, with its last offset
    for off in range(lg.log_start_offset, lg.log_end_offset):
        assert [r.offset for r in lg.read(off, max_records=1)] == [off]


@pytest.mark.parametrize("then", ["clean", "unclean", "truncate"])
def test_a_second_unclean_open_leaves_the_writers_index_alone(tmp_path, then):
    path = str(tmp_path / "t-0")
    # batches of 3 sizes around the interval: entries every batch, every 2nd or 3rd
    cfg = {"segment.bytes": 1 << 20, "index.interval.bytes": 3000}
    sizes = [40, 900, 2500, 120, 3100, 60, 1500]
    ts = NOW
    lg = kstore.Log.open(path, cfg)
    for i in range(14):
        ts += 1
        lg.append(_batch(3, sizes[i % len(sizes)], ts))
    if then == "clean":
        lg.close()
    else:
        lg.close_handlers()                      # a crash: the next open recovers
    lg = kstore.Log.open(path, cfg)              # clean, or unclean #1 (indexes rebuilt)
    if then == "truncate":
        lg.truncate_to(21)                       # a batch boundary (batches of 3)
    for i in range(11):
        ts += 1
        lg.append(_batch(2, sizes[(i * 3) % len(sizes)], ts))
    end = lg.log_end_offset
    lg.close_handlers()
    before = _indexes(path)
    io = Writes()
    lg = kstore.Log.open(path, cfg, io=io)       # unclean: the writer's index is sound
    try:
        assert lg.log_end_offset == end and lg.recovery_report
        assert [k for k in io.c if k.endswith(" index")] == []
        after = _indexes(path)
        index = [n for n in before if n.endswith(".index")]
        assert index and all(after[n] == before[n] for n in index)
        _check_lookups(lg)
        # the placement is the scan's: a rebuild from nothing gives the same bytes
        entries = {n: after[n][0].rstrip(b"\0") for n in index}
    finally:
        lg.close_handlers()
    for n in index:
        os.unlink(os.path.join(path, n))
    lg = kstore.Log.open(path, cfg)
    try:
        rebuilt = _indexes(path)
        assert {n: rebuilt[n][0].rstrip(b"\0") for n in index} == entries
        _check_lookups(lg)
    finally:
        lg.close()


def test_large_batches_leave_both_indexes_alone_after_repeated_crashes(tmp_path):
    """The benchmark's shape (every batch past the interval): .index and .timeindex both sound."""
    path = str(tmp_path / "t-0")
    cfg = {"segment.bytes": 1 << 20}
    lg = kstore.Log.open(path, cfg)
    for i in range(5):
        lg.append(_batch(100, 100, NOW + i))
    lg.close_handlers()
    kstore.Log.open(path, cfg).close_handlers()          # unclean #1, nothing appended
    for rnd in range(3):
        lg = kstore.Log.open(path, cfg)
        lg.append(_batch(100, 100, NOW + 10 + rnd))
        lg.close_handlers()
        before = _indexes(path)
        io = Writes()
        lg = kstore.Log.open(path, cfg, io=io)
        try:
            assert [k for k in io.c if "index" in k] == []
            assert _indexes(path) == before
            _check_lookups(lg)
            assert lg.offset_for_timestamp(NOW + 10 + rnd) == 500 + 100 * rnd
        finally:
            lg.close_handlers()
