"""kstore.Consumer without a group: assign() and subscribe() over a StoreReader or a LogManager,
positions, auto_offset_reset, seeks, pauses, max_poll_records, waits (no busy loop),
offsets_for_times, iteration and read_committed."""
import os
import struct
import threading
import time

import pytest

import kstore
from kstore import Consumer, NoOffsetForPartitionError, OffsetAndTimestamp, TopicPartition as TP
from kstore.errors import InvalidConfigError, KStoreStateError, OffsetOutOfRangeError

from batch_helpers import craft_v2, markers_then_records, txn_batch
from thread_watchdog import join_all
from writer_process import WriterProcess

NOW = 1_700_000_000_000


@pytest.fixture
def store(tmp_path):
    """A LogManager with topic t (2 partitions), 5 records each (keys k<p>-<i>, timestamps
    NOW + i)."""
    d = str(tmp_path / "data")
    m = kstore.LogManager(d)
    m.create_topic("t", 2)
    for p in range(2):
        m.append_batch("t", p, [(b"k%d-%d" % (p, i), b"v%d" % i, NOW + i) for i in range(5)])
    yield d, m
    m.close()


def offsets(got):
    return {str(tp): [r.offset for r in recs] for tp, recs in got.items()}


def test_assign_poll_earliest_reads_every_record_grouped_by_partition(store):
    d, _m = store
    with Consumer(d, auto_offset_reset="earliest") as c:
        c.assign([TP("t", 0), TP("t", 1)])
        assert c.assignment() == {TP("t", 0), TP("t", 1)}
        got = c.poll(timeout_ms=1000)
        assert offsets(got) == {"t-0": [0, 1, 2, 3, 4], "t-1": [0, 1, 2, 3, 4]}
        assert all(isinstance(k, TP) for k in got)
        r = got[TP("t", 1)][2]
        assert isinstance(r, kstore.Record) and (r.key, r.value, r.timestamp) == (b"k1-2", b"v2", NOW + 2)
        assert c.position(TP("t", 0)) == 5 and c.position(("t", 1)) == 5
        assert c.poll(0) == {}


def test_reads_a_log_managers_own_logs(store):
    _d, m = store
    with Consumer(m, auto_offset_reset="earliest") as c:
        c.assign([TP("t", 1)])
        assert offsets(c.poll(500)) == {"t-1": [0, 1, 2, 3, 4]}
        m.append_batch("t", 1, [(b"x", b"y")])
        assert offsets(c.poll(500)) == {"t-1": [5]}


def test_auto_offset_reset_latest_earliest_none(store):
    d, m = store
    with Consumer(d) as c:                       # latest: Kafka's default
        c.assign([TP("t", 0)])
        assert c.position(TP("t", 0)) == 5
        assert c.poll(0) == {}
        m.append_batch("t", 0, [(b"a", b"b")])
        assert offsets(c.poll(1000)) == {"t-0": [5]}
    with Consumer(d, auto_offset_reset="none") as c:
        c.assign([TP("t", 0)])
        with pytest.raises(NoOffsetForPartitionError) as e:
            c.poll(0)
        assert e.value.partitions == {TP("t", 0)}
        c.seek(TP("t", 0), 3)                    # a seek gives it a position
        assert offsets(c.poll(0)) == {"t-0": [3, 4, 5]}
    with pytest.raises(InvalidConfigError):
        Consumer(d, auto_offset_reset="smallest")


def test_max_poll_records_and_fairness(store):
    d, m = store
    for p in range(2):
        m.append_batch("t", p, [(b"k", b"v")] * 5)      # 10 records per partition
    with Consumer(d, auto_offset_reset="earliest", max_poll_records=4) as c:
        c.assign([TP("t", 0), TP("t", 1)])
        seen = []
        for _ in range(5):
            got = c.poll(0)
            assert sum(len(v) for v in got.values()) == 4
            seen.append(offsets(got))
        # the partition that filled a poll goes to the back: both advance
        assert seen[0] == {"t-0": [0, 1, 2, 3]}
        assert seen[1] == {"t-1": [0, 1, 2, 3]}
        assert seen[2] == {"t-0": [4, 5, 6, 7]}
        assert seen[3] == {"t-1": [4, 5, 6, 7]}
        assert seen[4] == {"t-0": [8, 9], "t-1": [8, 9]}
        assert c.poll(0, max_records=100) == {}
        with pytest.raises(InvalidConfigError):
            c.poll(0, max_records=0)


