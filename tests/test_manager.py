"""LogManager: Kafka's LogManagerTest cases (facts §10 item 14), locks, startup and shutdown,
checkpoints byte for byte, malformed checkpoints, retention and flush on a mock clock, topics,
the default partitioner, log dirs going offline. Races and crashes (killed processes, readers
beside a writing process, threads racing the manager) are in reliability/test_manager_races.py."""
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest

import kstore
from kstore.checkpoint import OffsetCheckpointFile
from kstore.errors import (InvalidConfigError, InvalidTopicError, LogDirLockedError,
                           LogDirOfflineError, TopicExistsError, UnknownTopicError)
from kstore.fileio import FileOps
from kstore.manager import LogManager
from kstore.partitioner import partition_for_key

from manager_helpers import NOW, manager



# -- topics and appends ---------------------------------------------------------------------------
def test_create_topics_and_partitions(tmp_path, mock):
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("clicks", 3, {"segment.bytes": 1000})
        m.create_topic("views")
        assert m.topics() == ["clicks", "views"]
        assert m.partitions("clicks") == [0, 1, 2]
        assert sorted(os.listdir(tmp_path)) == [".lock", "clicks-0", "clicks-1", "clicks-2",
                                                "kstore-topic-config.json", "views-0"]
        assert m.log("clicks", 1).config.segment_bytes == 1000
        meta = (tmp_path / "clicks-0" / "partition.metadata").read_text()
        assert meta.startswith("version: 0\ntopic_id: ")
        with pytest.raises(TopicExistsError):
            m.create_topic("clicks")
        with pytest.raises(UnknownTopicError):
            m.log("nope", 0)


@pytest.mark.parametrize("name", ["", ".", "..", "a" * 250, "bad/name", "spa ce", "ünï"])
def test_topic_name_rules(tmp_path, mock, name):
    with manager(str(tmp_path), mock=mock) as m:
        with pytest.raises(InvalidTopicError):
            m.create_topic(name)


def test_keyed_appends_follow_kafkas_partitioner(tmp_path, mock):
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("t", 5)
        for i in range(50):
            key = b"key-%d" % i
            md = m.append("t", key, b"v%d" % i, timestamp=NOW + i)
            assert md.partition == partition_for_key(key, 5)
            assert md.timestamp == NOW + i
        # unkeyed records spread over every partition
        parts = {m.append("t", None, b"x").partition for _ in range(10)}
        assert parts == {0, 1, 2, 3, 4}
        md = m.append("t", None, b"h", partition=2, headers=[("a", b"b")])
        rec = m.log("t", 2).read(md.offset)[0]
        assert rec.headers == (("a", b"b"),) and rec.value == b"h"


def test_auto_create_and_its_switch(tmp_path, mock):
    with manager(str(tmp_path), {"num.partitions": 2}, mock=mock) as m:
        m.append("auto", b"k", b"v")
        assert m.partitions("auto") == [0, 1]
    with manager(str(tmp_path / "b"), {"auto.create.topics.enable": "false"}, mock=mock) as m:
        with pytest.raises(UnknownTopicError):
            m.append("nope", b"k", b"v")


def test_least_loaded_assignment_20_partitions_3_dirs(tmp_path, mock):
    """testLeastLoadedAssignment: new partitions go to the dir with the fewest."""
    dirs = [str(tmp_path / f"d{i}") for i in range(3)]
    with manager(dirs, mock=mock) as m:
        for i in range(20):
            m.create_topic(f"topic{i}", 1)
        counts = [sum(1 for n in os.listdir(d) if os.path.isdir(os.path.join(d, n))) for d in dirs]
        assert sum(counts) == 20 and max(counts) - min(counts) <= 1


def test_alter_config_and_add_partitions_persist(tmp_path, mock):
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("t", 1, {"retention.ms": 1000})
        m.alter_topic_config("t", {"retention.ms": 5000, "segment.bytes": 2048})
        assert m.log("t", 0).config.retention_ms == 5000
        assert m.add_partitions("t", 3) == [1, 2]
        with pytest.raises(InvalidTopicError):
            m.add_partitions("t", 2)
        m.alter_topic_config("t", {"segment.bytes": None})
    with manager(str(tmp_path), mock=mock) as m:
        assert m.partitions("t") == [0, 1, 2]
        cfg = m.log("t", 2).config
        assert cfg.retention_ms == 5000 and cfg.segment_bytes == 1073741824


def test_delete_topic_renames_then_removes_after_delay(tmp_path, mock):
    t, s = mock
    with manager(str(tmp_path), {"log.segment.delete.delay.ms": 60000}, mock=mock) as m:
        m.create_topic("gone", 2)
        m.append("gone", b"k", b"v")
        m.delete_topic("gone")
        assert m.topics() == []
        names = [n for n in os.listdir(tmp_path) if n.startswith("gone-")]
        assert len(names) == 2 and all(n.endswith("-delete") for n in names)
        assert all(len(n.split(".")[-1]) == len("0123456789abcdef0123456789abcdef-delete") for n in names)
        assert m.delete_logs() == 0
        t.advance(60000)
        assert m.delete_logs() == 2
        assert not [n for n in os.listdir(tmp_path) if n.startswith("gone-")]


