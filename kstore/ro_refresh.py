"""A read-only log's refresh (Log.refresh): the partition directory is listed again only when
its entries may have changed, so a refresh costs what changed, not how many segments exist.

Listing a directory of 10,000 segments (30,000 names) and looking at every segment costs
~100 ms; a refresh that finds only new batches in the last segment needs neither. Every entry
created, removed or renamed in a directory marks its modification and status-change times for
update (POSIX: open(O_CREAT), unlink, rename, mkdir, rmdir), and every change the writer makes
to the segment list is one of those (a roll creates files; retention, DeleteRecords and
truncation remove or rename them; a compaction swap renames; a topic deletion renames the
directory itself). So while the directory's stamp (device, inode, both times, size, link count)
is the one a listing was trusted under, the listing still holds and only the last segment can
have changed (new batches: the writer's one append path).

A stamp equal to an earlier one proves nothing if the change came in the same clock tick as
the previous one: file systems take times from a coarse clock (one kernel tick, <= 10 ms, behind
the wall clock) truncated to their granularity (whole seconds on some). A listing is trusted
only if the wall clock read after taking the stamp, before the listing, is further past the
stamp's times than that lag (DirWatch.SLACK_NS, or COARSE_SLACK_NS for whole-second times):
any change made after the clock was read then gets a later time, and any made before is in
the listing (readdir waits for a change in progress: both hold the directory's lock). A
listing taken right after a change is not trusted: the next refresh lists again, until the
directory has been quiet for longer than the slack. A wall clock seen going back voids the
trust (a change after a step back could repeat a time).
"""
from __future__ import annotations

import functools
import logging
import os
import time
from typing import Callable, Optional

from kstore.errors import KStoreError, SegmentGoneError, UnknownTopicError
from kstore.fileio import FileOps
from kstore.leader_epoch import LEADER_EPOCH_CHECKPOINT, EpochEntry, parse_checkpoint
from kstore.log_loader import LogLoader
from kstore.log_segments import LogSegments
from kstore.segment_ro import ReadOnlySegment
from kstore.start_file import LOG_START_FILE, read_saved_start

Stamp = tuple[int, int, int, int, int, int]
log = logging.getLogger("kstore.log")

#: scans of a directory changing under every one before the refresh gives up
SCAN_ATTEMPTS = 50


class DirWatch:
    """Whether a directory's entries can have changed since a trusted listing of it."""

    #: the most a file system's sub-second times may run behind time.time_ns(): a tick of the
    #: kernel's coarse clock (10 ms at HZ=100), with a margin
    SLACK_NS = 20_000_000
    #: the same for whole-second times (FAT's modification times have a 2 s granularity)
    COARSE_SLACK_NS = 2_100_000_000

    def __init__(self, io: FileOps, path: str) -> None:
        self._io = io
        self.path = path
        self._trusted: Optional[Stamp] = None
        self._since = 0             # the wall clock when the trusted listing was started

    def stamp(self) -> Stamp:
        """The directory's stamp now; UnknownTopicError if it is gone (topic deleted)."""
        try:
            st = self._io.stat_path(self.path, follow_symlinks=True)
        except FileNotFoundError:
            raise UnknownTopicError(f"partition directory {self.path} was deleted") from None
        return (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_nlink)

    def unchanged(self) -> bool:
        """True if the trusted listing still holds (one stat)."""
        trusted = self._trusted
        if trusted is None:
            return False
        if self.stamp() == trusted and time.time_ns() >= self._since:
            return True
        self._trusted = None
        return False

    def before_listing(self) -> tuple[Stamp, int]:
        """Taken before a listing: the stamp, then the wall clock."""
        stamp = self.stamp()
        return stamp, time.time_ns()

    def settled(self, before: tuple[Stamp, int]) -> bool:
        """Whether the directory cannot have changed since before_listing returned `before`:
        its stamp is the same and no change can share the stamp's times (the module
        docstring)."""
        stamp, now = before
        mtime, ctime = stamp[2], stamp[3]
        coarse = mtime % 1_000_000_000 == 0 and ctime % 1_000_000_000 == 0
        slack = self.COARSE_SLACK_NS if coarse else self.SLACK_NS
        return now - max(mtime, ctime) > slack and self.stamp() == stamp

    def listed(self, before: tuple[Stamp, int]) -> None:
        """A listing started after before_listing returned `before` was published: trust it
        while the stamp stays the same, if the directory was settled (see settled)."""
        self._trusted = None
        if self.settled(before):
            self._trusted = before[0]
            self._since = before[1]

    def forget(self) -> None:
        """List again at the next refresh."""
        self._trusted = None


