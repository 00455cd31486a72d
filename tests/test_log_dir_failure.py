"""kstore/log_dir_failure.py: LogDirFailureChannel records the first error of a dir, guards work
on a dir, and tells disk errors (offline) from a file's own errors (raised as they are)."""
import errno
import os
import re
import subprocess
import sys
import threading
import time
import traceback

import pytest

from kstore import Consumer, TopicPartition as TP
from kstore.errors import ApiTimeoutError, LogDirOfflineError
from kstore.fileio import FileOps
from kstore.manager import LogManager
from kstore.log_dir_failure import LogDirFailureChannel


def test_first_error_wins_and_is_logged_once(caplog):
    ch = LogDirFailureChannel()
    assert ch.mark_offline("/d", OSError(errno.EIO, "first"))
    assert not ch.mark_offline("/d", OSError(errno.EIO, "second"))
    assert ch.offline_dirs == {"/d": "[Errno 5] first"} and ch.reason("/d") == "[Errno 5] first"
    assert ch.is_offline("/d") and not ch.is_offline("/e")
    assert ch.all_offline(["/d"]) and not ch.all_offline(["/d", "/e"])
    assert ch.summary() == "/d: [Errno 5] first"
    assert [r.getMessage() for r in caplog.records] == ["log dir /d is offline: [Errno 5] first"]


def test_guard():
    ch = LogDirFailureChannel()
    assert ch.guard("/d", lambda x, y=0: x + y, 1, y=2) == 3

    def fail(code):
        raise OSError(code, "boom")
    with pytest.raises(PermissionError):
        ch.guard("/d", fail, errno.EACCES)         # a file's own error: the dir stays online
    assert ch.offline_dirs == {}
    with pytest.raises(LogDirOfflineError, match="log dir /d went offline"):
        ch.guard("/d", fail, errno.ENOSPC)
    with pytest.raises(LogDirOfflineError, match=r"log dir /d is offline \(\[Errno 28\] boom\)"):
        ch.guard("/d", lambda: 1)


class _DiskFullUnder(FileOps):
    """Once armed, every data write under `under` fails with ENOSPC (the runway's zero fill and
    a large append's pwrite): the disk of one log dir is full."""

    def __init__(self):
        super().__init__()
        self.under = None

    def _check(self, fd):
        if self.under and os.readlink(f"/proc/self/fd/{fd}").startswith(self.under + os.sep):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def zero_fill(self, fd, offset, length):
        self._check(fd)
        return super().zero_fill(fd, offset, length)

    def pwrite(self, fd, data, offset):
        self._check(fd)
        return super().pwrite(fd, data, offset)


def _files(d):
    """{relative path: bytes} of every file under d but the wake-up words (.kstore-notify: a
    close or a topic deletion bumps them so that waiting readers look again)."""
    out = {}
    for base, _dirs, names in os.walk(d):
        for n in names:
            if n == ".kstore-notify":
                continue
            p = os.path.join(base, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, d)] = f.read()
    return out


