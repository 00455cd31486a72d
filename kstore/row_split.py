"""Row budgeting of columnar appends (Log.append_columns, the Spark sink): consecutive row ranges
whose summed encoded sizes stay within a batch budget, one Python step per range (moved out of
log.py; `kstore.log.split_rows` still names it).
"""
from __future__ import annotations

import numpy as np

__all__ = ["split_rows"]


def split_rows(sizes: np.ndarray, start: int, stop: int, budget: int) -> list[tuple[int, int]]:
    """Consecutive row ranges of [start, stop) whose summed sizes stay within budget (a range
    holds at least one row). One Python step per range, not per row."""
    out: list[tuple[int, int]] = []
    if stop <= start:
        return out
    cs = np.cumsum(sizes[start:stop])
    pos = 0
    n = stop - start
    while pos < n:
        base = cs[pos - 1] if pos else 0
        j = int(np.searchsorted(cs, base + budget, side="right"))
        j = max(j, pos + 1)
        out.append((start + pos, start + j))
        pos = j
    return out
