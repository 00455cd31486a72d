"""Where a Spark write stages its batches until the driver's commit, and how staging is found,
removed and collected.

Layout: ``<first log dir>/.kstore-staging/<write id>/<task>-<n>.batches``, on the store's own
filesystem (shared by every node in a cluster), never an executor's local disk. The write id is
something every participant of one write knows without talking to the others:

- a batch write: an id drawn when the write is planned (the writer object, pickled to the tasks
  and handed back to the commit, carries it);
- a streaming micro-batch: ``q-<query id>-b<batch id>``, from the task's local properties. The
  commit runs in a writer PySpark builds afresh for each commit, so it learns the directories
  from the commit messages, which name them.

Liveness: a task holds a shared flock on its write's directory from creating it until it has
staged everything (or failed and removed its files); a commit holds one while it appends. The
collector (``collect_stale``, run when a write is planned) removes a directory only when it can
take the flock exclusively AND nothing in it changed for ``staleStagingMs``: so never one a task
or commit is using, and never a finished task's files waiting for a commit that is still due.
It renames the directory away before removing it, and a task checks after taking its lock that
the name still leads to the directory it locked, so a task never stages into a directory being
removed.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from typing import Iterable, Optional

from kstore.errors import UnusableFileError
from kstore.fileio import FileOps, get_file_ops
from kstore.spark.options import STAGING_DIR

log = logging.getLogger("kstore.spark")

_TRASH = ".removing-"


def staging_root(log_dir: str) -> str:
    return os.path.join(log_dir, STAGING_DIR)


def new_write_id() -> str:
    """A batch write's id, drawn once when the write is planned."""
    return "w-" + uuid.uuid4().hex


def streaming_write_id() -> Optional[str]:
    """In a streaming micro-batch's task: ``q-<query id>-b<batch id>`` (the same in every task
    of the batch and in every attempt of it, a restart's replay included); None elsewhere."""
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is None:
            return None
        q, b = ctx.getLocalProperty("sql.streaming.queryId"), ctx.getLocalProperty("streaming.sql.batchId")
    except Exception:      # pragma: no cover - outside a task
        return None
    if not q or b is None or not all(c.isalnum() or c == "-" for c in q + b):
        return None
    return f"q-{q}-b{b}"


def lock_dir(path: str, io: Optional[FileOps] = None, attempts: int = 50) -> int:
    """Create the staging directory `path` if needed and flock it shared (a task or a commit
    using it). Returns the descriptor to pass to io.unlock. Retries while the collector holds it
    or has just renamed it away."""
    io = io or get_file_ops()
    for _ in range(attempts):
        os.makedirs(path, exist_ok=True)
        try:
            fd = io.try_lock(path, shared=True, directory=True)
        except FileNotFoundError:
            continue
        if fd is None:
            time.sleep(0.01)
            continue
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        io.unlock(fd)
    raise OSError(f"kstore sink: could not take the staging directory {path}: another process "
                  "kept removing it")


def newest_change_ms(path: str) -> int:
    """The newest mtime of a staging directory and the files in it (ms)."""
    newest = os.stat(path).st_mtime_ns
    for name in os.listdir(path):
        try:
            newest = max(newest, os.stat(os.path.join(path, name), follow_symlinks=False).st_mtime_ns)
        except FileNotFoundError:
            pass
    return newest // 1_000_000


def collect_stale(log_dir: str, stale_ms: int, io: Optional[FileOps] = None) -> list[str]:
    """Remove the staging of writes that died (tasks killed, drivers gone before their commit):
    directories no task or commit has locked and nothing in which changed for stale_ms. Returns
    the names removed. Never raises (a failure is logged): collection must not fail a write."""
    io = io or get_file_ops()
    root = staging_root(log_dir)
    removed: list[str] = []
    try:
        names = io.listdir(root)
    except (OSError, UnusableFileError):
        return removed
    now = time.time() * 1000
    for name in names:
        path = os.path.join(root, name)
        try:
            if name.startswith(_TRASH):        # a collector that died half-way
                if now - newest_change_ms(path) >= stale_ms:
                    shutil.rmtree(path, ignore_errors=True)
                continue
            if not os.path.isdir(path) or os.path.islink(path):
                continue
            fd = io.try_lock(path, directory=True)
            if fd is None:
                continue                       # a task or a commit is using it
            try:
                if now - newest_change_ms(path) < stale_ms:
                    continue
                trash = os.path.join(root, f"{_TRASH}{name}-{uuid.uuid4().hex[:8]}")
                io.rename(path, trash)
            finally:
                io.unlock(fd)
            shutil.rmtree(trash, ignore_errors=True)
            removed.append(name)
        except OSError as e:
            log.warning("kstore sink: could not collect stale staging %s: %s", path, e)
    if removed:
        log.info("kstore sink: removed stale staging of %d dead write(s) in %s: %s",
                 len(removed), root, ", ".join(sorted(removed)))
    remove_root_if_empty(log_dir)
    return removed


def remove_dirs(dirs: Iterable[str], files: Iterable[str] = ()) -> None:
    """After a commit or an abort: the files it was handed, then the write's directories (with
    whatever a failed attempt of the same write left in them), then the root once empty."""
    io = get_file_ops()
    for f in files:
        try:
            io.unlink(f)
        except OSError:
            pass
    roots = set()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)
        roots.add(os.path.dirname(d))
    for r in roots:
        try:
            io.rmdir(r)
        except OSError:
            pass


def remove_root_if_empty(log_dir: str) -> None:
    try:
        get_file_ops().rmdir(staging_root(log_dir))
    except OSError:
        pass
