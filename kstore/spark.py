"""kstore as a PySpark data source, format ``kstore``: batch and streaming reads with the schema
and options of Spark's Kafka source, and batch and streaming writes with its sink's columns.

    from kstore.spark import register
    register(spark)
    df = spark.read.format("kstore").option("subscribe", "clicks").load("/data/kstore")
    df.write.format("kstore").mode("append").option("topic", "out").save("/data/kstore")

Reads plan one task per partition (or per offset range, with minPartitions /
maxRecordsPerPartition); each task opens the store read-only and yields Arrow batches decoded by
the core, so reading works beside an application that holds the store and appends. Writes
stage encoded batches per task under ``<first log dir>/.kstore-staging/``; the driver's commit
appends them (as a broker assigns offsets to a produce request), so a failed or retried task
leaves nothing behind. The commit opens the store as its writer: it fails with
LogDirLockedError while another process holds it.

Needs PySpark >= 4.2 and pyarrow: ``pip install 'kstore[spark]'``.
"""
from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, Sequence

try:
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyspark.sql.datasource import (DataSource, DataSourceArrowWriter, DataSourceReader,
                                        DataSourceStreamReader, InputPartition,
                                        WriterCommitMessage)
    from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual,
                                        In, LessThan, LessThanOrEqual, StringStartsWith)
    from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                                  SupportsTriggerAvailableNow)
    from pyspark.sql.datasource import DataSourceStreamArrowWriter
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("kstore.spark needs PySpark >= 4.2 and pyarrow: "
                      "pip install 'kstore[spark]'") from e

import numpy as np

from kstore import _core
from kstore.arrow import column_input, iter_batches, kafka_schema, key_hashes, split_rows
from kstore.broker_config import BrokerConfig
from kstore.config import LogConfig
from kstore.errors import (DataLossError, InvalidConfigError, InvalidRecordError,
                           OffsetOutOfRangeError, RecordTooLargeError, UnknownTopicError)
from kstore.fileio import get_file_ops
from kstore.reader import StoreReader, split_log_dirs

log = logging.getLogger("kstore.spark")

FORMAT = "kstore"
STAGING_DIR = ".kstore-staging"
#: Target size of one staged record batch (the broker-side batch a Spark row group becomes).
STAGED_BATCH_BYTES = 1 << 20

SCHEMA_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
              "timestamp TIMESTAMP, timestampType INT")
HEADERS_DDL = ", headers ARRAY<STRUCT<key: STRING, value: BINARY>>"

TopicPartition = tuple[str, int]


def register(spark) -> None:
    """Register the ``kstore`` format with a SparkSession and turn on Python filter pushdown
    (``spark.sql.python.filterPushdown.enabled``), which the reader implements: Spark refuses to
    plan a Python reader with pushFilters while that setting is off. Sessions that must keep it
    off can read with the option ``pushFilters=false``."""
    spark.dataSource.register(KStoreDataSource)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


# -- options ------------------------------------------------------------------------------------
def _bool(opts, key: str, default: bool) -> bool:
    v = opts.get(key)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "false"):
        return s == "true"
    raise InvalidConfigError(f"option '{key}' must be true or false, got {v!r}")


def _int(opts, key: str, minimum: int = 1) -> Optional[int]:
    v = opts.get(key)
    if v is None:
        return None
    try:
        n = int(str(v).strip())
    except ValueError:
        raise InvalidConfigError(f"option '{key}' must be an integer, got {v!r}") from None
    if n < minimum:
        raise InvalidConfigError(f"option '{key}' must be at least {minimum}, got {n}")
    return n


