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
