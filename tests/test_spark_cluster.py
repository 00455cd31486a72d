"""More than one machine: a real Spark standalone cluster (a master and two workers, each in its
own mount and UTS namespace that sees the store through a shared bind mount, as NFS would give
it; tests/spark_cluster.py) with one driver session (tests/cluster_driver.py, its own process):
batch read, streaming read with a restart, batch and streaming write, and tasks on hosts that
cannot see the store failing with StoreNotVisibleError naming host and path."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")
from spark_cluster import WORKERS, Cluster, namespaces_allowed  # noqa: E402

pytestmark = pytest.mark.spark
DRIVER = os.path.join(os.path.dirname(__file__), "cluster_driver.py")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    why = namespaces_allowed()
    if why:
        pytest.skip(why)
    base = str(tmp_path_factory.mktemp("cluster"))
    cluster = Cluster(base)
    try:
        cluster.start(timeout=120)
        out = os.path.join(base, "results.json")
        env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable,
                   PYTHONSAFEPATH="1")
        try:
            p = subprocess.run([sys.executable, DRIVER, cluster.url, base, out], env=env,
                               capture_output=True, timeout=900, start_new_session=True)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the driver did not finish in 900 s: {e.stderr!r}"[-4000:]
                        + cluster.tail())
        if not os.path.exists(out):
            pytest.fail(f"the driver wrote no results (exit {p.returncode}): "
                        + p.stderr.decode(errors="replace")[-4000:] + cluster.tail())
        with open(out) as f:
            res = json.load(f)
        res["_base"] = base
        print("cluster case seconds:", {k: v.get("secs") for k, v in res.items()
                                        if isinstance(v, dict)})
        yield res
    finally:
        cluster.stop()


def ok(results, name):
    r = results.get(name)
    assert r is not None, f"case {name} did not run"
    assert r["ok"], r.get("trace") or r
    return r


def expect(topic_n: int, start: int = 0, partitions: int = 2):
    """(partition, offset, value) of records start..start+n-1 appended round robin."""
    out, next_off = [], {}
    for i in range(start + topic_n):
        p = i % partitions
        off = next_off.get(p, 0)
        next_off[p] = off + 1
        if i >= start:
            out.append((p, off, f"v{i}"))
    return sorted(out)


def test_tasks_run_on_both_workers_and_import_this_tree(results):
    r = ok(results, "hosts")
    assert r["hosts"] == sorted(WORKERS)
    assert r["kstore"].startswith(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_batch_read(results):
    r = ok(results, "batch_read")
    assert [tuple(x) for x in r["rows"]] == expect(1000)
    assert [tuple(x) for x in r["split"]] == expect(1000)


def test_streaming_read_restart_exact(results):
    r = ok(results, "stream_read_restart")
    assert [tuple(x) for x in r["first"]] == expect(600)
    assert [tuple(x) for x in r["second"]] == expect(400, start=600)
    assert r["third"] == []


def test_batch_write(results):
    r = ok(results, "batch_write")
    vals = sorted(x[2] for x in r["rows"])
    assert vals == sorted(f"w{i}" for i in range(500))
    per_part: dict = {}
    for p, off, _ in r["rows"]:
        per_part.setdefault(p, []).append(off)
    assert all(offs == list(range(len(offs))) for offs in per_part.values())
    assert r["staging"] == []


def test_streaming_write_exactly_once_per_batch(results):
    r = ok(results, "stream_write")
    assert r["first"] == sorted(f"v{i}" for i in range(1000))
    assert r["second"] == sorted(f"v{i}" for i in range(1100))


def test_streaming_write_leaves_no_staging(results):
    assert ok(results, "stream_write")["staging"] == []


def _names_host_and_path(res, path):
    assert res["failed"], f"expected a failure, got {res.get('got')!r}"
    err = res["error"]
    assert "StoreNotVisibleError" in err, err[-2000:]
    assert "DataLossError" not in err
    assert any(f"host {h} cannot see the kstore store at {path}" in err for h in WORKERS), err[-2000:]
    return err


def test_empty_dir_at_the_store_path_fails_naming_host_and_path(results):
    r = ok(results, "masked")
    path = os.path.join(results["_base"], "mnt", "shared", "masked")
    for k in ("batch_true", "batch_false", "stream_false"):
        assert "no store identity" in _names_host_and_path(r[k], path)
    _names_host_and_path(r["write"], path)
    assert "mw-0" not in r["masked_staging"] and ".kstore-staging" not in r["masked_staging"]


def test_missing_dir_fails_naming_host_and_path(results):
    r = ok(results, "missing")
    path = os.path.join(results["_base"], "mnt", "local", "store")
    assert "does not exist" in _names_host_and_path(r, path)