# -- locks -----------------------------------------------------------------------------------------------
def test_two_managers_on_one_dir_fail(tmp_path, mock):
    """testTwoLogManagersUsingSameDirFails, in process and across processes."""
    m = manager(str(tmp_path), mock=mock)
    with pytest.raises(LogDirLockedError, match="Failed to acquire lock"):
        manager(str(tmp_path), mock=mock)
    child = textwrap.dedent(f"""
        import kstore, sys
        try:
            kstore.LogManager({str(tmp_path)!r})
        except kstore.LogDirLockedError:
            sys.exit(3)
        sys.exit(0)
    """)
    r = subprocess.run([sys.executable, "-c", child], cwd=str(tmp_path.parent))
    assert r.returncode == 3
    m.close()
    manager(str(tmp_path), mock=mock).close()     # free again after close


def test_duplicate_log_dirs_rejected(tmp_path):
    with pytest.raises(InvalidConfigError, match="Duplicate log directory"):
        LogManager([str(tmp_path), str(tmp_path) + "/"])


# -- startup, shutdown, checkpoints -------------------------------------------------------------------
def test_clean_shutdown_writes_checkpoints_and_marker_byte_for_byte(tmp_path, mock):
    t, s = mock
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("a", 2)
        m.create_topic("b", 1, {"segment.bytes": 400})
        for i in range(10):
            m.append("a", None, b"x", partition=i % 2)
        for _ in range(6):
            m.append("b", b"k", b"y" * 50, timestamp=NOW)
        m.log("b", 0).delete_records(4)
    rp = (tmp_path / "recovery-point-offset-checkpoint").read_bytes()
    assert rp == b"0\n3\na 0 5\na 1 5\nb 0 6\n"
    ls = (tmp_path / "log-start-offset-checkpoint").read_bytes()
    assert ls == b"0\n1\nb 0 4\n"
    assert (tmp_path / ".kafka_cleanshutdown").exists()
    with manager(str(tmp_path), mock=mock) as m:
        assert not (tmp_path / ".kafka_cleanshutdown").exists()     # deleted before loading
        assert all(lg.recovery_report == [] for lg in m.logs().values())
        assert m.log("b", 0).log_start_offset == 4
        assert m.log("a", 1).log_end_offset == 5


def test_malformed_checkpoints_never_stop_startup(tmp_path, mock):
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("t", 1)
        for i in range(5):
            m.append("t", None, b"v%d" % i)
    os.unlink(tmp_path / ".kafka_cleanshutdown")
    for bad in (b"0\n2\nt 0 5\n", b"1\n1\nt 0 5\n", b"0\nx\n", b"0\n1\nt zero 5\n", b"0\n1\nt 0\n", b"\xff\xfe"):
        (tmp_path / "recovery-point-offset-checkpoint").write_bytes(bad)
        with manager(str(tmp_path), mock=mock) as m:
            assert len(m.checkpoint_errors) == 1
            assert "recovery-point-offset-checkpoint" in m.checkpoint_errors[0]
            lg = m.log("t", 0)
            assert lg.recovery_report, "the log must be recovered in full"
            assert [r.value for r in lg.read(0)] == [b"v%d" % i for i in range(5)]
        os.unlink(tmp_path / ".kafka_cleanshutdown")


def test_checkpoint_file_reader_and_writer(tmp_path):
    cp = OffsetCheckpointFile(str(tmp_path / "cp"))
    assert cp.read() == {}
    cp.write({("t", 1): 10, ("s", 0): 3})
    assert (tmp_path / "cp").read_bytes() == b"0\n2\ns 0 3\nt 1 10\n"
    assert cp.read() == {("t", 1): 10, ("s", 0): 3}
    (tmp_path / "cp").write_bytes(b"0\n1\nt 1 10")     # truncated: no final newline is fine
    assert cp.read() == {("t", 1): 10}
    (tmp_path / "cp").write_bytes(b"0\n2\nt 1 10\n")    # truncated: count mismatch
    with pytest.raises(kstore.KStoreError, match="expected 2 entries but found 1"):
        cp.read()


# -- scheduled tasks on the mock clock --------------------------------------------------------------
def test_cleanup_expired_segments(tmp_path, mock):
    """testCleanupExpiredSegments: time retention via the scheduled task, delayed file deletion."""
    t, s = mock
    cfg = {"log.segment.bytes": "400", "log.retention.ms": "10000", "log.segment.delete.delay.ms": "1000",
           "log.retention.check.interval.ms": "5000", "log.initial.task.delay.ms": "0"}
    with manager(str(tmp_path), cfg, mock=mock) as m:
        m.create_topic("t", 1)
        for _i in range(30):
            m.append("t", None, b"x" * 50, timestamp=NOW)
        lg = m.log("t", 0)
        n_before = len(lg.segments)
        assert n_before > 3
        s.advance(5000)                   # first retention run: nothing old enough
        assert len(lg.segments) == n_before
        s.advance(10000)                  # now every segment is expired
        assert [sg.base_offset for sg in lg.segments] == [30]
        assert lg.log_start_offset == 30
        d = lg.dir
        assert any(n.endswith(".deleted") for n in os.listdir(d))
        s.advance(1000)
        assert not any(n.endswith(".deleted") for n in os.listdir(d))
        m.append("t", None, b"after", timestamp=t.milliseconds())
        assert [r.value for r in lg.read(30)] == [b"after"]


