"""Writing to a store from Spark: each task encodes its rows into v2 batches per (topic,
partition) and stages them in files; the driver's commit appends the staged batches as the
store's writer, so a failed or retried task leaves nothing in the log."""
from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (DataSourceArrowWriter, DataSourceStreamArrowWriter,
                                    WriterCommitMessage)

from kstore import _core
from kstore.arrow import column_input, key_hashes
from kstore.config import NO_LIMIT
from kstore.errors import (InvalidConfigError, InvalidRecordError, KStoreError, LogDirLockedError,
                           RecordTooLargeError, UnknownTopicError)
from kstore.fileio import get_file_ops
from kstore.log import split_rows
from kstore.offsets_topic import flock_holder
from kstore.spark.deploy import check, check_writer_fs, identify
from kstore.spark.options import TopicPartition, TopicPlan, WriteOptions
from kstore.spark.staging import (collect_stale, lock_dir, remove_dirs, staging_root,
                                  streaming_write_id)

log = logging.getLogger("kstore.spark")

#: Target size of one staged record batch (the broker-side batch a Spark row group becomes).
STAGED_BATCH_BYTES = 1 << 20


@dataclass
class StagedFile:
    topic: str
    partition: int
    path: str
    records: int


@dataclass
class KStoreCommitMessage(WriterCommitMessage):
    """A task's staged files, and its write's staging directory (the commit removes it)."""
    staged: list[StagedFile]
    staging: str = ""


@dataclass
class _StagingFile:
    """A staging file a task is writing: its descriptor and path, records and bytes so far."""
    fd: int
    path: str
    records: int = 0
    size: int = 0


def _topics_of(batch: pa.RecordBatch, wo: WriteOptions) -> tuple[list[str], np.ndarray]:
    """(distinct topics, per-row index into them)."""
    n = batch.num_rows
    if wo.topic is not None:
        return [wo.topic], np.zeros(n, dtype=np.int32)
    col = batch.column(batch.schema.get_field_index("topic"))
    if col.null_count:
        raise InvalidRecordError("null topic present in the data; use the 'topic' option "
                                 "to set a default topic")
    enc = pc.dictionary_encode(pc.cast(col, pa.string()))
    return enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False).astype(np.int32)


