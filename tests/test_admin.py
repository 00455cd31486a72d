"""kstore.tools.admin: `kstore topics`, get-offsets, log-dirs, delete-records and assign-replicas, run
through the CLI entry point with exact output and exit status."""
import json
import os

import pytest

import kstore
from kstore.tools.cli import main


def run(capsys, *argv):
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.fixture
def store(tmp_path):
    d = str(tmp_path / "store")
    with kstore.LogManager(d, {"log.cleaner.enable": False}) as m:
        m.create_topic("clicks", 2)
        m.create_topic("users", 1, {"cleanup.policy": "compact"})
        for i in range(10):
            m.append("clicks", None, b"c%d" % i, partition=i % 2, timestamp=1000 + i)
        m.append("users", b"u", b"x", timestamp=5000)
    return d


def test_topics_create_list_describe(tmp_path, capsys):
    d = str(tmp_path / "s")
    assert run(capsys, "topics", "create", "--log-dirs", d, "--topic", "T", "--partitions", "3",
               "--config", "cleanup.policy=compact,delete", "--config", "segment.bytes=4096") == \
        (0, "Created topic T.\n", "")
    assert sorted(n for n in os.listdir(d) if n.startswith("T-")) == ["T-0", "T-1", "T-2"]
    rc, out, err = run(capsys, "topics", "create", "--log-dirs", d, "--topic", "T")
    assert (rc, out, err) == (1, "", "kstore: error: Topic 'T' already exists.\n")
    assert run(capsys, "topics", "create", "--log-dirs", d, "--topic", "T", "--if-not-exists")[0] == 0
    assert run(capsys, "topics", "list", "--log-dirs", d) == (0, "T\n", "")
    rc, out, _ = run(capsys, "topics", "describe", "--log-dirs", d, "--topic", "T")
    lines = out.splitlines()
    assert rc == 0 and len(lines) == 4
    assert lines[0].startswith("Topic: T\tTopicId: ")
    assert lines[0].endswith("\tPartitionCount: 3\tReplicationFactor: 1\t"
                             "Configs: cleanup.policy=compact,delete,segment.bytes=4096")
    assert lines[1] == (f"\tTopic: T\tPartition: 0\tLogDir: {d}\tLogStartOffset: 0\tLogEndOffset: 0"
                        f"\tSize: 0\tSegments: 1")
    tid = lines[0].split("TopicId: ")[1].split("\t")[0]
    assert open(os.path.join(d, "T-1", "partition.metadata")).read() == f"version: 0\ntopic_id: {tid}\n"


def test_topics_alter_and_delete(store, capsys):
    rc, out, _ = run(capsys, "topics", "alter", "--log-dirs", store, "--topic", "users",
                     "--config", "retention.ms=3600000", "--partitions", "3")
    assert rc == 0
    assert out == ("Added partitions [1, 2] to users.\n"
                   "Completed updating config for topic users: cleanup.policy=compact,retention.ms=3600000\n")
    rc, out, _ = run(capsys, "topics", "alter", "--log-dirs", store, "--topic", "users",
                     "--delete-config", "retention.ms")
    assert out == "Completed updating config for topic users: cleanup.policy=compact\n"
    rc, out, _ = run(capsys, "topics", "describe", "--log-dirs", store, "--topic", "users", "--json")
    desc = json.loads(out)
    assert desc["partitionCount"] == 3 and desc["configs"] == {"cleanup.policy": "compact"}
    assert [(p["partition"], p["logEndOffset"]) for p in desc["partitions"]] == [(0, 1), (1, 0), (2, 0)]
    with kstore.LogManager(store, {"log.cleaner.enable": False}) as m:     # the change persisted
        assert m.topic_config("users").overrides == {"cleanup.policy": ("compact",)}
        assert m.partitions("users") == [0, 1, 2]
    assert run(capsys, "topics", "delete", "--log-dirs", store, "--topic", "users")[0] == 0
    assert sorted(n.split(".")[0] for n in os.listdir(store) if n.endswith("-delete")) == \
        ["users-0", "users-1", "users-2"]
    assert run(capsys, "topics", "list", "--log-dirs", store)[1] == "clicks\n"
    rc, _, err = run(capsys, "topics", "delete", "--log-dirs", store, "--topic", "users")
    assert rc == 1 and "does not exist" in err
    assert run(capsys, "topics", "delete", "--log-dirs", store, "--topic", "users", "--if-exists")[0] == 0


