"""The reliability tier: every test under tests/reliability/ (crash, corruption, faults, fuzz,
soak, concurrency, and the test_<module>_races.py files) is marked `reliability`: `pytest -m
reliability` runs this tier, `pytest -m "not reliability and not spark"` the fast one.

The helper modules (crash_harness, race_harness, thread_watchdog, writer_process) live in tests/,
which the root conftest puts on sys.path: import them by name from here too.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
# where the figures for the README's Reliability table go (beside the root conftest, as before)
COUNTS_PATH = HERE.parent / ".crash-counts.json"


@pytest.hookimpl(tryfirst=True)       # before the mark plugin deselects by -m
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests under this directory `reliability` (the root conftest runs them last).
    Called with every collected item, so it looks at each one's path."""
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.reliability)


_COUNTS: dict = {}


@pytest.fixture(scope="session")
def reliability_counts():
    """The reliability tests file their figures here (section -> dict); at the end of the session
    they are merged into tests/.crash-counts.json for the README's Reliability section."""
    yield _COUNTS
    if not _COUNTS:
        return
    try:
        with open(COUNTS_PATH) as f:
            counts = json.load(f)
    except (OSError, ValueError):
        counts = {}
    counts.update(_COUNTS)
    tmp = f"{COUNTS_PATH}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(counts, f, indent=1, sort_keys=True)
    os.replace(tmp, COUNTS_PATH)
