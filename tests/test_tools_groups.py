"""`kstore consumer-groups` (tools/groups.py): kafka-consumer-groups.sh's output over a store,
among them a broker-written `__consumer_offsets` partition built byte for byte from Kafka's
layouts (kafka-python's v2 batch builder, Kafka's record schemas, a compacted batch with gaps,
a gzip batch, value versions 0, 1, 3 and 4, GroupMetadata v0 and v3, a KIP-848 record)."""
from __future__ import annotations

import io
import json
import os
import struct
from contextlib import redirect_stderr, redirect_stdout

import pytest

import kstore
from kstore import Log, TopicPartition
from kstore.group_coordinator import GroupCoordinator
from kstore.group_records import (GroupMetadata, MemberMetadata, OffsetAndMetadata,
                                  assignment_bytes, group_metadata_key, group_metadata_value,
                                  offset_commit_key, offset_commit_value, partition_for,
                                  subscription_bytes)
from kstore.tools.cli import main

TP = TopicPartition
NOW = 1_700_000_000_000
MEMBER_ID = "consumer-1-7d3b2c1e-5f4a-4e2b-9c1d-0a1b2c3d4e5f"


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(["consumer-groups", *argv])
    return rc, out.getvalue(), err.getvalue()


def same_partition(prefix: str, target: int) -> str:
    """The first group id `prefix-i` that Kafka puts in __consumer_offsets partition target."""
    i = 0
    while partition_for(f"{prefix}-{i}", 50) != target:
        i += 1
    return f"{prefix}-{i}"


def kp_batch(base, records, *, codec=0, last_delta=None):
    """A v2 batch by kafka-python's DefaultRecordBatchBuilder (independent of kstore's encoder):
    records are (offset delta, key, value, timestamp); last_delta rewrites lastOffsetDelta (a
    batch the broker's cleaner emptied at its end keeps its last offset) and the CRC-32C."""
    from kafka.record.default_records import DefaultRecordBatchBuilder
    b = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
    for delta, key, value, ts in records:
        b.append(delta, ts, key, value, [])
    raw = bytearray(b.build())
    struct.pack_into(">q", raw, 0, base)
    if last_delta is not None:
        struct.pack_into(">i", raw, 23, last_delta)
        struct.pack_into(">I", raw, 17, kstore.crc32c(bytes(raw[21:])))
    return bytes(raw)


