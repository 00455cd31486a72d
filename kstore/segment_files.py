"""A segment's files by name (part of LogSegment, segment.py): the four paths, renaming them
to another suffix (`.deleted`, `.cleaned`, `.swap`) and unlinking them. A mixin: it works on
LogSegment's own attributes, under its lock."""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Optional

from kstore.fileio import FileOps
from kstore.files import (INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX,
                          segment_file)

if TYPE_CHECKING:
    from kstore.offset_index import OffsetIndex
    from kstore.time_index import TimeIndex


class SegmentFiles:
    """The file-name operations of LogSegment (a mixin placed before SegmentReader)."""

    dir: str
    base_offset: int
    log_path: str
    offset_index_path: str
    time_index_path: str
    _suffix: str
    _io: FileOps
    _lock: threading.RLock
    _oidx: Optional["OffsetIndex"]
    _tidx: Optional["TimeIndex"]

    if TYPE_CHECKING:
        def settle_size(self) -> None: ...        # SegmentReader's

        def close_handlers(self) -> None: ...     # LogSegment's

    def _paths(self) -> list[str]:
        txn = segment_file(self.dir, self.base_offset, TXN_INDEX_SUFFIX, self._suffix)
        return [self.log_path, self.offset_index_path, self.time_index_path, txn]

    def change_file_suffixes(self, old: str, new: str) -> None:
        """Rename every file of the segment from suffix `old` to `new` (e.g. '' → '.deleted')."""
        self.settle_size()
        with self._lock:
            for path in self._paths():
                if not path.endswith(old) and old:
                    continue
                target = (path[: len(path) - len(old)] if old else path) + new
                if self._io.exists(path):
                    self._io.rename(path, target)
            self._suffix = self._suffix[: len(self._suffix) - len(old)] + new if old else self._suffix + new
            self.log_path = segment_file(self.dir, self.base_offset, LOG_SUFFIX, self._suffix)
            self.offset_index_path = segment_file(self.dir, self.base_offset, INDEX_SUFFIX, self._suffix)
            self.time_index_path = segment_file(self.dir, self.base_offset, TIME_INDEX_SUFFIX, self._suffix)
            if self._oidx is not None:
                self._oidx.path = self.offset_index_path
            if self._tidx is not None:
                self._tidx.path = self.time_index_path

    def delete(self) -> None:
        """Unmap and unlink every file of the segment."""
        self.close_handlers()
        for path in self._paths():
            try:
                self._io.unlink(path)
            except FileNotFoundError:
                pass
