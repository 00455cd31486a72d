"""read_committed.TxnFilter: the last stable offset a reader computes from the log itself, beside
a writer process that compacts what the reader has scanned, and for a reader placed inside a
transaction still open (seek, committed offset, `kstore consume --offset`, AsyncConsumer)."""
import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

import kstore
from kstore import AsyncConsumer, Consumer, TopicPartition as TP
from kstore.read_committed import TxnFilter

from batch_helpers import craft_v2, emptied_marker, txn_batch
from writer_process import WriterProcess

NOW = 1_700_000_000_000
TOPIC = ("{'cleanup.policy': 'compact', 'delete.retention.ms': '0', "
         "'min.cleanable.dirty.ratio': '0.01', 'segment.bytes': '1000'}")


def _commit_and_clean_away(w: WriterProcess) -> None:
    """pid 7's COMMIT, newer values of its key, then cleans (the mock clock moving on between
    them) until its data and then its marker are gone; a record after."""
    w.run(f"lg.append_batches({txn_batch(1, 7, control=1, ts=NOW)!r})",
          "for i in range(5): lg.append([(b'k', b'new%d' % i, NOW)])",
          "lg.roll()")
    for j in range(4):
        w.run("m.clean_now()", "t.sleep(0.01)", f"lg.append([(b'k', b'again{j}', NOW)])", "lg.roll()")
    w.run("lg.append([(b'z', b'tail', NOW)])")


def _every(d: str) -> list:
    with kstore.Log.open(os.path.join(d, "t-0"), read_only=True) as lg:
        return [(r.offset, r.value) for r in lg]


def test_a_transaction_cleaned_away_after_it_was_scanned_open_no_longer_holds_the_reader(tmp_path, watchdog):
    """A read_committed consumer scans pid 7's data while its transaction is open and waits at
    offset 0. The writer commits it, writes newer values of the key and cleans until the data and
    then the marker are gone. The consumer's next polls return what a fresh read of the log
    returns. Before, the transaction stayed open in the consumer's filter (its marker, never
    scanned, was gone): the consumer stayed at offset 0 for good, returning nothing."""
    watchdog(60)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    try:
        w.run(f"m.create_topic('t', 1, {TOPIC})", "lg = m.log('t', 0)",
              f"lg.append_batches({txn_batch(0, 7, [b'v'], ts=NOW)!r})")
        with Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed") as c:
            c.assign([TP("t", 0)])
            assert c.poll(100) == {} and c.position(TP("t", 0)) == 0
            _commit_and_clean_away(w)
            every = _every(d)
            assert [v for _o, v in every] == [b"again2", b"again3", b"tail"]     # marker gone
            got = []
            for _ in range(3):
                for recs in c.poll(200).values():
                    got += [(r.offset, r.value) for r in recs]
            assert sorted(got, key=lambda x: x[0]) == got
            assert got == every
            assert c.position(TP("t", 0)) == every[-1][0] + 1
    finally:
        assert w.close() == 0


def test_consume_follow_read_committed_goes_on_past_a_transaction_cleaned_away(tmp_path, watchdog):
    """The same with `kstore consume --follow --isolation-level read_committed` in a third
    process (stopped, SIGSTOP, while the writer commits and cleans): held at offset 0 by the open
    transaction, it prints every record once the transaction is committed and cleaned away
    (before: nothing, until its timeout)."""
    watchdog(60)
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    try:
        w.run(f"m.create_topic('t', 1, {TOPIC})", "lg = m.log('t', 0)",
              f"lg.append_batches({txn_batch(0, 7, [b'v'], ts=NOW)!r})")
        child = subprocess.Popen([sys.executable, "-m", "kstore", "consume", "--log-dirs", d,
                                  "--topic", "t", "--from-beginning", "--follow", "--print-offset",
                                  "--isolation-level", "read_committed", "--timeout-ms", "3000"],
                                 cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE)
        try:
            time.sleep(1)                    # it reads the open transaction and waits at 0,
            os.kill(child.pid, signal.SIGSTOP)     # stopped while the writer commits and cleans
            try:
                _commit_and_clean_away(w)
            finally:
                os.kill(child.pid, signal.SIGCONT)
            out, err = child.communicate(timeout=30)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
        every = _every(d)
    finally:
        assert w.close() == 0
    assert child.returncode == 0, err
    assert out == b"".join(b"Offset:%d\t%s\n" % (o, v) for o, v in every)
    assert err.endswith(b"Processed a total of 3 messages\n")



