"""kstore.consumer_access: a Consumer used by two threads at once raises
ConcurrentModificationError in the second (Kafka's ConcurrentModificationException) instead of
racing the first; one thread re-entering (a listener) and threads taking turns are fine."""
import subprocess
import sys
import threading
import time

import pytest

import kstore
from kstore import ConcurrentModificationError, Consumer, TopicPartition as TP
from kstore.consumer_buffer import RecordBuffer
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
        while c._guard.owner is None and time.monotonic() < deadline:    # A is inside
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


def _waiting_for_the_lock(t):
    """Whether thread t's consumer call waits for the consumer's lock (held by another thread)."""
    frame = sys._current_frames().get(t.ident)
    while frame is not None:
        if frame.f_code.co_name == "_wait_for":
            return True
        frame = frame.f_back
    return False


def test_a_call_waiting_for_the_poll_timers_lock_still_keeps_other_threads_out(writer, watchdog):
    """Thread A's position() waits for the consumer's lock, held by another thread as the poll
    timer's eviction holds it; meanwhile the main thread's calls raise
    ConcurrentModificationError naming A (Kafka's acquire(): A is inside), and once the lock is
    free A answers and the main thread's calls work again. A call takes the lock with one
    non-blocking try; only when that fails does it look who holds it."""
    watchdog(60)
    d, _w = writer
    with Consumer(d, auto_offset_reset="earliest") as c:
        c.assign([T0])
        answers: list = []
        held, free = threading.Event(), threading.Event()

        def timer():                       # a stand-in for PollTimer's thread evicting
            with c._lock:
                held.set()
                assert free.wait(30)
        h = threading.Thread(target=timer, name="kstore-poll-timer-stand-in")
        h.start()
        assert held.wait(10)
        a = threading.Thread(target=lambda: answers.append(c.position(T0)), name="thread-a")
        a.start()
        deadline = time.monotonic() + 10
        while not _waiting_for_the_lock(a) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert _waiting_for_the_lock(a)
        for call in (lambda: c.position(T0), c.assignment, lambda: c.seek(T0, 5)):
            with pytest.raises(ConcurrentModificationError, match=f"otherThread\\(id: {a.ident}\\)$"):
                call()
        free.set()
        join_all([h, a], 30)
        assert answers == [0] and c.position(T0) == 0 and c.assignment() == {T0}


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
        while not _waiting_for_the_lock(b) and time.monotonic() < deadline:   # b is inside poll,
            time.sleep(0.001)                                                  # past its checks
        assert _waiting_for_the_lock(b)
        c.close()
    join_all([b], 30)
    assert results == ["This consumer has already been closed."]


CLOSED = "^This consumer has already been closed\\.$"     # Kafka's IllegalStateException message

#: every public method of Consumer that Kafka's acquireAndEnsureOpen() refuses once closed
AFTER_CLOSE = {
    "poll": lambda c: c.poll(), "commit": lambda c: c.commit(), "commit_offsets": lambda c: c.commit({T0: 5}),
    "committed": lambda c: c.committed(T0), "position": lambda c: c.position(T0),
    "seek": lambda c: c.seek(T0, 0), "seek_to_beginning": lambda c: c.seek_to_beginning(T0),
    "seek_to_end": lambda c: c.seek_to_end(), "pause": lambda c: c.pause(T0),
    "resume": lambda c: c.resume(T0), "paused": lambda c: c.paused(),
    "assignment": lambda c: c.assignment(), "subscription": lambda c: c.subscription(),
    "subscribe": lambda c: c.subscribe(["t"]), "unsubscribe": lambda c: c.unsubscribe(),
    "assign": lambda c: c.assign([T0]), "topics": lambda c: c.topics(),
    "partitions_for_topic": lambda c: c.partitions_for_topic("t"),
    "beginning_offsets": lambda c: c.beginning_offsets([T0]), "end_offsets": lambda c: c.end_offsets([T0]),
    "offsets_for_times": lambda c: c.offsets_for_times({T0: 0}),
}


