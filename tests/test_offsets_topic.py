"""kstore/offsets_topic.py and the log dirs' failure channel: a commit whose __consumer_offsets
partition is on an offline log dir fails with CoordinatorNotAvailableError (Kafka: the
coordinator of that partition is unavailable, COORDINATOR_NOT_AVAILABLE / NOT_COORDINATOR,
both retriable), writes nothing there, and every offset committed before stays."""
import errno
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

from kstore import ApiTimeoutError, Consumer, LogManager, TopicPartition as TP
from kstore.errors import LogDirOfflineError
from kstore.fileio import FileOps
from kstore.group_records import OffsetAndMetadata

from thread_watchdog import join_all

OFFSETS = "__consumer_offsets-0"


class _DiskFullUnder(FileOps):
    """Once armed, every data write under `under` fails with ENOSPC."""

    def __init__(self):
        super().__init__()
        self.under = None

    def _check(self, fd):
        under = self.under              # once: the test disarms it while a thread appends
        if under and os.readlink(f"/proc/self/fd/{fd}").startswith(under + os.sep):
            raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def zero_fill(self, fd, offset, length):
        self._check(fd)
        return super().zero_fill(fd, offset, length)

    def pwrite(self, fd, data, offset):
        self._check(fd)
        return super().pwrite(fd, data, offset)


def _files(d):
    """{name: bytes} of the partition dir d but its wake-up word."""
    out = {}
    for n in sorted(os.listdir(d)):
        if n != ".kstore-notify":
            with open(os.path.join(d, n), "rb") as f:
                out[n] = f.read()
    return out


_COMMITTED = r"""
import sys
from kstore import Consumer, TopicPartition as TP
with Consumer(sys.argv[1:], group_id="g", enable_auto_commit=False) as c:
    print(" ".join(str(c.committed(TP("t", p))) for p in range(4)))
"""


def _committed_elsewhere(dirs, cwd):
    """The group's committed offsets of t-0..3 as another process reads them."""
    out = subprocess.run([sys.executable, "-c", _COMMITTED, *dirs], timeout=60, check=True,
                         capture_output=True, text=True, cwd=cwd).stdout.split()
    return [None if o == "None" else int(o) for o in out]


