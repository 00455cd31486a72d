"""LogDirLoader: what a log dir may hold (Kafka's LogManager.loadLogs and
UnifiedLog.parseTopicPartitionName), the `-delete` dirs a start-up queues for removal, and the
start-up planning (which partitions have megabytes to recover and load on recovery threads)."""
import os

import pytest

from kstore import StoreReader
from kstore.errors import UnusableFileError
from kstore.fileio import FileOps
from kstore.log_dir_loader import bytes_to_recover, parse_topic_partition_name

from broker_dirs import v2_batch, write_partition
from manager_helpers import manager

HEX = "0123456789abcdef" * 2


@pytest.mark.parametrize("name,expected", [
    ("t-0", ("t", 0)), ("my-stuff-2", ("my-stuff", 2)), ("t--3", ("t-", 3)),
    (f"t-4.{HEX}-delete", ("t", 4)), ("t-5.x-future", ("t", 5)), ("t-6.y-stray", ("t", 6)),
    ("__consumer_offsets-49", ("__consumer_offsets", 49)), ("t-+7", ("t", 7)),
    ("photos", None), ("lost+found", None), ("my-stuff", None), ("-3", None), ("t-", None),
    ("x-delete", None), ("t-1-future", None), ("t-99999999999", None), ("t-٣", None),
    (".kstore-groups", None),
])
def test_parse_topic_partition_name_is_kafkas(name, expected):
    assert parse_topic_partition_name(name) == expected


@pytest.mark.parametrize("child", ["photos", "lost+found", "notes-draft", "x-delete"])
def test_a_directory_that_is_no_partition_refuses_the_start_naming_it(tmp_path, mock, child):
    """As Kafka's broker refuses to start: the error names the directory; nothing is adopted or
    written into it; a read-only manager refuses it too."""
    d = tmp_path / "logs"
    (d / child).mkdir(parents=True)
    (d / child / "cat.jpg").write_bytes(b"\xff\xd8")
    msg = (f"refusing {d / child}: '{child}' is not in the form of topic-partition or "
           f"topic-partition.uniqueId-delete (if marked for deletion); a log dir should hold "
           f"only Kafka topic data: move it out of the log dir")
    for read_only in (False, True):
        with pytest.raises(UnusableFileError) as ei:
            manager(str(d), mock=mock, read_only=read_only)
        assert str(ei.value) == msg
    assert sorted(os.listdir(d / child)) == ["cat.jpg"]
    assert sorted(os.listdir(d)) == [".lock", child]
    os.rename(d / child, tmp_path / child)
    with manager(str(d), mock=mock):       # the lock was released: moved out, it starts
        pass


def test_a_foreign_directory_named_like_a_partition_is_refused(tmp_path, mock):
    """`my-stuff-2/` with photos in it is not partition 2 of a topic `my-stuff` (Kafka would
    adopt it and write a segment into it): refused, naming it; the same name holding a
    broker's segment, or a known topic's partition holding anything, is a partition."""
    d = tmp_path / "logs"
    (d / "my-stuff-2").mkdir(parents=True)
    (d / "my-stuff-2" / "a.jpg").write_bytes(b"x")
    (d / "my-stuff-2" / "b.jpg").write_bytes(b"x")
    with pytest.raises(UnusableFileError) as ei:
        manager(str(d), mock=mock)
    assert str(ei.value) == (
        f"refusing {d / 'my-stuff-2'}: a directory named like partition 2 of topic 'my-stuff', "
        f"which this store does not know, holding no partition files (a.jpg, b.jpg): move it "
        f"out of the log dir")
    assert sorted(os.listdir(d / "my-stuff-2")) == ["a.jpg", "b.jpg"]
    write_partition(str(d), "my-stuff-2", v2_batch(0, [(0, 0, b"k", b"v")]))
    with manager(str(d), mock=mock) as m:
        assert m.partitions("my-stuff") == [2]
        assert [r.value for r in m.read("my-stuff", 2, 0)] == [b"v"]
        m.create_topic("t", 1)
        m.append("t", None, b"x")
    (d / "t-0" / "README.txt").write_text("mine")
    (d / "empty-7").mkdir()                 # an empty dir: Kafka adopts it, so does kstore
    with manager(str(d), mock=mock) as m:
        assert m.partitions("t") == [0] and m.partitions("empty") == [7]


