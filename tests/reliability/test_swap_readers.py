"""Read-only readers beside a writer that swaps segments in (the cleaner's `.cleaned` -> `.swap`
-> final replacement, and a load finishing a swap a crash left behind).

The writer's FileOps calls a hook after every rename and unlink, so a read-only Log refreshes
and reads the partition in each intermediate directory state, deterministically (a reader in
another process sees the same directory: the read-only Log shares nothing with the writer).
A reader must never skip a record that survives compaction, never repeat one, never see the
log start move (it stays 0: nothing is deleted from the front) and never raise.

Found by tests/test_soak_concurrent.py ("SKIP: StoreReader comp: reset from 7991 to 8006, above
the final log start 0"): while the old segments are renamed to `.deleted` and before the
`.swap` is renamed to its final name, no `.log` covers the swapped range.
"""
import os

import pytest

import kstore
from kstore import _core
from kstore.clock import MockTime
from kstore.errors import KStoreError
from kstore.fileio import FileOps
from kstore.manager import LogManager
from kstore.scheduler import MockScheduler

NOW = 1_700_000_000_000


class HookOps(FileOps):
    """The writer's I/O: after each rename/unlink (when armed) the hook sees the new state."""

    def __init__(self, hook):
        self.hook = hook
        self.armed = False
        self.crash_at = None        # a rename source suffix: raise instead of renaming (a crash)

    def rename(self, src, dst):
        if self.armed and self.crash_at and src.endswith(self.crash_at):
            raise SystemExit("simulated crash")
        super().rename(src, dst)
        if self.armed:
            self.hook(f"rename {os.path.basename(src)} -> {os.path.basename(dst)}")

    def unlink(self, path):
        super().unlink(path)
        if self.armed:
            self.hook(f"unlink {os.path.basename(path)}")


class Readers:
    """A long-lived read-only Log (its view carried across the steps, as a polling reader's)
    and a fresh one per step; what each read at each step."""

    def __init__(self, path):
        self.path = path
        self.lasting = kstore.Log.open(path, read_only=True)
        self.seen = []          # (step, reader, start, [offsets read], log end offset)
        self.failures = []
        self.ends = []          # (step, reader, log end offset) at each step

    def observe(self, step):
        fresh = None
        try:
            fresh = kstore.Log.open(self.path, read_only=True)
            for name, lg in (("lasting", self.lasting), ("fresh", fresh)):
                self._read_all(step, name, lg)
        except BaseException as e:     # recorded, never raised into the writer
            self.failures.append(f"{step}: open raised {type(e).__name__}: {e}")
        finally:
            if fresh is not None:
                fresh.close()

    def _read_all(self, step, name, lg):
        try:
            lg.refresh()
            start = lg.log_start_offset
            if start != 0:
                self.failures.append(f"{step}: {name} reader's log start is {start}, not 0")
            offsets, p = [], start
            while True:
                recs = lg.read(p, max_bytes=300)
                if not recs:
                    break
                offsets += [r.offset for r in recs]
                p = recs[-1].offset + 1
            self.ends.append((step, name, lg.log_end_offset))
            if p < lg.log_end_offset:
                self.failures.append(f"{step}: {name} reader stopped at {p} < end {lg.log_end_offset}")
        except BaseException as e:
            kind = "kstore error" if isinstance(e, KStoreError) else "UNEXPECTED"
            self.failures.append(f"{step}: {name} reader raised ({kind}) {type(e).__name__}: {e}")
            return
        if any(b <= a for a, b in zip(offsets, offsets[1:])):
            self.failures.append(f"{step}: REPEAT: {name} reader read offsets out of order")
        self.seen.append((step, name, start, offsets, lg.log_end_offset))

    def check(self, surviving, min_end):
        """Every record that survives the swap existed all along: each full read holds it. The
        log end never goes below min_end (its value before the swap), nor back for a reader."""
        last = {}
        for step, name, end in self.ends:
            if end < max(min_end, last.get(name, 0) if name == "lasting" else 0):
                self.failures.append(f"{step}: {name} reader's log end went back to {end}")
            last[name] = end
        for step, name, _start, offsets, end in self.seen:
            missing = sorted({o for o in surviving if o < end} - set(offsets))
            if missing:
                self.failures.append(f"{step}: SKIP: {name} reader missed {len(missing)} surviving "
                                     f"records, {missing[0]}..{missing[-1]}")
        shown = [f for kind in ("log start", "log end", "SKIP", "REPEAT", "raised", "stopped", "open")
                 for f in [f for f in self.failures if kind in f][:3]]
        assert not self.failures, f"{len(self.failures)} failure(s), some of each kind:\n" + "\n".join(shown)
        self.lasting.close()