def test_cleanup_segments_to_maintain_size(tmp_path, mock):
    """testCleanupSegmentsToMaintainSize."""
    cfg = {"log.segment.bytes": "400", "log.retention.bytes": "1200"}
    with manager(str(tmp_path), cfg, mock=mock) as m:
        m.create_topic("t", 1)
        for _i in range(40):
            m.append("t", None, b"x" * 50, timestamp=NOW)
        lg = m.log("t", 0)
        size_before, seg = lg.size, lg.segments[0].size
        deleted = m.cleanup_logs()
        assert deleted == (size_before - 1200) // seg
        assert lg.size >= 1200


def test_compacted_topics_are_left_to_the_cleaner(tmp_path, mock):
    t, s = mock
    with manager(str(tmp_path), {"log.segment.bytes": "400"}, mock=mock) as m:
        m.create_topic("c", 1, {"cleanup.policy": "compact", "retention.ms": 1})
        for _i in range(20):
            m.append("c", b"k", b"x" * 50, timestamp=NOW)
        t.advance(100000)
        assert m.cleanup_logs() == 0


def test_time_based_flush(tmp_path, mock):
    """testTimeBasedFlush: logs whose flush.ms elapsed are flushed by the flusher task."""
    t, s = mock
    cfg = {"log.flush.scheduler.interval.ms": "1000", "log.flush.interval.ms": "2000",
           "log.initial.task.delay.ms": "0"}
    with manager(str(tmp_path), cfg, mock=mock) as m:
        m.create_topic("t", 1)
        m.append("t", None, b"x")
        lg = m.log("t", 0)
        s.advance(1000)
        assert lg.recovery_point == 0
        s.advance(1000)
        assert lg.recovery_point == 1


def test_scheduled_checkpoints(tmp_path, mock):
    t, s = mock
    cfg = {"log.initial.task.delay.ms": "0", "log.flush.offset.checkpoint.interval.ms": "500"}
    with manager(str(tmp_path), cfg, mock=mock) as m:
        m.create_topic("t", 1)
        m.append("t", None, b"x")
        m.log("t", 0).flush()
        s.advance(500)
        assert (tmp_path / "recovery-point-offset-checkpoint").read_bytes() == b"0\n1\nt 0 1\n"
        assert set(s.pending()) >= {"kafka-log-retention", "kafka-recovery-point-checkpoint",
                                    "kafka-log-start-offset-checkpoint", "kafka-delete-logs"}


# -- configuration ------------------------------------------------------------------------------------
def test_from_properties(tmp_path, mock, caplog):
    props = tmp_path / "server.properties"
    d = tmp_path / "logs"
    props.write_text(textwrap.dedent(f"""\
        # a broker's settings
        broker.id=0
        listeners=PLAINTEXT://:9092
        zookeeper.connect=localhost:2181
        log.dirs={d}
        num.partitions : 3
        log.retention.hours 1
        log.retention.minutes=30
        log.segment.bytes=\\
            4096
    """))
    import logging
    with caplog.at_level(logging.INFO, logger="kstore.config"):
        m = LogManager.from_properties(str(props), time=mock[0], scheduler=mock[1])
    with m:
        assert "broker.id, listeners, zookeeper.connect" in caplog.text
        m.create_topic("t")
        cfg = m.log("t", 2).config
        assert cfg.retention_ms == 30 * 60000 and cfg.segment_bytes == 4096
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kstore.config"):
        LogManager(str(tmp_path / "x"), {"made.up": 1}, time=mock[0], scheduler=mock[1]).close()
    assert [r.getMessage() for r in caplog.records] == ["unknown broker settings ignored: made.up"]
    with pytest.raises(InvalidConfigError, match="segment.bytes.*value must be at least 14"):
        LogManager(str(tmp_path / "y"), {"log.segment.bytes": "3"}, time=mock[0], scheduler=mock[1])


# -- I/O errors ---------------------------------------------------------------------------------------
class FailingOps(FileOps):
    def __init__(self):
        self.fail_under = None

    def zero_fill(self, fd, offset, length):
        if self.fail_under and self._path_of(fd).startswith(self.fail_under):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return super().zero_fill(fd, offset, length)

    def pwrite(self, fd, data, offset):
        # a large append's data write (small ones grow the runway with zero_fill)
        if self.fail_under and self._path_of(fd).startswith(self.fail_under):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return super().pwrite(fd, data, offset)

    @staticmethod
    def _path_of(fd):
        return os.readlink(f"/proc/self/fd/{fd}")


def test_io_error_takes_only_that_dir_offline(tmp_path, mock):
    ops = FailingOps()
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = manager([d1, d2], {"log.segment.bytes": "5000000", "message.max.bytes": "20000000"}, mock=mock, io=ops)
    m.create_topic("a", 1)
    m.create_topic("b", 1)
    da, db = m.log_dir_of("a", 0), m.log_dir_of("b", 0)
    assert da != db
    m.append("a", None, b"acked", partition=0)
    ops.fail_under = da
    with pytest.raises(LogDirOfflineError):
        m.append("a", None, os.urandom(5_000_000 - 200), partition=0)
    with pytest.raises(LogDirOfflineError, match="offline"):
        m.append("a", None, b"small", partition=0)          # no blind retries
    assert da in m.offline_dirs
    m.append("b", None, b"still fine", partition=0)         # the other dir keeps working
    with pytest.raises(LogDirOfflineError, match="partition a-0 is offline"):
        m.read("a", 0, 0)                                    # its partitions are offline (Kafka)
    ops.fail_under = None
    m.close()
    with manager([d1, d2], mock=mock) as m:                  # reopening after the fault recovers
        assert [r.value for r in m.log("a", 0).read(0)] == [b"acked"]
        m.append("a", None, b"again", partition=0)