def test_reading_commands_work_beside_the_owner(store, capsys):
    """list, describe, get-offsets and log-dirs open read-only: the owner keeps its lock."""
    with kstore.LogManager(store, {"log.cleaner.enable": False}) as m:
        m.append("clicks", None, b"late", partition=0, timestamp=9000)
        assert run(capsys, "topics", "list", "--log-dirs", store)[1] == "clicks\nusers\n"
        assert run(capsys, "get-offsets", "--log-dirs", store, "--topic", "clicks")[1] == \
            "clicks:0:6\nclicks:1:5\n"
        rc, _, err = run(capsys, "topics", "create", "--log-dirs", store, "--topic", "x")
        assert rc == 1 and err.startswith("kstore: error: ") and "lock" in err.lower()


def test_get_offsets_by_time(store, capsys):
    g = lambda *a: run(capsys, "get-offsets", "--log-dirs", store, *a)[1]  # noqa: E731
    assert g() == "clicks:0:5\nclicks:1:5\nusers:0:1\n"
    assert g("--topic", "clicks", "--time", "earliest") == "clicks:0:0\nclicks:1:0\n"
    assert g("--topic", "clicks", "--time", "-2") == "clicks:0:0\nclicks:1:0\n"
    # clicks partition 0 holds timestamps 1000,1002,..; partition 1 holds 1001,1003,..
    assert g("--topic", "clicks", "--time", "1003") == "clicks:0:2\nclicks:1:1\n"
    assert g("--topic", "clicks", "--time", "1009", "--partitions", "0") == "clicks:0:\n"
    assert g("--topic", "clicks", "--time", "max-timestamp") == "clicks:0:4\nclicks:1:4\n"
    assert g("--topic", "clicks", "--time", "1970-01-01T00:00:01.003Z") == "clicks:0:2\nclicks:1:1\n"
    rc, _, err = run(capsys, "get-offsets", "--log-dirs", store, "--topic", "nope")
    assert (rc, err) == (1, f"kstore: error: Topic 'nope' does not exist in {store}\n")


def test_log_dirs_json(store, tmp_path, capsys):
    missing = str(tmp_path / "missing")
    rc, out, _ = run(capsys, "log-dirs", "--log-dirs", f"{store},{missing}", "--topic-list", "clicks")
    doc = json.loads(out)
    sizes = {p: os.path.getsize(os.path.join(store, p, "00000000000000000000.log")) for p in ("clicks-0", "clicks-1")}
    assert doc == {"version": 1, "brokers": [{"broker": 0, "logDirs": [
        {"logDir": store, "error": None, "partitions": [
            {"partition": "clicks-0", "size": sizes["clicks-0"], "offsetLag": 0, "isFuture": False},
            {"partition": "clicks-1", "size": sizes["clicks-1"], "offsetLag": 0, "isFuture": False}]},
        {"logDir": missing, "error": f"KafkaStorageException: {missing} is not a directory", "partitions": []}]}]}


def test_delete_records(store, tmp_path, capsys):
    spec = tmp_path / "del.json"
    spec.write_text(json.dumps({"partitions": [{"topic": "clicks", "partition": 0, "offset": 3},
                                               {"topic": "clicks", "partition": 1, "offset": 99}],
                                "version": 1}))
    rc, out, _ = run(capsys, "delete-records", "--log-dirs", store, "--offset-json-file", str(spec))
    assert rc == 1
    assert out.splitlines()[:3] == ["Executing records delete operation", "Records delete operation completed:",
                                    "partition: clicks-0\tlow_watermark: 3"]
    assert out.splitlines()[3].startswith("partition: clicks-1\terror: cannot delete records up to 99")
    rc, out, _ = run(capsys, "delete-records", "--log-dirs", store, "--topic", "clicks", "--offset", "-1")
    assert rc == 0 and out.splitlines()[2:] == ["partition: clicks-0\tlow_watermark: 5",
                                                "partition: clicks-1\tlow_watermark: 5"]
    # durable: a fresh reader sees the new log start offsets
    assert run(capsys, "get-offsets", "--log-dirs", store, "--topic", "clicks", "--time", "earliest")[1] == \
        "clicks:0:5\nclicks:1:5\n"
    spec.write_text("{not json")
    rc, _, err = run(capsys, "delete-records", "--log-dirs", store, "--offset-json-file", str(spec))
    assert rc == 1 and f"--offset-json-file {spec}" in err


