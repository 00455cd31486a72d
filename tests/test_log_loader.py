"""LogLoader: reopening, recovery after an unclean shutdown, missing or corrupt indexes, temporary
and swap files, the overflow split (Kafka's LogLoaderTest)."""
import os
import time

import pytest

import kstore
from kstore import _core

from log_helpers import NOW, files, values


# -- reopen and recovery ------------------------------------------------------------------------------
def test_reopen_after_close_roll_and_truncate(open_log, log_dir):
    cfg = {"segment.bytes": 500}
    log = open_log(cfg)
    for i in range(20):
        log.append([(b"k%d" % i, b"v%d" % i, NOW + i)])
    log.close()
    log = open_log(cfg)
    assert log.recovery_report == []             # clean: nothing recovered
    # the active segment's indexes are back at their maximum capacity; the files grow back to
    # the maximum size at their first entry (lazily, so opening many partitions stays cheap)
    active = log.active_segment
    assert active.offset_index.max_entries == 10485760 // 8
    assert active.time_index.max_entries == 10485760 // 12
    assert active.offset_index.length_on_disk == 10485760
    assert os.path.getsize(log.segments[0].offset_index_path) == 8 * log.segments[0].offset_index.entries
    assert log.log_end_offset == 20 and values(log) == [b"v%d" % i for i in range(20)]
    for i in range(20, 60):                      # enough to add index entries to the active segment
        log.append([(b"k%d" % i, b"x" * 200, NOW + i)])
    assert os.path.getsize(log.active_segment.offset_index_path) == 10485760
    log.truncate_to(13)
    log.close()
    log = open_log(cfg)
    assert log.log_end_offset == 13 and values(log)[-1] == b"v12"
    assert log.offset_for_timestamp(NOW + 12) == 12
    log.append([(None, b"new", NOW + 100)])
    assert log.read(13)[0].value == b"new"


def test_unclean_reopen_recovers_everything(open_log, log_dir):
    log = open_log({"segment.bytes": 500})
    for i in range(20):
        log.append([(None, b"v%d" % i, NOW + i)])
    log.close_handlers()                              # crash: no flush, no trim, no marker
    active = os.path.join(log_dir, f"{log.segments[-1].base_offset:020d}.log")
    assert os.path.getsize(active) > log.segments[-1].size      # preallocated zero tail
    log = open_log({"segment.bytes": 500})
    assert log.log_end_offset == 20
    assert values(log) == [b"v%d" % i for i in range(20)]
    assert len(log.recovery_report) == len(log.segments)


def test_tail_cut_at_every_byte_of_the_last_batch(tmp_path):
    src = str(tmp_path / "src-0")
    with kstore.Log.open(src) as log:
        for i in range(5):
            log.append([(b"k%d" % i, b"value-%d" % i, NOW + i, [("h", b"x")])])
        last_start = log.segments[0].size - (log.segments[0].size - sum(
            len(bytes(log.read_batches(o, 1))) for o in range(4)))
    data = open(os.path.join(src, "00000000000000000000.log"), "rb").read()
    for cut in range(last_start, len(data) + 1):
        d = str(tmp_path / f"cut{cut}-0")
        os.mkdir(d)
        with open(os.path.join(d, "00000000000000000000.log"), "wb") as f:
            f.write(data[:cut])
        with kstore.Log.open(d) as log:
            expect = 5 if cut == len(data) else 4
            assert log.log_end_offset == expect, cut
            assert [r.value for r in log.read(0)] == [b"value-%d" % i for i in range(expect)]
        assert os.path.getsize(os.path.join(d, "00000000000000000000.log")) == (cut if expect == 5 else last_start)


