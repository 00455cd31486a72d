"""File names of a partition directory (kstore/files.py): what parses as a segment, and odd names
that must give kstore errors naming the path, never raw Python errors (issue 12, defect 18)."""

import pytest

import kstore
from kstore.errors import UnusableFileError
from kstore.fileio import get_file_ops
from kstore.files import delete_dir_name, is_delete_dir, parse_name, partition_dirs

ARABIC_ZERO = "\u0660"


def _store(path, n=3):
    with kstore.Log.open(str(path)) as lg:
        for i in range(n):
            lg.append([(b"k", b"v%d" % i)])


def test_parse_name_takes_ascii_digits_up_to_int64(tmp_path):
    assert parse_name("09223372036854775807.log") == ((1 << 63) - 1, ".log", "")
    assert parse_name("00000000000000000042.index.swap") == (42, ".index", ".swap")
    assert parse_name(ARABIC_ZERO * 20 + ".log") is None
    # a partition number is ASCII digits too (parse_partition_dir, removed as unused, said so)
    (tmp_path / ("t-" + ARABIC_ZERO)).mkdir()
    (tmp_path / "t-0").mkdir()
    assert partition_dirs(get_file_ops(), str(tmp_path)) == [(("t", 0), str(tmp_path / "t-0"))]
    with pytest.raises(UnusableFileError) as ei:
        parse_name("99999999999999999999.log", "/x/t-0")
    assert str(ei.value) == "refusing /x/t-0/99999999999999999999.log: its base offset is above 2^63-1"


@pytest.mark.parametrize("read_only", [False, True])
def test_segment_name_above_int64_is_refused_naming_it(tmp_path, read_only):
    part = tmp_path / "t-0"
    _store(part)
    odd = part / "99999999999999999999.log"
    odd.write_bytes(b"")
    with pytest.raises(UnusableFileError) as ei:
        kstore.Log.open(str(part), read_only=read_only)
    assert str(ei.value) == f"refusing {odd}: its base offset is above 2^63-1"
    assert odd.exists()


@pytest.mark.parametrize("read_only", [False, True])
def test_non_ascii_digits_are_not_a_segment(tmp_path, read_only):
    part = tmp_path / "t-0"
    _store(part)
    odd = part / (ARABIC_ZERO * 20 + ".log")
    odd.write_bytes(b"not a segment")
    with kstore.Log.open(str(part), read_only=read_only) as lg:
        assert [(r.offset, r.value) for r in lg.read(0)] == [(0, b"v0"), (1, b"v1"), (2, b"v2")]
        assert [s.base_offset for s in lg.segments] == [0]
    assert odd.read_bytes() == b"not a segment"


@pytest.mark.parametrize("read_only", [False, True])
def test_directory_named_like_a_segment_is_refused(tmp_path, read_only):
    part = tmp_path / "t-0"
    _store(part)
    odd = part / "00000000000000000007.log"
    odd.mkdir()
    with pytest.raises(UnusableFileError) as ei:
        with kstore.Log.open(str(part), read_only=read_only) as lg:
            lg.read(7)
    assert str(ei.value) == f"refusing {odd}: a directory, not a regular file"
    assert odd.is_dir()


def test_log_path_that_is_a_file_is_a_kstore_error(tmp_path):
    f = tmp_path / "t-0"
    f.write_bytes(b"")
    with pytest.raises(UnusableFileError, match=f"refusing {f}: not a directory"):
        kstore.Log.open(str(f))
    # the failed open left no lock behind: a LogManager can own the parent log dir
    kstore.LogManager(str(tmp_path), {"log.cleaner.enable": False}).close()
    with pytest.raises(UnusableFileError, match=f"refusing {f}: not a directory"):
        kstore.StoreReader(str(f))


def test_delete_dir_name_is_kafkas_and_fits_255_bytes():
    name = delete_dir_name("t", 3)
    assert is_delete_dir(name) and name.startswith("t-3.") and name.endswith("-delete") and len(name) == 43
    long = delete_dir_name("x" * 249, 12)
    assert len(long) == 255 and is_delete_dir(long) and long.startswith("x" * 200)
