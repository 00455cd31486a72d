"""What one segment's recovery found (LogSegment.recover, the loader's recovery report)."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class SegmentRecovery:
    """What LogSegment.recover() found (the core's recover_scan, without the index entries)."""
    segment: str                  #: the .log's path
    status: str                   #: why the scan stopped: "ok" at the end, else the first invalid batch's kind
    reason: str                   #: the invalid batch in words ("" if none)
    valid_bytes: int
    truncated_bytes: int          #: bytes cut off after valid_bytes
    tail_zero: bool               #: the bytes cut were zeros (a preallocated tail, not corruption)
    batches: int
    next_offset: int              #: one past the last valid offset (-1 without batches)
    max_timestamp: int
    offset_of_max_timestamp: int
    first_batch_timestamp: int
    #: (epoch, base offset) of the valid batches whose leader epoch is above every earlier one's
    #: in the segment: assigned to the leader epoch cache as Kafka's recover does (leader_epoch.py)
    epochs: tuple[tuple[int, int], ...] = ()


def bytes_since_entry(index, size: int) -> int:
    """Kafka's bytesSinceLastIndexEntry for a segment of `size` bytes that takes appends again
    (made active after an open or a recovery, or truncated): the bytes from the batch of its
    offset index's last entry (0 without one) to its end, as recovery's scan counts them
    (validBytes - lastIndexEntry). Both then place the next entries alike, so the next unclean
    open finds the writer's index sound and leaves it (counting from 0 at the end, as Kafka
    does after recover(), put every later entry up to one interval late: the last segment's
    .index was rewritten at every unclean open, issue 14)."""
    n = index.entries
    return max(0, size - (index.entry(n - 1)[1] if n else 0))
