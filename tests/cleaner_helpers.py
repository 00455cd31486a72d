"""Helpers the cleaner tests share (unit and reliability tiers)."""
from kstore.clock import MockTime
from kstore.manager import LogManager
from kstore.scheduler import MockScheduler

NOW = 1_700_000_000_000


def mgr(path, config=None, t=None):
    t = t or MockTime(NOW)
    cfg = {"log.segment.bytes": "1000", "log.segment.delete.delay.ms": "0"}
    cfg.update(config or {})
    return LogManager(str(path), cfg, time=t, scheduler=MockScheduler(t)), t


def latest(records):
    out = {}
    for off, k, v in records:
        out[k] = (off, v)
    return out


def contents(lg):
    return [(r.offset, r.key, r.value) for r in lg]