def test_assign_replicas_prints_kafka_reassignment_json(store, tmp_path, capsys):
    rc, out, _ = run(capsys, "assign-replicas", "--log-dirs", store, "--topic", "clicks", "--broker-list", "0,1,2",
                     "--replication-factor", "2", "--start-index", "0", "--shift", "0")
    assert rc == 0
    assert out == (
        "Current partition replica assignment\n"
        '{"version":1,"partitions":[{"topic":"clicks","partition":0,"replicas":[0],"log_dirs":["any"]},'
        '{"topic":"clicks","partition":1,"replicas":[0],"log_dirs":["any"]}]}\n\n'
        "Proposed partition reassignment configuration\n"
        '{"version":1,"partitions":[{"topic":"clicks","partition":0,"replicas":[0,1],"log_dirs":["any","any"]},'
        '{"topic":"clicks","partition":1,"replicas":[1,2],"log_dirs":["any","any"]}]}\n')
    move = tmp_path / "move.json"
    move.write_text('{"topics": [{"topic": "users"}], "version": 1}')
    rc, out, _ = run(capsys, "assign-replicas", "--log-dirs", store, "--topics-to-move-json-file", str(move),
                     "--broker-list", "5,6", "--json", "--start-index", "1", "--shift", "0")
    assert json.loads(out) == {      # --json: the plain output's two documents, by their headings
        "current": {"version": 1, "partitions": [{"topic": "users", "partition": 0, "replicas": [0],
                                                  "log_dirs": ["any"]}]},
        "proposed": {"version": 1, "partitions": [{"topic": "users", "partition": 0, "replicas": [6],
                                                   "log_dirs": ["any"]}]}}
    # without a store: Kafka's seed layout for 6 partitions on 3 brokers, RF 3
    rc, out, _ = run(capsys, "assign-replicas", "--topic", "x", "--partitions", "6", "--broker-list", "0,1,2",
                     "--replication-factor", "3", "--start-index", "0", "--shift", "0", "--json")
    assert [p["replicas"] for p in json.loads(out)["proposed"]["partitions"]] == \
        [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1], [1, 0, 2], [2, 1, 0]]
    rc, _, err = run(capsys, "assign-replicas", "--topic", "x", "--partitions", "2", "--broker-list", "0",
                     "--replication-factor", "2")
    assert rc == 1 and "larger than available brokers: 1" in err


def test_usage_errors_exit_2_with_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["topics", "frobnicate"])
    assert e.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
    for cmd in ("topics", "produce", "consume", "get-offsets", "log-dirs", "delete-records",
                "assign-replicas", "dump-log", "quickstart"):
        with pytest.raises(SystemExit) as e:
            main([cmd, "--help"])
        assert e.value.code == 0
        assert "example" in capsys.readouterr().out


