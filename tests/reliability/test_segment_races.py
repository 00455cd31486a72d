"""The segment's write path under readers: large appends are pwritten (the file grows under
the writer's mapping), small ones copied into the mapping over the zero runway. Reader threads,
a read-only reader in this process beside a writer process, and kill -9 of that writer must
only ever see whole batches, byte for byte."""
import os
import signal
import subprocess
import sys
import threading

import pytest

import kstore
from kstore.errors import OffsetOutOfRangeError
from kstore.segment import PWRITE_MIN_BYTES

from thread_watchdog import join_all

NOW = 1_700_000_000_000


def batch(first: int, n: int, size: int) -> list:
    """n records tagged with their offset and their batch (first offset, length): a reader can
    tell a whole batch from part of one."""
    pad = b"x" * max(0, size - 40)
    return [(b"%d" % (first + j), b"%d:%d:%d:" % (first + j, first, n) + pad, NOW + first + j)
            for j in range(n)]


def check_whole(recs) -> None:
    """Records contiguous, each one what was appended at its offset, and the last one the last
    of its batch (reads return whole batches)."""
    prev = None
    for r in recs:
        off, first, n = (int(x) for x in r.value.split(b":")[:3])
        assert off == r.offset and r.key == b"%d" % off, (r.offset, r.value[:30])
        assert prev is None or r.offset == prev + 1
        prev = r.offset
    if recs:
        _off, first, n = (int(x) for x in recs[-1].value.split(b":")[:3])
        assert recs[-1].offset == first + n - 1, f"a read ended inside batch {first}+{n}"


SHAPES = [(1000, 120), (1, 100), (300, 60), (2, 9000), (40, 50)]   # (records, bytes each)


def test_reader_threads_see_whole_batches_while_large_appends_are_pwritten(open_log, watchdog):
    watchdog(300)
    assert 1000 * 120 > PWRITE_MIN_BYTES > 40 * 50 + 61
    log = open_log({"segment.bytes": 1_500_000, "retention.bytes": 1_200_000, "retention.ms": -1})
    stop = threading.Event()
    errors, reads, most = [], [0], 0

    def reader():
        try:
            while not stop.is_set():
                leo, start = log.log_end_offset, log.log_start_offset
                if leo == start:
                    continue
                try:
                    check_whole(log.read(max(start, leo - 1), max_bytes=1))    # the newest batch
                    check_whole(log.read(start, max_bytes=300_000))
                except OffsetOutOfRangeError:
                    continue          # retention removed the start under the read
                reads[0] += 1
        except Exception as e:        # surfaced below
            errors.append(e)
    threads = [threading.Thread(target=reader, name=f"reader-{i}") for i in range(3)]
    for th in threads:
        th.start()
    try:
        for i in range(150):
            n, size = SHAPES[i % len(SHAPES)]
            first = log.log_end_offset
            log.append(batch(first, n, size))
            most = max(most, len(log.segments))
            if i % 40 == 39:
                log.delete_old_segments()
            if i == 100:
                log.truncate_to(first)      # the last batch (1000 records, pwritten) goes
    finally:
        stop.set()
        join_all(threads, 60)
    assert not errors, errors
    assert reads[0] > 0 and most > 2 and log.log_start_offset > 0    # rolled, retention ran
    check_whole(log.read(log.log_start_offset, max_bytes=1 << 30))


WRITER = r"""
import sys, kstore
sys.path[:0] = [sys.argv[2], sys.argv[2] + "/.."]
from test_segment_races import batch, SHAPES
log = kstore.Log.open(sys.argv[1], {"segment.bytes": 3_000_000})
i = 0
while True:
    n, size = SHAPES[i % len(SHAPES)]
    info = log.append(batch(log.log_end_offset, n, size))
    print(info.last_offset, flush=True)
    i += 1
"""


@pytest.mark.parametrize("pretouch", ["0", "1"])
def test_read_only_reader_and_kill_9_see_whole_pwritten_batches(tmp_path, watchdog, pretouch):
    """A writer process appends large and small batches; this process refreshes a read-only log
    beside it (whole batches only, whatever it catches mid-pwrite), then kills the writer with
    SIGKILL: the reopened log holds every acknowledged batch and only whole ones. With
    KSTORE_PRETOUCH=1 the writer's pretoucher pre-faults a zero runway ahead: it reads as the end."""
    watchdog(300)
    d = str(tmp_path / "t-0")
    here = os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen([sys.executable, "-c", WRITER, d, here], stdout=subprocess.PIPE,
                         cwd=str(tmp_path), env=dict(os.environ, KSTORE_PRETOUCH=pretouch))
    acked = -1
    try:
        assert p.stdout.readline()                  # the log exists
        ro = kstore.Log.open(d, read_only=True)
        seen = 0
        for line in p.stdout:
            acked = int(line)
            ro.refresh()
            recs = ro.read(seen, max_bytes=1 << 30) if ro.log_end_offset > seen else []
            check_whole(recs)
            assert ro.log_end_offset == seen + len(recs)
            seen = ro.log_end_offset
            if acked >= 30_000:
                break
        ro.close()
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        p.stdout.close()
    assert acked >= 30_000, "the writer did not run"
    with kstore.Log.open(d, {"segment.bytes": 3_000_000}) as log:
        recs = log.read(0, max_bytes=1 << 31)
        check_whole(recs)
        assert len(recs) >= acked + 1                # nothing acknowledged was lost
        assert len(log.segments) > 1
        log.append(batch(log.log_end_offset, 1000, 120))
        check_whole(log.read(0, max_bytes=1 << 31))
