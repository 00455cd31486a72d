"""The pretoucher (kstore/pretouch.py) and the runway it grows (kstore/runway.py): the bytes
appended are the same with and without it (golden hashes of main's encoder), it grows the runway
ahead of the writer with zeros and never below the data, its failures leave the writer's own
path to fail or succeed as before, and a FileOps that is not thread-safe is served in order in
the caller's thread."""
import errno
import hashlib
import os
import threading
import time

import pytest

import kstore
from kstore import pretouch
from kstore.clock import MockTime
from kstore.errors import KafkaStorageError
from kstore.fileio import FileOps
from kstore.segment import PWRITE_MIN_BYTES
from tests.golden_bytes import epoch_back_to_unknown

NOW = 1_700_000_000_000

#: sha256[:16] of each file after golden_workload, written by main's encoder before this work
GOLDEN = {
    "00000000000000000000.index": "3f29f5ddc22e8460",
    "00000000000000000000.log": "7d6345a04919c3bf",
    "00000000000000000000.timeindex": "cfe0086ff10c9114",
    "00000000000000007824.index": "f77c5af49b718816",
    "00000000000000007824.log": "8bd559177fd8441e",
    "00000000000000007824.timeindex": "118d923f756a6eac",
}


@pytest.fixture
def pretoucher():
    pt = pretouch.enable()
    yield pt
    pretouch.disable()


def golden_workload(root: str, io=None) -> dict:
    """Large batches (None keys among them), single records, headers, list-shaped records and
    nulls, across a roll; returns each file's sha256[:16]."""
    lg = kstore.Log.open(os.path.join(root, "g-0"), {"segment.bytes": 1 << 20,
                                                      "index.interval.bytes": 4096},
                         time=MockTime(NOW), io=io)
    o = 0
    for i in range(40):
        if i % 4 == 0:
            recs = [(o.to_bytes(16, "big") if j % 7 else None, bytes([j % 251]) * 100, NOW + o + j)
                    for j in range(1000)]
        elif i % 4 == 1:
            recs = [(b"k%d" % o, b"single %d" % o)]
        elif i % 4 == 2:
            recs = [(b"h", b"v" * (i * 37), NOW - 5, [("hk", b"hv"), ("n", None)]), [b"l", b"list"],
                    (None, None)]
        else:
            recs = [(bytes(16), bytes(100 + j % 3)) for j in range(300)]
        o += len(recs)
        lg.append(recs)
    lg.close()
    out = {}
    for name in sorted(os.listdir(os.path.join(root, "g-0"))):
        if name.endswith((".log", ".index", ".timeindex")):
            with open(os.path.join(root, "g-0", name), "rb") as f:
                data = f.read()
            if name.endswith(".log"):       # batches now carry the leader epoch (0), main's -1
                data = epoch_back_to_unknown(data)
            out[name] = hashlib.sha256(data).hexdigest()[:16]
    return out


def test_appended_bytes_equal_mains_without_pretouch(tmp_path):
    assert golden_workload(str(tmp_path)) == GOLDEN


def test_appended_bytes_equal_mains_with_pretouch(tmp_path, pretoucher, watchdog):
    watchdog(60)
    assert golden_workload(str(tmp_path)) == GOLDEN
    assert pretoucher.filled > 0


def big_batch(first: int, n: int = 1000) -> list:
    return [(first.to_bytes(16, "big"), (first + j).to_bytes(8, "big") * 12 + b"vvvv", NOW + first + j)
            for j in range(n)]


def wait_until(cond, seconds: float = 10.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.002)
    return cond()


def test_runway_grown_ahead_with_zeros_and_trimmed_at_close(tmp_path, pretoucher, watchdog):
    watchdog(60)
    part = str(tmp_path / "t-0")
    lg = kstore.Log.open(part, time=MockTime(NOW))
    lg.append(big_batch(0))
    size = lg.active_segment.size
    assert size >= PWRITE_MIN_BYTES
    path = os.path.join(part, "00000000000000000000.log")
    # the window for ~127 KB appends is 32 of them (4 MiB), asked for when < half is left
    assert wait_until(lambda: os.path.getsize(path) >= size + (2 << 20))
    assert wait_until(lambda: pretoucher.filled >= 2 << 20)
    flen = os.path.getsize(path)
    with open(path, "rb") as f:
        f.seek(size)
        assert f.read(flen - size) == bytes(flen - size)     # zeros past the data, nothing else
    for i in range(1, 20):
        lg.append(big_batch(i * 1000))
    expect = [(r.offset, r.key, r.value) for r in lg.read(0, max_records=20_000, max_bytes=1 << 30)]
    appended = [(i * 1000 + j, k, v) for i in range(20) for j, (k, v, _t) in enumerate(big_batch(i * 1000))]
    assert expect == appended
    size = lg.active_segment.size
    lg.close()
    assert os.path.getsize(path) == size                     # the runway cut at close
    with kstore.Log.open(part) as again:
        assert [(r.offset, r.key, r.value) for r in again] == expect
        assert not again.recovery_report          # a clean close: nothing recovered


