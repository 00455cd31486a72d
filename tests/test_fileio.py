"""The I/O layer: every file operation of a workload goes through FileOps, so tests can record
operations and inject errors; durability steps happen in the right order."""
import errno
import os
import stat
import sys

import pytest

import kstore
from kstore.fileio import FileOps

NOW_MS = 1_700_000_000_000


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
    for _i in range(5):
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
    log.append([(b"k", b"v")])
    writes = [o for o in ops.ops if o[0] == "map_write"]
    assert writes == [("map_write", 0, 70)]      # 61-byte header + a 9-byte record
    assert log.read(0)[0].value == b"v"
    log.close()


class TornWriteOps(RecordingOps):
    """pwrite fails with ENOSPC or EIO after writing the first half (a short write, then the error)."""
    def __init__(self):
        super().__init__()
        self.fail_errno = None

    def pwrite(self, fd, data, offset):
        if self.fail_errno is not None:
            e, self.fail_errno = self.fail_errno, None
            view = memoryview(data)
            os.pwrite(fd, view[:len(view) // 2], offset)
            raise OSError(e, os.strerror(e) + " (injected)")
        return super().pwrite(fd, data, offset)


class ZeroFillFails(TornWriteOps):
    """zero_fill of the file whose name ends in `suffix` fails with ENOSPC once armed."""
    def __init__(self, suffix):
        super().__init__()
        self.suffix = suffix
        self.armed = False

    def zero_fill(self, fd, offset, length):
        if self.armed and os.readlink(f"/proc/self/fd/{fd}").endswith(self.suffix):
            self.armed = False
            self._rec("zero_fill-failed", offset, length)
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return super().zero_fill(fd, offset, length)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
@pytest.mark.parametrize("where", ["runway", "pwrite-enospc", "pwrite-eio"])
def test_enospc_on_preallocation_fails_append_cleanly(tmp_path, where):
    """A small append grows the zero-filled runway (zero_fill of the .log: the indexes'
    blocks are zero-filled too); a large one is pwritten (torn here: half written, then the
    error). Either failure fails the append and the log (until reopened), leaves the
    acknowledged records readable, and the reopen cuts the torn bytes."""
    ops = ZeroFillFails(".log")
    d = str(tmp_path / "t-0")
    log = kstore.Log.open(d, {"max.message.bytes": 10 << 20}, io=ops)
    log.append([(None, b"first")])
    small = [(None, os.urandom(4000))] * 3        # under PWRITE_MIN_BYTES: copied into the mapping
    if where == "runway":
        ops.armed = True
        err = errno.ENOSPC
        with pytest.raises(OSError) as ei:
            for _ in range(20):                  # the first runway (64 KiB) fills up
                log.append(small)
        acked = log.log_end_offset
        assert not ops.armed and [o[0] for o in ops.ops].count("zero_fill-failed") == 1
    else:
        log.append(small)
        acked = log.log_end_offset
        err = errno.ENOSPC if where == "pwrite-enospc" else errno.EIO
        ops.fail_errno = err
        big = [(None, os.urandom(200_000))] * 30  # a 6 MB batch: pwritten
        with pytest.raises(OSError) as ei:
            log.append(big)
        assert ("pwrite", 6_000_000 + 61 + 30 * 7) not in ops.ops   # failed before the recording
    assert ei.value.errno == err and isinstance(ei.value, kstore.KafkaStorageError)
    assert d in str(ei.value)
    assert log.log_end_offset == acked
    recs = log.read(0, max_bytes=1 << 30)
    assert [r.offset for r in recs] == list(range(acked))      # acknowledged records stay readable
    assert recs[0].value == b"first" and all(r.value == small[0][1] for r in recs[1:])
    with pytest.raises(kstore.KafkaStorageError, match="reopen it"):
        log.append([(None, b"refused")])         # Kafka: an I/O error fails the log until reopened
    log.close()
    with kstore.Log.open(d) as log:              # space back: reopened, appends work again
        assert log.log_end_offset == acked       # the torn batch was cut
        log.append([(None, b"after the disk was freed")])
    with kstore.Log.open(d) as log:
        vals = [r.value for r in log.read(0, max_bytes=1 << 30)]
        assert vals[0] == b"first" and vals[-1] == b"after the disk was freed" and len(vals) == acked + 1


def test_large_appends_are_pwritten_small_ones_copied(tmp_path):
    """The write path by size: a batch of PWRITE_MIN_BYTES or more is one pwrite of exactly its
    bytes at the log end (no runway grown for it); a smaller one is a copy into the mapping
    (seen by an intercepting FileOps as map_write)."""
    from kstore.segment import PWRITE_MIN_BYTES
    ops = InterceptingOps()
    d = str(tmp_path / "t-0")
    log = kstore.Log.open(d, io=ops)
    ops.ops.clear()
    log.append([(b"k", b"v", NOW_MS)])
    # the first runway (64 KiB of written zeros), then the copy
    assert [o for o in ops.ops if o[0] in ("map_write", "zero_fill")] == [("zero_fill", 0, 65536),
                                                                            ("map_write", 0, 70)]
    ops.ops.clear()
    recs = [(b"k%015d" % i, b"v" * 100, NOW_MS + i) for i in range(1000)]
    log.append(recs)
    size = log.active_segment.size - 70
    assert size >= PWRITE_MIN_BYTES
    assert [o for o in ops.ops if o[0] in ("map_write", "pwrite", "zero_fill")] == [("pwrite", size)]
    with open(os.path.join(d, "00000000000000000000.log"), "rb") as f:
        on_disk = f.read()
    assert len(on_disk) >= 70 + size
    assert on_disk[70 + size:] == bytes(len(on_disk) - 70 - size)    # only runway zeros after it
    assert [(r.key, r.value, r.timestamp) for r in log.read(1, max_records=1000)] == recs
    log.close()


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


# -- hostile files: refused, never followed, never waited on (issue 12, defect 17) ---------------
def _store_with_data(path):
    with kstore.Log.open(str(path)) as lg:
        for i in range(5):
            lg.append([(b"k", b"v%d" % i)])


@pytest.mark.parametrize("read_only", [False, True])
def test_fifo_named_like_a_segment_is_refused_without_blocking(tmp_path, watchdog, read_only):
    from kstore.errors import UnusableFileError
    watchdog(30)
    part = tmp_path / "t-0"
    part.mkdir()
    fifo = part / "00000000000000000000.log"
    os.mkfifo(fifo)
    with pytest.raises(UnusableFileError) as ei:
        kstore.Log.open(str(part), read_only=read_only)
    assert ei.value.path == str(fifo)
    assert str(ei.value) == f"refusing {fifo}: a FIFO, not a regular file"
    assert not isinstance(ei.value, OSError)          # not an I/O error: no dir goes offline
    assert os.path.exists(fifo) and sorted(os.listdir(part)) == ["00000000000000000000.log"]


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("suffix", [".log", ".index"])
def test_symlinked_segment_file_is_refused_and_its_target_untouched(tmp_path, watchdog, read_only, suffix):
    from kstore.errors import UnusableFileError
    watchdog(30)
    part = tmp_path / "t-0"
    _store_with_data(part)
    seg = part / ("00000000000000000000" + suffix)
    outside = tmp_path / ("outside" + suffix)
    os.rename(seg, outside)
    os.symlink(outside, seg)
    before = (outside.read_bytes(), os.stat(outside).st_mtime_ns)
    with pytest.raises(UnusableFileError) as ei:
        with kstore.Log.open(str(part), read_only=read_only) as lg:
            lg.read(0)                         # a read-only log opens its index on first read
            lg.append([(b"k", b"after")])
    assert ei.value.path == str(seg)
    assert str(ei.value) == f"refusing {seg}: a symbolic link, not a regular file"
    assert (outside.read_bytes(), os.stat(outside).st_mtime_ns) == before
    assert os.path.islink(seg)


def test_open_refuses_special_files_and_creates_none_through_a_dangling_link(tmp_path):
    from kstore.errors import UnusableFileError
    ops = FileOps()
    d = tmp_path / "d"
    d.mkdir()
    with pytest.raises(UnusableFileError, match="a directory, not a regular file"):
        ops.open(str(d), os.O_RDONLY)
    with pytest.raises(UnusableFileError, match="a directory, not a regular file"):
        ops.open(str(d), os.O_RDWR)
    link = tmp_path / "link"
    os.symlink(tmp_path / "nowhere", link)
    with pytest.raises(UnusableFileError, match="a symbolic link"):
        ops.open(str(link), os.O_RDWR | os.O_CREAT)
    assert not os.path.exists(tmp_path / "nowhere")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UnusableFileError, match="a FIFO"):
        ops.open(str(fifo), os.O_WRONLY)       # no reader: ENXIO under O_NONBLOCK, refused
    with pytest.raises(UnusableFileError, match="a symbolic link, not a directory"):
        os.symlink(d, tmp_path / "dlink")
        ops.check_dir(str(tmp_path / "dlink"))
    fd = ops.open(str(tmp_path / "plain"), os.O_RDWR | os.O_CREAT)
    ops.close(fd)


def test_hostile_checkpoint_and_config_files_are_refused_not_fatal(tmp_path, watchdog):
    """A FIFO as a checkpoint or the topic config: treated as unreadable (a warning), never read
    from; a read-only store opens. A writable one refuses the topic config that way (its
    overrides would be lost: test_topics.py) and leaves it alone; once it is removed, the store
    opens and the checkpoint's FIFO is replaced by the next atomic write."""
    from kstore.errors import UnusableFileError
    watchdog(30)
    with kstore.LogManager(str(tmp_path)) as m:
        m.create_topic("t", 1)
        m.append("t", None, b"v")
    for name in ("recovery-point-offset-checkpoint", "kstore-topic-config.json"):
        os.unlink(tmp_path / name)
        os.mkfifo(tmp_path / name)
    with kstore.LogManager(str(tmp_path), read_only=True) as ro:
        assert ro.topics() == ["t"] and ro.offline_dirs == {}
    with pytest.raises(UnusableFileError, match="a FIFO, not a regular file") as ei:
        kstore.LogManager(str(tmp_path))
    assert ei.value.path == str(tmp_path / "kstore-topic-config.json")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "kstore-topic-config.json").st_mode)
    os.unlink(tmp_path / "kstore-topic-config.json")
    with kstore.LogManager(str(tmp_path)) as m:
        assert m.topics() == ["t"] and m.offline_dirs == {}
        assert any("malformed checkpoint: refusing" in e for e in m.checkpoint_errors)
        assert [r.value for r in m.read("t", 0, 0)] == [b"v"]
    assert os.path.isfile(tmp_path / "recovery-point-offset-checkpoint")


