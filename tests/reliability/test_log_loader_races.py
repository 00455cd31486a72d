"""A read-only Log's directory scan (LogLoader.scan_read_only) beside a writer that changes the
segment list between the scan's two listings, every time, deterministically: the reader's
FileOps runs the writer's step before each listing of the partition directory.

A writer that keeps rolling (and retention removing from the head) makes every pair of listings
differ; the reader must still make progress (found by tests/reliability/test_manager_races.py::
test_read_only_manager_beside_an_appending_process on tmpfs: "the segments of ... keep changing")
and never see a hole, a log start moving backwards, or skipped or repeated records. A truncation
between the listings must not be accepted (the first listing has tail segments the writer
deleted).
"""
import os

import kstore
from kstore.fileio import FileOps
from kstore.ro_refresh import DirWatch


class ListingHookOps(FileOps):
    """The reader's I/O: before each listing of the partition directory (when armed), the
    writer's step runs; before each look at a file (open, or stat), on_open."""

    def __init__(self, dir_, step):
        self.dir = dir_
        self.step = step
        self.armed = False
        self.listings = 0
        self.on_open = None         # called (when armed) before each open

    def listdir(self, path):
        if self.armed and os.path.abspath(path) == self.dir:
            self.listings += 1
            self.step(self.listings)
        return super().listdir(path)

    def open(self, path, flags, mode=0o644):
        if self.armed and self.on_open is not None:
            self.on_open(path)
        return super().open(path, flags, mode)

    def stat_path(self, path, follow_symlinks=False):
        # a refresh's cheap look at a file it validated (no open when it has not grown)
        if self.armed and self.on_open is not None and os.path.abspath(path) != self.dir:
            self.on_open(path)
        return super().stat_path(path, follow_symlinks)


def _append_and_roll(writer, n=3):
    writer.append([(b"k", b"v%d" % i) for i in range(n)])
    writer.roll()


def _read_range(lg, start, end):
    got, p = [], start
    while p < end:
        recs = lg.read(p, max_records=1000)
        assert recs, f"nothing read at {p} (range {start}..{end})"
        got.extend((r.offset, r.value) for r in recs if r.offset < end)
        p = recs[-1].offset + 1
    return got


def _check_view(reader, writer, prev_start):
    """The reader's view: a start not below the last one, records contiguous from it to its end,
    an end not past the writer's."""
    start, end = reader.log_start_offset, reader.log_end_offset
    assert start >= prev_start, f"log start moved back from {prev_start} to {start}"
    assert end <= writer.log_end_offset
    got = _read_range(reader, start, end)
    # the writer's records over the same range (a truncation cuts whole batches: offsets may
    # have gaps, the same for both)
    want = _read_range(writer, start, end)
    assert got == want, f"records skipped or repeated: {got} != {want}"
    bases = [s.base_offset for s in reader._segments]
    writer_bases = [s.base_offset for s in writer._segments]
    # no hole: the reader's segments are a run of consecutive segments the writer had
    assert bases, "no segments"
    return start, bases, writer_bases


def _run(tmp_path, watchdog, step_fn, refreshes=20, on_open=None, *, monkeypatch):
    watchdog(120)
    # every refresh here must list: the writer steps only before a listing. A listing of a
    # directory settled for DirWatch.SLACK_NS is trusted and the next refresh lists nothing
    # while the stamp holds (ro_refresh.py, tested in test_ro_refresh.py); the reader's open
    # comes more than 20 ms after the writer's last roll whenever the machine is loaded or the
    # test runs after others, and then no refresh ever listed (listings == 0). No trust here.
    monkeypatch.setattr(DirWatch, "settled", lambda self, before: False)
    path = os.path.abspath(str(tmp_path / "t-0"))
    writer = kstore.Log.open(path)
    try:
        for _ in range(4):
            _append_and_roll(writer)
        ops = ListingHookOps(path, lambda n: step_fn(writer, n))
        if on_open is not None:
            ops.on_open = lambda p: on_open(writer, p)
        reader = kstore.Log.open(path, read_only=True, io=ops)
        try:
            prev = reader.log_start_offset
            for _ in range(refreshes):
                ops.armed = True
                try:
                    reader.refresh()
                finally:
                    ops.armed = False
                prev, bases, writer_bases = _check_view(reader, writer, prev)
                i = writer_bases.index(bases[0]) if bases[0] in writer_bases else None
                # segments the writer removed from the head since are gone from its list; the
                # rest must match its list in order
                kept = [b for b in bases if b in writer_bases]
                assert kept == writer_bases[i: i + len(kept)] if i is not None else not kept, \
                    (bases, writer_bases)
            assert ops.listings >= 2 * refreshes
        finally:
            reader.close()
    finally:
        writer.close()