def _json(opts, key: str) -> dict:
    try:
        data = json.loads(opts[key])
    except ValueError as e:
        raise InvalidConfigError(f"option '{key}' is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidConfigError(f"option '{key}' must be a JSON object, got {opts[key]!r}")
    return data


def _partition_map(opts, key: str) -> dict[TopicPartition, int]:
    """{"topic": {"0": n, ...}} -> {(topic, 0): n}."""
    out = {}
    for topic, parts in _json(opts, key).items():
        if not isinstance(parts, dict):
            raise InvalidConfigError(f"option '{key}': expected {{\"{topic}\": {{\"0\": ...}}}}")
        for p, v in parts.items():
            try:
                out[(topic, int(p))] = int(v)
            except (TypeError, ValueError):
                raise InvalidConfigError(f"option '{key}': bad entry {topic}/{p}: {v!r}") from None
    return out


@dataclass
class OffsetSpec:
    """Where a range starts or ends: kind is 'earliest', 'latest', 'offsets' ({tp: offset,
    -2 earliest, -1 latest}), 'timestamp' (one ms timestamp for all) or 'timestamps' ({tp: ms})."""
    kind: str
    offsets: dict = field(default_factory=dict)
    timestamp: int = 0


def _offset_spec(opts, prefix: str, default: str, is_end: bool) -> OffsetSpec:
    ts_key, by_ts_key, off_key = f"{prefix}timestamp", f"{prefix}offsetsbytimestamp", f"{prefix}offsets"
    if opts.get(ts_key) is not None:         # precedence: timestamp > by-timestamp > offsets
        return OffsetSpec("timestamp", timestamp=_int(opts, ts_key, 0))
    if opts.get(by_ts_key) is not None:
        return OffsetSpec("timestamps", offsets=_partition_map(opts, by_ts_key))
    raw = str(opts.get(off_key, default)).strip()
    if raw.lower() in ("earliest", "latest"):
        if is_end and raw.lower() == "earliest":
            raise InvalidConfigError(f"option '{prefix}Offsets' cannot be 'earliest'")
        return OffsetSpec(raw.lower())
    offs = _partition_map(opts, off_key)
    for tp, v in offs.items():
        if v < -2 or (is_end and v == -2):
            raise InvalidConfigError(f"option '{prefix}Offsets': invalid offset {v} for {tp[0]}-{tp[1]}"
                                     + (" (-2, earliest, is not allowed for an ending offset)" if v == -2 else ""))
    return OffsetSpec("offsets", offsets=offs)


@dataclass
class ReadOptions:
    """The source options of one query, parsed and checked once on the driver (picklable)."""
    paths: list
    assign: Optional[list] = None            # [(topic, partition)]
    subscribe: Optional[list] = None         # [topic]
    pattern: Optional[str] = None
    starting: OffsetSpec = field(default_factory=lambda: OffsetSpec("earliest"))
    ending: OffsetSpec = field(default_factory=lambda: OffsetSpec("latest"))
    timestamp_strategy: str = "error"
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: Optional[int] = None
    max_records_per_partition: Optional[int] = None
    max_offsets_per_trigger: Optional[int] = None
    push_filters: bool = True

    @classmethod
    def parse(cls, opts, streaming: bool) -> "ReadOptions":
        opts = {str(k).lower(): v for k, v in dict(opts).items()}
        if not opts.get("path"):
            raise InvalidConfigError("kstore source: give the log dirs with .load(path) or the "
                                     "'path' option (comma-separated)")
        o = cls(paths=split_log_dirs(opts["path"]))
        chosen = [k for k in ("assign", "subscribe", "subscribepattern") if opts.get(k)]
        if len(chosen) != 1:
            raise InvalidConfigError(
                "kstore source: exactly one of the options 'assign', 'subscribe' or "
                f"'subscribePattern' must be given (got {chosen or 'none'})")
        if "assign" in chosen:
            data = _json(opts, "assign")
            try:
                o.assign = sorted({(t, int(p)) for t, ps in data.items() for p in ps})
            except (TypeError, ValueError):
                raise InvalidConfigError(f"option 'assign' must look like {{\"t\": [0, 1]}}, "
                                         f"got {opts['assign']!r}") from None
        elif "subscribe" in chosen:
            o.subscribe = sorted({t.strip() for t in opts["subscribe"].split(",") if t.strip()})
            if not o.subscribe:
                raise InvalidConfigError("option 'subscribe' names no topic")
        else:
            o.pattern = opts["subscribepattern"]
            try:
                re.compile(o.pattern)
            except re.error as e:
                raise InvalidConfigError(f"option 'subscribePattern' is not a valid regex: {e}") from None
        o.starting = _offset_spec(opts, "starting", "latest" if streaming else "earliest", False)
        if streaming:
            for k in ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp"):
                if opts.get(k) is not None:
                    raise InvalidConfigError(f"option '{k}' is for batch queries only")
        else:
            if o.starting.kind == "latest" or (o.starting.kind == "offsets" and
                                               -1 in o.starting.offsets.values()):
                raise InvalidConfigError("option 'startingOffsets': latest (-1) is not allowed "
                                         "for batch queries")
            o.ending = _offset_spec(opts, "ending", "latest", True)
        strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).lower()
        if strategy not in ("error", "latest"):
            raise InvalidConfigError("option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest'")
        o.timestamp_strategy = strategy
        o.fail_on_data_loss = _bool(opts, "failondataloss", True)
        o.include_headers = _bool(opts, "includeheaders", False)
        o.min_partitions = _int(opts, "minpartitions")
        o.max_records_per_partition = _int(opts, "maxrecordsperpartition")
        o.max_offsets_per_trigger = _int(opts, "maxoffsetspertrigger")
        o.push_filters = _bool(opts, "pushfilters", True)
        return o

    def topic_partitions(self, store: StoreReader) -> list[TopicPartition]:
        """The partitions this query reads, as the store has them now."""
        if self.assign is not None:
            missing = [tp for tp in self.assign if tp not in set(store.partitions())]
            if missing:
                raise UnknownTopicError(f"assigned partitions do not exist in {store.log_dirs}: "
                                        + ", ".join(f"{t}-{p}" for t, p in missing))
            return list(self.assign)
        if self.subscribe is not None:
            return [tp for tp in store.partitions() if tp[0] in self.subscribe]
        rx = re.compile(self.pattern)
        return [tp for tp in store.partitions() if rx.fullmatch(tp[0])]


