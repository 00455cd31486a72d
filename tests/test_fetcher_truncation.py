"""KIP-320 in the consumer (fetcher.py): a position past a truncation of its log. A truncation
below the log end starts a new leader epoch (leader_epoch.py); a position whose record's epoch
ends below it goes back to where that epoch ends ("Truncation detected"), so the records
appended there again are returned, never skipped; auto_offset_reset "none" raises
LogTruncationError. In process (a LogManager's logs), read-only (a StoreReader's) beside a
writer process, and beside writer threads."""
from __future__ import annotations

import threading

import pytest

import kstore
from kstore import Consumer, LogTruncationError, TopicPartition as TP

from broker_dirs import v2_batch, write_partition
from thread_watchdog import join_all
from writer_process import WriterProcess

T0 = TP("t", 0)


def _poll(c, want: int, ms: int = 300) -> list:
    out: list = []
    for _ in range(20):
        out += [(r.offset, r.value, r.leader_epoch) for r in c.poll(ms).get(T0, [])]
        if len(out) >= want:
            break
    return out


@pytest.fixture
def m(tmp_path):
    mgr = kstore.LogManager(str(tmp_path / "data"))
    mgr.create_topic("t", 1)
    yield mgr
    mgr.close()


@pytest.mark.parametrize("store", ["manager", "reader"])
def test_records_appended_again_below_the_position_are_returned(m, store):
    """Read to 10, cut to 5, 8 appended again (5..12, epoch 1): the next poll returns 5..12.
    Before, the consumer went on from 10 and never returned the new 5..9."""
    lg = m.log("t", 0)
    for i in range(10):
        lg.append([(b"k", b"old%d" % i)])
    with Consumer(m if store == "manager" else m.log_dirs, auto_offset_reset="earliest") as c:
        c.assign([T0])
        assert [o for o, _v, _e in _poll(c, 10)] == list(range(10))
        assert lg.truncate_to(5) and lg.leader_epoch == 1
        for i in range(8):
            lg.append([(b"k", b"new%d" % i)])
        assert _poll(c, 8) == [(5 + i, b"new%d" % i, 1) for i in range(8)]
        assert c.position(T0) == 13


@pytest.mark.parametrize("store", ["manager", "reader"])
def test_a_cut_not_grown_back_resets_to_the_cut_not_to_the_start(m, store):
    """Read to 10, cut to 5 with nothing appended: the position (past the end) goes back to 5,
    the first offset known to diverge, not to the log start as the "earliest" reset would (every
    record read again); the records appended next are returned."""
    lg = m.log("t", 0)
    for i in range(10):
        lg.append([(b"k", b"old%d" % i)])
    with Consumer(m if store == "manager" else m.log_dirs, auto_offset_reset="earliest") as c:
        c.assign([T0])
        assert len(_poll(c, 10)) == 10
        lg.truncate_to(5)
        assert c.poll(100) == {} and c.position(T0) == 5
        lg.append([(b"k", b"new")])
        assert _poll(c, 1) == [(5, b"new", 1)]


def test_no_reset_policy_raises_log_truncation_error_until_a_seek(m):
    lg = m.log("t", 0)
    for i in range(10):
        lg.append([(b"k", b"old%d" % i)])
    with Consumer(m, auto_offset_reset="none") as c:
        c.assign([T0])
        c.seek(T0, 0)
        assert len(_poll(c, 10)) == 10
        lg.truncate_to(4)
        lg.append([(b"k", b"a")] * 9)
        for _ in range(2):
            with pytest.raises(LogTruncationError) as e:
                c.poll(100)
            assert e.value.divergent_offsets == {T0: 4}
            assert isinstance(e.value, kstore.OffsetOutOfRangeError)
        c.seek(T0, 4)
        assert [o for o, _v, _e in _poll(c, 9)] == list(range(4, 13))