class _Stager:
    """A write task: encodes rows into v2 batches per (topic, partition) and appends them to
    staging files. Nothing reaches the log until the driver commits."""

    def __init__(self, wo: WriteOptions, task_id: str, streaming: bool = False):
        self.wo = wo
        self.task_id = task_id
        self.io = get_file_ops()
        self.files: dict[TopicPartition, _StagingFile] = {}
        self.builder = _core.BatchBuilder()
        self.rr = 0
        # a streaming sink's micro-batch: q-<query>-b<batch>, which every task and the commit's
        # messages know; a batch write (foreachBatch's too: it may write twice in a batch): the
        # id drawn at planning
        wid = streaming_write_id() if streaming else None
        self.dir = os.path.join(staging_root(wo.paths[0]), wid) if wid else wo.staging
        self.dir_lock: Optional[int] = None

    def plan_for(self, topic: str) -> TopicPlan:
        p = self.wo.plans.get(topic)
        if p is None:
            if not self.wo.auto_create:
                raise UnknownTopicError(f"topic {topic!r} does not exist and auto.create.topics.enable is false")
            p = self.wo.default_plan
        if p.magic < 2:
            raise InvalidConfigError(
                f"topic {topic!r} writes message format v{p.magic} (message.format.version); "
                "the kstore sink writes v2 batches only, as Kafka 3.0+ brokers do")
        return p

    def add(self, batch: pa.RecordBatch) -> None:
        n = batch.num_rows
        if n == 0:
            return
        if batch.schema.names != self.wo.columns:     # extra columns: ignored, as Kafka's sink
            batch = batch.select([c for c in self.wo.columns if c in batch.schema.names])
        topics, tix = _topics_of(batch, self.wo)
        pcol = batch.schema.get_field_index("partition")
        explicit = None
        if pcol >= 0:
            pa_col = batch.column(pcol)
            explicit = pc.cast(pa_col, pa.int64()).fill_null(-1).to_numpy(zero_copy_only=False)
        hashes = key_hashes(batch)
        parts = np.empty(n, dtype=np.int64)
        for i, topic in enumerate(topics):
            rows = np.nonzero(tix == i)[0] if len(topics) > 1 else np.arange(n)
            plan = self.plan_for(topic)
            # Kafka's default partitioner per key, round robin for null keys
            h = hashes[rows]
            dflt = np.where(h >= 0, h % plan.partitions, -1)
            nulls = np.nonzero(dflt < 0)[0]
            if len(nulls):
                dflt[nulls] = (self.rr + np.arange(len(nulls))) % plan.partitions
                self.rr += len(nulls)
            if explicit is not None:
                given = explicit[rows]
                bad = np.nonzero((given >= plan.partitions) | (given < -1))[0]
                if len(bad):
                    raise InvalidRecordError(
                        f"partition {int(given[bad[0]])} of topic {topic!r} does not exist "
                        f"(it has {plan.partitions})")
                dflt = np.where(given >= 0, given, dflt)
            parts[rows] = dflt
        # one stable sort groups rows by (topic, partition) keeping their order within a group
        group = tix.astype(np.int64) * (1 << 32) + parts
        order = np.argsort(group, kind="stable")
        if not np.array_equal(order, np.arange(n)):
            batch = batch.take(pa.array(order))
            group = group[order]
        cols = column_input(batch)
        sizes = cols.sizes()
        cuts = np.nonzero(np.diff(group))[0] + 1
        bounds = [0, *cuts.tolist(), n]
        now = int(time.time() * 1000)
        b = self.builder
        for s, e in zip(bounds[:-1], bounds[1:]):
            topic = topics[int(group[s] >> 32)]
            partition = int(group[s] & 0xFFFFFFFF)
            plan = self.plan_for(topic)
            budget = max(1, min(STAGED_BATCH_BYTES, plan.max_message_bytes - 256))
            b.compression_level = plan.level
            for lo, hi in split_rows(sizes, s, e, budget):
                b.build_columns(lo, hi, cols, 0, now, plan.log_append_time,
                                now - min(plan.ts_before_ms, NO_LIMIT),
                                now + min(plan.ts_after_ms, NO_LIMIT), plan.require_key, plan.codec)
                if b.size > plan.max_message_bytes:
                    raise RecordTooLargeError(
                        f"a record for {topic}-{partition} encodes to a {b.size}-byte batch, "
                        f"larger than max.message.bytes ({plan.max_message_bytes})")
                self._write(topic, partition, b.getvalue(), hi - lo)

    def _write(self, topic: str, partition: int, data: bytes, records: int) -> None:
        f = self.files.get((topic, partition))
        if f is None:
            if self.dir_lock is None:          # held until finish/discard: we are alive
                self.dir_lock = lock_dir(self.dir, self.io)
            path = os.path.join(self.dir, f"{self.task_id}-{len(self.files)}.batches")
            fd = self.io.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
            f = self.files[(topic, partition)] = _StagingFile(fd, path)
        self.io.pwrite(f.fd, data, f.size)
        f.records += records
        f.size += len(data)

    def finish(self) -> KStoreCommitMessage:
        staged = []
        for (topic, partition), f in self.files.items():
            self.io.close(f.fd)
            staged.append(StagedFile(topic, partition, f.path, f.records))
        self.files.clear()
        self._unlock()
        return KStoreCommitMessage(staged, self.dir)

    def _unlock(self) -> None:
        if self.dir_lock is not None:
            fd, self.dir_lock = self.dir_lock, None
            self.io.unlock(fd)

    def discard(self) -> None:
        for f in self.files.values():
            try:
                self.io.close(f.fd)
                self.io.unlink(f.path)
            except OSError:
                pass
        self.files.clear()
        self._unlock()


def _task_id() -> str:
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is not None:
            return f"p{ctx.partitionId()}-a{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}"
    except Exception:     # pragma: no cover - outside a task
        pass
    return uuid.uuid4().hex


def stage_batches(wo: WriteOptions, batches: Iterator[pa.RecordBatch],
                  streaming: bool = False) -> KStoreCommitMessage:
    """A write task: stage every batch; on failure remove what this task staged."""
    st = _Stager(wo, _task_id(), streaming)
    try:
        for b in batches:
            st.add(b)
        return st.finish()
    except BaseException:
        st.discard()
        raise


def _lock_holder(paths: Sequence[str]) -> str:
    """Who holds the store's writer lock, as far as this host can tell (for error messages)."""
    from kstore.manager import LOCK_FILE
    for d in paths:
        pid = flock_holder(os.path.join(d, LOCK_FILE))
        if pid is not None:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read(200).replace(b"\0", b" ").decode("utf-8", "replace").strip()
            except OSError:
                cmd = ""
            return (f"held by pid {pid} on {socket.gethostname()}" + (f" ({cmd})" if cmd else "")
                    + f", lock file {os.path.join(d, LOCK_FILE)}")
    return ("held by a process this host cannot name (another host, or it has just exited); "
            f"lock files: {', '.join(os.path.join(d, LOCK_FILE) for d in paths)}")


def open_store(wo: WriteOptions):
    """The store as its writer (a LogManager), waiting for its lock with backoff (10 ms doubling
    to 500 ms) up to lockTimeoutMs: an application may hold the store briefly. Past that, fails
    with LogDirLockedError naming the holder."""
    from kstore.manager import LogManager
    deadline = time.monotonic() + wo.lock_timeout_ms / 1000
    pause = 0.01
    while True:
        try:
            return LogManager(wo.paths, wo.broker)
        except LogDirLockedError as e:
            left = deadline - time.monotonic()
            if left <= 0:
                raise LogDirLockedError(
                    f"kstore sink: the commit could not take the store's writer lock in "
                    f"{wo.paths} within lockTimeoutMs={wo.lock_timeout_ms}: it is "
                    f"{_lock_holder(wo.paths)}. ({e})") from None
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)


