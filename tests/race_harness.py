"""The machinery of the thread-race tests (tests/reliability/): a Race runs step functions
in threads until stopped, recording any exception with its traceback; Acked records what the
appenders were told; the check_* functions turn what readers saw into exact verdicts whose
messages start with the defect class (LOST, WRONG, SKIP, REPEAT, EMPTY READ, UNEXPECTED
EXCEPTION, OFFLINE, ERROR LOGGED); a hang fails join_all with every thread's stack."""
from __future__ import annotations

import logging
import random
import struct
import sys
import threading
import time
import traceback
from typing import Optional

import kstore
from kstore.errors import KStoreError, OffsetOutOfRangeError
from thread_watchdog import join_all

JOIN_TIMEOUT = 25.0    # a thread still running this long after stop is a hang


class Race:
    """The threads of one test: each runs its step function until stop (or until it raises,
    which is recorded with its traceback and ends that thread only)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.failures: list[str] = []
        self.seconds = 0.0
        self.reads = 0          # records the readers checked
        self._lock = threading.Lock()

    def fail(self, msg: str) -> None:
        with self._lock:
            self.failures.append(msg)

    def spawn(self, name: str, step, pause: float = 0.0) -> None:
        def run():
            try:
                while not self.stop.is_set():
                    step()
                    if pause:
                        time.sleep(pause)
            except AssertionError as e:
                self.fail(f"{name}: {e}")
            except BaseException as e:
                kind = "kstore error" if isinstance(e, KStoreError) else "UNEXPECTED EXCEPTION (not a kstore error)"
                self.fail(f"{name}: {kind} {type(e).__name__}: {e}\n{traceback.format_exc()}")
        self.threads.append(threading.Thread(target=run, name=name, daemon=True))

    def run(self, seconds: float) -> None:
        t0 = time.monotonic()
        old = sys.getswitchinterval()
        sys.setswitchinterval(0.0002)     # switch threads 25x more often: races show sooner
        try:
            for t in self.threads:
                t.start()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and not self.failures:
                time.sleep(0.05)
            self.stop.set()
            join_all(self.threads, JOIN_TIMEOUT)      # a hang fails here, with every stack
        finally:
            sys.setswitchinterval(old)
            self.seconds = time.monotonic() - t0

    def check(self, error_logs: "ErrorLogs | None" = None) -> None:
        """Fail with the threads' failures, and the ERROR records logged meanwhile (a dir taken
        offline by a background thread fails every appender: the log names the first cause)."""
        if not self.failures:
            return
        logged = error_logs.records[:2] if error_logs is not None else []
        raise AssertionError(f"{len(self.failures)} thread failure(s):\n" + "\n".join(self.failures[:6])
                             + "".join(f"\nERROR LOGGED meanwhile: {r}" for r in logged))


class Acked:
    """What the appenders were told: offset -> every value acknowledged there (more than one only
    after a truncation let the offset be reused)."""

    def __init__(self) -> None:
        self.at: dict[int, list[bytes]] = {}
        self.keys: dict[int, bytes] = {}         # keyed appends: offset -> key
        self._lock = threading.Lock()

    def add(self, first: int, values: list[bytes], keys=None) -> None:
        with self._lock:
            for i, v in enumerate(values):
                self.at.setdefault(first + i, []).append(v)
                if keys is not None:
                    self.keys[first + i] = keys[i]

    def values(self) -> set:
        return {(o, v) for o, vs in self.at.items() for v in vs}


def appender(race: Race, acked: Acked, append, w: int, keyed: int = 0, seed: int = 0):
    """A step that appends 1-5 records valued b"w<w>:<seq>" and records the acknowledged offsets.
    keyed > 0 gives each record one of that many keys (compacted topics)."""
    rng = random.Random(seed * 1000 + w)
    seq = [0]

    def step():
        n = rng.randint(1, 5)
        vals = [b"w%d:%d" % (w, seq[0] + i) for i in range(n)]
        seq[0] += n
        recs = [(b"k%d" % rng.randrange(keyed) if keyed else None, v) for v in vals]
        info = append(recs)
        first = info.first_offset
        assert info.last_offset == first + n - 1, \
            f"WRONG: an append of {n} records got offsets {first}..{info.last_offset}"
        acked.add(first, vals, [k for k, _v in recs] if keyed else None)
    return step


def single_appender(acked: Acked, m, topic: str, w: int):
    """A step that appends one record with LogManager.append (the producer path, partition 0)."""
    seq = [0]

    def step():
        v = b"w%d:%d" % (w, seq[0])
        seq[0] += 1
        md = m.append(topic, None, v, partition=0)
        acked.add(md.offset, [v])
    return step


def check_run(name: str, recs, pos: int, expect_dense: bool = True) -> None:
    """A read at pos returned recs: a contiguous run of offsets starting at pos (compacted
    logs: increasing, starting at or after pos)."""
    offs = [r.offset for r in recs]
    if not offs:
        return
    if expect_dense:
        if offs[0] != pos:
            raise AssertionError(f"SKIP: {name} read at offset {pos} returned first offset {offs[0]}")
        for a, b in zip(offs, offs[1:]):
            if b != a + 1:
                raise AssertionError(f"SKIP: {name} read at {pos}: offset {a} followed by {b} "
                                     f"(offsets {offs[0]}..{offs[-1]})")
    else:
        if offs[0] < pos or any(b <= a for a, b in zip(offs, offs[1:])):
            raise AssertionError(f"REPEAT: {name} read at {pos} returned offsets {offs[:20]}...")


def check_seen(name: str, seen: dict, acked: Acked) -> None:
    """Every record a reader saw was acknowledged at that offset with that value."""
    for o, v in seen.items():
        vals = acked.at.get(o)
        if vals is None or v not in vals:
            raise AssertionError(f"WRONG: {name} read offset {o} = {v!r}; acknowledged there: {vals}")


def check_batches(view: memoryview, pos: int) -> tuple[Optional[int], Optional[int]]:
    """Raw batches from read_batches: CRC-32C correct, back to back, the first holding pos.
    Returns (first base offset, next offset after the last batch), (None, None) for no batch."""
    data = bytes(view)
    at = 0
    expect: Optional[int] = None
    first: Optional[int] = None
    while at < len(data):
        base, length = struct.unpack_from(">qi", data, at)
        crc, = struct.unpack_from(">I", data, at + 17)
        delta, = struct.unpack_from(">i", data, at + 23)
        end = at + 12 + length
        assert kstore.crc32c(data[at + 21:end]) == crc, \
            f"WRONG: read_batches at {pos}: bad CRC in batch at offset {base}"
        if expect is None:
            first = base
            assert base <= pos <= base + delta, f"SKIP: read_batches at {pos} began with batch {base}..{base + delta}"
        else:
            assert base == expect, f"SKIP: read_batches at {pos}: batch {base} follows one ending at {expect - 1}"
        expect = base + delta + 1
        at = end
    return first, expect


def column_values(cols) -> list[tuple[int, bytes]]:
    a = cols.arrays()
    vo, vd = a["value_offsets"], a["value_data"].tobytes()
    return [(int(o), vd[vo[i]:vo[i + 1]]) for i, o in enumerate(a["offset"])]


def final_records(lg) -> list:
    out, pos = [], lg.log_start_offset
    while pos < lg.log_end_offset:
        recs = lg.read(pos, max_bytes=1 << 20)
        assert recs, f"EMPTY READ: final read at {pos} < log end {lg.log_end_offset}"
        out += recs
        pos = recs[-1].offset + 1
    return out


def check_dense_exact(lg, acked: Acked, start: int = 0) -> None:
    """No removals: the log holds exactly the acknowledged records, densely, from start."""
    recs = final_records(lg)
    got = {r.offset: r.value for r in recs}
    for o, vals in sorted(acked.at.items()):
        assert len(vals) == 1, f"REPEAT: offset {o} was acknowledged {len(vals)} times: {vals}"
        if o < start:
            continue
        if o not in got:
            raise AssertionError(f"LOST: acknowledged offset {o} ({vals[0]!r}) is missing")
        assert got[o] == vals[0], f"WRONG: offset {o} holds {got[o]!r}, acknowledged {vals[0]!r}"
    offs = [r.offset for r in recs]
    assert offs == list(range(start, start + len(offs))), "SKIP: final log offsets are not dense"
    assert lg.log_end_offset == max(acked.at) + 1, \
        f"LOST: log end {lg.log_end_offset}, acknowledged up to {max(acked.at)}"


def chaser(race: Race, lg, name: str, seen: dict, max_bytes: int, dense: bool = True,
           removals: bool = False):
    """A reader that follows the log end with small reads, resuming at last offset + 1."""
    st = {"pos": None}

    def step():
        if st["pos"] is None:
            st["pos"] = lg.log_start_offset
        pos = st["pos"]
        end = lg.log_end_offset
        try:
            recs = lg.read(pos, max_bytes=max_bytes)
        except OffsetOutOfRangeError:
            if not removals:
                raise
            st["pos"] = lg.log_start_offset if pos < lg.log_start_offset else min(pos, lg.log_end_offset)
            return
        if not recs:
            if pos < end and dense and not removals:
                raise AssertionError(f"EMPTY READ: {name} read at {pos} below the log end {end}")
            if pos < end and not dense:
                st["pos"] = next((s.base_offset for s in lg.segments if s.base_offset > pos), pos)
            time.sleep(0.001)
            return
        if removals and dense and recs[0].offset > pos:
            # offsets below the log start were removed legitimately (delete_records, retention)
            start = lg.log_start_offset
            if recs[0].offset > start:
                raise AssertionError(
                    f"SKIP: {name} read at offset {pos} returned first offset {recs[0].offset}, "
                    f"though only offsets below {start} (the log start now) were removed; "
                    f"segments {[s.base_offset for s in lg.segments]}, log end {lg.log_end_offset}")
            pos = recs[0].offset
        check_run(name, recs, pos, dense)
        race.reads += len(recs)
        for r in recs:
            if r.offset in seen and not removals and seen[r.offset] != r.value:
                raise AssertionError(f"WRONG: {name} read offset {r.offset} as {seen[r.offset]!r} "
                                     f"then {r.value!r}")
            seen[r.offset] = r.value
        st["pos"] = recs[-1].offset + 1
    return step


class ErrorLogs(logging.Handler):
    """kstore log records at ERROR or above (an ordinary race must not log one)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(self.format(record))


