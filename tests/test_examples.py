"""The worked examples in examples/ run and produce what they claim."""
import importlib.util
import os
import subprocess
import sys

import pytest

import kstore

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, name + ".py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_examples_run_twice_in_the_same_directory(tmp_path):
    """The README's Log and LogManager examples (examples/readme_examples.py, issue 16 item
    12): the second run in the same directory exits 0 and prints what the first printed."""
    pytest.importorskip("kstore._core")
    env = dict(os.environ, PYTHONSAFEPATH="1")
    runs = [subprocess.run([sys.executable, os.path.join(EXAMPLES, "readme_examples.py"), str(tmp_path)],
                           capture_output=True, text=True, timeout=120, env=env) for _ in range(2)]
    assert [(r.returncode, r.stderr) for r in runs] == [(0, ""), (0, "")]
    assert runs[0].stdout == runs[1].stdout
    assert runs[0].stdout.splitlines()[:3] == ["b'k' b'v' ()", "b'k2' b'v2' ()", "None b'v3' (('h', b'x'),)"]
    part = runs[0].stdout.splitlines()[3].split()[0]
    assert runs[1].stdout.splitlines()[3] == f"{part} [b'/home']"
    with kstore.LogManager([str(tmp_path / "data/d1"), str(tmp_path / "data/d2")], read_only=True) as m:
        assert [r.value for r in m.read("clicks", int(part), 0)] == [b"/home", b"/home"]
    with kstore.Log.open(str(tmp_path / "data/clicks-0")) as lg:      # its clean marker keeps the start
        assert (lg.log_start_offset, lg.log_end_offset) == (4, 6)
        assert [r.value for r in lg.read(4)] == [b"v2", b"v3"]


def test_clickstream_pipeline(spark, tmp_path):
    """Run twice in the same directory (issue 16 item 12): the second run starts over and
    reports exactly what the first did."""
    pytest.importorskip("pyspark")
    ex = load_example("clickstream_pipeline")
    report = ex.main(str(tmp_path / "data"), spark=spark)
    assert report["clicks"] == 1800
    assert report["mismatches"] == 0
    # minute 4 was counted in both runs: compaction kept one record per key
    assert report["records_after_compaction"] == report["keys"]
    assert ex.main(str(tmp_path / "data"), spark=spark) == report
    assert not [n for n in os.listdir(tmp_path / "data") if n.endswith("-delete")]