def test_seek_seek_to_beginning_end_and_position(store):
    d, _m = store
    with Consumer(d, auto_offset_reset="earliest") as c:
        c.assign([TP("t", 0), TP("t", 1)])
        c.seek(TP("t", 0), 3)
        assert c.position(TP("t", 0)) == 3
        assert offsets(c.poll(0)) == {"t-0": [3, 4], "t-1": [0, 1, 2, 3, 4]}
        c.seek_to_beginning(TP("t", 0))
        assert c.position(TP("t", 0)) == 0
        c.seek_to_end()                          # every assigned partition
        assert (c.position(TP("t", 0)), c.position(TP("t", 1))) == (5, 5)
        assert c.beginning_offsets([TP("t", 0)]) == {TP("t", 0): 0}
        assert c.end_offsets([TP("t", 0), TP("t", 1)]) == {TP("t", 0): 5, TP("t", 1): 5}
        with pytest.raises(KStoreStateError):
            c.seek(TP("t", 7), 0)                # not assigned
        with pytest.raises(InvalidConfigError):
            c.seek(TP("t", 0), -1)


def test_pause_resume(store):
    d, m = store
    with Consumer(d, auto_offset_reset="earliest") as c:
        c.assign([TP("t", 0), TP("t", 1)])
        c.pause(TP("t", 1))
        assert c.paused() == {TP("t", 1)}
        assert offsets(c.poll(0)) == {"t-0": [0, 1, 2, 3, 4]}
        m.append_batch("t", 1, [(b"a", b"b")])
        assert c.poll(200) == {}                 # paused: its new record is not returned
        c.resume(TP("t", 1))
        assert offsets(c.poll(0)) == {"t-1": [0, 1, 2, 3, 4, 5]}


def test_position_below_log_start_resets_as_kafka(store):
    d, m = store
    m.log("t", 0).roll()
    m.append_batch("t", 0, [(b"a", b"b")] * 3)          # offsets 5..7 in a new segment
    with Consumer(d, auto_offset_reset="earliest") as c, \
            Consumer(d, auto_offset_reset="latest") as late, \
            Consumer(d, auto_offset_reset="none") as none:
        for x in (c, late, none):
            x.assign([TP("t", 0)])
            x.seek(TP("t", 0), 1)
        m.log("t", 0).delete_records(5)
        m.checkpoint_log_start_offsets()
        assert offsets(c.poll(500)) == {"t-0": [5, 6, 7]}   # reset to the log start
        assert late.poll(200) == {} and late.position(TP("t", 0)) == 8
        with pytest.raises(OffsetOutOfRangeError):
            none.poll(200)


def test_idle_poll_sleeps_without_cpu(store):
    """poll(2000) with nothing to read: returns {} after the timeout, having used (almost) no
    CPU: it sleeps on the notification words, it does not loop."""
    d, _m = store
    with Consumer(d) as c:
        c.assign([TP("t", 0), TP("t", 1)])
        c.poll(0)
        cpu, wall = time.thread_time(), time.monotonic()
        assert c.poll(timeout_ms=2000) == {}
        wall, cpu = time.monotonic() - wall, time.thread_time() - cpu
        assert wall >= 1.99
        assert cpu < 0.05, f"an idle poll(2000) used {cpu * 1000:.1f} ms of CPU"


def test_poll_wakes_on_an_append_in_another_process(tmp_path, watchdog):
    watchdog(60)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run('m.create_topic("t", 1)', 'm.append_batch("t", 0, [(b"k", b"v0")])')
        with Consumer(d, auto_offset_reset="earliest") as c:
            c.assign([TP("t", 0)])
            assert offsets(c.poll(1000)) == {"t-0": [0]}
            result = {}

            def consume():
                t0 = time.monotonic()
                result["got"] = c.poll(timeout_ms=20000)
                result["waited"] = time.monotonic() - t0
            th = threading.Thread(target=consume)
            th.start()
            time.sleep(0.3)
            w.run('m.append_batch("t", 0, [(b"k", b"v1")])')
            join_all([th], 20)
        assert offsets(result["got"]) == {"t-0": [1]}
        assert result["got"][TP("t", 0)][0].value == b"v1"
        assert result["waited"] < 10          # woken by the append, not by the timeout
    finally:
        w.close()


def test_offsets_for_times(store):
    d, _m = store
    with Consumer(d) as c:
        got = c.offsets_for_times({TP("t", 0): NOW + 2, TP("t", 1): NOW + 99})
        assert got == {TP("t", 0): OffsetAndTimestamp(2, NOW + 2), TP("t", 1): None}
        with pytest.raises(InvalidConfigError):
            c.offsets_for_times({TP("t", 0): -1})