def _data_loss(opts: ReadOptions, msg: str) -> None:
    if opts.fail_on_data_loss:
        raise DataLossError(msg + ". Some data may have been lost: retention deleted it or the "
                            "partition was recreated. If you want the query to go on, set the "
                            "option 'failOnDataLoss' to false.")
    log.warning("%s; skipping what is gone (failOnDataLoss=false)", msg)


def _resolve(store: StoreReader, tp: TopicPartition, spec: OffsetSpec, is_end: bool,
             strategy: str) -> int:
    """The offset a spec names for one partition (timestamps through the time index)."""
    start, end = store.offsets(*tp)
    kind = spec.kind
    if kind == "earliest":
        return start
    if kind == "latest":
        return end
    if kind == "offsets":
        if tp not in spec.offsets:
            return start if not is_end else end
        v = spec.offsets[tp]
        return start if v == -2 else end if v == -1 else v
    ts = spec.timestamp if kind == "timestamp" else spec.offsets.get(tp)
    if ts is None:
        return start if not is_end else end
    off = store.log(*tp).offset_for_timestamp(ts)
    if off is not None:
        return off
    if is_end or strategy == "latest":
        return end
    raise OffsetOutOfRangeError(
        f"no record of {tp[0]}-{tp[1]} has a timestamp >= {ts} (set "
        f"startingOffsetsByTimestampStrategy=latest to start at the end instead)")


# -- filter pushdown ------------------------------------------------------------------------------
def _to_ms(v: Any) -> Optional[int]:
    """A filter's timestamp literal as epoch milliseconds, rounded down (None if not a time)."""
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=_dt.timezone.utc)
        us = (v - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)) // _dt.timedelta(microseconds=1)
        return us // 1000
    return None


