"""Threads sharing one Log or one LogManager topic (issue 12, "Tests that stay"): appenders race
readers (read with small max_bytes, iter_chunks, read_batches, read_columns,
offset_for_timestamp), flush, roll, truncate_to, delete_records, retention, the cleaner (clean_now
and two background threads) and topic creation and deletion.

Every record's value names its writer and sequence number (b"w1:37"), so the checks are exact:
each acknowledged record is read back exactly once at the offset its append returned, unless a
truncation or a log-start move that the mutating threads recorded removed it; offsets are dense
where nothing was removed (compacted topics: each key's latest value, against a model); a read
returns a contiguous run of offsets starting at the one asked for; nothing but the documented
kstore errors is raised; nothing hangs (a watchdog dumps every thread's stack).

A failure message starts with the defect class: LOST, WRONG, SKIP, REPEAT, EMPTY READ,
UNEXPECTED EXCEPTION, OFFLINE, ERROR LOGGED, or "threads still running" (a hang, with stacks).

In-process read-only readers beside a truncating writer are left to test_soak_concurrent.py (in
this directory): a SIGBUS there would kill the whole test run instead of one reader process."""
from __future__ import annotations

import logging
import random
import struct
import time

import pytest

import kstore
from kstore import _core
from race_harness import (Acked, ErrorLogs, Race, appender, chaser, check_batches, check_compacted,
                          check_dense_exact, check_manager_healthy, check_seen, column_values,
                          final_records, single_appender)

SECONDS = 3.0          # how long the threads of each test race
COUNTS = {"tests": 0, "threads": 0, "seconds": 0.0, "records_acked": 0, "records_read": 0,
          "records_lost": 0, "hangs": 0}


@pytest.fixture(scope="module", autouse=True)
def _file_counts(reliability_counts):
    """The figures of the races that passed, for the README's Reliability table."""
    yield
    if COUNTS["tests"]:
        reliability_counts["concurrency"] = dict(COUNTS, seconds=round(COUNTS["seconds"], 1))


def tally(race: Race, *acked: Acked) -> None:
    """Count a race whose every check passed."""
    COUNTS["tests"] += 1
    COUNTS["threads"] += len(race.threads)
    COUNTS["seconds"] += race.seconds
    COUNTS["records_read"] += race.reads
    COUNTS["records_acked"] += sum(len(a.at) for a in acked)


# -- one Log ----------------------------------------------------------------------------------
LOG_CFG = {"segment.bytes": 2048, "index.interval.bytes": 128, "segment.index.bytes": 4096}


def test_log_flush_beside_appends_and_rolls(tmp_path, watchdog):
    """flush() in two threads while three others append (rolling small segments) and one rolls
    explicitly: no deadlock; the log holds exactly the acknowledged records, densely, and the
    recovery point reaches the log end."""
    watchdog(90)
    lg = kstore.Log.open(str(tmp_path / "t-0"), LOG_CFG)
    race, acked = Race(), Acked()
    for w in range(3):
        race.spawn(f"appender-{w}", appender(race, acked, lg.append, w, seed=1), pause=0.0002)
    race.spawn("flusher-0", lg.flush, pause=0.001)
    race.spawn("flusher-1", lambda: lg.flush(max(0, lg.log_end_offset - 3)), pause=0.001)
    race.spawn("roller", lambda: lg.roll(), pause=0.005)
    race.run(SECONDS)
    race.check()
    check_dense_exact(lg, acked)
    lg.flush()
    assert lg.recovery_point == lg.log_end_offset
    lg.close()
    with kstore.Log.open(str(tmp_path / "t-0"), LOG_CFG) as again:
        check_dense_exact(again, acked)
    tally(race, acked)


