"""Shared fixtures. Tests import the installed kstore (pytest runs with --import-mode=importlib).

Tiers, by marker (`pytest -q` runs them all, the fast tier first):
- the fast tier, `pytest -m "not reliability and not spark"`: the unit tests in tests/;
- `spark`: the tests that use the `spark` fixture (a local SparkSession, a JVM), marked here;
- `reliability`: the crash, corruption, fault, fuzz, soak and concurrency suites in
  tests/reliability/, marked by that directory's conftest."""
import os
import sys
from pathlib import Path

import pytest

import kstore

# helper modules beside the tests (thread_watchdog, crash_harness, race_harness, writer_process)
# import by name, from tests/ and from tests/reliability/ alike
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


RELIABILITY_DIR = Path(__file__).resolve().parent / "reliability"


@pytest.hookimpl(tryfirst=True)       # before the mark plugin deselects by -m
def pytest_collection_modifyitems(config, items):
    """Mark `spark` every test that uses the SparkSession, and order a run by tier: the fast tier
    first (a failure shows within a couple of minutes of a whole-suite run), then spark, then
    reliability (sorting keeps each tier's own order)."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)
    items.sort(key=lambda item: (RELIABILITY_DIR in item.path.resolve().parents,
                                 item.get_closest_marker("spark") is not None))


def pytest_report_header(config):
    return f"kstore {kstore.__version__} from {os.path.dirname(kstore.__file__)}; CRC-32C via {kstore._core.crc32c_implementation()}"


@pytest.fixture
def log_dir(tmp_path):
    return str(tmp_path / "topic-0")


@pytest.fixture
def open_log(log_dir):
    """Open a Log at log_dir with a config; closes it at the end."""
    logs = []

    def opener(config=None, path=None, **kw):
        lg = kstore.Log.open(path or log_dir, config, **kw)
        logs.append(lg)
        return lg
    yield opener
    for lg in logs:
        if not lg.closed:
            lg.close()


@pytest.fixture
def group_store(tmp_path):
    """(log dir, LogManager) of topic t: 4 partitions of 10 records each, values b"p<P>-<i>"
    (the consumer-group tests)."""
    import kstore
    d = str(tmp_path / "data")
    m = kstore.LogManager(d)
    m.create_topic("t", 4)
    for p in range(4):
        m.append_batch("t", p, [(b"k", b"p%d-%d" % (p, i)) for i in range(10)])
    yield d, m
    m.close()


@pytest.fixture
def mock():
    """A MockTime and a MockScheduler driven by it, for managers and logs on a hand-run clock."""
    from kstore.clock import MockTime
    from kstore.scheduler import MockScheduler
    t = MockTime(1_700_000_000_000)
    return t, MockScheduler(t)


@pytest.fixture
def watchdog():
    """watchdog(seconds): bound a test; on expiry every thread's stack is dumped and the run fails
    (see tests/thread_watchdog.py). Concurrency tests wrap their whole body in it."""
    from thread_watchdog import Watchdog
    dogs = []

    def arm(seconds=120):
        dog = Watchdog(seconds)
        dog.__enter__()
        dogs.append(dog)
        return dog
    yield arm
    for dog in dogs:
        dog.__exit__(None, None, None)


@pytest.fixture(autouse=True)
def no_unraisable_exceptions():
    """Fail any test during which an exception was swallowed ("Exception ignored in ...")."""
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u)
    yield
    sys.unraisablehook = old
    assert not seen, f"exceptions ignored during the test: {[(u.exc_type, u.exc_value) for u in seen]}"


@pytest.fixture(scope="session")
def spark():
    """One local[2] SparkSession for the run, with the kstore format registered. Skipped only
    when Java is absent (PySpark is part of the test install)."""
    import shutil
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("Java is not installed (PySpark needs it)")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Python workers start in this directory with it on sys.path: from a source checkout they
    # would import ./kstore (no compiled core) instead of the installed package
    os.environ["PYTHONSAFEPATH"] = "1"
    from pyspark.sql import SparkSession
    from kstore.spark import register
    session = (SparkSession.builder.master("local[2]").appName("kstore-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
               .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()
