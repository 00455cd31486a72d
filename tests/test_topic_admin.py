"""kstore.topic_admin's deletion record: delete_topic drops it only after the groups' committed
offsets of the topic are gone, so whatever stops the deletion there (a failure to write the
tombstones here; a crash: tests/reliability/test_topic_admin_crash.py) leaves the topic
"marked for deletion" and the next start-up ends it, offsets included, instead of leaving
offsets that a topic created again under the name would resume from."""
from __future__ import annotations

import pytest

from kstore import LogManager, TopicExistsError, TopicPartition as TP, UnknownTopicError
from kstore.group_coordinator import GroupCoordinator


def test_a_deletion_whose_offsets_stay_is_finished_by_the_next_start_up(tmp_path, monkeypatch, caplog):
    d = str(tmp_path)
    with LogManager(d) as m:
        m.create_topic("t", 1)
        m.append_batch("t", 0, [(None, b"x")] * 10)
        with GroupCoordinator(m) as gc:
            gc.commit_offsets("g", {TP("t", 0): 10})
        calls = []

        def failing(self, topics, **kw):
            calls.append(list(topics))
            raise OSError(28, "No space left on device")
        with monkeypatch.context() as mp:
            mp.setattr(GroupCoordinator, "on_topics_deleted", failing)
            m.delete_topic("t")
            assert m.topics() == []
            # create_topic retries the deletion once (topic_deletion.py), and it fails again
            with pytest.raises(TopicExistsError, match=r"^Topic 't' is marked for deletion\.$"):
                m.create_topic("t", 1)
        assert calls == [["t"], ["t"]]
        assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
            "topic(s) ['t'] deleted but their committed offsets could not be removed: "
            "[Errno 28] No space left on device"] * 2
        with GroupCoordinator(m) as gc:
            assert gc.fetch_offsets("g")[TP("t", 0)].offset == 10      # still there, not usable
            with pytest.raises(UnknownTopicError, match="does not host"):
                gc.commit_offsets("g", {TP("t", 0): 11})
    with LogManager(d) as m:                 # the start-up ends the deletion, offsets first
        with GroupCoordinator(m) as gc:
            assert gc.fetch_offsets("g") == {}
        m.create_topic("t", 1)
        assert m.topics() == ["t"]


_RETENTION_ELSEWHERE = r"""
import sys
from kstore.topics import read_topic_config_file
print(read_topic_config_file(sys.argv[1:])["topics"]["t"]["retention.ms"])
"""


def test_a_config_change_skips_an_offline_dirs_logs(tmp_path, watchdog):
    """Kafka's updateTopicConfig updates logsByTopic, i.e. currentLogs, from which
    handleLogDirFailure removed a failed dir's logs. Before, alter_topic_config changed the
    in-memory config of the offline dir's partitions too (seen through their Logs held from
    before the failure). Now, beside a thread appending to the online dir's partitions: those
    change, the offline ones keep theirs, the offline dir's topic config file is untouched;
    another process reads the new config (the newest file), and a restart (the dir back)
    applies it to every partition."""
    import errno
    import os
    import subprocess
    import sys
    import threading
    from thread_watchdog import join_all
    watchdog(60)
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2])
    m.create_topic("t", 4, {"retention.ms": "1000000"})
    off = [p for p in range(4) if m.log_dir_of("t", p) == d1]
    on = [p for p in range(4) if p not in off]
    stop = threading.Event()

    def append():
        while not stop.is_set():
            for p in on:
                m.append("t", b"k", b"v", partition=p)
    with open(os.path.join(d1, "kstore-topic-config.json"), "rb") as f:
        before = f.read()
    logs = {p: m.log("t", p) for p in range(4)}     # held from before the failure
    m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    try:
        cfg = m.alter_topic_config("t", {"retention.ms": "2000000"})
        assert cfg.retention_ms == 2000000 and m.topic_config("t").retention_ms == 2000000
        assert {p: lg.config.retention_ms for p, lg in logs.items()} == {
            p: 1000000 if p in off else 2000000 for p in range(4)}
        with open(os.path.join(d1, "kstore-topic-config.json"), "rb") as f:
            assert f.read() == before
        out = subprocess.run([sys.executable, "-c", _RETENTION_ELSEWHERE, d1, d2], timeout=60,
                             check=True, capture_output=True, text=True, cwd=str(tmp_path)).stdout
        assert out.split() == ["2000000"]
    finally:
        stop.set()
        join_all([writer], 30)
    m.close()
    with LogManager([d1, d2]) as m2:
        assert [m2.log("t", p).config.retention_ms for p in range(4)] == [2000000] * 4
