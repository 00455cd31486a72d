"""ENOSPC, EIO and EROFS injected at every file operation of a workload (facts: crash-and-fault-
testing §4): the log dir goes offline, appends fail with a clear kstore error (never a raw
OSError, never SIGBUS), acknowledged records stay readable beside the failed store, and
reopening once the fault is gone recovers a valid prefix holding every acknowledged record.
Also: a fork()ed child does not release the directory lock (flock semantics)."""
import errno
import os

import pytest

import kstore
from kstore.clock import MockTime
from kstore.errors import KStoreError
from kstore.scheduler import MockScheduler

from crash_harness import NoSyncOps

NOW = 1_700_000_000_000
CFG = {"log.segment.bytes": 600, "log.index.size.max.bytes": 4096, "log.index.interval.bytes": 100,
       "log.cleaner.enable": False, "file.delete.delay.ms": 0, "log.segment.delete.delay.ms": 0}
WRITE_OPS = ("open", "pwrite", "fsync", "truncate", "allocate", "zero_fill", "rename", "unlink",
             "mkdir", "fsync_dir", "map_flush", "rmdir")
COUNTS = {"faults_injected": 0, "records_lost": 0}


class FaultOps(NoSyncOps):
    """Counts write-side operations; from operation `at` on, every one fails with `err` (a full
    or failed disk stays that way). No power is lost here, so no real fsync is needed (NoSyncOps)."""

    def __init__(self, at=None, err=errno.ENOSPC):
        self.at, self.err, self.n, self.fired = at, err, 0, False

    def _op(self, name, flags=None):
        if name == "open" and flags is not None and not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            return                       # reads keep working: the disk is full, not gone
        self.n += 1
        if self.at is not None and self.n > self.at:
            self.fired = True
            raise OSError(self.err, f"{os.strerror(self.err)} (injected at operation {self.at})")


for _name in WRITE_OPS:
    def _wrap(name=_name):
        base = getattr(NoSyncOps, name)

        def op(self, *a, **kw):
            self._op(name, a[1] if name == "open" and len(a) > 1 else None)
            return base(self, *a, **kw)
        op.__name__ = name
        return op
    setattr(FaultOps, _name, _wrap())


def value(o):
    return b"value-%05d" % o + b"-" * 30


def workload(root, ops, acked):
    """Topics, appends, flushes, rolls, checkpoints, retention; records acknowledged appends."""
    t = MockTime(NOW)
    m = kstore.LogManager(root, CFG, io=ops, time=t, scheduler=MockScheduler(t))
    try:
        if "t" not in m.topics():
            m.create_topic("t", 1, {"retention.bytes": 2000})
        lg = m.log("t", 0)
        for i in range(40):
            o = lg.log_end_offset
            m.append_batch("t", 0, [(None, value(o), NOW + o)])
            acked.append(o)
            if i % 8 == 7:
                lg.flush()
                m.checkpoint_recovery_offsets()
        m.cleanup_logs()
        m.checkpoint_log_start_offsets()
    except BaseException:
        try:
            m.close()
        except KStoreError:
            pass
        raise
    m.close()                 # a fault here must be reported too


def test_faults_at_every_operation(tmp_path):
    dry = FaultOps()
    workload(str(tmp_path / "dry"), dry, [])
    total = dry.n
    assert total > 100
    for err in (errno.ENOSPC, errno.EIO, errno.EROFS):
        for at in range(total):
            root = str(tmp_path / f"{errno.errorcode[err]}-{at}")
            ops = FaultOps(at, err)
            acked = []
            with pytest.raises(KStoreError) as e:          # a kstore error, never a raw OSError
                workload(root, ops, acked)
            assert ops.fired
            assert os.strerror(err) in str(e.value) or "offline" in str(e.value), str(e.value)
            COUNTS["faults_injected"] += 1
            # acknowledged records are readable beside the failed store, then after a reopen
            if os.path.isdir(os.path.join(root, "t-0")):
                with kstore.StoreReader(root) as r:
                    lg = r.log("t", 0)
                    seen = [x.offset for x in lg]
                    lost = [o for o in acked if o >= lg.log_start_offset and o not in seen]
                with kstore.LogManager(root, CFG, io=NoSyncOps()) as m:
                    lg = m.log("t", 0)
                    recs = [(x.offset, x.value) for x in lg]
                    start = lg.log_start_offset
                    assert recs == [(o, value(o)) for o in range(start, start + len(recs))]
                    lost += [o for o in acked if o >= start and o >= start + len(recs)]
                    n = lg.log_end_offset
                    m.append_batch("t", 0, [(None, value(n), NOW)])     # and it takes appends again
                COUNTS["records_lost"] += len(lost)
                assert not lost, f"{errno.errorcode[err]} at op {at}: acknowledged {lost} lost"
            else:
                assert not acked


def test_forked_child_does_not_release_the_lock(tmp_path):
    m = kstore.LogManager(str(tmp_path), {"log.cleaner.enable": False})
    pid = os.fork()
    if pid == 0:                                   # the child closes every fd it inherited
        os.closerange(3, 4096)
        os._exit(0)
    os.waitpid(pid, 0)
    with pytest.raises(kstore.LogDirLockedError):
        kstore.LogManager(str(tmp_path))
    m.close()
    kstore.LogManager(str(tmp_path)).close()


@pytest.fixture(scope="module", autouse=True)
def _file_counts(reliability_counts):
    yield
    reliability_counts["faults"] = dict(COUNTS)
