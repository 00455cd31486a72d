"""Helpers shared by the segment test modules."""
import random

from kstore import _core
from kstore.clock import MockTime
from kstore.config import NO_LIMIT, LogConfig
from kstore.fileio import get_file_ops
from kstore.segment import LogSegment

NOW = 1_700_000_000_000


def make_segment(dir_, base=0, config=None, exists=False, time=None):
    cfg = LogConfig(config or {"index.interval.bytes": 10})
    seg = LogSegment(str(dir_), base, cfg, io=get_file_ops(), time=time or MockTime(NOW),
                     rng=random.Random(0), file_already_exists=exists)
    return seg


def append(seg, offset, records, magic=2):
    b = _core.BatchBuilder()
    recs = [r if isinstance(r, tuple) else (None, r, NOW) for r in records]
    b.build(recs, magic, offset, NOW, False, -NO_LIMIT, NO_LIMIT, False, 0)
    if not seg.is_active:
        seg.make_active()
    seg.append(b, b.last_offset, b.max_timestamp, b.offset_of_max_timestamp)
    return b


def read_all(seg, offset=0):
    out = []
    seg.read(offset, 1 << 30, 1 << 30, out)
    return out
