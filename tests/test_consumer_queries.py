"""kstore/consumer_queries.py: beginning_offsets, end_offsets and offsets_for_times of a partition
on an offline log dir retry, as Kafka's consumer retries KAFKA_STORAGE_ERROR, until their
timeout (default_api_timeout_ms), then raise ApiTimeoutError; wakeup() and close() end the wait.

kstore cannot bring an offline dir back (a LogManager's dir stays offline until it is reopened,
and a Consumer keeps its manager), so no test sees a retry succeed."""
import errno
import threading
import time

import pytest

from kstore import ApiTimeoutError, Consumer, LogManager, OffsetAndTimestamp, TopicPartition as TP
from kstore.errors import InvalidConfigError, KStoreStateError, WakeupError

from thread_watchdog import join_all

NOW = 1_700_000_000_000


@pytest.fixture
def split(tmp_path):
    """A manager of two dirs, topic t (4 partitions, 5 records each at NOW + i), whose first
    dir is offline; (manager, offline partitions, online partitions)."""
    d1, d2 = str(tmp_path / "d1"), str(tmp_path / "d2")
    m = LogManager([d1, d2])
    m.create_topic("t", 4)
    for p in range(4):
        m.append_batch("t", p, [(b"k%d" % i, b"v", NOW + i) for i in range(5)])
    off = [p for p in range(4) if m.log_dir_of("t", p) == d1]
    on = [p for p in range(4) if p not in off]
    assert off and on
    m.log_dir_failure_channel.mark_offline(d1, OSError(errno.EIO, "Input/output error (injected)"))
    yield m, off, on
    m.close()


def _appending(m, on, stop):
    """Appends to the online partitions until stop: the queries run beside a writer."""
    while not stop.is_set():
        for q in on:
            m.append("t", b"x", b"v", partition=q, timestamp=NOW + 100)


def test_an_offline_partition_times_out_after_the_timeout(split, watchdog):
    """Before, each query raised LogDirOfflineError at once. Kafka's fetchOffsetsByTimes retries
    a KAFKA_STORAGE_ERROR until its timer runs out, then throws TimeoutException ("Failed to
    get offsets by times in Nms"): so here, for the call's timeout_ms or the consumer's
    default_api_timeout_ms, naming the offline partition; a query of online partitions alone
    answers, beside a thread that appends to them."""
    watchdog(60)
    m, off, on = split
    p, q = off[0], on[0]
    stop = threading.Event()
    writer = threading.Thread(target=_appending, args=(m, on, stop), daemon=True)
    writer.start()
    why = rf"Failed to get offsets by times in \d+ms: t-{p}: partition t-{p} is offline: its log dir"
    try:
        with Consumer(m, default_api_timeout_ms=300) as c:
            queries = [lambda **kw: c.beginning_offsets([TP("t", p), TP("t", q)], **kw),
                       lambda **kw: c.end_offsets([TP("t", q), TP("t", p)], **kw),
                       lambda **kw: c.offsets_for_times({TP("t", p): NOW, TP("t", q): NOW}, **kw)]
            for query in queries:
                for kw, bound in (({}, 0.3), ({"timeout_ms": 200}, 0.2), ({"timeout_ms": 0}, 0)):
                    t0 = time.monotonic()
                    with pytest.raises(ApiTimeoutError, match=why):
                        query(**kw)
                    assert time.monotonic() - t0 >= bound     # never before the timeout
            assert c.beginning_offsets([TP("t", q)]) == {TP("t", q): 0}
            assert c.offsets_for_times({TP("t", q): NOW + 2}) == {TP("t", q): OffsetAndTimestamp(2, NOW + 2)}
            stop.set()
            join_all([writer], 30)
            assert c.end_offsets([TP("t", x) for x in on]) == {
                TP("t", x): m.log("t", x).log_end_offset for x in on}
            for bad in (-1, "1", True, float("nan")):
                with pytest.raises(InvalidConfigError, match="timeout_ms must be a number"):
                    c.end_offsets([TP("t", q)], timeout_ms=bad)
    finally:
        stop.set()
        join_all([writer], 30)


@pytest.mark.parametrize("how", ["wakeup", "close"])
def test_wakeup_or_close_ends_the_retries(split, how, watchdog):
    """A query waiting for an offline partition sleeps on the consumer's bell, as a poll does:
    wakeup() from another thread ends it with WakeupError (once: the next query answers), a
    close() from another thread with KStoreStateError, long before its 60 s timeout (the
watchdog's 60 s bound the test)."""
    watchdog(60)
    m, off, on = split
    c = Consumer(m)
    started = threading.Event()
    begin = c._fetcher.offset_for_policy

    def counted(tp, policy):                 # says when the query has begun its retries
        started.set()
        return begin(tp, policy)
    c._fetcher.offset_for_policy = counted
    stopper = threading.Thread(target=lambda: (started.wait(30), time.sleep(0.2),
                                               c.wakeup() if how == "wakeup" else c.close()))
    stopper.start()
    with pytest.raises(WakeupError if how == "wakeup" else KStoreStateError):
        c.beginning_offsets([TP("t", on[0]), TP("t", off[0])], timeout_ms=60000)
    join_all([stopper], 30)
    if how == "wakeup":
        assert c.beginning_offsets([TP("t", on[0])]) == {TP("t", on[0]): 0}
    c.close()