def _messages(messages: Sequence[Optional[WriterCommitMessage]]) -> list[KStoreCommitMessage]:
    return [m for m in messages if isinstance(m, KStoreCommitMessage)]   # None: a failed task


def commit_staged(wo: WriteOptions, messages: Sequence[Optional[WriterCommitMessage]]) -> int:
    """The driver's commit: append every staged file, in task order, as the store's writer;
    create topics the data names that do not exist yet. Returns the records appended.

    Every staged file is opened (and its write's staging directory locked against the
    collector) before the store is. Topics are created at their first append; if the commit
    fails, a topic it created that no record reached is deleted again before the store's lock
    is released (a concurrent reader may see it, empty, while the commit runs). Records already
    appended stay (at least once, as Kafka's sink). The staging is removed whatever happens."""
    io = get_file_ops()
    msgs = _messages(messages)
    dirs = sorted({m.staging for m in msgs if m.staging} | {wo.staging})
    staged = [sf for m in msgs for sf in m.staged]
    locks: list[int] = []
    fds: list[int] = []
    total = 0
    try:
        for d in dirs:
            if os.path.isdir(d):
                locks.append(lock_dir(d, io))
        for sf in staged:
            try:
                fds.append(io.open(sf.path, os.O_RDONLY))
            except FileNotFoundError:
                raise KStoreError(
                    f"kstore sink: staged file {sf.path} ({sf.topic}-{sf.partition}) is gone "
                    "(removed as stale staging? see staleStagingMs); nothing was appended") from None
        if not staged:
            return 0
        with open_store(wo) as mgr:
            known = set(mgr.topics())
            created: dict[str, bool] = {}        # topic this commit created -> a record landed
            try:
                for sf, fd in zip(staged, fds):
                    if sf.topic not in known:
                        if not wo.auto_create:
                            raise UnknownTopicError(f"topic {sf.topic!r} does not exist")
                        mgr.create_topic(sf.topic)
                        known.add(sf.topic)
                        created[sf.topic] = False
                    lg = mgr.log(sf.topic, sf.partition)
                    size = io.size(fd)
                    if size:
                        m = io.map(fd, size, False)
                        try:
                            lg.append_batches(m)
                        finally:
                            m.close()
                        if sf.topic in created:
                            created[sf.topic] = True
                    total += sf.records
            except BaseException:
                for t, landed in created.items():
                    if not landed:
                        try:
                            mgr.delete_topic(t)
                        except Exception as e:      # pragma: no cover - the first error wins
                            log.error("kstore sink: could not delete topic %s created by a "
                                      "failed commit: %s", t, e)
                raise
    finally:
        for fd in fds:
            io.close(fd)
        for fd in locks:
            io.unlock(fd)
        remove_dirs(dirs, [sf.path for sf in staged])
    return total


def remove_staging(wo: WriteOptions,
                   messages: Sequence[Optional[WriterCommitMessage]] = ()) -> None:
    """An abort: remove the files the tasks staged and their write's directories."""
    msgs = _messages(messages)
    remove_dirs(sorted({m.staging for m in msgs if m.staging} | {wo.staging}),
                [sf.path for m in msgs for sf in m.staged])


def _collect(wo: WriteOptions) -> None:
    """At planning: remove the staging dead writes left (staging.collect_stale)."""
    if os.path.isdir(wo.paths[0]):
        collect_stale(wo.paths[0], wo.stale_staging_ms)


class KStoreBatchWriter(DataSourceArrowWriter):
    """df.write.format("kstore").mode("append"): tasks stage, the driver's commit appends."""

    def __init__(self, wo: WriteOptions):
        self.wo = wo
        check_writer_fs(wo.paths)       # planned on the driver: refuse an unsafe filesystem
        self.store = identify(wo.paths, make_dirs=True)
        _collect(wo)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
        check(self.store)               # never stage on a disk that is not the store
        return stage_batches(self.wo, iterator)

    def commit(self, messages: list[Optional[WriterCommitMessage]]) -> None:
        commit_staged(self.wo, messages)

    def abort(self, messages: list[Optional[WriterCommitMessage]]) -> None:
        remove_staging(self.wo, messages)


class KStoreStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: each micro-batch stages and commits like a batch write (at least once,
    as Kafka's sink: a micro-batch replayed after a failure is appended again). PySpark builds
    a new writer for every commit, so a micro-batch's staging is named by the query and batch
    ids its tasks see, and the commit finds it through the commit messages."""

    def __init__(self, wo: WriteOptions):
        self.wo = wo
        check_writer_fs(wo.paths)
        self.store = identify(wo.paths, make_dirs=True)
        _collect(wo)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
        check(self.store)
        return stage_batches(self.wo, iterator, streaming=True)

    def commit(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        commit_staged(self.wo, messages)

    def abort(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        remove_staging(self.wo, messages)
