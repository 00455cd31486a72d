"""LogCleaner: Kafka's LogCleanerTest cases in our words (facts §10 item 12), a property test,
crashes at every swap stage and kill -9 during cleaning, uncleanable partitions."""
import os
import struct

import pytest
from hypothesis import given, settings, strategies as st

import kstore
from kstore import _core
from kstore.cleaner import CleanerStats, group_segments
from kstore.clock import MockTime
from kstore.manager import LogManager
from kstore.scheduler import MockScheduler

from cleaner_helpers import contents, latest, mgr

NOW = 1_700_000_000_000
DAY = 86_400_000


def append_cycling_keys(m, n, keys, key_format):
    """n single-record appends to c-0, record i keyed key_format % (i % keys) with value v<i>;
    returns [(offset, key, value)]."""
    written = []
    for i in range(n):
        k = key_format % (i % keys)
        md = m.append("c", k, b"v%d" % i, partition=0, timestamp=NOW)
        written.append((md.offset, k, b"v%d" % i))
    return written


def test_compaction_keeps_latest_value_of_each_key_at_its_offset(tmp_path):
    m, t = mgr(tmp_path)
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact"})
        written = append_cycling_keys(m, 400, 17, b"k%d")
        lg = m.log("c", 0)
        active_base = lg.active_segment.base_offset
        stats = m.clean_now()
        assert len(stats) == 1 and stats[0].records_removed > 0
        got = contents(lg)
        {k: ov for k, ov in latest([w for w in written if w[0] < active_base]).items()}
        # below the active segment: exactly the latest of each key (as of the cleaned range)
        cleaned = [g for g in got if g[0] < active_base]
        assert len(cleaned) <= 17
        for off, k, _v in cleaned:
            later = [w for w in written if w[1] == k and off < w[0] < active_base]
            assert not later, f"{k} at {off} survived a later value"
        # every key's latest value overall is still readable, at its original offset
        final = {k: (off, v) for off, k, v in got}
        assert final == {k: (off, v) for k, (off, v) in latest(written).items()}
        assert [g[0] for g in got] == sorted(g[0] for g in got)
        assert not [n for n in os.listdir(lg.dir) if n.endswith((".cleaned", ".swap"))]


def test_unchanged_batches_are_copied_byte_for_byte(tmp_path):
    m, t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact"})
        lg = m.log("c", 0)
        lg.append([(b"a", b"1", NOW), (b"b", b"2", NOW)])     # batch 1: both superseded later
        lg.append([(b"c", b"3", NOW)])                        # batch 2: unique key, untouched
        raw2 = bytes(lg.read_batches(2, 1))
        lg.append([(b"a", b"4", NOW), (b"b", b"5", NOW)])
        lg.roll()
        m.clean_now()
        batches = bytes(lg.read_batches(0, 1 << 20))
        assert raw2 in batches
        assert [(r.offset, r.value) for r in lg.read(0)] == [(2, b"3"), (3, b"4"), (4, b"5")]


def test_rebuilt_batch_keeps_base_and_last_offsets(tmp_path):
    m, t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact"})
        lg = m.log("c", 0)
        lg.append([(b"x", b"old", NOW), (b"y", b"keep", NOW), (b"z", b"old", NOW)])
        lg.append([(b"x", b"new", NOW), (b"z", b"new", NOW)])
        lg.roll()
        m.clean_now()
        raw = bytes(lg.read_batches(0, 1 << 20))
        base, = struct.unpack(">q", raw[:8])
        delta, = struct.unpack(">i", raw[23:27])
        count, = struct.unpack(">i", raw[57:61])
        assert (base, base + delta, count) == (0, 2, 1)            # offsets 0..2 kept, one record
        assert struct.unpack(">I", raw[17:21])[0] == kstore.crc32c(raw[21:struct.unpack(">i", raw[8:12])[0] + 12])
        assert [(r.offset, r.value) for r in lg.read(0)] == [(1, b"keep"), (3, b"new"), (4, b"new")]


@pytest.mark.parametrize("compression", ["uncompressed", "gzip"])
def test_clean_tombstone_survives_until_the_delete_horizon(tmp_path, compression):
    """testCleanTombstone: a tombstone stays for delete.retention.ms, then goes."""
    m, t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": DAY,
                                "min.cleanable.dirty.ratio": "0", "compression.type": compression})
        lg = m.log("c", 0)
        lg.append([(b"k", b"v1", NOW), (b"j", b"v", NOW)])
        lg.append([(b"k", None, NOW)])               # tombstone for k
        lg.roll()
        m.clean_now()
        got = [(r.offset, r.key, r.value) for r in lg.read(0)]
        assert got == [(1, b"j", b"v"), (2, b"k", None)]
        raw = bytes(lg.read_batches(2, 1))
        attrs, = struct.unpack(">h", raw[21:23])
        assert attrs & 64                              # delete-horizon bit set
        assert struct.unpack(">q", raw[27:35])[0] == NOW + DAY
        assert lg.read(2)[0].timestamp == NOW          # record timestamps unchanged
        lg.append([(b"other", b"x", NOW)])
        lg.roll()
        t.advance(DAY - 1)
        m.clean_now()
        assert (2, b"k", None) in [(r.offset, r.key, r.value) for r in lg.read(0)]
        t.advance(2)
        lg.append([(b"other", b"y", NOW)])
        lg.roll()
        m.clean_now()
        assert b"k" not in [r.key for r in lg.read(0)]