def broker_store(tmp_path):
    """A broker's log dir after a clean shutdown: orders-0/1 and one compacted
    __consumer_offsets partition holding four groups."""
    d = tmp_path / "kafka-logs"
    d.mkdir()
    for p, n in ((0, 40), (1, 25)):
        with Log.open(str(d / f"orders-{p}")) as lg:
            lg.append([(b"k%d" % i, b"v", NOW + i) for i in range(n)])
        marker = d / f"orders-{p}" / ".kstore-clean-shutdown"      # not a broker's file
        if marker.exists():
            marker.unlink()
    pay = "payments"
    part = partition_for(pay, 50)
    archived, flex, new = (same_partition(x, part) for x in ("archived", "flex", "newproto"))
    member = MemberMetadata(MEMBER_ID, None, "consumer-1", "/10.0.0.7", 300000, 45000,
                            subscription_bytes(["orders"]), assignment_bytes([TP("orders", 0)]))
    v3 = lambda o, e=None, m="": offset_commit_value(OffsetAndMetadata(o, m, e, NOW), 3)  # noqa: E731
    data = b"".join([
        # offsets 1 and 3 were compacted away; the batch keeps its last offset (3)
        kp_batch(0, [(0, offset_commit_key(pay, "orders", 0), v3(10), NOW),
                     (2, offset_commit_key(pay, "old-topic", 0), v3(3), NOW)], last_delta=3),
        kp_batch(4, [(0, offset_commit_key(pay, "orders", 1),
                      offset_commit_value(OffsetAndMetadata(20, "", None, NOW, NOW + 86_400_000), 1), NOW),
                     (1, offset_commit_key(archived, "orders", 0),
                      offset_commit_value(OffsetAndMetadata(7, "", None, NOW - 5), 0), NOW),
                     (2, group_metadata_key(archived),
                      group_metadata_value(GroupMetadata("consumer", 1, None, None, -1, ()), 0), NOW)],
                 codec=1),                                   # gzip
        kp_batch(7, [(0, offset_commit_key(pay, "orders", 0), v3(30, 4, "m"), NOW + 1),
                     (1, offset_commit_key(pay, "old-topic", 0), None, NOW + 1)]),
        kp_batch(9, [(0, group_metadata_key(pay),
                      group_metadata_value(GroupMetadata("consumer", 5, "range", MEMBER_ID, NOW, (member,)), 3), NOW)]),
        kp_batch(10, [(0, struct.pack(">h", 3) + struct.pack(">h", len(new)) + new.encode(),
                       b"\x00\x00" + b"kip-848 group", NOW),
                      (1, offset_commit_key(flex, "orders", 1),
                       offset_commit_value(OffsetAndMetadata(11, "f", 2, NOW), 4), NOW)]),
    ])
    pd = d / f"__consumer_offsets-{part}"
    pd.mkdir()
    (pd / "00000000000000000000.log").write_bytes(data)
    (pd / "00000000000000000000.index").write_bytes(b"")
    (pd / "00000000000000000000.timeindex").write_bytes(b"")
    (pd / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    (pd / "partition.metadata").write_text("version: 0\ntopic_id: 0sS9a3rBQ5yrPWv0QAHj_Q\n")
    (d / ".kafka_cleanshutdown").write_text("")
    (d / "recovery-point-offset-checkpoint").write_text(f"0\n1\n__consumer_offsets {part} 12\n")
    return str(d), pd, {"archived": archived, "flex": flex, "new": new}


def test_describe_a_brokers_consumer_offsets(tmp_path):
    d, pd, names = broker_store(tmp_path)
    before = {n: (pd / n).read_bytes() for n in os.listdir(pd)}
    rc, out, err = run("--log-dirs", d, "--describe", "--group", "payments")
    assert rc == 0 and err == ""
    w = len(MEMBER_ID)
    assert out == (
        f"\n{'GROUP':<15} {'TOPIC':<15} {'PARTITION':<10} {'CURRENT-OFFSET':<15} {'LOG-END-OFFSET':<15} "
        f"{'LAG':<15} {'CONSUMER-ID':<{w}} {'HOST':<15} CLIENT-ID"
        f"\n{'payments':<15} {'orders':<15} {'0':<10} {'30':<15} {'40':<15} {'10':<15} {MEMBER_ID} "
        f"{'/10.0.0.7':<15} consumer-1"
        f"\n{'payments':<15} {'orders':<15} {'1':<10} {'20':<15} {'25':<15} {'5':<15} {'-':<{w}} "
        f"{'-':<15} -\n")
    assert out.splitlines()[1].startswith("GROUP           TOPIC           PARTITION  CURRENT-OFFSET  ")
    rc, out, err = run("--log-dirs", d, "--describe", "--group", names["archived"])
    assert rc == 0
    assert err == f"\nConsumer group '{names['archived']}' has no active members.\n"
    assert out.splitlines()[2].split() == [names["archived"], "orders", "0", "7", "40", "33", "-", "-", "-"]
    rc, out, _ = run("--log-dirs", d, "--describe", "--group", names["flex"], "--json")
    assert json.loads(out)["offsets"] == [{
        "group": names["flex"], "topic": "orders", "partition": 1, "current_offset": 11,
        "log_end_offset": 25, "lag": 14, "consumer_id": "-", "host": "-", "client_id": "-"}]
    rc, out, _ = run("--log-dirs", d, "--list")
    assert out.split() == sorted([names["archived"], names["flex"], "payments"])
    rc, out, _ = run("--log-dirs", d, "--describe", "--group", "payments", "--members", "--verbose")
    assert out.splitlines()[1:] == [
        f"{'GROUP':<15} {'CONSUMER-ID':<{w}} {'HOST':<15} {'CLIENT-ID':<15} {'#PARTITIONS':<15} ASSIGNMENT",
        f"{'payments':<15} {MEMBER_ID} {'/10.0.0.7':<15} {'consumer-1':<15} {'1':<15} (0)"]
    rc, out, _ = run("--log-dirs", d, "--describe", "--group", "payments", "--state")
    assert out.splitlines()[2].split()[-3:] == ["range", "Stable", "1"]
    # reading changed nothing in the broker's partition
    assert {n: (pd / n).read_bytes() for n in os.listdir(pd)} == before
    # a commit appends after the broker's batches (the open recovers the segment first)
    with GroupCoordinator(d) as gc:
        assert gc.fetch_offsets("payments")[TP("orders", 0)] == OffsetAndMetadata(30, "m", 4, NOW)
        gc.commit_offsets(names["archived"], {TP("orders", 0): 39})
    with Log.open(str(pd), read_only=True) as lg:
        assert lg.log_end_offset == 13
    assert (pd / "00000000000000000000.log").read_bytes()[:len(before["00000000000000000000.log"])] == \
        before["00000000000000000000.log"]
    rc, out, _ = run("--log-dirs", d, "--describe", "--group", names["archived"])
    assert out.splitlines()[2].split()[3:6] == ["39", "40", "1"]


def test_describe_missing_group(tmp_path):
    d, _, _ = broker_store(tmp_path)
    rc, out, err = run("--log-dirs", d, "--describe", "--group", "nobody")
    assert rc == 0 and out == "\nError: Consumer group 'nobody' does not exist.\n" and err == ""


@pytest.fixture
def store(tmp_path):
    d = str(tmp_path)
    with kstore.LogManager(d) as m:
        m.create_topic("t", 2)
        for p in range(2):
            for i in range(50):
                m.append_batch("t", p, [(b"k", b"v", NOW + i * 1000)])
    with GroupCoordinator(d) as gc:
        gc.commit_offsets("g", {TP("t", 0): 10, TP("t", 1): 45})
    return d


def test_reset_offsets_dry_run_then_execute(store):
    fmt = "\n{:<30} {:<30} {:<10} {:<15}"
    rc, out, err = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--topic", "t",
                       "--shift-by", "10")
    assert rc == 0
    assert out == (fmt.format("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET") + fmt.format("g", "t", 0, 20)
                   + fmt.format("g", "t", 1, 50) + "\n")
    assert err == "New offset (55) is higher than latest offset for topic partition t-1. Value will be set to 50\n"
    with GroupCoordinator(store) as gc:          # a dry run commits nothing
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 10, TP("t", 1): 45}
    rc, out, _ = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--topic", "t:1",
                     "--to-datetime", "2023-11-14T22:13:40.000Z", "--execute")     # NOW + 20 s
    assert rc == 0 and out == fmt.format("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET") + fmt.format("g", "t", 1, 20) + "\n"
    rc, out, _ = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--all-topics",
                     "--to-earliest", "--execute", "--json")
    assert json.loads(out) == [{"group": "g", "topic": "t", "partition": 0, "new_offset": 0},
                               {"group": "g", "topic": "t", "partition": 1, "new_offset": 0}]
    rc, out, _ = run("--log-dirs", store, "--reset-offsets", "--group", "new", "--topic", "t:0",
                     "--to-latest", "--execute")
    with GroupCoordinator(store) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 0, TP("t", 1): 0}
        assert gc.fetch_offsets("new") == {TP("t", 0): gc.fetch_offsets("new")[TP("t", 0)]}
        assert gc.fetch_offsets("new")[TP("t", 0)].offset == 50