def test_refresh_beside_a_writer_rolling_between_every_two_listings(tmp_path, watchdog, monkeypatch):
    """Every listing sees one more segment than the one before: no two listings are equal."""
    _run(tmp_path, watchdog, lambda writer, n: _append_and_roll(writer), monkeypatch=monkeypatch)


def test_refresh_beside_a_writer_rolling_and_retaining_between_every_two_listings(tmp_path, watchdog, monkeypatch):
    """A segment added at the tail and one removed from the head before every listing."""
    def step(writer, n):
        _append_and_roll(writer)
        segs = writer._segments
        if len(segs) > 3:
            writer.delete_records(segs[1].base_offset)
    _run(tmp_path, watchdog, step, monkeypatch=monkeypatch)


def test_refresh_beside_retention_taking_the_head_during_the_validations(tmp_path, watchdog, monkeypatch):
    """Retention removes the reader's first segment (validated before: the reader read it) just
    as the scan validates it, every scan, and the writer rolls before every listing: the scan
    drops the vanished head once the second listing confirms it is gone from the head."""
    removed = []

    def on_open(writer, path):
        segs = writer._segments
        if path == segs[0].log_path and len(segs) > 2:
            writer.delete_records(segs[1].base_offset)
            _append_and_roll(writer)
            removed.append(path)
    _run(tmp_path, watchdog, lambda writer, n: _append_and_roll(writer), on_open=on_open, monkeypatch=monkeypatch)
    assert len(removed) >= 10


def test_refresh_beside_a_writer_truncating_between_the_listings(tmp_path, watchdog, monkeypatch):
    """A truncation (tail segments deleted, appends going on in a new segment) between a
    refresh's listings, every few listings, with rolls between all the others: the first
    listing's tail is gone, so it is not a view of one moment and must not be published."""
    def step(writer, n):
        if n % 3 == 0:
            leo = writer.log_end_offset
            writer.truncate_to(leo - 5)        # the last segment and part of the one before
            writer.append([(b"k", b"t%d" % i) for i in range(2)])
        else:
            _append_and_roll(writer)
    _run(tmp_path, watchdog, step, monkeypatch=monkeypatch)


def test_stable_run_accepts_only_head_removals_and_tail_additions():
    """The listing rule itself (LogLoader.stable_run): how many head segments of the first
    listing to drop, or None (list again)."""
    from kstore.log_loader import stable_run
    a = [0, 10, 20, 30]
    cases = [
        ((a, []), (a, []), 0),                          # unchanged
        (([], []), ([], []), 0),
        ((a, []), (a + [40, 50], []), 0),               # rolls
        ((a, []), ([20, 30, 40], []), 2),               # retention and a roll
        ((a, []), ([30], []), 3),
        ((a, []), ([40], []), None),                    # nothing of first left
        ((a, []), ([0, 10, 20], []), None),             # truncation: the tail went
        ((a, []), ([0, 10, 20, 25], []), None),         # truncation, then a roll below 30
        ((a, []), ([0, 10, 20, 25, 30, 40], []), None),  # a base added inside
        (([0, 10, 30], []), ([0, 10, 20, 30], []), None),  # first missed 20
        ((a, []), ([0, 30, 40], []), None),             # a swap retired 10 and 20
        ((a, []), ([10, 30], []), None),                # a hole in second
        (([], []), ([0], []), None),
        ((a, [0]), (a + [40], [0]), None),              # a swap in progress: equal only
        ((a, [0]), (a, [0]), 0),
        ((a, []), (a + [40], [0]), None),
    ]
    for first, second, want in cases:
        assert stable_run(first, second) == want, (first, second)