def _writer(root, ops):
    t = MockTime(NOW)
    cfg = {"log.segment.bytes": "1000", "log.segment.delete.delay.ms": "0"}
    return LogManager(str(root), cfg, time=t, scheduler=MockScheduler(t), io=ops)


def _fill(m, n=300, keys=23):
    m.create_topic("c", 1, {"cleanup.policy": "compact"})
    for i in range(n):
        m.append("c", b"k%d" % (i % keys), b"v%d" % i, partition=0, timestamp=NOW)


def test_reader_during_cleaner_swap_never_skips(tmp_path, watchdog):
    watchdog(120)
    readers = []
    ops = HookOps(lambda step: readers[0].observe(step))
    with _writer(tmp_path, ops) as m:
        _fill(m)
        lg = m.log("c", 0)
        assert len(lg.segments) >= 4          # several groups: the first and middle ones swap
        readers.append(Readers(lg.dir))
        readers[0].observe("before the clean")
        ops.armed = True
        stats = m.clean_now()
        ops.armed = False
        assert any(s.records_removed for s in stats)
        surviving = [r.offset for r in lg]
    r = readers[0]
    assert len(r.seen) + len(r.failures) > 4      # the hook ran at the swap steps
    r.check(surviving, lg.log_end_offset)


def test_reader_while_load_finishes_a_crashed_swap(tmp_path, watchdog):
    """The writer crashes between retiring the old segments and renaming the .swap (the state
    the soak reader met, left on disk); readers read it, then a load finishes the swap."""
    watchdog(120)
    readers = []
    ops = HookOps(lambda step: readers[0].observe(step))
    m = _writer(tmp_path, ops)
    _fill(m)
    lg = m.log("c", 0)
    d = lg.dir
    readers.append(Readers(d))
    ops.armed, ops.crash_at = True, ".log.swap"
    with pytest.raises(SystemExit):
        m.clean_now()
    ops.armed, ops.crash_at = False, None
    assert any(n.endswith(".log.swap") for n in os.listdir(d))
    for x in m.logs().values():          # the process dies: no close, no clean-shutdown marker
        x.close_handlers()
    m._release_locks()
    m._closed = True
    readers[0].observe("crashed mid-swap")
    ops.armed = True
    with _writer(tmp_path, ops) as m2:
        ops.armed = False
        assert not any(n.endswith(".swap") for n in os.listdir(d))
        surviving = [r.offset for r in m2.log("c", 0)]
    readers[0].check(surviving, surviving[-1] + 1)


