"""leader_epoch.py (Kafka's LeaderEpochFileCache, LeaderEpochCheckpointFile): the file's bytes,
the cache's rules, and a Log keeping it as a broker's leader does (issue 16 item 4)."""
import os
import struct

import pytest

import kstore
from kstore.leader_epoch import (EpochEntry, LeaderEpochCheckpointError, LeaderEpochFileCache,
                                 format_checkpoint, parse_checkpoint)

from broker_dirs import v2_batch, write_partition
from manager_helpers import manager
from thread_watchdog import run_threads

CKPT = "leader-epoch-checkpoint"


def epochs_on_disk(d):
    """The partitionLeaderEpoch of every batch in the partition's .log files, in order."""
    out = []
    for name in sorted(n for n in os.listdir(d) if n.endswith(".log")):
        with open(os.path.join(d, name), "rb") as f:
            data = f.read()
        pos = 0
        while pos + 17 <= len(data):
            size = struct.unpack_from(">i", data, pos + 8)[0] + 12
            if size <= 12:
                break                    # the zero runway
            out.append((struct.unpack_from(">q", data, pos)[0], struct.unpack_from(">i", data, pos + 12)[0]))
            pos += size
    return out


def read(d):
    with open(os.path.join(d, CKPT), "rb") as f:
        return f.read()


# -- the file --------------------------------------------------------------------------------------
def test_format_and_parse_are_kafkas():
    entries = [EpochEntry(0, 0), EpochEntry(3, 120), EpochEntry(7, 4000)]
    assert format_checkpoint(entries) == b"0\n3\n0 0\n3 120\n7 4000\n"
    assert format_checkpoint([]) == b"0\n0\n"
    assert parse_checkpoint("p", b"0\n3\n0 0\n3 120\n7 4000\n") == entries
    assert parse_checkpoint("p", b"") == []            # Kafka creates the file empty
    assert parse_checkpoint("p", b"0\n0\n") == []


@pytest.mark.parametrize("data,why", [
    (b"1\n0\n", "unrecognised version '1'"),
    (b"0\n", "no count line"),
    (b"0\nx\n", "no count line"),
    (b"0\n2\n0 0\n", "expected 2 entries but found 1"),
    (b"0\n1\n0 0 0\n", "line 3 '0 0 0' is not `epoch offset`"),
    (b"0\n1\nfive 0\n", "line 3 'five 0' is not `epoch offset`"),
    (b"0\n1\n-1 0\n", "line 3: epoch or offset out of range"),
    (b"0\n2\n3 10\n2 20\n", "line 4: epochs and offsets must increase"),
    (b"0\n2\n3 10\n4 5\n", "line 4: epochs and offsets must increase"),
    (b"\xff\n", "not ASCII"),
])
def test_a_malformed_checkpoint_names_file_and_fault(data, why):
    with pytest.raises(LeaderEpochCheckpointError) as ei:
        parse_checkpoint("/x/t-0/leader-epoch-checkpoint", data)
    assert str(ei.value) == f"malformed leader epoch checkpoint /x/t-0/leader-epoch-checkpoint: {why}"


def test_cache_rules_are_kafkas(tmp_path):
    """assign, truncateFromEnd, truncateFromStart and endOffsetFor as LeaderEpochFileCacheTest."""
    c = LeaderEpochFileCache(str(tmp_path / CKPT), kstore.get_file_ops())
    assert c.latest_epoch == -1 and c.end_offset_for(0, 10) == (-1, -1)
    assert c.assign(2, 6) and not c.assign(2, 7) and c.assign(3, 8) and c.assign(5, 12)
    assert c.entries == [(2, 6), (3, 8), (5, 12)]
    assert c.end_offset_for(1, 20) == (-1, -1)
    assert c.end_offset_for(2, 20) == (2, 8) and c.end_offset_for(4, 20) == (3, 12)
    assert c.end_offset_for(5, 20) == (5, 20) and c.end_offset_for(9, 20) == (5, 20)
    assert c.assign(3, 9)           # an epoch not above the latest removes what it contradicts
    assert c.entries == [(2, 6), (3, 9)]
    assert c.assign(4, 9) and c.entries == [(2, 6), (4, 9)]     # same start: replaced
    assert c.assign(4, 7) and c.entries == [(2, 6), (4, 7)]     # same epoch, lower start
    c.flush()
    assert read(str(tmp_path)) == b"0\n2\n2 6\n4 7\n"
    assert c.truncate_from_end(7) and c.entries == [(2, 6)]
    assert not c.truncate_from_end(7)
    c.assign(4, 7)
    c.assign(6, 20)
    assert c.truncate_from_start(10) and c.entries == [(4, 10), (6, 20)]
    assert not c.truncate_from_start(10) and not c.truncate_from_start(3)
    assert c.truncate_from_start(25) and c.entries == [(6, 25)]
    c.flush()
    assert read(str(tmp_path)) == b"0\n1\n6 25\n"
    with pytest.raises(ValueError):
        c.assign(-1, 0)