@dataclass
class Pruning:
    """What pushed filters allow: topics/partitions to keep, an offset range, and a lower bound
    on timestamps (resolved through the time index)."""
    topics: Optional[set] = None
    topic_prefixes: Optional[list] = None
    partitions: Optional[set] = None
    partition_lo: int = 0
    partition_hi: int = 1 << 31
    offset_lo: int = 0
    offset_hi: int = 1 << 62
    ts_lo: Optional[int] = None

    def keeps(self, tp: TopicPartition) -> bool:
        t, p = tp
        if self.topics is not None and t not in self.topics:
            return False
        if self.topic_prefixes and not all(t.startswith(x) for x in self.topic_prefixes):
            return False
        if self.partitions is not None and p not in self.partitions:
            return False
        return self.partition_lo <= p < self.partition_hi

    def push(self, f) -> bool:
        """Narrow by one filter; True when it is fully handled (Spark need not re-check it)."""
        col = f.attribute[0] if len(f.attribute) == 1 else None
        eq = isinstance(f, (EqualTo, EqualNullSafe))
        if col == "topic":
            if eq and isinstance(f.value, str):
                self.topics = {f.value} if self.topics is None else self.topics & {f.value}
                return True
            if isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                vals = set(f.value)
                self.topics = vals if self.topics is None else self.topics & vals
                return True
            if isinstance(f, StringStartsWith):
                self.topic_prefixes = (self.topic_prefixes or []) + [f.value]
                return True
            return False
        if col in ("partition", "offset"):
            vals = f.value if isinstance(f, In) else (f.value,) if hasattr(f, "value") else ()
            if not vals or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
                return False
            lo, hi = (self.partition_lo, self.partition_hi) if col == "partition" else \
                (self.offset_lo, self.offset_hi)
            exact = True
            if eq:
                lo, hi = max(lo, f.value), min(hi, f.value + 1)
            elif isinstance(f, GreaterThan):
                lo = max(lo, f.value + 1)
            elif isinstance(f, GreaterThanOrEqual):
                lo = max(lo, f.value)
            elif isinstance(f, LessThan):
                hi = min(hi, f.value)
            elif isinstance(f, LessThanOrEqual):
                hi = min(hi, f.value + 1)
            elif isinstance(f, In):
                if col == "partition":
                    self.partitions = set(vals) if self.partitions is None else self.partitions & set(vals)
                    return True
                lo, hi = max(lo, min(vals)), min(hi, max(vals) + 1)
                exact = False
            else:
                return False
            if col == "partition":
                self.partition_lo, self.partition_hi = lo, hi
            else:
                self.offset_lo, self.offset_hi = lo, hi
            return exact
        if col == "timestamp":
            # only a lower bound prunes: CreateTime timestamps need not grow with offsets, but the
            # first offset with timestamp >= T bounds every match from below. Spark re-checks.
            if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo, EqualNullSafe)):
                ms = _to_ms(f.value)
                if ms is not None:
                    self.ts_lo = ms if self.ts_lo is None else max(self.ts_lo, ms)
            return False
        return False


# -- reading --------------------------------------------------------------------------------------
class KStoreRange(InputPartition):
    """One task: the records of topic-partition with start <= offset < end."""

    def __init__(self, topic: str, partition: int, start: int, end: int):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end

    def __repr__(self) -> str:
        return f"KStoreRange({self.topic}-{self.partition} [{self.start}, {self.end}))"

    def __eq__(self, other) -> bool:
        return isinstance(other, KStoreRange) and self.value == other.value


def split_ranges(ranges: list[KStoreRange], min_partitions: Optional[int],
                 max_records: Optional[int]) -> list[KStoreRange]:
    """Spark's KafkaOffsetRangeCalculator: cut ranges to at most max_records offsets, then, if
    there are fewer than min_partitions, split the big ones in proportion to their size."""
    out = []
    for r in ranges:
        n = r.end - r.start
        parts = max(1, math.ceil(n / max_records)) if max_records and n > 0 else 1
        out += _cut(r, parts)
    if min_partitions and len(out) < min_partitions:
        total = sum(r.end - r.start for r in out)
        if total > 0:
            res = []
            for r in out:
                size = r.end - r.start
                parts = max(1, math.floor(size / total * min_partitions + 0.5)) if size else 1
                res += _cut(r, parts)
            out = res
    return out


