"""Shared by the LogManager tests of both tiers: a manager on a mock clock and scheduler (the
`mock` fixture in conftest.py gives the pair)."""
from kstore.manager import LogManager

NOW = 1_700_000_000_000


def manager(dirs, config=None, mock=None, **kw):
    if mock is not None:
        kw.setdefault("time", mock[0])
        kw.setdefault("scheduler", mock[1])
    return LogManager(dirs, config, **kw)
