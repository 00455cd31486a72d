"""read_skip.after_empty_read: where every reader goes on after a read that returned no records
(Log iteration, Consumer at both isolation levels, consume), over logs as a cleaner leaves them:
more markers than one read takes followed by records in the same segment, batches emptied or
cut short by compaction, emptied segments. Each reader returns exactly the log's records and
ends at the log end, as Kafka's consumer (its position moves to a batch's nextOffset)."""
import os
import subprocess
import sys

import pytest

import kstore
from kstore import Consumer, TopicPartition as TP
from kstore.read_skip import after_empty_read

from batch_helpers import craft_v2, emptied_marker, txn_batch

MARKERS = (1 << 20) // len(txn_batch(0, 4, control=1)) + 10     # more than one read (1 MiB)


def _write(d: str, files: dict) -> None:
    os.makedirs(os.path.join(d, "t-0"), exist_ok=True)
    for base, data in files.items():
        with open(os.path.join(d, "t-0", "%020d.log" % base), "wb") as f:
            f.write(data)


def _markers_then_records_in_one_segment(d: str) -> int:
    """One segment: a record, MARKERS COMMITs, a gap of 2 and two records; the log end."""
    n = MARKERS
    _write(d, {0: craft_v2([(0, 0, b"a", b"first")], 0)
               + b"".join(txn_batch(1 + i, 4, control=1) for i in range(n))
               + craft_v2([(0, 0, b"b", b"after"), (1, 0, b"c", b"last")], n + 3)})
    return n + 5


def _cut_batches(d: str) -> int:
    """Batches as compaction leaves them: [0..3] keeping 0 and 1 (its last offset kept),
    an emptied segment [4..], a segment of an emptied marker and an emptied data batch
    [6..8]; the log end, 9."""
    _write(d, {0: craft_v2([(0, 0, b"a", b"v0"), (1, 0, b"b", b"v1")], 0, last_delta=3),
               4: b"",
               6: emptied_marker(6, 4) + craft_v2([], 7, last_delta=1)})
    return 9