def _cut(r: KStoreRange, parts: int) -> list[KStoreRange]:
    n = r.end - r.start
    if parts <= 1 or n <= 1:
        return [r]
    parts = min(parts, n)
    bounds = [r.start + (n * i) // parts for i in range(parts + 1)]
    return [KStoreRange(r.topic, r.partition, bounds[i], bounds[i + 1]) for i in range(parts)]


def read_range(opts: ReadOptions, part: KStoreRange, schema: Optional[pa.Schema] = None
               ) -> Iterator[pa.RecordBatch]:
    """A task's work: open the store read-only and yield the range as Arrow batches."""
    if not isinstance(part, KStoreRange):
        return          # Spark plans one empty InputPartition(None) when there is nothing to read
    with StoreReader(opts.paths) as store:
        try:
            lg = store.log(part.topic, part.partition)
        except UnknownTopicError:
            _data_loss(opts, f"partition {part.topic}-{part.partition} no longer exists")
            return
        start = part.start
        if start < lg.log_start_offset:
            _data_loss(opts, f"offsets {start}..{lg.log_start_offset - 1} of "
                             f"{part.topic}-{part.partition} are gone")
            start = lg.log_start_offset
        if start > lg.log_end_offset:
            _data_loss(opts, f"offset {start} of {part.topic}-{part.partition} is past its end "
                             f"{lg.log_end_offset}")
            return
        try:
            yield from iter_batches(lg, part.topic, part.partition, start, part.end,
                                    include_headers=opts.include_headers, schema=schema)
        except OffsetOutOfRangeError as e:
            _data_loss(opts, str(e))


class KStoreBatchReader(DataSourceReader):
    """Batch read: one task per partition or offset range."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.pruning = Pruning()

    def plan(self) -> list[KStoreRange]:
        o, pr = self.opts, self.pruning
        ranges = []
        with StoreReader(o.paths) as store:
            tps = o.topic_partitions(store)
            for name, spec in (("startingOffsets", o.starting), ("endingOffsets", o.ending)):
                if spec.kind == "offsets" and spec.offsets:
                    missing = [tp for tp in tps if tp not in spec.offsets]
                    if missing:
                        raise InvalidConfigError(
                            f"{name} gives specific offsets, so it must name every "
                            "TopicPartition (-2 for earliest, -1 for latest); missing: "
                            + ", ".join(f"{t}-{p}" for t, p in missing))
            for tp in tps:
                if not pr.keeps(tp):
                    continue
                log_start, log_end = store.offsets(*tp)
                start = _resolve(store, tp, o.starting, False, o.timestamp_strategy)
                end = _resolve(store, tp, o.ending, True, o.timestamp_strategy)
                if start < log_start:
                    _data_loss(o, f"starting offset {start} of {tp[0]}-{tp[1]} is below its log "
                                  f"start offset {log_start}")
                    start = log_start
                if start > log_end:
                    _data_loss(o, f"starting offset {start} of {tp[0]}-{tp[1]} is past its log "
                                  f"end offset {log_end}")
                    start = log_end
                if end > log_end:
                    end = log_end
                if pr.ts_lo is not None and start < end:
                    off = store.log(*tp).offset_for_timestamp(pr.ts_lo)
                    start = max(start, end if off is None else off)
                start, end = max(start, pr.offset_lo), min(end, pr.offset_hi)
                if start < end:
                    ranges.append(KStoreRange(tp[0], tp[1], start, end))
        return split_ranges(ranges, o.min_partitions, o.max_records_per_partition)

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan()

    def read(self, partition: KStoreRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts, partition, kafka_schema(self.opts.include_headers))


class KStorePushdownReader(KStoreBatchReader):
    """KStoreBatchReader with filter pushdown on topic, partition, offset and timestamp."""

    def pushFilters(self, filters):
        for f in filters:
            if not self.pruning.push(f):
                yield f


class KStoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming read. Offsets are {"topic": {"partition": next_offset}}, as Kafka's source
    keeps them; partitions that appear later start at their earliest offset."""

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self._store: Optional[StoreReader] = None
        self._target: Optional[dict] = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_store"] = None          # mappings and descriptors do not travel
        return state

    def _fresh_store(self) -> StoreReader:
        if self._store is None:
            self._store = StoreReader(self.opts.paths)
        else:
            self._store.refresh()
        return self._store

    @staticmethod
    def _to_json(offsets: dict[TopicPartition, int]) -> dict:
        out: dict = {}
        for (t, p) in sorted(offsets):
            out.setdefault(t, {})[str(p)] = offsets[(t, p)]
        return out

    @staticmethod
    def _from_json(data: dict) -> dict[TopicPartition, int]:
        return {(t, int(p)): int(v) for t, parts in (data or {}).items() for p, v in parts.items()}

    def _latest(self) -> dict[TopicPartition, int]:
        store = self._fresh_store()
        return {tp: store.offsets(*tp)[1] for tp in self.opts.topic_partitions(store)}

    def initialOffset(self) -> dict:
        store = self._fresh_store()
        o = self.opts
        return self._to_json({tp: _resolve(store, tp, o.starting, False, o.timestamp_strategy)
                              for tp in o.topic_partitions(store)})

    def getDefaultReadLimit(self) -> ReadLimit:
        m = self.opts.max_offsets_per_trigger
        return ReadMaxRows(m) if m else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._to_json(self._latest())

    def reportLatestOffset(self) -> Optional[dict]:
        return self._to_json(self._latest())

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._from_json(start)
        latest = self._latest()
        if self._target is not None:
            target = self._from_json(self._target)
            latest = {tp: min(v, target[tp]) for tp, v in latest.items() if tp in target}
        store = self._store
        for tp in latest:
            if tp not in begin:
                begin[tp] = store.offsets(*tp, refresh=False)[0]    # new partition: earliest
        ends = dict(latest)
        if isinstance(limit, ReadMaxRows):
            sizes = {tp: max(0, latest[tp] - begin[tp]) for tp in latest}
            total = sum(sizes.values())
            if total > limit.max_rows:
                for tp, size in sizes.items():
                    prorate = limit.max_rows * (size / total)
                    take = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
                    ends[tp] = min(latest[tp], begin[tp] + take)
        return self._to_json(ends)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = self._from_json(start), self._from_json(end)
        store = self._fresh_store()
        ranges = []
        for tp, e in stop.items():
            try:
                log_start, log_end = store.offsets(*tp)
            except UnknownTopicError:
                _data_loss(self.opts, f"partition {tp[0]}-{tp[1]} no longer exists")
                continue
            s = begin.get(tp, log_start)
            if s < log_start:
                _data_loss(self.opts, f"offsets {s}..{log_start - 1} of {tp[0]}-{tp[1]} were "
                                      f"deleted before they were read")
                s = log_start
            if e < s:
                _data_loss(self.opts, f"{tp[0]}-{tp[1]}: end offset {e} is below start {s} "
                                      f"(the partition was recreated?)")
                continue
            if s < e:
                ranges.append(KStoreRange(tp[0], tp[1], s, e))
        return split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)

    def read(self, partition: KStoreRange) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts, partition, kafka_schema(self.opts.include_headers))

    def commit(self, end: dict) -> None:
        """Nothing to do: like Spark's Kafka source, offsets live in the query's checkpoint."""

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None


