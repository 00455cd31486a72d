"""FileOps under concurrent writers of one file (moved from test_fileio.py: a race, reliability tier)."""
import os

from kstore.fileio import FileOps


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
