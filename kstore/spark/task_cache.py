"""What a Spark task's read opens, kept in its Python worker for the next task of that store.

Spark runs tasks in pooled Python workers (``spark.python.worker.reuse``, on by default), one
task at a time per worker, and stops a worker idle for a minute. A task that opened the store
afresh paid, per read, the read-only open of its partition (validating the segments' batch
headers) and the first touch of a new memory map and of new decode buffers: 62 ms of CPU for
a 500,000-record partition (16-byte keys, 100-byte values, 1000-record batches) against 25 ms
with reader and buffers reused, on a quiet core; decoding is 20 ms of either. So a task
checks out a `StoreReader` and its decode buffers
(`ColumnsPool`) from this process's cache and checks them in when it is done:

- checkout refreshes the reader (StoreReader.refresh: partitions added or deleted, log-start
  checkpoints) and the partition's log (Log.refresh: segments appended, rolled, deleted or
  replaced; a reader of a replaced file finishes on it, as every read-only log does), so the
  task sees exactly what a fresh open would. A partition directory that is not the one the
  reader opened (topic deleted and created again: another inode) drops the whole reader, so
  nothing of the old partition's offsets carries over;
- an entry is used by one task (one thread) at a time: checkout takes it out of the cache;
- a read that fails closes its entry instead of checking it in;
- entries idle for IDLE_SECONDS are closed (by the next checkout or checkin, or a timer), so
  an idle worker does not keep deleted segments' space mapped for long; at most MAX_IDLE per
  store are kept;
- a forked child (Spark's daemon forks workers) starts with an empty cache.

Lock: `_lock` (locks.py: "spark task_cache._lock") guards the idle lists and the timer only;
it is a leaf: readers are opened, refreshed and closed outside it.
"""
from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator, Optional, Sequence

from kstore.arrow import ColumnsPool
from kstore.errors import UnknownTopicError
from kstore.fileio import get_file_ops
from kstore.log import Log
from kstore.reader import StoreReader

#: Seconds an entry may stay unused before it is closed (Spark stops a worker idle for 60 s).
IDLE_SECONDS = 30.0
#: Entries kept per store (a worker runs one task at a time; more only with threads).
MAX_IDLE = 2

_lock = threading.Lock()
_idle: dict[tuple[str, ...], list["Entry"]] = {}
_timer: Optional[threading.Timer] = None


@dataclass
class Entry:
    """A checked-out reader of one store and the decode buffers its reads reuse."""
    reader: StoreReader
    pool: ColumnsPool = field(default_factory=ColumnsPool)
    #: partition dir -> (st_dev, st_ino) when the reader first opened it
    dirs: dict[str, tuple[int, int]] = field(default_factory=dict)
    last_used: float = 0.0

    def partition_log(self, topic: str, partition: int) -> Log:
        """The refreshed log of topic-partition (UnknownTopicError when it is gone). When its
        directory is no longer the one this reader opened (deleted and created again: another
        inode), the reader is replaced by a fresh one first, so nothing of the old partition
        (its log start offset, its mappings) carries over."""
        lg = self.reader.log(topic, partition, refresh=True)
        if self._same_dir(lg, topic, partition):
            return lg
        paths = self.reader.log_dirs
        self.reader.close()
        self.reader = StoreReader(paths)
        self.dirs.clear()
        lg = self.reader.log(topic, partition)
        self._same_dir(lg, topic, partition)
        return lg

    def _same_dir(self, lg: Log, topic: str, partition: int) -> bool:
        """Whether lg's directory is the one this reader opened (recorded on first use)."""
        try:
            st = get_file_ops().stat_path(lg.dir, follow_symlinks=False)
        except FileNotFoundError:
            raise UnknownTopicError(f"partition {topic}-{partition} was deleted under the read "
                                    f"({lg.dir} is gone)") from None
        ident = (st.st_dev, st.st_ino)
        return self.dirs.setdefault(lg.dir, ident) == ident


def _key(paths: Sequence[str]) -> tuple[str, ...]:
    return tuple(os.path.abspath(p) for p in paths)


def _expired(now: float) -> list[Entry]:
    """Take out the entries idle too long (under _lock)."""
    out = []
    for key in list(_idle):
        keep = [e for e in _idle[key] if now - e.last_used < IDLE_SECONDS]
        out += [e for e in _idle[key] if now - e.last_used >= IDLE_SECONDS]
        if keep:
            _idle[key] = keep
        else:
            del _idle[key]
    return out


def _close(entries: list[Entry]) -> None:
    for e in entries:
        e.reader.close()


def _sweep() -> None:
    """The timer: close expired entries, and run again while entries remain."""
    global _timer
    with _lock:
        _timer = None
        gone = _expired(time.monotonic())
        if _idle:
            _schedule()
    _close(gone)


def _schedule() -> None:
    """Start the sweep timer unless it runs (under _lock)."""
    global _timer
    if _timer is None:
        _timer = threading.Timer(IDLE_SECONDS, _sweep)
        _timer.daemon = True
        _timer.start()


def _checkout(paths: Sequence[str]) -> Entry:
    key = _key(paths)
    with _lock:
        gone = _expired(time.monotonic())
        kept = _idle.get(key)
        entry = kept.pop() if kept else None
        if kept is not None and not kept:
            del _idle[key]
    _close(gone)
    if entry is not None:
        try:
            entry.reader.refresh()
            return entry
        except BaseException:
            entry.reader.close()
            raise
    return Entry(StoreReader(list(paths)))


def _checkin(paths: Sequence[str], entry: Entry) -> None:
    entry.last_used = time.monotonic()
    with _lock:
        kept = _idle.setdefault(_key(paths), [])
        extra = kept[:len(kept) + 1 - MAX_IDLE] if len(kept) >= MAX_IDLE else []
        del kept[:len(extra)]
        kept.append(entry)
        _schedule()
    _close(extra)


@contextmanager
def store(paths: Sequence[str]) -> Iterator[Entry]:
    """A refreshed reader of the store at paths and its decode buffers, for one read: checked
    in again when the block ends normally (or its generator is closed early), closed when it
    raises."""
    entry = _checkout(paths)
    try:
        yield entry
    except GeneratorExit:
        _checkin(paths, entry)
        raise
    except BaseException:
        entry.reader.close()
        raise
    _checkin(paths, entry)


def clear() -> None:
    """Close every idle entry (tests; a process that wants its mappings gone now)."""
    global _timer
    with _lock:
        gone = [e for kept in _idle.values() for e in kept]
        _idle.clear()
        timer, _timer = _timer, None
    if timer is not None:
        timer.cancel()
    _close(gone)


def idle_count() -> int:
    """Entries in the cache (not checked out)."""
    with _lock:
        return sum(len(k) for k in _idle.values())


def _after_fork() -> None:
    global _lock, _timer
    _lock = threading.Lock()
    _idle.clear()           # the parent's readers stay the parent's; never closed here
    _timer = None


os.register_at_fork(after_in_child=_after_fork)