def test_iteration_yields_records_with_topic_and_partition(store):
    d, _m = store
    with Consumer(d, auto_offset_reset="earliest", consumer_timeout_ms=300) as c:
        c.assign([TP("t", 0)])
        recs = list(c)
        assert [(r.topic, r.partition, r.offset, r.key) for r in recs] == [
            ("t", 0, i, b"k0-%d" % i) for i in range(5)]
        assert isinstance(recs[0], kstore.ConsumerRecord)


def test_iteration_position_moves_record_by_record(store):
    d, _m = store
    with Consumer(d, auto_offset_reset="earliest") as c:
        c.assign([TP("t", 0)])
        it = iter(c)
        assert next(it).offset == 0
        assert c.position(TP("t", 0)) == 1        # not the end of what was read ahead
        assert next(it).offset == 1
        c.seek(TP("t", 0), 4)                     # a seek drops what was read ahead
        assert next(it).offset == 4


def test_subscribe_without_group_reads_every_partition_and_finds_new_ones(store):
    d, m = store
    with Consumer(d, "t", auto_offset_reset="earliest") as c:
        got = c.poll(1000)
        assert offsets(got) == {"t-0": [0, 1, 2, 3, 4], "t-1": [0, 1, 2, 3, 4]}
        assert c.subscription() == {"t"}
        m.add_partitions("t", 3)
        m.append_batch("t", 2, [(b"n", b"new")])
        got = c.poll(5000)
        assert offsets(got) == {"t-2": [0]}       # a partition that appears: from its start
        with pytest.raises(KStoreStateError):
            c.assign([TP("t", 0)])                # subscribe and assign exclude each other
    with Consumer(d, pattern=r"t|u", auto_offset_reset="earliest") as c:
        assert set(offsets(c.poll(1000))) == {"t-0", "t-1", "t-2"}


def test_commit_needs_a_group_and_close_is_idempotent(store):
    d, _m = store
    c = Consumer(d)
    with pytest.raises(KStoreStateError):
        c.commit()
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(KStoreStateError):
        c.poll(0)


# -- read_committed ------------------------------------------------------------------------------
def test_read_committed_skips_aborted_and_stops_at_the_last_stable_offset(tmp_path):
    d = str(tmp_path / "data")
    os.makedirs(d)
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"plain0")])                                  # 0
        lg.append_batches(txn_batch(0, 7, [b"aborted1", b"aborted2"]))  # 1, 2   pid 7
        lg.append_batches(txn_batch(0, 8, [b"committed3"]))             # 3      pid 8
        lg.append_batches(txn_batch(0, 7, control=0))                   # 4      ABORT pid 7
        lg.append_batches(txn_batch(0, 8, control=1))                   # 5      COMMIT pid 8
        lg.append([(b"a", b"plain6")])                                  # 6
        lg.append_batches(txn_batch(0, 9, [b"open7"]))                  # 7      pid 9, open
        lg.append([(b"a", b"plain8")])                                  # 8
        with Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed") as c, \
                Consumer(d, auto_offset_reset="earliest") as u:
            c.assign([TP("t", 0)])
            u.assign([TP("t", 0)])
            vals = [r.value for r in c.poll(500)[TP("t", 0)]]
            assert vals == [b"plain0", b"committed3", b"plain6"]         # LSO 7: the open txn
            assert c.end_offsets([TP("t", 0)]) == {TP("t", 0): 7}
            assert c.poll(100) == {}
            assert [r.value for r in u.poll(500)[TP("t", 0)]] == [
                b"plain0", b"aborted1", b"aborted2", b"committed3", b"plain6", b"open7", b"plain8"]
            lg.append_batches(txn_batch(0, 9, control=1))               # 9      COMMIT pid 9
            assert [r.value for r in c.poll(1000)[TP("t", 0)]] == [b"open7", b"plain8"]
            assert c.position(TP("t", 0)) == 9
            lg.append([(b"a", b"plain10")])
            assert [r.value for r in c.poll(1000)[TP("t", 0)]] == [b"plain10"]



