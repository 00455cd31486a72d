"""The store identity a Spark task checks before it reads or stages (kstore/spark/deploy.py):
a missing dir, an empty dir or another store at the planned path fails naming host and path."""
from __future__ import annotations

import os
import socket

import pytest

pytest.importorskip("pyspark")

from kstore.errors import StoreNotVisibleError, UnsafeFilesystemError, UnusableFileError  # noqa: E402
from kstore.fileio import FileOps  # noqa: E402
from kstore.spark import deploy  # noqa: E402
from kstore.spark.deploy import ID_FILE, StoreIdentity, check, create_id, identify, read_id  # noqa: E402


def test_identity_created_once_and_stable(tmp_path):
    d = tmp_path / "store"
    d.mkdir()
    assert read_id(str(d)) is None
    a = identify([str(d)])
    raw = (d / ID_FILE).read_text()
    assert len(raw) == 33 and raw.endswith("\n")
    assert a.ids == (f"kstore:{raw.strip()}",)
    assert a.driver_host == socket.gethostname()
    assert identify([str(d)]) == a                      # read, never replaced
    assert create_id(str(d)) == a.ids[0]
    assert sorted(os.listdir(d)) == [ID_FILE]           # no temp file left behind
    check(a)


def test_create_race_loses_to_the_first_link(tmp_path):
    d = tmp_path / "s"
    d.mkdir()

    class Racer(FileOps):
        def link(self, src, dst):
            (d / ID_FILE).write_text("ab" * 16 + "\n")   # another process links first
            super().link(src, dst)

    assert create_id(str(d), Racer()) == "kstore:" + "ab" * 16
    assert sorted(os.listdir(d)) == [ID_FILE]


def test_kafka_meta_properties_is_the_identity(tmp_path):
    d = tmp_path / "kafka"
    d.mkdir()
    (d / "meta.properties").write_text("#\n#Mon\ncluster.id=CLU\ndirectory.id=DIRID\n"
                                       "node.id=1\nversion=1\n")
    assert identify([str(d)]).ids == ("kafka:CLU/DIRID",)
    assert not (d / ID_FILE).exists()
    (d / "meta.properties").write_text("version=0\nbroker.id=1\n")      # ZK mode: no dir id
    assert identify([str(d)]).ids[0].startswith("kstore:")
    (d / "meta.properties").write_bytes(b"cluster.id=CLU\ndirectory.id=D\\u12\n")  # Kafka fails too
    with pytest.raises(UnusableFileError) as ei:
        identify([str(d)])
    assert str(ei.value) == (f"refusing {d / 'meta.properties'}: not a properties file Kafka reads "
                             f"({d / 'meta.properties'}, line 2: Malformed \\uxxxx encoding "
                             "(java.util.Properties refuses it): 'directory.id=D\\\\u12')")


def test_missing_empty_and_other_store_fail_naming_host_and_path(tmp_path):
    d, other = tmp_path / "store", tmp_path / "other"
    d.mkdir()
    other.mkdir()
    ident = identify([str(d)])
    host = socket.gethostname()
    moved = StoreIdentity((str(tmp_path / "gone"),), ident.ids, "driver-h")
    with pytest.raises(StoreNotVisibleError, match="does not exist") as e:
        check(moved)
    assert e.value.host == host and e.value.path == str(tmp_path / "gone")
    assert f"host {host} cannot see the kstore store at {tmp_path / 'gone'}" in str(e.value)
    assert "driver-h" in str(e.value)
    empty = StoreIdentity((str(other),), ident.ids, "driver-h")
    with pytest.raises(StoreNotVisibleError, match="no store identity"):
        check(empty)
    identify([str(other)])
    with pytest.raises(StoreNotVisibleError, match="another store"):
        check(empty)
    (d / ID_FILE).unlink()
    (d / "x").mkdir()
    (d / ID_FILE).write_text("not hex\n")
    with pytest.raises(StoreNotVisibleError, match="cannot be read"):
        check(ident)
    with pytest.raises(UnusableFileError, match=ID_FILE):
        read_id(str(d))
    (d / ID_FILE).write_bytes(b"0" * 5000)                   # hostile size: never read whole
    with pytest.raises(UnusableFileError, match="larger than"):
        read_id(str(d))
    (tmp_path / "file").write_text("")
    with pytest.raises(StoreNotVisibleError, match="not a directory"):
        check(StoreIdentity((str(tmp_path / "file"),), (None,), "h"))


