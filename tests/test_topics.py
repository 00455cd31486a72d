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
