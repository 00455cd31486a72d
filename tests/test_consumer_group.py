"""kstore.Consumer in a consumer group (subscribe + group_id, GroupMember underneath): partitions
shared without overlap, the rebalance listener (revoked after the auto-commit, then assigned),
positions from the committed offsets, a member killed with -9 taken over by the others, pattern
subscriptions, and `kstore consume --group`."""
import io
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import kstore
from kstore import Consumer, ConsumerRebalanceListener, TopicPartition as TP
from kstore.group_coordinator import GroupCoordinator
from kstore.tools import cli

FAST = dict(session_timeout_ms=3000, heartbeat_interval_ms=200, auto_offset_reset="earliest")


@pytest.fixture
def store(group_store):
    return group_store


class Recorder(ConsumerRebalanceListener):
    def __init__(self, consumer_ref):
        self.events = []
        self.ref = consumer_ref

    def on_partitions_revoked(self, revoked):
        c = self.ref[0]
        # the auto-commit ran first: the committed offsets are the positions being given up
        self.events.append(("revoked", sorted(revoked), {tp: c.committed(tp) for tp in revoked},
                            {tp: c.position(tp) for tp in revoked}))

    def on_partitions_assigned(self, assigned):
        self.events.append(("assigned", sorted(assigned)))


def poll_until(consumers, cond, seconds=20):
    got = {id(c): {} for c in consumers}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for c in consumers:
            for tp, recs in c.poll(50).items():
                got[id(c)].setdefault(tp, []).extend(r.offset for r in recs)
        if cond():
            return got
    raise AssertionError(f"not reached in {seconds} s: {[sorted(c.assignment()) for c in consumers]}")


def test_two_members_share_partitions_and_resume_from_commits(store, watchdog):
    watchdog(90)
    d, _m = store
    ref1 = [None]
    rec1 = Recorder(ref1)
    c1 = Consumer(d, "t", group_id="g", listener=rec1, max_poll_records=12, **FAST)
    ref1[0] = c1
    try:
        got1 = c1.poll(5000)
        assert c1.assignment() == {TP("t", p) for p in range(4)}
        assert rec1.events == [("assigned", [TP("t", p) for p in range(4)])]
        read1 = {tp: [r.offset for r in v] for tp, v in got1.items()}
        assert sum(map(len, read1.values())) == 12
        c2 = Consumer(d, "t", group_id="g", **FAST)
        try:
            got = poll_until([c1, c2], lambda: len(c1.assignment()) == 2 and len(c2.assignment()) == 2
                             and all(c2.position(tp) == 10 for tp in c2.assignment()))
            assert not c1.assignment() & c2.assignment()
            kind, revoked, committed, positions = rec1.events[1]
            assert kind == "revoked" and len(revoked) == 2 and committed == positions
            assert set(revoked) == c2.assignment()
            # c2 starts each taken partition at c1's commit: no record of it read twice
            for tp in c2.assignment():
                assert got[id(c2)].get(tp, []) == list(range(committed[tp], 10)), (rec1.events, got)
        finally:
            c2.close()
        poll_until([c1], lambda: len(c1.assignment()) == 4)
    finally:
        c1.close()
    with GroupCoordinator([d]) as gc:            # everything read was committed at close
        assert {tp: o.offset for tp, o in gc.fetch_offsets("g").items()} == {TP("t", p): 10 for p in range(4)}


MEMBER = r"""
import sys, kstore
c = kstore.Consumer(sys.argv[1], "t", group_id="g", session_timeout_ms=3000, heartbeat_interval_ms=200,
                    auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=3)
while not c.assignment():
    c.poll(100)
c.commit({tp: 3 for tp in c.assignment()})
print(",".join(sorted(str(tp) for tp in c.assignment())), flush=True)
sys.stdin.read()
"""