def _append_until_refused(log_of):
    """A thread appending a record at a time to log_of() (a sibling log in the dir about to go
    offline) until a KafkaStorageError: (thread, keys acknowledged, [the error])."""
    acked, refused = [], []

    def run():
        i = 0
        while not refused:
            try:
                log_of().append([(b"s%d" % i, b"v")])
                acked.append(b"s%d" % i)
            except kstore.KafkaStorageError as e:
                refused.append(e)
            i += 1
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, acked, refused


@pytest.mark.parametrize("how", ["manager", "log"])
def test_a_dir_gone_offline_fails_every_log_in_it(tmp_path, how, watchdog):
    """Kafka takes every partition of a failed log dir offline. One log's disk error, through
    the manager's append or the Log's own (`m.log(t, p).append`), takes its dir offline and
    every other log there refuses writes from then on (append, delete_records, roll,
    truncate_to, flush: KafkaStorageError naming the dir), while a thread appending to a
    sibling meanwhile was told the truth: what it was acknowledged is what another process reads
    and what a reopen finds. Logs in other dirs keep working. Before, the siblings went on
    taking appends, deletions and truncations on the failed disk, and a Log's own error did
    not take its dir offline at all."""
    watchdog(120)
    ops = FailingOps()
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = manager([d1, d2], {"log.segment.bytes": "5000000", "message.max.bytes": "20000000"}, io=ops)
    m.create_topic("a", 1)
    m.create_topic("b", 1)
    m.create_topic("c", 2)
    da = m.log_dir_of("a", 0)
    cp = next(p for p in (0, 1) if m.log_dir_of("c", p) == da)
    sibling = m.log("c", cp)
    t, acked, refused = _append_until_refused(lambda: sibling)
    while len(acked) < 50:
        time.sleep(0.001)
    ops.fail_under = os.path.join(da, "a-0")          # only a-0's files fail: the disk's first error
    big = os.urandom(5_000_000 - 200)
    with pytest.raises(LogDirOfflineError):
        if how == "manager":
            m.append("a", None, big, partition=0)
        else:
            m.log("a", 0).append([(None, big)])
    assert da in m.offline_dirs and "No space left" in m.offline_dirs[da]
    t.join(30)
    assert not t.is_alive() and "is offline" in str(refused[0]) and da in str(refused[0])
    for write in (lambda: sibling.append([(b"late", b"v")]), lambda: sibling.delete_records(1),
                  sibling.roll, lambda: sibling.truncate_to(1), sibling.flush):
        with pytest.raises(kstore.KafkaStorageError, match="is offline"):
            write()
    assert [r.key for r in sibling.read(0, max_bytes=1 << 30)] == acked   # reads go on
    other = next(p for p in (0, 1) if p != cp)
    m.append("b", None, b"fine", partition=0)          # the other dir keeps working
    m.log("c", other).append([(b"o", b"v")])
    # another process reads the dir as it is: exactly what was acknowledged
    out = subprocess.run([sys.executable, "-c", _READ_SIBLING, da, str(cp)], cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=60, check=True).stdout.split()
    assert out == [k.decode() for k in acked]
    ops.fail_under = None
    m.close()
    db = m.log_dir_of("b", 0)                          # an offline dir's close is not clean
    assert ".kafka_cleanshutdown" not in os.listdir(da) and ".kafka_cleanshutdown" in os.listdir(db)
    with manager([d1, d2]) as m:
        assert [r.key for r in m.log("c", cp).read(0, max_bytes=1 << 30)] == acked
        assert [r.value for r in m.log("b", 0).read(0)] == [b"fine"]
        m.log("c", cp).append([(b"again", b"v")])


class _OpenFailOps(FileOps):
    """Once armed, opening a .timeindex under `under` fails with EMFILE: an error that is not
    one of the disk's errnos (log_dir_failure.IO_ERRNOS)."""

    def __init__(self):
        self.under = None

    def open(self, path, flags, mode=0o644):
        if self.under and path.startswith(self.under) and path.endswith(".timeindex"):
            raise OSError(errno.EMFILE, "Too many open files (injected)")
        return super().open(path, flags, mode)