def test_to_datetime_without_a_zone_is_utc_and_ms_count(store, monkeypatch):
    """Kafka's Utils.getDateTime appends Z to a time without a zone, and its SSS counts
    milliseconds ('.5' is 5 ms): the same text resets to the same offsets on every machine.
    Before, kstore read it in the local zone (5 h 30 early in Kolkata: offset 0) and '.5' as
    500 ms."""
    import time
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        fmt = "\n{:<30} {:<30} {:<10} {:<15}"
        for text, offset in (("2023-11-14T22:13:40", 20), ("2023-11-14T22:13:40.5", 21),
                             ("2023-11-14T22:13:40.5Z", 21), ("2023-11-15T03:43:40+05:30", 20)):
            rc, out, err = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--topic",
                               "t:1", "--to-datetime", text)
            assert (rc, err) == (0, "") and out == (fmt.format("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")
                                                    + fmt.format("g", "t", 1, offset) + "\n"), text
        with pytest.raises(SystemExit) as e:                                 # Kafka refuses it
            run("--log-dirs", store, "--reset-offsets", "--group", "g", "--topic", "t:1",
                "--to-datetime", "2023-11-14T22:13:40+0530")
        assert e.value.code == 2
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_reset_refused_while_members_live(store):
    with GroupCoordinator(store) as gc:
        gc.store_group("g", GroupMetadata("consumer", 1, "range", "m", NOW, (
            MemberMetadata("m", None, "c", "/h", 1, 1, subscription_bytes(["t"]), assignment_bytes([TP("t", 0)])),)))
    rc, out, _ = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--topic", "t", "--to-earliest", "--execute")
    assert rc == 1
    assert out == "\nError: Assignments can only be reset if the group 'g' is inactive, but the current state is Stable.\n\n"
    with GroupCoordinator(store) as gc:
        assert gc.fetch_offsets("g")[TP("t", 0)].offset == 10


