"""kstore/topics.py: Kafka's topic name rules, topic ids, partition.metadata and the topic
config file (newest readable copy wins, written to every online dir, deletion intent)."""
import base64
import errno
import json
import logging

import pytest

from kstore.errors import InvalidTopicError
from kstore.fileio import FileOps, get_file_ops
from kstore.log_dir_failure import LogDirFailureChannel
from kstore.topics import (PARTITION_METADATA_FILE, TOPIC_CONFIG_FILE, TopicConfigFile,
                           TopicConfigs, new_topic_id, read_topic_config_file, topics_collide,
                           validate_topic_name, write_partition_metadata)


def test_name_rules_and_collisions():
    validate_topic_name("a.b_c-9")
    # "abc\n": Python's "$" matches before a final newline; Kafka's rule is a full match
    for bad in ("", ".", "..", "x" * 250, "a b", "ü", "abc\n", "\nabc"):
        with pytest.raises(InvalidTopicError):
            validate_topic_name(bad)
    assert topics_collide("a.b", "a_b") and not topics_collide("a.b", "a-b")


def test_topic_id_is_a_uuid_in_url_safe_base64(tmp_path):
    tid = new_topic_id()
    assert len(tid) == 22 and len(base64.urlsafe_b64decode(tid + "==")) == 16
    write_partition_metadata(get_file_ops(), str(tmp_path), tid)
    write_partition_metadata(get_file_ops(), str(tmp_path), new_topic_id())    # kept as it was
    assert (tmp_path / PARTITION_METADATA_FILE).read_text() == f"version: 0\ntopic_id: {tid}\n"


def test_newest_readable_copy_wins(tmp_path, caplog):
    dirs = [tmp_path / n for n in "abc"]
    for d in dirs:
        d.mkdir()
    (dirs[0] / TOPIC_CONFIG_FILE).write_text(json.dumps({"version": 3, "topics": {"t": {}}}))
    (dirs[1] / TOPIC_CONFIG_FILE).write_text(json.dumps(
        {"version": 4, "topics": {"u": {"retention.ms": "5"}}, "topic_ids": {"u": "id"},
         "deleting": ["v"]}))
    (dirs[2] / TOPIC_CONFIG_FILE).write_text("{not json")
    caplog.set_level(logging.WARNING)
    got = TopicConfigFile.read([str(d) for d in dirs])
    assert got == TopicConfigFile(4, {"u": {"retention.ms": "5"}}, {"u": "id"}, ["v"])
    assert read_topic_config_file([str(d) for d in dirs])["version"] == 4
    assert any("ignoring unreadable topic config file" in r.getMessage() for r in caplog.records)
    assert TopicConfigFile.read([str(tmp_path / "none")]) is None


class FailWrites(FileOps):
    def __init__(self, bad):
        self.bad = bad

    def write_atomic(self, path, data):
        if path.startswith(self.bad):
            raise OSError(errno.EIO, "injected")
        return super().write_atomic(path, data)


