"""start_file.py: a partition's start carried between a standalone Log and a LogManager, in
either direction, after a clean close and after a crash (what a user expects: records deleted
stay deleted, records appended stay)."""
import os
import shutil

import kstore
from kstore.checkpoint import OffsetCheckpointFile

from log_helpers import NOW


def _values(lg):
    return [r.value for r in lg]


def _kill_copy(src, dst):
    """What a kill -9 of the process owning src leaves (no clean close): a copy of it now."""
    shutil.copytree(src, dst)
    for name in (".lock",):
        p = os.path.join(dst, name)
        if os.path.exists(p):
            os.unlink(p)
    return str(dst)


def test_a_standalone_start_is_kept_by_a_log_manager_opening_the_partition(tmp_path):
    """Standalone DeleteRecords, then the partition under a LogManager: it starts there, and the
    start is in the dir's checkpoint before the standalone files go, so a kill of the manager
    right after its start keeps it (before: the managed open dropped .kstore-log-start and
    started at the segment's base, 0: the deleted records came back)."""
    store = str(tmp_path / "store")
    with kstore.Log.open(os.path.join(store, "t-0")) as lg:
        lg.append([(None, b"v%d" % i, NOW) for i in range(10)])
        lg.delete_records(4)
    m = kstore.LogManager(store)
    assert (m.log("t", 0).log_start_offset, m.log("t", 0).log_end_offset) == (4, 10)
    assert OffsetCheckpointFile(os.path.join(store, "log-start-offset-checkpoint")).read() \
        == {("t", 0): 4}
    crashed = _kill_copy(store, tmp_path / "crash")
    m.close()
    for d in (store, crashed):
        with kstore.LogManager(d) as m2:
            assert m2.log("t", 0).log_start_offset == 4
            assert _values(m2.log("t", 0)) == [b"v%d" % i for i in range(4, 10)]


def test_a_standalone_start_after_a_standalone_crash_is_kept_by_a_log_manager(tmp_path):
    """The same after a kill of the standalone writer (no clean-shutdown marker: only its start
    file says where it started)."""
    store = str(tmp_path / "store")
    lg = kstore.Log.open(os.path.join(store, "t-0"))
    lg.append([(None, b"v%d" % i, NOW) for i in range(10)])
    lg.delete_records(6)
    lg.close_handlers()
    with kstore.LogManager(store) as m:
        assert (m.log("t", 0).log_start_offset, m.log("t", 0).log_end_offset) == (6, 10)
    with kstore.LogManager(store) as m:
        assert _values(m.log("t", 0)) == [b"v6", b"v7", b"v8", b"v9"]


def test_a_standalone_truncation_below_an_older_checkpointed_start_keeps_its_records(tmp_path):
    """A managed life checkpointed start 6; a standalone life then truncated below it and
    appended: the next managed open starts at the standalone start, with every record (before:
    at the checkpoint's 6, above the log end 5, so the loader dropped all of them). Again with
    the standalone writer killed (its start file only; and the manager's clean-shutdown marker
    must not make the manager skip recovering it)."""
    store = str(tmp_path / "store")
    with kstore.LogManager(store) as m:
        m.create_topic("t", 1)
        m.log("t", 0).append([(None, b"v%d" % i, NOW) for i in range(10)])
        m.log("t", 0).delete_records(6)
    assert OffsetCheckpointFile(os.path.join(store, "log-start-offset-checkpoint")).read() \
        == {("t", 0): 6}
    for crash in (False, True):
        part = os.path.join(store, "t-0")
        lg = kstore.Log.open(part)
        assert lg.log_start_offset == (11 if crash else 6)
        lg.truncate_to(2)
        lg.append([(None, b"n%d" % i, NOW) for i in range(3)])
        lg.flush()
        lg.close_handlers() if crash else lg.close()
        with kstore.LogManager(store) as m:
            lg = m.log("t", 0)
            assert (lg.log_start_offset, lg.log_end_offset) == (2, 5)
            assert _values(lg) == [b"n0", b"n1", b"n2"]
            lg.truncate_fully_and_start_at(10)
            lg.append([(None, b"v%d" % i, NOW) for i in range(10, 12)])
            lg.delete_records(11)
        assert OffsetCheckpointFile(os.path.join(store, "log-start-offset-checkpoint")).read() \
            == {("t", 0): 11}


