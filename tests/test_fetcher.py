"""fetcher.Fetcher: a read_committed fetch cuts the records it read at a last stable offset
found before the read, never at one of the log as it is after the read."""
import os

import kstore
from kstore import Consumer, TopicPartition as TP, _core
from kstore.log import Log

from batch_helpers import txn_batch

NOW = 1_700_000_000_000


def test_read_committed_cuts_at_the_stable_offset_found_before_the_read(tmp_path, monkeypatch):
    """Plain record 0, then pid 7's open transaction (data at 1): a read_committed consumer
    returns 0 and waits at 1. Its next read at 1 returns pid 7's record; then, before the fetch
    goes on, the writer truncates to 1 (the open transaction is gone, never committed) and
    appends a plain record there, and the reader's log learns it (as a read's own refresh
    does). The poll returns nothing of pid 7, and the next ones the new record at 1. Before,
    the stable offset was found after the read, in the new log (2, no transaction open), and
    the poll returned pid 7's record."""
    d = str(tmp_path / "data")
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"plain", NOW)])
        lg.append_batches(txn_batch(0, 7, [b"open"], ts=NOW))
        real = _core.read_records
        cut = []

        def read(self, offset, *args, **kw):
            recs = real(self, offset, *args, **kw)
            if self.read_only and offset == 1 and not cut:
                cut.append(recs)
                lg.truncate_to(1)
                lg.append([(b"b", b"new", NOW)])
                self.refresh()
            return recs

        with Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed") as c:
            c.assign([TP("t", 0)])
            got = [(r.offset, r.value) for recs in c.poll(1000).values() for r in recs]
            assert got == [(0, b"plain")]
            monkeypatch.setattr(Log, "read", read)
            for _ in range(3):
                got += [(r.offset, r.value) for recs in c.poll(200).values() for r in recs]
            assert [r.value for r in cut[0]] == [b"open"]            # the read did return it
            assert got == [(0, b"plain"), (1, b"new")]
            assert c.position(TP("t", 0)) == 2


def test_offsets_for_times_under_read_committed_stops_at_the_last_stable_offset(tmp_path):
    """A plain record at 0 (time NOW), pid 7's transaction open at 1 (NOW + 1), a plain record
    at 2 (NOW + 2). Kafka's ListOffsets at READ_COMMITTED answers only offsets below the last
    stable offset (1): the times of 1 and 2 find nothing, as end_offsets says 1; at
    read_uncommitted they find 1 and 2. Once pid 7 commits, read_committed finds them too.
    Before, read_committed answered 1 and 2 while the transaction was open."""
    d = str(tmp_path / "data")
    tp = TP("t", 0)
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"p0", NOW)])
        lg.append_batches(txn_batch(0, 7, [b"t7"], ts=NOW + 1))
        lg.append([(b"a", b"p2", NOW + 2)])
        with Consumer(d, isolation_level="read_committed") as rc, Consumer(d) as ru:
            def ask(c):
                out = [c.offsets_for_times({tp: ts})[tp] for ts in (NOW, NOW + 1, NOW + 2)]
                return [None if o is None else (o.offset, o.timestamp) for o in out]
            assert ask(rc) == [(0, NOW), None, None] and rc.end_offsets([tp]) == {tp: 1}
            assert ask(ru) == [(0, NOW), (1, NOW + 1), (2, NOW + 2)]
            lg.append_batches(txn_batch(0, 7, control=1, ts=NOW + 3))
            assert ask(rc) == [(0, NOW), (1, NOW + 1), (2, NOW + 2)]
