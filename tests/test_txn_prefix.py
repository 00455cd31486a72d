"""txn_prefix.open_at: the transactions open at an offset, from a header walk of the log."""
import os

import pytest

import kstore
from kstore.errors import SegmentGoneError
from kstore.read_committed import TxnFilter
from kstore.txn_prefix import kept_bases, open_at

from batch_helpers import txn_batch

NOW = 1_700_000_000_000


def _log(tmp_path):
    """pid 7's transaction open at 1 in the first segment; plain records at 2 and 3 in the
    next."""
    lg = kstore.Log.open(os.path.join(str(tmp_path), "t-0"))
    lg.append([(b"a", b"p0", NOW)])
    lg.append_batches(txn_batch(0, 7, [b"t7"], ts=NOW))
    lg.roll()
    lg.append([(b"a", b"p2", NOW)])
    lg.append([(b"a", b"p3", NOW)])
    return lg


def test_a_segment_gone_under_the_walk_is_walked_again_not_skipped(tmp_path, monkeypatch):
    """The first segment's read fails once (removed under the walk, as when a read-only log's
    listing is stale or retention races it). The walk starts again on the log's listing and
    finds pid 7 open: a filter at 3 has LSO 1. Before, the segment was skipped: its
    transactions were lost and the LSO was the log end, 4 (records past an open transaction)."""
    with _log(tmp_path) as lg:
        seg0 = lg.segments[0]
        cls = type(seg0)
        real = cls.read_batches
        failed = []

        def flaky(self, offset, max_bytes):
            if self is seg0 and not failed:
                failed.append(offset)
                raise SegmentGoneError(f"segment {self.base_offset} removed under the read")
            return real(self, offset, max_bytes)
        monkeypatch.setattr(cls, "read_batches", flaky)
        assert TxnFilter(3).stable_offset(lg) == 1
        assert failed == [0]
        state, mark = open_at(lg, 3)
        assert state == {7: (1, 1)} and mark is not None and mark[0] == 2


def test_a_segment_gone_at_every_attempt_raises_segment_gone(tmp_path, monkeypatch):
    """A segment removed again at every attempt: SegmentGoneError naming the log and the
    offset (a Consumer's poll retries at its next fetch), never an LSO from part of the log."""
    with _log(tmp_path) as lg:
        seg0 = lg.segments[0]
        cls = type(seg0)
        real = cls.read_batches

        def gone(self, offset, max_bytes):
            if self is seg0:
                raise SegmentGoneError("removed")
            return real(self, offset, max_bytes)
        monkeypatch.setattr(cls, "read_batches", gone)
        with pytest.raises(SegmentGoneError, match="offset 3") as e:
            open_at(lg, 3)
        assert lg.dir in str(e.value)


def test_states_kept_below_the_first_segment_are_dropped(tmp_path):
    """States are kept at each segment base a walk passes; once retention (here
    delete_records) removes the segments below one, the states below the new first segment go
    (a long-lived reader keeps one per live segment, not one per segment ever rolled), and
    the transaction open across the move is still known from the state at the new first base."""
    with _log(tmp_path) as lg:
        lg.roll()
        lg.append([(b"a", b"p4", NOW)])
        assert [s.base_offset for s in lg.segments] == [0, 2, 4]
        assert TxnFilter(5).stable_offset(lg) == 1
        assert kept_bases(lg) == [2, 4]
        lg.delete_records(4)
        assert [s.base_offset for s in lg.segments] == [4]
        assert TxnFilter(5).stable_offset(lg) == 4        # pid 7 open below the log start
        assert kept_bases(lg) == [4]