def test_reset_offsets_of_an_unknown_topic_or_partition(store):
    """Kafka's kafka-consumer-groups --reset-offsets: a topic the cluster does not have fails
    the command (describeTopics: UnknownTopicOrPartitionException, printed on stdout); a named
    partition it does not host has no log start/end/timestamp offset (printUsageAndExit's line
    on stderr) or, for --to-offset, is refused by the broker's OffsetCommit. Exit status 1 and
    nothing committed for any group, dry run or --execute; --all-topics skips nothing silently."""
    unknown = ("\nError: Executing consumer group command failed due to UnknownTopicOrPartitionException: "
               "This server does not host this topic-partition.\n")
    for args in (["--topic", "nope", "--to-earliest"], ["--topic", "t", "--topic", "nope", "--to-latest"],
                 ["--topic", "nope:0", "--to-offset", "3"], ["--topic", "t:0,2", "--to-offset", "3"],
                 ["--topic", "t:2", "--to-current"]):
        for mode in ([], ["--execute"]):
            rc, out, err = run("--log-dirs", store, "--reset-offsets", "--group", "g", *args, *mode)
            assert (rc, out, err) == (1, unknown, ""), args
    for opt, what in (("--to-earliest", "starting offset"), ("--to-latest", "ending offset"),
                      ("--to-datetime=2023-11-14T22:13:40.000Z", "offset by timestamp")):
        rc, out, err = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--topic", "t:1,2",
                           opt, "--execute")
        assert (rc, out, err) == (1, "", f"Error getting {what} of topic partition: t-2\n")
    rc, out, err = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--topic", "t:5", "--shift-by", "1")
    assert (rc, out, err) == (1, "", "kstore: error: Cannot shift offset for partition t-5 since there is "
                                     "no current committed offset\n")
    with GroupCoordinator(store) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 10, TP("t", 1): 45}
        with pytest.raises(kstore.UnknownTopicError):   # what --execute would have met
            gc.commit_offsets("g", {TP("t", 2): 3})


def test_reset_of_several_groups_commits_none_when_one_fails(store):
    """--execute over several groups: a group whose offsets cannot be computed (h has no
    committed offset to shift) fails the command before any group's offsets are written."""
    rc, out, err = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--group", "h",
                       "--topic", "t:0", "--shift-by", "1", "--execute")
    assert (rc, out, err) == (1, "", "kstore: error: Cannot shift offset for partition t-0 since there is "
                                     "no current committed offset\n")
    with GroupCoordinator(store) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 10, TP("t", 1): 45}
        assert gc.fetch_offsets("h") == {}


def test_delete_groups(store):
    rc, out, _ = run("--log-dirs", store, "--delete", "--group", "g")
    assert rc == 0 and out == "Deletion of requested consumer groups ('g') was successful.\n"
    rc, out, _ = run("--log-dirs", store, "--delete", "--group", "g")
    assert rc == 1
    assert out == ("\nError: Deletion of some consumer groups failed:\n"
                   "* Group 'g' could not be deleted due to: GroupIdNotFoundException: The group id does not exist.\n")
    rc, out, _ = run("--log-dirs", store, "--list", "--json")
    assert json.loads(out) == {"groups": []}


def test_delete_of_several_groups_names_each_quoted(store):
    """--delete of several groups lists them as Kafka's deleteGroups does, each quoted
    ('g', 'h'), in both the all-succeeded line and the partly-failed one; a group named twice
    is deleted once (the admin client's request holds a set). Before, the names were joined
    inside one pair of quotes ('g, h') and a repeated name failed as not found."""
    with GroupCoordinator(store) as gc:
        gc.commit_offsets("h", {TP("t", 0): 1})
        gc.commit_offsets("k", {TP("t", 1): 2})
    rc, out, _ = run("--log-dirs", store, "--delete", "--group", "g", "--group", "h", "--group", "g")
    assert (rc, out) == (0, "Deletion of requested consumer groups ('g', 'h') was successful.\n")
    rc, out, _ = run("--log-dirs", store, "--delete", "--group", "k", "--group", "gone", "--group", "h")
    assert (rc, out) == (1, "\nError: Deletion of some consumer groups failed:\n"
                            "* Group 'gone' could not be deleted due to: GroupIdNotFoundException: The group id does not exist.\n"
                            "* Group 'h' could not be deleted due to: GroupIdNotFoundException: The group id does not exist.\n"
                            "\nThese consumer groups were deleted successfully: 'k'\n")
    with GroupCoordinator(store) as gc:
        assert gc.list_groups() == []


