"""The partition's leader epochs (Kafka's LeaderEpochFileCache and LeaderEpochCheckpointFile).

`leader-epoch-checkpoint` in the partition directory: a version line `0`, a count line, then
`<epoch> <start offset>` lines (single spaces, `\\n` ends), epochs and start offsets strictly
increasing. Each entry says from which offset on the batches were written under that leader
epoch. A broker's first leader of a new partition writes `0 / 1 / 0 0`; kstore does the same
for a partition it opens writable with no epoch yet, and appends its batches with the latest
epoch in their partitionLeaderEpoch field (outside the CRC), as a broker's leader does.

The cache follows the log as Kafka's does: a truncation removes the entries at or after the new
end (truncateFromEnd), a new log start folds the entries below it into one starting there
(truncateFromStart), and every open applies both to what it read (a crash may have left the
file behind the log: its writes after truncations are deferred, as Kafka's async flush).
A truncation below the log end is a new leader's (Kafka cuts a replica's log only when its
leader changed): it starts the next epoch at the new end, in the file before a record goes,
and an open keeps the file's latest epoch at the log end, so epochs never go back; a consumer
whose position is past a cut finds it by them (KIP-320: diverging_epoch, fetcher.py).

`LeaderEpochs` is Log's part (a mixin, log.py): it loads the cache at a writable open, stamps
appends, and keeps the file in step with truncations and log start changes: in memory under
Log._lock, written after the lock is released (or at close).
"""
from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from kstore.errors import KStoreError, OffsetOutOfRangeError, UnusableFileError
from kstore.fileio import FileOps

if TYPE_CHECKING:
    from kstore._core import BatchBuilder

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
VERSION = 0
#: the epoch a partition kstore creates starts at (a broker's first leader epoch)
INITIAL_EPOCH = 0


class LeaderEpochCheckpointError(KStoreError):
    """A leader-epoch-checkpoint that cannot be read (Kafka fails the log; kstore isolates the
    partition, leaving the file as it is)."""


class EpochEntry(NamedTuple):
    """From start_offset on, batches were written under leader epoch `epoch`."""
    epoch: int
    start_offset: int


def parse_checkpoint(path: str, data: bytes) -> list[EpochEntry]:
    """The entries of a leader-epoch-checkpoint's bytes (Kafka's CheckpointFile read): an empty
    file has none; LeaderEpochCheckpointError naming the file for anything malformed."""
    def bad(why: str) -> LeaderEpochCheckpointError:
        return LeaderEpochCheckpointError(f"malformed leader epoch checkpoint {path}: {why}")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise bad("not ASCII") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return []
    if lines[0].strip() != str(VERSION):
        raise bad(f"unrecognised version {lines[0][:40]!r}")
    if len(lines) < 2 or not lines[1].strip().isdigit():
        raise bad("no count line")
    count = int(lines[1])
    if len(lines) - 2 != count:
        raise bad(f"expected {count} entries but found {len(lines) - 2}")
    out: list[EpochEntry] = []
    for n, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if len(parts) != 2 or not all(p.isascii() and p.lstrip("-").isdigit() for p in parts):
            raise bad(f"line {n} {line[:60]!r} is not `epoch offset`")
        e = EpochEntry(int(parts[0]), int(parts[1]))
        if not (0 <= e.epoch < 1 << 31 and 0 <= e.start_offset < 1 << 63):
            raise bad(f"line {n}: epoch or offset out of range")
        if out and (e.epoch <= out[-1].epoch or e.start_offset < out[-1].start_offset):
            raise bad(f"line {n}: epochs and offsets must increase")
        out.append(e)
    return out


def end_offset_for(entries: list[EpochEntry], epoch: int, log_end_offset: int) -> tuple[int, int]:
    """Kafka's endOffsetFor (OffsetsForLeaderEpoch): (the largest epoch <= `epoch`, the start
    offset of the first epoch above it, or the log end for the latest); (-1, -1) when `epoch` is
    below every entry."""
    if not entries or epoch < entries[0].epoch:
        return (-1, -1)
    for i, x in enumerate(entries):
        if x.epoch > epoch:
            return (entries[i - 1].epoch, x.start_offset)
    return (entries[-1].epoch, log_end_offset)


