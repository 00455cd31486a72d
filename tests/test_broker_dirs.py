"""Partition directories as Kafka brokers write them (issue 16 "Done when"), built by the
tests from the format spec (tests/broker_dirs.py): LogAppendTime, snappy and lz4, transactions
with commit and abort markers, a compacted partition, a KRaft metadata log. kstore must read
every record exactly, give Kafka's answers to offset and time lookups, rebuild the indexes by
Kafka's rule, and read the same through a read-only view. kafka-python's captured broker bytes
(v0, v1, v2) are in tests/data/dump and test_dump.py."""
import os
import struct

import numpy as np
import pytest

import kstore

from broker_dirs import (CONTROL, LOG_APPEND_TIME, NOW, TRANSACTIONAL, control_key, end_txn_marker,
                         kafka_index_entries, kafka_lz4, leader_change, v2_batch, write_partition,
                         xerial_snappy)

BROKER_FILES = {"partition.metadata": b"version: 0\ntopic_id: 3Yq1v0XbRjqJgUZ8A3m0_w\n",
                "leader-epoch-checkpoint": b"0\n2\n0 0\n4 6\n"}


def both_views(d, config=None):
    """Records read through a writable open and a read-only one (they must agree)."""
    out = []
    for ro in (True, False):
        with kstore.Log.open(d, config, read_only=ro) as lg:
            out.append(([(r.offset, r.timestamp, r.timestamp_type, r.key, r.value, list(r.headers))
                         for r in lg.read(lg.log_start_offset, max_bytes=1 << 30)],
                        lg.log_start_offset, lg.log_end_offset))
    assert out[0] == out[1]
    return out[0]


def test_log_append_time_topic(tmp_path):
    """A LogAppendTime topic's batches carry the broker's time as max timestamp (the records'
    own deltas are the producer's): every record reads with it, type 1, and a time lookup
    answers the batch's first offset at or after it."""
    data = (v2_batch(0, [(0, 0, b"a", b"1"), (1, 7, b"b", b"2")], base_ts=NOW - 500,
                     attrs=LOG_APPEND_TIME, max_ts=NOW)
            + v2_batch(2, [(0, 3, None, b"3")], base_ts=NOW - 100, attrs=LOG_APPEND_TIME,
                       max_ts=NOW + 1000))
    d = write_partition(str(tmp_path), "lat-0", data, extra=BROKER_FILES)
    recs, start, end = both_views(d, {"message.timestamp.type": "LogAppendTime"})
    assert recs == [(0, NOW, 1, b"a", b"1", []), (1, NOW, 1, b"b", b"2", []),
                    (2, NOW + 1000, 1, None, b"3", [])]
    assert (start, end) == (0, 3)
    with kstore.Log.open(d, {"message.timestamp.type": "LogAppendTime"}, read_only=True) as lg:
        assert lg.fetch_offset_by_timestamp(NOW - 400) == (0, NOW)
        assert lg.fetch_offset_by_timestamp(NOW + 1) == (2, NOW + 1000)
        assert lg.fetch_offset_by_timestamp(-3) == (2, NOW + 1000)


@pytest.mark.parametrize("codec,frame", [(2, xerial_snappy), (3, kafka_lz4)])
def test_snappy_and_lz4_batches(tmp_path, codec, frame):
    """Compressed batches in Kafka's framings (xerial snappy, Kafka's LZ4 frame), one of them
    over 64 KiB of records (several blocks), beside an uncompressed one."""
    big = [(i, i, b"k%04d" % i, bytes([i % 251]) * 300) for i in range(400)]
    data = (v2_batch(0, [(0, 0, b"x", b"plain")])
            + v2_batch(1, [(0, 0, b"c", b"compressed"), (1, 1, None, None, [("h", b"v")])],
                       attrs=codec, codec_payload=frame)
            + v2_batch(3, big, attrs=codec, codec_payload=frame))
    d = write_partition(str(tmp_path), "z-0", data, extra=BROKER_FILES)
    recs, start, end = both_views(d)
    assert recs[:3] == [(0, NOW, 0, b"x", b"plain", []), (1, NOW, 0, b"c", b"compressed", []),
                        (2, NOW + 1, 0, None, None, [("h", b"v")])]
    assert recs[3:] == [(3 + i, NOW + i, 0, b"k%04d" % i, bytes([i % 251]) * 300, []) for i in range(400)]
    assert end == 403
    with kstore.Log.open(d, read_only=True) as lg:
        assert lg.offset_for_timestamp(NOW + 150) == 153


