"""The tail refresh of a read-only log (notify.LogNotifier.catch_up -> ro_refresh.scan ->
ReadOnlySegment.extend_tail): while the notification page's list stamp is the one read before
the reader's last full refresh, an append is learnt from the writer's size hint alone (one pread
of the new bytes through the kept descriptor, validated); every other change moves the stamp
and takes the full refresh, and hints that do not match the bytes change nothing."""
from __future__ import annotations

import collections
import os
import threading
import time

import pytest

import kstore
from kstore import _core, _notify, segment_ro
from kstore.fileio import FileOps, get_file_ops
from kstore.notify import NOTIFY_FILE
from thread_watchdog import join_all

REC = (b"k" * 16, b"v" * 100)


class Ops(FileOps):
    """The reader's I/O, counted."""

    def __init__(self):
        self.reset()
        self.maps: list = []

    def reset(self):
        self.read = collections.Counter()
        self.meta = collections.Counter()

    def pread(self, fd, n, offset):
        data = super().pread(fd, n, offset)
        self.read[os.readlink(f"/proc/self/fd/{fd}").rsplit(".", 1)[1]] += len(data)
        return data

    def listdir(self, path):
        self.meta["listdir"] += 1
        return super().listdir(path)

    def open(self, path, flags, mode=0o644):
        self.meta["open"] += 1
        return super().open(path, flags, mode)

    def close(self, fd):
        self.meta["close"] += 1
        return super().close(fd)

    def map(self, fd, length, writable):
        m = super().map(fd, length, writable)
        self.maps.append(m)
        return m

    def stat(self, fd):
        self.meta["fstat"] += 1
        return super().stat(fd)

    def stat_path(self, path, follow_symlinks=False):
        self.meta["stat_path"] += 1
        return super().stat_path(path, follow_symlinks)


def _page(path: str) -> _notify.Bell:
    """Another mapping of the partition's notification page (a second process's view)."""
    io = get_file_ops()
    fd = io.open(os.path.join(path, NOTIFY_FILE), os.O_RDWR)
    try:
        return _notify.Bell(io.map(fd, _notify.SIZE, True))
    finally:
        io.close(fd)


def _catch_up(ro) -> None:
    """What a waiter does after a wake: arm, then catch up on the word and hints."""
    n = ro.notifier
    bell = n.current_bell(time.monotonic())
    n.catch_up(bell, bell.arm())


class _Plain(Ops):
    """Ops without its pread override: FileOps' own (compiled) pread_validate is used."""

    pread = FileOps.pread


def _records(lg, start=0):
    return [(r.offset, r.key, r.value) for r in lg.read(start, max_bytes=1 << 24)]


def _tailing(open_log, log_dir, cfg=None, ops=None):
    """A writer and a read-only reader whose next catch-up is a tail refresh."""
    lg = open_log(cfg)
    lg.append([REC])
    ops = Ops() if ops is None else ops
    ro = open_log(cfg, path=log_dir, read_only=True, io=ops)
    lg.append([REC])
    _catch_up(ro)                     # a full refresh: the stamp read before it is trusted
    assert ro.log_end_offset == 2
    return lg, ro, ops


def test_the_stamp_moves_on_every_change_but_an_append(open_log, log_dir):
    lg = open_log()
    assert lg.wait_for(0, timeout=0) is False        # a first wait maps the page (lazily)
    page = _page(log_dir)
    stamps = [page.tail()[0]]
    assert stamps[0] > 0
    lg.append([REC])
    assert page.tail() == (stamps[0], 0, lg.segments[-1].size) and lg.segments[-1].size > 0
    lg.append([REC] * 1000)
    assert page.tail() == (stamps[0], 0, lg.segments[-1].size)
    for change in (lambda: lg.roll(), lambda: lg.truncate_to(1)):
        change()
        stamps.append(page.tail()[0])
    word = page.load()
    lg.close()                          # wakes, changes no segment: the same stamp
    assert page.tail()[0] == stamps[-1] and page.load() != word
    lg = open_log()                  # a restarted writer: the page untouched until its first
    assert page.tail()[0] == stamps[-1]              # change, which brings a new stamp
    lg.append([REC])
    stamps.append(page.tail()[0])
    assert stamps == sorted(set(stamps)) and len(stamps) == 4
    assert page.tail()[1:] == (lg.segments[-1].base_offset, lg.segments[-1].size)
    page.close()