def test_unkeyed_records_are_dropped(tmp_path):
    m, t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1)                       # written under delete, then compacted
        lg = m.log("c", 0)
        lg.append([(None, b"no key", NOW), (b"k", b"v", NOW)])
        lg.roll()
        m.alter_topic_config("c", {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"})
        m.clean_now()
        assert [(r.offset, r.key) for r in lg.read(0)] == [(1, b"k")]


def test_dirty_ratio_and_min_compaction_lag(tmp_path):
    m, t = mgr(tmp_path)
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.compaction.lag.ms": 60_000})
        for i in range(100):
            m.append("c", b"k%d" % (i % 5), b"v" * 20, partition=0, timestamp=t.milliseconds())
        assert m.clean_now() == []                  # everything is younger than the lag
        t.advance(60_001)
        m.append("c", b"k0", b"x", partition=0, timestamp=t.milliseconds())
        assert len(m.clean_now()) == 1
        # right after cleaning the dirty ratio is 0: nothing to do
        assert m.clean_now() == []


def test_compact_delete_applies_retention_too(tmp_path):
    m, t = mgr(tmp_path)
    with m:
        m.create_topic("cd", 1, {"cleanup.policy": "compact,delete", "retention.ms": 1000})
        for i in range(60):
            m.append("cd", b"k%d" % i, b"v" * 30, partition=0, timestamp=NOW)
        lg = m.log("cd", 0)
        assert m.cleanup_logs() == 0                 # LogManager retention skips compacted logs
        t.advance(5000)
        m.clean_now()
        assert lg.log_start_offset == lg.log_end_offset


def test_uncleanable_partition_does_not_stop_the_others(tmp_path):
    """KAFKA-7215: an error marks the partition uncleanable; the others are cleaned."""
    m, t = mgr(tmp_path, {"log.segment.bytes": "2000"})
    with m:
        for name in ("bad", "good"):
            m.create_topic(name, 1, {"cleanup.policy": "compact"})
            for i in range(200):
                m.append(name, b"k%d" % (i % 3), b"v%d" % i, partition=0, timestamp=NOW)
        bad = m.log("bad", 0).segments[1]
        m.log("bad", 0).read(0)   # map it
        with open(bad.log_path, "r+b") as f:       # corrupt a record inside a closed segment
            f.seek(70)
            f.write(b"\xff\xff\xff")
        stats = m.clean_now()
        assert [s.topic for s in stats] == ["good"]
        assert ("bad", 0) in m.uncleanable_partitions()
        assert "CRC" in m.uncleanable_partitions()[("bad", 0)] or "Corrupt" in m.uncleanable_partitions()[("bad", 0)]


def test_clean_now_waits_for_a_clean_under_way_in_a_cleaner_thread(tmp_path):
    """A clean a background thread holds must finish before clean_now returns: when it returns,
    every key below the active segment has one record (this raced in the clickstream example)."""
    import threading
    import time as _t
    m, t = mgr(tmp_path)
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact"})
        written = append_cycling_keys(m, 300, 7, b"k%d")
        lg = m.log("c", 0)
        active_base = lg.active_segment.base_offset
        cleaner = m.cleaner
        ltc = cleaner.grab_filthiest()            # as thread 0 would, then slowly cleans
        assert ltc.tp == ("c", 0)

        def background():
            _t.sleep(0.3)
            with cleaner._cleaners[0].lock:
                cleaner._clean(cleaner._cleaners[0], ltc)

        th = threading.Thread(target=background)
        th.start()
        m.clean_now()
        below = [(o, k) for o, k, _ in contents(lg) if o < active_base]
        th.join()
        keys_below = {k for o, k, _ in written if o < active_base}
        assert sorted(k for _, k in below) == sorted(keys_below)        # one record per key
        assert dict((k, o) for o, k in below) == {k: o for o, k, _ in written if o < active_base}


def test_clean_now_and_cleaner_thread_never_share_the_offset_map_at_once(tmp_path, monkeypatch):
    """clean_now runs on thread 0's Cleaner; each clean holds that Cleaner's lock."""
    from kstore import cleaner as cleaner_mod
    seen = []
    real = cleaner_mod.Cleaner.clean

    def checked(self, ltc):
        seen.append(self.lock.locked())
        return real(self, ltc)

    monkeypatch.setattr(cleaner_mod.Cleaner, "clean", checked)
    m, t = mgr(tmp_path)
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact"})
        append_cycling_keys(m, 100, 5, b"k%d")
        m.clean_now()
    assert seen == [True]


def test_segment_grouping_respects_sizes_and_offset_span(tmp_path):
    """testSegmentGroupingWithSparseOffsets: groups never span more than 2^31-1 offsets."""
    d = tmp_path / "t-0"
    d.mkdir()
    far = (1 << 31) + 10
    b = _core.BatchBuilder()
    raw = b""
    for base in (0, 1, 2, far, far + 1):
        b.build([(b"k", b"v", NOW)], 2, base, NOW, False, 0, 1 << 62, False, 0)
        raw += b.getvalue()
    (d / "00000000000000000000.log").write_bytes(raw)
    lg = kstore.Log.open(str(d), {"cleanup.policy": "compact"})
    lg.roll()
    segs = lg.segments[:-1]
    assert [s.base_offset for s in segs] == [0, far]
    groups = group_segments(segs, lg.config, far + 2)
    assert [[s.base_offset for s in g] for g in groups] == [[0], [far]]
    lg.close()
    # size: consecutive segments are grouped only while their .log sizes fit segment.bytes
    d2 = str(tmp_path / "u-0")
    lg = kstore.Log.open(d2, {"segment.bytes": 300, "cleanup.policy": "compact"})
    for _i in range(6):
        lg.append([(b"k", b"x" * 100, NOW)])
    segs = lg.segments[:-1]
    sizes = [s.size for s in segs]
    groups = group_segments(segs, kstore.LogConfig({"segment.bytes": sizes[0] * 2}), 10)
    assert [len(g) for g in groups] == [2] * (len(segs) // 2) + [1] * (len(segs) % 2)
    lg.close()


@pytest.mark.parametrize("stage", ["cleaned", "some_swapped", "all_swapped", "old_deleted"])
def test_recovery_after_crash_at_each_swap_stage(tmp_path, stage):
    """testRecoveryAfterCrash: a crash anywhere in .cleaned → .swap → rename is all-or-nothing."""
    m, t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    m.create_topic("c", 1, {"cleanup.policy": "compact"})
    lg = m.log("c", 0)
    for i in range(50):
        lg.append([(b"k%d" % (i % 5), b"v%d" % i, NOW)])
    lg.roll()
    for i in range(50, 55):
        lg.append([(b"k%d" % (i % 5), b"v%d" % i, NOW)])
    before = {k: v for _o, k, v in contents(lg)}
    d = lg.dir
    # run a clean but stop it at the chosen stage by intercepting replace_segments
    orig = lg.replace_segments

    def crashing(new_base, old):
        names = [f"{new_base:020d}{s}" for s in (".timeindex", ".index", ".log")]
        if stage == "cleaned":
            raise SystemExit
        for i, n in enumerate(names):
            if stage == "some_swapped" and i == 2:
                break
            os.rename(os.path.join(d, n + ".cleaned"), os.path.join(d, n + ".swap"))
        if stage in ("some_swapped", "all_swapped"):
            raise SystemExit
        for s in old:
            for suf in (".log", ".index", ".timeindex"):
                p = os.path.join(d, f"{s.base_offset:020d}{suf}")
                os.rename(p, p + ".deleted")
        raise SystemExit
    lg.replace_segments = crashing
    with pytest.raises(SystemExit):
        m.clean_now()
    lg.replace_segments = orig
    for x in m.logs().values():
        x.close_handlers()
    m._release_locks()
    m._closed = True
    m2, _ = mgr(tmp_path, t=t)
    with m2:
        names = os.listdir(d)
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))], names
        after = {k: v for _o, k, v in contents(m2.log("c", 0))}
        assert after == before


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 12), st.booleans()), min_size=1, max_size=120),
       st.integers(1, 4))