def test_log_readers_of_every_kind_beside_appends_and_rolls(tmp_path, watchdog):
    """Three appenders and a roller against readers of every kind (read with small max_bytes,
    iter_chunks, read_batches, read_columns, offset_for_timestamp): every read is a contiguous
    run from its offset; each acknowledged record is read exactly once, exactly."""
    watchdog(90)
    lg = kstore.Log.open(str(tmp_path / "t-0"), LOG_CFG)
    race, acked = Race(), Acked()
    for w in range(3):
        race.spawn(f"appender-{w}", appender(race, acked, lg.append, w), pause=0.0005)
    race.spawn("roller", lambda: lg.roll(), pause=0.01)
    seen_read: dict = {}
    race.spawn("reader-read", chaser(race, lg, "read(max_bytes=150)", seen_read, 150))

    passes = []

    def iter_pass():
        end = lg.log_end_offset
        offs = [r.offset for chunk in lg.iter_chunks(max_bytes=300) for r in chunk]
        assert offs[:end] == list(range(end)), \
            f"SKIP: iter_chunks pass read {len(offs)} records; first gap after " \
            f"{next((a for a, b in zip(offs, offs[1:]) if b != a + 1), None)} (log end was {end})"
        assert len(offs) == len(set(offs)), "REPEAT: iter_chunks returned an offset twice"
        passes.append(len(offs))
        race.reads += len(offs)
    race.spawn("reader-iter_chunks", iter_pass, pause=0.01)

    bpos = [0]

    def batches_step():
        if bpos[0] >= lg.log_end_offset:
            time.sleep(0.001)
            return
        v = lg.read_batches(bpos[0], max_bytes=200)
        assert len(v), f"EMPTY READ: read_batches at {bpos[0]} below the log end"
        _first, bpos[0] = check_batches(v, bpos[0])
    race.spawn("reader-read_batches", batches_step)

    cpos, cseen = [0], {}
    cols = _core.Columns()

    def columns_step():
        pos = cpos[0]
        cols.clear()
        nxt = lg.read_columns(pos, 1 << 62, cols, max_records=40, max_data=300)
        got = column_values(cols)
        offs = [o for o, _v in got]
        assert offs == list(range(pos, nxt)), \
            f"SKIP: read_columns at {pos} returned offsets {offs[:5]}..{offs[-3:]}, next {nxt}"
        cseen.update(got)
        race.reads += len(got)
        cpos[0] = nxt
        if not got:
            time.sleep(0.001)
    race.spawn("reader-read_columns", columns_step)

    lookups = []

    def ts_step():
        end = lg.log_end_offset
        if end == 0:
            return
        o = random.randrange(end)
        r = lg.read(o, max_records=1)
        assert r and r[0].offset == o, f"SKIP: read({o}, max_records=1) returned {r[:1]}"
        lookups.append((o, r[0].timestamp, lg.offset_for_timestamp(r[0].timestamp)))
    race.spawn("reader-offset_for_timestamp", ts_step, pause=0.002)

    race.run(SECONDS)
    race.check()
    check_seen("read(max_bytes=150)", seen_read, acked)
    check_seen("read_columns", cseen, acked)
    check_dense_exact(lg, acked)
    recs = final_records(lg)
    assert len(seen_read) >= min(len(recs), 100) and passes, "the readers made no progress"
    ts = [r.timestamp for r in recs]
    for o, t, found in lookups:
        want = next(i for i, x in enumerate(ts) if x >= t)
        assert found == want, f"WRONG: offset_for_timestamp({t}) = {found}, expected {want} (from record {o})"
    lg.close()
    tally(race, acked)