def test_an_append_is_learnt_from_the_size_hint_alone(open_log, log_dir):
    lg, ro, ops = _tailing(open_log, log_dir, {"index.interval.bytes": 1 << 20})
    for n in (1, 1000, 3, 1):
        before = ro.segments[-1].size
        lg.append([(b"%016d" % i, b"v" * 100) for i in range(n)])
        ops.reset()
        _catch_up(ro)
        # no listing, no stat, no open: one pread of exactly the new bytes
        assert ops.meta == {} and ops.read == {"log": lg.segments[-1].size - before}
        assert ro.log_end_offset == lg.log_end_offset
        assert ro.segments[-1].size == lg.segments[-1].size
        assert _records(ro) == _records(lg)


def test_a_woken_waiter_takes_the_tail_refresh(open_log, log_dir, watchdog):
    # another thread's append wakes the waiter, which learns it with one pread: nothing listed,
    # stat'd or opened
    watchdog(60)
    lg, ro, ops = _tailing(open_log, log_dir)
    for n in (1, 1000):
        end = lg.log_end_offset
        before = ro.segments[-1].size
        ops.reset()
        t = threading.Thread(target=lambda n=n: (time.sleep(0.05), lg.append([REC] * n)))
        t.start()
        assert ro.wait_for(end, timeout=30) is True
        join_all([t], 30)
        assert ops.meta == {} and ops.read == {"log": lg.segments[-1].size - before}
        assert ro.log_end_offset == end + n and _records(ro, end) == _records(lg, end)


def test_a_woken_consumer_wait_takes_the_tail_refresh(open_log, log_dir, tmp_path, watchdog):
    # fetcher.wait_logs (Consumer.poll's sleep) over two logs: an append to the second wakes
    # it, which learns it by the tail step (one pread of the new bytes, nothing listed, opened
    # or stat'd) and returns; the first log, unchanged since its catch-up, reads nothing
    from kstore.fetcher import wait_logs
    watchdog(60)
    other = open_log(path=str(tmp_path / "other-0"))
    other.append([REC])
    ro_other = open_log(path=str(tmp_path / "other-0"), read_only=True)
    lg, ro, ops = _tailing(open_log, log_dir)
    for n in (1, 1000):
        end = lg.log_end_offset
        before = ro.segments[-1].size
        ops.reset()
        t = threading.Thread(target=lambda n=n: (time.sleep(0.05), lg.append([REC] * n)))
        t.start()
        wait_logs([ro_other, ro], [ro_other.log_end_offset, end], 30)
        join_all([t], 30)
        assert ops.meta == {} and ops.read == {"log": lg.segments[-1].size - before}
        assert ro.log_end_offset == end + n and _records(ro, end) == _records(lg, end)


def test_woken_reads_nothing_when_the_word_did_not_move(open_log, log_dir):
    lg, ro, ops = _tailing(open_log, log_dir)
    n = ro.notifier
    bell = n.current_bell(time.monotonic())
    ops.reset()
    assert n.woken(bell, 1) is False and ops.read == {}      # caught up: the counter is seen
    before = ro.segments[-1].size
    lg.append([REC])
    assert n.woken(bell, 1) is True and ro.log_end_offset == 3
    assert ops.read == {"log": lg.segments[-1].size - before}     # one pread of the new batch
    ops.reset()
    assert n.woken(bell, 2) is False and ops.read == {}      # the same counter again
    lg.roll()
    lg.append([REC])
    assert n.woken(bell, 3) is False and ro.log_end_offset == 3   # a new stamp: the full look
    _catch_up(ro)
    assert ro.log_end_offset == 4