def test_corrupt_log_tail_and_index(tmp_path):
    """LogLoaderTest.testCorruptLog: random bytes appended to the active .log and .index."""
    import random
    rnd = random.Random(5)
    for trial in range(5):
        d = str(tmp_path / f"t{trial}-0")
        log = kstore.Log.open(d, {"index.interval.bytes": 1})
        for i in range(30):
            log.append([(None, b"v%d" % i, NOW + i)])
        log.close()
        for name in ("00000000000000000000.log", "00000000000000000000.index"):
            with open(os.path.join(d, name), "ab") as f:
                f.write(rnd.randbytes(rnd.randint(1, 1024)))
        os.unlink(os.path.join(d, ".kstore-clean-shutdown"))
        log = kstore.Log.open(d, {"index.interval.bytes": 1})
        assert log.log_end_offset == 30
        assert [r.offset for r in log.read(0, max_bytes=1 << 20)] == list(range(30))
        for i in range(30):
            assert log.read(i, 1)[0].offset == i
        log.close()


def test_missing_indexes_are_rebuilt(open_log, log_dir):
    """testIndexRebuild: deleted indexes are rebuilt even after a clean shutdown."""
    cfg = {"index.interval.bytes": 1, "segment.bytes": 300}
    log = open_log(cfg)
    for i in range(10):
        log.append([(None, b"v%d" % i, NOW + i * 10)])
    log.close()
    for name in os.listdir(log_dir):
        if name.endswith((".index", ".timeindex")):
            os.unlink(os.path.join(log_dir, name))
    log = open_log(cfg)
    for i in range(10):
        assert log.read(i, 1)[0].value == b"v%d" % i
        assert log.offset_for_timestamp(NOW + i * 10 - 1) == i
    assert all(s.offset_index.entries > 0 for s in log.segments if s.size)


def test_bogus_and_temporary_files_removed(open_log, log_dir):
    """testBogusIndexSegmentsAreRemoved / testOpenDeletesObsoleteFiles."""
    log = open_log()
    log.append([(None, b"a")])
    log.close()
    for name in ("00000000000000000099.index", "00000000000000000099.timeindex",
                 "00000000000000000005.log.deleted", "00000000000000000007.log.cleaned"):
        open(os.path.join(log_dir, name), "wb").close()
    log = open_log()
    assert files(log_dir) == ["00000000000000000000.index", "00000000000000000000.log",
                              "00000000000000000000.timeindex"]
    assert values(log) == [b"a"]


def test_log_end_less_than_start_after_reopen(tmp_path):
    """testLogEndLessThanStartAfterReopen: one empty segment at the log start offset."""
    d = str(tmp_path / "t-0")
    log = kstore.Log.open(d)
    for _i in range(5):
        log.append([(None, b"x")])
    log.close()
    # a partition no standalone Log used since its checkpoint (whose start a managed open
    # would carry over the checkpoint's: start_file.carry_to_manager)
    os.unlink(os.path.join(d, ".kstore-clean-shutdown"))
    log = kstore.Log.open(d, log_start_offset=10, recovery_point=5, clean_shutdown=False)
    assert [s.base_offset for s in log.segments] == [10]
    assert log.log_start_offset == log.log_end_offset == 10
    log.close()


def test_clean_shutdown_skips_recovery(tmp_path):
    """testCleanShutdownFile: no recovery even with recovery point 0."""
    d = str(tmp_path / "t-0")
    with kstore.Log.open(d) as log:
        log.append([(None, b"x")] * 3)
    log = kstore.Log.open(d, recovery_point=0, clean_shutdown=True)
    assert log.recovery_report == [] and log.recovery_point == 3
    log.close()