def test_reader_while_load_splits_an_overflowed_segment(tmp_path, watchdog):
    """A load splits a segment whose offsets overflow its relative-offset range (.cleaned ->
    .swap, old segment deleted, .swap -> final): a reader beside it sees the records it saw
    before at every step (the batches past the overflow are invisible to it until the split)."""
    watchdog(120)
    d = tmp_path / "t-0"
    d.mkdir()
    far = (1 << 31) + 10
    b = _core.BatchBuilder()
    raw = b""
    for base, n in ((0, 3), (100, 2), (far, 2), (far + 5, 1)):
        b.build([(None, b"o%d" % (base + i), NOW) for i in range(n)], 2, base, NOW, False, 0,
                1 << 62, False, 0)
        raw += b.getvalue()
    (d / "00000000000000000000.log").write_bytes(raw)
    readers = [Readers(str(d))]
    readers[0].observe("before the split")
    ops = HookOps(lambda step: readers[0].observe(step))
    ops.armed = True
    with kstore.Log.open(str(d), io=ops) as lg:
        ops.armed = False
        assert [s.base_offset for s in lg.segments] == [0, far]
    assert len(readers[0].seen) + len(readers[0].failures) > 4
    readers[0].check([0, 1, 2, 100, 101], 102)


class CrashOps(FileOps):
    """Kills the opening process (SystemExit) at its n-th rename or unlink."""

    def __init__(self, n):
        self.left = n

    def _step(self):
        self.left -= 1
        if self.left < 0:
            raise SystemExit("simulated crash")

    def rename(self, src, dst):
        self._step()
        super().rename(src, dst)

    def unlink(self, path):
        self._step()
        super().unlink(path)


def test_a_crash_while_a_load_discards_an_unfinished_split_is_recoverable(tmp_path, watchdog):
    """A split killed before all its `.cleaned` files became `.swap` (they are renamed last-first)
    leaves the old segment, a `.cleaned` piece and a `.swap` piece: the swap is discarded. A load
    killed at any step of that clean-up, then a load, keeps the old records, each once."""
    watchdog(120)
    far = (1 << 31) + 10
    b = _core.BatchBuilder()
    pieces = {}
    for base, n in ((0, 3), (100, 2), (far, 2), (far + 5, 1)):
        b.build([(None, b"o%d" % (base + i), NOW) for i in range(n)], 2, base, NOW, False, 0,
                1 << 62, False, 0)
        pieces[base] = b.getvalue()
    whole = b"".join(pieces.values())
    expected = [0, 1, 2, 100, 101, far, far + 1, far + 5]
    for n in range(12):
        d = tmp_path / f"n{n}" / "t-0"
        d.mkdir(parents=True)
        (d / "00000000000000000000.log").write_bytes(whole)
        (d / "00000000000000000000.log.cleaned").write_bytes(pieces[0] + pieces[100])
        (d / f"{far:020d}.log.swap").write_bytes(pieces[far] + pieces[far + 5])
        try:
            kstore.Log.open(str(d), io=CrashOps(n)).close_handlers()
            crashed = False
        except SystemExit:
            crashed = True
        with kstore.Log.open(str(d)) as lg:
            got = [r.offset for r in lg.read(0, max_bytes=1 << 20)]
        assert got == expected, f"crash at step {n}: read {got}"
        if not crashed:
            break


def test_reader_that_saw_one_swap_reads_through_the_next_one(tmp_path, watchdog):
    """A reader that refreshed during one swap at base 0 and next refreshes during a later swap
    at base 0 (a new `.swap` file under the same name, the clean after more appends) reads the
    new swap file (its old view of the name is stale, not a reason to list again forever)."""
    watchdog(120)
    readers = []

    def at_front_swap(step):
        if step.endswith("-> 00000000000000000000.log.deleted"):
            readers[0].observe(step)
    ops = HookOps(at_front_swap)
    with _writer(tmp_path, ops) as m:
        _fill(m)
        lg = m.log("c", 0)
        readers.append(Readers(lg.dir))
        ops.armed = True
        m.clean_now()
        for i in range(300, 500):
            m.append("c", b"k%d" % (i % 23), b"v%d" % i, partition=0, timestamp=NOW)
        m.clean_now()
        ops.armed = False
        surviving = [r.offset for r in lg]
    r = readers[0]
    assert len([s for s in r.seen if s[1] == "lasting"]) + len(r.failures) >= 2
    r.check(surviving, 0)