def test_an_offline_dir_is_left_alone_by_retention_compaction_flush_and_topic_changes(
        tmp_path, watchdog):
    """Kafka's handleLogDirFailure takes the dir's logs out of the LogManager: from then on no
    task writes there. Here the scheduler's retention, flush and checkpoint tasks and the
    cleaner run at a 50 ms beat while threads append to every partition, one dir's disk fills,
    and a topic spanning both dirs is deleted and another created. The offline dir's files stay
    byte for byte as they were; the online dir goes on (retention deletes, the deleted topic's
    partitions are renamed for deletion, the new topic goes there alone). The offline dir's
    logs hold what was acknowledged and at most the one batch whose append was refused (in
    doubt, as in Kafka: see test_a_refused_append_is_the_one_batch_in_doubt; it flaked once
    in ~100 loaded runs when it asked for exactly the acknowledged records), and so does the
    restart; the deleted topic's partitions there are stray logs, renamed for deletion as
    Kafka's KRaft broker renames them."""
    watchdog(180)
    ops = _DiskFullUnder()
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    cfg = {"log.segment.bytes": "20000", "log.retention.bytes": "60000", "log.initial.task.delay.ms": "0",
           "log.retention.check.interval.ms": "50", "log.flush.interval.messages": "10",
           "log.flush.scheduler.interval.ms": "20", "log.cleaner.backoff.ms": "50",
           "log.flush.offset.checkpoint.interval.ms": "50",
           "log.flush.start.offset.checkpoint.interval.ms": "50"}
    m = LogManager([d1, d2], cfg, io=ops)
    m.create_topic("t", 4)
    m.create_topic("k", 2, {"cleanup.policy": "compact", "segment.bytes": "5000"})
    parts = [("t", p) for p in range(4)] + [("k", p) for p in range(2)]
    dir_of = {tp: m.log_dir_of(*tp) for tp in parts}
    assert sorted(set(dir_of.values())) == [d1, d2]
    logs = {tp: m.log(*tp) for tp in parts}   # held: these go on reading once their dir is offline
    acked = {tp: [] for tp in parts}
    refused = {}                  # partition: (the error, the key of the refused append)
    stop = {"t": threading.Event(), "k": threading.Event()}

    def append(topic, partitions):
        i = 0
        while not stop[topic].is_set():
            for p in partitions:
                if (topic, p) in refused:
                    continue
                key = b"k%d" % (i % 20)
                try:
                    acked[topic, p].append(m.append(topic, key, b"v" * 200, partition=p).offset)
                except LogDirOfflineError as e:
                    refused[topic, p] = (e, key)
            i += 1
    threads = [threading.Thread(target=append, args=("t", range(4)), daemon=True),
               threading.Thread(target=append, args=("k", range(2)), daemon=True)]
    for t in threads:
        t.start()
    while min(len(a) for a in acked.values()) < 300:
        time.sleep(0.01)
    ops.under = d1
    offline = [tp for tp in parts if dir_of[tp] == d1]
    while set(refused) != set(offline):
        time.sleep(0.01)
    assert list(m.offline_dirs) == [d1] and "No space left" in m.offline_dirs[d1]
    assert all("is offline" in str(e) or "No space left" in str(e) for e, _k in refused.values())
    seen = {tp: [(r.offset, r.key) for r in logs[tp].read(logs[tp].log_start_offset,
                                                          max_bytes=1 << 30)] for tp in offline}
    before = _files(d1)
    online_t = [p for p in range(4) if dir_of["t", p] == d2]
    start = {p: m.log("t", p).log_start_offset for p in online_t}
    time.sleep(0.5)                                   # retention and the cleaner go on in d2
    assert all(m.log("t", p).log_start_offset > start[p] for p in online_t)
    stop["t"].set()
    threads[0].join(30)
    m.delete_topic("t")
    m.create_topic("n", 4)
    assert {m.log_dir_of("n", p) for p in range(4)} == {d2}
    time.sleep(0.5)
    stop["k"].set()
    for t in threads:
        t.join(30)
    m.close()
    assert _files(d1) == before                        # nothing wrote to the offline dir
    assert ".kafka_cleanshutdown" not in os.listdir(d1)
    assert not any(n.startswith("t-") and not n.endswith("-delete") for n in os.listdir(d2))
    for tp in offline:       # the acknowledged records, in order, then at most the refused one
        assert acked[tp] == list(range(len(acked[tp])))
        extra = [r for r in seen[tp] if r[0] > acked[tp][-1]]
        assert extra in ([], [(len(acked[tp]), refused[tp][1])]), (
            tp, seen[tp][-3:], acked[tp][-3:], "".join(traceback.format_exception(refused[tp][0])))
        assert seen[tp][-1][0] == acked[tp][-1] + len(extra)  # compaction keeps the last record
        if tp[0] == "t":          # retention kept a suffix
            assert [o for o, _k in seen[tp]] == list(range(seen[tp][0][0], seen[tp][-1][0] + 1))
    with LogManager([d1, d2], dict(cfg, **{"log.cleaner.enable": "false"})) as m:
        assert sorted(m.topics()) == ["k", "n"]
        for tp in offline:
            if tp[0] == "k":
                lg = m.log(*tp)
                assert [(r.offset, r.key) for r in lg.read(lg.log_start_offset, max_bytes=1 << 30)] == seen[tp]
        names = os.listdir(d1)
        for topic, p in offline:
            if topic == "t":
                assert f"t-{p}" not in names
                assert any(n.startswith(f"t-{p}.") and n.endswith("-delete") for n in names)