@pytest.mark.parametrize("how", ["manager", "log"])
def test_any_io_error_of_a_log_takes_its_dir_offline(tmp_path, how, watchdog):
    """Kafka's maybeHandleIOException: any IOException of a log takes its dir offline, not only
    the disk's errnos. A log failed by EMFILE (its time index at its first entry) is closed
    unflushed and untrimmed. Before, through the Log's own append its dir stayed online and
    close() marked it clean, so the next start trusted the untrimmed segment: a read of that
    log raised CorruptRecordError at its zero runway; through the manager's append the dir
    went offline only at the next write, the log's refusal (an EIO) named as the cause. Now
    the first error takes the dir offline, a sibling appending meanwhile is refused from then
    on, and the reopen recovers exactly what was acknowledged."""
    watchdog(120)
    ops = _OpenFailOps()
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = manager([d1, d2], io=ops)
    m.create_topic("t", 1)
    d = m.log_dir_of("t", 0)
    m.create_topic("s", 2)
    sp = next(p for p in (0, 1) if m.log_dir_of("s", p) == d)
    sibling = m.log("s", sp)          # held: the manager's log() refuses it once offline
    t, acked, refused = _append_until_refused(lambda: sibling)
    mine = [b"k%d" % i for i in range(3)]
    for k in mine:
        m.append("t", k, b"x", partition=0)     # no time index entry yet
    while len(acked) < 50:
        time.sleep(0.001)
    ops.under = os.path.join(d, "t-0")
    with pytest.raises(LogDirOfflineError, match="Too many open files") as ei:
        for i in range(10):        # the time index's first entry: after index.interval.bytes
            if how == "manager":
                m.append("t", b"big%d" % i, b"x" * 2000, partition=0)
            else:
                m.log("t", 0).append([(b"big%d" % i, b"x" * 2000)])
            mine.append(b"big%d" % i)
    assert len(mine) == 5
    assert ei.value.errno == errno.EMFILE or how == "manager"
    assert list(m.offline_dirs) == [d] and "Too many open files" in m.offline_dirs[d]
    t.join(30)
    assert not t.is_alive() and "is offline" in str(refused[0])
    with pytest.raises(LogDirOfflineError, match="is offline"):
        m.append("t", b"late", b"x", partition=0)
    ops.under = None
    m.close()
    assert ".kafka_cleanshutdown" not in os.listdir(d)
    with manager([d1, d2]) as m:
        assert [r.key for r in m.log("t", 0).read(0, max_bytes=1 << 30)] == mine
        assert [r.key for r in m.log("s", sp).read(0, max_bytes=1 << 30)] == acked
        m.append("t", b"again", b"x", partition=0)
        assert m.log("t", 0).log_end_offset == len(mine) + 1


_READ_SIBLING = r"""
import sys, kstore
with kstore.StoreReader(sys.argv[1]) as r:
    print(" ".join(x.key.decode() for x in r.log("c", int(sys.argv[2])).read(0, max_bytes=1 << 30)))
"""


class _CheckpointFailOps(FileOps):
    """Fails the atomic write of one checkpoint file (ENOSPC)."""

    def __init__(self):
        self.fail_name = None

    def write_atomic(self, path, data):
        if self.fail_name and os.path.basename(path) == self.fail_name:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return super().write_atomic(path, data)


def test_delete_records_writes_the_log_start_checkpoint_at_once(tmp_path, mock):
    """A DeleteRecords inside a segment is in log-start-offset-checkpoint when the call returns
    (other processes' StoreReaders read it; the periodic task, which the mock scheduler never
    runs here, is 60 s away), written atomically, every partition of the dir in it. A write
    that fails takes the dir offline, as the periodic task's failure does, and raises
    LogDirOfflineError; the start stays where the call moved it."""
    ops = _CheckpointFailOps()
    d = str(tmp_path)
    m = manager(d, mock=mock, io=ops)
    m.create_topic("a", 2)
    for p in (0, 1):
        m.log("a", p).append([(b"k", b"v")] * 10)
    cp = os.path.join(d, "log-start-offset-checkpoint")
    assert m.log("a", 1).delete_records(4) == 4
    assert open(cp).read() == "0\n1\na 1 4\n"
    assert m.log("a", 0).delete_records(0) == 0          # not moved: nothing written
    assert open(cp).read() == "0\n1\na 1 4\n"
    assert m.log("a", 0).delete_records(7) == 7
    assert OffsetCheckpointFile(cp).read() == {("a", 0): 7, ("a", 1): 4}
    assert not [n for n in os.listdir(d) if n.endswith(".tmp")]
    ops.fail_name = "log-start-offset-checkpoint"
    with pytest.raises(LogDirOfflineError, match="log-start-offset-checkpoint"):
        m.log("a", 1).delete_records(6)
    assert d in m.offline_dirs
    assert OffsetCheckpointFile(cp).read() == {("a", 0): 7, ("a", 1): 4}   # the old file whole
    m.close()


class _CheckpointDirOps(FileOps):
    """Records the log-start checkpoints written; fails those of fail_dir (ENOSPC)."""

    def __init__(self):
        self.written: list = []
        self.fail_dir = None

    def write_atomic(self, path, data):
        if os.path.basename(path) == "log-start-offset-checkpoint":
            if os.path.dirname(path) == self.fail_dir:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")
            self.written.append(os.path.dirname(path))
        return super().write_atomic(path, data)