def test_property_latest_value_per_key_and_tombstones_past_horizon(tmp_path_factory, ops, batch):
    root = tmp_path_factory.mktemp("prop")
    t = MockTime(NOW)
    m = LogManager(str(root), {"log.segment.bytes": "600", "log.segment.delete.delay.ms": "0"},
                   time=t, scheduler=MockScheduler(t))
    with m:
        m.create_topic("p", 1, {"cleanup.policy": "compact", "delete.retention.ms": 1000,
                                "min.cleanable.dirty.ratio": "0"})
        lg = m.log("p", 0)
        written = []
        for i in range(0, len(ops), batch):
            recs = [(b"key%d" % k, None if tomb else b"val%d" % (i + j), NOW)
                    for j, (k, tomb) in enumerate(ops[i:i + batch])]
            info = lg.append(recs)
            written += [(info.first_offset + j, r[0], r[1]) for j, r in enumerate(recs)]
        lg.roll()                                       # everything cleanable
        m.clean_now()
        want = latest(written)
        got = latest(contents(lg))
        # every key's latest value (or its tombstone, still within the horizon) at its offset
        assert got == want
        t.advance(2000)                                 # past the horizon
        lg.append([(b"zz", b"filler", NOW)])
        lg.roll()
        m.clean_now()
        m.clean_now()
        got = latest(contents(lg))
        want_live = {k: v for k, v in latest(written + [(lg.log_end_offset - 1, b"zz", b"filler")]).items()
                     if v[1] is not None}
        assert {k: v for k, v in got.items() if v[1] is not None} == want_live
        assert all(v[1] is not None for v in got.values()), "tombstones past the horizon remain"


def test_full_dedupe_map_cleans_in_several_passes(tmp_path):
    """When the map fills, a pass cleans up to the last offset it covers; the next continues."""
    m, t = mgr(tmp_path, {"log.cleaner.dedupe.buffer.size": str(24 * 40),
                          "log.cleaner.io.buffer.load.factor": "0.5", "log.segment.bytes": "3000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0"})
        written = append_cycling_keys(m, 600, 60, b"k%02d")
        lg = m.log("c", 0)
        active = lg.active_segment.base_offset
        ends = []
        for _ in range(100):           # 20 keys per pass: about 30 passes
            stats = m.clean_now()
            if not stats:
                break
            ends.append(stats[0].end_offset)
            assert stats[0].map_entries <= 20
        assert len(ends) > 1 and ends == sorted(ends)          # several passes, moving forward
        assert m.cleaner.first_dirty_offset(("c", 0)) == active
        assert latest(contents(lg)) == latest(written)
        below = [o for o, _k, _v in contents(lg) if o < active]
        assert len(below) <= 60


@pytest.mark.parametrize("config", [
    {"compression.type": "gzip"},
    {"message.format.version": "0.10.2"},
    {"message.format.version": "0.10.2", "compression.type": "gzip"},
])
def test_compaction_of_compressed_and_legacy_formats(tmp_path, config):
    m, t = mgr(tmp_path, {"log.segment.bytes": "4000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0", **config})
        lg = m.log("c", 0)
        written = []
        for i in range(0, 300, 3):
            recs = [(b"k%d" % ((i + j) % 7), b"v%d" % (i + j), NOW) for j in range(3)]
            info = lg.append(recs)
            written += [(info.first_offset + j, r[0], r[1]) for j, r in enumerate(recs)]
        before = lg.size
        m.clean_now()
        assert latest(contents(lg)) == latest(written)
        assert lg.size < before
        offsets = [r.offset for r in lg]
        assert offsets == sorted(set(offsets))
        if "message.format.version" not in config:
            # v2 compressed batches are rebuilt: only the latest of each key below the active segment
            active = lg.active_segment.base_offset
            assert len([o for o in offsets if o < active]) <= 7


def test_throttler_caps_the_rate():
    from kstore.cleaner import Throttler
    th = Throttler(10_000_000)          # 10 MB/s
    t0 = __import__("time").monotonic()
    for _ in range(40):
        th.maybe_throttle(100_000)      # 4 MB in total
    elapsed = __import__("time").monotonic() - t0
    assert 0.35 <= elapsed < 2.0        # 4 MB at 10 MB/s is 0.4 s


# -- races with the cleaner (issue 12, defect 13) ---------------------------------------------------
def _race_io(action):
    """FileOps that runs action() once, when the cleaner opens its first .cleaned output."""
    from kstore.fileio import FileOps

    class RaceIO(FileOps):
        fired = False

        def open(self, path, flags, mode=0o644):
            if not RaceIO.fired and path.endswith(".log.cleaned"):
                RaceIO.fired = True
                action()
            return super().open(path, flags, mode)
    return RaceIO()