def _consume(d: str, tmp_path, *args: str) -> bytes:
    r = subprocess.run([sys.executable, "-m", "kstore", "consume", "--log-dirs", d, "--topic", "t",
                        "--print-offset", *args], cwd=str(tmp_path), capture_output=True, timeout=60,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert r.returncode == 0, r.stderr
    return r.stdout


def _poll_all(d: str, iso: str, start: int = 0) -> tuple[list, int]:
    with Consumer(d, auto_offset_reset="earliest", isolation_level=iso) as c:
        c.assign([TP("t", 0)])
        c.seek(TP("t", 0), start)
        got: list = []
        for _ in range(4):
            for recs in c.poll(200).values():
                got += [(r.offset, r.value) for r in recs]
        return got, c.position(TP("t", 0))


def test_iteration_goes_past_more_markers_than_a_read_to_records_of_the_same_segment(tmp_path):
    """Before, Log iteration took the read of markers only for a segment's empty tail and went
    on to the next segment: with one segment, it ended after "first"."""
    d = str(tmp_path / "s")
    end = _markers_then_records_in_one_segment(d)
    want = [(0, b"first"), (end - 2, b"after"), (end - 1, b"last")]
    with kstore.Log.open(os.path.join(d, "t-0"), read_only=True) as lg:
        assert lg.log_end_offset == end
        assert [(r.offset, r.value) for r in lg] == want
        assert [(r.offset, r.value) for c in lg.iter_chunks(1) for r in c] == want[1:]


@pytest.mark.parametrize("iso", ["read_uncommitted", "read_committed"])
def test_consumers_go_past_more_markers_than_a_read(tmp_path, iso):
    d = str(tmp_path / "s")
    end = _markers_then_records_in_one_segment(d)
    assert _poll_all(d, iso) == ([(0, b"first"), (end - 2, b"after"), (end - 1, b"last")], end)
    assert _consume(d, tmp_path, "--from-beginning", "--isolation-level", iso) == \
        b"Offset:0\tfirst\nOffset:%d\tafter\nOffset:%d\tlast\n" % (end - 2, end - 1)


@pytest.mark.parametrize("iso", ["read_uncommitted", "read_committed"])
def test_a_consumer_ends_at_the_log_end_past_batches_compaction_cut_or_emptied(tmp_path, iso):
    """After the last record the position is the log end (9), as Kafka's consumer's, from
    every start. Before, it stayed at 2 (in the batch whose last records were cleaned away) or
    at 7 (at the emptied data batch): a group's lag never reached 0."""
    d = str(tmp_path / "s")
    end = _cut_batches(d)
    every = [(0, b"v0"), (1, b"v1")]
    for start in range(end + 1):
        assert _poll_all(d, iso, start) == ([x for x in every if x[0] >= start], end), start


def test_after_empty_read_never_passes_what_the_read_could_not_see(tmp_path):
    """A batch appended after the read (at or past the end it saw) is never passed over: the
    result stops at that end; a data batch is passed only when it holds pos."""
    d = str(tmp_path / "s")
    end = _cut_batches(d)
    with kstore.Log.open(os.path.join(d, "t-0"), read_only=True) as lg:
        assert after_empty_read(lg, 2, end) == end
        assert after_empty_read(lg, 2, 6) == 4            # the read saw up to 6 only
        assert after_empty_read(lg, 0, end) == 0          # records at 0 (a data batch from pos)
        assert after_empty_read(lg, 6, end) == end
        assert after_empty_read(lg, 6, 7) == 7
        assert after_empty_read(lg, end, end) == end
    with kstore.Log.open(os.path.join(tmp_path, "w"), {}) as lg:
        lg.append([(b"k", b"v")])
        assert after_empty_read(lg, 0, 0) == 0            # appended after a read at the end
        assert after_empty_read(lg, 1, 1) == 1


@pytest.mark.parametrize("iso", ["read_uncommitted", "read_committed"])
def test_consume_group_without_follow_ends_after_batches_compaction_cut(tmp_path, iso):
    """`consume --group` without --follow stops once its positions reach the end offsets: it
    printed both records and then never exited (its position stayed at 2 or 7, below the end,
    9), until killed."""
    d = str(tmp_path / "s")
    _cut_batches(d)
    out = _consume(d, tmp_path, "--group", "g", "--from-beginning", "--isolation-level", iso)
    assert out == b"Offset:0\tv0\nOffset:1\tv1\n"


def test_fetch_returns_the_records_and_the_offset_to_read_next(tmp_path):
    """Log.fetch: after records, the offset past the last one; after a read that returned none,
    past the markers, emptied batches and gaps it passed over (the log end if nothing is left)."""
    d = str(tmp_path / "cut")
    end = _cut_batches(d)
    with kstore.Log.open(os.path.join(d, "t-0"), read_only=True) as lg:
        got = [(start, [r.offset for r in recs], nxt)
               for start in range(end + 1) for recs, nxt in [lg.fetch(start)]]
        assert got == [(0, [0, 1], 2), (1, [1], 2)] + [(s, [], end) for s in range(2, end + 1)]
        assert [(r.offset, n) for recs, n in [lg.fetch(0, 1)] for r in recs] == [(0, 1)]
    d = str(tmp_path / "markers")
    end = _markers_then_records_in_one_segment(d)
    with kstore.Log.open(os.path.join(d, "t-0"), read_only=True) as lg:
        recs, nxt = lg.fetch(1, max_bytes=100)         # markers are outside the budget
        assert ([(r.offset, r.value) for r in recs], nxt) == ([(end - 2, b"after"),
                                                              (end - 1, b"last")], end)


WRITER = r"""
import sys, time
import kstore
sys.path.insert(0, sys.argv[2])
from batch_helpers import txn_batch
with kstore.Log.open(sys.argv[1], {}) as lg:
    lg.append([(b"k", b"plain")])
    lg.append_batches(txn_batch(0, 7, [b"t1", b"t2"]) + txn_batch(0, 7, control=1))
    print("markers", flush=True)
    sys.stdin.readline()
    lg.append([(b"k", b"after")])
    print("appended", flush=True)
    sys.stdin.readline()
"""


def test_a_fetch_tail_loop_sleeps_while_the_log_ends_in_markers(tmp_path, watchdog):
    """A `records, pos = fetch(pos)` + `wait_for(pos)` loop in this process, beside a writer
    process whose log ends in a COMMIT marker: the loop waits at the log end (a handful of
    turns while the writer holds still) and wakes for the next record. A read() loop's pos
    stays at the marker, below the log end, so its wait_for returned at once: a busy core."""
    d = str(tmp_path / "t-0")
    here = os.path.dirname(os.path.abspath(__file__))
    with watchdog(60):
        # cwd: not the checkout, whose kstore/ (uncompiled in CI) `-c` would import first
        w = subprocess.Popen([sys.executable, "-c", WRITER, d, here], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, cwd=str(tmp_path),
                             env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
        try:
            assert w.stdout.readline() == b"markers\n"
            with kstore.Log.open(d, read_only=True) as lg:
                pos, got, turns = 0, [], 0
                while len(got) < 4:
                    recs, pos = lg.fetch(pos)
                    got += [(r.offset, r.value) for r in recs]
                    if recs:
                        continue
                    assert pos == lg.log_end_offset == 4
                    turns += 1
                    if turns == 3:          # asleep at the end: now the writer appends
                        w.stdin.write(b"go\n")
                        w.stdin.flush()
                        assert w.stdout.readline() == b"appended\n"
                    assert lg.wait_for(pos, 0.5) == (turns >= 3), turns
                assert got == [(0, b"plain"), (1, b"t1"), (2, b"t2"), (4, b"after")]
                assert turns == 3
        finally:
            w.stdin.close()
            w.wait(30)


def test_a_fetch_that_a_truncation_cuts_under_stays_at_the_new_end(tmp_path, monkeypatch):
    """A truncation between fetch's look at the log end (10) and its read (at 5, now the end)
    leaves the read empty and no batch at or after 5. fetch used to return the old end, 10, as
    if records 5..9 had been passed over: a tail loop then waited past the offsets the next
    appends take and never returned those records. The offset to read next is 5 (nothing was
    passed: the next read decides), and the loop gets the records appended there."""
    with kstore.Log.open(str(tmp_path / "t-0"), {}) as lg:
        for i in range(10):
            lg.append([(b"k", b"old%d" % i)])
        read, cut = lg.read, []

        def truncated_first(*args, **kw):
            if not cut:
                cut.append(lg.truncate_to(5))
            return read(*args, **kw)
        monkeypatch.setattr(lg, "read", truncated_first)
        assert lg.fetch(5) == ([], 5) and cut == [True] and lg.log_end_offset == 5
        for i in range(3):
            lg.append([(b"k", b"new%d" % i)])
        recs, nxt = lg.fetch(5)
        assert ([(r.offset, r.value) for r in recs], nxt) == (
            [(5, b"new0"), (6, b"new1"), (7, b"new2")], 8)