def test_read_committed_at_a_marker_before_an_open_transaction_waits_there(tmp_path):
    """A position at a producer's marker followed by its next, open, transaction: the position
    moves past the marker and waits at the LSO. Before, the read (records, all at or past the
    LSO) was taken for a compacted gap and the position jumped to the next segment's base:
    open3 and plain4 were never returned, once committed."""
    d = str(tmp_path / "data")
    os.makedirs(d)
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"plain0")])                                  # 0
        lg.append_batches(txn_batch(0, 4, [b"committed1"]))             # 1
        lg.append_batches(txn_batch(0, 4, control=1))                   # 2 COMMIT pid 4
        lg.append_batches(txn_batch(0, 4, [b"open3"]))                  # 3 pid 4 again: the LSO
        lg.append([(b"a", b"plain4")])                                  # 4
        lg.roll()
        lg.append([(b"a", b"plain5")])                                  # 5
        with Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed") as c:
            c.assign([TP("t", 0)])
            assert [r.value for r in c.poll(500)[TP("t", 0)]] == [b"plain0", b"committed1"]
            assert c.poll(100) == {}
            assert c.position(TP("t", 0)) == 3                          # past the marker, at the LSO
            lg.append_batches(txn_batch(0, 4, control=1))               # 6 COMMIT pid 4
            assert [r.value for r in c.poll(1000)[TP("t", 0)]] == [b"open3", b"plain4", b"plain5"]
            assert c.position(TP("t", 0)) == 6



def test_read_committed_moves_to_the_lso_over_batches_with_no_records(tmp_path):
    """A batch with no records (a broker's cleaner leaves them) before an open transaction: the
    position moves to the LSO and the poll sleeps. Before, it stayed at the empty batch and the
    poll re-read it in a loop: 1 s of CPU in a 1 s poll."""
    d = str(tmp_path / "data")
    os.makedirs(os.path.join(d, "t-0"))
    with open(os.path.join(d, "t-0", "00000000000000000000.log"), "wb") as f:
        f.write(craft_v2([(0, 0, b"a", b"plain0")], 0) + craft_v2([], 1, last_delta=0)
                + struct.pack(">q", 2) + txn_batch(0, 4, [b"open2"])[8:]   # 2: pid 4, open
                + craft_v2([(0, 0, b"a", b"plain3")], 3))
    with kstore.Log.open(os.path.join(d, "t-0")) as lg, \
            Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed") as c:
        c.assign([TP("t", 0)])
        assert [r.value for r in c.poll(500)[TP("t", 0)]] == [b"plain0"]
        cpu = time.process_time()
        assert c.poll(500) == {}
        assert time.process_time() - cpu < 0.25
        assert c.position(TP("t", 0)) == 2
        lg.append_batches(txn_batch(0, 4, control=1))                   # 4 COMMIT pid 4
        assert [r.value for r in c.poll(1000)[TP("t", 0)]] == [b"open2", b"plain3"]

@pytest.mark.parametrize("iso", ["read_uncommitted", "read_committed"])
def test_a_segment_of_markers_only_is_read_past_to_the_record_after_a_gap(tmp_path, iso):
    """More than a read's byte budget of markers, then a marker, a gap and a record in the next
    segment: the record is returned. Before, the read returned nothing, the position went past
    the markers to the gap and then on to the next segment's base, as for a compacted tail: the
    record was never returned (seen as a key's last value lost in a compacted log beside a
    transactional writer). Now the read passes over markers outside its byte budget, and a
    read that finds no record moves past markers only (fetcher.after_empty_read)."""
    d = str(tmp_path / "data")
    at = markers_then_records(d)
    with Consumer(d, auto_offset_reset="earliest", isolation_level=iso) as c:
        c.assign([TP("t", 0)])
        got = []
        for _ in range(5):
            for recs in c.poll(200).values():
                got += [(r.offset, r.value) for r in recs]
        assert got == [(at, b"plain"), (at + 1, b"next")]
        assert c.position(TP("t", 0)) == at + 2


