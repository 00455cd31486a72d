"""A read-only view of one segment that another process writes (the segments of a read-only Log:
StoreReader, a read-only LogManager, `kstore consume`, Spark tasks).

The writer appends, rolls, truncates (by replacing the file), compacts (swapping new files in
under the same names) and deletes under the reader. The view validates pread copies of the
bytes before mapping them and maps only what it validated, which the writer never shrinks or
overwrites, so a reader never faults on a page past an end of file nor decodes zeroed batches;
a replaced file (new inode) is read through a new view; a deleted one raises SegmentGoneError,
which the Log turns into going on with its current segments or OffsetOutOfRangeError.
"""
from __future__ import annotations

import os
import threading
import time as _time
from typing import Optional

from kstore import _core
from kstore.config import NO_LIMIT, LogConfig
from kstore.errors import SegmentGoneError
from kstore.fileio import FileOps
from kstore.index import AbstractIndex
from kstore.files import LOG_SUFFIX, SWAP_SUFFIX, segment_file
from kstore.segment import LogSegment

# why a read-only refresh stopped before the end of a rolled segment (recover_scan statuses)
_INVALID = {"crc": "CRC mismatch", "corrupt": "malformed batch", "overflow": "offset overflow",
            "offset_order": "offsets that do not follow the previous batch",
            "below_base": "an offset below the segment's base offset", "end": "incomplete batch"}


#: a refresh's first read past the valid end (one page: all it reads when nothing is new), and
#: the largest window it reads small batches in
_PROBE = 4096
_MAX_WINDOW = 256 << 10

#: the most a tail refresh (extend_tail) reads in one pread; more goes through the windows
_TAIL_MAX = 4 << 20

#: a tail refresh extends the index copies (two opens, preads and a stat: more than the rest of
#: it) only every _TAIL_INDEX_EVERY refreshes or once the data runs _TAIL_INDEX_LAG bytes past the
#: last entry copied: reads in between scan at most that many batch headers from the last entry
_TAIL_INDEX_EVERY = 128
_TAIL_INDEX_LAG = 1 << 20
#: a tail refresh told to leave the index copies for later (index=False: a woken waiter's, on
#: the append-to-visible path; the copy costs ~150-250 µs cold) still extends them past this lag
_TAIL_INDEX_LAG_MAX = 4 << 20

#: descriptors kept open across refreshes, one per read-only log's last segment at most: a
#: StoreReader of 1000 partitions stays far below the usual 1024 limit (past the cap a refresh
#: opens and closes the file as before); one idle for KEEP_QUIET_S is closed
KEEP_MAX = 128
KEEP_QUIET_S = 2.0


