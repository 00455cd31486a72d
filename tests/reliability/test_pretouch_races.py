"""The pretoucher's thread beside the writer's life cycle: rolls, truncations, flushes, close
and topic deletion from other threads while it grows runways, readers in this process and in
another, and kill -9 of a pretouching writer. Whatever the interleaving: only whole batches
are read, byte for byte; no zero is written below the data (a record would read back as
zeros or fail its CRC); nothing is written to a file once its segment stopped its runway (a
closed log's files are exactly their data; no file reappears after deletion)."""
import os
import random
import sys
import threading
import time

import kstore
from kstore import pretouch
from kstore.errors import KStoreError, OffsetOutOfRangeError

from thread_watchdog import join_all

sys.path.insert(0, os.path.dirname(__file__))
from test_segment_races import SHAPES, batch, check_whole  # noqa: E402

CFG = {"segment.bytes": 2_500_000, "retention.ms": -1}


def logs_on_disk_equal_their_data(part: str, lg_segments: dict) -> None:
    for name in os.listdir(part):
        if name.endswith(".log"):
            base = int(name[:-4])
            assert os.path.getsize(os.path.join(part, name)) == lg_segments[base], \
                f"{name}: file of {os.path.getsize(os.path.join(part, name))} bytes, data {lg_segments[base]}"


def test_pretoucher_beside_rolls_truncations_flushes_and_readers(tmp_path, watchdog):
    watchdog(300)
    part = str(tmp_path / "t-0")
    pt = pretouch.enable(ahead=2 << 20)
    lg = kstore.Log.open(part, CFG)
    stop = threading.Event()
    errors: list = []
    counts = {"roll": 0, "truncate": 0, "flush": 0, "read": 0}
    rnd = random.Random(7)

    def loop(name, step, pause):
        try:
            while not stop.is_set():
                step()
                counts[name] += 1
                time.sleep(pause)
        except Exception as e:        # surfaced below
            errors.append((name, repr(e)))

    def roll():
        lg.roll()

    ends = threading.Lock()        # an append's first offset stays the log end it was given
    firsts: list = []              # each batch's first offset (truncations cut at one of them)

    def truncate():
        with ends:
            while firsts and firsts[-1] >= lg.log_end_offset:
                firsts.pop()
            if lg.log_end_offset > 5000 and len(firsts) > 10:
                cut = firsts[-rnd.randrange(1, 10)]
                lg.truncate_to(cut)
                del firsts[firsts.index(cut):]

    def read():
        leo, start = lg.log_end_offset, lg.log_start_offset
        if leo > start:
            try:
                check_whole(lg.read(max(start, leo - 1), max_bytes=1))
                check_whole(lg.read(max(start, leo - 3000), max_bytes=1 << 22))
            except OffsetOutOfRangeError:
                pass                   # a truncation moved the end under the read

    threads = [threading.Thread(target=loop, args=a, name=a[0]) for a in
               (("roll", roll, 0.03), ("truncate", truncate, 0.02), ("flush", lg.flush, 0.01),
                ("read", read, 0.0))]
    for t in threads:
        t.start()
    try:
        for i in range(400):
            n, size = SHAPES[i % len(SHAPES)]
            with ends:
                firsts.append(lg.log_end_offset)
                lg.append(batch(lg.log_end_offset, n, size))
    finally:
        stop.set()
        join_all(threads, 60)
    assert not errors, errors
    assert counts["roll"] > 2 and counts["truncate"] > 2 and counts["read"] > 10
    assert pt.filled > 0
    sizes = {s.base_offset: s.size for s in lg.segments}
    recs = lg.read(lg.log_start_offset, max_bytes=1 << 31)
    check_whole(recs)
    assert len(recs) == lg.log_end_offset - lg.log_start_offset
    lg.close()
    pretouch.disable()
    logs_on_disk_equal_their_data(part, sizes)
    with kstore.Log.open(part, CFG) as again:
        assert not again.recovery_report
        assert [(r.offset, r.value) for r in again] == [(r.offset, r.value) for r in recs]


def test_pretoucher_beside_close_and_topic_deletion(tmp_path, watchdog):
    """Appenders pretouching many partitions while the topic is deleted and the manager closed:
    the appends fail with kstore errors only, the deleted partitions stay gone, and the kept
    topic's files hold exactly their data."""
    watchdog(300)
    pretouch.enable(ahead=2 << 20)
    root = str(tmp_path / "data")
    cfg = {"log.segment.bytes": 2_000_000, "log.segment.delete.delay.ms": 0,
           "file.delete.delay.ms": 0, "log.cleaner.enable": False}
    errors: list = []
    try:
        for rnd in range(3):
            m = kstore.LogManager(root, cfg)
            m.create_topic(f"gone{rnd}", 3)
            if rnd == 0:
                m.create_topic("keep", 1)
            stop = threading.Event()

            def appender(lg, stop):
                # the partition's Log, not append_batch: that would create the topic again
                try:
                    while not stop.is_set():
                        try:
                            lg.append(batch(0, 1000, 120))
                        except KStoreError:
                            return                      # deleted or closed under the append
                except Exception as e:        # surfaced below
                    errors.append(repr(e))
            threads = [threading.Thread(target=appender, args=(m.log(f"gone{rnd}", p), stop))
                       for p in range(3)]
            threads.append(threading.Thread(target=appender, args=(m.log("keep", 0), stop)))
            for t in threads:
                t.start()
            time.sleep(0.15)
            m.delete_topic(f"gone{rnd}")
            time.sleep(0.05)
            stop.set()
            join_all(threads, 60)
            m.delete_logs()
            keep_sizes = {s.base_offset: s.size for s in m.log("keep", 0).segments}
            m.close()
            time.sleep(0.05)                  # a stray pretouch write would land by now
            assert not [d for d in os.listdir(root) if d.startswith(f"gone{rnd}")]
            logs_on_disk_equal_their_data(os.path.join(root, "keep-0"), keep_sizes)
    finally:
        pretouch.disable()
    assert not errors, errors


# the kill -9 of a pretouching writer beside a read-only reader: test_segment_races'
# test_read_only_reader_and_kill_9_see_whole_pwritten_batches[1]


def test_crash_states_of_large_batches_with_the_pretoucher(tmp_path):
    """test_crash's producer-sized workload with pretouching on: the crash harness's FileOps is
    not thread-safe, so the runway is grown in the writer's thread, in order, and every one of
    its zero-fills is a crash point; every kill and power-loss state recovers the promised
    records byte for byte, with sound indexes and no leftovers."""
    from test_crash import PREFIXES, big_log_workload, check_big_log_state
    from crash_harness import explore
    pretouch.enable()
    try:
        ops = big_log_workload(str(tmp_path / "w"))
    finally:
        pretouch.disable()
    assert sum(s.op == "zero_fill" for s in ops.snapshots) >= 2
    explore(ops.snapshots, str(tmp_path), check_big_log_state, prefixes=PREFIXES)
