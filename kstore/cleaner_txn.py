"""The transactions of a log being cleaned (Kafka's CleanedTransactionMetadata, with the aborted
transactions and last stable offset a clean needs).

Kafka's cleaner never cleans at or past the last stable offset (an open transaction may still
abort), leaves aborted transactions' batches out of the dedupe map (an aborted value must not
replace a committed one) and drops them from the log, and drops a marker once its transaction
has no data left and the marker's delete horizon has passed (the first clean that finds it so
sets the horizon, as for tombstones); it also keeps each active producer's last batch, emptied if
need be. kstore keeps no `.txnindex` and no producer state, so a clean finds both from one walk
of the log's batch headers (read_committed.producer_batches): a producer's transaction runs from
its first data batch to its next marker, and its state is that of its last batches there.
One departure, below the log start only: Kafka takes an ABORT there for no abort (it collects
aborted transactions from the log start), keeps the data and drops the marker; kstore's readers
learn the transactions open at the log start from those bytes (txn_prefix: Kafka's producer
state), where data with no marker after it is a transaction still open, so the marker stays
while data of its transaction is before it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from kstore._core import TXN_ABORTED, TXN_KEEP_EMPTY, TXN_MARKER_GOES
from kstore.read_committed import ABORT, COMMIT, DATA, EMPTY_CONTROL, IDEMPOTENT, producer_batches

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


def _aborted(batches: list[tuple[int, int, int, int]], log_start: int) -> list[tuple[int, int]]:
    """(first offset, producer id) of each aborted transaction with data in batches whose ABORT
    is at or past the log start (Kafka's collectAbortedTransactions), sorted."""
    open_: dict[int, int] = {}
    out = []
    for base, _last, pid, kind in batches:
        if kind == DATA:
            open_.setdefault(pid, base)
        elif kind != EMPTY_CONTROL:
            first = open_.pop(pid, None)
            if first is not None and kind == ABORT and base >= log_start:
                out.append((first, pid))
    out.sort()
    return out


def _last_batches(batches: list, now: int, expiration_ms: int) -> list[int]:
    """Base offsets of the batches Kafka's cleaner keeps, emptied if need be, for the producers
    still active (lastRecordsOfActiveProducers): a producer's last data batch (its last sequence),
    or with none since its epoch changed, its markers of that epoch (the epoch, for fencing). A
    producer with no open transaction expires producer.id.expiration.ms after its last batch's
    max timestamp."""
    state: dict[int, list] = {}       # pid -> [epoch, last data base, markers' bases, ts, open]
    for base, _last, pid, epoch, kind, max_ts in batches:
        st = state.get(pid)
        if st is None or st[0] != epoch:            # a new epoch: its batch metadata restarts
            st = state[pid] = [epoch, None, [], max_ts, st[4] if st else False]
        if kind in (DATA, IDEMPOTENT):
            st[1] = base
            st[4] = st[4] or kind == DATA
        else:
            st[2].append(base)
            st[4] = False
        st[3] = max_ts
    keep: list[int] = []
    for _epoch, data, markers, ts, open_ in state.values():
        if open_ or now - ts < expiration_ms:
            keep += [data] if data is not None else markers
    return keep


def clean_actions(lg: "Log", end: int, now: int, expiration_ms: int) -> Optional[dict[int, int]]:
    """What a clean does with the batches that have a producer id below `end`, by base offset,
    as bits: TXN_ABORTED for an aborted transaction's data, TXN_MARKER_GOES for a marker whose
    transaction has no data left before it in this clean (Kafka's onControlBatchRead),
    TXN_KEEP_EMPTY for an active producer's last batch; None when no batch has a producer id."""
    every = list(producer_batches(lg, lg.segments[0].base_offset))
    if not every:
        return None
    actions: dict[int, int] = dict.fromkeys(_last_batches(every, now, expiration_ms), TXN_KEEP_EMPTY)
    batches = [(base, last, pid, kind) for base, last, pid, _e, kind, _ts in every if kind != IDEMPOTENT]
    aborted = _aborted(batches, lg.log_start_offset)
    ongoing_aborted: dict[int, bool] = {}     # pid -> a batch of it seen in this clean
    ongoing_committed: set[int] = set()
    unmarked: set[int] = set()                # pids with a data batch since their last marker
    i = 0
    for base, last, pid, kind in batches:
        if base >= end:
            break
        while i < len(aborted) and aborted[i][0] <= last:
            ongoing_aborted.setdefault(aborted[i][1], False)
            i += 1
        if kind == DATA:
            unmarked.add(pid)
            if pid in ongoing_aborted:
                ongoing_aborted[pid] = True
                actions[base] = actions.get(base, 0) | TXN_ABORTED
            else:
                ongoing_committed.add(pid)
            continue
        if kind == EMPTY_CONTROL:
            goes = True                       # emptied by an earlier clean
        elif kind == ABORT and pid in ongoing_aborted:
            goes = not ongoing_aborted.pop(pid)
        elif kind == ABORT:
            # below the log start: not an aborted transaction to Kafka's cleaner, which keeps
            # its data and drops the marker; kstore's readers find the transactions open at the
            # log start from these bytes, so the marker stays while its data does
            goes = pid not in unmarked
        elif kind == COMMIT:
            goes = pid not in ongoing_committed
            ongoing_committed.discard(pid)
        else:
            goes = False
        unmarked.discard(pid)
        if goes:
            actions[base] = actions.get(base, 0) | TXN_MARKER_GOES
    return actions