def check_manager_healthy(m, error_logs) -> None:
    assert m.offline_dirs == {}, f"OFFLINE: a benign race took a log dir offline: {m.offline_dirs}"
    assert not error_logs.records, "ERROR LOGGED for an ordinary race:\n" + "\n".join(error_logs.records[:3])
    if m.cleaner is not None:
        assert m.cleaner.dead_threads == 0, "a cleaner thread died"
        assert m.uncleanable_partitions() == {}, f"uncleanable: {m.uncleanable_partitions()}"


def check_compacted(lg, acked: Acked) -> None:
    """Compacted: every record present was acknowledged at its offset; each key's latest
    acknowledged record at or above the log start is present."""
    keys, start = acked.keys, lg.log_start_offset
    recs = final_records(lg)
    offs = [r.offset for r in recs]
    assert offs == sorted(set(offs)), "REPEAT: compacted log offsets are not increasing"
    latest: dict = {}
    for o in sorted(acked.at):
        latest[keys[o]] = o
    got = {r.offset: (r.key, r.value) for r in recs}
    for o, (k, v) in got.items():
        assert acked.at.get(o) == [v] and keys[o] == k, \
            f"WRONG: offset {o} holds {k!r}={v!r}, acknowledged {keys.get(o)!r}={acked.at.get(o)}"
    for k, o in latest.items():
        if o >= start and o not in got:
            raise AssertionError(f"LOST: key {k!r}'s latest record (offset {o}, {acked.at[o]}) was compacted away")
    assert lg.log_end_offset == max(acked.at) + 1
