"""Shared fixtures. Tests import the installed kstore (pytest runs with --import-mode=importlib).

Two tiers: the unit tests in tests/ (`pytest -m "not reliability"`, the fast tier) and the
crash, corruption, fault, fuzz, soak and concurrency suites in tests/reliability/, marked
`reliability` by that directory's conftest. `pytest -q` runs both, the fast tier first."""
import os
import sys

import pytest

import kstore

# helper modules beside the tests (thread_watchdog, crash_harness, race_harness, writer_process)
# import by name, from tests/ and from tests/reliability/ alike
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
def watchdog():
    """watchdog(seconds): bound a test; on expiry every thread's stack is dumped and the run fails
    (see tests/watchdog.py). Concurrency tests wrap their whole body in it."""
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
