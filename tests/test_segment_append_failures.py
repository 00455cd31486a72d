"""An append that fails part-way leaves nothing (segment.py append, runway.py unwrite,
index.py reserve_next): not its bytes in the .log (a reopen, clean or after a crash, would
recover the "failed" batch and a retrying producer would duplicate it), not its index
entries, not a size or offset; the error is a KafkaStorageError naming the file. Each
failure point of an append is checked on the same workload: the offset or time index's
block reservation (ENOSPC), the runway's zero-fill (ENOSPC), a torn pwrite of a large batch
(ENOSPC), and a copy into the mapping that wrote every byte and then failed (EIO)."""
import errno
import os
import shutil
import subprocess
import sys

import pytest

import kstore
from kstore.fileio import FileOps

NOW_MS = 1_700_000_000_000
LOG = "00000000000000000000.log"


class FailingOps(FileOps):
    """Fails one operation once armed: `where` picks the operation and the file."""
    intercept_map_writes = True

    def __init__(self):
        super().__init__()
        self.where = None

    @staticmethod
    def _name(fd):
        return os.readlink(f"/proc/self/fd/{fd}")

    def zero_fill(self, fd, offset, length):
        suffix = {"index": ".index", "timeindex": ".timeindex", "runway": ".log"}.get(self.where)
        if suffix and self._name(fd).endswith(suffix):
            self.where = None
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return super().zero_fill(fd, offset, length)

    def pwrite(self, fd, data, offset):
        if self.where == "pwrite" and self._name(fd).endswith(".log"):
            self.where = None
            view = memoryview(data)
            os.pwrite(fd, view[:len(view) // 2], offset)       # torn: half, then the error
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return super().pwrite(fd, data, offset)

    def map_write(self, mapping, position, data):
        super().map_write(mapping, position, data)
        if self.where == "copy":
            self.where = None                                  # every byte landed, then EIO
            raise OSError(errno.EIO, "Input/output error (injected)")


def _records(tag, n, size):
    return [(b"%s-%012d" % (tag, i), bytes([65 + i % 26]) * size, NOW_MS + i) for i in range(n)]


def _files(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith((".log", ".index", ".timeindex")):
            with open(os.path.join(d, f), "rb") as fh:
                out[f] = fh.read()
    return out


def _same_but_zero_tail(before, after):
    """after holds before's bytes then only zeros (a runway or preallocation grown since)."""
    return after[:len(before)] == before and after.count(0, len(before)) == len(after) - len(before)


# where -> (failing file, errno, the failed append is large (pwritten))
CASES = {"index": (".index", errno.ENOSPC, False), "timeindex": (".timeindex", errno.ENOSPC, False),
         "runway": (".log", errno.ENOSPC, False), "pwrite": (".log", errno.ENOSPC, True),
         "copy": (".log", errno.EIO, False)}


@pytest.mark.parametrize("where", sorted(CASES))
def test_a_failed_append_leaves_nothing(tmp_path, where, watchdog):
    suffix, err, large = CASES[where]
    root = str(tmp_path / "store")
    d = os.path.join(root, "t-0")
    ops = FailingOps()
    # every append after a segment's first gets an index entry; the first entry reserves the
    # indexes' first block (zero_fill), the runway's first 64 KiB is grown by the first copy
    cfg = {"index.interval.bytes": 1, "max.message.bytes": 10 << 20}
    log = kstore.Log.open(d, cfg, io=ops)
    first = _records(b"a", 3, 100)
    log.append(first)
    acked = log.log_end_offset
    size = log.active_segment.size
    before = _files(d)
    if where == "runway":
        # the next copies fill the first 64 KiB runway; the one past it grows the runway
        fill = _records(b"f", 1, 60_000 // 2)[:1] * 0 + [(b"f", b"x" * 4000, NOW_MS)]
        while log.active_segment.size + 4200 <= 64 << 10:
            log.append(fill)
        acked, size, before = log.log_end_offset, log.active_segment.size, _files(d)
    failed = _records(b"x", 300 if large else 3, 1000 if large else 100 if where != "runway" else 4000)
    ops.where = where
    with pytest.raises(kstore.KafkaStorageError) as ei:
        log.append(failed)
    assert ops.where is None                                     # the injected failure happened
    assert ei.value.errno == err
    assert suffix in str(ei.value) and d in str(ei.value)        # names the file
    assert log.log_end_offset == acked and log.active_segment.size == size
    after = _files(d)
    assert after.keys() == before.keys()
    for name in before:                                          # nothing but zeros past the old data
        assert _same_but_zero_tail(before[name][:size] if name == LOG else before[name],
                                   after[name]), name
    assert after[LOG][:size] == before[LOG][:size]
    # another process's view (a read-only StoreReader scans past what it knew) sees no such batch
    with kstore.StoreReader(root) as r:
        ro = r.log("t", 0)
        assert ro.log_end_offset == acked
        assert [x.key for x in ro.read(0, max_bytes=1 << 30)][-1] != failed[-1][0]
    # a crash now (kill -9 leaves the files as they are): the unclean open recovers no such batch
    crash = str(tmp_path / "crash" / "t-0")
    shutil.copytree(d, crash)
    with kstore.Log.open(crash, cfg) as c:
        assert c.log_end_offset == acked
        assert [x.offset for x in c.read(0, max_bytes=1 << 30)] == list(range(acked))
        info = c.append(failed)                                  # the retry gets the next offsets
        assert (info.first_offset, info.last_offset) == (acked, acked + len(failed) - 1)
    with pytest.raises(kstore.KafkaStorageError, match="reopen it"):
        log.append(failed)                                       # the log stays failed until reopened
    log.close()
    with kstore.Log.open(d, cfg) as log:                         # clean reopen, space back
        assert log.log_end_offset == acked
        info = log.append(failed)
        assert (info.first_offset, info.last_offset) == (acked, acked + len(failed) - 1)
        got = log.read(acked, max_bytes=1 << 30)
        assert [(x.offset, x.key, x.value) for x in got] == [
            (acked + i, k, v) for i, (k, v, _ts) in enumerate(failed)]
        assert log.active_segment.offset_index.lookup(acked + 1)[0] <= acked + 1
    with kstore.Log.open(d, cfg) as log:
        assert log.log_end_offset == acked + len(failed)
        assert [x.key for x in log.read(0, max_bytes=1 << 30)].count(failed[0][0]) == 1


# another process's reader: the keys it reads from the partition (a StoreReader scans past what
# the writer published, validating what it finds)
_PEEK = r"""
import sys, kstore
with kstore.StoreReader(sys.argv[1]) as r:
    print(b"|".join(x.key for x in r.log("t", 0).read(0, max_bytes=1 << 30)).decode())
"""


class PeekingOps(FailingOps):
    """FailingOps whose injected index failure first lets another process read the partition
    (the moment between the batch's bytes and its error)."""

    def __init__(self, root):
        super().__init__()
        self.root = root
        self.seen = None

    def zero_fill(self, fd, offset, length):
        suffix = {"index": ".index", "timeindex": ".timeindex"}.get(self.where)
        if suffix and self._name(fd).endswith(suffix):
            # cwd outside the checkout: the child imports the installed kstore (PYTHONPATH kept)
            self.seen = subprocess.run([sys.executable, "-c", _PEEK, self.root], cwd=self.root,
                                       capture_output=True, text=True, timeout=60,
                                       check=True).stdout.strip().split("|")
        return super().zero_fill(fd, offset, length)


@pytest.mark.parametrize("where", ["index", "timeindex"])
def test_a_batch_whose_index_block_fails_is_never_seen_by_another_process(tmp_path, where,
                                                                          watchdog):
    """Another process reads the partition at the moment the append's index block reservation
    fails (ENOSPC, injected): it sees the records of the earlier appends only, never the failed
    batch's (which is then gone for good: no retry or reopen gives its offsets those records).
    Before, the batch was copied into the log first and its index block reserved after, so the
    reader, which validates what the file holds past the writer's published size, returned the
    failed batch's records; the writer then zeroed them and gave their offsets to the next
    append."""
    watchdog(120)
    root = str(tmp_path / "store")
    ops = PeekingOps(root)
    cfg = {"index.interval.bytes": 1}
    log = kstore.Log.open(os.path.join(root, "t-0"), cfg, io=ops)
    try:
        first = _records(b"a", 3, 100)
        log.append(first)
        ops.where = where
        with pytest.raises(kstore.KafkaStorageError):
            log.append(_records(b"x", 3, 100))
        assert ops.where is None
        assert ops.seen == [k.decode() for k, _v, _ts in first]
    finally:
        log.close()


def _columns(keys, size):
    """Rows of `keys` with `size`-byte values as a ColumnInput (append_columns' input)."""
    import numpy as np
    n = len(keys)
    koff, voff = np.zeros(n + 1, np.int32), np.zeros(n + 1, np.int32)
    koff[1:] = np.cumsum([len(k) for k in keys])
    voff[1:] = np.arange(1, n + 1, dtype=np.int32) * size
    return kstore._core.ColumnInput(
        n, key=(koff, np.frombuffer(b"".join(keys), np.uint8), None),
        value=(voff, np.full(n * size, 66, np.uint8), None),
        timestamps=np.full(n, NOW_MS, np.int64))


def test_a_failed_append_columns_fails_the_log_as_append_does(tmp_path):
    """append_columns' I/O error fails the log as append's does: the next append of any kind is
    refused ("reopen it") instead of writing on after a failed write (Kafka: the log's dir goes
    offline). Before, append_columns raised and the log took the next appends."""
    d = str(tmp_path / "t-0")
    ops = FailingOps()
    log = kstore.Log.open(d, {"max.message.bytes": 10 << 20}, io=ops)
    assert log.append_columns(_columns([b"a%d" % i for i in range(3)], 100)) == (0, 3)
    ops.where = "pwrite"
    with pytest.raises(kstore.KafkaStorageError) as ei:
        log.append_columns(_columns([b"x%03d" % i for i in range(300)], 1000))
    assert ops.where is None and ei.value.errno == errno.ENOSPC and LOG in str(ei.value)
    assert log.log_end_offset == 3
    with pytest.raises(kstore.KafkaStorageError, match="reopen it"):
        log.append_columns(_columns([b"b"], 10))
    with pytest.raises(kstore.KafkaStorageError, match="reopen it"):
        log.append([(b"c", b"v")])
    assert [x.key for x in log.read(0)] == [b"a0", b"a1", b"a2"]
    log.close()
    with kstore.Log.open(d) as log:
        assert [x.key for x in log.read(0)] == [b"a0", b"a1", b"a2"]