def test_transactions_with_commit_and_abort_markers(tmp_path):
    """Two transactional producers: one commits, one aborts (markers are control batches with
    the producer's id and epoch). Reads skip the markers and return the aborted records too (a
    read_uncommitted view, as the log holds them); offsets and the log end count the markers."""
    txn = dict(attrs=TRANSACTIONAL, producer_epoch=0)
    data = (v2_batch(0, [(0, 0, b"a", b"1"), (1, 1, b"a", b"2")], producer_id=1000, base_sequence=0, **txn)
            + v2_batch(2, [(0, 2, b"b", b"x")], producer_id=2000, base_sequence=0, **txn)
            + v2_batch(3, [(0, 3, control_key(1), end_txn_marker(5))], producer_id=1000,
                       attrs=TRANSACTIONAL | CONTROL, producer_epoch=0)
            + v2_batch(4, [(0, 4, control_key(0), end_txn_marker(5))], producer_id=2000,
                       attrs=TRANSACTIONAL | CONTROL, producer_epoch=0)
            + v2_batch(5, [(0, 5, b"c", b"after")]))
    # the broker's .txnindex entry for the aborted one: version, producer id, first and last
    # offset, last stable offset (AbortedTxn)
    txnindex = struct.pack(">hqqqq", 0, 2000, 2, 4, 5)
    d = write_partition(str(tmp_path), "tx-0", data,
                        extra={**BROKER_FILES, "00000000000000000000.txnindex": txnindex})
    recs, start, end = both_views(d)
    assert [(o, k, v) for o, _t, _tt, k, v, _h in recs] == [
        (0, b"a", b"1"), (1, b"a", b"2"), (2, b"b", b"x"), (5, b"c", b"after")]
    assert end == 6
    with kstore.Log.open(d, read_only=True) as lg:
        assert lg.fetch_offset_by_timestamp(NOW + 3) == (3, NOW + 3)       # the commit marker
    with open(os.path.join(d, "00000000000000000000.txnindex"), "rb") as f:
        assert f.read() == txnindex                         # left as the broker wrote it


def test_a_compacted_partition(tmp_path):
    """After the broker's cleaner: offset gaps inside batches (lastOffsetDelta kept), a batch
    emptied of records kept for its producer state, a tombstone; reads return exactly the
    survivors and the log end follows the last batch's lastOffsetDelta."""
    data = (v2_batch(0, [(1, 1, b"k1", b"v1b"), (3, 3, b"k2", None)], last_delta=4)
            + v2_batch(5, [], last_delta=2, producer_id=77, producer_epoch=0, base_sequence=5)
            + v2_batch(8, [(0, 0, b"k3", b"v3"), (2, 2, b"k1", b"v1c")], last_delta=3))
    d = write_partition(str(tmp_path), "c-0", data, extra=BROKER_FILES)
    recs, start, end = both_views(d, {"cleanup.policy": "compact"})
    assert [(o, k, v) for o, _t, _tt, k, v, _h in recs] == [
        (1, b"k1", b"v1b"), (3, b"k2", None), (8, b"k3", b"v3"), (10, b"k1", b"v1c")]
    assert end == 12
    with kstore.Log.open(d, {"cleanup.policy": "compact"}) as lg:
        assert lg.read(4, 1)[0].offset == 8                     # a gap: the next survivor
        assert lg.append([(b"k4", b"new")]).first_offset == 12
        assert lg.leader_epoch == 4


def test_a_kraft_metadata_log(tmp_path):
    """`__cluster_metadata-0`: a KRaft leader's first batch is a control batch (LeaderChange),
    then metadata records. A LogManager leaves the directory alone, as Kafka's LogManager does
    (the raft layer owns it); a Log reads it, skipping control records, and the first offset at
    its first timestamp is 0, as Kafka answers."""
    data = (v2_batch(0, [(0, 0, control_key(2), leader_change(1, [1, 2, 3]))], attrs=CONTROL,
                     leader_epoch=1)
            + v2_batch(1, [(0, 0, None, bytes.fromhex("0c0100")), (1, 1, None, bytes.fromhex("110000"))],
                       leader_epoch=1))
    d = write_partition(str(tmp_path), "__cluster_metadata-0", data,
                        extra={"leader-epoch-checkpoint": b"0\n1\n1 0\n", "quorum-state":
                               b'{"leaderId":1,"leaderEpoch":1,"votedId":-1,"data_version":1}'})
    with kstore.LogManager(str(tmp_path), read_only=True) as m:
        assert m.topics() == []
    recs, start, end = both_views(d)
    assert [(o, v) for o, _t, _tt, _k, v, _h in recs] == [(1, bytes.fromhex("0c0100")), (2, bytes.fromhex("110000"))]
    assert end == 3
    with kstore.Log.open(d, read_only=True) as lg:
        assert lg.fetch_offset_by_timestamp(NOW) == (0, NOW)


def test_indexes_rebuilt_by_kafkas_rule(tmp_path):
    """A broker dir whose indexes were lost: kstore's rebuild holds exactly the entries Kafka's
    LogSegment.recover makes (index.interval.bytes 4096, the broker default)."""
    data = b"".join(v2_batch(i * 10, [(j, j * 3, b"k%d" % j, b"v" * (50 + 40 * (i % 7))) for j in range(10)],
                             base_ts=NOW + i * 100)
                    for i in range(60))
    d = write_partition(str(tmp_path), "i-0", data, extra=BROKER_FILES)
    offsets, times = kafka_index_entries(data, 4096)
    assert len(offsets) > 5
    with kstore.Log.open(d, {"index.interval.bytes": 4096}) as lg:
        assert lg.log_end_offset == 600
    idx = np.fromfile(os.path.join(d, "00000000000000000000.index"), dtype=">i4").reshape(-1, 2)
    assert [tuple(map(int, e)) for e in idx] == offsets
    tidx = open(os.path.join(d, "00000000000000000000.timeindex"), "rb").read()
    got = [struct.unpack_from(">qi", tidx, i) for i in range(0, len(tidx), 12)]
    # and at close the active segment's final entry, as Kafka's LogSegment.close adds it
    assert got == times + [(NOW + 59 * 100 + 27, 599)]
