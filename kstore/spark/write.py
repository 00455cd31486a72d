"""Writing to a store from Spark: each task encodes its rows into v2 batches per (topic,
partition) and stages them in files; the driver's commit appends the staged batches as the
store's writer, so a failed or retried task leaves nothing in the log."""
from __future__ import annotations

import os
import shutil
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
from kstore.errors import InvalidConfigError, InvalidRecordError, RecordTooLargeError, UnknownTopicError
from kstore.fileio import get_file_ops
from kstore.log import split_rows
from kstore.spark.deploy import check, check_writer_fs, identify
from kstore.spark.options import TopicPartition, TopicPlan, WriteOptions

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
    staged: list[StagedFile]


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

    def __init__(self, wo: WriteOptions, task_id: str):
        self.wo = wo
        self.task_id = task_id
        self.io = get_file_ops()
        self.files: dict[TopicPartition, _StagingFile] = {}
        self.builder = _core.BatchBuilder()
        self.rr = 0

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
            os.makedirs(self.wo.staging, exist_ok=True)
            path = os.path.join(self.wo.staging, f"{self.task_id}-{len(self.files)}.batches")
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
        return KStoreCommitMessage(staged)

    def discard(self) -> None:
        for f in self.files.values():
            try:
                self.io.close(f.fd)
                self.io.unlink(f.path)
            except OSError:
                pass
        self.files.clear()


def _task_id() -> str:
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is not None:
            return f"p{ctx.partitionId()}-a{ctx.attemptNumber()}-{uuid.uuid4().hex[:8]}"
    except Exception:     # pragma: no cover - outside a task
        pass
    return uuid.uuid4().hex


def stage_batches(wo: WriteOptions, batches: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
    """A write task: stage every batch; on failure remove what this task staged."""
    st = _Stager(wo, _task_id())
    try:
        for b in batches:
            st.add(b)
        return st.finish()
    except BaseException:
        st.discard()
        raise


def commit_staged(wo: WriteOptions, messages: Sequence[Optional[WriterCommitMessage]]) -> int:
    """The driver's commit: append every staged file, in task order, as the store's writer;
    create topics the data names that do not exist yet. Returns the records appended."""
    from kstore.manager import LogManager
    io = get_file_ops()
    total = 0
    try:
        with LogManager(wo.paths, wo.broker) as mgr:
            known = set(mgr.topics())
            for msg in messages:
                if not isinstance(msg, KStoreCommitMessage):     # None: a task that failed
                    continue
                for sf in msg.staged:
                    if sf.topic not in known:
                        if not wo.auto_create:
                            raise UnknownTopicError(f"topic {sf.topic!r} does not exist")
                        mgr.create_topic(sf.topic)
                        known.add(sf.topic)
                    lg = mgr.log(sf.topic, sf.partition)
                    fd = io.open(sf.path, os.O_RDONLY)
                    try:
                        size = io.size(fd)
                        if size:
                            m = io.map(fd, size, False)
                            try:
                                lg.append_batches(m)
                            finally:
                                m.close()
                    finally:
                        io.close(fd)
                    total += sf.records
    finally:
        remove_staging(wo)
    return total


def remove_staging(wo: WriteOptions) -> None:
    shutil.rmtree(wo.staging, ignore_errors=True)
    try:
        os.rmdir(os.path.dirname(wo.staging))     # the shared parent, once empty
    except OSError:
        pass


class KStoreBatchWriter(DataSourceArrowWriter):
    """df.write.format("kstore").mode("append"): tasks stage, the driver's commit appends."""

    def __init__(self, wo: WriteOptions):
        self.wo = wo
        check_writer_fs(wo.paths)       # planned on the driver: refuse an unsafe filesystem
        self.store = identify(wo.paths, make_dirs=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
        check(self.store)               # never stage on a disk that is not the store
        return stage_batches(self.wo, iterator)

    def commit(self, messages: list[Optional[WriterCommitMessage]]) -> None:
        commit_staged(self.wo, messages)

    def abort(self, messages: list[Optional[WriterCommitMessage]]) -> None:
        remove_staging(self.wo)


class KStoreStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: each micro-batch stages and commits like a batch write (at least once,
    as Kafka's sink: a micro-batch replayed after a failure is appended again)."""

    def __init__(self, wo: WriteOptions):
        self.wo = wo
        check_writer_fs(wo.paths)
        self.store = identify(wo.paths, make_dirs=True)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
        check(self.store)
        return stage_batches(self.wo, iterator)

    def commit(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        # micro-batches run one at a time: every file under the staging dir is this batch's
        commit_staged(self.wo, messages)

    def abort(self, messages: list[Optional[WriterCommitMessage]], batchId: int) -> None:
        remove_staging(self.wo)
