"""examples/worker_pool.py (the README's consumer-group example) runs: a worker killed with -9
mid-run, every job done, only a bounded number done twice."""
import importlib.util
import os

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                       "worker_pool.py")


def test_worker_pool_survives_kill_9(tmp_path, watchdog):
    watchdog(240)
    spec = importlib.util.spec_from_file_location("worker_pool", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    report = mod.main(str(tmp_path), jobs=2000)
    assert report["killed"] == 1
    assert report["done"] == 2000                      # every job, despite the kill
    # done twice: only what the killed worker did after its last commit (one poll's records)
    assert report["done_twice"] <= 500, report