def test_reset_of_a_group_named_twice_resets_it_once_and_succeeds(store):
    """--reset-offsets --execute naming g twice plans and writes g once and exits 0, as Kafka's
    (its requests hold a set of groups). Before, it printed the plan and exited 1 with no error
    (the status counted the names given, not the groups)."""
    rc, out, err = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--group", "g",
                       "--topic", "t:1", "--to-offset", "7", "--execute")
    assert (rc, err) == (0, "")
    assert out == ("\nGROUP                          TOPIC                          PARTITION  NEW-OFFSET     "
                   "\ng                              t                              1          7              \n")
    with GroupCoordinator(store) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 10, TP("t", 1): 7}


def test_describe_of_a_group_named_twice_prints_it_once(store):
    """--describe naming g twice prints g's table once (--state too; --json its one object, not
    a list), as Kafka's describe, whose results are a TreeMap by group id. Before, every name
    given printed its own table."""
    once = run("--log-dirs", store, "--describe", "--group", "g")
    assert once[0] == 0 and once[1].count("\nGROUP ") == 1
    assert run("--log-dirs", store, "--describe", "--group", "g", "--group", "g") == once
    state = run("--log-dirs", store, "--describe", "--group", "g", "--state")
    assert state[1].count("\nGROUP ") == 1
    assert run("--log-dirs", store, "--describe", "--group", "g", "--group", "g", "--state") == state
    rc, out, _ = run("--log-dirs", store, "--describe", "--group", "g", "--group", "g", "--json")
    assert rc == 0 and json.loads(out)["group"] == "g"


def test_usage_errors(store, capsys):
    with pytest.raises(SystemExit) as e:
        main(["consumer-groups", "--log-dirs", store, "--describe"])
    assert e.value.code == 2
    assert "--group (or --all-groups) is required" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["consumer-groups", "--log-dirs", store, "--reset-offsets", "--group", "g", "--to-earliest"])


def test_bench_groups_reports_every_figure(tmp_path, capsys):
    from kstore.tools import bench_groups
    assert bench_groups.main(["--commits", "40", "--fresh", "1", "--contended", "20", "--json",
                              "--dir", str(tmp_path)]) == 0
    res = json.loads(capsys.readouterr().out)
    assert set(res["warm"]) >= {"commit_p50", "commit_p99", "fetch_p50", "fetch_p99"}
    assert set(res["fresh"]) == {"import_ms_p50", "first_commit_ms_p50", "first_commit_ms_p99"}
    assert set(res["contended"]) == {"commit_p50", "commit_p99"}
    assert all(v > 0 for part in res.values() for v in part.values())


_JOINER = """
import sys, kstore
starts = {}

class Starts(kstore.ConsumerRebalanceListener):
    def on_partitions_revoked(self, tps):
        pass

    def on_partitions_assigned(self, tps):
        starts.update((tp.partition, c.position(tp)) for tp in tps)
c = kstore.Consumer(sys.argv[1], group_id="g", enable_auto_commit=False, auto_offset_reset="latest")
c.subscribe(["t"], listener=Starts())
while len(starts) < 2:
    c.poll(timeout_ms=100)
print(starts[0], starts[1], flush=True)
c.close()
"""


def test_a_member_joining_during_a_reset_starts_at_the_reset_offsets(store, monkeypatch, watchdog, tmp_path):
    """A consumer in another process joins group g (Empty: its kstore members have left) while
    --reset-offsets --to-earliest --execute is between its look at the group's state and its
    write: the member starts at the reset offsets (0, 0). Before, the member joined in that
    window, read the old commits (10, 45) and read on from them, and the reset, having seen
    the group Empty, was written under it and reported done (Kafka's coordinator checks and
    writes under its group lock; the tool now holds group.lock, under which members join)."""
    import subprocess
    import sys
    import time
    from kstore.tools import groups as groups_tool
    watchdog(120)
    with kstore.Consumer(store, "t", group_id="g", enable_auto_commit=False) as c:     # the group met here
        c.poll(timeout_ms=0)
    child: list = []
    real = groups_tool._Command.new_offset

    def new_offset_with_a_join(self, g, tp):
        if not child:
            child.append(subprocess.Popen([sys.executable, "-c", _JOINER, store], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)))
            time.sleep(3)          # the old code's window: the child joined and read the commits
        return real(self, g, tp)
    monkeypatch.setattr(groups_tool._Command, "new_offset", new_offset_with_a_join)
    rc, _out, _err = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--topic", "t",
                         "--to-earliest", "--execute")
    out, err = child[0].communicate(timeout=60)
    assert (rc, child[0].returncode, out) == (0, 0, "0 0\n"), err
    with GroupCoordinator(store) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", 0): 0, TP("t", 1): 0}