def test_split_on_offset_overflow(tmp_path):
    """testSplitOnOffsetOverflow: a segment holding offsets past base + 2^31-1 is split."""
    d = tmp_path / "t-0"
    d.mkdir()
    far = (1 << 31) + 10
    b = _core.BatchBuilder()
    raw = b""
    for base, n in ((0, 3), (100, 2), (far, 2), (far + 5, 1)):
        b.build([(None, b"o%d" % (base + i), NOW) for i in range(n)], 2, base, NOW, False, 0, 1 << 62, False, 0)
        raw += b.getvalue()
    (d / "00000000000000000000.log").write_bytes(raw)
    log = kstore.Log.open(str(d))
    assert [s.base_offset for s in log.segments] == [0, far]
    assert [r.offset for r in log.read(0, max_bytes=1 << 20)] == [0, 1, 2, 100, 101, far, far + 1, far + 5]
    assert log.read(far + 1, 1)[0].value == b"o%d" % (far + 1)
    assert log.log_end_offset == far + 6
    log.close()
    assert files(str(d)) == sorted(f"{o:020d}.{s}" for o in (0, far) for s in ("index", "log", "timeindex"))


def test_split_whose_first_batch_is_above_the_base_sets_the_log_start_after_it(tmp_path):
    """The split names each piece after its first batch: a segment 0 whose batches start at 5
    loads as [5, far] with log start 5 (Kafka computes it after recovery), and reads from 5."""
    d = tmp_path / "t-0"
    d.mkdir()
    far = (1 << 31) + 10
    b = _core.BatchBuilder()
    raw = b""
    for base in (5, far):
        b.build([(None, b"o%d" % base, NOW)], 2, base, NOW, False, 0, 1 << 62, False, 0)
        raw += b.getvalue()
    (d / "00000000000000000000.log").write_bytes(raw)
    log = kstore.Log.open(str(d))
    assert [s.base_offset for s in log.segments] == [5, far]
    assert log.log_start_offset == 5
    assert [(r.offset, r.value) for r in log] == [(5, b"o5"), (far, b"o%d" % far)]
    assert log.read(5, 1)[0].value == b"o5"
    log.close()


def test_crash_during_split_swap_recovers(tmp_path):
    """A .swap left by a split whose old segment is still there: the swap wins."""
    d = tmp_path / "t-0"
    d.mkdir()
    b = _core.BatchBuilder()
    b.build([(None, b"old", NOW)], 2, 0, NOW, False, 0, 1 << 62, False, 0)
    (d / "00000000000000000000.log").write_bytes(b.getvalue())
    b.build([(None, b"new", NOW)], 2, 0, NOW, False, 0, 1 << 62, False, 0)
    (d / "00000000000000000000.log.swap").write_bytes(b.getvalue())
    log = kstore.Log.open(str(d))
    assert values(log) == [b"new"]
    log.close()


# -- index zero tails: trimmed, never rebuilt (issue 14) ---------------------------------------------
def _count_rebuilds(monkeypatch):
    from kstore.segment import LogSegment
    calls = []
    orig = LogSegment._rebuild_indexes

    def counting(self):
        calls.append(self.log_path)
        return orig(self)
    monkeypatch.setattr(LogSegment, "_rebuild_indexes", counting)
    return calls


def _three_segments(open_log):
    log = open_log({"segment.bytes": 2000, "index.interval.bytes": 100})
    for i in range(60):
        log.append([(b"k%d" % i, b"v" * 80, NOW + i)])
    assert len(log.segments) >= 3
    log.close()