# -- a Log keeps it ---------------------------------------------------------------------------------
def test_a_new_partition_starts_at_epoch_0_and_its_batches_carry_it(tmp_path):
    """As a broker's first leader: `0 / 1 / 0 0` written at the open, every appended batch
    (append, append_columns, append_batches) carries epoch 0; a read-only open writes nothing."""
    d = str(tmp_path / "t-0")
    with kstore.Log.open(d) as lg:
        assert read(d) == b"0\n1\n0 0\n"
        assert lg.leader_epoch == 0
        lg.append([(b"k", b"v")])
        lg.append([(b"k%d" % i, b"v") for i in range(1000)])
        b = kstore._core.BatchBuilder()
        b.build([(b"s", b"staged")], 2, 0, 0, False, 0, 1 << 62, False, 0)
        assert lg.append_batches(b.getvalue()) == (1001, 1)
    assert epochs_on_disk(d) == [(0, 0), (1, 0), (1001, 0)]
    assert read(d) == b"0\n1\n0 0\n"
    ro_dir = str(tmp_path / "u-0")
    write_partition(str(tmp_path), "u-0", v2_batch(0, [(0, 0, b"k", b"v")]))
    with kstore.Log.open(ro_dir, read_only=True) as ro:
        assert ro.leader_epoch == -1 and [r.value for r in ro.read(0)] == [b"v"]
    assert not os.path.exists(os.path.join(ro_dir, CKPT))


def test_a_brokers_partition_appends_with_its_epoch_and_follows_truncation(tmp_path):
    """A broker's partition at epoch 5 (checkpoint `3 0`, `5 10`): appends carry 5 and leave
    the file alone; a truncation below 10 drops the entry and starts epoch 6 at the new end,
    written before it returns (a truncation is a new leader's: KIP-320 readers see the cut), and
    the appends after it carry 6; DeleteRecords folds the entries below the new log start into
    one."""
    data = b"".join(v2_batch(o, [(0, 0, b"k", b"v%d" % o)], leader_epoch=3 if o < 10 else 5)
                    for o in range(12))
    d = write_partition(str(tmp_path), "t-0", data, extra={CKPT: b"0\n2\n3 0\n5 10\n"})
    with kstore.Log.open(d, {"segment.bytes": 400}) as lg:
        assert lg.leader_epoch == 5
        assert lg.append([(b"k", b"new")]).first_offset == 12
        assert read(d) == b"0\n2\n3 0\n5 10\n"
        assert epochs_on_disk(d)[-2:] == [(11, 5), (12, 5)]
        lg.truncate_to(8)
        assert read(d) == b"0\n2\n3 0\n6 8\n" and lg.leader_epoch == 6
        assert lg.append([(b"k", b"again")]).first_offset == 8
        assert read(d) == b"0\n2\n3 0\n6 8\n"
        assert epochs_on_disk(d)[-2:] == [(7, 3), (8, 6)]
        lg.append([(b"k", b"x")])
        assert lg.delete_records(5) == 5
        assert read(d) == b"0\n2\n3 5\n6 8\n"
        assert lg.delete_records(9) == 9
        assert read(d) == b"0\n1\n6 9\n"
        assert lg.leader_epoch_cache.entries == [(6, 9)]