def test_a_member_joining_during_a_delete_starts_without_the_deleted_offsets(store, monkeypatch, watchdog, tmp_path):
    """A consumer in another process joins group g (Empty) while --delete has found no live
    member and not yet written its tombstones: the member starts as a new group's would, at
    auto_offset_reset (latest: 50, 50), and nothing of g is left committed. Before, it joined
    in that window, read the commits (10, 45) and read on from them, the deletion reported done
    (delete_group now looks and writes under group.lock, under which members join)."""
    import subprocess
    import sys
    import time
    watchdog(120)
    with kstore.Consumer(store, "t", group_id="g", enable_auto_commit=False) as c:     # the group met here
        c.poll(timeout_ms=0)
    child: list = []
    calls: list = []
    real = GroupCoordinator.live_members

    def live_members_then_a_join(self, group_id):
        live = real(self, group_id)
        calls.append(group_id)
        if len(calls) == 1:        # delete_group's look, under the group's lock
            child.append(subprocess.Popen([sys.executable, "-c", _JOINER, store], stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True, cwd=str(tmp_path)))
            time.sleep(3)          # the old code's window: the child joined and read the commits
        return live
    monkeypatch.setattr(GroupCoordinator, "live_members", live_members_then_a_join)
    rc, out, _err = run("--log-dirs", store, "--delete", "--group", "g")
    assert (rc, out) == (0, "Deletion of requested consumer groups ('g') was successful.\n")
    got, err = child[0].communicate(timeout=60)
    assert (child[0].returncode, got) == (0, "50 50\n"), err
    monkeypatch.undo()
    with GroupCoordinator(store) as gc:
        assert gc.fetch_offsets("g") == {}


_SPY_JOINER = """
import sys, kstore
from kstore.fileio import FileOps, set_file_ops
told = []

class Spy(FileOps):
    def try_lock(self, path, *, shared=False, directory=False):
        fd = super().try_lock(path, shared=shared, directory=directory)
        if fd is None and not told and path.endswith(('.kstore-groups', 'group.lock')):
            told.append(path)           # the join waits for the groups dir or group.lock
            print('blocked', flush=True)
        return fd
set_file_ops(Spy())
starts = {}

class Starts(kstore.ConsumerRebalanceListener):
    def on_partitions_revoked(self, tps):
        pass

    def on_partitions_assigned(self, tps):
        starts.update((tp.partition, c.position(tp)) for tp in tps)
c = kstore.Consumer(sys.argv[1], group_id=sys.argv[2], enable_auto_commit=False,
                    auto_offset_reset="latest")
c.subscribe(["t"], listener=Starts())
while len(starts) < 2:
    c.poll(timeout_ms=100)
print(starts[0], starts[1], flush=True)
c.close()
"""


def _join_at_first_look(monkeypatch, store: str, group: str, cwd) -> list:
    """At the tool's first look at group's live members, a _spy_joiner of it starts in another
    process; returns [its Popen, its first line ("blocked" if its join had to wait)]."""
    child: list = []
    real = GroupCoordinator.live_members

    def live_members_then_a_join(self, group_id):
        live = real(self, group_id)
        if not child:
            child.append(_spy_joiner(store, group, cwd))
            child.append(child[0].stdout.readline())
        return live
    monkeypatch.setattr(GroupCoordinator, "live_members", live_members_then_a_join)
    return child


def _spy_joiner(store: str, group: str, cwd):
    """A consumer of t in group joining from another process; its first line says whether its
    join found the group's locks held ('blocked'), the next its starting positions."""
    import subprocess
    import sys
    return subprocess.Popen([sys.executable, "-c", _SPY_JOINER, store, group], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(cwd), env=dict(os.environ))


def _group_dir(store: str, group: str) -> str:
    from kstore.group_files import GROUPS_DIR, encode_name
    return os.path.join(store, GROUPS_DIR, encode_name(group))


