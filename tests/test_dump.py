"""kstore.tools.dump (`kstore dump-log`): Kafka's DumpLogSegments lines, corruption positions, index checks."""
import json
import os
import struct

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
                               "producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 0 "
                               "isTransactional: false isControl: false deleteHorizonMs: "
                               "OptionalLong.empty position: 0 CreateTime: 1000 size: ")
    assert lines[2].endswith("magic: 2 compresscodec: none crc: " + lines[2].split("crc: ")[1].split()[0]
                             + " isvalid: true")
    assert lines[3] == ("| offset: 0 CreateTime: 1000 keySize: 2 valueSize: 7 sequence: -1 "
                        "headerKeys: [h] key: k0 payload: value-0")
    assert lines[4] == ("| offset: 1 CreateTime: 1000 keySize: -1 valueSize: -1 sequence: -1 "
                        "headerKeys: []")                 # null key and value: neither field
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
    assert out.endswith("Found 30 invalid bytes at the end of 00000000000000000000.log\n")
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
    assert capsys.readouterr().out == f"Dumping {idx}\n{idx} passed sanity check.\n"
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


# -- Kafka fidelity: golden files (tests/data/dump/, each names its inputs and Kafka's source) ----
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "dump")


def _hex_file(name):
    with open(os.path.join(DATA, name)) as f:
        return bytes.fromhex("".join(line.strip() for line in f if not line.startswith("#")))


def _golden(name, **paths):
    """A golden file's text: '#' lines are provenance; {name} placeholders are the test's paths."""
    with open(os.path.join(DATA, name), encoding="utf-8") as f:
        text = "".join(line for line in f if not line.startswith("#"))
    for k, v in paths.items():
        text = text.replace("{%s}" % k, v)
    return text


def _segment(tmp_path, data, base=0, sub="p-0"):
    d = tmp_path / sub
    d.mkdir(exist_ok=True)
    path = d / f"{base:020d}.log"
    path.write_bytes(data)
    return str(path)


def _kp_v2(records, *, base=0, codec=0, transactional=False, pid=-1, epoch=-1, seq=-1, control=False):
    """A v2 batch written by kafka-python's DefaultRecordBatchBuilder (an encoder independent of
    kstore's); `control` sets the control attribute (bit 5) and re-computes the CRC-32C."""
    import struct
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(2, codec, transactional, pid, epoch, seq, 1 << 20)
    for i, (key, value, ts, headers) in enumerate(records):
        b.append(i, ts, key, value, headers)
    raw = bytearray(b.build())
    struct.pack_into(">q", raw, 0, base)
    if control:
        struct.pack_into(">h", raw, 21, struct.unpack_from(">h", raw, 21)[0] | 32)
        import kstore
        struct.pack_into(">I", raw, 17, kstore.crc32c(bytes(raw[21:])))
    return bytes(raw)


def _kp_legacy(magic, codec, records, base=0):
    """v0/v1 messages written by kafka-python's LegacyRecordBatchBuilder (wrapped when codec)."""
    import struct
    from kafka.record.legacy_records import LegacyRecordBatchBuilder
    b = LegacyRecordBatchBuilder(magic, codec, 1 << 20)
    for i, (key, value, ts) in enumerate(records):    # v1 inner offsets are relative, v0 absolute
        b.append(i if magic == 1 and codec else base + i, ts, key, value)
    raw = bytearray(b.build())
    if codec:                                 # the wrapper carries the last offset
        struct.pack_into(">q", raw, 0, base + len(records) - 1)
        value = 26 if magic == 0 else 34      # where the wrapper's (keyless) value starts
        if codec == 1:
            struct.pack_into(">I", raw, value + 4, 0)    # gzip's MTIME: a fixed input
        import kstore
        struct.pack_into(">I", raw, 12, kstore.crc32(bytes(raw[16:])))
    return bytes(raw)


def _dump(*argv):
    import io
    import contextlib
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["dump-log", *argv])
    return rc, out.getvalue(), err.getvalue()


def test_golden_real_broker_batches(tmp_path):
    """Bytes a Kafka 0.11 broker (v2) and 0.10 broker (v0, v1) wrote, captured in kafka-python's
    test/record/test_records.py: every batch and record line as kafka-dump-log prints them."""
    for version in ("v0", "v1", "v2"):
        log = _segment(tmp_path, _hex_file(f"broker_{version}.hex"), sub=version)
        rc, out, err = _dump("--files", log, "--print-data-log")
        assert (rc, out) == (0, _golden(f"broker_{version}.golden", file=log)), version
        if version == "v2":      # its fourth batch starts again at offset 0, as captured
            assert err == f"Non-consecutive offsets in {log}\n  3 is followed by 0\n"
        else:
            assert err == ""