def test_read_committed_end_is_never_below_the_log_start(tmp_path):
    """An open transaction whose first records are deleted (delete_records, retention) under a
    consumer that has seen them: the last stable offset is the log start, as Kafka's (its
    firstUnstableOffset is raised to it), so end_offsets and seek_to_end give the log start.
    Before, they gave the deleted offset 1, below the log start."""
    d = str(tmp_path / "data")
    os.makedirs(d)
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"plain0")])                                  # 0
        lg.append_batches(txn_batch(0, 4, [b"open1"]))                  # 1 pid 4, open
        lg.append([(b"a", b"plain2")])                                  # 2
        lg.append([(b"a", b"plain3")])                                  # 3
        lg.roll()
        lg.append([(b"a", b"plain4")])                                  # 4
        with Consumer(d, auto_offset_reset="latest", isolation_level="read_committed") as c:
            c.assign([TP("t", 0)])
            assert c.end_offsets([TP("t", 0)]) == {TP("t", 0): 1}
            lg.delete_records(3)
            assert c.end_offsets([TP("t", 0)]) == {TP("t", 0): 3}
            assert c.poll(100) == {}
            assert c.position(TP("t", 0)) == 3
            assert c.poll(100) == {} and c.position(TP("t", 0)) == 3
            lg.append_batches(txn_batch(0, 4, control=1))               # 5 COMMIT pid 4
            assert [r.value for r in c.poll(1000)[TP("t", 0)]] == [b"plain3", b"plain4"]
            assert c.poll(100) == {} and c.position(TP("t", 0)) == 6

def test_beside_a_writer_process_that_rolls_truncates_and_deletes(tmp_path, watchdog):
    """The consumer's view stays exact while another process rolls segments, truncates below
    its position (KIP-320's truncation detection; Kafka's out-of-range reset for a position
    with no epoch) and deletes and re-creates the topic."""
    watchdog(90)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run('m.create_topic("t", 1)',
              'for i in range(40): m.append_batch("t", 0, [(b"k%d" % i, b"x" * 50)])')   # rolls (1200 B)
        with Consumer(d, auto_offset_reset="earliest") as c, \
                Consumer(d, auto_offset_reset="latest") as late:
            c.assign([TP("t", 0)])
            late.assign([TP("t", 0)])
            got = []
            while len(got) < 40:
                got += [r.offset for r in c.poll(1000).get(TP("t", 0), [])]
            assert got == list(range(40))
            assert late.position(TP("t", 0)) == 40
            w.run('m.log("t", 0).truncate_to(25)')
            w.run('for i in range(3): m.append_batch("t", 0, [(b"n%d" % i, b"y")])')   # 25..27
            # c's position 40 (after a record of epoch 0) is past the cut, which started epoch
            # 1 at 25: back to 25, Kafka's consumer's "Truncation detected" (KIP-320), not to
            # the start; late read nothing (no epoch): past the new end (28), its reset policy
            recs = c.poll(2000).get(TP("t", 0), [])
            assert [(r.offset, r.key, r.leader_epoch) for r in recs] == \
                [(25, b"n0", 1), (26, b"n1", 1), (27, b"n2", 1)]
            assert late.poll(500) == {} and late.position(TP("t", 0)) == 28
            w.run('m.delete_topic("t")')
            assert c.poll(300) == {}                      # gone: nothing, no error
            w.run('m.create_topic("t", 1)', 'm.append_batch("t", 0, [(b"again", b"z")])')
            deadline = time.monotonic() + 20
            recs = []
            while not recs and time.monotonic() < deadline:
                recs = c.poll(500).get(TP("t", 0), [])
            assert [(r.offset, r.key) for r in recs] == [(0, b"again")]
    finally:
        w.close()


def test_read_committed_header_walk_refuses_hostile_lengths():
    """The header walk of read_committed checks every length before use: a negative or tiny
    batch length, or a v2 batch shorter than its header, raises CorruptRecordError naming the
    log and offset (never a loop or an IndexError)."""
    from kstore import CorruptRecordError
    from kstore.read_committed import TxnFilter

    class FakeLog:
        dir = "/store/t-0"
        log_start_offset = 0
        log_end_offset = 10
        segments = []

        def __init__(self, data):
            self.data = data

        def read_batches(self, offset, max_bytes):
            return memoryview(self.data)

    good = txn_batch(0, 7, [b"a"])
    for bad in (struct.pack(">qi", 0, -20) + bytes(60), struct.pack(">qi", 0, 2) + bytes(60),
                struct.pack(">qiib", 0, 30, 0, 2) + bytes(60)):
        with pytest.raises(CorruptRecordError, match="t-0"):
            TxnFilter(0).stable_offset(FakeLog(good + bad))


T0 = TP("t", 0)


def _read_until(c, n, tp=T0):
    """(offset, value) of tp's records polled until n arrived (at most 20 s)."""
    got = []
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        got += [(r.offset, r.value) for r in c.poll(500).get(tp, [])]
    return got