def test_a_delete_records_writes_only_its_log_dirs_checkpoint(tmp_path, mock):
    """DeleteRecords checkpoints the log start of its partition's log dir only: one file
    written (not one per log dir), and a failing disk elsewhere neither fails the call nor is
    taken offline by it (it used to rewrite every dir's checkpoint, so a DeleteRecords of a
    partition in d1 raised LogDirOfflineError for d2's ENOSPC and took d2 offline); the
    periodic task still finds d2's failure."""
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    ops = _CheckpointDirOps()
    m = manager([d1, d2], mock=mock, io=ops)
    m.create_topic("a", 2)
    dirs = {p: os.path.dirname(m.log("a", p).dir) for p in (0, 1)}
    assert sorted(dirs.values()) == [d1, d2]
    p1 = [p for p in (0, 1) if dirs[p] == d1][0]
    for p in (0, 1):
        m.log("a", p).append([(b"k", b"v")] * 10)
    ops.written.clear()
    ops.fail_dir = d2
    assert m.log("a", p1).delete_records(4) == 4
    assert ops.written == [d1]
    assert OffsetCheckpointFile(os.path.join(d1, "log-start-offset-checkpoint")).read() == {("a", p1): 4}
    assert m.offline_dirs == {}
    with pytest.raises(LogDirOfflineError, match="log-start-offset-checkpoint"):
        m.checkpoint_log_start_offsets()
    assert list(m.offline_dirs) == [d2]
    m.close()                 # d2 was offline before: closed without it, no error


def test_assign_replicas_matches_kafka():
    a = kstore.assign_replicas(10, 5, 3, start_index=0, shift=0)
    assert a[0] == [0, 1, 2] and a[3] == [3, 4, 0] and a[4] == [4, 0, 1]
    assert a[5] == [0, 2, 3] and a[9] == [4, 1, 2]
    for p in range(5):   # the seed's simple scheme holds for the first n partitions
        assert a[p] == [(p + j) % 5 for j in range(3)]
    b = kstore.assign_replicas(4, [101, 102, 103], 2, start_index=1, shift=0)
    assert b[0] == [102, 103]
    with pytest.raises(InvalidConfigError, match="larger than available brokers"):
        kstore.assign_replicas(3, 2, 3)


def test_one_topic_id_per_topic_persisted(tmp_path, mock):
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("t", 3)
        ids = {(tmp_path / f"t-{p}" / "partition.metadata").read_text() for p in range(3)}
        assert len(ids) == 1
        m.add_partitions("t", 4)
        assert (tmp_path / "t-3" / "partition.metadata").read_text() in ids


def test_scheduled_tasks_skip_logs_deleted_meanwhile(tmp_path, mock):
    t, s = mock
    cfg = {"log.initial.task.delay.ms": "0", "log.retention.check.interval.ms": "100",
           "log.flush.scheduler.interval.ms": "100", "log.flush.interval.ms": "0"}
    with manager(str(tmp_path), cfg, mock=mock) as m:
        m.create_topic("a", 1)
        m.create_topic("b", 1)
        m.append("a", None, b"x")
        lg = m.log("a", 0)
        m.delete_topic("a")
        assert lg.closed
        m.append("b", None, b"y")
        s.advance(100)          # retention, flush and checkpoints run without raising
        assert m.log("b", 0).recovery_point == 1
        assert m.cleanup_logs() == 0


# -- start-up and hostile files (issue 12, defects 15 and 16) --------------------------------------
def test_topic_with_holes_appends_by_key_and_names_the_missing_partition(tmp_path, mock):
    """A store holding partitions 0 and 2 of a 3-partition topic (a broker's share): keys map
    over 3 partitions as Kafka's; a key or an explicit partition that is not here gets a kstore
    error naming topic and partition; round robin goes over the partitions held."""
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("t", 3)
    import shutil
    shutil.rmtree(tmp_path / "t-1")
    keys = {p: next(b"k%d" % i for i in range(100) if partition_for_key(b"k%d" % i, 3) == p)
            for p in range(3)}
    with manager(str(tmp_path), mock=mock) as m:
        assert m.partitions("t") == [0, 2] and m.ensure_topic("t") == 3
        r = m.append("t", keys[2], b"a")
        assert (r.topic, r.partition, r.offset) == ("t", 2, 0)
        assert m.append("t", keys[2], b"b").offset == 1
        assert m.append("t", keys[0], b"c").partition == 0
        msg = "partition 1 of topic 't' is not in this store (its log dirs hold partitions [0, 2])"
        with pytest.raises(UnknownTopicError) as ei:
            m.append("t", keys[1], b"d")
        assert str(ei.value) == msg
        with pytest.raises(UnknownTopicError) as ei:
            m.append_batch("t", 1, [(None, b"d")])
        assert str(ei.value) == msg
        assert m.append("t", None, b"e", partition=2).offset == 2
        with pytest.raises(UnknownTopicError, match="partition 1 of topic 't' is not in this store"):
            m.log_dir_of("t", 1)
        assert sorted(m.append("t", None, b"rr").partition for _ in range(4)) == [0, 0, 2, 2]
        with pytest.raises(InvalidTopicError, match="Topic currently has 3 partitions"):
            m.add_partitions("t", 3)
        assert m.add_partitions("t", 4) == [3] and m.partitions("t") == [0, 2, 3]
        assert [r.value for r in m.read("t", 2, 0)] == [b"a", b"b", b"e", b"rr", b"rr"]