@pytest.mark.parametrize("race", ["delete_topic", "delete_records", "retention"])
def test_cleaner_racing_deletion_aborts_the_clean_and_keeps_the_dir_online(tmp_path, race, caplog):
    """A segment renamed or removed under the cleaner (retention, delete_records, topic
    deletion) raised FileNotFoundError and took the whole log dir offline."""
    import logging
    caplog.set_level(logging.INFO)
    box = {}

    def action():
        m, lg = box["m"], box["m"].log("c", 0)
        if race == "delete_topic":
            m.delete_topic("c")
        elif race == "delete_records":
            lg.delete_records(lg.segments[2].base_offset)
            box["s"].tick()                  # file.delete.delay.ms=0: the unlinks run now
        else:
            m.alter_topic_config("c", {"cleanup.policy": "compact,delete", "retention.ms": 0})
            box["t"].sleep(1000)
            assert lg.delete_old_segments() > 0
            box["s"].tick()
    t = MockTime(NOW)
    s = MockScheduler(t)
    box["s"], box["t"] = s, t
    m = LogManager(str(tmp_path), {"log.segment.bytes": "1000", "log.segment.delete.delay.ms": "0"},
                   time=t, scheduler=s, io=_race_io(action))
    box["m"] = m
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact"})
        m.create_topic("other", 1)
        append_cycling_keys(m, 300, 7, b"k%d")
        assert m.clean_now() == []                       # aborted, not failed
        assert m.offline_dirs == {}
        assert m.uncleanable_partitions() == {}
        assert m.append("other", b"k", b"still writable").offset == 0
        assert any("aborted" in r.getMessage() or "changed during cleaning" in r.getMessage()
                   for r in caplog.records)
        assert [r for r in caplog.records if r.levelno > logging.INFO] == []
        if race != "delete_topic":
            lg = m.log("c", 0)
            assert not [n for n in os.listdir(lg.dir) if n.endswith((".cleaned", ".swap"))]
            # retried: the next pass cleans what is left (retention left nothing to clean)
            assert len(m.clean_now()) == (1 if race == "delete_records" else 0)
            assert m.offline_dirs == {}




def test_cleaner_stats_rate():
    """A clean's read rate in MB/s (Kafka's cleaner log line); 0 for a clean that took no time."""
    assert CleanerStats(bytes_read=3_000_000, duration_ms=1500).mb_per_s == 2.0
    assert CleanerStats(bytes_read=10).mb_per_s == 0.0


def test_a_clean_whose_dir_goes_offline_midway_writes_nothing_more_there(tmp_path, monkeypatch):
    """Kafka closes an offline dir's logs (handleLogDirFailure: closeHandlers), so a clean in
    progress there fails at its next read or write. When another log's disk error takes the
    dir offline during a clean, the clean stops at its next step: no swap, no checkpoint, no
    further chunk, and the .cleaned files are left for the next load (Kafka's), not removed; the
    log is not marked uncleanable. Before, the clean went on and swapped its segments in on the
    failed disk. At the restart the load removes the .cleaned files and the log reads as it did."""
    m, _t = mgr(tmp_path)
    d = str(tmp_path)
    m.create_topic("c", 1, {"cleanup.policy": "compact"})
    append_cycling_keys(m, 400, 17, b"k%d")
    lg = m.log("c", 0)
    before = contents(lg)
    files = {n: open(os.path.join(d, "c-0", n), "rb").read() for n in os.listdir(os.path.join(d, "c-0"))
             if n != ".kstore-notify"}
    checkpoint = open(os.path.join(d, "cleaner-offset-checkpoint"), "rb").read() \
        if os.path.exists(os.path.join(d, "cleaner-offset-checkpoint")) else None
    real = _core.filter_batches
    calls = []

    def failing_disk_midway(*a):
        calls.append(1)
        if len(calls) == 1:      # another log's write failed meanwhile: the dir goes offline
            m.log_dir_failure_channel.mark_offline(d, OSError(5, "Input/output error (injected)"))
        return real(*a)
    monkeypatch.setattr(_core, "filter_batches", failing_disk_midway)
    assert m.clean_now() == []
    assert len(calls) == 1 and list(m.offline_dirs) == [d]
    assert m.uncleanable_partitions() == {}
    after = {n: open(os.path.join(d, "c-0", n), "rb").read() for n in os.listdir(os.path.join(d, "c-0"))
             if n != ".kstore-notify"}
    # the chunk in flight was written; the swap was refused
    assert sorted(n for n in after if n.endswith(".cleaned")) == [
        "00000000000000000000.index.cleaned", "00000000000000000000.log.cleaned",
        "00000000000000000000.timeindex.cleaned"]
    assert {n: b for n, b in after.items() if not n.endswith(".cleaned")} == files
    cp = os.path.join(d, "cleaner-offset-checkpoint")
    assert (open(cp, "rb").read() if os.path.exists(cp) else None) == checkpoint
    assert contents(lg) == before
    m.close()
    monkeypatch.setattr(_core, "filter_batches", real)
    m, _t = mgr(tmp_path)
    with m:
        assert not [n for n in os.listdir(os.path.join(d, "c-0")) if n.endswith(".cleaned")]
        assert contents(m.log("c", 0)) == before


# -- transactions (Kafka's CleanedTransactionMetadata; LogCleanerTest's testAbortMarkerRemoval,
# testCommitMarkerRemoval, testAbortedTransactionsAreNotCleanedAsCommitted, and the LSO bound) ----
#: batch timestamps of producers idle past producer.id.expiration.ms (a day): Kafka's cleaner keeps
#: no last batch of theirs (test_an_active_producers_last_batch_is_kept_empty has the active case)
IDLE = NOW - 86_400_000
def txn_batches_of(lg):
    from kstore.read_committed import transactional_batches
    return list(transactional_batches(lg, lg.log_start_offset))