def test_golden_null_keys_tombstones_transactions_and_sequences(tmp_path):
    """A null key prints no key field, a null value no payload field; an idempotent batch's
    sequences wrap past 2^31-1 as Kafka's incrementSequence does; COMMIT and ABORT markers."""
    import struct
    data = _kp_v2([(b"k", b"v", 1000, []), (None, b"only-value", 1001, []), (b"only-key", None, 1002, []),
                   (None, None, 1003, [("h1", b"x"), ("h2", None)])])
    data += _kp_v2([(b"a", b"1", 2000, []), (b"b", b"2", 2001, [])], base=4, pid=29342342, epoch=15,
                   seq=(1 << 31) - 2)
    data += _kp_v2([(b"t", b"x", 3000, [])], base=6, transactional=True, pid=98323, epoch=99, seq=266)
    marker = struct.pack(">hi", 0, 100)
    data += _kp_v2([(struct.pack(">hh", 0, 1), marker, 3001, [])], base=7, transactional=True,
                   pid=98323, epoch=99, control=True)
    data += _kp_v2([(struct.pack(">hh", 0, 0), struct.pack(">hi", 0, 7), 3002, [])], base=8,
                   transactional=True, pid=98323, epoch=99, control=True)
    log = _segment(tmp_path, data)
    rc, out, err = _dump("--files", log, "--print-data-log")
    assert (rc, out, err) == (0, _golden("records_v2.golden", file=log), "")


def test_golden_legacy_compressed_wrappers(tmp_path):
    """gzip-wrapped v0 and v1 message sets (kafka-python's LegacyRecordBatchBuilder): the
    wrapper's line is `offset: <last offset>`, inner records carry their own isValid and crc
    (with Kafka's stray closing brace) and v1's relative inner offsets become absolute."""
    recs = [(b"k0", b"v0", 1000), (None, b"v1", 1001), (b"k2", None, 1002)]
    data = _kp_legacy(0, 1, recs, base=10) + _kp_legacy(1, 1, recs, base=13)
    log = _segment(tmp_path, data, base=10)
    rc, out, err = _dump("--files", log, "--print-data-log")
    assert (rc, out, err) == (0, _golden("legacy_gzip.golden", file=log), "")


# KRaft control values, written out byte by byte from Kafka's message schemas
# (clients/src/main/resources/common/message/*.json; flexible versions: compact arrays and
# strings are unsigned-varint length + 1, each struct ends with a tagged-field count)
KRAFT_VALUES = [
    # LeaderChangeMessage v0: Version 0, LeaderId 1, Voters [1, 2], GrantingVoters [1]
    (2, "0000" "00000001" "03" "0000000100" "0000000200" "02" "0000000100" "00"),
    # SnapshotHeaderRecord: Version 0, LastContainedLogTimestamp 1700000000000
    (3, "0000" "0000018bcfe56800" "00"),
    # SnapshotFooterRecord: Version 0, and one unknown tagged field (tag 5, 2 bytes) to skip
    (4, "0000" "01" "05" "02" "abcd"),
    # KRaftVersionRecord: Version 0, KRaftVersion 1
    (5, "0000" "0001" "00"),
    # VotersRecord: one voter 1, directory id 00..0f, endpoint CONTROLLER://localhost:9093,
    # supported kraft versions [0, 1]
    (6, "0000" "02" "00000001" "000102030405060708090a0b0c0d0e0f" "02" "0b" + b"CONTROLLER".hex()
     + "0a" + b"localhost".hex() + "2385" "00" "0000" "0001" "00" "00" "00"),
    # a control type Kafka does not know
    (9, "0000"),
]


def _kraft_log(tmp_path, values=KRAFT_VALUES, name="__cluster_metadata-0"):
    import struct
    data = b""
    for i, (type_id, value) in enumerate(values):
        data += _kp_v2([(struct.pack(">hh", 0, type_id), bytes.fromhex(value), 1700000000000 + i, [])],
                       base=i, control=True)
    return _segment(tmp_path, data, sub=name)