class _FsyncFailsUnder(FileOps):
    """Once armed, an fsync of a file under `under` fails with EIO: the disk fails after an
    append's bytes reached the page cache, at the flush that flush.messages makes due."""

    def __init__(self):
        super().__init__()
        self.under = None

    def fsync(self, fd):
        if self.under and os.readlink(f"/proc/self/fd/{fd}").startswith(self.under + os.sep):
            raise OSError(errno.EIO, "Input/output error (injected)")
        return super().fsync(fd)


_READ_KEYS = r"""
import sys, kstore
with kstore.StoreReader(sys.argv[1]) as r:
    for t in ("t", "s"):
        print(" ".join(x.key.decode() for x in r.log(t, 0).read(0, max_bytes=1 << 30)))
"""


@pytest.mark.parametrize("how", ["own fsync", "dir failed meanwhile"])
def test_a_refused_append_is_the_one_batch_in_doubt(tmp_path, how, watchdog, monkeypatch):
    """Kafka's UnifiedLog.append writes the batch, then flushes if flush.messages is due, in one
    maybeHandleIOException: an I/O error there (its own fsync, or its dir taken offline by
    another log meanwhile, its handlers closed) fails the produce with KAFKA_STORAGE_ERROR while
    the batch is in the log, and a restart recovers it. kstore's contract is Kafka's: a refused
    append's batch may be in the log, the only record past what was acknowledged (the dir then
    refuses every write). Its sibling in the dir, appended to by another thread meanwhile,
    holds exactly what it was acknowledged; another process and the restart read the same.
    (The second case is what made test_an_offline_dir_is_left_alone... flake: between the
    append's write and its due flush, another log's ENOSPC took the dir offline.)"""
    watchdog(60)
    ops = _FsyncFailsUnder()
    d = str(tmp_path / "d")
    m = LogManager([d], {"log.flush.interval.messages": "4"}, io=ops)
    m.create_topic("t", 1)
    m.create_topic("s", 1, {"flush.messages": str(1 << 62)})     # the sibling never flushes
    lg, sib = m.log("t", 0), m.log("s", 0)
    acked: list[bytes] = []
    refused: list[Exception] = []

    def sibling():
        i = 0
        while not refused:
            try:
                m.append("s", b"s%d" % i, b"v", partition=0)
                acked.append(b"s%d" % i)
            except LogDirOfflineError as e:
                refused.append(e)
            i += 1
    t = threading.Thread(target=sibling, daemon=True)
    t.start()
    assert [m.append("t", b"a%d" % i, b"v", partition=0).offset for i in range(3)] == [0, 1, 2]
    while len(acked) < 50:
        time.sleep(0.001)
    if how == "own fsync":
        ops.under = os.path.join(d, "t-0")
    else:
        flush = lg.flush

        def failed_first(*args, **kw):          # another log's error, just before the flush
            m.log_dir_failure_channel.mark_offline(d, OSError(errno.EIO, "Input/output error "
                                                                         "(injected)"))
            return flush(*args, **kw)
        monkeypatch.setattr(lg, "flush", failed_first)
    with pytest.raises(LogDirOfflineError, match=r"Input/output error \(injected\)"):
        m.append("t", b"in-doubt", b"v", partition=0)      # the 4th: flush.messages is due
    assert list(m.offline_dirs) == [d]
    t.join(30)
    assert not t.is_alive() and "is offline" in str(refused[0])
    expect = ["a0 a1 a2 in-doubt", " ".join(k.decode() for k in acked)]
    assert [" ".join(r.key.decode() for r in x.read(0, max_bytes=1 << 30)) for x in (lg, sib)] == expect
    out = subprocess.run([sys.executable, "-c", _READ_KEYS, d], timeout=60, capture_output=True,
                         text=True, check=True, cwd=str(tmp_path)).stdout.splitlines()
    assert out == expect
    ops.under = None
    m.close()
    with LogManager([d]) as m:
        assert [" ".join(r.key.decode() for r in m.read(x, 0, 0, max_bytes=1 << 30))
                for x in ("t", "s")] == expect


