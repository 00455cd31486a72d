"""The transactions of a log being cleaned (Kafka's CleanedTransactionMetadata, with the aborted
transactions and last stable offset a clean needs).

Kafka's cleaner never cleans at or past the last stable offset (an open transaction may still
abort), leaves aborted transactions' batches out of the dedupe map (an aborted value must not
replace a committed one) and drops them from the log, and drops a marker once its transaction
has no data left and the marker's delete horizon has passed (the first clean that finds it so
sets the horizon, as for tombstones). kstore keeps no `.txnindex`, so a clean finds the aborted
transactions from one walk of the log's batch headers (read_committed.transactional_batches):
a producer's transaction runs from its first data batch to its next marker.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from kstore._core import TXN_ABORTED, TXN_MARKER_GOES
from kstore.read_committed import ABORT, COMMIT, DATA, EMPTY_CONTROL, transactional_batches

if TYPE_CHECKING:
    from kstore.log import Log

__all__ = ["clean_actions", "first_uncleanable_by_lso"]


def first_uncleanable_by_lso(lg: "Log", lso: int) -> int:
    """The base of the segment holding the last stable offset (Kafka's LogToClean rounds the
    first uncleanable offset down to a segment base)."""
    base = lg.segments[0].base_offset
    for s in lg.segments:
        if s.base_offset > lso:
            break
        base = s.base_offset
    return base


def _aborted(batches: list[tuple[int, int, int, int]]) -> list[tuple[int, int]]:
    """(first offset, producer id) of each aborted transaction with data in batches, sorted."""
    open_: dict[int, int] = {}
    out = []
    for base, _last, pid, kind in batches:
        if kind == DATA:
            open_.setdefault(pid, base)
        elif kind != EMPTY_CONTROL:
            first = open_.pop(pid, None)
            if first is not None and kind == ABORT:
                out.append((first, pid))
    out.sort()
    return out


def clean_actions(lg: "Log", end: int) -> Optional[dict[int, int]]:
    """What a clean does with the transactional batches below `end`, by base offset:
    TXN_ABORTED for an aborted transaction's data, TXN_MARKER_GOES for a marker whose
    transaction has no data left before it in this clean (Kafka's onControlBatchRead); None
    when the log has no transactional batch."""
    batches = list(transactional_batches(lg, lg.log_start_offset))
    if not batches:
        return None
    aborted = _aborted(batches)
    actions: dict[int, int] = {}
    ongoing_aborted: dict[int, bool] = {}     # pid -> a batch of it seen in this clean
    ongoing_committed: set[int] = set()
    i = 0
    for base, last, pid, kind in batches:
        if base >= end:
            break
        while i < len(aborted) and aborted[i][0] <= last:
            ongoing_aborted.setdefault(aborted[i][1], False)
            i += 1
        if kind == DATA:
            if pid in ongoing_aborted:
                ongoing_aborted[pid] = True
                actions[base] = TXN_ABORTED
            else:
                ongoing_committed.add(pid)
            continue
        if kind == EMPTY_CONTROL:
            goes = True                       # emptied by an earlier clean
        elif kind == ABORT:
            goes = not ongoing_aborted.pop(pid, False)
        elif kind == COMMIT:
            goes = pid not in ongoing_committed
            ongoing_committed.discard(pid)
        else:
            goes = False
        if goes:
            actions[base] = TXN_MARKER_GOES
    return actions
