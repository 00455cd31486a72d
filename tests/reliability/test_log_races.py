"""Log reliability: reader threads and reader processes beside a writer that appends, truncates,
rolls and deletes segments; kill -9 of a writer."""
import signal
import subprocess
import sys
import threading
import time

import pytest

import kstore
from kstore import _core
from kstore.clock import MockTime
from kstore.errors import OffsetOutOfRangeError

from log_helpers import NOW, tagged_value, big_value


# -- concurrency and real crashes ------------------------------------------------------------------
def test_one_writer_many_readers(open_log):
    log = open_log({"segment.bytes": 20_000, "index.interval.bytes": 500})
    stop = threading.Event()
    errors = []

    def reader():
        try:
            while not stop.is_set():
                leo = log.log_end_offset
                if leo == 0:
                    continue
                got = log.read(max(log.log_start_offset, leo - 50), max_records=50)
                for r in got:
                    assert r.value == b"%d" % r.offset
                prev = None
                for r in log.read(0, max_records=200):
                    assert prev is None or r.offset == prev + 1
                    prev = r.offset
        except Exception as e:    # surfaced below
            errors.append(e)
    threads = [threading.Thread(target=reader) for _ in range(3)]
    for th in threads:
        th.start()
    for i in range(3000):
        log.append([(None, b"%d" % (2 * i)), (None, b"%d" % (2 * i + 1))])
    stop.set()
    for th in threads:
        th.join()
    assert not errors, errors
    assert len(log.segments) > 3


CHILD = r"""
import sys, kstore
log = kstore.Log.open(sys.argv[1], {"segment.bytes": 50000})
i = 0
while True:
    info = log.append([(b"k%d" % i, b"v%d" % i)])
    print(info.last_offset, flush=True)
    i += 1
"""


def test_kill_9_keeps_every_acknowledged_record(tmp_path):
    d = str(tmp_path / "t-0")
    for round_ in range(3):
        # cwd away from the repository so that the child imports the installed kstore
        p = subprocess.Popen([sys.executable, "-c", CHILD, d], stdout=subprocess.PIPE,
                             cwd=str(tmp_path))
        acked = -1
        for line in p.stdout:
            acked = int(line)
            if acked >= 2000 * (round_ + 1):
                break
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        assert acked >= 2000 * (round_ + 1), "the child did not run"
        with kstore.Log.open(d, {"segment.bytes": 50000}) as log:
            got = [r.offset for r in log]
            assert got == list(range(len(got)))           # a prefix, no holes
            assert len(got) >= acked + 1                    # nothing acknowledged was lost
            assert len(log.segments) > 1


def test_readers_survive_concurrent_retention(open_log):
    """Segments deleted under running readers: reads either succeed or say the offset is gone."""
    t = MockTime(NOW)
    log = open_log({"segment.bytes": 2000, "retention.bytes": 6000}, time=t)
    stop = threading.Event()
    errors, reads = [], [0]

    def reader():
        try:
            while not stop.is_set():
                start = log.log_start_offset
                try:
                    got = log.read(start, max_records=20)
                except OffsetOutOfRangeError:
                    continue
                reads[0] += 1
                for r in got:
                    assert r.value == b"%d" % r.offset
                # spinning readers would hold the GIL against the writer's roll and delete
                # syscalls (each waits a switch interval); a short pause keeps the test quick
                time.sleep(0.0002)
        except Exception as e:
            errors.append(e)
    th = [threading.Thread(target=reader) for _ in range(2)]
    for x in th:
        x.start()
    for i in range(3000):
        log.append([(None, b"%d" % i, NOW)])
        if i % 50 == 0:
            log.delete_old_segments()
    stop.set()
    for x in th:
        x.join()
    assert not errors, errors
    assert reads[0] > 0 and log.log_start_offset > 0


READER = r"""
import sys, kstore
ro = kstore.Log.open(sys.argv[1], read_only=True)
for line in sys.stdin:
    cmd, start = line.split()
    if cmd == "refresh":
        ro.refresh()
    recs = ro.read(int(start) if start != "-" else ro.log_start_offset, max_bytes=1 << 30)
    print(ro.log_start_offset, ro.log_end_offset,
          " ".join("%d=%s" % (r.offset, r.value[:6].decode()) for r in recs), flush=True)
"""