def test_open_fits_a_stale_file_to_the_log(tmp_path):
    """A crash can leave the file ahead of the log (a truncation's new epoch with nothing
    appended under it, or appends a crash lost): the open applies truncateFromEnd(log end) and
    truncateFromStart(log start), as Kafka's UnifiedLog does at load, then keeps the latest
    epoch the file had at the log end, as a leader assigns its epoch's start there: epochs never
    go back (a reader that saw epoch 4 must see the cut). The result is written."""
    data = b"".join(v2_batch(o, [(0, 0, b"k", b"v")], leader_epoch=2) for o in range(4))
    d = write_partition(str(tmp_path), "t-0", data, extra={CKPT: b"0\n3\n1 0\n2 2\n4 9\n"})
    with kstore.Log.open(d) as lg:
        assert lg.leader_epoch == 4
        assert read(d) == b"0\n3\n1 0\n2 2\n4 4\n"
        assert lg.append([(b"k", b"v")]).first_offset == 4
        assert epochs_on_disk(d)[-2:] == [(3, 2), (4, 4)]


def test_a_malformed_checkpoint_isolates_its_partition_untouched(tmp_path, mock):
    d = str(tmp_path)
    write_partition(d, "t-0", v2_batch(0, [(0, 0, b"k", b"v")]), extra={CKPT: b"0\n5\n1 0\n"})
    write_partition(d, "t-1", v2_batch(0, [(0, 0, b"k", b"w")]))
    with manager(d, mock=mock) as m:
        assert list(m.failed_partitions) == [("t", 0)]
        assert "expected 5 entries but found 1" in m.failed_partitions[("t", 0)]
        assert m.append("t", None, b"x", partition=1).offset == 1
    assert read(os.path.join(d, "t-0")) == b"0\n5\n1 0\n"
    assert read(os.path.join(d, "t-1")) == b"0\n1\n0 1\n"      # epoch 0 from its log end


def test_message_format_v1_has_no_leader_epochs(tmp_path):
    """Kafka's maybeCreateLeaderEpochCache: a log on a pre-v2 format keeps no cache and its
    file is deleted."""
    d = write_partition(str(tmp_path), "t-0", b"", extra={CKPT: b"0\n1\n0 0\n"})
    with kstore.Log.open(d, {"message.format.version": "0.10.2"}) as lg:
        lg.append([(b"k", b"v")])
        assert lg.leader_epoch == -1 and lg.leader_epoch_cache is None
    assert not os.path.exists(os.path.join(d, CKPT))


def test_topics_created_by_a_manager_start_at_epoch_0(tmp_path, mock):
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("t", 2)
        m.append("t", b"k", b"v", partition=1)
    for p in (0, 1):
        assert read(str(tmp_path / f"t-{p}")) == b"0\n1\n0 0\n"
    assert epochs_on_disk(str(tmp_path / "t-1")) == [(0, 0)]


