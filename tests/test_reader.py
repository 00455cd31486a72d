"""StoreReader (a read-only view for another process: Spark tasks, command-line readers) beside
the process that writes the store (issue 12, readers beside a writer)."""
import os
import time

import pytest

import kstore
from kstore.errors import UnknownTopicError

NOW = 1_700_000_000_000


def test_store_reader_log_of_a_deleted_topic_says_so(tmp_path):
    """A partition directory deleted under a StoreReader's log: refresh raises
    UnknownTopicError naming it (was a raw FileNotFoundError)."""
    d = tmp_path / "s"
    with kstore.Log.open(str(d / "t-0")) as lg:
        lg.append([(None, b"x")])
    with kstore.StoreReader(str(d)) as store:
        lg = store.log("t", 0)
        assert [r.value for r in lg.read(0)] == [b"x"]
        os.rename(d / "t-0", d / ("t-0.%s-delete" % ("0" * 32)))
        with pytest.raises(UnknownTopicError, match=f"partition directory {d / 't-0'} was deleted"):
            store.log("t", 0, refresh=True)
        store.refresh()
        assert store.partitions() == []


def test_a_topic_being_deleted_is_not_offered(tmp_path):
    """A deletion recorded in kstore-topic-config.json ("deleting") but cut short before its
    renames: the reader leaves the topic out, as a read-only LogManager does, and drops it from
    an open reader at its next refresh."""
    import json
    from kstore.topics import TOPIC_CONFIG_FILE
    d = str(tmp_path)
    with kstore.LogManager(d, {"log.cleaner.enable": False}) as m:
        m.create_topic("keep", 1)
        m.create_topic("gone", 2)
        m.append("keep", None, b"k")
        m.append_batch("gone", 1, [(None, b"g")])
    with kstore.StoreReader(d) as r:
        assert r.topics() == ["gone", "keep"]
        assert [r.value for r in r.log("gone", 1).read(0)] == [b"g"]
        path = tmp_path / TOPIC_CONFIG_FILE
        doc = json.loads(path.read_text())
        doc["version"] += 1
        doc["deleting"] = ["gone"]
        path.write_text(json.dumps(doc))
        r.refresh()
        assert r.topics() == ["keep"]
        assert r.partitions() == [("keep", 0)]
        with pytest.raises(UnknownTopicError):
            r.log("gone", 1)
    with kstore.StoreReader(d) as r:
        assert r.topics() == ["keep"]
        assert [r.value for r in r.log("keep", 0).read(0)] == [b"k"]
    with kstore.LogManager(d, read_only=True) as m:
        assert m.topics() == ["keep"]


def test_a_read_only_open_of_a_garbage_log_warns_through_the_kstore_logger(tmp_path, caplog):
    """A StoreReader user (no CLI) hears of a .log that is no batches through the `kstore.log`
    logger, with file, position and what is wrong, instead of an empty partition without a
    word; a sound partition (its zero runway included) logs nothing."""
    import logging
    d = tmp_path / "d"
    with kstore.LogManager(str(d)) as m:
        m.create_topic("t", 2)
        m.append("t", None, b"v", partition=1)
    garbage = d / "t-0" / "00000000000000000000.log"
    garbage.write_bytes(b"\x00" * 8 + b"\x00\x00\x00\x30" + b"\x07" * 40)
    with caplog.at_level(logging.WARNING, logger="kstore"):
        with kstore.StoreReader(str(d)) as s:
            assert s.log("t", 0).read(0) == []
            assert [r.value for r in s.log("t", 1).read(0)] == [b"v"]
    warnings = [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [("kstore.log", f"read-only open of {d / 't-0'}: {garbage}: position 0: 52 bytes "
                         f"that are not a valid batch (unknown magic byte 7); the log's data ends there")]


def test_a_delete_records_in_another_process_shows_at_the_readers_next_refresh(tmp_path, watchdog):
    """DeleteRecords inside a segment shows nowhere but the log start: the writer's LogManager
    writes its log-start checkpoint at once (it used to wait for the periodic task,
    log.flush.start.offset.checkpoint.interval.ms, 60 s; the writer's scheduler here never runs
    it), so a StoreReader in another process sees the new start at its next refresh, and a
    read below it raises OffsetOutOfRangeError as Kafka's fetch does."""
    from writer_process import WriterProcess
    watchdog(120)
    d = str(tmp_path / "store")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)",
              "lg.append([(b'k%d' % i, b'v') for i in range(20)])")
        with kstore.StoreReader(d) as store:
            assert store.offsets("t", 0) == (0, 20)
            w.run("assert lg.delete_records(16) == 16")
            assert (open(os.path.join(d, "log-start-offset-checkpoint")).read()
                    == "0\n1\nt 0 16\n")
            store.refresh()
            assert store.offsets("t", 0) == (16, 20)
            lg = store.log("t", 0)
            assert [r.offset for r in lg.read(16)] == [16, 17, 18, 19]
            with pytest.raises(kstore.OffsetOutOfRangeError):
                lg.read(15)
            # a start at a segment boundary is checkpointed too (and never lowered)
            w.run("for _ in range(12): lg.append([(b'k', b'v' * 200)])",
                  "assert len(lg.segments) > 2", "cut = lg.segments[1].base_offset",
                  "assert lg.delete_records(cut) == cut",
                  f"open({str(tmp_path / 'cut')!r}, 'w').write(str(cut))")
            cut = int((tmp_path / "cut").read_text())
            store.refresh()
            assert store.offsets("t", 0) == (cut, 32)
    finally:
        w.close()