# -- writing --------------------------------------------------------------------------------------
@dataclass
class TopicPlan:
    """What a write task needs to know of a topic: its partition count and how to encode."""
    partitions: int
    codec: int
    log_append_time: bool
    require_key: bool
    max_message_bytes: int
    ts_before_ms: int
    ts_after_ms: int
    exists: bool
    magic: int = 2
    level: Optional[int] = None


@dataclass
class StagedFile:
    topic: str
    partition: int
    path: str
    records: int


@dataclass
class KStoreCommitMessage(WriterCommitMessage):
    staged: list


@dataclass
class WriteOptions:
    paths: list
    topic: Optional[str]
    broker: dict
    staging: str
    plans: dict                 # topic -> TopicPlan (topics known when the write was planned)
    default_plan: TopicPlan     # for topics that appear only in the data (auto-created)
    auto_create: bool

    @classmethod
    def parse(cls, opts, schema) -> "WriteOptions":
        opts = {str(k).lower(): v for k, v in dict(opts).items()}
        if not opts.get("path"):
            raise InvalidConfigError("kstore sink: give the log dirs with .save(path) or the "
                                     "'path' option (comma-separated)")
        paths = split_log_dirs(opts["path"])
        names = {f.name for f in schema.fields}
        if "value" not in names:
            raise InvalidConfigError("kstore sink: the data needs a 'value' column (binary or string)")
        topic = opts.get("topic")
        if topic is None and "topic" not in names:
            raise InvalidConfigError("kstore sink: no topic: set the 'topic' option or give the "
                                     "data a 'topic' column")
        unknown = names - {"key", "value", "topic", "partition", "headers", "timestamp"}
        if unknown:
            raise InvalidConfigError(f"kstore sink: unexpected column(s) {sorted(unknown)}; it takes "
                                     "key, value, topic, partition, headers and timestamp")
        broker = {k[len("kstore."):]: v for k, v in opts.items() if k.startswith("kstore.")}
        bc = BrokerConfig(broker)
        from kstore.topics import read_topic_config_file
        overrides = (read_topic_config_file(paths) or {}).get("topics", {})
        counts: dict[str, int] = {}
        if all(os.path.isdir(p) for p in paths):
            with StoreReader(paths) as store:
                for t, _p in store.partitions():
                    counts[t] = counts.get(t, 0) + 1

        def plan(cfg: LogConfig, n: int, exists: bool) -> TopicPlan:
            return TopicPlan(n, cfg.codec, cfg.log_append_time, cfg.compact, cfg.max_message_bytes,
                             cfg.timestamp_before_max_ms, cfg.timestamp_after_max_ms, exists,
                             cfg.magic, cfg.compression_level)

        plans = {t: plan(bc.log_config(overrides.get(t)), n, True) for t, n in counts.items()}
        auto = bc["auto.create.topics.enable"]
        if topic is not None and topic not in plans and not auto:
            raise UnknownTopicError(f"topic {topic!r} does not exist in {paths} and "
                                    "auto.create.topics.enable is false")
        return cls(paths, topic, broker, os.path.join(paths[0], STAGING_DIR, uuid.uuid4().hex),
                   plans, plan(bc.log_config(None), bc["num.partitions"], False), auto)


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
        self.files: dict[TopicPartition, list] = {}     # tp -> [fd, path, records, position]
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
                                now - min(plan.ts_before_ms, 1 << 62),
                                now + min(plan.ts_after_ms, 1 << 62), plan.require_key, plan.codec)
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
            f = self.files[(topic, partition)] = [fd, path, 0, 0]
        self.io.pwrite(f[0], data, f[3])
        f[2] += records
        f[3] += len(data)

    def finish(self) -> KStoreCommitMessage:
        staged = []
        for (topic, partition), (fd, path, records, _size) in self.files.items():
            self.io.close(fd)
            staged.append(StagedFile(topic, partition, path, records))
        self.files.clear()
        return KStoreCommitMessage(staged)

    def discard(self) -> None:
        for fd, path, _r, _s in self.files.values():
            try:
                self.io.close(fd)
                self.io.unlink(path)
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