def test_missing_log_dirs_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["topics", "list"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(
        "kstore topics: error: --log-dirs is required (a comma-separated list of log dirs)\n")


def test_garbage_log_is_reported_not_shown_as_empty(store, capsys):
    """Issue 16 item 11: a .log of garbage, read-only, must not pass as an empty partition
    without a word: describe and log-dirs name the file, the position and what is wrong, as
    Kafka's dump does; a live owner's zero-filled runway and sound logs raise no warning."""
    with kstore.LogManager(store, {"log.cleaner.enable": False}) as m:
        m.append("clicks", None, b"late", partition=0, timestamp=9000)     # runway behind it
        for argv in (("topics", "describe"), ("log-dirs",)):
            rc, _out, err = run(capsys, *argv, "--log-dirs", store)
            assert (rc, err) == (0, "")
    bad = os.path.join(store, "users-0", "00000000000000000000.log")
    sound = os.path.getsize(bad)
    with open(bad, "ab") as f:
        f.write(b"\x00" * 8 + b"\x00\x00\x00\x05" + b"\xee" * 20)            # size 5 < 14
    warning = (f"kstore: warning: {bad}: position {sound}: 32 bytes that are not a valid batch "
               f"(record size 5 is smaller than the minimum record overhead (14)); the log's data "
               f"ends there\n")
    rc, out, err = run(capsys, "topics", "describe", "--log-dirs", store, "--topic", "users")
    assert (rc, err) == (0, warning)
    assert f"LogEndOffset: 1\tSize: {sound}\t" in out
    assert run(capsys, "log-dirs", "--log-dirs", store, "--topic-list", "users")[2] == warning
    with open(bad, "wb") as f:                                              # all garbage
        f.write(bytes(range(7, 107)))
    rc, out, err = run(capsys, "topics", "describe", "--log-dirs", store, "--topic", "users")
    assert "Size: 0\t" in out
    assert err == (f"kstore: warning: {bad}: position 0: 100 bytes that are not a valid batch "
                   f"(unknown magic byte 23); the "
                   f"log's data ends there\n")


# -- issue 16 items 8, 9, 10: configuration and usage errors -----------------------------------------
def _usage_error(capsys, *argv):
    with pytest.raises(SystemExit) as e:
        main(list(argv))
    cap = capsys.readouterr()
    return e.value.code, cap.out, cap.err


def test_unknown_topic_config_is_rejected_by_create_and_alter(store, capsys):
    rc, out, err = run(capsys, "topics", "create", "--log-dirs", store, "--topic", "T",
                       "--config", "segmnt.bytes=4096")
    assert (rc, out, err) == (1, "", "kstore: error: Unknown topic config name: segmnt.bytes "
                                     "(did you mean segment.bytes?)\n")
    assert "T" not in os.listdir(store) and not any(n.startswith("T-") for n in os.listdir(store))
    rc, _out, err = run(capsys, "topics", "alter", "--log-dirs", store, "--topic", "clicks",
                        "--config", "retention.msec=5")
    assert (rc, err) == (1, "kstore: error: Unknown topic config name: retention.msec (did you mean retention.ms?)\n")
    with pytest.raises(kstore.InvalidConfigError, match="Unknown topic config name: segmnt.bytes"):
        kstore.Log.open(os.path.join(store, "solo-0"), {"segmnt.bytes": 4096})


def test_stored_unknown_topic_config_still_loads(store, caplog):
    """A key an earlier version or a hand edit left in kstore-topic-config.json: the topic loads,
    the key is logged and ignored (Kafka validates names on create and alter only)."""
    import logging
    path = os.path.join(store, "kstore-topic-config.json")
    doc = json.load(open(path))
    doc["topics"]["users"]["segmnt.bytes"] = "4096"
    with open(path, "w") as f:
        json.dump(doc, f)
    with caplog.at_level(logging.WARNING, logger="kstore"):
        with kstore.LogManager(store, {"log.cleaner.enable": False}) as m:
            assert m.log("users", 0).config.compact
    assert any("segmnt.bytes" in r.getMessage() for r in caplog.records)


def test_broker_config_errors_and_notes(store, tmp_path, capsys, monkeypatch):
    """--broker-config: a missing file is a usage error (exit 2, no traceback); no warning about
    kstore's own progress setting; an empty server.properties says where the data goes."""
    missing = str(tmp_path / "nope.properties")
    code, _out, err = _usage_error(capsys, "topics", "create", "--topic", "t", "--broker-config", missing)
    assert code == 2 and err.startswith("usage: kstore topics ")
    assert err.endswith(f"kstore topics: error: --broker-config {missing}: no such file\n")
    props = tmp_path / "server.properties"
    props.write_text(f"log.dirs={store}\nnum.partitions=3\n")
    rc, out, err = run(capsys, "topics", "create", "--topic", "t3", "--broker-config", str(props))
    assert (rc, out, err) == (0, "Created topic t3.\n", "")
    assert sorted(n for n in os.listdir(store) if n.startswith("t3-")) == ["t3-0", "t3-1", "t3-2"]
    empty = tmp_path / "empty.properties"
    empty.write_text("# nothing\n")
    rc, out, err = run(capsys, "topics", "create", "--topic", "t4", "--broker-config", str(empty),
                       "--log-dirs", str(tmp_path / "given"))
    assert (rc, err) == (0, "")                       # --log-dirs given: no note
    import kstore.broker_config as bc
    monkeypatch.setitem(bc.BROKER_KEYS, "log.dir", (str(tmp_path / "kafka-logs"), bc.parse_str))
    rc, out, err = run(capsys, "topics", "create", "--topic", "t5", "--broker-config", str(empty))
    assert (rc, out) == (0, "Created topic t5.\n")
    assert err == (f"kstore: warning: {empty}: neither log.dirs nor log.dir is set: the data goes to "
                   f"{tmp_path / 'kafka-logs'} (Kafka's default log.dir)\n")
    assert os.path.isdir(tmp_path / "kafka-logs" / "t5-0")


def test_usage_errors_exit_2_with_the_subcommands_usage(store, capsys):
    code, _out, err = _usage_error(capsys, "get-offsets", "--log-dirs", store, "--bogus")
    assert code == 2 and err.startswith("usage: kstore get-offsets ")
    assert err.endswith("kstore get-offsets: error: unrecognized arguments: --bogus\n")
    code, _out, err = _usage_error(capsys, "topics", "list")
    assert (code, err.splitlines()[-1]) == (2, "kstore topics: error: --log-dirs is required "
                                               "(a comma-separated list of log dirs)")
    code, _out, err = _usage_error(capsys, "get-offsets", "--log-dirs", store, "--time", "soon")
    assert code == 2 and "--time 'soon'" in err
    code, _out, err = _usage_error(capsys, "delete-records", "--log-dirs", store, "--topic", "clicks",
                                   "--offset", "-7")
    assert (code, err.splitlines()[-1]) == (2, "kstore delete-records: error: offset -7 for clicks: an offset "
                                               "to delete records before is >= 0, or -1 for the high watermark")
    code, _out, err = _usage_error(capsys, "assign-replicas", "--topic", "x", "--partitions", "2",
                                   "--broker-list", "0,0")
    assert code == 2 and "repeats a broker id" in err


def test_get_offsets_for_a_missing_partition_is_an_error(store, capsys):
    rc, out, err = run(capsys, "get-offsets", "--log-dirs", store, "--topic", "clicks", "--partitions", "0,7")
    assert (rc, out, err) == (1, "", "kstore: error: Topic 'clicks' has no partition 7 (its partitions: 0, 1)\n")
    rc, out, err = run(capsys, "get-offsets", "--log-dirs", store, "--partitions", "9")
    assert (rc, out, err) == (1, "", "kstore: error: Could not match any topic-partitions with the "
                                     "specified filters\n")
    assert run(capsys, "get-offsets", "--log-dirs", store, "--partitions", "1") == (0, "clicks:1:5\n", "")


def test_negative_offsets_are_refused_by_the_library(store):
    """Minimal guards in local_log.py / log.py (owned by other parts of issue 14)."""
    with kstore.LogManager(store, {"log.cleaner.enable": False}) as m:
        lg = m.log("clicks", 0)
        with pytest.raises(kstore.OffsetOutOfRangeError, match="The offset -3 for .* is not valid"):
            lg.delete_records(-3)
        assert lg.log_start_offset == 0
        with pytest.raises(kstore.InvalidConfigError, match="max_records -1: expected None"):
            lg.read(0, max_records=-1)
        assert lg.read(0, max_records=0) == []
        assert [r.offset for r in lg.read(0, max_records=2)] == [0, 1]