class ReaderProcess:
    """A read-only Log in a child process (a SIGBUS kills it, not the test), driven by lines."""

    def __init__(self, path, cwd):
        self.p = subprocess.Popen([sys.executable, "-c", READER, path], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd)

    def read(self, refresh=False, start=None) -> str:
        self.p.stdin.write(f"{'refresh' if refresh else 'read'} {'-' if start is None else start}\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def close(self) -> tuple[int, str]:
        _out, err = self.p.communicate(timeout=30)
        return self.p.returncode, err


def _expect(start, end, gens):
    return f"{start} {end} " + " ".join(f"{o}={g}{o:05d}" for o, g in gens)


@pytest.mark.parametrize("trim", ["roll", "close", "truncate_again"])
def test_reader_process_keeps_its_records_across_truncate_and_trim(open_log, log_dir, tmp_path,
                                                                   watchdog, trim):
    """Defects 6 and 9: truncate_to zeroed the bytes a reader in another process had validated
    and mapped (CRC errors on healthy data), and the roll or close after it shrank the file
    under the mapping (the reader died of SIGBUS). Now the reader keeps reading the records as
    they were until it refreshes, then sees the truncated log and what follows."""
    watchdog(60)
    lg = open_log({"segment.bytes": 1 << 20})
    for o in range(10):
        lg.append([(None, big_value(o), NOW + o)])
    r = ReaderProcess(log_dir, str(tmp_path))
    try:
        assert r.read() == _expect(0, 10, [(o, "o") for o in range(10)])
        lg.truncate_to(3)
        if trim == "roll":
            lg.roll()
        elif trim == "close":
            lg.close()
            lg = open_log({"segment.bytes": 1 << 20})
        else:
            lg.append([(None, big_value(3, "n"), NOW)])
            lg.truncate_to(2)
        # the reader's view predates the truncation: exactly the old records, no fault (its
        # index sends a read of 8 straight to a page the trim cut: SIGBUS before)
        assert r.read(start=8) == _expect(0, 10, [(8, "o"), (9, "o")])
        assert r.read() == _expect(0, 10, [(o, "o") for o in range(10)])
        assert r.read(refresh=True) == _expect(0, lg.log_end_offset,
                                               [(o, "o") for o in range(lg.log_end_offset)])
        first_new = lg.log_end_offset
        for o in range(first_new, 6):
            lg.append([(None, big_value(o, "n"), NOW + o)])
        assert r.read(refresh=True) == _expect(
            0, 6, [(o, "o" if o < first_new else "n") for o in range(6)])
    finally:
        rc, err = r.close()
    assert (rc, err) == (0, "")


def _column_values(cols) -> list[tuple[int, bytes]]:
    a = cols.arrays()
    vo, vd = a["value_offsets"], a["value_data"].tobytes()
    return [(int(o), vd[vo[i]:vo[i + 1]]) for i, o in enumerate(a["offset"])]


def test_reader_threads_beside_truncate_roll_and_retention(open_log, watchdog):
    """Defects 6, 7, 9 for reader threads of the writing process: read, read_columns,
    read_batches and offset_for_timestamp while another thread appends, truncates, rolls and
    deletes segments. Every result is exact (offset, value, contiguous); the only error a read
    may raise is OffsetOutOfRangeError for an offset that is really gone. Before: raw
    ValueError/BufferError ("mapping is closed"), CorruptRecordError on zeroed batches."""
    from thread_watchdog import join_all
    watchdog(90)
    lg = open_log({"segment.bytes": 6000, "index.interval.bytes": 300, "retention.bytes": 30000})
    stop = threading.Event()
    errors, counts = [], {"read": 0, "columns": 0, "batches": 0, "time": 0}

    def check(pairs, start):
        if not pairs:
            return              # truncated to start meanwhile (start is the log end then)
        assert [o for o, big_value in pairs] == list(range(pairs[0][0], pairs[0][0] + len(pairs)))
        assert pairs[0][0] == start
        for o, v in pairs:
            assert v == tagged_value(o), (o, v[:20])

    def reader(kind):
        try:
            cols = _core.Columns(False)
            while not stop.is_set():
                lo, hi = lg.log_start_offset, lg.log_end_offset
                if hi - lo < 10:
                    continue
                start = lo + (hi - lo) // 2 // 5 * 5        # a batch boundary in the middle
                try:
                    if kind == "read":
                        check([(r.offset, r.value) for r in lg.read(start, max_records=40)], start)
                    elif kind == "columns":
                        cols.clear()
                        lg.read_columns(start, start + 40, cols)
                        check(_column_values(cols), start)
                    elif kind == "batches":
                        recs = _core.decode_batches(bytes(lg.read_batches(start, 3000)))
                        check([(r.offset, r.value) for r in recs], start)
                    else:
                        found = lg.offset_for_timestamp(NOW + start)
                        assert found is None or found >= start, (found, start)
                except OffsetOutOfRangeError:
                    continue
                counts["read" if kind == "read" else kind] += 1
        except BaseException as e:          # surfaced below, with where it came from
            import traceback
            errors.append((kind, "".join(traceback.format_exception(e))))
            stop.set()

    threads = [threading.Thread(target=reader, args=(k,), name=k)
               for k in ("read", "columns", "batches", "time")]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 4
    i = 0
    try:
        while time.monotonic() < deadline and not stop.is_set():
            leo = lg.log_end_offset
            lg.append([(None, tagged_value(leo + j), NOW + leo + j) for j in range(5)])
            i += 1
            if i % 9 == 0:
                lg.truncate_to(max(lg.log_start_offset, (lg.log_end_offset - 20) // 5 * 5))
            if i % 40 == 0:
                lg.truncate_to(max(lg.log_start_offset, lg.active_segment.base_offset - 10))
            if i % 25 == 0:
                lg.roll()
            if i % 30 == 0:
                lg.delete_old_segments()
    finally:
        stop.set()
        join_all(threads, 30)
    assert not errors, errors
    assert min(counts.values()) > 0, counts
    assert lg.log_start_offset > 0


@pytest.mark.parametrize("case", ["next_segment", "next_segment_past_stop", "last_segment"])
def test_read_columns_never_skips_records_a_truncation_cut_under_it(open_log, watchdog, case):
    """read_columns reads a segment that truncate_to has just cut, and the writer appends the
    cut offsets again before the read goes on (the tmpfs failure of the test above, by hand).
    Before: it went on at the next segment's base offset taken from the segment list it
    started with, but read it in the new list, where that offset lies in the re-grown
    segment (offsets 10..14 skipped inside one call: 975..994 then 1010 in the report); or,
    the cut segment being the last, it returned stop, and its caller skipped them."""
    watchdog(30)
    lg = open_log({"segment.bytes": 1 << 20})

    def append_to(end):
        while lg.log_end_offset < end:
            leo = lg.log_end_offset
            lg.append([(None, tagged_value(leo + j), NOW + leo + j) for j in range(5)])
    append_to(15)
    if case != "last_segment":
        lg.roll()                       # A holds 0..14, B 15..24
    append_to(25)
    seg = lg.segments[0]
    real = seg.read_columns
    fired = []

    def cut_then_read_then_grow(*args, **kw):
        if fired:
            return real(*args, **kw)
        fired.append(True)
        lg.truncate_to(10)              # B (if any) deleted, A cut to 0..9
        got = real(*args, **kw)         # A as cut: 5..9, then the end of its data
        append_to(25)                   # 10..24 again, in A
        return got
    seg.read_columns = cut_then_read_then_grow
    stop = 15 if case == "next_segment_past_stop" else 20
    seen, offset = [], 5
    cols = _core.Columns(False)
    for _call in range(10):             # the caller's loop (arrow.iter_batches)
        cols.clear()
        nxt = lg.read_columns(offset, stop, cols)
        seen += _column_values(cols)
        if nxt >= stop:
            break
        assert nxt > offset or cols.count, (offset, nxt)
        offset = nxt
    assert fired
    assert [o for o, _v in seen] == list(range(5, stop))
    assert all(v == tagged_value(o) for o, v in seen)


class _HeadRemovedLog(kstore.Log):
    """A Log whose next read of its segment list first runs `hook` once: the window between a
    read's range check and its fetch of the segment list, made deterministic."""
    hook = None

    @property
    def _segments(self):
        h, self.hook = self.hook, None
        if h is not None:
            h()
        return self.__dict__["_segs_"]

    @_segments.setter
    def _segments(self, v):
        self.__dict__["_segs_"] = v


@pytest.mark.parametrize("how", ["read", "read_batches", "read_columns"])
def test_a_read_whose_segment_retention_removed_after_its_range_check_is_out_of_range(
        tmp_path, watchdog, how):
    """DeleteRecords (or retention) removes the segment holding the offset between a read's
    range check and its fetch of the segment list: OffsetOutOfRangeError, as Kafka answers a
    fetch below the log start, never records from a later offset (a silent skip)."""
    watchdog(30)
    lg = _HeadRemovedLog.open(str(tmp_path / "t-0"), {"segment.bytes": 400})
    for i in range(60):
        lg.append([(None, b"%d" % i, NOW)])
    bases = [s.base_offset for s in lg.segments]
    assert len(bases) > 3 and bases[0] == 0
    cut = bases[2]                                   # removes the first two segments
    lg.hook = lambda: lg.delete_records(cut)
    with pytest.raises(OffsetOutOfRangeError) as ei:
        if how == "read":
            lg.read(1, max_records=5)
        elif how == "read_batches":
            lg.read_batches(1)
        else:
            lg.read_columns(1, 10, _core.Columns())
    assert lg.log_start_offset == cut and lg.segments[0].base_offset == cut
    assert "1" in str(ei.value)
    # the log goes on: a read at the new start returns the records from there
    assert [r.offset for r in lg.read(cut, max_records=3)] == [cut, cut + 1, cut + 2]
    lg.close()


def test_iteration_goes_on_from_the_new_start_when_retention_races_a_chunk_read(tmp_path, watchdog):
    """Iteration reads from the log start as of each chunk: a DeleteRecords between a chunk's
    range check and its read moves it on to the new start (no OffsetOutOfRangeError, no skip
    of what remains)."""
    watchdog(30)
    lg = _HeadRemovedLog.open(str(tmp_path / "t-0"), {"segment.bytes": 400})
    for i in range(60):
        lg.append([(None, b"%d" % i, NOW)])
    cut = lg.segments[2].base_offset
    lg.hook = lambda: lg.delete_records(cut)
    got = [r.offset for chunk in lg.iter_chunks(1) for r in chunk]
    assert got == list(range(cut, 60))
    lg.close()


def test_point_reads_and_time_lookups_in_remembered_batches_beside_truncate_roll_and_retention(
        open_log, watchdog):
    """Issue 14's record tables under races: reader threads make point reads (1-3 records at
    any offset, inside 50-record batches large enough to be remembered) and time lookups while
    the writer appends, truncates (files replaced: new mappings, new tables), rolls (the active
    segment remapped read-only) and deletes segments. Every read is exact (offset, value,
    contiguous from the offset asked); a time lookup finds the offset whose timestamp it asked
    for, or the log start if retention removed it, or nothing if a truncation removed it."""
    import random
    from thread_watchdog import join_all
    watchdog(90)
    lg = open_log({"segment.bytes": 60000, "index.interval.bytes": 4096, "retention.bytes": 300000})
    stop = threading.Event()
    errors, counts = [], {"read": 0, "time": 0}
    per = 50
    remembered = [0]

    def reader(kind, seed):
        rnd = random.Random(seed)
        try:
            while not stop.is_set():
                lo, hi = lg.log_start_offset, lg.log_end_offset
                if hi - lo < per:
                    continue
                x = rnd.randrange(lo, hi)
                try:
                    if kind == "read":
                        got = [(r.offset, r.value) for r in lg.read(x, max_records=rnd.randint(1, 3))]
                        if got:
                            assert [o for o, _v in got] == list(range(x, x + len(got))), (x, got)
                            assert all(v == tagged_value(o) for o, v in got), x
                    else:
                        found = lg.offset_for_timestamp(NOW + x)
                        assert found is None or found == x or x < found <= lg.log_start_offset, (x, found)
                except OffsetOutOfRangeError:
                    continue
                counts[kind] += 1
                remembered[0] = max(remembered[0], _core.batch_memory()[0])
        except BaseException as e:          # surfaced below, with where it came from
            import traceback
            errors.append((kind, "".join(traceback.format_exception(e))))
            stop.set()

    threads = [threading.Thread(target=reader, args=(k, n), name=f"{k}{n}")
               for n, k in enumerate(("read", "read", "time"))]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 4
    i = 0
    try:
        while time.monotonic() < deadline and not stop.is_set():
            leo = lg.log_end_offset
            lg.append([(None, tagged_value(leo + j), NOW + leo + j) for j in range(per)])
            i += 1
            if i % 7 == 0:       # at a batch boundary (else offsets up to the cut are a gap)
                lg.truncate_to(max(lg.log_start_offset, (lg.log_end_offset - per - 17) // per * per))
            if i % 11 == 0:
                lg.roll()
            if i % 13 == 0:
                lg.delete_old_segments()
            time.sleep(0.002)
    finally:
        stop.set()
        join_all(threads, 30)
    assert not errors, errors
    assert min(counts.values()) > 0, counts
    assert lg.log_start_offset > 0
    assert remembered[0] > 0                 # the readers' batches were remembered
