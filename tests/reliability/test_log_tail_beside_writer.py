"""A read-only waiter (StoreReader(...).log, wait_for + reads, in this process) beside the
store's writer in another process (tests/writer_process.py) that appends, runs retention by
size and by time (Log.delete_old_segments, as the cleaner runs it for a compact,delete topic:
segments renamed .deleted and removed), compacts (segments swapped) and
deletes and re-creates the topic. Those move the notify page's list stamp, which must send
the waiter's refresh_tail (log_tail.py) to the full refresh.

Every record the waiter returns is checked against the test's log of what the writer wrote:
that offset, that key, that value (values name the topic's incarnation and the offset);
offsets strictly increase within an incarnation; an offset skipped inside a read is one
compaction may remove (a later record of its key exists); a read below the log start raises
OffsetOutOfRangeError; a deleted topic raises UnknownTopicError naming it; nothing else is
raised (no raw OSError; a SIGBUS would kill the run). The interesting interleavings are forced
with events (the waiter parked in wait_for when the writer deletes segments or the topic, the
waiter between two chunks of one read when compaction swaps the segments), then a seeded
random phase runs the same operations while the waiter reads on in a thread, the topic deleted
and re-created at once too: a waiter that misses both (between two of its looks) reads the new
incarnation's records, which name it, and follows that one from its start (every record still
checked against what the writer wrote in the incarnation it names)."""
from __future__ import annotations

import random
import threading
import time

import pytest

from kstore import StoreReader
from kstore.errors import KStoreError, OffsetOutOfRangeError, UnknownTopicError
from thread_watchdog import join_all
from writer_process import WriterProcess

CFG = ("{'cleanup.policy': 'compact,delete', 'segment.bytes': 1200, 'retention.ms': 60000, "
       "'retention.bytes': -1, 'min.cleanable.dirty.ratio': 0.01, 'delete.retention.ms': 0, "
       "'file.delete.delay.ms': 0}")
KEYS = 7


class Model:
    """What the writer wrote, per incarnation of the topic: offset -> (key, value)."""

    def __init__(self, w: WriterProcess):
        self.w = w
        self.epoch = 0
        self.written: dict[int, dict[int, tuple[bytes, bytes]]] = {}
        self.created = threading.Condition()

    def create(self) -> None:
        with self.created:
            self.epoch += 1
            self.written[self.epoch] = {}
            self.leo = 0
        self.w.run(f"m.create_topic('t', 1, {CFG})", "lg = m.log('t', 0)")
        with self.created:
            self.created.notify_all()

    def append(self, n: int) -> None:
        recs = []
        for _ in range(n):
            o = self.leo
            key, value = b"k%d" % (o % KEYS if o % 3 else o % 2), b"e%d-o%d-" % (self.epoch, o) + b"v" * 40
            self.written[self.epoch][o] = (key, value)
            recs.append((key, value))
            self.leo += 1
        self.w.run(*(f"lg.append({recs[i:i + 10]!r})" for i in range(0, n, 10)))

    def retention_by_size(self) -> None:
        self.w.run("m.alter_topic_config('t', dict(" + CFG + ", **{'retention.bytes': 2400}))",
                   "lg.delete_old_segments()",
                   "m.alter_topic_config('t', " + CFG + ")")

    def retention_by_time(self) -> None:
        self.w.run("t.sleep(120000)", "lg.delete_old_segments()")

    def compact(self) -> None:
        self.w.run("lg.roll()", "m.clean_now()")

    def delete(self) -> None:
        self.w.run("m.delete_topic('t')")

    def check(self, epoch: int, recs, pos: int, last: int) -> int:
        """recs, read at pos with `last` the offset returned before: each one as written, in
        increasing order; what a read skips is compacted away. Returns the new last."""
        written = self.written[epoch]
        expect = max(pos, last + 1)
        for r in recs:
            assert r.offset > last, f"offset {r.offset} after {last} (incarnation {epoch})"
            assert (r.key, r.value) == written[r.offset], (epoch, r.offset, r.key, r.value)
            for o in range(expect, r.offset):          # skipped: a later record of its key exists
                k = written[o][0]
                assert any(written[x][0] == k for x in range(o + 1, len(written))), \
                    f"offset {o} (key {k!r}) missing with no later record of its key"
            last = expect = r.offset
            expect += 1
        return last


def incarnation(value: bytes) -> int:
    """The topic's incarnation a value names (b"e<incarnation>-o<offset>-...")."""
    return int(value[1:value.index(b"-")])


