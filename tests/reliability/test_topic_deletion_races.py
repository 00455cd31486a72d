"""kstore.topic_deletion beside other work (reliability tier): a deletion tail of topic A that
fails, then succeeds, retried by the running LogManager's scheduler while threads append to B
(retention by retention.bytes) and C (compacted by the cleaner's threads), and a consumer group
in another process reads B and C and auto-commits through the same __consumer_offsets flocks the
tombstoning takes. Every outcome is checked exactly; the watchdog bounds the whole test."""
from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import threading
import time

from thread_watchdog import join_all

from kstore import LogManager, TopicPartition as TP
from kstore.group_coordinator import GroupCoordinator
from kstore.topics import TopicConfigFile

GENEROUS_S = 60
FAILS = 3                    # the tails that fail: delete_topic's and the first two retries
PAD = b"." * 80              # each value: its topic, partition and offset, then this

BROKER = {"log.initial.task.delay.ms": 0, "log.segment.delete.delay.ms": 1000,    # a retry each second
          "log.retention.check.interval.ms": 50, "log.cleaner.backoff.ms": 50,
          "log.cleaner.threads": 2}
B_CONFIG = {"segment.bytes": 8000, "retention.bytes": 24000}
C_CONFIG = {"segment.bytes": 8000, "cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01}

READER = r"""
import json, sys, threading, kstore
from kstore import TopicPartition as TP
c = kstore.Consumer(sys.argv[1], "B", "C", group_id="readers", auto_offset_reset="earliest",
                    auto_commit_interval_ms=100, heartbeat_interval_ms=200)
ends, bad, read = {}, [], {}
stop = threading.Event()

def wait_for_ends():
    ends.update(json.loads(sys.stdin.readline()))
    stop.set()
threading.Thread(target=wait_for_ends, daemon=True).start()
print("reading", flush=True)
while True:
    for tp, rs in c.poll(timeout_ms=100).items():
        for r in rs:
            read[f"{tp.topic}-{tp.partition}"] = read.get(f"{tp.topic}-{tp.partition}", 0) + 1
            if r.value != b"%s%d-%d" % (tp.topic.encode(), tp.partition, r.offset) + b"." * 80:
                bad.append([tp.topic, tp.partition, r.offset])
    if stop.is_set() and {f"{tp.topic}-{tp.partition}": c.position(tp) for tp in c.assignment()} == ends:
        break
c.commit()
c.close()
print(json.dumps({"bad": bad, "read": read}), flush=True)
"""


def _value(topic: str, p: int, offset: int) -> bytes:
    return b"%s%d-%d" % (topic.encode(), p, offset) + PAD


def _pending(m: LogManager) -> list[str]:
    doc = TopicConfigFile.read(m.log_dirs)
    return doc.deleting if doc is not None else []


def _records(m: LogManager, topic: str, p: int) -> list[tuple[int, bytes, bytes]]:
    lg = m.log(topic, p)
    return [(r.offset, r.key, r.value) for chunk in lg.iter_chunks(lg.log_start_offset) for r in chunk]


def _appender(m: LogManager, topic: str, parts: int, ts: int, stop: threading.Event,
              counts: dict, batches: list) -> None:
    """Batches of 5 records to each partition in turn until stop; one appender per partition,
    so the i-th record of a partition is at offset i (its value says so). Keys k0..k9 (C's
    compaction keeps the latest of each)."""
    n = [0] * parts
    while not stop.is_set():
        for p in range(parts):
            recs = [(b"k%d" % ((n[p] + i) % 10), _value(topic, p, n[p] + i), ts) for i in range(5)]
            info = m.append_batch(topic, p, recs)
            assert info.first_offset == n[p], (topic, p, info.first_offset, n[p])
            batches.append((p, recs))
            n[p] += 5
        time.sleep(0.002)
    counts.update({(topic, p): n[p] for p in range(parts)})


def test_a_deletion_retried_beside_appends_retention_compaction_and_a_consumer_group(
        tmp_path, monkeypatch, watchdog, caplog):
    """A's tail fails FAILS times (EIO tombstoning its groups' offsets: delete_topic's, then
    the retry task's, every second) and then succeeds, while B and C take appends, B's old
    segments go by retention.bytes, C is compacted, and group readers in another process reads
    B and C and auto-commits. Exactly FAILS + 1 tails run; the deletion then completes: no
    group keeps an offset of A, A is created again empty; B holds exactly the records a
    replay of its appends into a quiet store keeps, from its start to its end, each at its
    offset; C holds, below its active segment, the latest record of each key and every
    record of the active segment, at their offsets; readers committed B's and C's ends and
    read no wrong value."""
    watchdog(240)
    caplog.set_level(logging.INFO, logger="kstore")
    d, ref = str(tmp_path / "data"), str(tmp_path / "ref")
    ts = int(time.time() * 1000)
    calls: list = []
    real = GroupCoordinator.on_topics_deleted

    def failing_then_real(self, topics, **kw):
        calls.append((threading.current_thread().name, list(topics)))
        if len(calls) <= FAILS:
            raise OSError(errno.EIO, "injected: tombstoning failed")
        return real(self, topics, **kw)
    monkeypatch.setattr(GroupCoordinator, "on_topics_deleted", failing_then_real)
    m = LogManager(d, BROKER)
    reader = None
    try:
        m.create_topic("A", 2)
        m.create_topic("B", 2, B_CONFIG)
        m.create_topic("C", 1, C_CONFIG)
        for p in range(2):
            m.append_batch("A", p, [(None, _value("A", p, i), ts) for i in range(20)])
        with GroupCoordinator(m) as gc:
            gc.commit_offsets("ga", {TP("A", 0): 20, TP("A", 1): 7})
            gc.commit_offsets("readers", {TP("A", 0): 3})
        reader = subprocess.Popen([sys.executable, "-c", READER, d], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=str(tmp_path), env=dict(os.environ))
        assert reader.stdout is not None and reader.stdout.readline() == "reading\n"
        stop = threading.Event()
        counts: dict = {}
        b_batches: list = []
        threads = [threading.Thread(target=_appender, args=(m, "B", 2, ts, stop, counts, b_batches),
                                    name="append-B"),
                   threading.Thread(target=_appender, args=(m, "C", 1, ts, stop, counts, []),
                                    name="append-C")]
        for t in threads:
            t.start()
        time.sleep(0.5)                            # appends, retention and cleaning under way
        m.delete_topic("A")
        assert _pending(m) == ["A"] and m.topics() == ["B", "C"]
        deadline = time.monotonic() + GENEROUS_S
        while _pending(m) and time.monotonic() < deadline:
            time.sleep(0.05)                       # the retry task's beats
        assert _pending(m) == [] and len(calls) == FAILS + 1, calls
        assert all(name.startswith("kstore-scheduler") for name, _ in calls[1:]), calls
        m.create_topic("A", 2)
        time.sleep(0.5)                            # more of the others' work after it
        stop.set()
        join_all(threads, GENEROUS_S)
        m.cleanup_logs()                           # settle: what the tasks would do next
        m.clean_now()
        ends = {f"{t}-{p}": n for (t, p), n in counts.items()}
        assert reader.stdin is not None
        reader.stdin.write(json.dumps(ends) + "\n")
        reader.stdin.flush()
        out, err = reader.communicate(timeout=GENEROUS_S)
        assert reader.returncode == 0, err
        got = json.loads(out)
        assert got["bad"] == [] and set(got["read"]) == set(ends)

        assert m.topics() == ["A", "B", "C"]
        assert [m.log("A", p).log_end_offset for p in range(2)] == [0, 0]
        with GroupCoordinator(m) as gc:
            groups = gc.list_groups()
            left = {g: gc.fetch_offsets(g) for g in groups}
        assert "ga" not in groups and all(tp.topic != "A" for offs in left.values() for tp in offs)
        assert {f"{tp.topic}-{tp.partition}": o.offset for tp, o in left["readers"].items()} == ends

        with LogManager(ref, {**BROKER, "log.retention.check.interval.ms": 3_600_000,
                              "log.cleaner.enable": False}) as r:
            r.create_topic("B", 2, B_CONFIG)
            for p, recs in b_batches:
                r.append_batch("B", p, recs)
            r.cleanup_logs()
            for p in range(2):
                want = _records(r, "B", p)
                got_b = _records(m, "B", p)
                assert got_b == want
                start = m.log("B", p).log_start_offset
                assert 0 < start and [o for o, _k, _v in got_b] == list(range(start, counts[("B", p)]))
                assert all(v == _value("B", p, o) for o, _k, v in got_b)

        lg = m.log("C", 0)
        active = lg.segments[-1].base_offset
        n = counts[("C", 0)]
        latest = {}
        for o in range(active):
            latest[b"k%d" % (o % 10)] = o
        want_c = sorted(latest.values()) + list(range(active, n))
        assert 0 < active and [o for o, _k, _v in _records(m, "C", 0)] == want_c
        assert all(v == _value("C", 0, o) and k == b"k%d" % (o % 10) for o, k, v in _records(m, "C", 0))
        assert not m.uncleanable_partitions()
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait(timeout=30)
        m.close()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == ["topic(s) ['A'] deleted but their committed offsets could not be removed: "
                      "[Errno 5] injected: tombstoning failed"] * FAILS
