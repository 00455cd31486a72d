"""read_committed.TxnFilter beside a writer process that compacts: the last stable offset a
reader computes from the log itself, when the cleaner rewrites what the reader has scanned."""
import os
import signal
import subprocess
import sys
import time

import kstore
from kstore import Consumer, TopicPartition as TP

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