def epoch_at(entries: list[EpochEntry], offset: int) -> Optional[int]:
    """The leader epoch of the record at offset by the entries (the last one starting at or
    below it); None if none does (no check can be made from it)."""
    found = None
    for x in entries:
        if x.start_offset > offset:
            break
        found = x.epoch
    return found


def epoch_before(records: Any, offset: int) -> Optional[int]:
    """The leader epoch of the last of records (in offset order) below offset; None if none is:
    what a reader's position takes when it passes them, returned or not (KIP-320)."""
    for r in reversed(records):
        if r.offset < offset:
            return r.leader_epoch
    return None


def format_checkpoint(entries: list[EpochEntry]) -> bytes:
    """The file's bytes for entries, as Kafka writes them."""
    lines = [str(VERSION), str(len(entries))] + [f"{e.epoch} {e.start_offset}" for e in entries]
    return ("\n".join(lines) + "\n").encode("ascii")


class LeaderEpochFileCache:
    """A partition's leader epoch entries, in memory, and its `leader-epoch-checkpoint`.

    Changes happen in memory (`assign`, `truncate_from_end`, `truncate_from_start`, `clear`);
    `flush` writes the file when they changed it. `_lock` (a leaf below Log._lock in
    kstore/locks.py) guards the entries and orders writes: a flush snapshots and writes under
    it, so an older snapshot never replaces a newer one.
    """

    def __init__(self, path: str, io: FileOps, entries: Optional[list[EpochEntry]] = None):
        self.path = path
        self._io = io
        self._entries: list[EpochEntry] = list(entries or [])
        self._lock = threading.Lock()
        self._dirty = False

    @classmethod
    def load(cls, partition_dir: str, io: FileOps) -> "LeaderEpochFileCache":
        """The cache of a partition directory: its file's entries, none if it is missing;
        LeaderEpochCheckpointError if it is malformed (or not a regular file)."""
        path = os.path.join(partition_dir, LEADER_EPOCH_CHECKPOINT)
        try:
            # read without a stat first (one per partition at start-up): a missing file is the
            # open's FileNotFoundError; anything but a regular file (a symlink, dangling or
            # not, too) is refused by the open
            data = io.read_file(path)
        except FileNotFoundError:
            cache = cls(path, io)
            cache._dirty = True          # Kafka creates the file when it loads the log
            return cache
        except UnusableFileError as e:
            raise LeaderEpochCheckpointError(str(e)) from None
        return cls(path, io, parse_checkpoint(path, data))

    @property
    def entries(self) -> list[EpochEntry]:
        return list(self._entries)

    @property
    def latest_epoch(self) -> int:
        """The latest epoch, -1 if there is none."""
        e = self._entries
        return e[-1].epoch if e else -1

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Kafka's assign: a new entry unless the latest has this epoch and an offset not above
        start_offset; entries it contradicts (an epoch or start offset not below its own) are
        removed first. Returns whether the entries changed."""
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"leader epoch {epoch} and start offset {start_offset} must be >= 0")
        with self._lock:
            e = self._entries
            if e and e[-1].epoch == epoch and start_offset >= e[-1].start_offset:
                return False
            while e and (e[-1].epoch >= epoch or e[-1].start_offset >= start_offset):
                e.pop()
            e.append(EpochEntry(epoch, start_offset))
            self._dirty = True
            return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Remove the entries starting at or after end_offset (the log was truncated there)."""
        with self._lock:
            e = self._entries
            keep = [x for x in e if x.start_offset < end_offset]
            if len(keep) == len(e):
                return False
            self._entries = keep
            self._dirty = True
            return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """The log starts at start_offset now: entries starting at or below it collapse into
        the last of them, moved to start there (Kafka's truncateFromStart)."""
        with self._lock:
            e = self._entries
            below = [x for x in e if x.start_offset <= start_offset]
            if not below or (len(below) == 1 and below[0].start_offset == start_offset):
                return False
            self._entries = [EpochEntry(below[-1].epoch, start_offset)] + e[len(below):]
            self._dirty = True
            return True

    def clear(self) -> None:
        with self._lock:
            if self._entries:
                self._entries = []
                self._dirty = True

    def end_offset_for(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        return end_offset_for(self._entries, epoch, log_end_offset)

    def flush(self) -> None:
        """Write the file (atomically, through FileOps) if the entries changed since it was."""
        with self._lock:
            if not self._dirty:
                return
            self._io.write_atomic(self.path, format_checkpoint(self._entries))
            self._dirty = False


class LeaderEpochs:
    """Log's leader epochs (a mixin placed before LocalLog, see the module docstring). The
    attributes it uses are Log's own."""

    dir: str
    read_only: bool
    _io: FileOps
    _leo: int
    _log_start_offset: int
    _truncations: int
    _closed: bool
    _epochs: Optional[LeaderEpochFileCache] = None   # writable logs only
    recovery_report: list                # the segments this open recovered (SegmentRecovery)
    _config: Any
    _epoch = -1                        # the epoch appends carry
    _epoch_stale = False               # a truncation removed its entry: the next append adds it
    _epoch_truncations = 0             # _truncations when the cache last followed one
    _ro_epochs: list[EpochEntry] = []  # a read-only log's (epoch_entries)
    _ro_refresh: Any                   # a read-only log's (ro_refresh.ReadOnlyRefresh)
    _lock: Any

    def _load_epochs(self) -> None:
        """A writable open, after its segments loaded: the cache read and fitted to the log
        (the epochs of the batches recovery validated assigned first, as LogSegment.recover does,
        then UnifiedLog's constructor: truncateFromEnd(log end), truncateFromStart(log start)),
        epoch 0 from the log end for a partition with none, the file written if that changed it.
        Message format v0/v1 has no leader epochs: no cache, and a file left is deleted (Kafka's
        maybeCreateLeaderEpochCache)."""
        if self._config.magic < 2:
            path = os.path.join(self.dir, LEADER_EPOCH_CHECKPOINT)
            if self._io.exists(path):
                self._io.unlink(path)
            return
        cache = LeaderEpochFileCache.load(self.dir, self._io)
        for report in self.recovery_report:    # Kafka's LogSegment.recover, segment by segment
            for epoch, start in report.epochs:
                if epoch > cache.latest_epoch:
                    cache.assign(epoch, start)
        top = cache.latest_epoch
        cache.truncate_from_end(self._leo)
        cache.truncate_from_start(self._log_start_offset)
        if cache.latest_epoch < top:
            # a truncation's new epoch with nothing appended under it yet (_before_cut), or
            # whose appends a crash lost: kept at the log end, as a leader assigns its epoch's
            # start there (Kafka's makeLeader), so that epochs never go back
            cache.assign(top, self._leo)
        if cache.latest_epoch < 0:
            cache.assign(INITIAL_EPOCH, self._leo)
        cache.flush()
        self._epochs = cache
        self._epoch = cache.latest_epoch
        self._epoch_stale = False          # instance attributes: the append path reads them
        self._epoch_truncations = self._truncations

    @property
    def leader_epoch(self) -> int:
        """The partition leader epoch appended batches carry; -1 for a read-only log."""
        return self._epoch

    @property
    def leader_epoch_cache(self) -> Optional[LeaderEpochFileCache]:
        """The partition's leader epoch cache (writable logs)."""
        return self._epochs

    def epoch_entries(self, fresh: bool = False) -> list[EpochEntry]:
        """The leader epochs: a writable log's cache; a read-only log's leader-epoch-checkpoint
        as last read, or (fresh) as it is now: read again if its stat changed (the writer
        renames a new one in before the change of the log it stands for). A read-only log reads
        it only when asked fresh (a consumer that read a later epoch or is past the end)."""
        if self._epochs is not None:
            return self._epochs.entries
        if fresh and self.read_only:
            with self._lock:
                if not self._closed:
                    self._ro_epochs = self._ro_refresh.saved_epochs()
        return self._ro_epochs

    def diverging_epoch(self, pos: int, epoch: int, past_end: bool = False) -> Optional[tuple[int, int]]:
        """KIP-320's check of a reader's position pos after a record of leader epoch `epoch`,
        made when a read at pos returned a later epoch, or pos is past the log end (past_end):
        a cut below pos puts a later epoch at pos once the log grows back past it. None: no
        cut below pos. Else (the largest epoch <= `epoch`, where it ends), that end below pos:
        records the reader returned were cut there (and maybe appended again under a later
        epoch); (-1, -1): `epoch` is older than every entry. A file ahead of its cut (the
        record at the end still of `epoch` or earlier: _before_cut writes the file first) is
        no cut yet. The epoch returned is the one the log goes on with at that end (the reader
        goes back there: what it reads next, control batches included, is of that epoch or
        later; a position whose epoch stayed the old one would find the same cut again after
        passing markers it does not see)."""
        entries = self.epoch_entries(True)
        if epoch < 0 or not entries:
            return None
        found, end = end_offset_for(entries, epoch, self._leo)
        if found >= 0 and end >= pos:
            return None
        if found >= 0 and not past_end and end < self._leo:
            try:
                ahead = self.read(end, 1)        # type: ignore[attr-defined]  # Log's
                if ahead and 0 <= ahead[0].leader_epoch <= epoch:
                    return None
            except OffsetOutOfRangeError:
                pass                             # (below the log start now)
        if found < 0:
            return (found, end)
        return (max([found] + [x.epoch for x in entries if x.start_offset <= end]), end)

    def _before_cut(self, offset: int) -> None:
        """A truncation below the log end is a new leader's (Kafka cuts a replica's log only when
        its leader changed): appends after it carry a new epoch, starting at offset, written to
        the file before a record goes, so a reader of records of the old epoch past offset can
        tell, at any later look and after any crash, that they were cut (KIP-320, fetcher.py)."""
        c = self._epochs
        if c is None or offset >= self._leo:
            return
        epoch = max(c.latest_epoch, self._epoch) + 1
        c.truncate_from_end(offset)
        c.assign(epoch, offset)
        c.flush()
        self._epoch, self._epoch_stale = epoch, False
        self._epoch_truncations = self._truncations + 1     # _ring keeps the entry at the end

    def _stamp_epoch(self, b: BatchBuilder) -> None:
        """Called for an append only while _epoch_stale (Log._lock held): a truncation removed
        the entry of the log's epoch, which starts again at this batch (Kafka's
        maybeAssignEpochStartOffset on a leader's append); the file is written now, once."""
        c = self._epochs
        if c is not None and b.magic == 2:
            c.assign(self._epoch, b.base_offset)
            c.flush()
            self._epoch_stale = False

    def _ring(self) -> None:
        """After every change of the log's start or end other than an append (Log._lock held):
        the cache follows in memory; the callers below write it after the lock."""
        c = self._epochs
        if c is not None:
            if self._truncations != self._epoch_truncations:
                self._epoch_truncations = self._truncations
                c.truncate_from_end(self._leo)
            c.truncate_from_start(self._log_start_offset)
            self._epoch_stale = c.latest_epoch != self._epoch
        super()._ring()          # type: ignore[misc]  # LocalLog's

    def _flush_epochs(self) -> None:
        c = self._epochs
        if c is not None and not self._closed:
            try:
                c.flush()
            except FileNotFoundError:
                pass                 # the partition was deleted meanwhile

    def truncate_to(self, target_offset: int) -> bool:
        r = super().truncate_to(target_offset)     # type: ignore[misc]
        self._flush_epochs()
        return r

    def delete_records(self, offset: int) -> int:
        r = super().delete_records(offset)     # type: ignore[misc]
        self._flush_epochs()
        return r

    def delete_old_segments(self) -> int:
        r = super().delete_old_segments()     # type: ignore[misc]
        self._flush_epochs()
        return r

    def close(self, *args: Any, **kw: Any) -> None:
        c = self._epochs
        if c is not None and not self._closed:
            c.flush()
        super().close(*args, **kw)     # type: ignore[misc]