@pytest.mark.parametrize("name", ["00000000000000000009.index", "00000000000000000000.log.deleted"])
def test_hostile_file_is_never_deleted_as_kstore_own(tmp_path, name):
    """An orphaned index or a leftover .deleted is removed at open; a symlink or FIFO with such
    a name is refused instead (the open fails naming it), and nothing it points at is touched."""
    from kstore.errors import UnusableFileError
    part = tmp_path / "t-0"
    _store_with_data(part)
    target = tmp_path / "precious"
    target.write_bytes(b"keep me")
    os.symlink(target, part / name)
    with pytest.raises(UnusableFileError) as ei:
        kstore.Log.open(str(part))
    assert str(ei.value) == f"refusing {part / name}: a symbolic link, not a regular file"
    assert os.path.islink(part / name) and target.read_bytes() == b"keep me"


@pytest.mark.parametrize("kind", ["dangling symlink", "directory", "FIFO"])
def test_a_hostile_lock_file_is_refused_and_nothing_created_outside(tmp_path, watchdog, kind):
    """The `.lock` of a log dir (taken by a LogManager, and shared by a standalone writable Log
    of one of its partitions) was opened following symlinks: a dangling link made kstore create
    its target outside the log dir; a directory there failed as an I/O error (KafkaStorageError,
    or the dir offline). Now UnusableFileError naming the .lock, and nothing is created."""
    from kstore.errors import UnusableFileError
    watchdog(30)
    logs, outside = tmp_path / "logs", tmp_path / "outside"
    logs.mkdir()
    outside.mkdir()
    lock = logs / ".lock"
    if kind == "dangling symlink":
        os.symlink(outside / "victim", lock)
    elif kind == "directory":
        lock.mkdir()
    else:
        os.mkfifo(lock)
    what = {"dangling symlink": "symbolic link", "directory": "directory", "FIFO": "FIFO"}[kind]
    with pytest.raises(UnusableFileError, match=f"{lock}.*a {what}, not a regular file"):
        kstore.Log.open(str(logs / "t-0"))
    with pytest.raises(UnusableFileError, match=f"{lock}.*a {what}, not a regular file"):
        FileOps().try_lock(str(lock))
    assert os.listdir(outside) == []


