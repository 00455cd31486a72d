"""Shared fixtures. Tests import the installed kstore (pytest runs with --import-mode=importlib)."""
import os
import sys

import pytest

import kstore


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


@pytest.fixture(autouse=True)
def no_unraisable_exceptions():
    """Fail any test during which an exception was swallowed ("Exception ignored in ...")."""
    seen = []
    old = sys.unraisablehook
    sys.unraisablehook = lambda u: seen.append(u)
    yield
    sys.unraisablehook = old
    assert not seen, f"exceptions ignored during the test: {[(u.exc_type, u.exc_value) for u in seen]}"
