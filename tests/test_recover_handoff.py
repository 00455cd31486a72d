"""An unclean open's last segment is made active with the descriptor and writable mapping its
recovery scanned through (LogSegment.recover(next_active=True) -> _activate): one open of its
.log, the same recovery results (sizes, cut bytes, zero runway kept, records), and no
descriptor or mapping left behind when the load fails after the scan."""
import os

import pytest

import kstore
from kstore.fileio import FileOps

from log_helpers import NOW

CFG = {"segment.bytes": 4096, "retention.ms": -1}


class CountingOps(FileOps):
    """Counts opens per .log path; fail_truncate_index makes an index's truncate fail."""

    def __init__(self, fail_index_write=False):
        self.opens: dict[str, int] = {}
        self.fail_index_write = fail_index_write

    def open(self, path, flags, mode=0o644):
        if path.endswith(".log"):
            self.opens[path] = self.opens.get(path, 0) + 1
        return super().open(path, flags, mode)

    def pwrite(self, fd, data, offset):
        if self.fail_index_write and os.readlink(f"/proc/self/fd/{fd}").endswith("index"):
            raise OSError(28, "No space left on device (injected)")
        return super().pwrite(fd, data, offset)


def _crashed(d, n=40):
    lg = kstore.Log.open(d, CFG, recovery_point=0, clean_shutdown=False)
    for i in range(n):
        lg.append([(b"k%d" % i, b"v" * 50 + b"%d" % i, NOW + i)])
    last = lg.segments[-1]
    path, size, flen = last.log_path, last.size, os.path.getsize(last.log_path)
    nsegs = len(lg.segments)
    lg.close_handlers()             # killed: the runway (zeros past size) stays on disk
    return path, size, flen, nsegs


def _fds_on(path):
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                out.append(fd)
        except OSError:
            pass
    return out


def _maps_of(path):
    with open("/proc/self/maps") as f:
        return [line for line in f if line.rstrip().endswith(path)]


def test_recovered_last_segment_is_opened_once_and_keeps_its_zero_runway(tmp_path):
    d = str(tmp_path / "t-0")
    path, size, flen, nsegs = _crashed(d)
    assert flen > size                               # a zero runway past the data
    io = CountingOps()
    lg = kstore.Log.open(d, CFG, recovery_point=0, clean_shutdown=False, io=io)
    try:
        last = lg.segments[-1]
        assert last.log_path == path and last.is_active
        assert io.opens[path] == 1                   # recovery's descriptor, handed on
        rep = lg.recovery_report[-1]
        assert (rep.valid_bytes, rep.truncated_bytes, rep.tail_zero) == (size, flen - size, True)
        assert os.path.getsize(path) == flen         # the runway is kept for the appends
        assert len(_fds_on(path)) == 1
        assert lg.log_end_offset == 40 and len(lg.segments) == nsegs
        lg.append([(b"k40", b"after", NOW + 40)])
        assert [r.offset for r in lg.read(0, 10 ** 6)] == list(range(41))
        assert lg.read(40, 1)[0].value == b"after"
        assert lg.segments[-1].size > size
    finally:
        lg.close()
    assert os.path.getsize(path) == lg.segments[-1].size    # close trims to the data
    lg = kstore.Log.open(d, CFG)
    try:
        assert [r.value for r in lg.read(39, 10)] == [b"v" * 50 + b"39", b"after"]
    finally:
        lg.close()


def test_garbage_tail_is_cut_through_the_handed_on_descriptor(tmp_path):
    d = str(tmp_path / "t-0")
    path, size, _flen, _n = _crashed(d)
    with open(path, "r+b") as f:                     # garbage, not zeros, after the data
        f.truncate(size)
        f.seek(size)
        f.write(b"\x01garbage" * 10)
    io = CountingOps()
    lg = kstore.Log.open(d, CFG, recovery_point=0, clean_shutdown=False, io=io)
    try:
        rep = lg.recovery_report[-1]
        assert (rep.valid_bytes, rep.truncated_bytes, rep.tail_zero) == (size, 80, False)
        assert os.path.getsize(path) == size and io.opens[path] == 1
        lg.append([(b"k40", b"after", NOW + 40)])
        assert [r.offset for r in lg.read(38, 10)] == [38, 39, 40]
    finally:
        lg.close()


def test_failed_load_after_the_scan_leaves_no_descriptor_or_mapping(tmp_path):
    d = str(tmp_path / "t-0")
    path, _size, _flen, _n = _crashed(d)
    # the last segment's .index is damaged: its rewrite by the recovery of the segment made
    # active next fails (a full disk) after the scan mapped the .log
    idx = path[:-len(".log")] + ".index"
    n = os.path.getsize(idx)
    assert n >= 8
    with open(idx, "r+b") as f:
        f.write(b"\xff" * 8)
    io = CountingOps(fail_index_write=True)
    with pytest.raises(OSError, match="injected"):
        kstore.Log.open(d, CFG, recovery_point=0, clean_shutdown=False, io=io)
    assert _fds_on(path) == [] and _maps_of(path) == []
    lg = kstore.Log.open(d, CFG, recovery_point=0, clean_shutdown=False)   # and it recovers
    try:
        assert lg.log_end_offset == 40
    finally:
        lg.close()
