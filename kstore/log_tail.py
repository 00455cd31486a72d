"""What lies past the bytes a reader validated in a `.log`: the end (zeros: the active
segment's runway), a batch a writer is still copying, or bytes that are no batch (garbage, a
torn write that will never finish). Used by the dump tool (its trailing-bytes report), by the
tools that describe a store, and by every read-only open, which warns through the `kstore.log`
logger instead of showing a garbage segment as an empty one (issue 16 item 11 and leftover).
"""
from __future__ import annotations

import logging
import os
import struct
import time
from typing import Any, Optional

from kstore import _core
from kstore.fileio import get_file_ops

log = logging.getLogger("kstore.log")


def stop_reason(data: bytes, pos: int) -> Optional[tuple[str, bool]]:
    """Why the batches end at `pos` (FileLogInputStream.nextBatch's checks): None when nothing
    but zeros follows (the end, or the active segment's preallocated runway); otherwise
    (what is wrong, whether it is only a batch cut short by the end of the data)."""
    rest = len(data) - pos
    if rest <= 0 or not any(data[pos:]):
        return None
    if rest < 17:
        return f"{rest} bytes left, fewer than a batch header's 17", True
    size = struct.unpack_from(">i", data, pos + 8)[0]
    magic = data[pos + 16]
    if size < 14:
        return f"record size {size} is smaller than the minimum record overhead (14)", False
    if magic > 2:
        return f"unknown magic byte {magic}", False
    if pos + 12 + size > len(data):
        return f"a batch of {size + 12} bytes runs past the end of the data ({rest} bytes left)", True
    if magic == 2 and size < 49:
        return f"v2 batch of {size + 12} bytes is smaller than the batch header (61 bytes)", False
    if magic == 2:
        return "negative lastOffsetDelta or record count", False
    return f"v{magic} message of {size + 12} bytes is smaller than its overhead", False


def tail_problem(path: str, valid_size: int, window: int = 1 << 16) -> Optional[str]:
    """What is wrong past the `valid_size` bytes a reader validated in the .log at `path`, or
    None: nothing but zeros (the active segment's runway) or a sound batch (one appended since,
    or longer than the `window` bytes read). Bytes still changing (a writer's copy in flight)
    are not judged. For `kstore topics describe` and `log-dirs`, which must not show a garbage
    segment as an empty one without a word (issue 16 item 11). A file deleted meanwhile
    (retention, compaction, a deleted topic) has nothing to say."""
    try:
        return _tail_problem(path, valid_size, window)
    except FileNotFoundError:
        return None


def _tail_problem(path: str, valid_size: int, window: int) -> Optional[str]:
    if get_file_ops().getsize(path) <= valid_size:
        return None

    def look() -> tuple[bytes, int]:
        io = get_file_ops()
        fd = io.open(path, os.O_RDONLY)
        try:
            size = io.size(fd)
            return io.pread(fd, min(window, max(size - valid_size, 0)), valid_size), size
        finally:
            io.close(fd)

    data, size = look()
    why = _batch_problem(data, size - valid_size)
    if why is None:
        return None
    time.sleep(0.05)
    if look() != (data, size):         # a writer is at work there: not garbage
        return None
    return (f"{path}: position {valid_size}: {size - valid_size} bytes that are not a valid "
            f"batch ({why}); the log's data ends there")


def _batch_problem(data: bytes, available: int) -> Optional[str]:
    """None when `data` (the first bytes of `available`) is zeros or starts with a batch whose
    CRC holds (or that runs past `data` but not past `available`); else what is wrong."""
    why = stop_reason(data, 0)
    if why is None:
        return None
    heads = _core.batch_headers(_core.Mapping.from_bytes(data), 0, len(data)) if data else []
    if heads:
        pos, _b, _l, size, magic, *_rest = heads[0]
        raw = data[:size]
        ok = (struct.unpack_from(">I", raw, 17)[0] == _core.crc32c(raw[21:]) if magic == 2
              else struct.unpack_from(">I", raw, 12)[0] == _core.crc32(raw[16:]))
        return None if ok else "its CRC does not match"
    if why[1] and len(data) < available:
        return None                     # a batch longer than the window: not judged here
    return why[0]


def warn_unreadable(lg: Any) -> int:
    """After a read-only open: one WARNING on the `kstore.log` logger per segment holding bytes
    past what the view validated that are no batch (the last segment's tail judged by
    tail_problem, a rolled segment's by its validation); returns how many."""
    n = 0
    segs = list(lg.segments)
    for i, seg in enumerate(segs):
        if i < len(segs) - 1:
            why = seg.view.corrupt
            problem = None if why is None else f"{seg.log_path}: {why}"
        else:
            problem = tail_problem(seg.log_path, seg.size)
        if problem is not None:
            n += 1
            log.warning("read-only open of %s: %s", lg.dir, problem)
    return n