def test_log_truncate_and_delete_records_under_appends_and_reads(tmp_path, watchdog):
    """truncate_to and delete_records race two appenders and readers: readers raise nothing but
    OffsetOutOfRangeError, never a CorruptRecordError on healthy data; every acknowledged record
    is in the final log at its offset unless a recorded truncation or start move removed it."""
    watchdog(90)
    lg = kstore.Log.open(str(tmp_path / "t-0"), LOG_CFG)
    race, acked = Race(), Acked()
    for w in range(2):
        race.spawn(f"appender-{w}", appender(race, acked, lg.append, w, seed=2), pause=0.0005)
    truncations: list[int] = []
    rng = random.Random(5)

    def mutate():
        end, start = lg.log_end_offset, lg.log_start_offset
        if end - start < 20:
            return
        if rng.random() < 0.7:
            # at a batch boundary: truncate_to drops the whole batch holding its target, as
            # Kafka does, so a mid-batch target would leave a legitimate hole below it
            target = struct.unpack_from(">q", bytes(lg.read_batches(end - rng.randint(1, 15))[:8]))[0]
            if lg.truncate_to(target):
                truncations.append(target)
        else:
            lg.delete_records(start + rng.randint(1, 10))
    race.spawn("truncator", mutate, pause=0.01)
    seen = [{} for _ in range(2)]
    race.spawn("reader-read-0", chaser(race, lg, "read(max_bytes=120)", seen[0], 120, removals=True))
    race.spawn("reader-read-1", chaser(race, lg, "read(max_bytes=600)", seen[1], 600, removals=True))
    race.run(SECONDS)
    race.check()
    assert truncations, "no truncation happened"
    for i, s in enumerate(seen):
        check_seen(f"reader-read-{i}", s, acked)
    start = lg.log_start_offset
    recs = final_records(lg)
    offs = [r.offset for r in recs]
    assert offs == list(range(start, lg.log_end_offset)), "SKIP: final log offsets are not dense"
    assert len({r.value for r in recs}) == len(recs), "REPEAT: a value appears twice in the final log"
    got = {r.offset: r.value for r in recs}
    for o, vals in acked.at.items():
        cut = sum(1 for t in truncations if t <= o)
        assert len(vals) <= 1 + cut, \
            f"REPEAT: offset {o} acknowledged {len(vals)} times with only {cut} truncation(s) at or below it"
        if o in got:
            assert got[o] in vals, f"WRONG: offset {o} holds {got[o]!r}, acknowledged there: {vals}"
        if o >= start and (o not in got or got[o] != vals[-1]) and not cut:
            raise AssertionError(f"LOST: offset {o} ({vals}) is gone and no truncation reached it "
                                 f"(log start {start})")
    lg.close()
    tally(race, acked)


# -- one LogManager topic ---------------------------------------------------------------------
MGR_CFG = {"log.segment.bytes": 2048, "log.index.size.max.bytes": 4096, "log.index.interval.bytes": 128,
           "log.initial.task.delay.ms": 0, "log.retention.check.interval.ms": 20,
           "log.flush.interval.ms": 5, "log.flush.scheduler.interval.ms": 5,
           "log.flush.offset.checkpoint.interval.ms": 10,
           "log.flush.start.offset.checkpoint.interval.ms": 10,
           "log.segment.delete.delay.ms": 5, "file.delete.delay.ms": 5,
           "log.cleaner.threads": 2, "log.cleaner.backoff.ms": 5, "auto.create.topics.enable": False}


@pytest.fixture
def error_logs():
    h = ErrorLogs()
    h.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
    lg = logging.getLogger("kstore")
    lg.addHandler(h)
    yield h
    lg.removeHandler(h)


def churn(m, rng):
    """Create and delete topics of many partitions beside the busy ones; each gets appends that
    roll its small segments right before it is deleted (the roll's scheduled flush races it)."""
    n = [0]

    def step():
        name = f"churn-{n[0]}"
        n[0] += 1
        m.create_topic(name, 12, {"segment.bytes": 1024})
        for i in range(rng.randint(10, 20)):
            m.append_batch(name, i % 2, [(None, b"c%03d" % i + b"." * 200)])
        m.log(name, 0).roll()           # its flush is scheduled now, and races the deletion
        m.delete_topic(name)
    return step


def finish_busy(race, m, acked, error_logs):
    """The end of a LogManager race over the 'busy' topic: the manager healthy, every
    acknowledged record read back once at its offset, closed, counted."""
    check_manager_healthy(m, error_logs)
    check_dense_exact(m.log("busy", 0), acked)
    m.close()
    tally(race, acked)