def test_the_file_follows_appends_truncations_and_deletions_on_other_threads(tmp_path, watchdog):
    """Appends, truncations, DeleteRecords and retention on three threads: after each step the
    cache is monotonic and within the log; after the close the file holds the cache's entries,
    each truncation started a new epoch, every batch carries the epoch of the entry covering
    it, and a reopen reads the same file back."""
    watchdog(120)
    d = str(tmp_path / "t-0")
    lg = kstore.Log.open(d, {"segment.bytes": 2000, "retention.bytes": 6000})

    def appender(stop):
        while not stop.is_set():
            lg.append([(b"k", b"v" * 50)] * 3)

    def truncater(stop):
        while not stop.is_set():
            end = lg.log_end_offset
            if end > lg.log_start_offset + 10:
                lg.truncate_to(end - 5)

    def deleter(stop):
        while not stop.is_set():
            try:
                lg.delete_records(max(lg.log_start_offset, lg.log_end_offset - 30))
            except kstore.OffsetOutOfRangeError:
                pass    # the truncater cut the log below the offset after it was computed:
                # refused, as Kafka refuses a DeleteRecords past the high watermark
            lg.delete_old_segments()
            # empty only between a truncation below the log start (a full one: Kafka's
            # clearAndFlush) and the next append, which starts the epoch again
            entries = lg.leader_epoch_cache.entries
            assert all(a.start_offset < b.start_offset for a, b in zip(entries, entries[1:]))
    run_threads(3, appender, truncater, deleter)
    entries = lg.leader_epoch_cache.entries
    start = lg.log_start_offset
    lg.close()
    assert read(d) == format_checkpoint(entries) and entries[0].start_offset == start
    assert all(a.epoch < b.epoch and a.start_offset < b.start_offset
               for a, b in zip(entries, entries[1:]))
    assert len(entries) > 1 and entries[-1].epoch == lg.leader_epoch
    on_disk = [(b, e) for b, e in epochs_on_disk(d) if b >= start]
    assert all(e == [x.epoch for x in entries if x.start_offset <= b][-1]
                           for b, e in on_disk)
    with kstore.Log.open(d) as again:
        # (a cut inside a batch removes the whole batch: the epoch of the last cut starts at
        # the log end the reopen finds, if that is below where the cut asked)
        leo = again.log_end_offset
        kept = [x for x in entries if x.start_offset < leo]
        assert again.leader_epoch_cache.entries == \
            (entries if len(kept) == len(entries) else kept + [(entries[-1].epoch, leo)])


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_checkpoint_is_refused_and_a_missing_one_created(tmp_path, dangling):
    """The load reads the file without a stat first: a missing file gives a new cache (the
    file written at epoch 0 from the log end), a symlink, dangling or not, is refused (never
    read or written through), naming the file."""
    d = str(tmp_path / "t-0")
    os.makedirs(d)
    assert LeaderEpochFileCache.load(d, kstore.fileio.FileOps()).entries == []
    target = str(tmp_path / "elsewhere")
    if not dangling:
        with open(target, "wb") as f:
            f.write(b"0\n1\n0 0\n")
    os.symlink(target, os.path.join(d, CKPT))
    with pytest.raises(LeaderEpochCheckpointError, match=CKPT):
        LeaderEpochFileCache.load(d, kstore.fileio.FileOps())
    assert os.path.exists(target) != dangling


@pytest.mark.parametrize("ckpt, expected", [
    (b"0\n1\n0 0\n", b"0\n3\n0 0\n3 2\n5 4\n"),      # stale: written before epochs 3 and 5
    (None, b"0\n3\n0 0\n3 2\n5 4\n"),                # missing
    (b"0\n2\n0 0\n4 3\n", b"0\n3\n0 0\n4 3\n5 4\n"),  # ahead of batch 2's epoch 3: kept, 5 added
])
def test_recovery_assigns_the_epochs_of_the_batches_it_validates(tmp_path, ckpt, expected):
    """Kafka's LogSegment.recover: each recovered v2 batch whose partitionLeaderEpoch is >= 0 and
    above the cache's latest starts that epoch at its base offset (-1 and lower epochs are
    skipped); then truncateFromEnd/Start fit the cache to the log. Before, an unclean open
    kept the stale file: leader_epoch 0, and appends after it stamped epoch 0 again."""
    epochs = [0, 0, 3, -1, 5, 2]
    data = b"".join(v2_batch(o, [(0, 0, b"k", b"v%d" % o)], leader_epoch=e)
                    for o, e in enumerate(epochs))
    d = write_partition(str(tmp_path), "t-0", data, extra={CKPT: ckpt} if ckpt else None)
    with kstore.Log.open(d, {"segment.bytes": 200}) as lg:
        # (an index rebuilt at load recovers the segment too, as Kafka's loadSegmentFiles does)
        assert {r.epochs for r in lg.recovery_report} == {((0, 0), (3, 2), (5, 4))}
        assert read(d) == expected
        assert lg.leader_epoch == 5
        assert lg.append([(b"k", b"new")]).first_offset == 6
    assert epochs_on_disk(d)[-1] == (6, 5)