def test_a_marker_emptied_by_the_cleaner_ends_the_transaction_a_reader_saw_open(tmp_path):
    """pid 7's data, then a control batch of pid 7 with no records: what a reader that scanned
    the transaction open finds after the cleaner removed its data and emptied its marker (kept as
    its range's last batch), here on disk as such. The transaction is over and was not aborted
    (Kafka's containsAbortMarker): a read_committed consumer reads on, and so does consume.
    Before, both failed: CorruptRecordError "control batch at offset 1 ... has no control key"."""
    d = str(tmp_path / "data")
    os.makedirs(os.path.join(d, "t-0"))
    with open(os.path.join(d, "t-0", "%020d.log" % 0), "wb") as f:
        f.write(txn_batch(0, 7, [b"v"]) + emptied_marker(1, 7) + txn_batch(2, 8, [b"w"])
                + txn_batch(3, 8, control=1) + craft_v2([(0, 0, b"z", b"plain")], 4))
    with Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed") as c:
        c.assign([TP("t", 0)])
        got = []
        for _ in range(3):
            for recs in c.poll(200).values():
                got += [(r.offset, r.value) for r in recs]
        assert got == [(0, b"v"), (2, b"w"), (4, b"plain")]
        assert c.position(TP("t", 0)) == 5
    r = subprocess.run([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                        "--from-beginning", "--isolation-level", "read_committed", "--print-offset"],
                       cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                       capture_output=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, b"Offset:0\tv\nOffset:2\tw\nOffset:4\tplain\n"), r.stderr


def test_a_cut_marker_written_again_as_an_abort_is_found_by_a_reader_that_scanned_past_it(tmp_path):
    """A read_committed consumer (max 1 record a poll) returns plain record 0 and has scanned
    pid 7's data at 1 and COMMIT at 2. The writer truncates to 2 (the COMMIT goes, the
    transaction is open again), writes an ABORT of pid 7 at 2 and a record at 3: the log end is
    past what the consumer scanned again. Its next polls return 3 only, as a fresh read of the
    log. Before, the filter kept what it had scanned (only a log end below it voided that) and
    returned the aborted record 1."""
    d = str(tmp_path / "data")
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"plain", NOW)])
        lg.append_batches(txn_batch(0, 7, [b"v"], ts=NOW) + txn_batch(1, 7, control=1, ts=NOW))
        with Consumer(d, auto_offset_reset="earliest", isolation_level="read_committed",
                      max_poll_records=1) as c:
            c.assign([TP("t", 0)])
            got = [(r.offset, r.value) for recs in c.poll(1000).values() for r in recs]
            assert got == [(0, b"plain")]
            lg.truncate_to(2)
            lg.append_batches(txn_batch(0, 7, control=0, ts=NOW))
            lg.append([(b"b", b"after", NOW)])
            for _ in range(3):
                got += [(r.offset, r.value) for recs in c.poll(200).values() for r in recs]
            assert got == [(0, b"plain"), (3, b"after")]
            assert c.position(TP("t", 0)) == 4


# -- a reader placed inside an open transaction ----------------------------------------------------
T0 = TP("t", 0)


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))


def _polls(c, n=3) -> list:
    got = []
    for _ in range(n):
        got += [(r.offset, r.value) for recs in c.poll(100).values() for r in recs]
    return got