def test_manager_scheduled_flushes_beside_appends(tmp_path, watchdog, error_logs):
    """The scheduler's flusher (every 5 ms), the flush each roll schedules and the flush an
    append triggers at flush.messages, beside three appending threads: no deadlock, the topic
    holds exactly the acknowledged records, densely."""
    watchdog(90)
    m = kstore.LogManager(str(tmp_path / "store"), dict(MGR_CFG, **{"log.flush.interval.messages": 40}))
    m.create_topic("busy", 1)
    race, acked = Race(), Acked()
    for w in range(2):
        race.spawn(f"appender-{w}", appender(race, acked, lambda r: m.append_batch("busy", 0, r), w, seed=6),
                   pause=0.0002)
    race.spawn("appender-2", single_appender(acked, m, "busy", 2), pause=0.0002)
    race.run(SECONDS)
    race.check(error_logs)
    finish_busy(race, m, acked, error_logs)


def test_manager_topic_appends_with_scheduler_retention_and_topic_churn(tmp_path, watchdog, error_logs):
    """Appenders on one topic with retention, the real scheduler flushing, checkpointing and
    deleting segments every few ms, delete_records, readers, and other topics created and
    deleted: no deadlock, no offline dir, no ERROR log; every acknowledged record at or above
    the final log start is there, densely."""
    watchdog(120)
    m = kstore.LogManager(str(tmp_path / "store"), MGR_CFG)
    m.create_topic("busy", 1, {"retention.bytes": 12000})
    lg = m.log("busy", 0)
    race, acked = Race(), Acked()
    for w in range(2):
        race.spawn(f"appender-{w}", appender(race, acked, lambda r: m.append_batch("busy", 0, r), w, seed=3),
                   pause=0.0005)
    race.spawn("appender-2", single_appender(acked, m, "busy", 2), pause=0.0002)
    rng = random.Random(7)
    starts: list[int] = []

    def delete_records():
        end, start = lg.log_end_offset, lg.log_start_offset
        if end - start > 30:
            starts.append(lg.delete_records(start + rng.randint(1, 20)))
    race.spawn("delete_records", delete_records, pause=0.03)
    race.spawn("topic-churn", churn(m, random.Random(8)), pause=0.01)
    race.spawn("flush", lambda: lg.flush(), pause=0.004)
    race.spawn("cleanup_logs", lambda: m.cleanup_logs(), pause=0.01)
    seen = [{}, {}]
    race.spawn("reader-0", chaser(race, lg, "read(max_bytes=150)", seen[0], 150, removals=True))
    race.spawn("reader-1", chaser(race, lg, "read(max_bytes=4000)", seen[1], 4000, removals=True))
    race.run(SECONDS)
    race.check(error_logs)
    check_manager_healthy(m, error_logs)
    for i, s in enumerate(seen):
        check_seen(f"reader-{i}", s, acked)
    start = lg.log_start_offset
    assert starts and start >= max(starts), "delete_records did not move the log start"
    check_dense_exact(lg, acked, start)
    assert [t for t in m.topics() if t.startswith("churn-")] == [], m.topics()
    m.close()
    # and again after a restart: nothing acknowledged at or above the start came back or went
    with kstore.LogManager(str(tmp_path / "store"), dict(MGR_CFG, **{"log.cleaner.enable": False})) as m2:
        assert m2.topics() == ["busy"]
        check_dense_exact(m2.log("busy", 0), acked, m2.log("busy", 0).log_start_offset)
    tally(race, acked)