@pytest.mark.parametrize("group", ["g", "fresh"])
def test_a_first_join_waits_for_a_reset_of_a_group_without_a_directory(store, monkeypatch,
                                                                       watchdog, tmp_path, group):
    """--reset-offsets --to-offset 3 --execute of a group no kstore member ever met here (g: its
    commits 10, 45 made without a member; fresh: nothing, which Kafka's reset allows, creating
    its offsets): a consumer in another process makes the group's first join between the
    tool's look at the state and its write. The join waits (the tool holds the groups dir's
    flock, under which alone a group's directory is made) and the member starts at 3, 3.
    Before, group.lock was taken only if the directory existed: the member joined in that
    window and started at the old commits (or latest), while the tool reported the reset."""
    from kstore.tools import groups as groups_tool
    watchdog(120)
    child: list = []
    real = groups_tool._Command.new_offset

    def new_offset_with_a_join(self, g, tp):
        if not child:
            child.append(_spy_joiner(store, group, tmp_path))
            child.append(child[0].stdout.readline())      # its join's first step, whatever it is
        return real(self, g, tp)
    monkeypatch.setattr(groups_tool._Command, "new_offset", new_offset_with_a_join)
    rc, _out, _err = run("--log-dirs", store, "--reset-offsets", "--group", group, "--topic", "t",
                         "--to-offset", "3", "--execute")
    out, err = child[0].communicate(timeout=60)
    assert (rc, child[1], child[0].returncode, out) == (0, "blocked\n", 0, "3 3\n"), err
    with GroupCoordinator(store) as gc:
        assert {tp: o.offset for tp, o in gc.fetch_offsets(group).items()} == {TP("t", 0): 3, TP("t", 1): 3}


def test_a_first_join_waits_for_a_delete_of_a_group_without_a_directory(store, monkeypatch,
                                                                        watchdog, tmp_path):
    """--delete of g (commits 10, 45, no kstore member ever met here) while a consumer in
    another process makes the group's first join between delete_group's look at the members
    and its tombstones: the join waits, the deletion is reported done, and the member starts
    as a new group's would, at latest (50, 50), nothing of g committed. Before, it joined in
    that window and started at 10, 45 while the deletion was reported done."""
    watchdog(120)
    child = _join_at_first_look(monkeypatch, store, "g", tmp_path)
    rc, out, _err = run("--log-dirs", store, "--delete", "--group", "g")
    got, err = child[0].communicate(timeout=60)
    assert (rc, out) == (0, "Deletion of requested consumer groups ('g') was successful.\n")
    assert (child[1], child[0].returncode, got) == ("blocked\n", 0, "50 50\n"), err
    monkeypatch.undo()
    with GroupCoordinator(store) as gc:
        assert gc.fetch_offsets("g") == {} and gc.group("g") is not None   # the member's generation


def test_delete_of_a_missing_group_beside_its_first_join(store, monkeypatch, watchdog, tmp_path):
    """--delete of a group that does not exist (GroupIdNotFoundException, exit 1) leaves no
    directory of it behind; while a consumer in another process makes that group's first join
    at the tool's look, the join waits for the answer ("does not exist", true when given) and
    then makes the group, which the next --delete, once the member left, deletes. Before, the
    look was not under any lock: the member joined meanwhile."""
    watchdog(120)
    missing = ("\nError: Deletion of some consumer groups failed:\n"
               "* Group 'new' could not be deleted due to: GroupIdNotFoundException: The group id does not exist.\n")
    assert run("--log-dirs", store, "--delete", "--group", "new")[:2] == (1, missing)
    assert not os.path.exists(_group_dir(store, "new"))
    child = _join_at_first_look(monkeypatch, store, "new", tmp_path)
    assert run("--log-dirs", store, "--delete", "--group", "new")[:2] == (1, missing)
    assert child[0].stdout.readline() == "50 50\n" and child[1] == "blocked\n"
    _out, err = child[0].communicate(timeout=60)
    assert child[0].returncode == 0, err
    monkeypatch.undo()
    assert os.path.isdir(_group_dir(store, "new"))
    rc, out, _ = run("--log-dirs", store, "--delete", "--group", "new")     # it left: Empty
    assert (rc, out) == (0, "Deletion of requested consumer groups ('new') was successful.\n")


