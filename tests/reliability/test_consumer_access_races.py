"""A Consumer closed by another thread at an arbitrary point of an iteration or of position and
end_offsets calls, beside a writer process appending: the user thread's calls end only in a
record, an answer, StopIteration or Kafka's closed KStoreStateError (never IndexError, KeyError
or a read of a closed store), and close()'s commit is exactly the position after the last
record the iteration returned."""
import random
import sys
import threading

import kstore
from kstore import Consumer, TopicPartition as TP
from thread_watchdog import join_all
from writer_process import WriterProcess

T0 = TP("t", 0)
CLOSED = "This consumer has already been closed."
ROUNDS = 150


def test_close_from_another_thread_at_random_points(tmp_path, watchdog):
    """150 rounds, thread switches every microsecond (interleavings inside the calls)."""
    watchdog(300)
    old_switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        _rounds(tmp_path)
    finally:
        sys.setswitchinterval(old_switch)


def _rounds(tmp_path):
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    w.run('m.create_topic("t", 1, {"segment.bytes": 1 << 24})',
          'm.append_batch("t", 0, [(None, b"%d" % i) for i in range(5000)])',
          "import threading",                # appends go on in the writer all through the rounds
          'stop = threading.Event(); ap = threading.Thread(target=lambda: [m.append_batch("t", 0, '
          '[(None, b"x")] * 10) for _ in iter(lambda: stop.wait(0.001), True)]); ap.start()')
    rng = random.Random(7)
    outcomes = {"iteration": 0, "calls": 0}
    for r in range(ROUNDS):
        how = "iteration" if r % 2 == 0 else "calls"
        c = Consumer(d, group_id=f"g{r}", auto_offset_reset="earliest", max_poll_records=rng.choice([1, 7, 50]))
        c.assign([T0])
        got, errors, going = [], [], threading.Event()
        stop_at = rng.randrange(1, 200)

        def user(c=c, got=got, errors=errors, going=going, stop_at=stop_at, how=how):
            try:
                if how == "iteration":
                    for rec in c:
                        got.append(rec.offset)
                        if len(got) == stop_at:
                            going.set()
                else:
                    while True:
                        got.append((c.position(T0), c.end_offsets([T0])[T0]))
                        if len(got) == stop_at:
                            going.set()
            except kstore.KStoreStateError as e:
                errors.append(("closed", str(e)) if how == "calls" else repr(e))
            except BaseException as e:       # noqa: BLE001 - the test reports it
                errors.append(repr(e))
            going.set()
        t = threading.Thread(target=user, name="user")
        t.start()
        assert going.wait(30)
        c.close()
        join_all([t], 30)
        if how == "iteration":
            assert errors == [] and got == list(range(len(got))) and len(got) >= stop_at
            assert Consumer(d, group_id=f"g{r}").committed(T0) == len(got)
        else:
            assert errors == [("closed", CLOSED)] and len(got) >= stop_at
            assert all(pos == 0 and end >= 5000 for pos, end in got)
        outcomes[how] += 1
    w.run("stop.set(); ap.join()")
    assert w.close() == 0
    assert outcomes == {"iteration": ROUNDS // 2, "calls": ROUNDS // 2}