def test_a_topic_recreated_past_the_position_is_read_from_its_start(tmp_path, watchdog):
    """A topic deleted and re-created (by the writer process) between two polls, whose new log
    already ends past the consumer's position: a new topic, read by auto_offset_reset from its
    first record. The old code kept the position (100) and skipped the new topic's first 100
    records."""
    watchdog(90)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    old = 'for i in range(0, 100, 10): m.append_batch("t", 0, [(None, b"old%d" % j) for j in range(i, i + 10)])'
    new = 'for i in range(0, 150, 10): m.append_batch("t", 0, [(None, b"new%d" % j) for j in range(i, i + 10)])'
    try:
        w.run('m.create_topic("t", 1)', old)
        with Consumer(d, auto_offset_reset="earliest") as plain, \
                Consumer(d, "t", group_id="g", auto_offset_reset="earliest") as member:
            plain.assign([TP("t", 0)])
            for c in (plain, member):
                assert _read_until(c, 100) == [(i, b"old%d" % i) for i in range(100)]
            member.commit()
            w.run('m.delete_topic("t")', 'm.create_topic("t", 1)', new)
            for c in (plain, member):
                assert _read_until(c, 150) == [(i, b"new%d" % i) for i in range(150)]
                assert c.position(TP("t", 0)) == 150
            member.commit()
            assert member.committed(TP("t", 0)) == 150
    finally:
        w.close()


def test_a_topic_recreated_under_a_log_managers_consumer(tmp_path, watchdog):
    """The same through the producer's own LogManager (a new Log object for the new topic),
    with a producer thread appending to another topic meanwhile."""
    watchdog(60)
    m = kstore.LogManager(str(tmp_path / "data"))
    try:
        m.create_topic("t", 1)
        m.create_topic("u", 1)
        stop = threading.Event()

        def produce():
            while not stop.is_set():
                m.append_batch("u", 0, [(None, b"u")])
        th = threading.Thread(target=produce)
        th.start()
        try:
            m.append_batch("t", 0, [(None, b"old%d" % i) for i in range(100)])
            with Consumer(m, auto_offset_reset="earliest") as c:
                c.assign([TP("t", 0)])
                assert _read_until(c, 100) == [(i, b"old%d" % i) for i in range(100)]
                m.delete_topic("t")
                m.create_topic("t", 1)
                m.append_batch("t", 0, [(None, b"new%d" % i) for i in range(150)])
                assert _read_until(c, 150) == [(i, b"new%d" % i) for i in range(150)]
        finally:
            stop.set()
            join_all([th], 10)
    finally:
        m.close()


def test_a_recreated_topic_with_no_reset_policy_raises_until_a_seek(tmp_path):
    """auto_offset_reset="none": a position of the deleted topic raises OffsetOutOfRangeError
    saying so (once, not wrapped in itself as the first fix did), at every poll until a seek."""
    m = kstore.LogManager(str(tmp_path / "data"))
    try:
        m.create_topic("t", 1)
        m.append_batch("t", 0, [(None, b"old")] * 5)
        with Consumer(str(tmp_path / "data"), auto_offset_reset="none") as c:
            c.assign([T0])
            c.seek(T0, 0)
            assert len(_read_until(c, 5)) == 5
            m.delete_topic("t")
            m.create_topic("t", 1)
            m.append_batch("t", 0, [(None, b"new")] * 8)
            for _ in range(2):
                with pytest.raises(OffsetOutOfRangeError) as ei:
                    c.poll(timeout_ms=2000)
                assert str(ei.value) == (
                    "Offsets out of range with no configured reset policy for partitions: {t-0: 5} "
                    "(t-0 was deleted and re-created: position 5 belongs to the old topic)")
            c.seek_to_beginning()
            assert _read_until(c, 8) == [(i, b"new") for i in range(8)]
    finally:
        m.close()


def test_close_timeout_is_checked(group_store):
    """close(timeout) takes seconds >= 0 (Kafka: "The timeout cannot be negative."), refused
    before anything is closed; close(False) still means autocommit=False."""
    d, _m = group_store
    c = Consumer(d, group_id="g", auto_offset_reset="earliest")
    c.assign([TP("t", 0)])
    c.poll(timeout_ms=5000, max_records=3)
    for bad, msg in [(-1, "The timeout cannot be negative."), ("1", "close timeout must be a number"),
                     (True, "close timeout must be a number"), (float("nan"), "close timeout must be a number")]:
        with pytest.raises(InvalidConfigError, match=msg):
            c.close(timeout=bad)
        assert not c.closed
    c.close(False)
    assert c.closed
    from kstore.group_coordinator import GroupCoordinator
    with GroupCoordinator(d) as gc:
        assert gc.fetch_offsets("g") == {}