def test_changes_go_to_every_online_dir_and_a_failed_write_takes_its_dir_offline(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    failures = LogDirFailureChannel()
    topics = TopicConfigs([a, b], failures, FailWrites(b))
    topics.add_topic("t", {"cleanup.policy": ("compact", "delete")})
    topics.persist()
    assert failures.offline_dirs == {b: "[Errno 5] injected"}
    assert TopicConfigFile.read([a]) == TopicConfigFile(
        1, {"t": {"cleanup.policy": "compact,delete"}}, {"t": topics.topic_id("t")}, [])
    topics.record_deletion("t")
    assert TopicConfigFile.read([a]).deleting == ["t"] and topics.is_deleting("t")
    assert topics.overrides("t") is None
    topics.finish_deletions(["t"])
    again = TopicConfigs([a, b], LogDirFailureChannel(), get_file_ops())
    again.load()
    assert again.deleting == () and TopicConfigFile.read([a]).version == 3


def test_a_writable_start_refuses_a_store_whose_every_topic_config_copy_is_unreadable(tmp_path):
    """Starting without the overrides would run retention on a retention.ms=-1 topic with
    Kafka's 7-day default and delete its records, and the next topic change would write the
    loss into a new file. So a writable LogManager (and every writing command) refuses, naming
    the file; one readable copy in another dir is enough; readers go on; removing the file is
    the operator's way to start with the defaults. Before, the start went on silently."""
    import kstore
    from kstore.errors import UnusableFileError
    from kstore.tools.cli import main
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    with kstore.LogManager([d1, d2]) as m:
        m.create_topic("keep", 2, {"retention.ms": -1})
        for p in (0, 1):
            m.log("keep", p).append([(b"k", b"old", 1000)])      # 1970: outside 7 days
    good = (tmp_path / "d1" / TOPIC_CONFIG_FILE).read_bytes()
    (tmp_path / "d2" / TOPIC_CONFIG_FILE).write_bytes(good[:len(good) // 2])
    with kstore.LogManager([d1, d2]) as m:                      # d1's copy is enough
        assert m.topic_config("keep").retention_ms == -1
        m.create_topic("other", 1)
    assert json.loads((tmp_path / "d2" / TOPIC_CONFIG_FILE).read_bytes())["topics"]["keep"] == {
        "retention.ms": -1}                                     # the bad copy is rewritten
    for d in ("d1", "d2"):
        (tmp_path / d / TOPIC_CONFIG_FILE).write_bytes(b"\x00garbage")
    with pytest.raises(UnusableFileError) as ei:
        kstore.LogManager([d1, d2])
    assert ei.value.path == str(tmp_path / "d1" / TOPIC_CONFIG_FILE)
    assert "restore it, or remove it to start with the defaults" in str(ei.value)
    assert main(["topics", "create", "--log-dirs", f"{d1},{d2}", "--topic", "x"]) == 1
    assert (tmp_path / "d1" / TOPIC_CONFIG_FILE).read_bytes() == b"\x00garbage"   # untouched
    with kstore.StoreReader([d1, d2]) as r:                     # readers need no overrides
        assert [x.value for x in r.log("keep", 0).read(0)] == [b"old"]
    with kstore.LogManager([d1, d2], read_only=True) as m:
        assert m.log("keep", 1).log_end_offset == 1


@pytest.mark.parametrize("doc", ['{"version": 1, "topics": []}', '{"version": "2", "topics": {}}',
                                 '{"version": 1, "topics": {"t": 5}}', '{"topics": {}}',
                                 '{"version": 1, "deleting": 7}', '{"version": 1, "topic_ids": {"t": 1}}',
                                 '{"version": 1, "partitions": [1]}', '[1]'])
def test_valid_json_of_another_shape_is_an_unreadable_copy(tmp_path, doc, caplog):
    """A copy that is JSON but not the file's shape (a hand edit) is unreadable as torn bytes
    are: a writable start refuses it naming the file (be9c227's rule), a reader warns and goes
    on, a readable copy in another dir wins. Before, opens crashed on it (AttributeError
    'list' object has no attribute 'items', TypeError 'int' object is not iterable, KeyError), and a
    '"version": "2"' copy was loaded and failed the first topic change with a TypeError."""
    import kstore
    from kstore.errors import UnusableFileError
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    with kstore.LogManager([d1, d2]) as m:
        m.create_topic("keep", 1, {"retention.ms": -1})
        m.log("keep", 0).append([(b"k", b"old", 1000)])
    (tmp_path / "d2" / TOPIC_CONFIG_FILE).write_text(doc)
    with kstore.LogManager([d1, d2]) as m:                      # d1's copy wins
        assert m.topic_config("keep").retention_ms == -1
    (tmp_path / "d1" / TOPIC_CONFIG_FILE).write_text(doc)
    (tmp_path / "d2" / TOPIC_CONFIG_FILE).write_text(doc)
    with pytest.raises(UnusableFileError) as ei:
        kstore.LogManager([d1, d2])
    assert ei.value.path == str(tmp_path / "d1" / TOPIC_CONFIG_FILE)
    assert (tmp_path / "d1" / TOPIC_CONFIG_FILE).read_text() == doc      # untouched
    with caplog.at_level(logging.WARNING, "kstore.topics"), kstore.StoreReader([d1, d2]) as r:
        assert [x.value for x in r.log("keep", 0).read(0)] == [b"old"]
    assert any("ignoring unreadable topic config file" in rec.message for rec in caplog.records)
    assert read_topic_config_file([d1, d2]) is None


def test_a_copy_that_cannot_be_stat_ed_or_a_dangling_symlink_is_unreadable_not_absent(tmp_path):
    """be9c227's refusal counted a copy as absent when os.path.exists said False, which it says
    for a dangling symlink (the file kept on a mount that is gone) and for any stat error (EIO,
    EACCES): a writable start then went on with Kafka's defaults (retention.ms=-1 ran as 7
    days) and the next topic change wrote the file over the link. Now both are refused naming
    the file, and readers go on with a warning."""
    import kstore
    from kstore.errors import UnusableFileError
    d = str(tmp_path / "d")
    with kstore.LogManager(d) as m:
        m.create_topic("keep", 1, {"retention.ms": -1})
        m.log("keep", 0).append([(b"k", b"old", 1000)])
    path = tmp_path / "d" / TOPIC_CONFIG_FILE
    moved = tmp_path / "elsewhere.json"
    path.rename(moved)
    path.symlink_to(tmp_path / "gone" / "kstore-topic-config.json")
    with pytest.raises(UnusableFileError) as ei:
        kstore.LogManager(d)
    assert ei.value.path == str(path) and path.is_symlink()      # the link is left alone
    with kstore.StoreReader([d]) as r:
        assert [x.value for x in r.log("keep", 0).read(0)] == [b"old"]
    path.unlink()
    moved.rename(path)

    class StatFails(FileOps):
        def stat_path(self, p, follow_symlinks=False):
            if p.endswith(TOPIC_CONFIG_FILE):
                raise OSError(errno.EIO, "Input/output error", p)
            return super().stat_path(p, follow_symlinks)
    with pytest.raises(UnusableFileError) as ei:
        kstore.LogManager(d, io=StatFails())
    assert ei.value.path == str(path) and "Input/output error" in str(ei.value)
    with kstore.LogManager(d) as m:                              # the file was never touched
        assert m.topic_config("keep").retention_ms == -1


WRITER = """
import sys, kstore
with kstore.LogManager(sys.argv[1:3]) as m:
    for i in range(60):
        m.create_topic(f"t{i}", 1, {"retention.ms": -1})
print("done", flush=True)
"""


def test_no_copy_is_ever_unreadable_to_a_strict_read_beside_a_writer_process(tmp_path, watchdog):
    """The refusal must never be a transient race: another process rewriting both copies 60
    times (atomic renames) never shows two threads here an unreadable copy; the versions they
    see never go back; every topic they see has its override; the store then opens writable
    with all 60."""
    import subprocess
    import sys
    import threading

    import kstore
    watchdog(120)
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    kstore.LogManager([d1, d2]).close()
    p = subprocess.Popen([sys.executable, "-c", WRITER, d1, d2], stdout=subprocess.PIPE,
                         text=True, cwd=str(tmp_path))
    seen: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def read(out: list[int]) -> None:
        try:
            while True:
                alive = p.poll() is None        # one read more once the writer is done
                doc = read_topic_config_file([d1, d2], strict=True)
                if doc is not None:
                    assert all(c == {"retention.ms": -1} for c in doc["topics"].values())
                    out.append(doc["version"])
                if not alive:
                    return
        except BaseException as e:      # noqa: BLE001  (reported below)
            errors.append(e)
    threads = [threading.Thread(target=read, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    try:
        assert p.communicate(timeout=90)[0] == "done\n" and p.returncode == 0
    finally:
        if p.poll() is None:
            p.kill()
        for t in threads:
            t.join()
    assert errors == []
    for s in seen:
        assert s == sorted(s) and s[-1] == 60
    with kstore.LogManager([d1, d2]) as m:
        assert all(m.topic_config(f"t{i}").retention_ms == -1 for i in range(60))