_READ_DIR = r"""
import sys, kstore
with kstore.StoreReader(sys.argv[1]) as r:
    for p in map(int, sys.argv[2:]):
        print(" ".join(str(x.offset) for x in r.log("t", p).read(0, max_bytes=1 << 30)))
"""


def test_an_offline_dirs_partitions_refuse_reads_until_a_restart(tmp_path, watchdog):
    """Kafka's handleLogDirFailure takes the dir's partitions offline: a fetch of one fails with
    KAFKA_STORAGE_ERROR until the broker restarts. Before, the manager refused writes there but
    still served reads (LogManager.read, log() and so read_columns, a Consumer's poll). Now each
    raises LogDirOfflineError naming the partition and its dir (a Consumer's poll returns
    nothing from it, as Kafka's retries a KAFKA_STORAGE_ERROR), while a thread appends to every
    partition and a consumer polls the other dir's, which keep working. Another process's
    StoreReader, which cannot know, still reads the dir; a restart serves it again."""
    watchdog(120)
    ops = _DiskFullUnder()
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2], {"log.segment.bytes": "20000"}, io=ops)
    m.create_topic("t", 4)
    off1 = [p for p in range(4) if m.log_dir_of("t", p) == d1]
    on2 = [p for p in range(4) if p not in off1]
    assert off1 and on2
    acked: dict[int, list[int]] = {p: [] for p in range(4)}
    refused: dict[int, Exception] = {}
    polled: dict[int, list[int]] = {p: [] for p in on2}
    errors: list[BaseException] = []
    stop, drained = threading.Event(), threading.Event()

    def append():
        i = 0
        while not stop.is_set():
            for p in range(4):
                if p not in refused:
                    try:
                        acked[p].append(m.append("t", b"k%d" % i, b"v" * 100, partition=p).offset)
                    except LogDirOfflineError as e:
                        refused[p] = e
            i += 1

    def consume():
        try:
            with Consumer(m, auto_offset_reset="earliest", max_poll_records=100000) as c:
                c.assign([TP("t", p) for p in on2])
                while not drained.is_set() or any(len(polled[p]) < len(acked[p]) for p in on2):
                    for tp, recs in c.poll(20).items():
                        polled[tp.partition].extend(r.offset for r in recs)
        except BaseException as e:    # reported by the main thread
            errors.append(e)
    threads = [threading.Thread(target=append, daemon=True),
               threading.Thread(target=consume, daemon=True)]
    for t in threads:
        t.start()
    while min(len(a) for a in acked.values()) < 100:
        time.sleep(0.01)
    p = off1[0]
    c1 = Consumer(m, auto_offset_reset="earliest", max_poll_records=100000)
    c1.assign([TP("t", p)])
    assert [r.offset for r in c1.poll(0)[TP("t", p)]][:100] == list(range(100))
    ops.under = d1
    while set(refused) != set(off1):
        time.sleep(0.01)
    why = f"partition t-{p} is offline: its log dir {re.escape(d1)} is offline \\(.*No space left"
    for read in (lambda: m.read("t", p, 0), lambda: m.log("t", p)):
        with pytest.raises(LogDirOfflineError, match=why):
            read()
    assert c1.poll(0) == {}        # as Kafka's consumer: a retriable fetch error, nothing read
    for q in on2:                                   # the other dir goes on
        assert [r.offset for r in m.read("t", q, 0, max_bytes=1 << 30)][:100] == list(range(100))
    time.sleep(0.2)
    stop.set()
    threads[0].join(30)
    drained.set()                                   # the consumer reads on to the end
    threads[1].join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert {q: polled[q] for q in on2} == {q: acked[q] for q in on2}
    c1.close()
    out = subprocess.run([sys.executable, "-c", _READ_DIR, d1, *map(str, off1)], timeout=60,
                         capture_output=True, text=True, check=True, cwd=str(tmp_path)).stdout.splitlines()
    on_disk = {q: [int(o) for o in line.split()] for q, line in zip(off1, out)}
    for q in off1:          # what was acknowledged, and at most the refused batch (in doubt)
        assert acked[q] == list(range(len(acked[q])))
        assert on_disk[q] in (acked[q], acked[q] + [len(acked[q])])
    m.close()
    with LogManager([d1, d2]) as m:
        for q in off1:
            assert [r.offset for r in m.read("t", q, 0, max_bytes=1 << 30)] == on_disk[q]