def committed_view(d, topic):
    """What a read_committed consumer reads of topic-0 from the start, in one process."""
    out = []
    with kstore.Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed") as c:
        c.assign([kstore.TopicPartition(topic, 0)])
        while True:
            got = c.poll(200).get(kstore.TopicPartition(topic, 0), [])
            if not got:
                return out
            out += [(r.offset, r.key, r.value) for r in got]


def test_cleaning_transactions_as_kafka(tmp_path):
    """An aborted transaction's value never replaces a committed one (it stays out of the dedupe
    map) and its batch goes; nothing at or past the last stable offset is cleaned; a marker stays
    while its transaction has data, then gets a delete horizon, then goes once it has passed.
    Before, the aborted value won the key: the committed value was deleted and a read_committed
    reader found no value for the key at all."""
    from kstore.read_committed import ABORT, COMMIT, DATA
    from batch_helpers import txn_batch
    m, t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": "1000",
                                "min.cleanable.dirty.ratio": "0.01"})
        lg = m.log("c", 0)
        lg.append([(b"k1", b"a")])                                   # 0
        lg.append_batches(txn_batch(0, 7, [b"aborted"], ts=IDLE))             # 1  k=b"k" pid 7
        lg.append_batches(txn_batch(0, 8, [b"c8"], ts=IDLE))                  # 2  k=b"k" pid 8
        lg.append_batches(txn_batch(0, 7, control=ABORT, ts=IDLE))            # 3
        lg.append_batches(txn_batch(0, 8, control=COMMIT, ts=IDLE))           # 4
        lg.append([(b"k2", b"plain5")])                              # 5
        lg.roll()
        lg.append_batches(txn_batch(0, 9, [b"open6"], ts=IDLE))               # 6  pid 9, open: the LSO
        lg.append([(b"k2", b"newer7")])                              # 7
        lg.roll()
        assert len(m.clean_now()) == 1
        # the segment holding the LSO (base 6) and later ones are not cleaned: k2 at 5 stays
        assert contents(lg) == [(0, b"k1", b"a"), (2, b"k", b"c8"), (5, b"k2", b"plain5"),
                                (6, b"k", b"open6"), (7, b"k2", b"newer7")]
        # the aborted batch went; the markers stay: their transactions had data in this clean
        assert txn_batches_of(lg) == [(2, 2, 8, DATA), (3, 3, 7, ABORT), (4, 4, 8, COMMIT),
                                      (6, 6, 9, DATA)]
        assert committed_view(str(tmp_path), "c") == [(0, b"k1", b"a"), (2, b"k", b"c8"),
                                                      (5, b"k2", b"plain5")]
        lg.append_batches(txn_batch(0, 9, control=COMMIT, ts=IDLE))           # 8: the LSO is the end
        lg.append([(b"k3", b"x9")])                                  # 9
        lg.roll()
        assert len(m.clean_now()) == 1
        # pid 8's c8 (key b"k") gave way to open6 (now committed), k2's 5 to 7
        assert contents(lg) == [(0, b"k1", b"a"), (6, b"k", b"open6"), (7, b"k2", b"newer7"),
                                (9, b"k3", b"x9")]
        # pid 7's ABORT has no data left: it stays, with a delete horizon; pid 8's COMMIT does
        # not get one yet: this clean still met c8's batch (Kafka's onBatchRead counts it)
        assert txn_batches_of(lg) == [(3, 3, 7, ABORT), (4, 4, 8, COMMIT), (6, 6, 9, DATA),
                                      (8, 8, 9, COMMIT)]

        def horizon(offset):
            view = lg.read_batches(offset, 1 << 20)
            attrs, base_ts = struct.unpack_from(">h", view, 21)[0], struct.unpack_from(">q", view, 27)[0]
            return base_ts if attrs & 0x40 else None
        assert (horizon(3), horizon(4), horizon(8)) == (NOW + 1000, None, None)

        def clean_at(ms, offset):
            t.sleep(ms - (t.milliseconds() - NOW))
            lg.append([(b"k3", b"x%d" % offset)])                    # dirt, so it is cleaned
            lg.roll()
            assert len(m.clean_now()) == 1
        clean_at(999, 10)
        assert [b[0] for b in txn_batches_of(lg)] == [3, 4, 6, 8]    # 3's horizon has not passed
        assert (horizon(3), horizon(4), horizon(8)) == (NOW + 1000, NOW + 1999, None)
        clean_at(1000, 11)
        assert [b[0] for b in txn_batches_of(lg)] == [4, 6, 8]       # past its horizon, 3 goes
        clean_at(1999, 12)
        # and 4 goes; pid 9's marker stays while its data does
        assert txn_batches_of(lg) == [(6, 6, 9, DATA), (8, 8, 9, COMMIT)]
        assert contents(lg) == [(0, b"k1", b"a"), (6, b"k", b"open6"), (7, b"k2", b"newer7"),
                                (12, b"k3", b"x12")]
        assert committed_view(str(tmp_path), "c") == contents(lg)
        assert m.uncleanable_partitions() == {}


def test_the_cleaned_range_ends_after_trailing_markers_as_kafkas(tmp_path):
    """Kafka's buildOffsetMap moves the map's latest offset to the last offset of every batch it
    reads (updateLatestOffset), markers and aborted batches included, so the cleaner checkpoint
    ends after a dirty section's trailing marker. Before, it ended after the last keyed record
    (checkpoint 2): the marker was left in the dirty section, for a later pass to clean again."""
    from batch_helpers import txn_batch
    from kstore.read_committed import COMMIT
    m, _t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
        lg = m.log("c", 0)
        lg.append([(b"k", b"v0")])                                   # 0
        lg.append_batches(txn_batch(0, 7, [b"v1"], ts=IDLE))                  # 1  key b"k"
        lg.append_batches(txn_batch(0, 7, control=COMMIT, ts=IDLE))           # 2
        lg.roll()
        stats = m.clean_now()
        assert [s.end_offset for s in stats] == [3]
        assert contents(lg) == [(1, b"k", b"v1")]
        assert m.clean_now() == []                                   # nothing dirty is left