class _KeptFds:
    """How many read-only segments keep their .log open (a leaf lock: taken under a segment's
    lock, nothing is taken under it)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0

    def take(self) -> bool:
        with self.lock:
            if self.count >= KEEP_MAX:
                return False
            self.count += 1
            return True

    def give(self) -> None:
        with self.lock:
            self.count -= 1


KEPT = _KeptFds()


class ReadOnlySegment(LogSegment):
    """A segment of a read-only Log: validated before it is mapped, the last one on every
    refresh, the others on first use."""

    read_only = True

    def __init__(self, dir_: str, base_offset: int, config: LogConfig, *, io: FileOps, time, rng,
                 suffix: str = ""):
        super().__init__(dir_, base_offset, config, io=io, time=time, rng=rng,
                         file_already_exists=True, suffix=suffix)
        self.ro_suffix = suffix          # ".swap": a swap in progress, read under its swap name
        self.ro_scanned = False          # the .log's batches were validated
        self._ro_last_offset = -1
        self._ro_ident: Optional[tuple[int, int]] = None   # (st_dev, st_ino) validated
        self.ro_next_base: Optional[int] = None   # the next segment when the log listed it
        # the position of the last offset index entry copied: the writer makes an entry at a
        # batch only after more than index.interval.bytes since the previous one (Kafka's
        # rule), so after the first validation the index files are not read while the valid
        # data ends before that (a writer with a smaller interval only has its newest entries
        # copied later: entries save scans, reads never need them)
        self._ro_indexed = 0
        # the last segment's .log kept open between refreshes (under self._lock), so a refresh
        # of an unchanged directory costs one fstat and the preads of the new bytes; closed
        # when the segment stops being last, its file is replaced or deleted, it is closed, or
        # it was idle for KEEP_QUIET_S
        self._ro_fd: Optional[int] = None
        self._ro_grown_at = 0.0          # time.monotonic() of the last refresh that found bytes
        self._ro_tails = 0               # tail refreshes since the index copies were extended

    def mapping(self) -> _core.Mapping:
        """The mapping of the validated bytes (validating them first: deferred from the open)."""
        if self.view.log_map is None and not self.ro_scanned:
            self.refresh_read_only(False)
        return super().mapping()

    def refresh_read_only(self, is_last: bool, dir_unchanged: bool = False) -> bool:
        """Read-only view of a segment another process may append to, replace or delete: extend
        the valid size by validating pread copies of the new bytes, then extend the indexes'
        valid prefix the same way. Mapped reads never go past the validated size, and the writer
        never shrinks or rewrites a file below it (a truncation replaces the file), so no page
        past an end of file is touched. Returns False, changing nothing, when the file at the
        path is no longer the one validated (replaced by compaction or truncation: the log reads
        it through a new segment); raises SegmentGoneError when it was deleted.

        What a refresh costs is what changed: a stat of the path when the file is no longer
        than validated, else one small pread past the valid end when nothing new was written
        (the active segment's zero runway), the new batches and the new index entries only
        (never the preallocated zeros of the index files) when something was; the mapping is
        made over the file's whole length or more (see _remap), so it is not made again for
        every new batch.

        An invalid batch at the end of the last segment may be one still being written (invisible
        until whole); before the end of a rolled segment, or followed by a valid batch, it is
        corruption: a read reaching it raises CorruptRecordError naming file and position, as
        the writer's reads do. The log validates its last segment at open and refresh, the others
        on first use (mapping()), so opening costs the same whatever the partition's size.

        dir_unchanged: the caller saw the directory unchanged since the listing that found this
        file (ro_refresh.DirWatch: every replacement or deletion is a rename or unlink in it),
        so the path still names the file validated: a kept descriptor's fstat is all it looks
        at (the common case of a tailing reader: fstat, pread of the new bytes, validation)."""
        with self._lock:
            fd = self._ro_fd
            if self.ro_scanned:
                if fd is not None and dir_unchanged:
                    st = self._io.stat(fd)
                else:
                    try:
                        st = self._io.stat_path(self.log_path)
                    except FileNotFoundError:
                        self.release_fd()
                        raise SegmentGoneError(f"segment {self.log_path} was deleted") from None
                if (st.st_dev, st.st_ino) != self._ro_ident or st.st_size < self.size:
                    self.release_fd()
                    return False
                if st.st_size == self.size:
                    if fd is not None and (not is_last or
                                           _time.monotonic() - self._ro_grown_at > KEEP_QUIET_S):
                        self.release_fd()
                    return True
            if fd is None:
                try:
                    fd = self._io.open(self.log_path, os.O_RDONLY)
                except FileNotFoundError:
                    raise SegmentGoneError(f"segment {self.log_path} was deleted") from None
                st = self._io.stat(fd)
            keep = False
            try:
                ident, flen = (st.st_dev, st.st_ino), st.st_size
                if self.ro_scanned and (ident != self._ro_ident or flen < self.size):
                    return False
                if self.ro_scanned and flen == self.size:
                    return True
                pos = self.size if self.ro_scanned else 0
                last = self._ro_last_offset if pos else -1
                best = self._max_ts if pos and self._max_ts else (-1, -1)
                start = pos
                pos, last, best, bad = self._validate(fd, flen, pos, last, best)
                if is_last:
                    corrupt = self._invalid_at_end(fd, flen, pos, last, bad) \
                        if pos < flen and bad is not None else None
                else:
                    corrupt = self._invalid_in_rolled(fd, pos, last)
                first, grew = not self.ro_scanned, pos > self.size
                if self._map is None or self._map.length < pos:
                    self._remap(fd, pos, flen)
                if pos > start and (m := self._map) is not None:
                    m.note_crc_verified(start, pos)    # checked in the copies: reads skip them
                keep = is_last and (fd == self._ro_fd or KEPT.take())
            finally:
                if not keep:
                    if fd == self._ro_fd:
                        self.release_fd()
                    else:
                        self._io.close(fd)
            self._ro_fd = fd if keep else None
            if grew:
                self._ro_grown_at = _time.monotonic()
            self.ro_scanned = True
            self._ro_ident = ident
            self._ro_last_offset = last
            self.size = pos
            self.view.corrupt = corrupt
            self._max_ts = best
            if first or grew and pos - 1 > self._ro_indexed + self._config.index_interval_bytes:
                self._load_index_prefix()
            return True

    def extend_tail(self, end: int, index: bool = True) -> bool:
        """The tail refresh of the last segment (ro_refresh.ReadOnlyRefresh.scan): the writer's
        notification page says the segment's data ends at `end` and nothing but appends changed
        since this view was listed. The bytes from the valid size to `end` are read through the
        kept descriptor (one pread: no stat, no open) and validated as any refresh validates
        them (CRC, offsets following the last one, in C); they become visible only if they
        validate whole. Returns False, changing nothing, when the full refresh must look: no kept
        descriptor, a size hint below the valid size or more than _TAIL_MAX past it, bytes that
        do not validate whole (short, torn, corrupt: refresh_read_only tells which). The hint is never trusted for what is read, only for where to look.
        index False: the index copies are extended only past _TAIL_INDEX_LAG_MAX; catch_up_index
        does it at an idle moment."""
        with self._lock:
            # the view's fields directly, not the size/_map/_max_ts properties: this is on the
            # append-to-visible path (a read-only segment's size is never lazy once scanned)
            v, fd = self.view, self._ro_fd
            size = v.size if not self._size_unknown else self.size
            if fd is None or self.closed or v.corrupt is not None:
                return False
            if end <= size:
                return end == size
            m = v.log_map
            if end - size > _TAIL_MAX or m is None:
                return False
            _, valid, last, mts, moff = self._io.pread_validate(fd, end - size, size,
                                                                 self.base_offset,
                                                                 self._ro_last_offset)
            if valid != end - size:
                return False
            if m.length < end:
                self._remap(fd, end, end)    # the file holds them: the pread returned them
            if (m := v.log_map) is not None:
                m.note_crc_verified(size, end)    # (reads skip the CRCs checked here)
            if not v.max_ts_known or mts > v.max_timestamp:
                v.max_timestamp, v.offset_of_max_timestamp, v.max_ts_known = mts, moff, True
            self._ro_last_offset = last
            self._ro_grown_at = _time.monotonic()
            v.size = end
            self._ro_tails += 1
            lag = end - self._ro_indexed
            if end - 1 > self._ro_indexed + self._config.index_interval_bytes and (
                    lag > _TAIL_INDEX_LAG_MAX or index and (
                        self._ro_tails >= _TAIL_INDEX_EVERY or lag > _TAIL_INDEX_LAG)):
                self._ro_tails = 0
                self._load_index_prefix()
            return True

    def catch_up_index(self) -> bool:
        """Extend the index copies over what tail refreshes validated since they were last
        extended, if that passed an index interval (Log.catch_up_index: a waiter with nothing
        new, about to sleep). True if it read the indexes."""
        with self._lock:
            if self._ro_tails == 0 or self.closed or self.view.corrupt is not None or \
                    self.size - 1 <= self._ro_indexed + self._config.index_interval_bytes:
                return False
            self._ro_tails = 0
            self._load_index_prefix()
            return True

    def release_fd(self) -> None:
        """Close the .log descriptor kept between refreshes, if any (idempotent)."""
        with self._lock:
            fd, self._ro_fd = self._ro_fd, None
            if fd is not None:
                KEPT.give()
                self._io.close(fd)

    def close(self) -> None:
        self.release_fd()
        super().close()

    def close_handlers(self) -> None:
        self.release_fd()
        super().close_handlers()

    def _remap(self, fd: int, pos: int, flen: int) -> None:
        """Map at least the pos validated bytes: the file's length (a kstore writer's active
        segment runs a runway of preallocated zeros past its data, so the mapping is made again
        only when the data passes it) and at least twice pos (a writer without a runway). Only
        [0, pos) is ever touched (reads stop at the published size), so pages past the end of
        the file (the length at this fstat, or a later trim of the runway at roll or close,
        which never cuts below the writer's size, at least pos) are never faulted in."""
        old = self._map
        self._map = self._io.map(fd, max(flen, 2 * pos), False) if pos > 0 \
            else _core.Mapping.from_bytes(b"")
        if old is not None:
            old.close()

    def read_next_offset(self) -> int:
        """One past the last offset validated (no scan), or the base offset if none."""
        if not self.ro_scanned:
            return super().read_next_offset()
        last = self._ro_last_offset
        return last + 1 if last >= 0 else self.base_offset

    def _validate(self, fd: int, flen: int, pos: int, last: int, best: tuple[int, int]):
        """Validate batches from pos in pread windows: (valid end, last offset, (max ts, its
        offset), the window holding the first invalid batch or None if the data simply ended).
        The first window is one page (what a refresh with nothing new reads: zeros), doubling
        while whole windows validate (a reader catching up); one that ends inside a batch is
        followed by one that holds that batch whole (its length from its header)."""
        window, big = _PROBE, False
        while pos < flen:
            want = min(window, flen - pos)
            data = self._io.pread(fd, want, pos)
            if not data:
                break
            valid, last, mts, moff, complete = _core.validate_batches(data, self.base_offset, last)
            if mts > best[0]:
                best = (mts, moff)
            pos += valid
            if valid == len(data):
                # small batches read whole: read on in larger windows (catching up); after one
                # big batch read whole, probe again
                window, big = (_PROBE if big else min(window * 2, _MAX_WINDOW)), False
                continue
            if complete:
                return pos, last, best, data[valid:]      # an invalid batch (torn, corrupt) or zeros
            if len(data) < want or pos + len(data) - valid >= flen:
                return pos, last, best, None             # the file ends inside it: being written
            # the window ended inside a batch: the next holds that batch whole (its length from
            # its header; a hostile one is capped by the file's length), still growing if it
            # fits in twice the window (small batches seldom end a window exactly)
            need = int.from_bytes(data[valid + 8:valid + 12], "big", signed=True) + 12 \
                if len(data) - valid >= 12 else 0
            grow = min(window * 2, _MAX_WINDOW)
            window, big = (grow, False) if need <= grow else \
                (max(need, 2 * (len(data) - valid)), True)
        return pos, last, best, None

    def _invalid_in_rolled(self, fd: int, pos: int, last: int) -> Optional[str]:
        """A rolled segment is whole: why the bytes from pos (where validation stopped) to its
        end are corruption, or None if it ends there. A rolled file is never written again (a
        truncation that reactivates it replaces it first) and is trimmed before the next segment
        is created, so once the next segment is seen to exist (under its final name or, a swap
        in progress, its `.swap` name), a fresh look at the file is final. If the next segment is gone (the log's listing is stale) or the fresh look
        validates further (the file was still active when read), SegmentGoneError makes the
        log list its segments again."""
        nxt = self.ro_next_base
        if nxt is not None and not any(self._io.exists(segment_file(self.dir, nxt, LOG_SUFFIX, suf))
                                       for suf in ("", SWAP_SUFFIX)):
            raise SegmentGoneError(f"segment {self.log_path} is no longer followed by segment {nxt}")
        end = self._io.stat(fd).st_size
        if end <= pos:
            return None
        data = self._io.pread(fd, min(64 << 10, end - pos), pos)
        size = int.from_bytes(data[8:12], "big", signed=True) + 12 if len(data) >= 12 else 0
        if len(data) < size <= end - pos:     # the batch whole, so its fault is named right
            data = self._io.pread(fd, size, pos)
        if _core.validate_batches(data, self.base_offset, last)[0]:
            raise SegmentGoneError(f"segment {self.log_path} changed while it was read")
        if data.count(0) == len(data):
            reason = "zero bytes (an unrecovered preallocated tail)"
        else:
            reason = self._reason(data, last)
        return f"{reason} before the end of a rolled segment"

    def _reason(self, bad: bytes, last: int) -> str:
        """Why the batch at the start of bad fails validation, in words."""
        diag = _core.recover_scan(_core.Mapping.from_bytes(bad), len(bad), self.base_offset,
                                  NO_LIMIT, 0, 0, prev_last_offset=last)
        return _INVALID.get(diag.status, "invalid batch")

    def _invalid_at_end(self, fd: int, flen: int, pos: int, last: int, bad: bytes) -> Optional[str]:
        """Why the invalid batch at pos of the last segment (`bad` its window) is corruption, or
        None while it may be a batch still being written: one followed by nothing but zeros, or
        a torn one the writer completes (read again once)."""
        if len(bad) < 12:
            return None
        # zeros (the preallocated runway) give a size below 26 and end here too
        size = int.from_bytes(bad[8:12], "big", signed=True) + 12
        if size < 26 or pos + size >= flen:
            return None
        nxt = self._io.pread(fd, min(64 << 10, flen - pos - size), pos + size)
        need = int.from_bytes(nxt[8:12], "big", signed=True) + 12 if len(nxt) >= 12 else 0
        if len(nxt) < need <= flen - pos - size:     # a next batch past the window: read it whole
            nxt = self._io.pread(fd, need, pos + size)
        if not _core.validate_batches(nxt, self.base_offset, -1)[0]:
            return None
        again = self._io.pread(fd, size, pos)           # a batch being copied in is whole by now
        if _core.validate_batches(again, self.base_offset, last)[0] == size:
            return None
        return f"{self._reason(again, last)}, followed by valid batches"

    def _load_index_prefix(self) -> None:
        """Extend the private copies of both indexes with the entries the file holds past those
        already copied, as far as they stay well-ordered and point at validated data (entries
        past them are zero padding or point at data not yet visible; the next refresh that finds
        new batches reads on from there). Only the new entries are read and checked (against
        the last one kept), never the preallocated zeros past them. Entries read after the .log
        was replaced (they may point into the new file) are dropped. An index file rewritten
        under the view (the writer's recovery rebuilt it: its next entry does not follow the
        last one copied) is copied again from its start."""
        last_rel = (self._ro_last_offset - self.base_offset) if self._ro_last_offset >= 0 else -1
        idxs: tuple[AbstractIndex, AbstractIndex] = (self.offset_index, self.time_index)
        news = [self._new_entries(idx, last_rel) for idx in idxs]
        if not self._same_file():
            return
        for idx, (extend, raw) in zip(idxs, news):
            idx.load_copy(raw, extend=extend)
        oidx = self.offset_index
        self._ro_indexed = oidx.entry(oidx.entries - 1)[1] if oidx.entries else 0

    def _new_entries(self, idx: AbstractIndex, last_rel: int) -> tuple[bool, bytes]:
        """(extend, raw): the valid entries of idx's file after the n already copied (extend
        True), or from its start (False: none copied yet, or the file no longer continues the
        copy). Read in windows that grow while they validate whole; no more entries than the
        .log could index (26 bytes a batch at least): a huge sparse index (damaged or hostile)
        is not read past that."""
        esize = idx.ENTRY_SIZE
        n = idx.entries
        prev = idx.copy_entry(n - 1) if n else None
        try:
            fd = self._io.open(idx.path, os.O_RDONLY)
        except FileNotFoundError:
            return n > 0, b""
        try:
            out: list[bytes] = []
            cap = self.size // 26 + 1 - n
            pos, window = n * esize, 64
            while cap > 0:
                want = min(window, cap)
                data = self._io.pread(fd, want * esize, pos)
                k = _core.index_valid_prefix(data, esize, self.size, last_rel, prev)
                if k == 0 and prev is not None and pos == n * esize and data[:esize].strip(b"\0") \
                        and _core.index_valid_prefix(data[:esize], esize, self.size, last_rel) == 1:
                    # a valid entry that does not follow the last copied one: rewritten
                    n, prev, pos, cap, out = 0, None, 0, self.size // 26 + 1, []
                    continue
                if k:
                    out.append(data[: k * esize])
                    prev = data[(k - 1) * esize: k * esize]
                if k < want:
                    break
                pos += k * esize
                cap -= k
                window *= 2
        finally:
            self._io.close(fd)
        return n > 0, b"".join(out)

    def _same_file(self) -> bool:
        """The .log at the path is still the file validated (not replaced, not deleted)."""
        try:
            st = self._io.stat_path(self.log_path)
        except FileNotFoundError:
            return False
        return (st.st_dev, st.st_ino) == self._ro_ident