@pytest.mark.parametrize("where", ["same thread", "another thread"])
def test_every_method_of_a_closed_consumer_raises_kafkas_closed_error(writer, watchdog, where):
    """After close() (in this thread or another) every method raises KStoreStateError with
    Kafka's message, iteration ends, close() again and wakeup() return quietly. Before, the
    closing thread's calls passed (end_offsets, topics, assignment... answered) and another
    thread's said 'the consumer is closed' (now one message, Kafka's)."""
    watchdog(60)
    d, w = writer
    c = Consumer(d, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
    c.assign([T0])
    assert c.end_offsets([T0]) == {T0: 100000}
    if where == "same thread":
        c.close()
    else:
        t = threading.Thread(target=c.close)
        t.start()
        join_all([t], 30)
    w.run('m.append_batch("t", 0, [(None, b"after")])')
    answers = {}
    for name, call in AFTER_CLOSE.items():
        try:
            answers[name] = call(c)
        except kstore.KStoreStateError as e:
            answers[name] = str(e)
    assert answers == {name: "This consumer has already been closed." for name in AFTER_CLOSE}
    assert list(c) == []
    with pytest.raises(StopIteration, match=CLOSED):
        next(c)
    assert c.close() is None and c.wakeup() is None and c.close() is None and c.closed
    with pytest.raises(kstore.KStoreStateError, match=CLOSED):
        c.poll()                             # the wakeup() after close raises nothing
    assert kstore.Consumer(d, group_id="g").committed(T0) is None     # nothing was committed


class TracingRLock:
    """The consumer's _lock, telling whether the closing thread's close() found it free
    (got_in) or had to wait for it (reached only): where close() stands, without sleeps."""

    def __init__(self, closer_name):
        self._l = threading.RLock()
        self.closer_name = closer_name
        self.reached, self.got_in = threading.Event(), threading.Event()

    def acquire(self, blocking=True, timeout=-1):
        if threading.current_thread().name == self.closer_name and not self.reached.is_set():
            if self._l.acquire(False):
                self.got_in.set()
                self.reached.set()
                return True
            self.reached.set()
        return self._l.acquire(blocking, timeout)

    def release(self):
        self._l.release()

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


class HookBuffer(RecordBuffer):
    """A RecordBuffer whose truth test, once armed, runs a hook in between (iteration's
    'if buf:' and its 'buf[0]')."""
    hook = None

    def __len__(self):
        n = super().__len__()
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return n


def _inside(c, w, name):
    """Arm the call `name` of c to stop inside (before its read), let another thread's close()
    begin, append 5 records in the writer process, and go on once close() reached the
    consumer's lock (and, if it got the lock, once close() returned). Returns the call, the
    event set once close() returned, and whether close() had returned when the read went on."""
    c._lock = TracingRLock("closer")
    closed, read_after_close = threading.Event(), []

    def closer():
        c.close()
        closed.set()

    def stop_here():
        threading.Thread(target=closer, name="closer").start()
        assert c._lock.reached.wait(10)
        w.run('m.append_batch("t", 0, [(None, b"n%d" % i) for i in range(5)])')
        if c._lock.got_in.is_set():          # nothing kept close() out: it runs to its end
            assert closed.wait(10)
        read_after_close.append(closed.is_set())

    def hooked(orig):
        def call(*a, **kw):
            stop_here()
            return orig(*a, **kw)
        return call
    if name == "end_offsets":
        c._fetcher.end_offset = hooked(c._fetcher.end_offset)
        return lambda: c.end_offsets([T0]), closed, read_after_close
    if name == "position":
        c._fetcher.update_positions = hooked(c._fetcher.update_positions)
        return lambda: c.position(T0), closed, read_after_close
    if name == "committed":
        coord = c._coord()
        coord.fetch_offsets = hooked(coord.fetch_offsets)
        return lambda: c.committed(T0), closed, read_after_close
    buf = c._buffer = HookBuffer()
    it = iter(c)
    first = next(it)
    assert first.offset == 99990
    buf.hook = stop_here
    return lambda: next(it).offset, closed, read_after_close


@pytest.mark.parametrize("name,expected", [("end_offsets", {T0: 100005}), ("position", 100005),
                                           ("committed", 99990), ("iteration", 99991)])
def test_a_call_inside_when_another_thread_closes_answers_then_close_runs(writer, watchdog, name, expected):
    """A thread inside end_offsets, position, committed or iteration's read-ahead when another
    thread's close() begins (the writer process appending meanwhile) answers from the open
    consumer, and that close() runs after it: its commit includes the record returned, and the
    thread's next call says closed. Before, the close ran alongside: iteration's buffered read
    raised IndexError (close emptied the buffer), the others read a closed store."""
    watchdog(60)
    d, w = writer
    c = Consumer(d, group_id="g", auto_offset_reset="latest", max_poll_records=10)
    c.assign([T0])
    if name in ("committed", "iteration"):
        c.commit({T0: 99990})
    call, closed, read_after_close = _inside(c, w, name)
    assert call() == expected and read_after_close == [False]
    assert closed.wait(10) and c.closed
    if name == "iteration":
        with pytest.raises(StopIteration, match=CLOSED):
            call()
    else:
        with pytest.raises(kstore.KStoreStateError, match=CLOSED):
            call()
    want = {"iteration": 99992, "committed": 99990, "position": 100005}.get(name)   # close commits
    assert kstore.Consumer(d, group_id="g").committed(T0) == want


_CLOSE_IN_A_HANDLER = """import os, signal, sys
import kstore
from kstore.group_membership import GroupMember
c = kstore.Consumer(sys.argv[1], "t", group_id="g", auto_offset_reset="earliest", heartbeat_interval_ms=100)
signal.signal(signal.SIGTERM, lambda *_: c.close())
print(sorted((str(tp), len(rs)) for tp, rs in c.poll(timeout_ms=10_000).items()), flush=True)
apply = GroupMember._apply
def signalled_inside(self, state):            # the signal lands while the member's lock is held
    os.kill(os.getpid(), signal.SIGTERM)
    return apply(self, state)
GroupMember._apply = signalled_inside
got = c.poll(timeout_ms=10_000)               # its heartbeat re-reads the group state
print(got, c.closed, flush=True)
try:
    c.poll()
except kstore.KStoreStateError as e:
    print(e)
"""


def test_close_in_a_signal_handler_during_a_poll_closes_once_the_poll_returns(tmp_path, watchdog):
    """A SIGTERM handler calls close() (a common way to stop a consumer) and the signal lands
    while the main thread's poll is inside its group member's heartbeat, the member's lock held
    (another process runs it; a writer appended 10 records). The poll returns {} and the
    consumer is closed on the poll's way out: the records the first poll returned are
    committed, the next poll raises Kafka's closed error. Before, close() ran inside the poll,
    on the same thread: it waited for the member's lock its own poll held, and the process
    hung for good."""
    watchdog(120)
    d = str(tmp_path / "data")
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
        m.append_batch("t", 0, [(None, b"%d" % i) for i in range(10)])
    script = tmp_path / "close_in_a_handler.py"
    script.write_text(_CLOSE_IN_A_HANDLER)
    try:
        r = subprocess.run([sys.executable, str(script), d], capture_output=True, text=True,
                           cwd=str(tmp_path), timeout=30)
        out = (r.returncode, r.stdout, r.stderr)
    except subprocess.TimeoutExpired:
        out = ("hung", "", "")
    assert out == (0, "[('t-0', 10)]\n{} True\nThis consumer has already been closed.\n", "")
    assert Consumer(d, group_id="g").committed(T0) == 10