def test_golden_kraft_control_records(tmp_path):
    """LeaderChange, snapshot header/footer, kraft version and voters as DumpLogSegments'
    printControlRecord prints them (their generated JsonConverters' JSON), an unknown type as
    controlType: UNKNOWN(9); the same records in a KRaft snapshot (.checkpoint) file."""
    log = _kraft_log(tmp_path)
    rc, out, err = _dump("--files", log, "--deep-iteration")
    assert (rc, out, err) == (0, _golden("kraft_control.golden", file=log), "")
    snap = os.path.join(os.path.dirname(log), "00000000000000000006-0000000002.checkpoint")
    os.rename(log, snap)
    rc, out, _err = _dump("--files", snap, "--deep-iteration")
    assert out.splitlines()[:2] == [f"Dumping {snap}", "Snapshot end offset: 6, epoch: 2"]
    assert out.splitlines()[2:] == _golden("kraft_control.golden", file=log).splitlines()[2:]


def test_malformed_control_values_are_reported_not_raised(tmp_path, capsys):
    """A LeaderChange whose voter array runs past its value, and a marker value of 2 bytes:
    each record still prints (its meaning unknown), stderr names file, offset and position."""
    log = _kraft_log(tmp_path, [(2, "0000" "00000001" "09" "00000001"), (1, "0000")])
    rc, out, err = _dump("--files", log, "--deep-iteration")
    assert rc == 2
    lines = out.splitlines()
    assert lines[3] == "| offset: 0 CreateTime: 1700000000000 keySize: 4 valueSize: 11 sequence: -1 headerKeys: []"
    assert lines[5] == "| offset: 1 CreateTime: 1700000000001 keySize: 4 valueSize: 2 sequence: -1 headerKeys: []"
    assert err.splitlines() == [
        f"kstore dump-log: {log}: control record at offset 0 (batch at position 0): LeaderChangeMessage: "
        f"array of 8 elements in 4 bytes",
        f"kstore dump-log: {log}: control record at offset 1 (batch at position 83): Invalid value size "
        f"found for end transaction marker. Must have at least 6 bytes, but found only 2"]


def test_empty_index_and_max_bytes(tmp_path):
    """An empty .index prints "<path> is empty." (DumpLogSegments.dumpIndex); --max-bytes N
    dumps the batches that end within N and reports no corruption where it cut (Kafka's slice),
    while without it trailing bytes are reported as Kafka does."""
    d = make(tmp_path)
    idx = os.path.join(d, "00000000000000000000.index")
    open(idx, "wb").close()
    assert _dump("--files", idx) == (0, f"Dumping {idx}\n{idx} is empty.\n", "")
    assert _dump("--files", idx, "--index-sanity-check") == (0, f"Dumping {idx}\n{idx} is empty.\n", "")
    log = os.path.join(d, "00000000000000000000.log")
    rc, full, _ = _dump("--files", log)
    sizes = [int(line.split(" size: ")[1].split()[0]) for line in full.splitlines()[2:]]
    assert len(sizes) == 4
    for cut in (sizes[0] + sizes[1], sizes[0] + sizes[1] + 30):
        rc, out, err = _dump("--files", log, "--max-bytes", str(cut))
        assert (rc, out, err) == (0, "\n".join(full.splitlines()[:4]) + "\n", "")
    with open(log, "ab") as f:
        f.write(b"\x00" * 8 + b"\x00\x00\x00\x30" + b"\x07" * 20)   # a header that is no batch
    total = os.path.getsize(log)
    rc, out, err = _dump("--files", log)
    assert rc == 2
    assert out == full + "Found 32 invalid bytes at the end of 00000000000000000000.log\n"
    assert err == (f"kstore dump-log: found 32 bytes that are not a valid batch: unknown magic byte 7 "
                   f"({log}, position {total - 32})\n")


def test_skip_record_metadata_keeps_kafkas_prefixes(tmp_path):
    """--skip-record-metadata: "| key: K payload: V"; without a key Kafka's line is " payload: V"
    (its prefix goes with the key field), and a record with neither prints an empty line."""
    log = _segment(tmp_path, _kp_v2([(b"k", b"v", 1, []), (None, b"w", 2, []), (None, None, 3, [])]))
    rc, out, _err = _dump("--files", log, "--print-data-log", "--skip-record-metadata")
    assert out.splitlines()[3:] == ["| key: k payload: v", " payload: w", ""]


