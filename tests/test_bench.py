"""kstore.tools.bench (`kstore bench`): a tiny run through the command gives every figure."""
import json

from kstore.tools import cli


def test_bench_json_tiny_run(capsys):
    assert cli.main(["bench", "--records", "3000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 3000
    assert out["kstore"]["append_single"]["rate"] > 0
    assert "time_lookup_p50_vs_offset_lookup_p50" in out["ratios"]
