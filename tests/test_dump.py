"""kstore.dump (`kstore dump-log`): Kafka's DumpLogSegments lines, corruption positions, index checks."""
import json
import os

from kstore.cli import main


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