def test_read_only_store_falls_back_to_the_partition(tmp_path, monkeypatch):
    d = tmp_path / "ro"
    (d / "t-0").mkdir(parents=True)

    class ReadOnly(FileOps):
        def open(self, path, flags, mode=0o644):
            if flags & os.O_CREAT:
                raise OSError(30, "Read-only file system", path)
            return super().open(path, flags, mode)

    ident = identify([str(d)], io=ReadOnly())
    assert ident.ids == (None,) and not (d / ID_FILE).exists()
    check(ident, "t-0")
    with pytest.raises(StoreNotVisibleError, match="partition t-1 is in none"):
        check(ident, "t-1")


def test_make_dirs_for_a_new_store(tmp_path):
    d = tmp_path / "a" / "new"
    ident = identify([str(d)], make_dirs=True)
    assert d.is_dir() and ident.ids[0].startswith("kstore:")


def test_nfs_without_shared_locks_is_refused_for_writes(tmp_path, monkeypatch):
    mounts = (f"40 1 0:50 /x {tmp_path} rw - nfs srv:/x rw,vers=3,local_lock=all,addr=1.2.3.4\n"
              f"41 40 0:51 /y {tmp_path}/v4 rw - nfs4 srv:/y rw,vers=4.2,local_lock=none\n")

    class Mounts(FileOps):
        def read_file(self, path):
            return mounts.encode() if path == "/proc/self/mountinfo" else super().read_file(path)

    (tmp_path / "v4").mkdir()
    io = Mounts()
    assert deploy.mount_of(str(tmp_path / "s"), io)[:2] == (str(tmp_path), "nfs")
    with pytest.raises(UnsafeFilesystemError, match="local_lock=all"):
        deploy.check_writer_fs([str(tmp_path / "s")], io)
    deploy.check_writer_fs([str(tmp_path / "v4" / "s")], io)     # NFSv4: locks in the protocol
    deploy.check_writer_fs([str(tmp_path)], FileOps())           # this machine's real mounts


def _store(tmp_path, n=10):
    import kstore
    d = str(tmp_path / "st")
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
        m.append_batch("t", 0, [(b"k%d" % i, b"v%d" % i) for i in range(n)])
    return d


def test_task_checks_identity_before_opening_the_store(tmp_path):
    from kstore.spark.options import ReadOptions
    from kstore.spark.read import KStoreRange, read_range
    d = _store(tmp_path)
    ident = identify([d])
    opts = ReadOptions(paths=[d], fail_on_data_loss=False)
    rows = sum(b.num_rows for b in read_range(opts, KStoreRange("t", 0, 0, 10, ident)))
    assert rows == 10
    empty = tmp_path / "empty"
    empty.mkdir()
    elsewhere = StoreIdentity((str(empty),), ident.ids, "driver-h")
    opts_e = ReadOptions(paths=[str(empty)], fail_on_data_loss=False)
    with pytest.raises(StoreNotVisibleError, match=f"cannot see the kstore store at {empty}"):
        list(read_range(opts_e, KStoreRange("t", 0, 0, 10, elsewhere)))


def test_task_on_another_host_seeing_a_shorter_partition_fails(tmp_path):
    from kstore.spark.options import ReadOptions
    from kstore.spark.read import KStoreRange, read_range, split_ranges
    d = _store(tmp_path)
    ident = identify([d])
    opts = ReadOptions(paths=[d])
    other = StoreIdentity(ident.dirs, ident.ids, "driver-host-elsewhere")
    parts = split_ranges([KStoreRange("t", 0, 0, 20, other)], 2, None)
    assert [p.store for p in parts] == [other, other]          # splits keep the identity
    with pytest.raises(StoreNotVisibleError, match="ends at offset 10 here.*up to 20"):
        list(read_range(opts, parts[1]))
    assert sum(b.num_rows for b in read_range(opts, parts[0])) == 10
    # on the driver's own host a shorter log is a truncation: the reader's existing handling
    assert sum(b.num_rows for b in read_range(opts, KStoreRange("t", 0, 0, 20, ident))) == 10


def test_create_id_races_between_threads_and_a_process(tmp_path):
    import subprocess
    import sys
    import threading

    from thread_watchdog import join_all
    for round_ in range(5):
        d = tmp_path / f"r{round_}"
        d.mkdir()
        got: list = []
        proc = subprocess.Popen([sys.executable, "-P", "-c", "import sys; from kstore.spark.deploy "
                                 "import create_id; print(create_id(sys.argv[1]))", str(d)],
                                stdout=subprocess.PIPE, text=True)
        threads = [threading.Thread(target=lambda g=got, p=str(d): g.append(create_id(p)))
                   for _ in range(4)]
        for t in threads:
            t.start()
        join_all(threads, 30)
        out, _ = proc.communicate(timeout=60)
        assert len(got) == 4 and set(got) == {out.strip()} == {read_id(str(d))}
        assert sorted(os.listdir(d)) == [ID_FILE]