def test_a_brokers_partition_alone_opens_reads_and_appends_by_number(tmp_path, mock):
    """A log dir holding partition 3 of a broker's topic (the rest live on other brokers): it
    is read and appended to by number; a keyed append needs the topic's partition count, which
    the dir does not know: a kstore error saying so (never a KeyError) until the count is given,
    then keys map over it as Kafka's partitioner does; the count is kept."""
    from broker_dirs import v2_batch, write_partition
    from kstore.errors import UnknownPartitionCountError
    d = str(tmp_path)
    write_partition(d, "t-3", v2_batch(0, [(0, 0, b"k0", b"a"), (1, 1, b"k1", b"b")], leader_epoch=5))
    keys = {p: next(b"k%d" % i for i in range(200) if partition_for_key(b"k%d" % i, 8) == p)
            for p in (0, 3)}
    with manager(d, mock=mock) as m:
        assert (m.topics(), m.partitions("t"), m.partition_count("t")) == (["t"], [3], None)
        assert [(r.offset, r.value) for r in m.read("t", 3, 0)] == [(0, b"a"), (1, b"b")]
        assert m.append("t", b"k", b"c", partition=3).offset == 2
        assert m.append_batch("t", 3, [(None, b"d")]).first_offset == 3
        assert m.append("t", None, b"e").partition == 3          # round robin over those here
        with pytest.raises(UnknownPartitionCountError) as ei:
            m.append("t", keys[3], b"x")
        assert str(ei.value) == (
            "the partition count of topic 't' is unknown: this store holds its partitions [3] "
            "(a broker's log dirs hold some of a topic's partitions), and a key is mapped to a "
            "partition by the count; give the partition, or the count with "
            "LogManager.set_partition_count('t', n)")
        with pytest.raises(UnknownPartitionCountError):
            m.ensure_topic("t")
        assert m.ensure_topic("t", 3) == 4
        with pytest.raises(UnknownTopicError) as ei:
            m.append("t", None, b"x", partition=0)
        assert str(ei.value) == "partition 0 of topic 't' is not in this store (its log dirs hold partitions [3])"
        with pytest.raises(InvalidTopicError, match="must exceed its highest partition 3"):
            m.set_partition_count("t", 3)
        m.set_partition_count("t", 8)
        assert m.append("t", keys[3], b"f").offset == 5
        with pytest.raises(UnknownTopicError, match="partition 0 of topic 't' is not in this store"):
            m.append("t", keys[0], b"x")
        with pytest.raises(UnknownTopicError, match=r"partition 8 of 't' does not exist \(8 partitions\)"):
            m.append("t", None, b"x", partition=8)
    with manager(d, mock=mock) as m:
        assert m.partition_count("t") == 8 and m.ensure_topic("t") == 8
        assert [r.value for r in m.read("t", 3, 0)] == [b"a", b"b", b"c", b"d", b"e", b"f"]
        m.create_topic("u", 2)
        assert m.partition_count("u") == 2 and m.add_partitions("u", 5) == [2, 3, 4]
    with manager(d, mock=mock) as m:
        assert m.partition_count("u") == 5


def test_a_hostile_partition_is_isolated_and_says_why(tmp_path, mock, watchdog, caplog):
    """A FIFO named like a segment in t-1 and a symlinked partition dir u-0: both isolated
    (ERROR logged, failed_partitions, PartitionLoadError on use); the dir stays online, the
    other partitions work, the hostile files and the link's target are untouched, and the
    isolated partitions keep their checkpoint entries."""
    from kstore.errors import PartitionLoadError
    watchdog(60)
    d = tmp_path / "d"
    with manager(str(d), mock=mock) as m:
        m.create_topic("t", 2)
        for p in range(2):
            m.append_batch("t", p, [(None, b"v%d" % p)])
    fifo = d / "t-1" / "00000000000000000000.log"
    os.unlink(fifo)
    os.mkfifo(fifo)
    outside = tmp_path / "outside-0"
    outside.mkdir()
    (outside / "00000000000000000000.log").write_bytes(b"not yours")
    os.symlink(outside, d / "u-0")
    for read_only in (True, False):
        caplog.clear()
        with manager(str(d), mock=mock, read_only=read_only) as m:
            assert m.offline_dirs == {}
            assert m.failed_partitions == {
                ("t", 1): f"{d / 't-1'}: UnusableFileError: refusing {fifo}: a FIFO, not a regular file",
                ("u", 0): f"{d / 'u-0'}: UnusableFileError: refusing {d / 'u-0'}: a symbolic link, not a directory"}
            assert m.topics() == ["t", "u"] and m.partitions("t") == [0, 1]
            assert [r.value for r in m.read("t", 0, 0)] == [b"v0"]
            with pytest.raises(PartitionLoadError) as ei:
                m.log("t", 1)
            assert str(ei.value) == ("partition t-1 failed to load at start-up and is isolated: "
                                     f"{d / 't-1'}: UnusableFileError: refusing {fifo}: a FIFO, not a regular file")
            if not read_only:
                with pytest.raises(PartitionLoadError):
                    m.append("t", None, b"x", partition=1)
                with pytest.raises(TopicExistsError):
                    m.create_topic("u", 1)
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert any("partition t-1" in e and "isolated" in e for e in errors), errors
    assert os.path.exists(fifo) and os.path.islink(d / "u-0")
    assert (outside / "00000000000000000000.log").read_bytes() == b"not yours"
    assert sorted(os.listdir(outside)) == ["00000000000000000000.log"]
    cp = OffsetCheckpointFile(str(d / "recovery-point-offset-checkpoint")).read()
    assert cp[("t", 1)] == 1 and cp[("t", 0)] == 1