def test_what_a_log_dir_may_hold_besides_partitions(tmp_path, mock):
    """Hidden and kstore's own dot dirs, regular files, tiered storage's index cache, KRaft's
    metadata log, `-future`/`-stray` dirs and `-delete` dirs: the store starts; none of them is
    a topic; __consumer_offsets partitions load read-only (a writable manager leaves them out of
    its registry: they are shared-writer partitions, written under their own flock)."""
    d = tmp_path / "logs"
    for sub in (".kstore-groups", ".kstore-staging/job1", ".snapshot", "remote-log-index-cache",
                "t-0.abc-future", "t-0.abc-stray"):
        (d / sub).mkdir(parents=True)
    (d / "notes.txt").write_text("not a dir")
    write_partition(str(d), "__cluster_metadata-0", v2_batch(0, [(0, 0, None, b"m")]))
    write_partition(str(d), "__consumer_offsets-3", v2_batch(0, [(0, 0, b"g", b"o")]))
    write_partition(str(d), f"gone-0.{HEX}-delete", v2_batch(0, [(0, 0, b"k", b"v")]))
    with manager(str(d), mock=mock, read_only=True) as m:
        assert m.topics() == ["__consumer_offsets"]
    with manager(str(d), mock=mock) as m:
        assert m.topics() == []
        with StoreReader(str(d)) as r:
            assert [x.value for x in r.log("__consumer_offsets", 3).read(0)] == [b"o"]
    assert os.path.isdir(d / "__cluster_metadata-0") and os.path.isdir(d / ".kstore-groups")


def test_delete_delay_counts_from_the_rename_across_restarts(tmp_path):
    """`topics delete` frees space although no process outlives file.delete.delay.ms: the
    `-delete` dir's mtime is set to the rename's time and each start-up queues it with that
    time, so a store reopened every 40 s with a 60 s delay removes it on the second reopen; a
    dir a broker renamed (mtime long ago) goes at the first task run."""
    from kstore.clock import MockTime
    from kstore.scheduler import MockScheduler
    d = str(tmp_path / "logs")
    cfg = {"log.segment.delete.delay.ms": 60_000}

    def at(ms):
        t = MockTime(ms)
        return manager(d, cfg, mock=(t, MockScheduler(t)))

    t0 = 1_700_000_000_000
    with at(t0) as m:
        m.create_topic("t", 2)
        m.append("t", None, b"x", partition=1)
        m.delete_topic("t")
    gone = sorted(n for n in os.listdir(d) if n.endswith("-delete"))
    assert len(gone) == 2
    assert {os.stat(os.path.join(d, n)).st_mtime_ns for n in gone} == {t0 * 1_000_000}
    with at(t0 + 40_000) as m:
        assert m.delete_logs() == 0
    with at(t0 + 59_999) as m:
        assert m.delete_logs() == 0
    with at(t0 + 60_000) as m:
        assert m.delete_logs() == 2
    assert not [n for n in os.listdir(d) if n.endswith("-delete")]
    broker = write_partition(d, f"old-0.{HEX}-delete", v2_batch(0, [(0, 0, b"k", b"v")]))
    os.utime(broker, ns=((t0 - 86_400_000) * 1_000_000,) * 2)
    with at(t0 + 80_000) as m:
        assert m.delete_logs() == 1
    assert not os.path.exists(broker)


