"""The .timeindex file: timestamp -> relative offset (Kafka's TimeIndex)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from kstore import _core
from kstore.errors import IndexOffsetOverflowError, InvalidOffsetError, KStoreStateError
from kstore.index import AbstractIndex, CorruptIndexError, INT32_MAX, TIME_DTYPE


class TimeIndex(AbstractIndex):
    """Maps timestamps to the relative offset of the batch holding the max timestamp so far."""

    ENTRY_SIZE = 12
    DTYPE = TIME_DTYPE

    def __init__(self, path, base_offset, max_index_size=-1, writable=True, io=None, load=True):
        super().__init__(path, base_offset, max_index_size, writable, io, load)
        self._last_entry = self._read_last_entry()

    def _read_last_entry(self) -> tuple[int, int]:
        if self._entries == 0 or self._map is None:
            return -1, self.base_offset
        ts, rel = _core.index_entry(self._map, self._entries - 1, 12)
        return ts, self.base_offset + rel

    def _after_truncate(self) -> None:
        self._last_entry = self._read_last_entry()

    def is_full(self) -> bool:
        # one slot is kept for the final entry written at roll/close (skip_full_check)
        return self._entries >= self.max_entries - 1

    @property
    def last_entry(self) -> tuple[int, int]:
        """(timestamp, offset) of the last entry, or (-1, base_offset) when empty."""
        return self._last_entry

    def entry(self, n: int) -> tuple[int, int]:
        if n < 0 or n >= self._entries:
            raise IndexError(f"entry {n} out of range for {self._entries} entries")
        ts, rel = _core.index_entry(self._mapping(), n, 12)
        return ts, self.base_offset + rel

    def lookup(self, target_ts: int) -> tuple[int, int]:
        """(timestamp, offset) of the largest entry with timestamp <= target, else (-1, base)."""
        if self._entries == 0:
            return -1, self.base_offset
        return _core.time_index_lookup(self._mapping(), self._entries, self.base_offset, target_ts)

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        with self._lock:
            st = self.state
            n = st.entries
            max_entries = self.max_entries
            if not skip_full_check and n >= max_entries - 1:      # is_full()
                raise KStoreStateError(f"Attempt to append to a full time index (size = {n}) {self.path}")
            last_ts, last_off = self._last_entry
            if n != 0 and offset < last_off:
                raise InvalidOffsetError(
                    f"Attempt to append an offset ({offset}) to slot {n} no larger than "
                    f"the last offset appended ({last_off}) to {self.path}")
            if n != 0 and timestamp < last_ts:
                raise InvalidOffsetError(
                    f"Attempt to append a timestamp ({timestamp}) to slot {n} no larger "
                    f"than the last timestamp appended ({last_ts}) to {self.path}")
            if timestamp > last_ts:
                if n >= max_entries:
                    raise KStoreStateError(f"time index {self.path} has no room for a final entry")
                rel = offset - self.base_offset
                if rel < 0 or rel > INT32_MAX:
                    raise IndexOffsetOverflowError(f"Integer overflow for offset: {offset} ({self.path})")
                if (n + 1) * 12 > self._allocated:
                    self.reserve_next()      # (a full disk: KafkaStorageError naming the file)
                _core.put_time_entry(self._mapping(), n, timestamp, rel)
                st.entries = n + 1
                self._last_entry = (timestamp, offset)

    def truncate_to(self, offset: int) -> None:
        """Remove entries whose offset >= offset."""
        with self._lock:
            if self._entries == 0:
                return
            slot = _core.time_index_floor_slot_by_offset(self._mapping(), self._entries, self.base_offset, offset)
            if slot < 0:
                n = 0
            elif self.entry(slot)[1] == offset:
                n = slot
            else:
                n = slot + 1
            self._truncate_to_entries(n)

    def sanity_check(self) -> None:
        self._check_sizes()
        if self._entries:
            first_ts = self.entry(0)[0]
            last_ts, last_off = self._last_entry
            if last_ts < first_ts:
                raise CorruptIndexError(
                    f"Corrupt time index found, time index file ({self.path}) has non-zero size but "
                    f"the last timestamp is {last_ts} which is less than the first timestamp {first_ts}")
            if last_off < self.base_offset:
                raise CorruptIndexError(
                    f"Corrupt time index found, time index file ({self.path}) has non-zero size but "
                    f"the last offset is {last_off} which is less than the base offset {self.base_offset}")

    def _entries_problem(self, arr: np.ndarray, log_size: int) -> Optional[str]:
        ts = arr["timestamp"].astype(np.int64)
        rel = arr["relative_offset"].astype(np.int64)
        if rel.min() < 0:
            return f"offset {self.base_offset + int(rel.min())} below the base offset {self.base_offset}"
        if len(rel) > 1 and not (np.all(np.diff(ts) >= 0) and np.all(np.diff(rel) >= 0)):
            return "entries not increasing"
        if log_size == 0:
            return "entries for an empty .log"
        return None

    def load_entries(self, raw: np.ndarray) -> None:
        self._load_bulk(raw)
        self._last_entry = self._read_last_entry()
