"""kstore.log_dir_loader: the start-up planning of one log dir (which partitions have megabytes
to recover and load on recovery threads)."""
import os

from kstore.fileio import FileOps
from kstore.log_dir_loader import bytes_to_recover


class Recording(FileOps):
    """Records the file operations bytes_to_recover makes."""

    def __init__(self):
        self.calls = []

    def listdir(self, path):
        self.calls.append(("listdir", path))
        return super().listdir(path)

    def stat_path(self, path, follow_symlinks=False):
        self.calls.append(("stat_path", os.path.basename(path), follow_symlinks))
        return super().stat_path(path, follow_symlinks)


def _segments(d, sizes):
    d.mkdir()
    for base, size in sizes.items():
        (d / f"{base:020d}.log").write_bytes(b"\0" * size)
        (d / f"{base:020d}.index").write_bytes(b"")


def test_counts_the_logs_from_the_recovery_points_segment_through_fileops(tmp_path):
    d = tmp_path / "t-0"
    _segments(d, {0: 1000, 100: 2000, 200: 3000})
    (d / "junk.log").write_bytes(b"x" * 50)
    io = Recording()
    # recovery point 150 lies in the segment at 100: it and the one above are recovered
    assert bytes_to_recover(io, str(d), 150) == 5000
    assert io.calls == [("listdir", str(d)),
                        ("stat_path", f"{100:020d}.log", False),
                        ("stat_path", f"{200:020d}.log", False)]
    assert bytes_to_recover(io, str(d), 0) == 6000
    assert bytes_to_recover(io, str(d), 10 ** 9) == 3000
    # `enough`: counting stops at the first segment that reaches it
    io.calls.clear()
    assert bytes_to_recover(io, str(d), 0, enough=2500) == 3000
    assert [c[1] for c in io.calls[1:]] == [f"{0:020d}.log", f"{100:020d}.log"]


def test_a_symlinked_log_is_not_followed_and_a_missing_dir_counts_nothing(tmp_path):
    d = tmp_path / "t-0"
    _segments(d, {0: 1000})
    big = tmp_path / "elsewhere.bin"
    big.write_bytes(b"\0" * 100_000)
    os.symlink(big, d / f"{500:020d}.log")
    assert bytes_to_recover(FileOps(), str(d), 0) == 1000
    assert bytes_to_recover(FileOps(), str(tmp_path / "gone"), 0) == 0
    f = tmp_path / "file"
    f.write_bytes(b"")
    assert bytes_to_recover(FileOps(), str(f), 0) == 0