def test_a_managed_start_is_kept_by_a_standalone_open(tmp_path):
    """Managed DeleteRecords, then the partition opened standalone, after the manager's clean
    close and after its kill: the standalone log starts there (before: at the segment's base,
    0, since it read only its own start files, which the managed open had removed)."""
    store = str(tmp_path / "store")
    m = kstore.LogManager(store)
    m.create_topic("t", 1)
    m.log("t", 0).append([(None, b"v%d" % i, NOW) for i in range(10)])
    m.log("t", 0).delete_records(3)
    crashed = _kill_copy(store, tmp_path / "crash")
    m.close()
    for d in (store, crashed):
        with kstore.Log.open(os.path.join(d, "t-0")) as lg:
            assert (lg.log_start_offset, lg.log_end_offset) == (3, 10)
            assert _values(lg) == [b"v%d" % i for i in range(3, 10)]
            lg.append([(None, b"s", NOW)])
        with kstore.Log.open(os.path.join(d, "t-0")) as lg:     # its own marker now
            assert (lg.log_start_offset, lg.log_end_offset) == (3, 11)
        with kstore.LogManager(d) as m2:                          # and back
            assert (m2.log("t", 0).log_start_offset, m2.log("t", 0).log_end_offset) == (3, 11)


def test_a_log_manager_after_a_standalone_writers_kill_recovers_the_partition(tmp_path):
    """A manager's clean close left its dir's .kafka_cleanshutdown; a standalone writer then
    appended to a partition and was killed (its active segment untrimmed, nothing flushed): the
    next manager recovers the partition, every record there (before: the marker was still on
    disk, the manager loaded without recovery, and its first read of the partition raised
    CorruptRecordError in the untrimmed segment)."""
    store = str(tmp_path / "store")
    with kstore.LogManager(store) as m:
        m.create_topic("t", 1)
        m.log("t", 0).append([(None, b"m%d" % i, NOW) for i in range(5)])
    assert os.path.exists(os.path.join(store, ".kafka_cleanshutdown"))
    lg = kstore.Log.open(os.path.join(store, "t-0"))
    lg.append([(None, b"s%d" % i, NOW) for i in range(3)])
    lg.close_handlers()
    with kstore.LogManager(store) as m:
        lg = m.log("t", 0)
        assert lg.log_end_offset == 8
        assert _values(lg) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"s0", b"s1", b"s2"]
        lg.append([(None, b"after", NOW)])
        assert lg.log_end_offset == 9


def test_a_reader_process_sees_the_start_across_a_writer_processs_switch(tmp_path, watchdog):
    """A writer process uses a partition standalone (DeleteRecords), then under a LogManager
    (DeleteRecords again), then standalone again, while this process reads it through a kept
    StoreReader and fresh ones: every view starts at the last DeleteRecords, none shows a
    deleted record (before: a fresh reader after the switch to the manager started at 0)."""
    from kstore.reader import StoreReader
    from writer_process import WriterProcess
    watchdog(120)
    store = str(tmp_path / "store")
    part = os.path.join(store, "t-0")
    w = WriterProcess(str(tmp_path / "other"), str(tmp_path))
    kept = None
    try:
        w.run(f"lg = kstore.Log.open({part!r})",
              "lg.append([(None, b'v%d' % i, NOW) for i in range(10)])", "lg.delete_records(2)")
        kept = StoreReader(store)
        views = []

        def check(start, end):
            kept.refresh()
            views.append(kept.offsets("t", 0))
            with StoreReader(store) as fresh:
                views.append(fresh.offsets("t", 0))
                assert [r.offset for r in fresh.log("t", 0)][:1] == [start]
            assert views[-2:] == [(start, end)] * 2
        check(2, 10)
        w.run("lg.close()", f"m2 = LogManager({store!r})")
        check(2, 10)
        w.run("m2.log('t', 0).delete_records(5)")
        check(5, 10)
        w.run("m2.close()", f"lg = kstore.Log.open({part!r})", "lg.delete_records(7)")
        check(7, 10)
        w.run("lg.close()")
    finally:
        if kept is not None:
            kept.close()
        w.close()


def test_a_read_only_open_starts_at_a_log_managers_delete_records(tmp_path, watchdog):
    """A LogManager in another process deletes records inside a segment; Log.open(read_only=True)
    of the partition, while it runs and after it closed, starts at the new start and iterates
    from there, as a StoreReader and a standalone writable open do. Before, it started at the
    segment's base: the deleted records came back (seen as "records below the start" by a
    check of a compacted log against its read-only iteration)."""
    from writer_process import WriterProcess
    watchdog(60)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run("m.create_topic('t', 1)", "lg = m.log('t', 0)",
              "for i in range(100): lg.append([(b'k', b'v%d' % i)])", "lg.delete_records(55)")
        bases = sorted(int(n[:20]) for n in os.listdir(os.path.join(d, "t-0")) if n.endswith(".log"))
        assert bases[0] < 55 < bases[1]
        with kstore.Log.open(os.path.join(d, "t-0"), read_only=True) as lg:
            assert lg.log_start_offset == 55
            assert _values(lg) == [b"v%d" % i for i in range(55, 100)]
    finally:
        assert w.close() == 0
    with kstore.Log.open(os.path.join(d, "t-0"), read_only=True) as lg:
        assert (lg.log_start_offset, _values(lg)[0]) == (55, b"v55")
    with kstore.StoreReader(d) as st:
        assert st.log("t", 0).log_start_offset == 55
