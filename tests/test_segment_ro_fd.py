"""The .log descriptor a read-only log keeps open for its last segment between refreshes
(segment_ro.ReadOnlySegment, KEPT): the fast path's syscalls exactly, and the descriptor closed
when the segment rolls, is replaced (truncation), is deleted, is closed, or idles; bounded by
KEEP_MAX; never a stale read through it."""
from __future__ import annotations

import os
import threading
import time

import pytest

from kstore import segment_ro
from kstore.errors import SegmentGoneError, UnknownTopicError
from kstore.fileio import FileOps
from kstore.ro_refresh import DirWatch
from tests import thread_watchdog


class Ops(FileOps):
    """Counts the reader's opens, closes, fstats and path stats; tracks the open descriptors."""

    def __init__(self):
        self.fds: set[int] = set()
        self.reset()

    def reset(self):
        self.opens = self.closes = self.fstats = self.stat_paths = self.preads = 0

    def open(self, path, flags, mode=0o644):
        self.opens += 1
        fd = super().open(path, flags, mode)
        self.fds.add(fd)
        return fd

    def close(self, fd):
        self.closes += 1
        self.fds.discard(fd)
        return super().close(fd)

    def stat(self, fd):
        self.fstats += 1
        return super().stat(fd)

    def stat_path(self, path, follow_symlinks=False):
        self.stat_paths += 1
        return super().stat_path(path, follow_symlinks)

    def pread(self, fd, n, offset):
        self.preads += 1
        return super().pread(fd, n, offset)

    def log_fds(self):
        return {fd for fd in self.fds if os.readlink(f"/proc/self/fd/{fd}").endswith(".log")}


def _settle():
    time.sleep(DirWatch.SLACK_NS / 1e9 * 2)


def _recs(n, start=0):
    return [(b"%016d" % (start + i), b"v" * 100) for i in range(n)]


def _ro(open_log, log_dir):
    ops = Ops()
    ro = open_log(path=log_dir, read_only=True, io=ops)
    _settle()
    ro.refresh()                      # a trusted listing from here
    return ro, ops


def test_fast_path_is_one_dir_stat_one_fstat_and_the_preads_of_the_new_bytes(open_log, log_dir):
    lg = open_log()
    lg.append(_recs(10))
    ro, ops = _ro(open_log, log_dir)
    assert len(ops.log_fds()) == 1
    for i in range(1, 4):
        lg.append(_recs(1, 10 * i))
        ops.reset()
        ro.refresh()
        assert ro.log_end_offset == 10 + i
        assert (ops.opens, ops.closes, ops.stat_paths, ops.fstats, ops.preads) == (0, 0, 1, 1, 1)
    # a 1000-record batch (~127 KB): the probe page, the batch whole (its header's length),
    # a probe past it (the runway's zeros: nothing follows); it passes index.interval.bytes, so both index files are opened, their new entries
    # read once and the .log's identity checked by path (index entries read after a
    # replacement are dropped)
    lg.append(_recs(1000, 100))
    ro.refresh()
    lg.append(_recs(1000, 2000))
    ops.reset()
    ro.refresh()
    assert ro.log_end_offset == 2013
    assert (ops.opens, ops.closes, ops.stat_paths, ops.fstats, ops.preads) == (2, 2, 2, 1, 5)
    assert [r.offset for r in ro.read(2012)] == [2012]
    assert ro.read(1013, max_records=1)[0].key == b"%016d" % 2000


def test_the_descriptor_is_closed_on_log_close(open_log, log_dir):
    lg = open_log()
    lg.append(_recs(5))
    ro, ops = _ro(open_log, log_dir)
    before = segment_ro.KEPT.count
    assert len(ops.log_fds()) == 1
    ro.close()
    assert ops.log_fds() == set() and segment_ro.KEPT.count == before - 1


def test_roll_moves_the_descriptor_to_the_new_last_segment(open_log, log_dir):
    lg = open_log()
    lg.append(_recs(5))
    ro, ops = _ro(open_log, log_dir)
    (old,) = ops.log_fds()
    assert os.readlink(f"/proc/self/fd/{old}").endswith("00000000000000000000.log")
    lg.roll()
    lg.append(_recs(2, 5))
    ro.refresh()
    assert ro.log_end_offset == 7 and [r.offset for r in ro.read(5)] == [5, 6]
    (fd,) = ops.log_fds()
    assert os.readlink(f"/proc/self/fd/{fd}").endswith("00000000000000000005.log")


def test_truncation_replaces_the_file_and_the_old_descriptor_is_closed(open_log, log_dir):
    lg = open_log()
    for i in range(10):
        lg.append(_recs(1, i))
    ro, ops = _ro(open_log, log_dir)
    (old,) = ops.log_fds()
    old_ino = os.fstat(old).st_ino
    lg.truncate_to(4)
    lg.append([(b"new", b"x")])
    ro.refresh()
    assert ro.log_end_offset == 5
    assert [(r.offset, r.key) for r in ro.read(3)] == [(3, b"%016d" % 3), (4, b"new")]
    # the file was replaced: the kept descriptor (if any) is the new file's, never the old one
    assert all(os.fstat(fd).st_ino != old_ino for fd in ops.log_fds())
    assert os.stat(ro.segments[-1].log_path).st_ino != old_ino