def _cli(d: str, offset: int, cwd: str) -> list:
    """`kstore consume --offset N --isolation-level read_committed` in a child process (a
    read-only reader with no writer state): the (offset, value) pairs it prints."""
    r = subprocess.run([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                        "--partition", "0", "--offset", str(offset), "--isolation-level",
                        "read_committed", "--print-offset"], cwd=cwd, env=_env(),
                       capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    out = []
    for ln in r.stdout.decode().splitlines():
        o, v = ln.split("\t", 1)
        out.append((int(o[len("Offset:"):]), v.encode()))
    assert r.stderr.endswith(b"Processed a total of %d messages\n" % len(out)), r.stderr
    return out


def _async(d: str, offset: int) -> tuple[list, int]:
    async def main():
        async with AsyncConsumer(d, isolation_level="read_committed") as c:
            c.assign([T0])
            c.seek(T0, offset)
            got = []
            for _ in range(3):
                for recs in (await c.getmany(timeout_ms=100)).values():
                    got += [(r.offset, r.value) for r in recs]
            return got, c.consumer.position(T0)
    return asyncio.run(main())


def _read(how: str, d: str, offset: int, cwd: str) -> tuple[list, int | None]:
    """What a read_committed reader placed at offset returns now, and its position after (None
    for the CLI): placed by seek, by a committed offset it resumes from, by --offset, or by an
    AsyncConsumer's seek."""
    if how == "cli":
        return _cli(d, offset, cwd), None
    if how == "async":
        return _async(d, offset)
    if how == "committed":
        with Consumer(d, group_id="g", enable_auto_commit=False) as c:
            c.assign([T0])
            c.commit({T0: offset})
        with Consumer(d, group_id="g", isolation_level="read_committed",
                      enable_auto_commit=False) as c:
            c.assign([T0])
            return _polls(c), c.position(T0)
    with Consumer(d, isolation_level="read_committed") as c:
        c.assign([T0])
        c.seek(T0, offset)
        return _polls(c), c.position(T0)


@pytest.mark.parametrize("how", ["seek", "committed", "cli", "async"])
@pytest.mark.parametrize("outcome", ["commit", "abort"])
def test_a_reader_placed_inside_an_open_transaction_waits_for_its_marker(tmp_path, how, outcome):
    """pid 7's transaction opens at 1 and is still open; plain records and pid 8's committed
    transaction follow. A read_committed reader placed at 2 (after pid 7's first batch, which
    it never reads) returns nothing: the last stable offset is 1, as Kafka's broker computes it
    whatever the fetch offset; end_offsets says 1. Once pid 7's marker is written it returns
    every committed record from 2 (pid 7's at 5 only if committed). Before, the reader never
    saw pid 7's first batch: it returned 2 and 3 at once (past the open transaction)."""
    d = str(tmp_path / "data")
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"p0", NOW)])                                          # 0
        lg.append_batches(txn_batch(0, 7, [b"t7a"], ts=NOW))                     # 1
        lg.append([(b"a", b"p2", NOW)])                                          # 2
        lg.append_batches(txn_batch(0, 8, [b"t8"], ts=NOW) + txn_batch(0, 8, control=1, ts=NOW))
        lg.append_batches(txn_batch(0, 7, [b"t7b"], ts=NOW))                     # 5
        lg.append([(b"a", b"p6", NOW)])                                          # 6
        with Consumer(d, isolation_level="read_committed") as c:
            assert c.end_offsets([T0]) == {T0: 1}
        got, pos = _read(how, d, 2, str(tmp_path))
        assert got == [] and pos in (None, 2)
        lg.append_batches(txn_batch(0, 7, control=1 if outcome == "commit" else 0, ts=NOW))  # 7
        lg.append([(b"a", b"p8", NOW)])                                          # 8
        got, pos = _read(how, d, 2, str(tmp_path))
        t7 = [(5, b"t7b")] if outcome == "commit" else []
        assert got == [(2, b"p2"), (3, b"t8")] + t7 + [(6, b"p6"), (8, b"p8")]
        assert pos in (None, 9)


def test_several_producers_open_hold_the_reader_at_the_earliest(tmp_path):
    """pid 7 opens at 1, pid 8 at 2, pid 9 commits at 3-4, a plain record at 5. Readers at 5
    and 3: nothing while either of 7 and 8 is open (the LSO is 1, then 2 once 7 commits), then
    the committed records from their position once 8 aborts (its record at 2, below both
    positions, is not theirs; a reader at 2 drops it)."""
    d = str(tmp_path / "data")
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"p0", NOW)])
        lg.append_batches(txn_batch(0, 7, [b"t7"], ts=NOW) + txn_batch(0, 8, [b"t8"], ts=NOW)
                          + txn_batch(0, 9, [b"t9"], ts=NOW) + txn_batch(0, 9, control=1, ts=NOW))
        lg.append([(b"a", b"p5", NOW)])
        with Consumer(d, isolation_level="read_committed") as c5, \
                Consumer(d, isolation_level="read_committed") as c3:
            for c, at in ((c5, 5), (c3, 3)):
                c.assign([T0])
                c.seek(T0, at)
            assert (_polls(c5), _polls(c3), c5.end_offsets([T0])) == ([], [], {T0: 1})
            lg.append_batches(txn_batch(0, 7, control=1, ts=NOW))                  # 6
            assert (_polls(c5), _polls(c3), c5.end_offsets([T0])) == ([], [], {T0: 2})
            assert _cli(d, 3, str(tmp_path)) == []
            lg.append_batches(txn_batch(0, 8, control=0, ts=NOW))                  # 7
            lg.append([(b"a", b"p8", NOW)])
            assert _polls(c5) == [(5, b"p5"), (8, b"p8")]
            assert _polls(c3) == [(3, b"t9"), (5, b"p5"), (8, b"p8")]
            assert (c5.position(T0), c3.position(T0), c5.end_offsets([T0])) == (9, 9, {T0: 9})
        assert _cli(d, 2, str(tmp_path)) == [(3, b"t9"), (5, b"p5"), (8, b"p8")]


