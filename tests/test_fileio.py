"""The I/O layer: every file operation of a workload goes through FileOps, so tests can record
operations and inject errors; durability steps happen in the right order."""
import errno
import os

import pytest

import kstore
from kstore.fileio import FileOps


class RecordingOps(FileOps):
    def __init__(self, fail=None):
        self.ops = []
        self.fail = fail or {}

    def _rec(self, name, *args):
        self.ops.append((name,) + args)
        if name in self.fail and self.fail[name] > 0:
            self.fail[name] -= 1
            if self.fail[name] == 0:
                raise OSError(errno.ENOSPC, "No space left on device (injected)")

    def open(self, path, flags, mode=0o644):
        self._rec("open", os.path.basename(path))
        return super().open(path, flags, mode)

    def pwrite(self, fd, data, offset):
        self._rec("pwrite", len(data))
        return super().pwrite(fd, data, offset)

    def fsync(self, fd):
        self._rec("fsync")
        return super().fsync(fd)

    def fsync_dir(self, path):
        self._rec("fsync_dir", os.path.basename(path))
        return super().fsync_dir(path)

    def rename(self, src, dst):
        self._rec("rename", os.path.basename(src), os.path.basename(dst))
        return super().rename(src, dst)

    def unlink(self, path):
        self._rec("unlink", os.path.basename(path))
        return super().unlink(path)

    def truncate(self, fd, length):
        self._rec("truncate", length)
        return super().truncate(fd, length)

    def zero_fill(self, fd, offset, length):
        self._rec("zero_fill", offset, length)
        return super().zero_fill(fd, offset, length)

    def map_flush(self, mapping, start=0, end=-1):
        self._rec("map_flush")
        return super().map_flush(mapping, start, end)


class InterceptingOps(RecordingOps):
    intercept_map_writes = True

    def map_write(self, mapping, position, data):
        self._rec("map_write", position, len(data))
        return super().map_write(mapping, position, data)


def test_flush_fsyncs_data_then_directory_for_new_segments(tmp_path):
    ops = RecordingOps()
    log = kstore.Log.open(str(tmp_path / "t-0"), {"segment.bytes": 300}, io=ops)
    for i in range(5):
        log.append([(None, b"x" * 100)])
    ops.ops.clear()
    log.flush()
    names = [o[0] for o in ops.ops]
    assert "fsync" in names and "map_flush" in names
    # the directory is fsynced after the data of a segment created since the last flush
    assert names.index("fsync_dir") > max(i for i, n in enumerate(names) if n == "fsync")
    log.close()


def test_map_writes_can_be_intercepted(tmp_path):
    ops = InterceptingOps()
    log = kstore.Log.open(str(tmp_path / "t-0"), io=ops)
    info = log.append([(b"k", b"v")])
    writes = [o for o in ops.ops if o[0] == "map_write"]
    assert writes == [("map_write", 0, 70)]      # 61-byte header + a 9-byte record
    assert log.read(0)[0].value == b"v"
    log.close()


def test_enospc_on_preallocation_fails_append_cleanly(tmp_path):
    ops = RecordingOps()
    d = str(tmp_path / "t-0")
    log = kstore.Log.open(d, {"max.message.bytes": 10 << 20}, io=ops)
    log.append([(None, b"first")])
    ops.fail = {"zero_fill": 1}
    big = [(None, os.urandom(200_000))] * 30     # forces the runway to grow
    with pytest.raises(OSError) as ei:
        log.append(big)
    assert ei.value.errno == errno.ENOSPC and isinstance(ei.value, kstore.KStoreError)
    assert d in str(ei.value)
    assert log.log_end_offset == 1
    assert [r.value for r in log.read(0)] == [b"first"]      # acknowledged records stay readable
    with pytest.raises(kstore.KafkaStorageError, match="reopen it"):
        log.append([(None, b"refused")])         # Kafka: an I/O error fails the log until reopened
    log.close()
    with kstore.Log.open(d) as log:              # space back: reopened, appends work again
        log.append([(None, b"after the disk was freed")])
    with kstore.Log.open(d) as log:
        assert [r.value for r in log.read(0)] == [b"first", b"after the disk was freed"]


def test_checkpoint_style_atomic_write(tmp_path):
    ops = RecordingOps()
    path = str(tmp_path / "checkpoint")
    ops.write_atomic(path, b"0\n0\n")
    names = [o[0] for o in ops.ops]
    assert names == ["open", "pwrite", "fsync", "rename", "fsync_dir"]
    assert open(path, "rb").read() == b"0\n0\n"
    assert not os.path.exists(path + ".tmp")


def test_default_ops_can_be_swapped(tmp_path):
    ops = RecordingOps()
    prev = kstore.set_file_ops(ops)
    try:
        with kstore.Log.open(str(tmp_path / "t-0")) as log:
            log.append([(None, b"x")])
        assert any(o[0] == "fsync" for o in ops.ops)
    finally:
        kstore.set_file_ops(prev)


def test_concurrent_atomic_writes_of_one_file_never_collide(tmp_path, watchdog):
    """Two writers of one file shared `<path>.tmp`: one renamed the other's temp file away and its
    own os.replace failed with ENOENT (issue 12, defect 12). Each write now has its own temp name,
    still ending in .tmp (which loading removes)."""
    import threading
    from thread_watchdog import join_all
    watchdog(60)
    path = str(tmp_path / "cleaner-offset-checkpoint")
    errors, names = [], set()

    class Ops(FileOps):
        def open(self, p, flags, mode=0o644):
            names.add(os.path.basename(p))
            return super().open(p, flags, mode)
    ops = Ops()

    def writer(n):
        try:
            for i in range(300):
                ops.write_atomic(path, b"%d %d\n" % (n, i))
        except OSError as e:
            errors.append(e)
    threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    join_all(threads, 60)
    assert errors == []
    assert open(path, "rb").read() in {b"%d 299\n" % n for n in range(3)}
    assert os.listdir(tmp_path) == ["cleaner-offset-checkpoint"]
    assert len(names) == 900 and all(n.startswith("cleaner-offset-checkpoint.") and n.endswith(".tmp")
                                     for n in names)