def test_a_consumer_reads_on_past_an_offline_dir_and_loses_no_record(tmp_path, watchdog):
    """Kafka's consumer treats a fetch's KAFKA_STORAGE_ERROR as retriable (FetchCollector
    handleInitializeErrors: a metadata update, nothing raised): the partition yields nothing and
    the others go on. A Consumer of partitions in both dirs, polling few records at a time while
    a thread appends to all, sees one dir go offline: its polls never raise, it returns every
    acknowledged record of the other dir's partitions in order and a gapless prefix of the
    offline ones' (before: poll raised LogDirOfflineError after moving the positions of the
    partitions it had read in that poll, whose records were lost), and its group commit and
    close go on (the offsets topic is not in the offline dir)."""
    watchdog(120)
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2], {"offsets.topic.num.partitions": "1"})
    m.create_topic("t", 4)
    off1 = [p for p in range(4) if m.log_dir_of("t", p) == d1]
    on2 = [p for p in range(4) if p not in off1]
    assert off1 and on2
    acked: dict[int, list[int]] = {p: [] for p in range(4)}
    refused: dict[int, Exception] = {}
    stop = threading.Event()

    def append():
        i = 0
        while not stop.is_set():
            for p in range(4):
                if p not in refused:
                    try:
                        acked[p].append(m.append("t", b"k%d" % i, b"v", partition=p).offset)
                    except LogDirOfflineError as e:
                        refused[p] = e
            i += 1
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    polled: dict[int, list[int]] = {p: [] for p in range(4)}
    c = Consumer(m, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False,
                 max_poll_records=7)
    c.assign([TP("t", p) for p in range(4)])

    def poll():
        for tp, recs in c.poll(0.02).items():
            polled[tp.partition].extend(r.offset for r in recs)
    while min(len(polled[p]) for p in range(4)) < 50:
        poll()
    m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))
    while set(refused) != set(off1) or min(len(acked[q]) for q in on2) < len(acked[off1[0]]) + 200:
        poll()
    stop.set()
    writer.join(30)
    assert not writer.is_alive()
    while any(len(polled[q]) < len(acked[q]) for q in on2):
        poll()
    poll()
    assert {q: polled[q] for q in on2} == {q: acked[q] for q in on2}
    for p in off1:               # what was read before the dir went offline, with no gap
        assert polled[p] == list(range(len(polled[p]))) and len(polled[p]) >= 50
        assert acked[p][:len(polled[p])] == polled[p]
        assert c.position(TP("t", p)) == len(polled[p])
    c.commit()
    assert {p: c.committed(TP("t", p)) for p in range(4)} == {p: len(polled[p]) for p in range(4)}
    c.close()
    with Consumer(m, auto_offset_reset="earliest") as c2:   # no position there: position() says why
        c2.assign([TP("t", off1[0])])
        assert c2.poll(0) == {}
        t0 = time.monotonic()                # (retried until its timeout, as Kafka's position)
        with pytest.raises(ApiTimeoutError, match=f"Timeout of 200ms expired before the "
                           f"position for partition t-{off1[0]} could be determined "
                           f"\\(.*partition t-{off1[0]} is offline"):
            c2.position(TP("t", off1[0]), timeout_ms=200)
        assert time.monotonic() - t0 >= 0.2
    m.close()


_TAIL_DIR = r"""
import sys, kstore
d, parts = sys.argv[1], [int(p) for p in sys.argv[2:]]
with kstore.StoreReader(d) as r:
    print("ready", flush=True)
    while True:                      # reads until told to stop: each read a gapless prefix
        for p in parts:
            offs = [x.offset for x in r.log("t", p, refresh=True).read(0, max_bytes=1 << 30)]
            assert offs == list(range(len(offs))), (p, offs[:5])
        if sys.stdin.readline() != "again\n":
            break
        print("read", flush=True)
    for p in parts:
        lg = r.log("t", p, refresh=True)
        print(" ".join(str(x.offset) for x in lg.read(0, max_bytes=1 << 30)))
"""