def test_a_transaction_open_across_segment_rolls(tmp_path):
    """pid 7 opens at 1 in the first segment; plain records fill two more. A reader placed in
    the last segment (a Consumer; a second one, which starts from the state kept at the last
    segment's base; the CLI in another process) returns nothing until pid 7 commits. Then the
    writer truncates to 1 (pid 7's batch goes), writes plain records from 1 and rolls at 2
    again: the state kept at base 2 (pid 7 open) no longer holds (the batch before it
    changed), and a new reader at 3 returns the new records."""
    d = str(tmp_path / "data")
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"p0", NOW)])
        lg.append_batches(txn_batch(0, 7, [b"t7"], ts=NOW))
        lg.roll()
        for i in (2, 3):
            lg.append([(b"a", b"p%d" % i, NOW)])
        lg.roll()
        lg.append([(b"a", b"p4", NOW)])
        assert [s.base_offset for s in lg.segments] == [0, 2, 4]
        assert (_read("seek", d, 4, str(tmp_path)), _read("seek", d, 3, str(tmp_path))) == (([], 4), ([], 3))
        assert _cli(d, 4, str(tmp_path)) == []
        lg.append_batches(txn_batch(0, 7, control=1, ts=NOW))                      # 5
        assert _read("seek", d, 3, str(tmp_path)) == ([(3, b"p3"), (4, b"p4")], 6)
        lg.truncate_to(1)
        lg.append([(b"a", b"n1", NOW)])
        lg.roll()
        for i in (2, 3):
            lg.append([(b"a", b"n%d" % i, NOW)])
        assert [s.base_offset for s in lg.segments] == [0, 2]
        assert _read("seek", d, 3, str(tmp_path)) == ([(3, b"n3")], 4)
        assert _cli(d, 2, str(tmp_path)) == [(2, b"n2"), (3, b"n3")]


def test_a_transaction_open_below_a_log_start_moved_inside_it(tmp_path):
    """pid 7 opens at 1; plain records to 5; delete_records(3) moves the log start inside the
    open transaction (its first batch stays on disk, in the first segment). Kafka keeps the
    transaction open: the LSO is the log start, 3. A reader at 4 (and one reset to the earliest
    offset) returns nothing until pid 7 commits, then the records from its position."""
    d = str(tmp_path / "data")
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"p0", NOW)])
        lg.append_batches(txn_batch(0, 7, [b"t7"], ts=NOW))
        for i in range(2, 6):
            lg.append([(b"a", b"p%d" % i, NOW)])
        lg.delete_records(3)
        assert lg.log_start_offset == 3
        with Consumer(d, isolation_level="read_committed") as c, \
                Consumer(d, isolation_level="read_committed", auto_offset_reset="earliest") as e:
            c.assign([T0])
            c.seek(T0, 4)
            e.assign([T0])
            assert (_polls(c), _polls(e), c.end_offsets([T0])) == ([], [], {T0: 3})
            assert (c.position(T0), e.position(T0)) == (4, 3)
            assert _cli(d, 4, str(tmp_path)) == []
            lg.append_batches(txn_batch(0, 7, control=1, ts=NOW))                  # 6
            lg.append([(b"a", b"p7", NOW)])
            assert _polls(c) == [(4, b"p4"), (5, b"p5"), (7, b"p7")]
            assert _polls(e) == [(3, b"p3"), (4, b"p4"), (5, b"p5"), (7, b"p7")]
        assert _cli(d, 4, str(tmp_path)) == [(4, b"p4"), (5, b"p5"), (7, b"p7")]


