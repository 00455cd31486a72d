"""The kstore command: quickstart writes a real store and reports what it did; bench runs."""
import json
import os
import subprocess
import sys

import kstore
from kstore import cli


def test_quickstart_builds_and_tours_a_store(tmp_path, capsys):
    assert cli.main(["quickstart", "--dir", str(tmp_path / "data")]) == 0
    out = capsys.readouterr().out
    assert "offsets 0..99" in out and "log end offset 400" in out
    assert "read by offset 250 → key=b'user-250'" in out
    assert "0 segments needed recovery" in out
    assert "compacted 'profiles': 500 -> " in out and "user-7 reads b'profile version 487'" in out
    assert "retention.bytes=8192: deleted" in out
    part = tmp_path / "data" / "quickstart-0"
    with kstore.Log.open(str(part)) as log:
        assert log.log_end_offset == 400
        assert len(log.segments) > 1


def test_python_dash_m_entry_point(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kstore", "quickstart", "--dir", str(tmp_path)],
                       capture_output=True, text=True, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "kstore" in r.stdout and os.path.isdir(tmp_path / "quickstart-0")


def test_bench_json_tiny_run(capsys):
    assert cli.main(["bench", "--records", "3000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 3000
    assert out["kstore"]["append_single"]["rate"] > 0
    assert "time_lookup_p50_vs_offset_lookup_p50" in out["ratios"]


def test_no_command_prints_help(capsys):
    assert cli.main([]) == 2
    assert "quickstart" in capsys.readouterr().out
