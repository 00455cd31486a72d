"""swap: the `.cleaned -> .swap -> final` protocol, and its completion at load after a crash at
each step (Kafka's LogLoaderTest swap-file cases)."""
import os

import pytest

import kstore
from kstore import swap
from kstore.fileio import get_file_ops

from log_helpers import NOW, files


def _write(d, name, data=b"x"):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def test_remove_cleaned(tmp_path):
    d = str(tmp_path)
    for suf in (".log.cleaned", ".index.cleaned", ".timeindex.cleaned"):
        _write(d, "00000000000000000005" + suf)
    _write(d, "00000000000000000009.log.cleaned")
    _write(d, "00000000000000000000.log")
    swap.remove_cleaned(get_file_ops(), d, 5)
    assert files(d) == ["00000000000000000000.log", "00000000000000000009.log.cleaned"]
    swap.remove_all_cleaned(get_file_ops(), d)
    assert files(d) == ["00000000000000000000.log"]
    swap.remove_all_cleaned(get_file_ops(), str(tmp_path / "gone"))    # errors ignored


def _compacted_log(path):
    """A log of 3 segments whose first two are to be replaced by one cleaned segment."""
    lg = kstore.Log.open(path, {"segment.bytes": 300})
    while len(lg.segments) < 3:
        o = lg.log_end_offset
        lg.append([(b"k%d" % (o % 3), b"v%d" % o, NOW + o)])
    return lg


def test_swap_in_replaces_the_old_segments(tmp_path):
    d = str(tmp_path / "t-0")
    lg = _compacted_log(d)
    old = lg.segments[:2]
    base = old[0].base_offset
    # the cleaned segment: here simply the old segments' bytes back to back
    data = b"".join(bytes(s.mapping().read(0, s.size)) for s in old)
    _write(d, f"{base:020d}.log.cleaned", data)
    assert lg.replace_segments(base, old)
    assert [s.base_offset for s in lg.segments] == [base, lg.segments[1].base_offset]
    assert all(s.closed for s in old)
    assert not [n for n in files(d) if n.endswith((".cleaned", ".swap"))]
    assert [r.offset for r in lg] == list(range(lg.log_end_offset))
    lg.close()


@pytest.mark.parametrize("stage", ["cleaned", "half-promoted", "swap", "retired", "final"])
def test_load_finishes_or_undoes_an_interrupted_swap(tmp_path, stage):
    """A crash at each step of swap_in: the next load sees the old segments or the new one."""
    d = str(tmp_path / "t-0")
    lg = _compacted_log(d)
    expect = [(r.offset, r.value) for r in lg]
    old = lg.segments[:2]
    base = old[0].base_offset
    data = b"".join(bytes(s.mapping().read(0, s.size)) for s in old)
    lg.close()
    _write(d, f"{base:020d}.log.cleaned", data)
    _write(d, f"{base:020d}.index.cleaned", b"")
    if stage != "cleaned":
        # .index promoted first, .log last
        os.rename(os.path.join(d, f"{base:020d}.index.cleaned"), os.path.join(d, f"{base:020d}.index.swap"))
    if stage in ("swap", "retired", "final"):
        os.rename(os.path.join(d, f"{base:020d}.log.cleaned"), os.path.join(d, f"{base:020d}.log.swap"))
    if stage in ("retired", "final"):
        for s in old:
            for suf in (".log", ".index", ".timeindex"):
                p = os.path.join(d, f"{s.base_offset:020d}{suf}")
                if os.path.exists(p):
                    os.rename(p, p + ".deleted")
    if stage == "final":
        for suf in (".log", ".index"):
            os.rename(os.path.join(d, f"{base:020d}{suf}.swap"), os.path.join(d, f"{base:020d}{suf}"))
    with kstore.Log.open(d) as again:
        assert [(r.offset, r.value) for r in again] == expect
        names = files(d)
        assert not [n for n in names if n.endswith((".cleaned", ".swap", ".deleted"))]
        bases = [s.base_offset for s in again.segments]
        if stage in ("cleaned", "half-promoted"):
            assert bases == [s.base_offset for s in old] + [bases[-1]]      # undone
        else:
            assert bases == [base, bases[-1]] and len(bases) == 2           # finished