def test_a_dirty_section_with_no_keyed_record_is_cleaned_as_kafkas(tmp_path):
    """Kafka cleans a dirty section whose only batches are an aborted transaction and its marker
    (buildOffsetMap fast-forwards the map's latest offset to the end of the range it read, and
    the segments below are cleaned whatever the map holds): the aborted records go. Before, an
    empty map only moved the checkpoint, and a read_uncommitted reader read the aborted records
    until a later clean that had keyed records."""
    from batch_helpers import txn_batch
    from kstore.read_committed import ABORT
    m, _t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
        lg = m.log("c", 0)
        lg.append([(b"k", b"v0")])                                       # 0
        lg.roll()
        assert [s.end_offset for s in m.clean_now()] == [1]
        lg.append_batches(txn_batch(0, 7, [b"aborted1", b"aborted2"], ts=IDLE))   # 1-2, key b"k"
        lg.append_batches(txn_batch(0, 7, control=ABORT, ts=IDLE))                # 3
        lg.roll()
        stats = m.clean_now()
        assert [(s.end_offset, s.map_entries, s.records_removed) for s in stats] == [(4, 0, 2)]
        assert contents(lg) == [(0, b"k", b"v0")]
        # the marker stays: its transaction had data in this clean
        assert txn_batches_of(lg) == [(3, 3, 7, ABORT)]
        assert committed_view(str(tmp_path), "c") == [(0, b"k", b"v0")]
        assert m.clean_now() == []


