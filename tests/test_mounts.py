"""kstore.mounts: mount tables parsed from /proc lines, the longest mount prefix, and the one
rule on which filesystems the store's flock keeps out other nodes' writers."""
import os

from kstore import mounts
from kstore.fileio import FileOps
from kstore.mounts import Mount


def test_parse_mountinfo_joins_mount_and_superblock_options_and_unescapes():
    text = ("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw,errors=remount-ro\n"
            "41 22 0:52 /e /mnt/my\\040share rw,nosuid shared:7 master:2 - nfs srv:/e "
            "rw,vers=3,nolock,local_lock=all\n"
            "42 22 0:53 / /x rw - tmpfs none\n"     # no superblock options: still read
            "garbage line\n")
    assert mounts.parse_mountinfo(text) == [
        Mount("/", "ext4", frozenset({"rw", "relatime", "errors=remount-ro"})),
        Mount("/mnt/my share", "nfs", frozenset({"rw", "nosuid", "vers=3", "nolock",
                                                  "local_lock=all"})),
        Mount("/x", "tmpfs", frozenset({"rw"}))]


def test_parse_mounts_lines():
    assert mounts.parse_mounts("srv:/x /a\\011b nfs4 rw,vers=4.2 0 0\nshort\n") == [
        Mount("/a\tb", "nfs4", frozenset({"rw", "vers=4.2"}))]


class _Tables(FileOps):
    def __init__(self, mountinfo=None, mounts_=None):
        super().__init__()
        self.files = {"/proc/self/mountinfo": mountinfo, "/proc/self/mounts": mounts_}

    def read_file(self, path):
        if path in self.files:
            if self.files[path] is None:
                raise FileNotFoundError(path)
            return self.files[path].encode()
        return super().read_file(path)


def test_longest_prefix_wins_and_falls_back_to_mounts(tmp_path):
    a = str(tmp_path)
    info = (f"1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
            f"2 1 0:5 / {a} rw - nfs srv:/a rw,vers=3,local_lock=all\n"
            f"3 2 0:6 / {a}/v4 rw - nfs4 srv:/b rw,vers=4.1\n"
            f"4 1 0:7 / {a}v4 rw - nfs srv:/c rw,nolock\n")      # a sibling, not a prefix
    io = _Tables(mountinfo=info)
    assert mounts.mount_of(os.path.join(a, "v4", "s"), io).point == a + "/v4"
    assert mounts.mount_of(os.path.join(a, "v4x"), io).point == a
    assert mounts.unsafe_lock_reason(os.path.join(a, "s"), io) == (
        f"it is on an NFS mount ({a}) whose locks are local to this client (local_lock=all)")
    assert mounts.unsafe_lock_reason(os.path.join(a, "v4", "s"), io) is None
    fallback = _Tables(mounts_=f"srv:/a {a} nfs rw,vers=3,local_lock=flock 0 0\n")
    assert mounts.unsafe_lock_reason(a, fallback) == (
        f"it is on an NFS mount ({a}) whose locks are local to this client (local_lock=flock)")
    assert mounts.mount_of(a, _Tables()) == mounts.NO_MOUNT
    assert mounts.unsafe_lock_reason(a, _Tables()) is None


def test_this_machines_real_mounts_are_read(tmp_path):
    m = mounts.mount_of(str(tmp_path))
    assert m.point and m.fstype and str(tmp_path).startswith(m.point)
