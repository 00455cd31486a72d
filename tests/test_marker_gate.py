"""kstore.marker_gate: the FileOps in front of a writable log while the clean-shutdown marker's
removal is made durable (the crash states are in tests/reliability/test_crash_marker.py)."""
import os

import kstore
from kstore.fileio import FileOps
from kstore.marker_gate import MarkerGate


def test_every_fileops_method_reaches_the_wrapped_fileops():
    """A FileOps method MarkerGate does not override would run FileOps' own default instead of
    the wrapped one's (a test's fault injection, a harness's model): none may be left."""
    public = {n for n, v in vars(FileOps).items() if callable(v) and not n.startswith("_")}
    assert public <= set(vars(MarkerGate))


class _Counting(FileOps):
    def __init__(self):
        super().__init__()
        self.asked = 0

    def memory_backed(self, fd):
        self.asked += 1
        return True


def test_a_method_added_to_fileops_is_delegated(tmp_path):
    """memory_backed (added with the pwrite append path) is the wrapped FileOps' answer."""
    ops = _Counting()
    d = str(tmp_path / "t-0")
    with kstore.Log.open(d, io=ops) as log:
        log.append([(b"k", b"v" * 100, 1_700_000_000_000 + i) for i in range(1000)])
    assert ops.asked == 1
    assert os.path.getsize(os.path.join(d, "00000000000000000000.log")) > 0