class Recording(FileOps):
    """Records every write-side call with the thread that made it."""

    def __init__(self):
        self.calls: list = []
        self.lock = threading.Lock()
        self.fail: dict = {}          # op -> (errno, only from this thread name or None)

    def _rec(self, op, *args):
        name = threading.current_thread().name
        with self.lock:
            self.calls.append((op, name) + args)
            f = self.fail.get(op)
        if f is not None and (f[1] is None or f[1] == name):
            raise OSError(f[0], os.strerror(f[0]))

    def pwrite(self, fd, data, offset):
        self._rec("pwrite", offset, len(memoryview(data)))
        return super().pwrite(fd, data, offset)

    size_now = None      # the test's view of the data end (the active segment's size)

    def zero_fill(self, fd, offset, length):
        if not os.readlink(f"/proc/self/fd/{fd}").endswith("index"):   # not an index's blocks
            self._rec("zero_fill", offset, length, self.size_now() if self.size_now else -1)
        return super().zero_fill(fd, offset, length)

    def allocate(self, fd, offset, length):
        self._rec("allocate", offset, length)
        return super().allocate(fd, offset, length)

    def populate(self, mapping, start, end):
        self._rec("populate", start, end)
        return super().populate(mapping, start, end)


def test_pretoucher_writes_only_past_the_data_and_the_writer_copies_there(tmp_path, pretoucher, watchdog):
    watchdog(60)
    ops = Recording()
    lg = kstore.Log.open(str(tmp_path / "t-0"), time=MockTime(NOW), io=ops)
    lg.append(big_batch(0))
    assert wait_until(lambda: pretoucher.filled >= 2 << 20)
    ops.size_now = lambda: lg.active_segment.size
    with ops.lock:
        ops.calls.clear()
    for i in range(1, 60):           # ~7.5 MB: past the first 4 MiB window
        lg.append(big_batch(i * 1000))
    lg.close()
    mine = threading.current_thread().name
    fills = [c for c in ops.calls if c[0] == "zero_fill"]
    assert fills and all(c[1] == "kstore-pretouch" for c in fills)
    # a zero-fill starts at or past the data end of its moment, and none overlaps another
    assert all(off >= size for _op, _t, off, _n, size in fills)
    spans = sorted((off, off + n) for _op, _t, off, n, _size in fills)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    # the appends into the pre-faulted runway are copies into the mapping, not pwrites (the
    # ones the pretoucher was not ready for are pwritten: how many depends on the machine)
    writer_pwrites = [c for c in ops.calls if c[0] == "pwrite" and c[1] == mine]
    assert len(writer_pwrites) < 59
    with kstore.Log.open(str(tmp_path / "t-0")) as again:
        assert again.log_end_offset == 60_000
        assert [r.value for r in again.read(59_000, max_records=1000)] == [v for _k, v, _t in big_batch(59_000)]


def test_a_full_disk_in_the_pretoucher_leaves_the_writer_path(tmp_path, pretoucher, watchdog):
    """ENOSPC (or EIO) in the pretoucher's zero-fill: nothing published, the appends go on
    through the writer's own growth; once that fails too, the append raises KafkaStorageError
    and every acknowledged record reads back after a reopen."""
    watchdog(60)
    ops = Recording()
    ops.fail["zero_fill"] = (errno.ENOSPC, "kstore-pretouch")
    ops.fail["populate"] = (errno.EIO, "kstore-pretouch")
    part = str(tmp_path / "t-0")
    lg = kstore.Log.open(part, time=MockTime(NOW), io=ops)
    for i in range(10):
        lg.append(big_batch(i * 1000))
        time.sleep(0.002)
    assert any(c[0] == "zero_fill" and c[1] == "kstore-pretouch" for c in ops.calls)
    assert pretoucher.filled == 0
    assert lg.log_end_offset == 10_000
    ops.fail["allocate"] = (errno.ENOSPC, None)       # now the disk is full for everyone
    ops.fail["pwrite"] = (errno.ENOSPC, None)
    with pytest.raises(KafkaStorageError):
        for i in range(10, 200):
            lg.append(big_batch(i * 1000))
    acked = lg.log_end_offset
    lg.close_handlers()
    with kstore.Log.open(part) as again:
        assert again.log_end_offset == acked
        assert [r.offset for r in again] == list(range(acked))


def test_the_crash_harness_fileops_is_served_in_the_callers_thread(tmp_path, pretoucher):
    class Unsafe(Recording):
        thread_safe = False
    ops = Unsafe()
    lg = kstore.Log.open(str(tmp_path / "t-0"), time=MockTime(NOW), io=ops)
    for i in range(4):
        lg.append(big_batch(i * 1000))
    lg.close()
    fills = [c for c in ops.calls if c[0] in ("zero_fill", "populate")]
    assert fills and all(c[1] == threading.current_thread().name for c in fills)
    assert pretoucher.filled >= 2 << 20


def test_enable_disable(watchdog):
    watchdog(30)
    a = pretouch.enable()
    try:
        assert pretouch.ACTIVE is a and pretouch.enable() is a
        b = pretouch.enable(ahead=16 << 20)
        assert b is not a and b.ahead == 16 << 20 and pretouch.ACTIVE is b
        with pytest.raises(ValueError):
            pretouch.Pretoucher(ahead=pretouch.CHUNK)
    finally:
        pretouch.disable()
    assert pretouch.ACTIVE is None