@pytest.mark.parametrize("how", ["another log failed", "the commit's own write failed"])
def test_a_commit_to_an_offline_dirs_offsets_partition(tmp_path, how, watchdog, caplog):
    """Before: the dir's logs refused writes, but a commit opened the offsets partition there
    itself and wrote to the failed disk (and returned), or, when its own write met the I/O
    error, raised KafkaStorageError and left the dir online for the manager. Now, while a
    thread appends to every partition of t (its dir's ones refused) and another process reads
    the committed offsets: the coordinator refuses the commit (CoordinatorNotAvailableError
    naming the dir, retriable: Consumer.commit tries again until its timeout, then raises
    ApiTimeoutError with it, as Kafka's commitSync), the
    offsets partition's files are as they were, the dir is offline in the manager, a poll's
    auto-commit logs the retriable error instead of raising, and the earlier commit is what
    another process and a restart read (this consumer's committed() is refused as Kafka's
    OffsetFetch then: ApiTimeoutError after its timeout, test_consumer_commits)."""
    watchdog(120)
    ops = _DiskFullUnder()
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2], {"offsets.topic.num.partitions": "1"}, io=ops)
    m.create_topic("t", 4)
    c = Consumer(m, group_id="g", auto_offset_reset="earliest", auto_commit_interval_ms=0, io=ops)
    c.assign([TP("t", p) for p in range(4)])
    earlier = {TP("t", p): 10 + p for p in range(4)}
    c.commit(earlier)
    assert [c.position(tp) for tp in earlier] == [10, 11, 12, 13]   # known before d1 fails
    assert os.path.isdir(os.path.join(d1, OFFSETS)) and not os.path.exists(os.path.join(d2, OFFSETS))
    refused: dict[int, Exception] = {}
    stop = threading.Event()

    def append():
        while not stop.is_set():
            for p in range(4):
                if p not in refused:
                    try:
                        m.append("t", b"k", b"v", partition=p)
                    except LogDirOfflineError as e:
                        refused[p] = e
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    try:
        before = _files(os.path.join(d1, OFFSETS))
        ops.under = d1
        if how == "another log failed":
            off = [p for p in range(4) if m.log_dir_of("t", p) == d1]
            while set(refused) != set(off):
                stop.wait(0.01)
            why = f"is in log dir {d1}, which is offline"
        else:     # a commit large enough for a pwrite is the first write to fail there
            with pytest.raises(ApiTimeoutError, match=f"before successfully committing offsets "
                               f"{{t-0=.*}} .*the write to {d1}/{OFFSETS} failed"):
                c.commit({TP("t", 0): OffsetAndMetadata(99, "m" * 20000)}, timeout_ms=0)
            why = f"is in log dir {d1}, which is offline \\(\\[Errno 28\\] No space left"
        assert list(m.offline_dirs) == [d1]
        for ms in (0, 200):                  # retried until its timeout (Kafka's commitSync)
            t0 = time.monotonic()
            with pytest.raises(ApiTimeoutError, match=f"Timeout of {ms}ms expired before "
                               "successfully committing offsets {t-0=20, t-1=21, t-2=22, t-3=23} .*" + why):
                c.commit({TP("t", p): 20 + p for p in range(4)}, timeout_ms=ms)
            assert time.monotonic() - t0 >= ms / 1000
        with caplog.at_level(logging.WARNING, "kstore.consumer"):
            got = c.poll(0)                  # reads the other dir's partitions
            assert got and all(m.log_dir_of(tp.topic, tp.partition) == d2 for tp in got)
            assert c.poll(0) is not None     # its auto-commit of those fails, logged: no raise
        assert any("auto-commit of offsets failed due to retriable error" in r.getMessage()
                   for r in caplog.records)
        for tp in earlier:                   # OffsetFetch: COORDINATOR_NOT_AVAILABLE, retried
            with pytest.raises(ApiTimeoutError, match=f"committed offset for partitions \\[{tp}\\]"):
                c.committed(tp, timeout_ms=0)
        assert _committed_elsewhere([d1, d2], str(tmp_path)) == [10, 11, 12, 13]
        ops.under = None
        assert _files(os.path.join(d1, OFFSETS)) == before
    finally:
        stop.set()
        join_all([writer], 30)
    c.close(autocommit=False)
    m.close()
    with LogManager([d1, d2]) as m2:
        with Consumer(m2, group_id="g", enable_auto_commit=False) as c2:
            assert {tp: c2.committed(tp) for tp in earlier} == earlier


def test_a_new_offsets_partition_goes_to_an_online_dir(tmp_path, watchdog):
    """Kafka creates a log in a live dir only. A group's first commit after the first log dir
    went offline made __consumer_offsets (and its topic record) in that dir, writing to the
    failed disk; now both go to the first online dir, beside an appending thread, and the
    commit is what another process and a restart read."""
    watchdog(60)
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2], {"offsets.topic.num.partitions": "1"})
    m.create_topic("t", 4)
    on = [p for p in range(4) if m.log_dir_of("t", p) == d2]
    stop = threading.Event()

    def append():
        while not stop.is_set():
            for p in on:
                m.append("t", b"k", b"v", partition=p)
    m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))
    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    try:
        with Consumer(m, group_id="g", enable_auto_commit=False) as c:
            c.commit({TP("t", p): 5 + p for p in range(4)})
        assert OFFSETS not in os.listdir(d1) and ".kstore-groups" not in os.listdir(d1)
        assert os.path.isdir(os.path.join(d2, OFFSETS))
        assert os.path.exists(os.path.join(d2, ".kstore-groups", "offsets-topic.json"))
        assert _committed_elsewhere([d1, d2], str(tmp_path)) == [5, 6, 7, 8]
    finally:
        stop.set()
        join_all([writer], 30)
    m.close()
    with LogManager([d1, d2]) as m2, Consumer(m2, group_id="g", enable_auto_commit=False) as c2:
        assert [c2.committed(TP("t", p)) for p in range(4)] == [5, 6, 7, 8]