def test_hostile_bytes_never_escape_as_other_exceptions(tmp_path):
    """Bit flips and cuts in gzip v2 batches, gzip v0/v1 wrappers and KRaft control records:
    the dump exits 0 or 2 (corruption shown with file and position), never with IndexError,
    struct.error, zlib.error or a traceback. 300 seeded mutations."""
    import random
    import struct
    recs = [(b"k0", b"v0" * 20, 1000), (None, b"v1", 1001), (b"k2", None, 1002)]
    base = (_kp_v2([(b"a", b"x" * 50, 1, []), (None, b"y", 2, [])], codec=1)
            + _kp_legacy(0, 1, recs, base=2) + _kp_legacy(1, 1, recs, base=5)
            + b"".join(_kp_v2([(struct.pack(">hh", 0, t), bytes.fromhex(v), 5, [])], base=8 + i, control=True)
                       for i, (t, v) in enumerate(KRAFT_VALUES)))
    rng = random.Random(16)
    codes = set()
    for _ in range(300):
        d = bytearray(base)
        for _ in range(rng.randint(1, 4)):
            d[rng.randrange(len(d))] = rng.randrange(256)
        if rng.random() < 0.2:
            d = d[:rng.randrange(len(d))]
        rc, out, err = _dump("--files", _segment(tmp_path, bytes(d)), "--print-data-log")
        assert rc in (0, 2) and "Traceback" not in err
        if rc == 2:         # shown: a batch's CRC on its line, or file and position on stderr
            assert "isvalid: false" in out or ("kstore dump-log: " in err and "position" in err)
        codes.add(rc)
    assert codes == {0, 2}


def test_txnindex_entries_as_kafka_prints_them(tmp_path):
    """DumpLogSegments.dumpTxnIndex: one line per 34-byte AbortedTxn entry; a partial entry is
    reported with its position."""
    import struct
    path = tmp_path / "00000000000000000000.txnindex"
    entries = [(98323, 0, 6, 7), (7, 10, 12, 10)]
    path.write_bytes(b"".join(struct.pack(">hqqqq", 0, *e) for e in entries))
    assert _dump("--files", str(path)) == (0, (
        f"Dumping {path}\n"
        "version: 0 producerId: 98323 firstOffset: 0 lastOffset: 6 lastStableOffset: 7\n"
        "version: 0 producerId: 7 firstOffset: 10 lastOffset: 12 lastStableOffset: 10\n"), "")
    with open(path, "ab") as f:
        f.write(b"\x00" * 5)
    rc, out, err = _dump("--files", str(path))
    assert (rc, len(out.splitlines())) == (2, 3)
    assert err == f"kstore dump-log: {path}: position 68: 5 bytes, not a whole 34-byte aborted transaction entry\n"


def test_an_active_index_trimmed_by_a_roll_under_the_dump_is_read_again(tmp_path, capsys):
    """The writer rolls (trimming the active segment's preallocated .timeindex, 10 MiB, to its
    entries) while dump-log reads that file: the dump is of the trimmed file, as a dump after
    the roll. Before, the copy was torn (2 MiB read, then the rest gone): zeroed entries and
    'Mismatches in :...: size 2097152 is not a multiple of the entry size 12', exit 2."""
    import kstore
    from kstore.fileio import FileOps, set_file_ops
    d = str(tmp_path / "t-0")
    lg = kstore.Log.open(d, {"index.interval.bytes": 1})
    try:
        for i in range(5):
            lg.append([(b"k", b"v%d" % i, 1000 + i)])
        tindex = os.path.join(d, "00000000000000000000.timeindex")
        assert os.path.getsize(tindex) > 2 << 20                  # preallocated

        class RollAtThirdRead(FileOps):
            reads = 0

            def pread(self, fd, n, pos):
                RollAtThirdRead.reads += 1
                if RollAtThirdRead.reads == 3:                   # 2 MiB copied
                    lg.roll()
                return super().pread(fd, n, pos)

        prev = set_file_ops(RollAtThirdRead())
        try:
            rc = main(["dump-log", "--files", tindex])
        finally:
            set_file_ops(prev)
        torn = capsys.readouterr()
        raw = open(tindex, "rb").read()                          # trimmed: whole entries
        entries = [struct.unpack_from(">qi", raw, i) for i in range(0, len(raw), 12)]
        assert len(raw) % 12 == 0 and [ts for ts, _ in entries] == [1001, 1002, 1003, 1004]
        assert main(["dump-log", "--files", tindex]) == 0
        after = capsys.readouterr()
        assert after.out == f"Dumping {tindex}\n" + "".join(
            f"timestamp: {ts} offset: {rel}\n" for ts, rel in entries)
        assert (rc, torn) == (0, after)
    finally:
        lg.close()
