"""kstore.tools.bench (`kstore bench`): a tiny run through the command gives every figure."""
import json

from kstore.tools import cli


def test_bench_json_tiny_run(capsys):
    assert cli.main(["bench", "--records", "3000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["records"] == 3000
    assert out["kstore"]["append_single"]["rate"] > 0
    assert "time_lookup_p50_vs_offset_lookup_p50" in out["ratios"]


def test_bench_measures_write_of_the_batched_logs_own_bytes(capsys):
    """The write() floor writes exactly the batched log's bytes, one 1000-record batch a call,
    and is reported beside the batch append in the same run."""
    assert cli.main(["bench", "--records", "3000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    k = out["kstore"]
    assert k["write_floor"]["batch_bytes"] * 3 == k["bytes_on_disk"]
    r = out["ratios"]
    assert r["append_batch_rate_vs_write_floor"] == k["append_batch"]["rate"] / k["write_floor"]["rate"]
    assert r["write_floor_rate_vs_lmdb_putmulti"] == k["write_floor"]["rate"] / out["lmdb"]["append_batch"]["rate"]