def test_delete_records_from_threads_beside_refreshing_readers(tmp_path, watchdog):
    """Threads calling delete_records and appending on one LogManager while other threads
    refresh StoreReaders: every start a reader sees is one a delete_records returned (or 0),
    never lowered, and once the writers stop, a refresh shows the last one."""
    import threading
    from thread_watchdog import join_all
    watchdog(120)
    d = str(tmp_path / "store")
    m = kstore.LogManager(d)
    try:
        m.create_topic("t", 1)
        lg = m.log("t", 0)
        lg.append([(b"k", b"v")] * 50)
        returned = {0}
        stop = threading.Event()
        errors: list = []

        def deleter():
            try:
                for _ in range(60):
                    lg.append([(b"k", b"v")] * 5)
                    returned.add(lg.delete_records(lg.log_start_offset + 3))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def reader():
            try:
                with kstore.StoreReader(d) as store:
                    last = 0
                    while not stop.is_set():
                        store.refresh()
                        start = store.offsets("t", 0)[0]
                        assert start >= last, (start, last)
                        last = start
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        writers = [threading.Thread(target=deleter, name=f"deleter-{i}") for i in range(2)]
        readers = [threading.Thread(target=reader, name=f"reader-{i}") for i in range(2)]
        for t in writers + readers:
            t.start()
        join_all(writers, 60)
        stop.set()
        join_all(readers, 30)
        assert errors == []
        with kstore.StoreReader(d) as store:
            assert store.offsets("t", 0) == (lg.log_start_offset, lg.log_end_offset)
            assert lg.log_start_offset == max(returned) >= 180
    finally:
        m.close()


def test_a_partition_deleted_after_the_listing_before_its_first_open(tmp_path, watchdog):
    """The writer process deletes t after a StoreReader listed it and before anything opened
    t-1: log() raises UnknownTopicError (was a bare KStoreError "does not exist"), so a
    Consumer polling through that reader skips the partition instead of raising from poll (a
    consumer met it within seconds of a topic being deleted and re-created in a loop)."""
    from writer_process import WriterProcess
    watchdog(60)
    d = str(tmp_path / "s")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run('m.create_topic("t", 2)', 'm.create_topic("u", 1)',
              'm.append_batch("u", 0, [(None, b"u0"), (None, b"u1")])')
        with kstore.StoreReader(d) as store:
            assert store.partitions() == [("t", 0), ("t", 1), ("u", 0)]
            store.log("t", 0)
            w.run('m.delete_topic("t")')
            with pytest.raises(UnknownTopicError, match=f"partition directory {d}/t-1 does not exist"):
                store.log("t", 1)
            with kstore.Consumer(store, auto_offset_reset="earliest") as c:
                c.assign([kstore.TopicPartition("t", 1), kstore.TopicPartition("u", 0)])
                got = c.poll(timeout_ms=1000)
                assert {tp: [r.value for r in recs] for tp, recs in got.items()} == {
                    kstore.TopicPartition("u", 0): [b"u0", b"u1"]}
                assert c.poll(timeout_ms=100) == {}
    finally:
        assert w.close() == 0


def test_a_log_that_followed_a_re_creation_is_kept_by_the_next_refresh(tmp_path, watchdog):
    """A topic deleted and re-created by the writer (another process) under a read-only Log:
    the log's own refresh follows the new directory (incarnation 1, its records from 0), and
    the StoreReader's next rescan keeps that Log. It used to compare the directory with the one
    it had when it opened the log, drop the Log and open another, so a Consumer, which had
    already reset to the new topic's start, took the new Log for yet another re-creation,
    reset again and delivered the records it had read a second time (consume --follow too)."""
    from writer_process import WriterProcess
    watchdog(120)
    d = str(tmp_path / "store")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run("m.create_topic('t', 1)", "m.log('t', 0).append([(None, b'old%d' % i) for i in range(3)])")
        with kstore.StoreReader(d) as store, kstore.Consumer(
                d, "t", group_id="g", auto_offset_reset="earliest", enable_auto_commit=False) as c:
            tp = kstore.TopicPartition("t", 0)
            lg = store.log("t", 0)
            assert [r.value for r in lg.read(0)] == [b"old0", b"old1", b"old2"]
            assert [r.value for r in c.poll(timeout_ms=5000)[tp]] == [b"old0", b"old1", b"old2"]
            w.run("m.delete_topic('t')", "m.create_topic('t', 1)",
                  "m.log('t', 0).append([(None, b'new%d' % i) for i in range(2)])")
            assert store.log("t", 0, refresh=True) is lg
            assert (lg.incarnation, [r.value for r in lg.read(0)]) == (1, [b"new0", b"new1"])
            store.refresh()
            assert store.log("t", 0) is lg and lg.incarnation == 1
            got = []
            for _ in range(100):                # the consumer resets to the new topic's start
                got += [r.value for r in c.poll(timeout_ms=100).get(tp, [])]
                if len(got) >= 2:
                    break
            assert got == [b"new0", b"new1"]
            later = []          # past its reader's next rescan (a subscription's: every 3 s)
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                later += [r.value for r in c.poll(timeout_ms=200).get(tp, [])]
            assert later == [] and c.position(tp) == 2
            w.run("m.log('t', 0).append([(None, b'new2')])")
            assert [r.value for r in c.poll(timeout_ms=5000)[tp]] == [b"new2"]
    finally:
        w.close()
