"""kstore.log_tail: what lies past a read-only log's valid bytes, judged beside the writer
process (which may delete the file at any moment)."""
import os
import sys

import pytest

import kstore
from kstore.errors import UnknownTopicError
from kstore.fileio import FileOps, set_file_ops
from kstore.log_tail import tail_problem


def test_a_file_deleted_under_the_look_has_no_problem(tmp_path):
    """tail_problem of a .log that is gone (retention, compaction, a deleted topic) says
    nothing: it raised a raw FileNotFoundError."""
    assert tail_problem(str(tmp_path / "00000000000000000000.log"), 0) is None


def test_a_read_only_open_while_the_writer_deletes_the_topic(tmp_path, watchdog):
    """The writer process deletes t the moment a StoreReader's first open of t-0 looks past its
    valid bytes: the open succeeds, the next refresh says the topic is gone, and a Consumer
    through that reader gets no raw FileNotFoundError from poll (met within seconds by a
    consumer beside a writer deleting and re-creating a topic in a loop)."""
    from writer_process import WriterProcess
    watchdog(60)
    d = str(tmp_path / "s")
    w = WriterProcess(d, str(tmp_path))

    class Hook(FileOps):
        armed = True

        def getsize(self, path):
            if self.armed and sys._getframe(1).f_code.co_name.endswith("tail_problem"):
                self.armed = False
                w.run('m.delete_topic("t")', 'm.delete_logs()')
            return super().getsize(path)

    hook = Hook()
    try:
        w.run('m.create_topic("t", 1, {"file.delete.delay.ms": 0})',
              'm.append_batch("t", 0, [(None, b"a"), (None, b"b")])')
        prev = set_file_ops(hook)
        try:
            with kstore.StoreReader(d) as store:
                with kstore.Consumer(store, auto_offset_reset="earliest") as c:
                    c.assign([kstore.TopicPartition("t", 0)])
                    # what the open found (its files are mapped), or nothing if the poll's
                    # catch-up already met the deletion; then nothing more
                    got = c.poll(timeout_ms=200)
                    assert {tp: [r.value for r in recs] for tp, recs in got.items()} in (
                        {}, {kstore.TopicPartition("t", 0): [b"a", b"b"]})
                    assert c.poll(timeout_ms=200) == {}
                assert not hook.armed, "the open never looked at the tail"
                assert not os.path.exists(os.path.join(d, "t-0"))
                with pytest.raises(UnknownTopicError):
                    store.log("t", 0, refresh=True)
        finally:
            set_file_ops(prev)
    finally:
        assert w.close() == 0