class _EioOps(FileOps):
    """EIO on opening anything under one directory: a failing disk."""

    def __init__(self, bad):
        self.bad = bad

    def open(self, path, flags, mode=0o644):
        if path.startswith(self.bad):
            raise OSError(errno.EIO, "Input/output error (injected)", path)
        return super().open(path, flags, mode)


def test_io_error_at_start_up_takes_the_dir_offline_never_silently(tmp_path, mock, caplog):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with manager([a, b], mock=mock) as m:
        m.create_topic("t", 2)
    assert {m for m in os.listdir(a) if m.startswith("t-")} and {m for m in os.listdir(b) if m.startswith("t-")}
    part_a = os.path.join(a, next(n for n in os.listdir(a) if n.startswith("t-")))
    with manager([a, b], mock=mock, io=_EioOps(part_a)) as m:
        assert list(m.offline_dirs) == [a] and "Input/output error (injected)" in m.offline_dirs[a]
        assert m.failed_partitions == {}
    assert any(r.levelname == "ERROR" and a in r.getMessage() for r in caplog.records)
    with pytest.raises(LogDirOfflineError) as ei:
        manager([a], mock=mock, io=_EioOps(part_a))
    assert str(ei.value).startswith(f"every log dir is offline: {a}: ")
    assert "Input/output error (injected)" in str(ei.value)


def test_a_hostile_clean_shutdown_marker_fails_the_start_naming_it(tmp_path, mock, watchdog):
    """A FIFO as .kafka_cleanshutdown is not taken as a clean shutdown (recovery skipped) nor
    removed: the start fails naming it, and a second start after it is removed works."""
    from kstore.errors import UnusableFileError
    watchdog(30)
    with manager(str(tmp_path), mock=mock) as m:
        m.create_topic("t", 1)
        m.append("t", None, b"v")
    marker = tmp_path / ".kafka_cleanshutdown"
    os.unlink(marker)
    os.mkfifo(marker)
    with pytest.raises(UnusableFileError) as ei:
        manager(str(tmp_path), mock=mock)
    assert str(ei.value) == f"refusing {marker}: a FIFO, not a regular file"
    os.unlink(marker)
    with manager(str(tmp_path), mock=mock) as m:
        assert [r.value for r in m.read("t", 0, 0)] == [b"v"]


def _mountinfo_io(tmp_path, **mounts):
    """FileOps whose /proc/self/mountinfo shows the given mounts under tmp_path: name ->
    (fstype, per-mount options, superblock options); / is ext4."""
    lines = ["22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"]
    for i, (name, (fstype, opts, sopts)) in enumerate(sorted(mounts.items())):
        (tmp_path / name).mkdir()
        lines.append(f"{40 + i} 22 0:{50 + i} /export/{name} {tmp_path / name} {opts} shared:9 - "
                     f"{fstype} srv:/export/{name} {sopts}")
    text = "\n".join(lines) + "\n"

    class Mounts(FileOps):
        def read_file(self, path):
            return text.encode() if path == "/proc/self/mountinfo" else super().read_file(path)
    return Mounts()


def test_only_nfs_mounts_with_local_locks_warn(tmp_path, caplog):
    """The manager warns by kstore.mounts' rule, the one the Spark sink refuses writes by: an
    NFS mount with client-local locks (nolock shows as local_lock=all; local_lock=flock) warns,
    naming dir, mount and option; NFSv4, NFSv3 with lockd (local_lock=none) and local
    filesystems do not."""
    io = _mountinfo_io(tmp_path, v3nolock=("nfs", "rw,relatime", "rw,vers=3,local_lock=all"),
                       v3flock=("nfs", "rw", "rw,vers=3,local_lock=flock,addr=1.2.3.4"),
                       v3lockd=("nfs", "rw", "rw,vers=3,local_lock=none,addr=1.2.3.4"),
                       v4=("nfs4", "rw,noatime", "rw,vers=4.2,local_lock=none"),
                       tmp=("tmpfs", "rw", "rw,size=100k"))
    warned = {}
    for name in ("v3nolock", "v3flock", "v3lockd", "v4", "tmp"):
        caplog.clear()
        d = tmp_path / name / "store"
        with caplog.at_level("WARNING", logger="kstore"):
            LogManager(str(d), io=io).close()
        warned[name] = [r.getMessage() for r in caplog.records if "lock does not keep" in r.message]
    assert warned == {
        "v3nolock": [f"log dir {d.parent.parent / 'v3nolock' / 'store'}: it is on an NFS mount "
                     f"({tmp_path / 'v3nolock'}) whose locks are local to this client "
                     "(local_lock=all), so its lock does not keep out writers on other nodes; "
                     "mount it with locking (NFSv4, or NFSv3 with lockd) or keep one node "
                     "writing"],
        "v3flock": [f"log dir {tmp_path / 'v3flock' / 'store'}: it is on an NFS mount "
                    f"({tmp_path / 'v3flock'}) whose locks are local to this client "
                    "(local_lock=flock), so its lock does not keep out writers on other nodes; "
                    "mount it with locking (NFSv4, or NFSv3 with lockd) or keep one node "
                    "writing"],
        "v3lockd": [], "v4": [], "tmp": []}
