"""The errors of a failing disk, as a Log raises them: an OSError on a write path fails the log
(Kafka's offline log dir) and surfaces as KafkaStorageError naming it; later writes are refused
without touching the disk. Used by LocalLog and Log (moved out of local_log.py).
"""
from __future__ import annotations

import errno
import functools

from kstore.errors import KafkaStorageError

__all__ = ["failed_error", "storage_error", "storage_op"]


def failed_error(log_dir: str, failed: str) -> KafkaStorageError:
    """The error every write of a failed log raises (it names the first I/O error)."""
    return KafkaStorageError(errno.EIO, f"log {log_dir} failed after an I/O error ({failed}); "
                             f"reopen it once the disk is fixed")


def storage_error(log_dir: str, e: OSError) -> KafkaStorageError:
    """e as a KafkaStorageError naming the log (e itself if it already is one)."""
    if isinstance(e, KafkaStorageError):
        return e
    err = KafkaStorageError(e.errno or errno.EIO, f"{e.strerror or e} (log {log_dir})")
    err.__cause__ = e
    return err


def storage_op(fn):
    """A write-side Log operation: an OSError fails the log (Kafka's offline log dir) and is
    raised as KafkaStorageError naming it; later writes are refused without touching the disk.
    (append inlines the same steps: it is the hot path.)"""
    @functools.wraps(fn)
    def op(self, *args, **kw):
        if self._failed is not None:
            raise failed_error(self.dir, self._failed)
        try:
            return fn(self, *args, **kw)
        except OSError as e:
            self._fail_on(e)
            raise storage_error(self.dir, e) from e
    return op