class Waiter:
    """The read-only side: follows the topic through every incarnation. It may miss one: the
    topic deleted and re-created between two of its looks (the read-only Log then follows the new
    directory from its own log start, without an error). The first record it reads of another
    incarnation says so (values name theirs): it is checked exactly against that incarnation, and
    the waiter follows the new topic from its start."""

    def __init__(self, root: str, model: Model):
        self.store = StoreReader(root)
        self.model = model
        self.epoch = model.epoch
        self.ro = self.store.log("t", 0)
        self.pos = 0
        self.last = -1
        self.read_count = 0
        self.out_of_range = 0
        self.deleted = 0               # deletions seen (UnknownTopicError)
        self.missed = 0                # re-creations found from the records alone

    def step(self, timeout: float = 0.05, max_records: int = 40) -> None:
        """One wait and read, every outcome checked."""
        try:
            if not self.ro.wait_for(self.pos, timeout=timeout):
                if self.epoch < self.model.epoch:
                    self.peek()        # a newer incarnation exists: is this log it already?
                return
            recs = self.ro.read(self.pos, max_records=max_records)
        except OffsetOutOfRangeError:
            start, end = self.ro.log_start_offset, self.ro.log_end_offset
            if self.pos > end and self.epoch < self.model.epoch:
                self.peek()            # re-created: the new log ends below the old position
                return
            assert self.pos < start, f"out of range at {self.pos} with the log {start}..{end}"
            self.out_of_range += 1
            self.pos = start
            return
        except UnknownTopicError as e:
            assert "'t'" in str(e) or "t-0" in str(e), str(e)
            self.deleted += 1
            self.reopen()
            return
        if recs and self.switched(recs[0]):
            return
        self.last = self.model.check(self.epoch, recs, self.pos, self.last)
        self.read_count += len(recs)
        if recs:
            self.pos = recs[-1].offset + 1

    def switched(self, first) -> bool:
        """Whether `first` (the first record of a read) belongs to a later incarnation than the
        one followed: then it is checked exactly as that one's, and the waiter follows it from
        its log start (re-reading from there)."""
        e = incarnation(first.value)
        if e == self.epoch:
            return False
        assert self.epoch < e <= self.model.epoch, f"incarnation {e} read while following {self.epoch}"
        assert (first.key, first.value) == self.model.written[e][first.offset], (e, first.offset)
        self.missed += 1
        self.epoch, self.pos, self.last = e, self.ro.log_start_offset, -1
        return True

    def peek(self) -> None:
        """Read the first record at the log start: a later incarnation's switches to it."""
        try:
            recs = self.ro.read(self.ro.log_start_offset, max_records=1)
        except (OffsetOutOfRangeError, UnknownTopicError):
            return                     # retention moved the start, or deleted: the next look
        if recs:
            self.switched(recs[0])

    def reopen(self, timeout: float = 30) -> None:
        """The topic was deleted: wait for a later incarnation and follow it from its start
        (which one the records say: the topic may be deleted and re-created again meanwhile)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.model.created:
                assert self.model.created.wait_for(lambda: self.model.epoch > self.epoch,
                                                   deadline - time.monotonic()), \
                    "the topic was not re-created"
            try:
                self.store.refresh()
                self.ro = self.store.log("t", 0)
                break
            except UnknownTopicError:    # not created yet (or deleted again): look again
                assert time.monotonic() < deadline, "the topic was not re-created"
                time.sleep(0.01)
        self.epoch += 1                   # at least; a later one switches at its first record
        self.pos, self.last = 0, -1


def _parked(fn, waiter: Waiter, offset: int):
    """Run fn in a thread once the waiter is about to sleep in wait_for(offset); the waiter's
    result (what its wait raised or returned)."""
    go = threading.Event()
    t = threading.Thread(target=lambda: (go.wait(30), fn()))
    t.start()
    try:
        go.set()
        return waiter.ro.wait_for(offset, timeout=30)
    finally:
        join_all([t], 60)


def test_waiter_beside_retention_compaction_and_topic_delete(tmp_path, watchdog):
    watchdog(300)
    root = str(tmp_path)
    w = WriterProcess(root, root)
    try:
        model = Model(w)
        model.create()
        model.append(30)
        waiter = Waiter(root, model)
        while waiter.pos < model.leo:
            waiter.step()
        assert waiter.read_count == 30

        # parked in wait_for when retention by time deletes every rolled segment, then appends
        start_before = waiter.ro.log_start_offset
        assert _parked(lambda: (model.retention_by_time(), model.append(5)), waiter, model.leo) is True
        with pytest.raises(OffsetOutOfRangeError):
            waiter.ro.read(start_before)                   # below the new log start
        assert waiter.ro.log_start_offset > start_before
        while waiter.pos < model.leo:
            waiter.step()

        # retention by size while parked
        model.append(60)
        assert _parked(lambda: (model.retention_by_size(), model.append(3)), waiter, waiter.pos) is True
        while waiter.pos < model.leo:
            waiter.step()
        assert waiter.ro.log_start_offset > 0

        # compaction swaps the segments between two chunks of one read
        model.append(80)
        first = waiter.ro.log_start_offset
        chunks = waiter.ro.iter_chunks(first)
        got = list(next(chunks))
        model.compact()
        for c in chunks:
            got.extend(c)
        model.check(waiter.epoch, got, first, -1)            # the old files, as they were
        assert [r.offset for r in got] == list(range(first, first + len(got)))
        waiter.pos, waiter.last = first, -1
        waiter.ro.refresh()
        while waiter.pos < model.leo:
            waiter.step(max_records=1000)                   # the compacted view
        compacted = [r.offset for r in waiter.ro.read(first, max_records=10_000)]
        assert len(compacted) < model.leo - first           # something was cleaned away

        # parked in wait_for when the topic is deleted, then re-created
        with pytest.raises(UnknownTopicError, match="t"):
            _parked(model.delete, waiter, model.leo)
        model.create()
        model.append(4)
        waiter.reopen()
        while waiter.pos < model.leo:
            waiter.step()
        assert [r.value for r in waiter.ro.read(0)][0].startswith(b"e2-o0-")

        # seeded random phase: the waiter reads on in a thread
        rng = random.Random(1909)                          # the operations
        sizes = random.Random(1910)                        # the follower's read sizes (its own:
                                                           # the operations stay the seed's)
        stop = threading.Event()
        errors: list[BaseException] = []

        def follow():
            try:
                while not stop.is_set():
                    waiter.step(timeout=0.05, max_records=sizes.choice([1, 7, 100]))
            except BaseException as e:      # reported by the main thread
                errors.append(e)

        t = threading.Thread(target=follow)
        t.start()
        try:
            for _ in range(60):
                op = rng.choices(["append", "size", "time", "compact", "recreate"],
                                 [10, 2, 1, 2, 2])[0]
                if op == "append":
                    model.append(rng.randint(1, 30))
                elif op == "size":
                    model.retention_by_size()
                elif op == "time":
                    model.retention_by_time()
                elif op == "compact":
                    model.compact()
                else:
                    # deleted and re-created at once (the waiter may see only the new
                    # incarnation's records: both between two of its looks) or after a pause
                    # (it most likely sees the deletion)
                    model.delete()
                    if rng.random() < 0.5:
                        time.sleep(0.2)
                    model.create()
                if errors:
                    break
            model.append(1)
        finally:
            stop.set()
            join_all([t], 60)
        if errors:
            raise errors[0]
        assert not any(isinstance(e, OSError) and not isinstance(e, KStoreError) for e in errors)
        while waiter.epoch < model.epoch or waiter.pos < model.leo:   # it catches up with the last incarnation
            waiter.step()
        assert waiter.epoch == model.epoch
        assert waiter.read_count > 100 and waiter.deleted + waiter.missed >= 1
        waiter.store.close()
    finally:
        assert w.close() == 0


def test_a_waiter_that_misses_a_re_creation_reads_the_new_topic_from_its_start(tmp_path, watchdog):
    """A read-only Log whose topic was deleted and re-created under the same path between two
    refreshes (the directory's inode changed) is a new log: the old incarnation's log start is
    forgotten, so the new records from 0 are readable (failed on main: the old start, clamped to
    the new end, hid them)."""
    watchdog(120)
    root = str(tmp_path)
    w = WriterProcess(root, root)
    try:
        model = Model(w)
        model.create()
        model.append(40)
        model.retention_by_time()                        # the log start moves past 0
        model.append(1)
        with StoreReader(root) as store:
            ro = store.log("t", 0)
            assert ro.wait_for(40, timeout=30) is True and ro.log_start_offset > 3
            # deleted and re-created in one step: the waiter never sees the directory gone
            w.run("m.delete_topic('t'); m.create_topic('t', 1, " + CFG + "); lg = m.log('t', 0); "
                  "lg.append([(b'k', b'a'), (b'k', b'b'), (b'k', b'c')])")
            ro.refresh()
            assert ro.log_end_offset == 3
            assert [r.value for r in ro.read(0)] == [b"a", b"b", b"c"]
    finally:
        assert w.close() == 0