def test_manager_compaction_two_cleaner_threads_clean_now_and_retention(tmp_path, watchdog, error_logs):
    """Two compacted topics (one compact,delete with retention) with appenders, the two
    background cleaner threads, clean_now and delete_records racing: no dir offline (shared
    checkpoint .tmp names, segments renamed under the cleaner), each key's latest value kept,
    readers see only acknowledged records in increasing order."""
    watchdog(120)
    m = kstore.LogManager(str(tmp_path / "store"), MGR_CFG)
    topics = {"comp-a": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01,
                         "segment.bytes": 1024},
              "comp-b": {"cleanup.policy": "compact,delete", "min.cleanable.dirty.ratio": 0.01,
                         "segment.bytes": 1024, "retention.bytes": 6000},
              "comp-c": {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01,
                         "segment.bytes": 512}}
    for t, c in topics.items():
        m.create_topic(t, 1, c)
    race = Race()
    ack = {t: Acked() for t in topics}
    for i, t in enumerate(topics):
        for w in range(2):
            race.spawn(f"appender-{t}-{w}", appender(race, ack[t], lambda r, t=t: m.append_batch(t, 0, r),
                                                     w, keyed=11, seed=4 + i), pause=0.0005)
    race.spawn("clean_now", lambda: m.clean_now(), pause=0.01)
    lga = m.log("comp-a", 0)

    def delete_records():
        end, start = lga.log_end_offset, lga.log_start_offset
        if end - start > 60:
            lga.delete_records(start + 10)
    race.spawn("delete_records-comp-a", delete_records, pause=0.05)
    race.spawn("cleanup_logs", lambda: m.cleanup_logs(), pause=0.01)
    race.spawn("topic-churn", churn(m, random.Random(9)), pause=0.02)
    seen = {t: {} for t in topics}
    for t in topics:
        race.spawn(f"reader-{t}", chaser(race, m.log(t, 0), f"read {t}", seen[t], 200, dense=False,
                                         removals=True))
    race.run(SECONDS + 2)       # the cleaners' races need a little longer
    race.check(error_logs)
    check_manager_healthy(m, error_logs)
    for t in topics:
        check_seen(f"reader-{t}", seen[t], ack[t])
        check_compacted(m.log(t, 0), ack[t])
    m.close()
    tally(race, *ack.values())


def test_manager_delete_topic_right_after_roll(tmp_path, watchdog, error_logs):
    """delete_topic straight after a roll, in a loop, while another thread appends to a live
    topic: the flush each roll scheduled races the rename of the partition dir; an ordinary
    deletion must log no ERROR and take no dir offline, and the live topic loses nothing."""
    watchdog(60)
    m = kstore.LogManager(str(tmp_path / "store"), MGR_CFG)
    m.create_topic("busy", 1)
    race, acked = Race(), Acked()
    race.spawn("appender", appender(race, acked, lambda r: m.append_batch("busy", 0, r), 0, seed=10),
               pause=0.0005)
    n = [0]

    def roll_then_delete():
        name = f"gone-{n[0]}"
        n[0] += 1
        m.create_topic(name, 1, {"segment.bytes": 1024})
        for _ in range(5):
            m.append_batch(name, 0, [(None, b"x" * 300)])
        m.log(name, 0).roll()
        m.delete_topic(name)
    race.spawn("roll-then-delete", roll_then_delete)
    race.run(SECONDS)
    race.check(error_logs)
    assert n[0] >= 5, f"only {n[0]} topics deleted"
    finish_busy(race, m, acked, error_logs)


def test_manager_checkpoints_and_topic_churn_beside_producer_appends(tmp_path, watchdog, error_logs):
    """Producer-style appends (partition lookup by topic) while another thread creates and
    deletes topics of 8 partitions and two more write the recovery-point and log-start
    checkpoints, as the scheduler does: no "dictionary changed size during iteration", no
    checkpoint .tmp race taking the dir offline; the live topic holds every acknowledged record."""
    watchdog(60)
    m = kstore.LogManager(str(tmp_path / "store"), MGR_CFG)
    m.create_topic("busy", 1)
    race, acked = Race(), Acked()
    for w in range(2):
        race.spawn(f"appender-{w}", single_appender(acked, m, "busy", w))
    n = [0]

    def churn16():
        name = f"wide-{n[0]}"
        n[0] += 1
        m.create_topic(name, 8)
        m.delete_topic(name)
    race.spawn("topic-churn", churn16)
    race.spawn("checkpoint-recovery", m.checkpoint_recovery_offsets, pause=0.001)
    race.spawn("checkpoint-start", m.checkpoint_log_start_offsets, pause=0.001)
    race.run(SECONDS)
    race.check(error_logs)
    finish_busy(race, m, acked, error_logs)