class ReadOnlyRefresh:
    """What a read-only Log keeps between refreshes: the watch on its directory, and the start
    a standalone writer saved there (start_file.LOG_START_FILE) as last read."""

    def __init__(self, io: FileOps, path: str) -> None:
        self.watch = DirWatch(io, path)
        self._io = io
        self._identity: Optional[tuple[int, int]] = None   # the directory's (device, inode)
        self._listed = False        # the last scan listed the directory (it may have changed)
        self._saved: Optional[tuple[tuple[int, ...], Optional[int]]] = None   # (stat, start)
        self._epochs: Optional[tuple[tuple[int, ...], list[EpochEntry]]] = None   # (stat, entries)

    def saved_start(self) -> Optional[int]:
        """The start a standalone writer saved in the directory (its DeleteRecords' or
        truncations'), None if none. Looked at only when the last scan listed the directory
        (saving renames a new file in, which changes the directory's stamp), and read again
        (bounded: start_file.read_saved_start) only when the file's stat changed."""
        if not self._listed:
            return self._saved[1] if self._saved is not None else None
        path = os.path.join(self.watch.path, LOG_START_FILE)
        try:
            st = self._io.stat_path(path)
        except FileNotFoundError:
            self._saved = None
            return None
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if self._saved is None or self._saved[0] != key:
            self._saved = (key, read_saved_start(self._io, path, "log start file")[1])
        return self._saved[1]

    def saved_epochs(self) -> list[EpochEntry]:
        """The writer's leader-epoch-checkpoint entries, [] if none or unreadable (epochs only
        tell a consumer of a cut: fetcher.py); read again only if the file's stat changed."""
        path = os.path.join(self.watch.path, LEADER_EPOCH_CHECKPOINT)
        try:
            st = self._io.stat_path(path)
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
            if self._epochs is None or self._epochs[0] != key:
                self._epochs = (key, parse_checkpoint(path, self._io.read_file(path)))
        except (OSError, KStoreError) as e:      # (missing, replaced, malformed: no epochs)
            log.debug("no leader epochs from %s: %s", path, e)
            self._epochs = ((), [])
        return self._epochs[1]

    @property
    def identity(self) -> Optional[tuple[int, int]]:
        """The (device, inode) of the directory the last listing was of (None before one)."""
        return self._identity

    def recreated(self, before: tuple[Stamp, int]) -> bool:
        """Whether the listing started at `before` is of another directory than the last one
        (the topic deleted and re-created under the same path between two refreshes): a new
        log, whose log start is its own, not the old incarnation's."""
        identity = (before[0][0], before[0][1])
        old, self._identity = self._identity, identity
        return old is not None and old != identity

    def scan(self, old: LogSegments, make_loader: Callable[[], LogLoader],
             tail: Optional[tuple[int, int]] = None,
             on_recreated: Optional[Callable[[], None]] = None) -> LogSegments:
        """The log's segments now: old itself when the directory cannot have changed and its
        last segment is still the file validated (validated on, for new batches), else a full
        scan (LogLoader.scan_read_only, retried while the directory changes under it).

        tail: (active base, active size) from the writer's notification page, whose list stamp
        is the one read before the listing of old (notify.LogNotifier.catch_up): the writer
        changed nothing but the active segment's data since, so when that is old's last segment
        the new bytes up to the size are validated through its kept descriptor
        (ReadOnlySegment.extend_tail), without a stat; anything else takes the path above.
        on_recreated: called (under the caller's lock) when the listing finds another directory
        at the path than the last listing did."""
        self._listed = False
        if tail is not None and self.extend(old, tail[0], tail[1]):
            return old
        if len(old) and self.watch.unchanged():
            last = old.segs[-1]
            try:
                if isinstance(last, ReadOnlySegment) and not last.closed \
                        and last.refresh_read_only(True, dir_unchanged=True):
                    return old
            except SegmentGoneError:
                pass
            self.watch.forget()
        self._listed = True
        loader = make_loader()
        for _attempt in range(SCAN_ATTEMPTS):
            before = self.watch.before_listing()
            segs = loader.scan_read_only(old, functools.partial(self.watch.settled, before))
            if segs is not None:
                if self.recreated(before) and on_recreated is not None:
                    on_recreated()
                self.watch.listed(before)
                self._release_kept(old, segs)
                return LogSegments(segs)
        raise SegmentGoneError(f"the segments of {self.watch.path} keep changing; try again")

    @staticmethod
    def extend(old: LogSegments, base: int, size: int, index: bool = True) -> bool:
        """scan's tail step alone (Log.refresh_tail, a waiter just woken by its writer): True
        if old's last segment is the active one the page names (base) and holds the validated
        bytes up to size now; False when the full refresh must look. index: as
        ReadOnlySegment.extend_tail's."""
        segs = old.segs
        if not segs:
            return False
        last = segs[-1]
        try:
            return last.base_offset == base and isinstance(last, ReadOnlySegment) \
                and last.extend_tail(size, index)
        except SegmentGoneError:
            return False

    @staticmethod
    def _release_kept(old: LogSegments, segs: list) -> None:
        """Only the new last segment keeps its .log open: close the descriptors of segments
        dropped from the list (deleted, replaced) or no longer last (a roll)."""
        keep = segs[-1] if segs else None
        for s in list(old.segs) + segs[:-1]:
            if s is not keep and isinstance(s, ReadOnlySegment):
                s.release_fd()
