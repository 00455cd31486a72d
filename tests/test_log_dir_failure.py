"""kstore/log_dir_failure.py: LogDirFailureChannel records the first error of a dir, guards work
on a dir, and tells disk errors (offline) from a file's own errors (raised as they are)."""
import errno
import os
import threading
import time
import traceback

import pytest

from kstore.errors import LogDirOfflineError
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
    partitions are renamed for deletion, the new topic goes there alone). At the restart the
    offline dir's logs hold exactly what was acknowledged, and the deleted topic's partitions
    there are stray logs, renamed for deletion as Kafka's KRaft broker renames them."""
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
    acked = {tp: [] for tp in parts}
    refused = {}
    stop = {"t": threading.Event(), "k": threading.Event()}

    def append(topic, partitions):
        i = 0
        while not stop[topic].is_set():
            for p in partitions:
                if (topic, p) in refused:
                    continue
                try:
                    acked[topic, p].append(
                        m.append(topic, b"k%d" % (i % 20), b"v" * 200, partition=p).offset)
                except LogDirOfflineError as e:
                    refused[topic, p] = e
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
    assert all("is offline" in str(e) or "No space left" in str(e) for e in refused.values())
    seen = {tp: [(r.offset, r.key) for r in m.log(*tp).read(m.log(*tp).log_start_offset,
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
    for tp in offline:            # the acknowledged records, in order, none after the refusal
        assert acked[tp] == list(range(len(acked[tp])))
        if tp[0] == "t":          # retention kept a suffix; compaction keeps the last record
            assert [o for o, _k in seen[tp]] == list(range(seen[tp][0][0], len(acked[tp])))
        assert seen[tp][-1][0] == acked[tp][-1], (          # (what refused it, if not)
            tp, seen[tp][-3:], acked[tp][-3:], "".join(traceback.format_exception(refused[tp])))
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