def commit_staged(wo: WriteOptions, messages: Sequence[Optional[KStoreCommitMessage]]) -> int:
    """The driver's commit: append every staged file, in task order, as the store's writer;
    create topics the data names that do not exist yet. Returns the records appended."""
    from kstore.manager import LogManager
    io = get_file_ops()
    total = 0
    try:
        with LogManager(wo.paths, wo.broker) as mgr:
            known = set(mgr.topics())
            for msg in messages:
                if msg is None:
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

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
        return stage_batches(self.wo, iterator)

    def commit(self, messages) -> None:
        commit_staged(self.wo, messages)

    def abort(self, messages) -> None:
        remove_staging(self.wo)


class KStoreStreamWriter(DataSourceStreamArrowWriter):
    """Streaming sink: each micro-batch stages and commits like a batch write (at least once,
    as Kafka's sink: a micro-batch replayed after a failure is appended again)."""

    def __init__(self, wo: WriteOptions):
        self.wo = wo

    def write(self, iterator: Iterator[pa.RecordBatch]) -> KStoreCommitMessage:
        return stage_batches(self.wo, iterator)

    def commit(self, messages, batchId: int) -> None:
        # micro-batches run one at a time: every file under the staging dir is this batch's
        commit_staged(self.wo, messages)

    def abort(self, messages, batchId: int) -> None:
        remove_staging(self.wo)


# -- the data source ------------------------------------------------------------------------------
class KStoreDataSource(DataSource):
    """The ``kstore`` format. Options: see the module docstring and README's Spark section."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _headers(self) -> bool:
        return _bool({k.lower(): v for k, v in self.options.items()}, "includeheaders", False)

    def schema(self) -> str:
        return SCHEMA_DDL + (HEADERS_DDL if self._headers() else "")

    def _check_schema(self, schema) -> None:
        want = kafka_schema(self._headers()).names
        if schema is not None and [f.name for f in schema.fields] != want:
            raise InvalidConfigError("the kstore source has a fixed schema (Spark's Kafka source "
                                     f"schema: {', '.join(want)}); it cannot be set with .schema()")

    def reader(self, schema) -> DataSourceReader:
        self._check_schema(schema)
        opts = ReadOptions.parse(self.options, streaming=False)
        return KStorePushdownReader(opts) if opts.push_filters else KStoreBatchReader(opts)

    def streamReader(self, schema) -> DataSourceStreamReader:
        self._check_schema(schema)
        return KStoreStreamReader(ReadOptions.parse(self.options, streaming=True))

    def writer(self, schema, overwrite: bool) -> KStoreBatchWriter:
        if overwrite:
            raise InvalidConfigError("the kstore sink only appends: use .mode('append')")
        return KStoreBatchWriter(WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema, overwrite: bool) -> KStoreStreamWriter:
        return KStoreStreamWriter(WriteOptions.parse(self.options, schema))