def test_every_descriptor_and_mapping_of_tail_refreshes_is_released(open_log, log_dir):
    # big batches pass the reader's mapping: remapped by the tail refresh (the old mapping
    # closed at once); a roll makes a new last segment; at close nothing is left open or mapped
    # (a segment dropped for a replaced file keeps its mapping for the readers still on it
    # until it is freed: not done here, ops.maps holds them)
    ops = Ops()
    lg = open_log()
    lg.append([REC])
    ro = open_log(path=log_dir, read_only=True, io=ops)
    opens_before = ops.meta["open"]
    for i in range(12):
        lg.append([REC] * 1000)
        _catch_up(ro)
        assert ro.log_end_offset == lg.log_end_offset
        if i == 5:
            lg.roll()
        assert sum(not m.closed for m in ops.maps) <= 2 * len(ro.segments) + 1
    assert _records(ro, 6000) == _records(lg, 6000)
    ro.close()
    assert ops.meta["open"] > opens_before and ops.meta["open"] == ops.meta["close"]
    assert [m for m in ops.maps if not m.closed] == [] and len(ops.maps) > 4


def test_the_index_copies_follow_tail_refreshes(open_log, log_dir, monkeypatch):
    # extended now and then (segment_ro._TAIL_INDEX_EVERY / _LAG): always a prefix of the
    # writer's entries, reads and time lookups the same as the writer's meanwhile
    lg, ro, ops = _tailing(open_log, log_dir, {"index.interval.bytes": 300})

    def entries(seg):
        return [idx.entries_array().tobytes() for idx in (seg.offset_index, seg.time_index)]
    copied = set()
    for i in range(60):
        lg.append([(b"%016d" % i, b"v" * 100)] * (1 + i % 3 * 400))
        _catch_up(ro)
        assert ro.log_end_offset == lg.log_end_offset
        mine, theirs = entries(ro.segments[-1]), entries(lg.segments[-1])
        assert all(t.startswith(m) for m, t in zip(mine, theirs))
        copied.add(ro.segments[-1].offset_index.entries)
        assert _records(ro, lg.log_end_offset - 3) == _records(lg, lg.log_end_offset - 3)
        assert ro.offset_for_timestamp(0) == lg.offset_for_timestamp(0)
    assert len(copied) > 3                       # extended along the way, not only at the start
    monkeypatch.setattr(segment_ro, "_TAIL_INDEX_EVERY", 1)
    lg.append([REC] * 10)
    _catch_up(ro)
    assert entries(ro.segments[-1]) == entries(lg.segments[-1])
    assert ro.segments[-1].offset_index.entries > 30
    assert _records(ro, 500) == _records(lg, 500)


def test_hints_that_do_not_match_the_bytes_change_nothing(open_log, log_dir):
    lg, ro, ops = _tailing(open_log, log_dir)
    page = _page(log_dir)
    stamp, base, size = page.tail()
    # a size hint past the data (zeros there): the full refresh looks, finds nothing new
    page.bump_end(lg.log_end_offset + 5, base, size + 500)
    ops.reset()
    _catch_up(ro)
    assert ops.meta["stat_path"] >= 1 and ro.log_end_offset == lg.log_end_offset == 2
    assert ro.segments[-1].size == size
    # a hint inside a batch (the writer's, spoiled after it): nothing half-seen, the full
    # refresh learns the whole batch
    lg.append([REC] * 1000)
    stamp, base, size = page.tail()
    page.bump_end(lg.log_end_offset, base, size - 10)
    _catch_up(ro)
    assert ro.log_end_offset == 1002 and ro.segments[-1].size == size
    # more than a tail refresh reads at once: the full refresh's windows
    assert ro.segments[-1].extend_tail(size + segment_ro._TAIL_MAX + 1) is False
    assert ro.segments[-1].size == size
    # a base that is not the reader's last segment's: the full refresh
    lg.append([REC])
    page.bump_end(lg.log_end_offset, base + 7, lg.segments[-1].size)
    ops.reset()
    _catch_up(ro)
    assert ops.meta["stat_path"] >= 1 and _records(ro) == _records(lg)
    page.close()