def test_epochs_of_a_brokers_log_without_a_cut_reset_nothing(tmp_path):
    """A broker's log whose epochs change without a cut (3 up to 9, 5 from 10: the checkpoint
    and the batches agree): read in pieces across the change, nothing is reset or skipped, and
    each record carries its batch's epoch."""
    data = b"".join(v2_batch(o, [(0, 0, b"k", b"v%d" % o)], leader_epoch=3 if o < 10 else 5)
                    for o in range(14))
    d = str(tmp_path / "data")
    write_partition(d, "t-0", data, extra={"leader-epoch-checkpoint": b"0\n2\n3 0\n5 10\n"})
    with Consumer(d, auto_offset_reset="earliest", max_poll_records=3) as c:
        c.assign([T0])
        got = _poll(c, 14)
    assert got == [(o, b"v%d" % o, 3 if o < 10 else 5) for o in range(14)]


def test_an_epoch_file_ahead_of_the_cut_is_not_taken_for_one(m):
    """The writer writes a truncation's new epoch before it cuts (leader_epoch._before_cut): a
    reader that lists the directory in between finds the file ahead of the records (epoch 1
    from 3, the record at 3 still of epoch 0) and takes no cut from it: nothing read twice."""
    lg = m.log("t", 0)
    for i in range(10):
        lg.append([(b"k", b"old%d" % i)])
    cache = lg.leader_epoch_cache            # the file as the writer leaves it before the cut
    cache.assign(1, 3)
    cache.flush()
    with Consumer(m.log_dirs, auto_offset_reset="earliest") as c:
        c.assign([T0])
        assert [o for o, _v, e in _poll(c, 10)] == list(range(10))
        lg.append([(b"k", b"more")])         # (the cut never came: still epoch 0)
        assert _poll(c, 1) == [(10, b"more", 0)]


def test_positions_past_cuts_beside_an_appending_and_truncating_thread(m, watchdog):
    """A writer thread appends numbered batches and now and then cuts the tail (each value is
    unique: it names the generation); a consumer in another thread reads until END. For every
    offset of the final log, the last record the consumer returned there is the final one: none
    skipped. Before, records appended again below a consumer's position were skipped."""
    watchdog(120)
    lg = m.log("t", 0)
    stop = threading.Event()
    got: list = []
    errors: list = []

    def writer():
        try:
            import random
            rng = random.Random(7)
            for n in range(400):
                lg.append([(b"k", b"%d-%d" % (n, i)) for i in range(rng.randrange(1, 6))])
                if rng.random() < 0.1 and lg.log_end_offset > 10:
                    lg.truncate_to(lg.log_end_offset - rng.randrange(1, 10))
            lg.append([(b"end", b"END")])
        except BaseException as e:       # pragma: no cover (the test reports it)
            errors.append(e)

    def reader():
        try:
            with Consumer(m.log_dirs, auto_offset_reset="earliest",
                          max_poll_records=7) as c:
                c.assign([T0])
                while not stop.is_set():
                    for r in c.poll(50).get(T0, []):
                        got.append((r.offset, r.value))
                    if got and got[-1][1] == b"END":
                        return
        except BaseException as e:       # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
    for t in threads:
        t.start()
    join_all(threads[:1], 60)
    join_all(threads[1:], 60)
    stop.set()
    assert errors == []
    final = {r.offset: r.value for r in lg.read(0, 100000)}
    last: dict = {}
    for o, v in got:
        last[o] = v
    assert got[-1][1] == b"END"
    assert {o: v for o, v in last.items() if o in final} == final


def test_a_consumer_in_this_process_beside_a_writer_process_that_cuts(tmp_path, watchdog):
    """The StoreReader-backed consumer of the usual case, the writer in another process: cut
    below the position, appended again past it, between two polls: every new record returned."""
    watchdog(120)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run('m.create_topic("t", 1)',
              'for i in range(40): m.append_batch("t", 0, [(b"k%d" % i, b"x" * 50)])')  # rolls
        with Consumer(d, auto_offset_reset="earliest") as c:
            c.assign([T0])
            assert [o for o, _v, _e in _poll(c, 40)] == list(range(40))
            w.run('m.log("t", 0).truncate_to(22)',
                  'for i in range(30): m.append_batch("t", 0, [(b"n%d" % i, b"y%d" % i)])')
            assert _poll(c, 30) == [(22 + i, b"y%d" % i, 1) for i in range(30)]
    finally:
        w.close()