def test_reset_of_groups_without_directories_takes_their_groups_dir_in_turn(store, watchdog):
    """--execute over g (commits, no directory), a and b (nothing): the groups dir's flock is
    taken for one group at a time, released before the next (a second flock of it from the
    same process while held would wait 30 s), every group gets its offsets, and no group
    directory is made."""
    watchdog(60)
    rc, _out, _err = run("--log-dirs", store, "--reset-offsets", "--group", "g", "--group", "b",
                         "--group", "a", "--topic", "t:1", "--to-offset", "7", "--execute")
    assert rc == 0
    with GroupCoordinator(store) as gc:
        assert {g: {tp: o.offset for tp, o in gc.fetch_offsets(g).items()} for g in "gab"} == {
            "g": {TP("t", 0): 10, TP("t", 1): 7}, "a": {TP("t", 1): 7}, "b": {TP("t", 1): 7}}
    assert [os.path.exists(_group_dir(store, g)) for g in "gab"] == [False] * 3


_FRESH_JOINER = """
import sys, kstore
c = kstore.Consumer(sys.argv[1], group_id="fresh", enable_auto_commit=False)
c.subscribe(["t"])
while not c.assignment():
    c.poll(timeout_ms=100)
print("joined", sorted(tp.partition for tp in c.assignment()), flush=True)
sys.stdin.read()
c.close()
"""


@pytest.mark.parametrize("action", [("--delete",),
                                    ("--reset-offsets", "--topic", "t", "--to-earliest", "--execute")],
                         ids=["delete", "reset"])
def test_a_new_groups_first_join_completes_between_two_groups_of_an_all_groups_scan(
        store, monkeypatch, watchdog, tmp_path, action):
    """--all-groups over 201 groups (g and grp-000..199, no directories): while the tool is
    between its 9th and 10th group, a consumer of a new group in another process makes its
    first join, which needs the groups dir's flock. The tool waits there for the join to
    complete (bounded by the watchdog): it does, with 9 groups done and 192 untouched, and the
    tool then finishes every group. Before, --reset-offsets --execute took the groups dir's
    flock (and every group.lock) once for all groups and held it across the whole scan (0.43 s
    over 200 groups of 50 partitions with --to-datetime): no moment between two groups, a
    first join waited for the scan's end (the hook here never ran: KeyError)."""
    import subprocess
    import sys
    watchdog(120)
    with GroupCoordinator(store) as gc:
        for i in range(200):
            gc.commit_offsets(f"grp-{i:03d}", {TP("t", 0): 5, TP("t", 1): 6})
    groups = ["g"] + [f"grp-{i:03d}" for i in range(200)]
    before = {g: {TP("t", 0): 10, TP("t", 1): 45} if g == "g" else {TP("t", 0): 5, TP("t", 1): 6}
              for g in groups}
    after = {g: {} if action[0] == "--delete" else {TP("t", 0): 0, TP("t", 1): 0} for g in groups}
    real = GroupCoordinator.groups_locked
    steps: list = []
    seen: dict = {}

    def between_groups(self, group_ids):
        steps.append(list(group_ids))
        if len(steps) == 10:                 # the 9 groups before are done, nothing is held
            child = subprocess.Popen([sys.executable, "-c", _FRESH_JOINER, store], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=str(tmp_path), env=dict(os.environ))
            seen["child"], seen["line"] = child, child.stdout.readline()
            with GroupCoordinator(store) as gc:
                seen["offsets"] = {g: {tp: o.offset for tp, o in gc.fetch_offsets(g).items()}
                                   for g in groups}
        return real(self, group_ids)
    monkeypatch.setattr(GroupCoordinator, "groups_locked", between_groups)
    rc, out, _err = run("--log-dirs", store, *action, "--all-groups")
    child = seen["child"]
    _out, err = child.communicate("", timeout=60)
    assert (rc, seen["line"], child.returncode) == (0, "joined [0, 1]\n", 0), err
    assert steps == [[g] for g in groups]
    assert seen["offsets"] == {g: after[g] if i < 9 else before[g] for i, g in enumerate(groups)}
    if action[0] == "--delete":
        assert out == f"Deletion of requested consumer groups ({', '.join(repr(g) for g in groups)}) was successful.\n"
    monkeypatch.undo()
    with GroupCoordinator(store) as gc:
        assert {g: {tp: o.offset for tp, o in gc.fetch_offsets(g).items()} for g in groups} == after
    assert os.path.isdir(_group_dir(store, "fresh"))
    assert [os.path.exists(_group_dir(store, g)) for g in groups] == [False] * len(groups)