@pytest.mark.parametrize("counted", [True, False], ids=["pread", "compiled"])
def test_refresh_tail_learns_exactly_the_validated_bytes_or_changes_nothing(open_log, log_dir,
                                                                            counted):
    # Log.refresh_tail, what a woken waiter calls: the writer's (base, size) hints name the new
    # bytes; True only when the last segment is that base and the bytes up to size validate.
    # counted: an overriding FileOps.pread sees the read; else FileOps' compiled pread_validate
    lg, ro, ops = _tailing(open_log, log_dir, ops=None if counted else _Plain())
    base, size = lg.segments[-1].base_offset, lg.segments[-1].size
    assert ro.refresh_tail(base, size) is True and ro.log_end_offset == 2   # nothing new
    lg.append([(b"%016d" % i, b"v" * 100) for i in range(1000)])
    end = lg.segments[-1].size
    ops.reset()
    assert ro.refresh_tail(base + 1, end) is False            # not the reader's last segment
    assert ro.refresh_tail(base, end - 10) is False            # inside a batch: nothing half-seen
    assert ro.refresh_tail(base, end + 61) is False            # past the data (zeros there)
    assert (ro.log_end_offset, ro.segments[-1].size) == (2, size) and ops.meta == {}
    ops.reset()
    assert ro.refresh_tail(base, end) is True
    assert ops.meta == {} and ops.read == ({"log": end - size} if counted else {})  # one pread
    assert ro.log_end_offset == 1002 and ro.segments[-1].size == end
    assert _records(ro, 2) == _records(lg, 2)
    # a torn batch (a writer killed mid-copy): its bytes never become visible
    with open(lg.segments[-1].log_path, "r+b") as f:
        f.seek(end)
        f.write(bytes(range(90)))
    assert ro.refresh_tail(base, end + 90) is False and ro.log_end_offset == 1002
    assert lg.refresh_tail(base, end) is False                # a writable log: not its path
    ro.close()
    assert ro.refresh_tail(base, end) is False


def _entries(seg) -> list:
    return [seg.offset_index.entry(i) for i in range(seg.offset_index.entries)]


def test_a_woken_waiters_tail_refresh_leaves_the_index_copies_for_its_idle_moment(
        open_log, log_dir, watchdog):
    # refresh_tail (on the append-to-visible path) does not read the indexes (~150-250 µs
    # cold); the waiter copies them when it finds nothing new and is about to sleep; past
    # _TAIL_INDEX_LAG_MAX they are copied at once
    watchdog(60)
    lg, ro, ops = _tailing(open_log, log_dir, {"index.interval.bytes": 4096})
    base = lg.segments[-1].base_offset
    before = _entries(ro.segments[-1])
    for _ in range(3):
        lg.append([REC] * 1000)
        assert ro.refresh_tail(base, lg.segments[-1].size) is True
    assert len(_entries(lg.segments[-1])) >= len(before) + 2     # (one entry a batch at most)
    assert _entries(ro.segments[-1]) == before and ro.log_end_offset == 3002
    ops.reset()
    assert ro.wait_for(ro.log_end_offset, timeout=0.05) is False   # idle: copies them
    assert _entries(ro.segments[-1]) == _entries(lg.segments[-1])
    assert ops.read["index"] > 0 and ops.read["timeindex"] > 0
    ops.reset()
    ro.catch_up_index()                                             # nothing left to copy
    assert ops.read == {} and ops.meta == {}
    # past the bound the tail refresh copies them itself, not before
    seg = ro.segments[-1]
    indexed = _entries(seg)[-1][1]
    while True:
        lg.append([REC] * 1000)
        end = lg.segments[-1].size
        assert ro.refresh_tail(base, end) is True
        if _entries(seg)[-1][1] != indexed:
            break
        assert end - indexed <= segment_ro._TAIL_INDEX_LAG_MAX
    assert end - indexed > segment_ro._TAIL_INDEX_LAG_MAX
    assert _entries(seg) == _entries(lg.segments[-1])
    assert _records(ro, 3000) == _records(lg, 3000)


def test_a_page_written_by_an_older_writer_is_not_trusted(open_log, log_dir):
    lg, ro, ops = _tailing(open_log, log_dir)
    page = _page(log_dir)
    assert page.tail()[0] > 0
    page.init_header(0)            # an older kstore's writer: its pid at 40, the stamp's not
    with open(os.path.join(log_dir, NOTIFY_FILE), "r+b") as f:
        f.seek(40)
        f.write((os.getpid() + 1).to_bytes(8, "little"))
    assert page.tail()[0] == -1
    lg.append([REC])
    ops.reset()
    _catch_up(ro)
    assert ops.meta["stat_path"] >= 1 and ro.log_end_offset == 3
    page.close()