def test_a_killed_member_is_taken_over_from_its_commits(store, tmp_path, watchdog):
    watchdog(90)
    d, _m = store
    p = subprocess.Popen([sys.executable, "-c", MEMBER, d], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        first = p.stdout.readline().strip()
        assert first == "t-0,t-1,t-2,t-3"
        with Consumer(d, "t", group_id="g", **FAST) as c:
            c.poll(300)
            assert c.assignment() == set()          # all held by the live member
            os.kill(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
            got = poll_until([c], lambda: len(c.assignment()) == 4
                             and all(c.position(tp) == 10 for tp in c.assignment()))
            # every partition resumed at the dead member's commit (3)
            assert got[id(c)] == {TP("t", p): list(range(3, 10)) for p in range(4)}
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)


def test_pattern_subscription(store, watchdog):
    watchdog(60)
    d, m = store
    m.create_topic("u", 1)
    m.append_batch("u", 0, [(b"k", b"u")])
    m.create_topic("other", 1)
    with Consumer(d, pattern=r"t|u", group_id="gp", **FAST) as c:
        poll_until([c], lambda: len(c.assignment()) == 5)
        assert {tp.topic for tp in c.assignment()} == {"t", "u"}
        c.subscribe(["u"])                         # changed in place: the member rebalances
        poll_until([c], lambda: c.assignment() == {TP("u", 0)})
        assert c.subscription() == {"u"}


def run_cli(*argv):
    out, err = io.BytesIO(), io.StringIO()
    stdout, stderr = sys.stdout, sys.stderr

    class Buf:
        buffer = out
    sys.stdout, sys.stderr = Buf(), err
    try:
        rc = cli.main(list(argv))
    finally:
        sys.stdout, sys.stderr = stdout, stderr
    return rc, out.getvalue(), err.getvalue()


def test_console_consume_group_commits_as_it_goes(store, watchdog):
    watchdog(90)
    d, m = store
    rc, out, err = run_cli("consume", "--log-dirs", d, "--topic", "t", "--group", "cg",
                           "--from-beginning", "--max-messages", "25")
    assert rc == 0 and out.count(b"\n") == 25 and "Processed a total of 25 messages" in err
    rc, out2, err = run_cli("consume", "--log-dirs", d, "--topic", "t", "--group", "cg", "--from-beginning")
    assert rc == 0 and out2.count(b"\n") == 15            # the rest, no record printed twice
    assert sorted((out + out2).split()) == sorted(b"p%d-%d" % (p, i) for p in range(4) for i in range(10))
    m.append_batch("t", 2, [(b"k", b"new")])
    rc, out3, err = run_cli("consume", "--log-dirs", d, "--topic", "t", "--group", "cg")
    assert out3 == b"new\n"
    rc, out4, err = run_cli("consume", "--log-dirs", d, "--topic", "t", "--group", "cg")
    assert out4 == b"" and "Processed a total of 0 messages" in err


def test_chaos_short(tmp_path, watchdog):
    """The chaos run of tests/reliability/test_consumer_group_chaos.py, 10 s."""
    import consumer_chaos
    watchdog(150)
    res = consumer_chaos.run(str(tmp_path), seconds=10, seed=7)
    print(f"chaos 10 s: {res}")
    assert res.kills >= 3 and res.records > 1000


def test_member_threads_in_one_process_read_every_record_exactly_once(tmp_path, watchdog):
    """Three consumers of one group on threads of one process (over the producer's own
    LogManager), joining one after another and one leaving while a producer thread appends:
    graceful rebalances commit before releasing, so every record is read exactly once."""
    from thread_watchdog import join_all
    watchdog(120)
    m = kstore.LogManager(str(tmp_path / "data"))
    m.create_topic("t", 6)
    stop = threading.Event()
    produced = [0]
    reads = []
    errors = []

    def producer():
        i = 0
        while not stop.is_set():
            m.append_batch("t", i % 6, [(b"k", b"%d" % i)] * 5)
            i += 1
            time.sleep(0.005)
        produced[0] = i * 5

    def member(lifetime, delay):
        try:
            time.sleep(delay)
            with Consumer(m, "t", group_id="g", **FAST) as c:
                end = time.monotonic() + lifetime
                while time.monotonic() < end:
                    for tp, recs in c.poll(100).items():
                        reads.extend((tp.partition, r.offset) for r in recs)
        except BaseException as e:
            errors.append(e)

    try:
        threads = [threading.Thread(target=producer)] + [
            threading.Thread(target=member, args=a) for a in ((12, 0), (4, 1), (12, 2))]
        for t in threads:
            t.start()
        time.sleep(6)
        stop.set()
        join_all(threads, 60)
        assert not errors, errors
        ends = {p: m.log("t", p).log_end_offset for p in range(6)}
        assert sum(ends.values()) == produced[0]
        assert len(reads) == len(set(reads))                          # nothing twice
        assert set(reads) == {(p, o) for p, e in ends.items() for o in range(e)}   # everything
    finally:
        stop.set()
        m.close()