def test_a_deletion_finished_at_start_up_is_timed_from_then(tmp_path, mock):
    """A deletion recorded but cut short (the crash after recording it): the start-up that
    renames the partitions stamps them with its time, and the delay counts from there."""
    d = str(tmp_path / "logs")
    with manager(d, {"log.segment.delete.delay.ms": 1000}, mock=mock) as m:
        m.create_topic("t", 1)
    import json
    path = os.path.join(d, "kstore-topic-config.json")
    doc = json.loads(open(path).read())
    doc["deleting"] = ["t"]
    with open(path, "w") as f:
        f.write(json.dumps(doc))
    t, _ = mock
    t.sleep(5000)
    with manager(d, {"log.segment.delete.delay.ms": 1000}, mock=mock) as m:
        assert m.topics() == []
        gone = [n for n in os.listdir(d) if n.endswith("-delete")]
        assert [os.stat(os.path.join(d, n)).st_mtime_ns // 1_000_000 for n in gone] == [t.milliseconds()]
        assert m.delete_logs() == 0
        t.sleep(1000)       # the scheduled kafka-delete-logs task runs
        m.delete_logs()
        assert [n for n in os.listdir(d) if n.endswith("-delete")] == []


def _cleaner_entries(d):
    from kstore.checkpoint import CLEANER_OFFSET_CHECKPOINT, OffsetCheckpointFile
    return OffsetCheckpointFile(os.path.join(d, CLEANER_OFFSET_CHECKPOINT)).read()


@pytest.mark.parametrize("cleaner", [True, False])
def test_a_deleted_topic_leaves_the_cleaner_checkpoint(tmp_path, mock, cleaner):
    """Kafka's asyncDelete removes the partition from cleaner-offset-checkpoint: a compacted
    topic deleted and created again under the same name (in this process or the next) is
    cleaned from its start, not from the old topic's first dirty offset (the clickstream
    example's second run kept duplicates)."""
    d = str(tmp_path)
    cfg = {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01, "segment.bytes": 1024}

    def fill(m):
        for i in range(60):
            m.append("pv", b"k%d" % (i % 5), b"v%d" % i, partition=0)
        m.log("pv", 0).roll()

    with manager(d, mock=mock) as m:
        m.create_topic("pv", 1, cfg)
        m.create_topic("other", 1, cfg)
        fill(m)
        m.clean_now()
        assert ("pv", 0) in _cleaner_entries(d)
        dirty = _cleaner_entries(d)[("pv", 0)]
    with manager(d, {"log.cleaner.enable": cleaner}, mock=mock) as m:
        m.delete_topic("pv")
        assert ("pv", 0) not in _cleaner_entries(d)
        m.create_topic("pv", 1, cfg)
        fill(m)
        if cleaner:
            m.clean_now()
            assert _cleaner_entries(d)[("pv", 0)] == dirty
            assert sorted(r.key for r in m.read("pv", 0, 0, max_bytes=1 << 20))[:5] == [b"k0", b"k1", b"k2", b"k3", b"k4"]
            assert len(m.read("pv", 0, 0, max_bytes=1 << 20)) == 5

class Recording(FileOps):
    """Records the file operations bytes_to_recover makes."""

    def __init__(self):
        self.calls = []

    def listdir(self, path):
        self.calls.append(("listdir", path))
        return super().listdir(path)

    def stat_path(self, path, follow_symlinks=False):
        self.calls.append(("stat_path", os.path.basename(path), follow_symlinks))
        return super().stat_path(path, follow_symlinks)


def _segments(d, sizes):
    d.mkdir()
    for base, size in sizes.items():
        (d / f"{base:020d}.log").write_bytes(b"\0" * size)
        (d / f"{base:020d}.index").write_bytes(b"")


def test_counts_the_logs_from_the_recovery_points_segment_through_fileops(tmp_path):
    d = tmp_path / "t-0"
    _segments(d, {0: 1000, 100: 2000, 200: 3000})
    (d / "junk.log").write_bytes(b"x" * 50)
    io = Recording()
    # recovery point 150 lies in the segment at 100: it and the one above are recovered
    assert bytes_to_recover(io, str(d), 150) == 5000
    assert io.calls == [("listdir", str(d)),
                        ("stat_path", f"{100:020d}.log", False),
                        ("stat_path", f"{200:020d}.log", False)]
    assert bytes_to_recover(io, str(d), 0) == 6000
    assert bytes_to_recover(io, str(d), 10 ** 9) == 3000
    # `enough`: counting stops at the first segment that reaches it
    io.calls.clear()
    assert bytes_to_recover(io, str(d), 0, enough=2500) == 3000
    assert [c[1] for c in io.calls[1:]] == [f"{0:020d}.log", f"{100:020d}.log"]


def test_a_symlinked_log_is_not_followed_and_a_missing_dir_counts_nothing(tmp_path):
    d = tmp_path / "t-0"
    _segments(d, {0: 1000})
    big = tmp_path / "elsewhere.bin"
    big.write_bytes(b"\0" * 100_000)
    os.symlink(big, d / f"{500:020d}.log")
    assert bytes_to_recover(FileOps(), str(d), 0) == 1000
    assert bytes_to_recover(FileOps(), str(tmp_path / "gone"), 0) == 0
    f = tmp_path / "file"
    f.write_bytes(b"")
    assert bytes_to_recover(FileOps(), str(f), 0) == 0


class ListingCounter(FileOps):
    """Counts the listings of each directory."""

    def __init__(self):
        self.listed = {}

    def listdir(self, path):
        self.listed[path] = self.listed.get(path, 0) + 1
        return super().listdir(path)


@pytest.mark.parametrize("threads", [1, 2])
def test_an_unclean_start_up_lists_each_partition_once(tmp_path, threads):
    """The listing the start-up planning makes (bytes_to_recover, with recovery threads) is the
    one the partition's load uses: one listdir per partition dir. The load still acts on it: a
    `.deleted` leftover named there is removed, an index missing there is rebuilt, and every
    batch is recovered (log end, records)."""
    d = str(tmp_path / "logs")
    with manager(d) as m:
        m.create_topic("t", 3)
        for p in range(3):
            m.log("t", p).append([(b"k%d" % i, b"v%d" % i, 1000 + i) for i in range(3)])
            m.log("t", p).append([(b"k%d" % i, b"v%d" % i, 1000 + i) for i in range(2)])
    # unclean, nothing checkpointed: every segment is recovered
    os.unlink(os.path.join(d, ".kafka_cleanshutdown"))
    os.unlink(os.path.join(d, "recovery-point-offset-checkpoint"))
    parts = [os.path.join(d, f"t-{p}") for p in range(3)]
    open(os.path.join(parts[1], f"{7:020d}.log.deleted"), "wb").close()
    os.unlink(os.path.join(parts[2], f"{0:020d}.index"))
    io = ListingCounter()
    with manager(d, {"num.recovery.threads.per.data.dir": threads}, io=io) as m:
        assert {p: io.listed.get(p) for p in parts} == {p: 1 for p in parts}
        for p in range(3):
            lg = m.log("t", p)
            assert (lg.log_start_offset, lg.log_end_offset) == (0, 5)
            assert [r.key for r in lg.read(0, max_bytes=1 << 20)] == [b"k0", b"k1", b"k2", b"k0", b"k1"]
            assert lg.segments[0].offset_index.lookup(4) == (0, 0)
    assert sorted(os.listdir(parts[1])) == sorted(os.listdir(parts[0]))
    assert sorted(os.listdir(parts[2])) == sorted(os.listdir(parts[0]))