def test_a_size_hint_that_does_not_explain_the_end_hint_takes_the_full_refresh(open_log, log_dir):
    # a writer that stores the end but not the size (an older kstore under a reused pid): the
    # tail refresh finds nothing at the stale size, the end hint says there is more
    lg, ro, ops = _tailing(open_log, log_dir)
    page = _page(log_dir)
    stale = page.tail()[2]
    lg.append([REC] * 3)
    page.bump_end(lg.log_end_offset, 0, stale)
    ops.reset()
    _catch_up(ro)
    assert ops.meta["stat_path"] >= 1 and ro.log_end_offset == lg.log_end_offset == 5
    assert _records(ro) == _records(lg)
    page.close()


def test_a_truncation_back_to_the_same_size_is_seen(open_log, log_dir):
    # the size hint alone cannot tell a replaced file of the same length: the stamp does
    lg, ro, ops = _tailing(open_log, log_dir)
    lg.append([(b"k" * 16, b"old%04d" % i + b"v" * 93) for i in range(3)])
    _catch_up(ro)
    assert ro.log_end_offset == 5
    size = lg.segments[-1].size
    lg.truncate_to(2)
    lg.append([(b"k" * 16, b"new%04d" % i + b"v" * 93) for i in range(3)])
    assert lg.segments[-1].size == size and lg.log_end_offset == 5
    _catch_up(ro)
    assert _records(ro, 2) == _records(lg, 2) and _records(ro, 2)[0][2].startswith(b"new")


def test_tail_refreshes_beside_appends_rolls_and_truncations_in_threads(open_log, log_dir, watchdog):
    # the reader waits and reads while another thread appends, rolls and truncates: every record
    # it is handed is the one written at its offset (the value names it), offsets contiguous
    # but for the holes a cut inside a batch leaves (see below and the test after this one);
    # at the end it sees exactly what a fresh read-only open sees
    watchdog(120)
    lg = open_log({"segment.bytes": 64 << 10})
    lg.append([(b"k", b"0:0")])
    ro = open_log(path=log_dir, read_only=True)
    gen = [0]
    done = threading.Event()
    errors: list = []

    # Kafka's truncateTo(t) drops whole batches and sets LEO = t: a cut inside a batch leaves
    # the offsets [batch base, t) unused for good (the writer's own reads skip them too). The
    # writer records each such hole before it truncates; the reader may jump over exactly these.
    holes: dict[int, int] = {}
    batches: list[tuple[int, int]] = []
    # once per run the reader is held behind the batch the first truncation cuts (gate = its
    # base) until the cut and the next append are done, then follows the cut: the hole jump
    # is taken every run, not only when load makes the reader lag
    gate: list = [None]
    parked, cut = threading.Event(), threading.Event()
    jumps: list[int] = []

    def write():
        try:
            for i in range(600):
                end = lg.log_end_offset
                if i % 97 == 96:
                    t = max(1, end - 5)
                    base = next((b for b, n in reversed(batches) if b <= t < b + n), t)
                    if base < t:
                        holes[base] = t
                    lg.truncate_to(t)
                    gen[0] += 1
                    continue
                n = 1 if i % 4 else 200
                if i == 92:
                    gate[0] = end
                    assert parked.wait(60)
                batches.append((end, n))
                lg.append([(b"k", b"%d:%d" % (gen[0], end + j)) for j in range(n)])
                if i == 97:
                    cut.set()
                if i % 50 == 49:
                    lg.roll()
        except BaseException as e:       # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    def read():
        try:
            nxt = 0
            while not done.is_set() or ro.log_end_offset < lg.log_end_offset:
                if gate[0] is not None and not parked.is_set():
                    parked.set()
                    assert cut.wait(60)
                    ro.refresh()
                if not ro.wait_for(nxt, timeout=0.2):
                    ro.refresh() if done.is_set() else None
                    continue
                recs = ro.read(nxt, max_bytes=1 << 20)
                for r in recs:
                    # the next offset; or, once the reader follows the cut, the end of the
                    # truncation hole it falls in (a view from before the cut still has it)
                    if r.offset != nxt:
                        nxt = next((e for b, e in list(holes.items()) if b <= nxt < e), nxt)
                        jumps.append(nxt)
                    assert r.offset == nxt and r.value.split(b":")[1] == b"%d" % r.offset
                    nxt += 1
                nxt = min(nxt, ro.log_end_offset)
        except BaseException as e:       # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for t in threads:
        t.start()
    join_all(threads, 100)
    assert errors == []
    assert len(holes) == 6 and jumps[0] == holes[gate[0]] and set(jumps) <= set(holes.values())
    ro.refresh()
    fresh = open_log(path=log_dir, read_only=True)
    assert _records(ro) == _records(fresh) == _records(lg)
    assert [s.base_offset for s in ro.segments] == [s.base_offset for s in lg.segments]


