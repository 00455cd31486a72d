"""StoreReader in other processes beside a writer that truncates, rolls and applies retention
(moved from test_reader.py: a multi-process race, reliability tier)."""
import subprocess
import sys
import time

import kstore

NOW = 1_700_000_000_000

# A StoreReader in a child process (a SIGBUS kills it, not the test) reading for `secs`
# seconds: Spark's path (read_columns) and Log.read from a moving middle of the partition.
# Every value names its offset; runs are contiguous; only OffsetOutOfRangeError may happen.
READER = r"""
import random, sys, time, kstore
from kstore import _core
from kstore.errors import OffsetOutOfRangeError
d, secs = sys.argv[1], float(sys.argv[2])
rnd = random.Random(7)
reads = records = 0
cols = _core.Columns(False)
with kstore.StoreReader(d) as store:
    end = time.monotonic() + secs
    while time.monotonic() < end:
        lg = store.log("t", 0, refresh=True)
        lo, hi = lg.log_start_offset, lg.log_end_offset
        if hi - lo < 10:
            continue
        start = rnd.randrange(lo, hi) // 5 * 5
        try:
            if rnd.random() < 0.5:
                got = [(r.offset, r.value) for r in lg.read(start, max_records=60)]
            else:
                cols.clear()
                lg.read_columns(start, start + 60, cols)
                a = cols.arrays()
                vo, vd = a["value_offsets"], a["value_data"].tobytes()
                got = [(int(o), vd[vo[i]:vo[i + 1]]) for i, o in enumerate(a["offset"])]
        except OffsetOutOfRangeError:
            continue
        if got:
            assert got[0][0] == max(start, got[0][0]) and got[0][0] <= start + 5, (start, got[0][0])
            assert [o for o, _ in got] == list(range(got[0][0], got[0][0] + len(got))), start
            for o, v in got:
                assert v == b"%d;" % o * 30, (o, v[:20])
        reads += 1
        records += len(got)
print(reads, records)
"""


def test_store_readers_in_other_processes_beside_truncate_roll_and_retention(tmp_path, watchdog):
    """Defects 6, 7, 9 end to end: two StoreReader processes read (Log.read and Spark's
    read_columns) for 4 s while this process appends, truncates (inside the active segment and
    back into rolled ones), rolls, closes and reopens, and deletes by retention. Before, the
    readers died of SIGBUS (exit -7), CorruptRecordError on healthy data or FileNotFoundError;
    now both exit 0 with every record they returned exact."""
    watchdog(90)
    d = tmp_path / "s"
    cfg = {"segment.bytes": 8000, "index.interval.bytes": 500, "retention.bytes": 40000}
    lg = kstore.Log.open(str(d / "t-0"), cfg)
    for o in range(0, 100, 5):
        lg.append([(None, b"%d;" % (o + j) * 30, NOW) for j in range(5)])
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(d), "4"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
               for _ in range(2)]
    deadline = time.monotonic() + 4.5
    i = 0
    try:
        while time.monotonic() < deadline:
            leo = lg.log_end_offset
            lg.append([(None, b"%d;" % (leo + j) * 30, NOW) for j in range(5)])
            i += 1
            if i % 7 == 0:
                lg.truncate_to(max(lg.log_start_offset, (lg.log_end_offset - 15) // 5 * 5))
            if i % 50 == 0:
                lg.truncate_to(max(lg.log_start_offset, lg.active_segment.base_offset - 20) // 5 * 5)
            if i % 20 == 0:
                lg.roll()
            if i % 30 == 0:
                lg.delete_old_segments()
            if i % 200 == 0:
                lg.close()
                lg = kstore.Log.open(str(d / "t-0"), cfg)
    finally:
        lg.close()
        results = [r.communicate(timeout=60) for r in readers]
    for r, (out, err) in zip(readers, results):
        assert (r.returncode, err) == (0, ""), (r.returncode, err[-2000:])
        reads, records = map(int, out.split())
        assert reads > 20 and records > 100, out


def test_store_readers_beside_a_writer_with_quiet_spells(tmp_path, watchdog):
    """The same readers beside a writer with quiet spells longer than DirWatch's slack, so that their refreshes take the fast path (no listing, only the last
    segment validated on) between the truncations, rolls and retention that change the
    directory: every record they return is exact, no reader dies."""
    from kstore.ro_refresh import DirWatch
    watchdog(90)
    d = tmp_path / "s"
    cfg = {"segment.bytes": 8000, "index.interval.bytes": 500, "retention.bytes": 40000}
    lg = kstore.Log.open(str(d / "t-0"), cfg)
    for o in range(0, 100, 5):
        lg.append([(None, b"%d;" % (o + j) * 30, NOW) for j in range(5)])
    readers = [subprocess.Popen([sys.executable, "-c", READER, str(d), "4"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
               for _ in range(2)]
    deadline = time.monotonic() + 4.5
    i = 0
    try:
        while time.monotonic() < deadline:
            leo = lg.log_end_offset
            lg.append([(None, b"%d;" % (leo + j) * 30, NOW) for j in range(5)])
            i += 1
            if i % 10 == 0:
                time.sleep(DirWatch.SLACK_NS / 1e9 * 2)
            if i % 23 == 0:
                lg.truncate_to(max(lg.log_start_offset, (lg.log_end_offset - 15) // 5 * 5))
            if i % 70 == 0:
                lg.truncate_to(max(lg.log_start_offset, lg.active_segment.base_offset - 20) // 5 * 5)
            if i % 20 == 0:
                lg.roll()
            if i % 30 == 0:
                lg.delete_old_segments()
    finally:
        lg.close()
        results = [r.communicate(timeout=60) for r in readers]
    for r, (out, err) in zip(readers, results):
        assert (r.returncode, err) == (0, ""), (r.returncode, err[-2000:])
        reads, records = map(int, out.split())
        assert reads > 20 and records > 100, out
