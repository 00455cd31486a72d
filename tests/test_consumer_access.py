"""kstore.consumer_access: a Consumer used by two threads at once raises
ConcurrentModificationError in the second (Kafka's ConcurrentModificationException) instead of
racing the first; one thread re-entering (a listener) and threads taking turns are fine."""
import threading
import time

import pytest

import kstore
from kstore import ConcurrentModificationError, Consumer, TopicPartition as TP
from thread_watchdog import join_all
from writer_process import WriterProcess

T0 = TP("t", 0)


@pytest.fixture
def writer(tmp_path):
    """(log dir, WriterProcess): topic t, 1 partition, 100000 records, owned by another process."""
    d = str(tmp_path / "data")
    w = WriterProcess(d, str(tmp_path))
    w.run('m.create_topic("t", 1, {"segment.bytes": 1 << 24})',
          'for j in range(100): m.append_batch("t", 0, [(None, b"%d" % (j * 1000 + i)) for i in range(1000)])')
    yield d, w
    assert w.close() == 0


def test_a_second_thread_inside_a_poll_raises(writer, watchdog):
    """Thread A sleeps in poll (nothing to read); the main thread's calls raise at once, naming
    both threads; A's poll then returns the record the writer process appends, and the main
    thread uses the consumer after A is done."""
    watchdog(60)
    d, w = writer
    with Consumer(d, auto_offset_reset="latest") as c:
        c.assign([T0])
        assert c.poll() == {} and c.position(T0) == 100000
        got, inside = [], threading.Event()

        def poll_in_a():
            inside.set()
            got.append(c.poll(timeout_ms=20_000))
        a = threading.Thread(target=poll_in_a, name="thread-a")
        a.start()
        inside.wait(10)
        deadline = time.monotonic() + 10
        while c._guard._owner is None and time.monotonic() < deadline:    # A is inside
            time.sleep(0.001)
        for call in (lambda: c.poll(), lambda: c.seek(T0, 0), c.assignment,
                     lambda: c.position(T0), lambda: c.pause(T0), lambda: next(iter(c))):
            with pytest.raises(ConcurrentModificationError,
                               match=r"^Consumer is not safe for multi-threaded access\. currentThread"
                                     r"\(name: MainThread, id: \d+\) otherThread\(id: \d+\)$"):
                call()
        w.run('m.append_batch("t", 0, [(None, b"late")])')
        join_all([a], 30)
        assert [(r.offset, r.value) for r in got[0][T0]] == [(100000, b"late")]
        c.seek(T0, 99999)                    # A is out: the main thread takes its turn
        assert [r.value for r in c.poll(timeout_ms=1000)[T0]] == [b"99999", b"late"]


def test_a_listener_re_enters_in_the_polling_thread(writer):
    """A rebalance listener runs inside poll, in the same thread: its seek and position work."""
    d, _w = writer
    seen = []

    class Listener(kstore.ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            pass

        def on_partitions_assigned(self, assigned):
            for tp in assigned:
                c.seek(tp, 99990)
                seen.append(c.position(tp))
    with Consumer(d, group_id="g", auto_offset_reset="earliest") as c:
        c.subscribe(["t"], listener=Listener())
        recs = c.poll(timeout_ms=5000)[T0]
        assert seen == [99990] and [r.offset for r in recs] == list(range(99990, 100000))


def test_a_seek_from_another_thread_is_never_lost(writer, watchdog):
    """A poller thread reads all the time while the main thread seeks to 0, 300 times: every
    seek either raises ConcurrentModificationError or takes effect (the poller's next records
    start at 0). Before, a poll finishing after the seek wrote its own position over it: the
    seek was lost without a word (about once in 200 trials)."""
    watchdog(120)
    d, _w = writer
    lost = applied = refused = 0
    for _ in range(300):
        with Consumer(d, auto_offset_reset="earliest", max_poll_records=50) as c:
            c.assign([T0])
            c.poll()
            stop, firsts, errors = threading.Event(), [], []

            def poller(c=c, stop=stop, firsts=firsts, errors=errors):
                while not stop.is_set():
                    try:
                        got = c.poll()
                    except ConcurrentModificationError:
                        continue                 # the main thread was inside (its seek)
                    except Exception as e:       # anything else fails the test
                        errors.append(e)
                        return
                    if got:
                        firsts.append(got[T0][0].offset)
            t = threading.Thread(target=poller)
            t.start()
            time.sleep(0.002)
            try:
                c.seek(T0, 0)
            except ConcurrentModificationError:
                refused += 1
            else:
                applied += 1
                deadline = time.monotonic() + 5
                while 0 not in firsts and time.monotonic() < deadline:
                    time.sleep(0.001)
                lost += 0 not in firsts
            stop.set()
            join_all([t], 30)
            assert errors == []
    assert (lost, applied + refused) == (0, 300), (applied, refused)


def test_a_poll_that_waited_for_a_closing_thread_says_closed(writer, watchdog):
    """A poll that arrives while close() runs in another thread (here: close holds the lock a
    poll takes) raises KStoreStateError once it gets in. The old code checked before waiting
    and then polled the closed consumer: it returned records after close() had returned."""
    watchdog(60)
    d, _w = writer
    c = Consumer(d, auto_offset_reset="earliest")
    c.assign([T0])
    results = []

    def poll():
        try:
            results.append(c.poll())
        except kstore.KStoreStateError as e:
            results.append(str(e))
    b = threading.Thread(target=poll)
    with c._lock:                         # what close() holds while it closes
        b.start()
        deadline = time.monotonic() + 10
        while c._guard._owner is None and time.monotonic() < deadline:   # b is inside poll
            time.sleep(0.001)
        time.sleep(0.1)                   # past the entry checks, waiting for the lock
        c.close()
    join_all([b], 30)
    assert results == ["the consumer is closed"]