def test_reader_behind_a_cut_inside_a_batch_is_handed_the_writers_hole(open_log, log_dir):
    # the interleaving the threaded test above hits under load, step by step: the reader knows
    # of a 200-record batch but has not read it when the writer truncates inside it (Kafka's
    # truncateTo: the whole batch goes, LEO = the target, so offsets [base, target) stay unused)
    # and appends again. A view from before the cut still serves the old batch whole; once the
    # reader follows the cut it is handed exactly the writer's records: the next one after the
    # hole, never a record from it, never a gap elsewhere.
    lg = open_log({"segment.bytes": 64 << 10})
    lg.append([(b"k", b"0:0")])
    ro = open_log(path=log_dir, read_only=True)
    lg.append([(b"k", b"0:%d" % (1 + j)) for j in range(200)])          # batch 1..200
    assert ro.wait_for(1, timeout=5) and ro.log_end_offset == 201
    assert lg.truncate_to(196) and lg.log_end_offset == 196
    # the reader's view from before the cut: the old batch, each record the one written there
    assert [(r.offset, r.value) for r in ro.read(1)] == [(o, b"0:%d" % o) for o in range(1, 201)]
    lg.append([(b"k", b"1:196"), (b"k", b"1:197")])
    assert [(r.offset, r.value) for r in lg.read(1)] == [(196, b"1:196"), (197, b"1:197")]
    ro.refresh()
    assert ro.log_end_offset == 198
    for start in (1, 100, 195, 196):                 # from anywhere in the hole: its end
        assert [(r.offset, r.value) for r in ro.read(start)] == [(196, b"1:196"), (197, b"1:197")]
    assert [(r.offset, r.value) for r in ro.read(0)] == [(0, b"0:0"), (196, b"1:196"), (197, b"1:197")]
    assert [s.base_offset for s in ro.segments] == [s.base_offset for s in lg.segments] == [0]



def test_tail_refreshes_carry_the_max_timestamp_and_its_offset(open_log, log_dir):
    # extend_tail sets the segment's (max timestamp, its offset: the batch's last offset) from
    # the validated batches: raised by a later maximum, kept when a batch's timestamps are
    # older; time lookups and time-based retention read it
    lg, ro, ops = _tailing(open_log, log_dir)
    seg = lg.segments[-1]
    t = int(time.time() * 1000) + 3_600_000             # above the two records' "now"
    steps = [(1, 5_000, (t + 5_000, 2)), (1002, 9_000, (t + 9_000, 1004)),
             (2, 7_000, (t + 9_000, 1004)), (3, 12_000, (t + 12_000, 1009))]
    for n, last_ts, want in steps:
        lg.append([(b"k" * 16, b"v" * 100, t + last_ts - n + 1 + i) for i in range(n)])
        before = ro.segments[-1].size
        ops.reset()
        assert ro.refresh_tail(seg.base_offset, seg.size) is True
        assert ops.meta == {} and ops.read == {"log": seg.size - before}   # one pread
        assert ro.segments[-1].load_max_timestamp() == want
        assert ro.segments[-1].size == seg.size and ro.log_end_offset == lg.log_end_offset
    assert ro.offset_for_timestamp(t + 8_999) == lg.offset_for_timestamp(t + 8_999) == 1003
    assert ro.offset_for_timestamp(t + 12_000) == 1009 and ro.offset_for_timestamp(-3) == 1009