class AllocOps(InterceptingOps):
    def __init__(self, memory):
        super().__init__()
        self.memory = memory

    def allocate(self, fd, offset, length):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):     # not the indexes' blocks
            self._rec("allocate", offset, length)
        return super().allocate(fd, offset, length)

    def memory_backed(self, fd):
        return self.memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/fd")
@pytest.mark.parametrize("memory", [False, True])
def test_large_appends_grow_the_runway_by_fallocate_except_in_memory(tmp_path, memory):
    """Ahead of a pwrite the runway is fallocated (a disk file system reserves blocks only);
    on tmpfs/ramfs the pwrite grows the file itself (fallocate would zero pages it then fills)."""
    ops = AllocOps(memory)
    d = str(tmp_path / "t-0")
    log = kstore.Log.open(d, io=ops)
    recs = [(b"k%015d" % i, b"v" * 100, NOW_MS + i) for i in range(1000)]
    log.append(recs)
    size = log.active_segment.size
    allocs = [o for o in ops.ops if o[0] == "allocate"]
    path = os.path.join(d, "00000000000000000000.log")
    if memory:
        assert allocs == [] and os.path.getsize(path) == size
    else:
        assert allocs == [("allocate", 0, size)]        # the first runway: the batch itself
        for _ in range(3):                               # then doubling: 1, 2, 4 batches ahead
            log.append(recs)
        allocs = [o for o in ops.ops if o[0] == "allocate"]
        assert allocs == [("allocate", 0, size), ("allocate", size, size),
                          ("allocate", 2 * size, 2 * size)]
        assert os.path.getsize(path) == 4 * size        # no zeros left over: exact runways
    got = log.read(0, max_bytes=1 << 30)
    assert [(r.key, r.value, r.timestamp) for r in got[:1000]] == recs
    log.close()
    assert os.path.getsize(path) == (size if memory else 4 * size)    # trimmed at close