def test_recovery_epochs_of_several_segments_and_a_cut_tail(tmp_path):
    """Epochs are assigned segment by segment in offset order; a batch cut off as invalid
    assigns nothing (the epoch of a torn tail never reaches the file)."""
    seg0 = b"".join(v2_batch(o, [(0, 0, b"k", b"v")], leader_epoch=1) for o in range(3))
    seg1 = b"".join(v2_batch(o, [(0, 0, b"k", b"v")], leader_epoch=7 if o < 5 else 9)
                    for o in range(3, 6))
    d = write_partition(str(tmp_path), "t-0", seg0, extra={CKPT: b"0\n1\n0 0\n"})
    torn = v2_batch(6, [(0, 0, b"k", b"v")], leader_epoch=11)[:-3]
    with open(os.path.join(d, "%020d.log" % 3), "wb") as f:
        f.write(seg1 + torn)
    with kstore.Log.open(d) as lg:
        assert lg.log_end_offset == 6
        # epoch 1 from offset 0 replaces the stale "0 0" (Kafka's assign drops entries whose
        # start offset is not below the new one's)
        assert read(d) == b"0\n3\n1 0\n7 3\n9 5\n"
        assert lg.leader_epoch == 9


def test_recovery_epochs_come_from_the_scan_that_validates(tmp_path):
    """A whole, parsable batch at the tail with a higher epoch but a bad CRC is cut by recovery's
    scan and assigns nothing (the epochs come from that scan's valid batches, not a walk of
    whatever headers parse)."""
    seg = bytearray(b"".join(v2_batch(o, [(0, 0, b"k", b"v")], leader_epoch=e)
                             for o, e in [(0, 1), (1, 1), (2, 4)]))
    bad = bytearray(v2_batch(3, [(0, 0, b"k", b"v")], leader_epoch=8))
    bad[-1] ^= 0x01                       # the value's byte: inside the CRC
    d = write_partition(str(tmp_path), "t-0", bytes(seg + bad), extra={CKPT: b"0\n1\n0 0\n"})
    with kstore.Log.open(d) as lg:
        assert lg.log_end_offset == 3
        # (recovered twice: the scan that cuts, then the index rebuild at load)
        assert {r.epochs for r in lg.recovery_report} == {((1, 0), (4, 2))}
        assert lg.recovery_report[0].status == "crc"
        assert read(d) == b"0\n2\n1 0\n4 2\n"
        assert lg.leader_epoch == 4
        assert lg.append([(b"k", b"new")]).first_offset == 3
    assert epochs_on_disk(d) == [(0, 1), (1, 1), (2, 4), (3, 4)]


@pytest.mark.parametrize("how", ["truncate_to", "truncate_fully_and_start_at"])
def test_a_cut_writes_its_new_epoch_before_any_record_goes(tmp_path, how):
    """A truncation below the log end starts a new epoch at the new end, in the file before the
    first segment file is cut, renamed or deleted (a crash in between leaves the new epoch over
    records still there, never a cut with the old epoch, which a reader past it could not tell:
    fetcher.py); truncate_fully_and_start_at below the end too, at or past it (the start moving
    up, as retention) does not."""
    seen: list = []
    armed = []

    class Watch(kstore.fileio.FileOps):
        def _look(self, path):
            if armed and not seen and path.endswith((".log", ".index", ".timeindex")):
                seen.append(read(d))

        def truncate(self, fd, length):
            self._look(os.readlink(f"/proc/self/fd/{fd}"))
            super().truncate(fd, length)

        def rename(self, src, dst):
            self._look(src)
            super().rename(src, dst)

        def unlink(self, path):
            self._look(path)
            super().unlink(path)

    d = str(tmp_path / "t-0")
    with kstore.Log.open(d, {"segment.bytes": 300}) as lg:
        for i in range(12):
            lg.append([(b"k", b"v%d" % i)])
    with kstore.Log.open(d, {"segment.bytes": 300}, io=Watch()) as lg:
        assert lg.log_end_offset == 12 and len(lg.segments) > 1
        armed.append(True)
        getattr(lg, how)(7)
        assert seen == [b"0\n2\n0 0\n1 7\n"] and lg.leader_epoch == 1
        assert read(d).endswith(b"1 7\n")
        lg.append([(b"k", b"new")])
        assert epochs_on_disk(d)[-1] == (7, 1)
        if how == "truncate_fully_and_start_at":
            lg.truncate_fully_and_start_at(20)          # past the end: no cut, no new epoch
            assert lg.leader_epoch == 1 and lg.leader_epoch_cache.entries == [(1, 20)]
