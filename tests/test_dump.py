"""kstore.tools.dump (`kstore dump-log`): Kafka's DumpLogSegments lines, corruption positions, index checks."""
import json
import os

from kstore.tools.cli import main


def make(tmp_path):
    import kstore
    d = str(tmp_path / "t-0")
    with kstore.Log.open(d, {"index.interval.bytes": 100}) as lg:
        for i in range(4):
            lg.append([(b"k%d" % i, b"value-%d" % i, 1000 + i, [("h", b"x")]), (None, None, 1000 + i)])
    return d


def test_dump_log_prints_kafka_lines(tmp_path, capsys):
    d = make(tmp_path)
    log = os.path.join(d, "00000000000000000000.log")
    assert main(["dump-log", "--files", log, "--print-data-log"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[:2] == [f"Dumping {log}", "Log starting offset: 0"]
    assert lines[2].startswith("baseOffset: 0 lastOffset: 1 count: 2 baseSequence: -1 lastSequence: -1 "
                               "producerId: -1 producerEpoch: -1 partitionLeaderEpoch: -1 "
                               "isTransactional: false isControl: false deleteHorizonMs: "
                               "OptionalLong.empty position: 0 CreateTime: 1000 size: ")
    assert lines[2].endswith("magic: 2 compresscodec: none crc: " + lines[2].split("crc: ")[1].split()[0]
                             + " isvalid: true")
    assert lines[3] == ("| offset: 0 CreateTime: 1000 keySize: 2 valueSize: 7 sequence: -1 "
                        "headerKeys: [h] key: k0 payload: value-0")
    assert lines[4] == ("| offset: 1 CreateTime: 1000 keySize: -1 valueSize: -1 sequence: -1 "
                        "headerKeys: [] key: null payload: null")
    assert len(lines) == 2 + 4 * 3


def test_dump_log_reports_corruption_with_position(tmp_path, capsys):
    d = make(tmp_path)
    log = os.path.join(d, "00000000000000000000.log")
    data = bytearray(open(log, "rb").read())
    second = data.index(b"k1") - 60
    data[-3] ^= 0xFF                                   # a flipped bit in the last batch
    open(log, "wb").write(bytes(data))
    assert main(["dump-log", "--files", log, "--json"]) == 2
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [r["isvalid"] for r in rows] == [True, True, True, False]
    open(log, "ab").write(b"\x01" * 30)                # a garbage tail
    assert main(["dump-log", "--files", log]) == 2
    out = capsys.readouterr().out
    assert f"at position {len(data)} that are not a valid batch" in out
    assert second > 0


def test_dump_index_checks_entries_against_the_log(tmp_path, capsys):
    d = make(tmp_path)
    idx = os.path.join(d, "00000000000000000000.index")
    tidx = os.path.join(d, "00000000000000000000.timeindex")
    assert main(["dump-log", "--files", f"{idx},{tidx}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Dumping {idx}" and out[1] == "offset: 5 position: 176"
    assert f"Dumping {tidx}" in out and "timestamp: 1002 offset: 5" in out
    assert main(["dump-log", "--files", idx, "--index-sanity-check"]) == 0
    assert capsys.readouterr().out == f"{idx} passed sanity check.\n"
    raw = bytearray(open(idx, "rb").read())
    raw[7] += 1                                        # first entry's position off by one
    open(idx, "wb").write(bytes(raw))
    assert main(["dump-log", "--files", idx, "--verify-index-only"]) == 2
    assert "is not the start of a batch" in capsys.readouterr().out


def _txn_batches():
    """A transactional data batch (producer 7, offsets 0-1) and its COMMIT marker (offset 2),
    as a broker writes them: attributes transactional (16) and control (32), CRC-32C valid."""
    import struct
    import kstore
    from kstore import _core

    def patch(raw, base, attrs):
        raw = bytearray(raw)
        struct.pack_into(">q", raw, 0, base)
        struct.pack_into(">h", raw, 21, attrs)
        struct.pack_into(">qhi", raw, 43, 7, 0, base)        # producerId, epoch, baseSequence
        struct.pack_into(">I", raw, 17, kstore.crc32c(bytes(raw[21:])))
        return bytes(raw)

    b = _core.BatchBuilder()
    b.build([(b"k0", b"v0", 1000), (b"k1", b"v1", 1001)], 2, 0, 0, False, 0, 1 << 62, False, 0)
    data = patch(b.getvalue(), 0, 16)
    b.build([(struct.pack(">hh", 0, 1), struct.pack(">hi", 0, 5), 1002)], 2, 0, 0, False, 0, 1 << 62, False, 0)
    marker = patch(b.getvalue(), 2, 16 | 32)
    return data, marker


def test_dump_log_shows_control_records_as_kafka_does(tmp_path, capsys):
    data, marker = _txn_batches()
    log = str(tmp_path / "00000000000000000000.log")
    with open(log, "wb") as f:
        f.write(data + marker)
    assert main(["dump-log", "--files", log, "--deep-iteration"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "producerId: 7 producerEpoch: 0" in lines[2] and "isTransactional: true isControl: false" in lines[2]
    assert lines[5].startswith("baseOffset: 2 lastOffset: 2 count: 1 baseSequence: 2 lastSequence: 2 "
                               "producerId: 7 producerEpoch: 0 partitionLeaderEpoch: -1 "
                               "isTransactional: true isControl: true ")
    assert lines[6] == ("| offset: 2 CreateTime: 1002 keySize: 4 valueSize: 6 sequence: 2 headerKeys: [] "
                        "endTxnMarker: COMMIT coordinatorEpoch: 5")
    assert main(["dump-log", "--files", log, "--deep-iteration", "--json"]) == 0
    rows = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert rows[1]["isControl"] is True
    assert rows[1]["records"][0]["endTxnMarker"] == "COMMIT"
    assert rows[1]["records"][0]["coordinatorEpoch"] == 5


def test_broker_txnindex_and_snapshot_files_are_tolerated(tmp_path, capsys):
    """A partition dir as a broker leaves it: transactional batches, a COMMIT marker, a .txnindex,
    producer-state .snapshot files, leader-epoch-checkpoint and partition.metadata. It opens,
    recovers, reads (the marker skipped), appends, and a deleted segment takes its .txnindex."""
    import kstore
    data, marker = _txn_batches()
    d = tmp_path / "t-0"
    d.mkdir()
    (d / "00000000000000000000.log").write_bytes(data + marker)
    (d / "00000000000000000000.txnindex").write_bytes(b"")
    (d / "00000000000000000003.snapshot").write_bytes(b"\x00\x01" + b"\x00" * 20)
    (d / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    (d / "partition.metadata").write_text("version: 0\ntopic_id: AAAAAAAAAAAAAAAAAAAAAA\n")
    with kstore.Log.open(str(d), {"segment.bytes": 200}) as lg:
        assert lg.log_end_offset == 3
        assert [(r.offset, r.key) for r in lg.read(0)] == [(0, b"k0"), (1, b"k1")]
        assert [r.offset for r in lg.read(2)] == []          # only the marker lies there
        lg.append([(b"k3", b"v3", 2000)])                 # rolls: segment.bytes=200
        assert [s.base_offset for s in lg.segments] == [0, 3]
        assert [(r.offset, r.key) for r in lg.read(2)] == [(3, b"k3")]
        assert lg.delete_records(3) == 3                  # drops segment 0 with its .txnindex
    names = sorted(os.listdir(d))
    assert "00000000000000000000.txnindex" not in names and "00000000000000000000.log" not in names
    assert "00000000000000000003.snapshot" in names and "leader-epoch-checkpoint" in names
    # the consumer tool prints data records only
    from kstore.tools.cli import main as cli
    (tmp_path / "store").mkdir()
    os.rename(d, tmp_path / "store" / "t-0")
    assert cli(["get-offsets", "--log-dirs", str(tmp_path / "store"), "--time", "earliest"]) == 0
    assert capsys.readouterr().out == "t:0:3\n"
    assert cli(["consume", "--log-dirs", str(tmp_path / "store"), "--topic", "t", "--from-beginning",
                "--print-offset"]) == 0
    assert capsys.readouterr().out == "Offset:3\tv3\n"