def _file(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _flip(path: str, pos: int) -> bytes:
    """Change the byte at pos of the file in place (what a disk's rot would do); its new value."""
    with open(path, "r+b") as f:
        f.seek(pos)
        b = bytes([f.read(1)[0] ^ 0x5A])
        f.seek(pos)
        f.write(b)
    return b


def test_a_read_skips_the_crcs_its_refresh_checked(open_log, log_dir):
    # a refresh validates new bytes in a pread copy (CRC included) before they become visible;
    # reads of those batches through the same mapping do not hash them again. The guarantee is
    # the README's: each batch's CRC is verified once per mapping of the file (a fresh mapping,
    # here a new reader, verifies it again and names the batch)
    lg, ro, ops = _tailing(open_log, log_dir, {"index.interval.bytes": 1 << 20})
    base, start = lg.segments[-1].base_offset, lg.segments[-1].size
    lg.append([(b"%016d" % i, b"v" * 100) for i in range(1000)])
    end = lg.segments[-1].size
    assert ro.refresh_tail(base, end) is True and ro.log_end_offset == 1002
    # change one value byte of record 500 (offset 502) after the refresh checked the batch
    path = lg.segments[-1].log_path
    at = _file(path).index(b"%016d" % 500, start) + 16 + 2   # key, value length (2 bytes)
    new = _flip(path, at)
    got = {r.offset: r.value for r in ro.read(2, max_bytes=1 << 24)}
    assert len(got) == 1000 and got[502] == new + b"v" * 99
    assert got[501] == got[503] == b"v" * 100
    # the writer's own mapping never took that refresh's word for it: its read checks the CRC
    with pytest.raises(kstore.CorruptRecordError, match=f"{path}.*position {start}"):
        lg.read(2, max_bytes=1 << 24)
    # a later batch is checked by its own refresh, and the range grows with it
    lg.append([(b"%016d" % i, b"w" * 100) for i in range(10)])
    end2 = lg.segments[-1].size
    assert ro.refresh_tail(base, end2) is True
    assert [r.value for r in ro.read(1002)] == [b"w" * 100] * 10
    # a new reader maps the file again: the changed batch, now followed by a valid one, is
    # corruption at its exact position
    ro2 = open_log(path=log_dir, read_only=True)
    with pytest.raises(kstore.CorruptRecordError, match=f"CRC mismatch.*{path}, position {start}"):
        ro2.read(2, max_bytes=1 << 24)


def test_a_full_refresh_also_counts_as_the_check(open_log, log_dir):
    # the full refresh (a listing, what a reader without a trusted page does) validates new
    # bytes the same way, and its mapping remembers that too
    lg = open_log({"index.interval.bytes": 1 << 20})
    lg.append([REC])
    ro = open_log(path=log_dir, read_only=True)
    start = lg.segments[-1].size
    lg.append([(b"%016d" % i, b"v" * 100) for i in range(100)])
    ro.refresh()
    assert ro.log_end_offset == 101
    at = _file(lg.segments[-1].log_path).index(b"%016d" % 7, start) + 16 + 2
    new = _flip(lg.segments[-1].log_path, at)
    assert ro.read(8)[0].value == new + b"v" * 99
    with pytest.raises(kstore.CorruptRecordError):
        lg.read(8)


def test_the_checked_range_of_a_mapping():
    # Mapping.note_crc_verified: contiguous ranges extend, others replace; outside the
    # mapping is an error (the caller's bug), never a silent mark
    m = _core.Mapping.from_bytes(b"x" * 100)
    for bad in ((-1, 5), (5, 4), (0, 101)):
        with pytest.raises(ValueError):
            m.note_crc_verified(*bad)
    m.note_crc_verified(10, 20)
    m.note_crc_verified(20, 50)         # extends: [10, 50)
    m.note_crc_verified(60, 60)         # empty: nothing
    m.note_crc_verified(70, 80)         # replaces: [70, 80)
    m.note_crc_verified(80, 100)        # extends: [70, 100)
