"""Delayed deletion of deleted partitions (Kafka's LogManager.deleteLogs).

`delete_topic` renames a partition to `topic-N.<uuid>-delete` and queues it with the rename
time; the scheduled task removes each one once `file.delete.delay.ms` has passed since then,
so readers that still map its files keep them for that long.
"""
from __future__ import annotations

import logging
import os
from collections import deque

from kstore.errors import UnusableFileError
from kstore.fileio import FileOps
from kstore.log_dir_failure import PARTITION_ERRNOS, LogDirFailureChannel

log = logging.getLogger("kstore.manager")


def delete_due(queue: deque[tuple[str, int]], io: FileOps, failures: LogDirFailureChannel,
               now_ms: int, delay_ms: int) -> int:
    """Remove the queued `-delete` dirs renamed at least delay_ms before now_ms; returns how
    many are gone. The others stay queued. A disk fault takes the dir's log dir offline; a
    partition-level problem (a symlink, a directory inside) is logged and the entry dropped."""
    n = 0
    # each entry once (start-up queues them by rename time, in no order); delete_topic may
    # append meanwhile: its entries wait for the next run
    for _ in range(len(queue)):
        path, at = queue.popleft()
        if at + delay_ms > now_ms:
            queue.append((path, at))
            continue
        try:
            io.check_dir(path)         # never follow a symlink out of the log dir
            for name in io.listdir(path):
                io.unlink(os.path.join(path, name))
            io.rmdir(path)
            io.fsync_dir(os.path.dirname(path))
            n += 1
        except FileNotFoundError:
            n += 1
        except UnusableFileError as e:
            log.error("not removing deleted partition %s: %s", path, e)
        except OSError as e:
            if e.errno in PARTITION_ERRNOS:     # e.g. a directory inside: not a disk fault
                log.error("could not remove deleted partition %s: %s", path, e)
            else:
                failures.mark_offline(os.path.dirname(path), e)
    return n