def test_a_filter_walks_only_from_the_nearest_kept_segment_base(tmp_path, monkeypatch):
    """The transactions open at a filter's start come from a header walk from the first
    segment, once per log: a later filter on the same log walks only from the base of the
    segment holding its start (the state kept there), and a filter at the first segment's base
    walks nothing. A log of plain records only: LSO = log end."""
    import kstore.txn_prefix
    d = str(tmp_path / "data")
    walked: list[int] = []
    real = kstore.txn_prefix.txn_headers

    def counting(view):
        walked.append(len(view))
        return real(view)
    monkeypatch.setattr(kstore.txn_prefix, "txn_headers", counting)
    with kstore.Log.open(os.path.join(d, "t-0"), {"segment.bytes": 2000}) as lg:
        for i in range(100):
            lg.append([(b"k%d" % i, b"v" * 100, NOW)])
        segs = lg.segments
        assert len(segs) > 5
        end = lg.log_end_offset
        assert TxnFilter(end).stable_offset(lg) == end
        assert sum(walked) == sum(s.size for s in segs[:-1]) + segs[-1].size
        walked.clear()
        assert TxnFilter(segs[-2].base_offset + 2).stable_offset(lg) == end
        assert sum(walked) == segs[-2].size            # from that segment's base only
        walked.clear()
        assert TxnFilter(segs[-1].base_offset).stable_offset(lg) == end and walked == []
        assert TxnFilter(0).stable_offset(lg) == end and walked == []


@pytest.mark.parametrize("where", ["first segment", "a later segment"])
def test_a_producer_walk_lists_every_batch_while_the_log_start_moves(tmp_path, where):
    """producer_batches (a clean's walk of the log) lists every batch from where it starts,
    also when delete_records moves the log start during the walk. Before, the walk went on
    from the new log start: the batches between the old one and the new one, still in the
    first segment, were missed (a clean then took pid 8's COMMIT at 4 for a marker with no
    data and dropped it, leaving its data at 3 for a reader to take for a transaction open at
    the log start for good), and when the segment it was reading was removed meanwhile, the
    walk ended there (a clean then missed every ABORT after it: their data went into the
    dedupe map)."""
    from kstore.read_committed import COMMIT, DATA, producer_batches
    kinds = [(0, 7, DATA), (1, 7, COMMIT), (2, 9, DATA), (3, 8, DATA), (4, 8, COMMIT),
             (5, 9, COMMIT), (6, 7, DATA)]
    with kstore.Log.open(str(tmp_path / "t-0"), {"file.delete.delay.ms": "0"}) as lg:
        for base, pid, kind in kinds:
            lg.append_batches(txn_batch(base, pid, [b"v"] if kind == DATA else (),
                                        control=None if kind == DATA else kind))
            if where == "a later segment" and base == 2:
                lg.roll()                                        # segments at 0, 3
        lg.roll()                                                # and 7 (active)
        if where == "first segment":
            lg.delete_records(1)          # the walk reads below the log start, then from it
        walk = producer_batches(lg, 0)
        got = [next(walk)]
        lg.delete_records(4)
        got += list(walk)
        assert lg.log_start_offset == 4
        assert [(b[0], b[2], b[4]) for b in got] == kinds


def test_a_transaction_truncated_fully_away_at_the_scanned_end_holds_no_reader(tmp_path):
    """pid 7 opens at 1 and never writes again; a reader waits at its LSO, 1, having scanned to
    the log end, 3; truncate_fully_and_start_at(3) deletes every segment (Kafka's producer
    state is cleared: no transaction open), then END at 3. The reader returns END. Before, its
    filter kept pid 7 open (the end had not come down below what it scanned, and its mark was
    below the new log start, so nothing said the log was replaced): the LSO stayed at the log
    start for good. A transaction held below the log start is held only while its first batch
    is still on disk (as a new reader learns it: txn_prefix), before and after the start moved."""
    d = str(tmp_path / "data")
    with kstore.Log.open(os.path.join(d, "t-0")) as lg:
        lg.append([(b"a", b"p0", NOW)])
        lg.append_batches(txn_batch(0, 7, [b"t7"], ts=NOW))                 # 1
        lg.append([(b"a", b"p2", NOW)])
        f = TxnFilter(0)
        with Consumer(d, isolation_level="read_committed", auto_offset_reset="earliest") as c:
            c.assign([T0])
            assert (_polls(c), f.stable_offset(lg)) == ([(0, b"p0")], 1)
            lg.truncate_fully_and_start_at(3)
            lg.append([(b"end", b"END", NOW)])                              # 3
            assert (_polls(c), f.stable_offset(lg)) == ([(3, b"END")], 4)
            assert c.position(T0) == 4
