"""The .index file: relative offset -> position in the segment's .log (Kafka's OffsetIndex)."""
from __future__ import annotations

from typing import Optional

import numpy as np

from kstore import _core
from kstore.errors import IndexOffsetOverflowError, InvalidOffsetError, KStoreStateError
from kstore.index import AbstractIndex, CorruptIndexError, INT32_MAX, OFFSET_DTYPE


class OffsetIndex(AbstractIndex):
    """Maps relative offsets to positions in the segment's .log file."""

    ENTRY_SIZE = 8
    DTYPE = OFFSET_DTYPE

    def __init__(self, path, base_offset, max_index_size=-1, writable=True, io=None, load=True):
        super().__init__(path, base_offset, max_index_size, writable, io, load)
        self._last_offset = self._read_last_offset()

    def _read_last_offset(self) -> int:
        if self._entries == 0 or self._map is None:
            return self.base_offset
        rel, _ = _core.index_entry(self._map, self._entries - 1, 8)
        return self.base_offset + rel

    def _after_truncate(self) -> None:
        self._last_offset = self._read_last_offset()

    @property
    def last_offset(self) -> int:
        return self._last_offset

    def entry(self, n: int) -> tuple[int, int]:
        """(offset, position) of entry n."""
        if n < 0 or n >= self._entries:
            raise IndexError(f"entry {n} out of range for {self._entries} entries")
        rel, pos = _core.index_entry(self._mapping(), n, 8)
        return self.base_offset + rel, pos

    def lookup(self, target_offset: int) -> tuple[int, int]:
        """(offset, position) of the largest entry with offset <= target, else (base, 0)."""
        if self._entries == 0:
            return self.base_offset, 0
        return _core.offset_index_lookup(self._mapping(), self._entries, self.base_offset, target_offset)

    def append(self, offset: int, position: int) -> None:
        # the entry count read once from the state (one per appended batch: no property calls)
        with self._lock:
            st = self.state
            n = st.entries
            if n >= self.max_entries:
                raise KStoreStateError(f"Attempt to append to a full index (size = {n}) {self.path}")
            if n == 0 or offset > self._last_offset:
                rel = offset - self.base_offset
                if rel < 0 or rel > INT32_MAX:
                    raise IndexOffsetOverflowError(
                        f"Integer overflow for offset: {offset} ({self.path})")
                if (n + 1) * 8 > self._allocated:
                    self.reserve_next()      # (a full disk: KafkaStorageError naming the file)
                _core.put_offset_entry(self._mapping(), n, rel, position)
                st.entries = n + 1
                self._last_offset = offset
            else:
                raise InvalidOffsetError(
                    f"Attempt to append an offset ({offset}) to position {n} no larger "
                    f"than the last offset appended ({self._last_offset}) to {self.path}")

    def truncate_to(self, offset: int) -> None:
        """Remove entries for offsets >= offset."""
        with self._lock:
            if self._entries == 0:
                return
            slot = _core.offset_index_floor_slot(self._mapping(), self._entries, self.base_offset, offset)
            if slot < 0:
                n = 0
            elif self.entry(slot)[0] == offset:
                n = slot
            else:
                n = slot + 1
            self._truncate_to_entries(n)

    def sanity_check(self) -> None:
        self._check_sizes()
        if self._entries and self._last_offset < self.base_offset:
            raise CorruptIndexError(
                f"Corrupt index found, index file ({self.path}) has non-zero size but the last "
                f"offset is {self._last_offset} which is less than the base offset {self.base_offset}.")

    def _entries_problem(self, arr: np.ndarray, log_size: int) -> Optional[str]:
        rel = arr["relative_offset"].astype(np.int64)
        pos = arr["position"].astype(np.int64)
        if rel[0] < 0:
            return f"offset {self.base_offset + int(rel[0])} below the base offset {self.base_offset}"
        if len(rel) > 1 and not (np.all(np.diff(rel) > 0) and np.all(np.diff(pos) > 0)):
            return "entries not increasing"
        if pos[0] < 0 or int(pos[-1]) >= max(log_size, 1):
            return f"position {int(pos[-1])} past the end of the .log ({log_size} bytes)"
        return None

    def load_entries(self, raw: np.ndarray) -> None:
        self._load_bulk(raw)
        self._last_offset = self._read_last_offset()