@pytest.mark.parametrize("store", ["manager", "reader"])
def test_a_group_resumes_from_a_committed_offset_past_a_cut(m, store):
    """A commit of the positions carries the leader epoch of the record before each (Kafka's
    OffsetAndMetadata.leaderEpoch); a member that resumes from it after the log was cut below
    it and grew back past it goes back to the cut (Kafka validates a committed position as any
    other), so the records appended there again are returned. Offsets given to commit() carry
    no epoch, as Kafka's."""
    lg = m.log("t", 0)
    for i in range(10):
        lg.append([(b"k", b"old%d" % i)])
    src = m if store == "manager" else m.log_dirs
    with Consumer(src, group_id="g", auto_offset_reset="earliest") as c:
        c.assign([T0])
        assert len(_poll(c, 10)) == 10
        c.commit()
        assert c.committed(T0, metadata=True).leader_epoch == 0
        c.commit({T0: 7})
        assert c.committed(T0, metadata=True).leader_epoch is None
        c.commit()
        assert (c.committed(T0), c.committed(T0, metadata=True).leader_epoch) == (10, 0)
    lg.truncate_to(6)
    for i in range(8):
        lg.append([(b"k", b"new%d" % i)])
    with Consumer(src, group_id="g", auto_offset_reset="earliest") as c:
        c.assign([T0])
        assert _poll(c, 8) == [(6 + i, b"new%d" % i, 1) for i in range(8)]


@pytest.mark.parametrize("store", ["manager", "reader"])
def test_read_committed_passes_a_cut_over_aborted_records_once(m, store):
    """read_committed: a position past aborted records (skipped, never returned) that are cut
    and written again, aborted again, under the new epoch. Back to the cut, the reader passes
    the new aborted records and goes on: its position takes their epoch. Before, it kept the
    old epoch, found the same cut again past them, and went back and forth for good."""
    from batch_helpers import txn_batch
    lg = m.log("t", 0)
    lg.append([(b"k", b"c0")])
    cut = lg.log_end_offset
    lg.append_batches(txn_batch(0, 7, [b"a1", b"a2"]) + txn_batch(0, 7, control=0))   # 1-2, ABORT 3
    with Consumer(m if store == "manager" else m.log_dirs, auto_offset_reset="earliest",
                  isolation_level="read_committed", max_poll_records=1) as c:
        c.assign([T0])
        assert _poll(c, 1) == [(0, b"c0", 0)]
        assert c.poll(100) == {} and c.position(T0) == 4
        lg.truncate_to(cut)
        lg.append_batches(txn_batch(0, 8, [b"b1", b"b2", b"b3"]) + txn_batch(0, 8, control=0))
        lg.append([(b"k", b"c5")])                                      # 1-3, ABORT 4, 5
        assert _poll(c, 1) == [(5, b"c5", 1)]
        assert c.poll(100) == {} and c.position(T0) == 6


def test_a_seek_with_a_committed_epoch_is_checked_a_plain_offset_is_not(m):
    """Kafka's seek(tp, OffsetAndMetadata): the committed offset 10 with its leader epoch 0,
    after a cut to 5 and 8 appended again in epoch 1, goes back to 5 (the records appended
    again returned); seek(tp, 10) with no epoch goes on from 10, as Kafka's does."""
    lg = m.log("t", 0)
    for i in range(10):
        lg.append([(b"k", b"old%d" % i)])
    with Consumer(m, group_id="g", auto_offset_reset="earliest") as c:
        c.assign([T0])
        assert len(_poll(c, 10)) == 10
        c.commit()
        committed = c.committed(T0, metadata=True)
    assert (committed.offset, committed.leader_epoch) == (10, 0)
    assert committed == kstore.OffsetAndMetadata(10, "", 0, committed.commit_timestamp)
    assert lg.truncate_to(5)
    for i in range(8):
        lg.append([(b"k", b"new%d" % i)])
    with Consumer(m, auto_offset_reset="earliest") as c:
        c.assign([T0])
        c.seek(T0, committed)
        assert _poll(c, 8) == [(5 + i, b"new%d" % i, 1) for i in range(8)]
        c.seek(T0, 10)
        assert _poll(c, 3) == [(10 + i, b"new%d" % (5 + i), 1) for i in range(3)]
        c.seek(T0, kstore.OffsetAndMetadata(10))           # no epoch: as a plain offset
        assert _poll(c, 3) == [(10 + i, b"new%d" % (5 + i), 1) for i in range(3)]