def test_logs_and_the_tasks_drop_an_offline_dirs_logs(tmp_path, watchdog):
    """Kafka's handleLogDirFailure removes the failed dir's logs from currentLogs: allLogs, the
    cleaner, retention, the flusher and the checkpoints never see them again. Before,
    LogManager.logs() still listed them (the tasks skipped them one check at a time). While a
    thread appends to every partition, the scheduler's tasks and the cleaner run at a 20 ms
    beat and another process's StoreReader reads the dir, the dir goes offline: logs() is
    exactly the other dir's partitions, the offline dir's files stay as they were, and the
    reader reads there what was acknowledged (and at most the refused batch, in doubt)."""
    watchdog(120)
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    cfg = {"log.initial.task.delay.ms": "0", "log.retention.check.interval.ms": "20",
           "log.flush.scheduler.interval.ms": "20", "log.cleaner.backoff.ms": "20",
           "log.flush.offset.checkpoint.interval.ms": "20", "log.flush.interval.ms": "100",
           "log.flush.start.offset.checkpoint.interval.ms": "20"}
    m = LogManager([d1, d2], cfg)
    m.create_topic("t", 4, {"segment.bytes": "4000"})
    m.create_topic("k", 2, {"cleanup.policy": "compact", "segment.bytes": "4000"})
    off1 = [p for p in range(4) if m.log_dir_of("t", p) == d1]
    on2 = [p for p in range(4) if p not in off1]
    k2 = [("k", p) for p in range(2) if m.log_dir_of("k", p) == d2]
    assert off1 and on2 and set(m.logs()) == {("t", p) for p in range(4)} | {("k", 0), ("k", 1)}
    acked: dict[int, list[int]] = {p: [] for p in range(4)}
    refused: dict[int, Exception] = {}
    stop = threading.Event()

    def append():
        i = 0
        while not stop.is_set():
            for p in range(4):
                if p not in refused:
                    try:
                        acked[p].append(m.append("t", b"k%d" % (i % 10), b"v" * 50,
                                                 partition=p).offset)
                    except LogDirOfflineError as e:
                        refused[p] = e
            for p in range(2):                 # the cleaner's work, in both dirs
                try:
                    m.append("k", b"k%d" % (i % 10), b"v", partition=p)
                except LogDirOfflineError:
                    pass
            i += 1
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    reader = subprocess.Popen([sys.executable, "-c", _TAIL_DIR, d1, *map(str, off1)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              cwd=str(tmp_path))
    try:
        assert reader.stdout.readline() == "ready\n"
        while min(len(a) for a in acked.values()) < 300:
            reader.stdin.write("again\n")
            reader.stdin.flush()
            assert reader.stdout.readline() == "read\n"
            time.sleep(0.01)
        m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))
        while set(refused) != set(off1):
            time.sleep(0.01)
        assert set(m.logs()) == {("t", p) for p in on2} | set(k2)
        time.sleep(0.1)                        # whatever a task had begun before is done
        before = _files(d1)
        for _ in range(5):                     # the tasks and the reader go on beside the writer
            reader.stdin.write("again\n")
            reader.stdin.flush()
            assert reader.stdout.readline() == "read\n"
            time.sleep(0.05)
        m.flush_dirty_logs()
        m.cleanup_logs()
        m.checkpoint_recovery_offsets()
        m.checkpoint_log_start_offsets()
        m.clean_now()
        assert set(m.logs()) == {("t", p) for p in on2} | set(k2)
        assert _files(d1) == before
        stop.set()
        writer.join(30)
        assert not writer.is_alive()
        out, _err = reader.communicate("stop\n", timeout=60)
        assert reader.returncode == 0
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait(30)
    on_disk = {p: [int(o) for o in line.split()] for p, line in zip(off1, out.splitlines())}
    for p in off1:
        assert acked[p] == list(range(len(acked[p])))
        assert on_disk[p] in (acked[p], acked[p] + [len(acked[p])]), (
            len(on_disk[p]), len(acked[p]), on_disk[p][-3:], acked[p][-3:])
    m.close()