def test_a_full_dedupe_map_stops_inside_a_batch_as_kafkas(tmp_path):
    """Kafka's map is full before a keyed record it has no room for (map.size <
    maxDesiredMapSize, checked before each put): the records put before it, in its batch too,
    stay mapped, and the pass ends after the last of them, so a batch with more keys than the
    map holds is cleaned over several passes. Before, a batch had to fit whole: one larger than
    the map was never mapped (the pass ended before it, or, as the first dirty batch, the
    checkpoint moved past it: its duplicates were never cleaned)."""
    m, _t = mgr(tmp_path, {"log.cleaner.dedupe.buffer.size": str(24 * 10),
                           "log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
        lg = m.log("c", 0)
        lg.append([(b"k%d" % i, b"v") for i in range(20)])              # 0-19
        lg.append([(b"k%d" % i, b"w") for i in range(3)])               # 20-22
        lg.roll()
        ends = []
        while True:
            stats = m.clean_now()
            if not stats:
                break
            ends.append((stats[0].end_offset, stats[0].map_entries))
        assert ends == [(9, 9), (18, 9), (23, 5)]          # 9 keys a pass (24 * 10 bytes * 0.9)
        assert contents(lg) == [(i, b"k%d" % i, b"v") for i in range(3, 20)] + [
            (20 + i, b"k%d" % i, b"w") for i in range(3)]
        assert m.uncleanable_partitions() == {}


def test_an_emptied_batch_goes_once_it_is_no_longer_the_rounds_last(tmp_path):
    """The batch before the first uncleanable offset is kept even when it loses every record
    (Kafka's RETAIN_EMPTY), written as Kafka's DefaultRecordBatch.writeEmptyHeader (no records,
    base timestamp -1, no delete horizon, its max timestamp kept); a later clean, where it is not
    the last, removes it (an empty batch is retained for nothing, DELETE_EMPTY). Before, an empty
    batch was copied as it was by every later clean: an aborted transaction's emptied batch, and
    so its ABORT marker, stayed in the log for good."""
    from batch_helpers import txn_batch
    from kstore.read_committed import ABORT, DATA
    m, _t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
        lg = m.log("c", 0)
        lg.append_batches(txn_batch(0, 7, [b"aborted0"], ts=IDLE + 5))   # 0, key b"k"
        lg.roll()
        lg.append_batches(txn_batch(0, 7, [b"aborted1"], ts=IDLE))                # 1
        lg.append_batches(txn_batch(0, 7, control=ABORT, ts=IDLE))                # 2
        lg.append([(b"k2", b"v3")])                                      # 3
        assert [s.end_offset for s in m.clean_now()] == [1]             # the segment of 0 only
        assert txn_batches_of(lg)[0] == (0, 0, 7, DATA)
        head = bytes(lg.read_batches(0, 1 << 20)[:61])
        attrs, delta, base_ts, max_ts, pid = struct.unpack_from(">hiqqq", head, 21)
        count = struct.unpack_from(">i", head, 57)[0]
        assert (attrs, delta, base_ts, max_ts, pid, count) == (0x10, 0, -1, IDLE + 5, 7, 0)
        assert struct.unpack_from(">i", head, 8)[0] == 49                # a bare header
        lg.roll()
        assert [s.end_offset for s in m.clean_now()] == [4]
        # the empty batch went, and 1's; the marker stays (1 was in this clean)
        assert txn_batches_of(lg) == [(2, 2, 7, ABORT)]
        assert contents(lg) == [(3, b"k2", b"v3")]


def test_a_clean_stopped_by_a_full_map_inside_a_transaction(tmp_path):
    """The dedupe map fills mid-segment: the pass cleans that segment whole (records past the
    map's end kept, an aborted transaction's batch past it removed) and keeps only the batch
    before the first uncleanable offset when emptied (Kafka's upperBoundOffsetOfCleaningRound),
    not the last batch of the segment the map stopped in: that one, emptied, went. Later passes
    finish; every key's last committed value survives and no aborted record is read. Before, the
    emptied aborted batch at 6 stayed after the first pass."""
    from batch_helpers import txn_batch
    from kstore.read_committed import ABORT, COMMIT, DATA
    m, _t = mgr(tmp_path, {"log.cleaner.dedupe.buffer.size": str(24 * 10),
                           "log.cleaner.io.buffer.load.factor": "0.5", "log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
        lg = m.log("c", 0)
        for i in range(6):
            lg.append([(b"k%d" % i, b"v%d" % i)])                        # 0-5
        lg.append_batches(txn_batch(0, 7, [b"aborted6"], ts=IDLE))                # 6, key b"k"
        lg.roll()
        lg.append_batches(txn_batch(0, 8, [b"c8"], ts=IDLE))                      # 7, key b"k"
        lg.append_batches(txn_batch(0, 7, control=ABORT, ts=IDLE))                # 8
        lg.append_batches(txn_batch(0, 8, control=COMMIT, ts=IDLE))               # 9
        lg.append([(b"k0", b"v10")])                                     # 10
        lg.roll()
        stats = m.clean_now()
        assert [(s.end_offset, s.map_entries) for s in stats] == [(5, 5)]
        assert txn_batches_of(lg) == [(7, 7, 8, DATA), (8, 8, 7, ABORT), (9, 9, 8, COMMIT)]
        assert contents(lg) == [(i, b"k%d" % i, b"v%d" % i) for i in range(6)] + [
            (7, b"k", b"c8"), (10, b"k0", b"v10")]
        while m.clean_now():
            pass
        assert contents(lg) == [(i, b"k%d" % i, b"v%d" % i) for i in range(1, 6)] + [
            (7, b"k", b"c8"), (10, b"k0", b"v10")]
        assert committed_view(str(tmp_path), "c") == contents(lg)
        assert m.uncleanable_partitions() == {}


def test_an_active_producers_last_batch_is_kept_empty(tmp_path):
    """Kafka's cleaner keeps the batch holding each active producer's last data offset (its last
    sequence), emptied if its records go, idempotent or transactional, and so the transaction's
    COMMIT with it (lastRecordsOfActiveProducers, RETAIN_EMPTY); once the producer has been idle
    producer.id.expiration.ms the batch goes, and then its marker. Before, both emptied batches went
    at the first clean: a broker taking over the log rebuilt no state for the producers."""
    from batch_helpers import txn_batch
    from kstore.read_committed import COMMIT, DATA, IDEMPOTENT, producer_batches
    m, t = mgr(tmp_path, {"log.segment.bytes": "100000", "producer.id.expiration.ms": "10000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": "1000",
                                "min.cleanable.dirty.ratio": "0.01"})
        lg = m.log("c", 0)
        lg.append_batches(txn_batch(0, 7, [b"t0"]))                          # 0, key b"k"
        lg.append_batches(txn_batch(0, 7, control=COMMIT))                   # 1
        lg.append_batches(txn_batch(0, 5, [b"i2"], transactional=False))     # 2, key b"k"
        lg.append([(b"k", b"plain3")])                                       # 3
        lg.roll()

        def batches():
            return [(b[0], b[2], b[4]) for b in producer_batches(lg, 0)]

        def counts():
            view = lg.read_batches(0, 1 << 20)
            out, p = [], 0
            while p < len(view):
                out.append(struct.unpack_from(">i", view, p + 57)[0])
                p += 12 + struct.unpack_from(">i", view, p + 8)[0]
            return out
        assert len(m.clean_now()) == 1
        assert contents(lg) == [(3, b"k", b"plain3")]
        assert batches() == [(0, 7, DATA), (1, 7, COMMIT), (2, 5, IDEMPOTENT)]
        assert counts() == [0, 1, 0, 1]
        t.sleep(9999)                          # still active: an idle producer expires at 10000
        lg.append([(b"k2", b"x")])
        lg.roll()
        assert len(m.clean_now()) == 1
        assert batches() == [(0, 7, DATA), (1, 7, COMMIT), (2, 5, IDEMPOTENT)]
        t.sleep(1)
        lg.append([(b"k2", b"y")])
        lg.roll()
        assert len(m.clean_now()) == 1
        assert batches() == [(1, 7, COMMIT)]   # its transaction's batch was in this clean
        assert contents(lg) == [(3, b"k", b"plain3"), (5, b"k2", b"y")]


def test_batches_left_below_the_log_start_count_in_a_clean_as_kafkas(tmp_path):
    """Kafka's cleaner reads the whole first segment, the batches below the log start that it
    still holds included, with the aborted transactions whose ABORT is at or past the log start:
    an aborted transaction straddling the log start keeps its ABORT (no delete horizon) while its
    batches below the start are in the clean, and they go. Before, kstore's walk began at the log
    start: the ABORT got a horizon at once, and the aborted batches below the start stayed."""
    from batch_helpers import txn_batch
    from kstore.read_committed import ABORT, producer_batches
    m, _t = mgr(tmp_path, {"log.segment.bytes": "100000"})
    with m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": "1000",
                                "min.cleanable.dirty.ratio": "0.01"})
        lg = m.log("c", 0)
        lg.append_batches(txn_batch(0, 7, [b"a0"], ts=IDLE))                # 0, key b"k"
        lg.append_batches(txn_batch(0, 7, [b"a1"], ts=IDLE))                # 1
        lg.append_batches(txn_batch(0, 7, control=ABORT, ts=IDLE))          # 2
        lg.append([(b"k2", b"v3")])                                         # 3
        lg.roll()
        lg.delete_records(2)
        assert len(m.clean_now()) == 1

        def batches():
            return [(b[0], b[4]) for b in producer_batches(lg, lg.segments[0].base_offset)]
        assert batches() == [(2, ABORT)]
        view = lg.read_batches(2, 1 << 20)
        assert struct.unpack_from(">h", view, 21)[0] & 0x40 == 0           # no horizon yet
        assert contents(lg) == [(3, b"k2", b"v3")]


def test_legacy_tombstone_horizon_is_the_segment_holding_the_first_dirty_offset(tmp_path):
    """v0/v1 tombstones have no delete horizon of their own: Kafka takes the last modified time
    of the last segment of logSegments(0, firstDirtyOffset), minus delete.retention.ms, and
    drops them from every segment modified before it. When the first dirty offset lies inside a
    segment (a clean that filled its map stopped there) that segment is the one, not the one
    before it. Segments [0..9] (a tombstone of a key no later record has, modified 10 days
    ago), [10..19] (modified now; first dirty offset 15), [20..29], the active [30..]: Kafka's
    horizon is now - 1 day, so the 10-day-old tombstone goes. Before, the horizon was taken
    from [0..9] itself (10 days ago - 1 day) and the tombstone stayed."""
    import time as _time
    from kstore.checkpoint import CLEANER_OFFSET_CHECKPOINT
    cfg = {"log.segment.bytes": "1000000"}
    topic = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0",
             "message.format.version": "0.10.2", "delete.retention.ms": str(DAY)}
    m, t = mgr(tmp_path, cfg)
    with m:
        m.create_topic("c", 1, topic)
        lg = m.log("c", 0)
        for i in range(40):
            if i and i % 10 == 0:
                lg.roll()
            k = b"gone" if i == 3 else b"k%d" % (i % 4 if i != 3 else 9)
            lg.append([(k, None if i == 3 else b"v%d" % i, NOW)])
        assert [s.base_offset for s in lg.segments] == [0, 10, 20, 30]
    with open(os.path.join(tmp_path, CLEANER_OFFSET_CHECKPOINT), "w") as f:
        f.write("0\n1\nc 0 15\n")
    now = _time.time()
    for base, age_days in ((0, 10), (10, 0), (20, 0)):
        p = os.path.join(tmp_path, "c-0", "%020d.log" % base)
        os.utime(p, (now - age_days * 86400, now - age_days * 86400))
    m, t = mgr(tmp_path, cfg)
    with m:
        lg = m.log("c", 0)
        assert (lg.read(3, 1)[0].key, lg.read(3, 1)[0].value) == (b"gone", None)
        m.clean_now()
        got = contents(lg)
        assert (3, b"gone", None) not in got
        # every other key keeps its latest value; nothing at or past 30 (active) changes
        assert latest(got) == {b"k%d" % j: (36 + j, b"v%d" % (36 + j)) for j in range(4)}


def test_an_offline_dirs_uncleanable_partitions_are_forgotten(tmp_path, watchdog):
    """Kafka's LogManager.handleLogDirFailure removes the dir's logs from currentLogs and the
    cleaner's maintainUncleanablePartitions, after each pass, drops the uncleanable partitions
    no longer among them. Before, uncleanable_partitions() still listed an offline dir's
    partition; now only the online dir's stays, beside a thread appending to compacted
    partitions of both dirs and the cleaner thread running at a 20 ms backoff. (Not Kafka's
    LogCleanerManager.handleLogDirFailure: that one drops only the dir's checkpoints.)"""
    import errno
    import threading
    from kstore.errors import LogDirOfflineError
    from thread_watchdog import join_all
    watchdog(60)
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2], {"log.segment.bytes": "2000", "log.cleaner.backoff.ms": "20"})
    # not cleanable (the cleaner thread runs) until both are corrupt
    m.create_topic("bad", 2, {"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"})
    m.create_topic("good", 2, {"cleanup.policy": "compact"})
    assert {m.log_dir_of("bad", p) for p in range(2)} == {d1, d2}
    for p in range(2):
        for i in range(200):
            m.append("bad", b"k%d" % (i % 3), b"v%d" % i, partition=p)
        lg = m.log("bad", p)
        lg.read(0)                                  # map it
        with open(lg.segments[1].log_path, "r+b") as f:   # a bad record in a closed segment
            f.seek(70)
            f.write(b"\xff\xff\xff")
    stop = threading.Event()

    def append():
        i = 0
        while not stop.is_set():
            for p in range(2):
                try:
                    m.append("good", b"k%d" % (i % 5), b"v%d" % i, partition=p)
                except LogDirOfflineError:
                    pass
            i += 1
    m.alter_topic_config("bad", {"min.compaction.lag.ms": None})
    m.clean_now()
    assert set(m.uncleanable_partitions()) == {("bad", 0), ("bad", 1)}
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    try:
        stop.wait(0.2)                              # the cleaner thread cleans "good" meanwhile
        m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))
        on = next(p for p in range(2) if m.log_dir_of("bad", p) == d2)
        for _ in range(3):
            got = m.uncleanable_partitions()
            assert set(got) == {("bad", on)}
            assert "Corrupt" in got[("bad", on)] or "CRC" in got[("bad", on)]
            stop.wait(0.1)
    finally:
        stop.set()
        join_all([writer], 30)
    m.close()