def test_memory_backed_tells_tmpfs(tmp_path):
    if not os.path.isdir("/dev/shm") or not sys.platform.startswith("linux"):
        pytest.skip("no /dev/shm")
    fd = os.open("/dev/shm", os.O_RDONLY)
    try:
        assert FileOps().memory_backed(fd) is True
    finally:
        os.close(fd)


# -- pread_validate: the tail refresh's read (a Kafka broker's bytes, tests/data/dump) --------
def _broker_v2() -> bytes:
    from test_dump import _hex_file
    return _hex_file("broker_v2.hex")[:218]     # three batches, offsets 0, 1-2, 3


def test_pread_validate_reads_and_validates_kafka_batches_in_one_call(tmp_path):
    data = _broker_v2()
    p = tmp_path / "00000000000000000000.log"
    p.write_bytes(data)
    fd = os.open(p, os.O_RDONLY)
    try:
        io = FileOps()
        assert io.pread_validate(fd, 218, 0, 0, -1) == (218, 218, 3, 1503229962141, 3)
        # from the second batch (position 71), the first's last offset as the previous one
        assert io.pread_validate(fd, 147, 71, 0, 0) == (147, 147, 3, 1503229962141, 3)
        # past the end of the file: what is there; a cut batch is not valid
        assert io.pread_validate(fd, 4096, 71, 0, 0) == (147, 147, 3, 1503229962141, 3)
        assert io.pread_validate(fd, 100, 71, 0, 0)[:3] == (100, 76, 2)
        # offsets that do not follow the previous batch's: nothing valid
        assert io.pread_validate(fd, 147, 71, 0, 5)[:3] == (147, 0, 5)
        assert io.pread_validate(fd, 0, 0, 0, -1) == (0, 0, -1, -1, -1)
        with pytest.raises(ValueError):
            io.pread_validate(fd, -1, 0, 0, -1)
    finally:
        os.close(fd)
    with pytest.raises(OSError) as e:
        FileOps().pread_validate(fd, 10, 0, 0, -1)            # closed: EBADF, as os.pread
    assert e.value.errno == errno.EBADF


def test_pread_validate_stops_at_a_corrupt_crc(tmp_path):
    data = bytearray(_broker_v2())
    data[147 + 61] ^= 0xFF                      # a record byte of the third batch
    p = tmp_path / "00000000000000000000.log"
    p.write_bytes(bytes(data))
    fd = os.open(p, os.O_RDONLY)
    try:
        assert FileOps().pread_validate(fd, 218, 0, 0, -1)[:3] == (218, 147, 2)
    finally:
        os.close(fd)


def test_pread_validate_goes_through_an_overridden_pread(tmp_path):
    class Torn(FileOps):
        """Injects a torn read: the last 10 bytes asked for never arrive."""
        calls = 0

        def pread(self, fd, n, offset):
            Torn.calls += 1
            return super().pread(fd, n, offset)[:-10]

    p = tmp_path / "00000000000000000000.log"
    p.write_bytes(_broker_v2())
    fd = os.open(p, os.O_RDONLY)
    try:
        assert Torn().pread_validate(fd, 218, 0, 0, -1)[:3] == (208, 147, 2)
        assert Torn.calls == 1
    finally:
        os.close(fd)
