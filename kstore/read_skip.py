"""Where a reader goes on after a read that returned no records (Kafka's consumer moves its fetch
position to the batch's nextOffset whether or not the batch gave it records).

A read of a compacted or transactional log can return nothing below the log end: transaction
markers (a run of them longer than one read), batches the cleaner emptied, a batch whose records
at and after the position were cleaned away, a segment's empty tail or a whole segment emptied.
`after_empty_read` walks the batch headers (no record decoded) past exactly those, to the next
batch that has records; `batch_heads` is the header walk, shared with read_committed. LogFetch,
a mixin of Log, gives readers the same step: `fetch` returns the records and where to go on,
so a read + wait_for tail loop on a log that ends in markers sleeps instead of spinning.
"""
from __future__ import annotations

import itertools
import struct
from typing import TYPE_CHECKING, Iterator, Optional

from kstore.errors import CorruptRecordError, OffsetOutOfRangeError, SegmentGoneError

if TYPE_CHECKING:
    from kstore._core import Record

__all__ = ["after_empty_read", "batch_heads", "LogFetch", "SCAN_BYTES", "CONTROL", "V2_HEADER"]

CONTROL = 0x20
#: bytes of batches looked at per read_batches call
SCAN_BYTES = 1 << 20
V2_HEADER = 61
_LEN = struct.Struct(">qi")          # base offset, batch length
_ATTRS = struct.Struct(">hi")        # attributes at 21, last offset delta at 23
_PID = struct.Struct(">q")           # producer id at 43
_COUNT = struct.Struct(">i")         # records count at 57


def batch_heads(view: memoryview, log_dir: str, first: int
                ) -> Iterator[tuple[int, int, int, int, int, int, int, int]]:
    """(base, last, magic, attributes, producer id, records count, start, end) of each whole
    batch in view (a read_batches view read from offset first, named in errors); a v0/v1 entry
    is (offset, offset, magic, 0, -1, 1, ...). Malformed lengths raise CorruptRecordError."""
    n = len(view)
    pos = 0
    while pos + 17 <= n:
        base, length = _LEN.unpack_from(view, pos)
        end = pos + 12 + length
        if length < 5:       # shorter than any message: the walk would not move forward
            raise CorruptRecordError(f"batch at offset {base} of {log_dir} has length {length} "
                                     f"(reading from offset {first})")
        if end > n:
            break
        magic = view[pos + 16]
        if magic >= 2:
            if 12 + length < V2_HEADER:
                raise CorruptRecordError(f"batch at offset {base} of {log_dir} is {length} bytes, "
                                         f"shorter than a v2 header (reading from offset {first})")
            attrs, delta = _ATTRS.unpack_from(view, pos + 21)
            if delta < 0:
                raise CorruptRecordError(f"batch at offset {base} of {log_dir} has a negative "
                                         f"last offset delta {delta}")
            yield (base, base + delta, magic, attrs, _PID.unpack_from(view, pos + 43)[0],
                   _COUNT.unpack_from(view, pos + 57)[0], pos, end)
        else:
            yield base, base, magic, 0, -1, 1, pos, end
        pos = end


def after_empty_read(lg: "LogFetch", pos: int, end: int) -> int:
    """Where a read from pos that returned no records goes on, end being the log end read
    before that read: past the batches below end with no record at or after pos (markers,
    emptied batches, the v2 batch holding pos, whose records from pos were cleaned away) and
    the gaps between them, to the next batch with records, or to end if none is left below it.
    pos itself if nothing can be passed (a segment gone or the log cut under the look: the next
    read decides).

    Only what the read must have looked at is passed over: a batch appended since has its
    base at or past end, and a data batch is passed only if it holds pos (the read started in
    it; a clean keeps a batch's offsets, so no later snapshot has another batch there)."""
    while pos < end:
        try:
            view = lg.read_batches(pos, SCAN_BYTES)
        except (OffsetOutOfRangeError, SegmentGoneError):
            return pos
        if not len(view):               # no batch at or after pos in any segment: to end,
            # unless the log ends below it now (truncated since end was read: nothing passed)
            return end if lg.log_end_offset >= end else pos
        moved = False
        for base, last, magic, attrs, _pid, count, _s, _e in batch_heads(view, lg.dir, pos):
            if last < pos:
                continue
            if base >= end:
                return pos
            if magic < 2 or (not attrs & CONTROL and count > 0 and base >= pos):
                return max(pos, base)   # records (after a gap, if base > pos)
            pos = last + 1
            moved = True
        if not moved:
            return pos
    return pos


class LogFetch:
    """Log's reads that carry a position (Kafka's fetch: records plus the offset to fetch next)."""

    dir: str
    _leo: int
    _log_start_offset: int
    if TYPE_CHECKING:
        @property
        def log_end_offset(self) -> int: ...
        def read(self, offset: int, max_records: Optional[int] = None, max_bytes: int = 1 << 20,
                 *, verify_crc: bool = True) -> list[Record]: ...
        def read_batches(self, offset: int, max_bytes: int = 1 << 20) -> memoryview: ...

    def fetch(self, offset: int, max_records: Optional[int] = None,
              max_bytes: int = 1 << 20, *, verify_crc: bool = True) -> tuple[list[Record], int]:
        """read(offset, ...) and the offset to read next: past the last record returned, or,
        when none was, past the markers, emptied batches and gaps that read passed over (the
        log end if nothing else is left), so a `records, pos = log.fetch(pos)` + `if not
        records: log.wait_for(pos)` loop sleeps at the end of a log that ends in markers."""
        end = self._leo
        recs = self.read(offset, max_records, max_bytes, verify_crc=verify_crc)
        if recs:
            return recs, recs[-1].offset + 1
        return recs, after_empty_read(self, offset, end)

    def iter_chunks(self, start: Optional[int] = None,
                    max_bytes: int = 1 << 20) -> Iterator[list[Record]]:
        """Records from start (default log_start_offset) in lists of about max_bytes of batches,
        to the end as of each chunk read (past markers and gaps)."""
        offset = self._log_start_offset if start is None else start
        while offset < self._leo:
            offset = max(offset, self._log_start_offset)
            try:
                chunk, nxt = self.fetch(offset, max_bytes=max_bytes)
            except OffsetOutOfRangeError:
                if offset < self._log_start_offset:
                    continue        # retention moved the start under the read: clamp again
                raise
            if nxt == offset:
                return
            if chunk:
                yield chunk
            offset = nxt

    def __iter__(self) -> Iterator[Record]:
        """Every record from log_start_offset to the end as of each chunk read."""
        return itertools.chain.from_iterable(self.iter_chunks())