def test_a_deleted_topics_uncleanable_partition_is_forgotten(tmp_path, watchdog):
    """Kafka's maintainUncleanablePartitions drops a deleted partition's entry too. Before, a
    deleted topic stayed uncleanable, and a topic created again under its name was never
    cleaned; now it is forgotten and the new topic is cleaned, beside a thread appending to
    another compacted topic."""
    import threading
    from thread_watchdog import join_all
    watchdog(60)
    m, t = mgr(tmp_path, {"log.segment.bytes": "2000"})
    stop = threading.Event()

    def fill():
        m.create_topic("bad", 1, {"cleanup.policy": "compact"})
        for i in range(200):
            m.append("bad", b"k%d" % (i % 3), b"v%d" % i, partition=0, timestamp=NOW)

    def append():
        while not stop.is_set():
            m.append("other", b"k", b"v", partition=0, timestamp=NOW)
    with m:
        m.create_topic("other", 1, {"cleanup.policy": "compact"})
        fill()
        lg = m.log("bad", 0)
        lg.read(0)
        with open(lg.segments[1].log_path, "r+b") as f:     # a bad record in a closed segment
            f.seek(70)
            f.write(b"\xff\xff\xff")
        m.clean_now()
        assert set(m.uncleanable_partitions()) == {("bad", 0)}
        writer = threading.Thread(target=append, daemon=True)
        writer.start()
        try:
            m.delete_topic("bad")
            assert m.uncleanable_partitions() == {}
            fill()
            stats = [s for s in m.clean_now() if s.topic == "bad"]
            assert len(stats) == 1 and stats[0].records_removed > 0
        finally:
            stop.set()
            join_all([writer], 30)