def test_a_sound_index_padded_with_zeros_is_trimmed_not_rebuilt(open_log, log_dir, monkeypatch):
    """A rolled segment's .index and .timeindex left at their preallocated length (zeros after
    the entries, as a writer killed while the segment was active leaves them) are trimmed to
    the sound entries on first use: no rebuild, the same bytes as before, exact lookups."""
    _three_segments(open_log)
    first = os.path.join(log_dir, "00000000000000000000")
    good = {suf: open(first + suf, "rb").read() for suf in (".index", ".timeindex")}
    assert len(good[".index"]) >= 16 and len(good[".timeindex"]) >= 24
    for suf in good:
        os.truncate(first + suf, 10485760 // (8 if suf == ".index" else 12) * (8 if suf == ".index" else 12))
    rebuilds = _count_rebuilds(monkeypatch)
    log = open_log({"segment.bytes": 2000, "index.interval.bytes": 100}, clean_shutdown=True,
                   recovery_point=10 ** 6)
    seg = log.segments[0]
    assert seg.offset_index.entries == len(good[".index"]) // 8
    assert seg.time_index.entries == len(good[".timeindex"]) // 12
    assert rebuilds == []
    for suf in good:
        assert open(first + suf, "rb").read() == good[suf]
    assert [r.offset for r in log.read(5, max_records=3)] == [5, 6, 7]
    assert log.offset_for_timestamp(NOW + 7) == 7


def test_entries_after_a_sound_prefix_that_are_not_zero_are_rebuilt(open_log, log_dir, monkeypatch):
    """Only an all-zero tail is padding: a non-zero entry after it is corruption (rebuilt)."""
    _three_segments(open_log)
    idx = os.path.join(log_dir, "00000000000000000000.index")
    good = open(idx, "rb").read()
    with open(idx, "ab") as f:
        f.write(bytes(800) + b"\x00\x00\x00\x01\x00\x00\x00\x02" + bytes(8))
    rebuilds = _count_rebuilds(monkeypatch)
    log = open_log({"segment.bytes": 2000, "index.interval.bytes": 100}, clean_shutdown=True,
                   recovery_point=10 ** 6)
    log.segments[0].load_offset_index()
    assert rebuilds == [os.path.join(log_dir, "00000000000000000000.log")]
    assert open(idx, "rb").read() == good          # the rebuild writes what the appends did
    assert [r.offset for r in log.read(5, max_records=1)] == [5]


def test_kill_9_of_a_writer_that_read_rolled_segments_rebuilds_no_index(tmp_path, monkeypatch, watchdog):
    """A LogManager in another process reads every partition (loading its rolled segments'
    indexes) and is killed with SIGKILL: the next (unclean) open rebuilds no index, and every
    rolled segment's index file holds exactly the bytes the writer left."""
    from writer_process import WriterProcess
    watchdog(120)
    w = WriterProcess(str(tmp_path), str(tmp_path))
    try:
        w.run("m.create_topic('t', 2)",
              "for i in range(120): m.append('t', b'k%d' % i, b'v' * 90, partition=i % 2, timestamp=NOW + i)")
        w.close()
        w = WriterProcess(str(tmp_path), str(tmp_path))
        w.run("lgs = [m.log('t', p) for p in (0, 1)]",
              "assert all(len(lg.segments) >= 5 for lg in lgs)",
              "assert [len(lg.read(0, 1000)) for lg in lgs] == [60, 60]",
              "[(s.offset_index.entries, s.time_index.entries) for lg in lgs for s in lg.segments]")
        before = {p: open(p, "rb").read() for p in
                  (os.path.join(tmp_path, d, f) for d in ("t-0", "t-1")
                   for f in os.listdir(os.path.join(tmp_path, d)) if f.endswith("index"))}
        # the clean open removes the marker on a thread (marker_gate.py); under load it may not
        # have run yet, and a kill then would leave a clean store: wait for it (the watchdog bounds)
        while os.path.exists(tmp_path / ".kafka_cleanshutdown"):
            time.sleep(0.01)
    finally:
        w.p.kill()
        w.p.wait(timeout=30)
    assert not os.path.exists(tmp_path / ".kafka_cleanshutdown")
    rebuilds = _count_rebuilds(monkeypatch)
    with kstore.LogManager(str(tmp_path), {"log.segment.bytes": "1200"}) as m:
        for p in (0, 1):
            lg = m.log("t", p)
            assert [r.offset for r in lg.read(0, 1000)] == list(range(60))
            for s in lg.segments:
                s.load_indexes()
            rolled = [s for s in lg.segments[:-1]]
            assert len(rolled) >= 4
            for s in rolled:
                for path in (s.offset_index_path, s.time_index_path):
                    assert open(path, "rb").read() == before[path], path
        assert rebuilds == []


def test_kill_9_reopen_keeps_the_active_segments_preallocated_indexes(tmp_path):
    """A writer killed with its active segment's indexes at their preallocated 10 MiB: the
    reopen rebuilds their entries in place (no truncation, the length kept, zeros after the
    entries), the entries are those a one-thread recovery computes, the .log keeps its zero
    runway, and the clean close trims them all."""
    import signal
    import subprocess
    import sys
    d = str(tmp_path / "t-0")
    code = ("import os, signal, sys, kstore\n"
            "lg = kstore.Log.open(sys.argv[1], {'segment.bytes': 1 << 20})\n"
            "for b in range(40):\n"
            "    lg.append([(b'k%d' % i, b'v' * 100, 1_700_000_000_000 + b) for i in range(100)])\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(kstore.__file__))}
    p = subprocess.run([sys.executable, "-c", code, d], env=env, timeout=60, cwd=str(tmp_path))
    assert p.returncode == -signal.SIGKILL
    idx, tidx = (os.path.join(d, "00000000000000000000" + s) for s in (".index", ".timeindex"))
    assert os.path.getsize(idx) == 10485760 and os.path.getsize(tidx) == 10485760 // 12 * 12
    with kstore.Log.open(d, {"segment.bytes": 1 << 20}) as lg:
        assert lg.log_end_offset == 4000
        [rep] = lg.recovery_report
        seg = lg.active_segment
        m = _core.Mapping.from_bytes(open(seg.log_path, "rb").read(seg.size))
        want = _core.recover_scan(m, seg.size, 0, 4096, 10485760 // 8, 10485760 // 12 - 1)
        assert seg.offset_index.entries == len(want.offset_entries) > 0
        assert os.path.getsize(idx) == 10485760 and os.path.getsize(tidx) == 10485760 // 12 * 12
        raw = open(idx, "rb").read()
        n = len(want.offset_entries) * 8
        assert raw[:n] == want.offset_entries.tobytes() and not any(raw[n:])
        # the .log's zero tail is kept as the runway of the next appends (not cut)
        with open(seg.log_path, "rb") as f:
            tail = f.read()[seg.size:]
        assert len(tail) > 0 and not any(tail)
        assert [r.offset for r in lg.read(2345, max_records=2)] == [2345, 2346]
        assert lg.offset_for_timestamp(1_700_000_000_000 + 17) == 1700
        lg.append([(b"k", b"after", 1_700_000_000_100)])
    # trimmed to its entries at the close: the append's among them (more than an interval
    # since the last entry's batch, as the scan counts: the writer goes on from recovery's index)
    assert os.path.getsize(idx) == n + 8
    with kstore.Log.open(d, {"segment.bytes": 1 << 20}) as lg:
        assert lg.recovery_report == [] and lg.log_end_offset == 4001
        assert os.path.getsize(idx) == 8 * lg.active_segment.offset_index.entries


# -- a sound index is never rebuilt --------------------------------------------------------------
def test_recovery_leaves_sound_indexes_unwritten(tmp_path):
    """After a crash the recovered segments' indexes already hold what recovery computes: they
    are read and kept (no pwrite, no truncate), byte for byte; a damaged one is rewritten."""
    from kstore.fileio import FileOps

    class Writes(FileOps):
        def __init__(self):
            self.fds, self.writes = {}, []

        def open(self, path, flags, mode=0o644):
            fd = super().open(path, flags, mode)
            self.fds[fd] = path
            return fd

        def pwrite(self, fd, data, offset):
            self.writes.append(self.fds.get(fd))
            return super().pwrite(fd, data, offset)

        def truncate(self, fd, length):
            self.writes.append(self.fds.get(fd))
            return super().truncate(fd, length)

    d = str(tmp_path / "t-0")
    cfg = {"segment.bytes": 4000, "index.interval.bytes": 100}
    lg = kstore.Log.open(d, cfg, recovery_point=0, clean_shutdown=False)
    for i in range(150):
        lg.append([(b"k%d" % i, b"v" * 40, NOW + i)])
    rp = lg.segments[-2].base_offset
    lg.close_handlers()                                   # kill -9: active indexes preallocated
    idx = [p for n in sorted(os.listdir(d)) if n.endswith("index") for p in [os.path.join(d, n)]]
    before = {p: open(p, "rb").read() for p in idx}
    io = Writes()
    lg = kstore.Log.open(d, cfg, recovery_point=rp, clean_shutdown=False, io=io)
    try:
        assert len(lg.recovery_report) == 2
        assert [p for p in io.writes if p and p.endswith("index")] == []
        assert {p: open(p, "rb").read() for p in idx} == before
        assert os.path.getsize(lg.active_segment.offset_index_path) == 10485760
        assert lg.segments[-2].offset_index.entries == os.path.getsize(lg.segments[-2].offset_index_path) // 8 > 3
        assert [r.offset for r in lg.read(0, 10 ** 6)] == list(range(150))
        assert lg.offset_for_timestamp(NOW + 120) == 120
    finally:
        lg.close_handlers()
    # one entry damaged (the second segment's, positions no longer increasing): rewritten
    p = os.path.join(d, f"{rp:020d}.index")
    raw = bytearray(open(p, "rb").read())
    raw[12:16] = (0).to_bytes(4, "big")
    open(p, "wb").write(bytes(raw))
    io = Writes()
    lg = kstore.Log.open(d, cfg, recovery_point=rp, clean_shutdown=False, io=io)
    try:
        assert p in io.writes
        assert open(p, "rb").read() == before[p]
        assert [r.offset for r in lg.read(0, 10 ** 6)] == list(range(150))
    finally:
        lg.close()


def test_a_managed_life_ends_a_standalone_clean_shutdown_marker(tmp_path, watchdog):
    """A LogManager's open of a partition a standalone Log closed cleanly removes that Log's
    clean-shutdown marker: a later standalone open after the manager's process was killed
    recovers the log (the marker used to survive the managed life: that open skipped recovery
    and its read of the killed writer's untrimmed active segment raised CorruptRecordError)."""
    from writer_process import WriterProcess
    watchdog(120)
    d = str(tmp_path / "store")
    part = os.path.join(d, "t-0")
    with kstore.Log.open(part) as lg:
        for i in range(10):
            lg.append([(None, b"v%d" % i, NOW + i)])
    assert ".kstore-clean-shutdown" in os.listdir(part)
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run("lg = m.log('t', 0)", "assert lg.truncate_to(2)",
              "lg.append([(None, b'w%d' % i) for i in range(3)])")
        assert ".kstore-clean-shutdown" not in os.listdir(part)
    finally:
        w.p.kill()                       # kill -9: no close, the active segment untrimmed
        w.p.wait(30)
    with kstore.Log.open(part) as lg:
        assert (lg.log_start_offset, lg.log_end_offset) == (0, 5)
        assert values(lg) == [b"v0", b"v1", b"w0", b"w1", b"w2"]


@pytest.mark.parametrize("content", [b'{"version": 0, "log_start_offset": -5}', b'{"log_start_offset": true}',
                                     b'{"log_start_offset": 3}' + b" " * 5000])
def test_a_marker_with_a_bad_start_is_not_trusted(tmp_path, content, caplog):
    """The clean-shutdown marker is read as the start file is (bounded, the start checked): one
    whose start is negative, not an int, or that is over 4 KiB is ignored with a warning and
    the log recovered, its start from its segments (was: a negative start was taken as is)."""
    d = str(tmp_path / "t-0")
    with kstore.Log.open(d) as lg:
        lg.append([(None, b"v")] * 5)
    with open(os.path.join(d, ".kstore-clean-shutdown"), "wb") as f:
        f.write(content)
    with caplog.at_level("WARNING", logger="kstore"):
        with kstore.Log.open(d) as lg:
            assert (lg.log_start_offset, lg.log_end_offset) == (0, 5)
    assert "ignoring unreadable clean-shutdown marker" in caplog.text