def test_deleted_partition_closes_the_descriptor(open_log, log_dir):
    lg = open_log()
    lg.append(_recs(3))
    ro, ops = _ro(open_log, log_dir)
    lg.delete()
    with pytest.raises((UnknownTopicError, SegmentGoneError)):
        ro.refresh()
    ro.close()
    assert ops.log_fds() == set()


def test_an_idle_descriptor_is_closed_and_reopened_on_growth(open_log, log_dir, monkeypatch):
    monkeypatch.setattr(segment_ro, "KEEP_QUIET_S", 0.0)
    lg = open_log()
    lg.append(_recs(3))
    ro, ops = _ro(open_log, log_dir)
    lg.close()                       # trimmed: the length says nothing is new
    ro.refresh()
    assert ops.log_fds() == set()
    lg = open_log()
    lg.append(_recs(2, 3))
    ro.refresh()
    assert ro.log_end_offset == 5 and [r.offset for r in ro.read(3)] == [3, 4]


def test_kept_descriptors_are_bounded(open_log, tmp_path, monkeypatch):
    monkeypatch.setattr(segment_ro, "KEEP_MAX", segment_ro.KEPT.count + 2)
    ops = Ops()
    ros = []
    for i in range(4):
        d = str(tmp_path / f"t-{i}")
        open_log(path=d).append(_recs(2))
        ros.append(open_log(path=d, read_only=True, io=ops))
    assert len(ops.log_fds()) == 2
    for ro in ros:
        ro.refresh()
        assert ro.log_end_offset == 2
    for ro in ros:
        ro.close()
    assert ops.log_fds() == set()


def test_refresh_beside_appends_rolls_and_truncations(open_log, log_dir, watchdog):
    lg = open_log({"segment.bytes": 20000})
    lg.append(_recs(1))
    ro, ops = _ro(open_log, log_dir)
    stop = threading.Event()
    errors: list[BaseException] = []

    def reader():
        try:
            while not stop.is_set():
                ro.refresh()
                end = ro.log_end_offset
                recs = ro.read(max(0, end - 3), max_records=3)
                offs = [r.offset for r in recs]
                assert offs == list(range(offs[0], offs[0] + len(offs))) if offs else True
                for r in recs:
                    assert r.value == b"v" * 100 and r.key[:2] == b"00"
        except BaseException as e:          # noqa: BLE001 - reported below
            errors.append(e)
    ts = [threading.Thread(target=reader) for _ in range(2)]
    for t in ts:
        t.start()
    o = 1
    for i in range(600):
        lg.append(_recs(1, o))
        o += 1
        if i % 100 == 99:
            lg.truncate_to(o - 2)     # replaces the active segment's file
            o -= 2
    stop.set()
    thread_watchdog.join_all(ts, 30)
    assert not errors, errors[0]
    ro.refresh()
    assert ro.log_end_offset == lg.log_end_offset
    assert ro.log_end_offset == o
    mine = [(r.offset, r.key) for r in ro.read(0, max_records=10**6, max_bytes=1 << 30)]
    theirs = [(r.offset, r.key) for r in lg.read(0, max_records=10**6, max_bytes=1 << 30)]
    assert mine == theirs and len(mine) == o
    ro.close()
    assert ops.log_fds() == set()


def test_another_process_appends_rolls_truncates_and_deletes(tmp_path, watchdog):
    """A writer in another process: the reader's kept descriptor follows the last segment
    through rolls (segment.bytes 1200) and a truncation (file replaced), reads exactly the
    writer's records after each step, and holds no descriptor once the topic is deleted and
    the log closed."""
    import kstore
    from writer_process import WriterProcess
    watchdog(120)
    w = WriterProcess(str(tmp_path), str(tmp_path))
    try:
        w.run("m.create_topic('t', 1)",
              "for i in range(5): m.append('t', b'k%d' % i, b'v' * 90, partition=0, timestamp=NOW + i)")
        ops = Ops()
        ro = kstore.Log.open(str(tmp_path / "t-0"), read_only=True, io=ops)
        try:
            _settle()
            for step in range(40):
                w.run(f"m.append('t', b'k{5 + step}', b'v' * 90, partition=0, timestamp=NOW)")
                ro.refresh()
                assert ro.log_end_offset == 6 + step
                assert [(r.offset, r.key) for r in ro.read(5 + step)] == [(5 + step, b"k%d" % (5 + step))]
                fds = ops.log_fds()
                assert len(fds) <= 1
                for fd in fds:
                    assert os.fstat(fd).st_ino == os.stat(ro.segments[-1].log_path).st_ino
            assert len(ro.segments) >= 4
            w.run("m.log('t', 0).truncate_to(43)",
                  "m.append('t', b'new', b'x', partition=0, timestamp=NOW)")
            ro.refresh()
            assert ro.log_end_offset == 44
            assert [(r.offset, r.key) for r in ro.read(42)][:2] == [(42, b"k42"), (43, b"new")]
            for fd in ops.log_fds():
                assert os.fstat(fd).st_ino == os.stat(ro.segments[-1].log_path).st_ino
            w.run("m.delete_topic('t')")
            with pytest.raises((UnknownTopicError, SegmentGoneError)):
                for _ in range(3):
                    ro.refresh()
                    _settle()
        finally:
            ro.close()
        assert ops.log_fds() == set()
    finally:
        w.close()
