"""Reading a store from Spark: offsets resolved per partition (timestamps through the time
index), ranges planned and split into tasks, each task decoding its range into Arrow batches;
the batch readers and the stream reader (Kafka-source offsets, rate limits)."""
from __future__ import annotations

import logging
import math
import time
from typing import Callable, Iterable, Iterator, Optional, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (DataSourceReader, DataSourceStreamReader, Filter,
                                    InputPartition)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from kstore import notify
from kstore.arrow import iter_batches, kafka_schema
from kstore.errors import (DataLossError, InvalidConfigError, OffsetOutOfRangeError,
                           SegmentGoneError, UnknownTopicError)
from kstore.reader import StoreReader
from kstore.spark.options import OffsetKind, OffsetSpec, ReadOptions, TopicPartition
from kstore.spark.deploy import StoreIdentity, check, check_end, identify
from kstore.spark import task_cache
from kstore.spark.pushdown import Pruning
from kstore.spark.stream_cuts import StreamCuts

log = logging.getLogger("kstore.spark")


def _data_loss(opts: ReadOptions, msg: str, then: str = "skipping what is gone") -> None:
    if opts.fail_on_data_loss:
        raise DataLossError(msg + ". Some data may have been lost: retention deleted it, or the "
                            "partition was truncated or recreated. If you want the query to go "
                            "on, set the option 'failOnDataLoss' to false.")
    log.warning("%s; %s (failOnDataLoss=false)", msg, then)


def _resolve(store: StoreReader, tp: TopicPartition, spec: OffsetSpec, is_end: bool,
             strategy: str) -> int:
    """The offset a spec names for one partition (timestamps through the time index)."""
    start, end = store.offsets(*tp)
    kind = spec.kind
    if kind is OffsetKind.EARLIEST:
        return start
    if kind is OffsetKind.LATEST:
        return end
    if kind is OffsetKind.OFFSETS:
        if tp not in spec.offsets:
            return start if not is_end else end
        v = spec.offsets[tp]
        return start if v == -2 else end if v == -1 else v
    ts = spec.timestamp if kind is OffsetKind.TIMESTAMP else spec.offsets.get(tp)
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



def check_named_partitions(spec: OffsetSpec, side: str, tps: Sequence[TopicPartition]) -> None:
    """Spark's Kafka source rule, the same for batch and streaming queries: offsets (or
    timestamps) given per partition must name exactly the partitions the query reads
    (KafkaOffsetReader's "If startingOffsets contains specific offsets, you must specify all
    TopicPartitions"); -2 and -1 say earliest and latest for a partition one does not care about."""
    if spec.kind is OffsetKind.OFFSETS:
        name = f"{side}Offsets"
    elif spec.kind is OffsetKind.TIMESTAMPS:
        name = f"{side}OffsetsByTimestamp"
    else:
        return
    missing = sorted(set(tps) - set(spec.offsets))
    extra = sorted(set(spec.offsets) - set(tps))
    if missing or extra:
        raise InvalidConfigError(
            f"{name} gives specific partitions, so it must name every TopicPartition the query "
            "reads and no other"
            + (" (-2 for earliest, -1 for latest)" if spec.kind is OffsetKind.OFFSETS else "")
            + "".join(f"; {what}: " + ", ".join(f"{t}-{p}" for t, p in tps_)
                      for what, tps_ in (("missing", missing), ("not read by the query", extra))
                      if tps_))


class KStoreRange(InputPartition):
    """One task: the records of topic-partition with start <= offset < end."""

    def __init__(self, topic: str, partition: int, start: int, end: int,
                 store: Optional[StoreIdentity] = None):
        super().__init__((topic, partition, start, end))
        self.topic, self.partition, self.start, self.end = topic, partition, start, end
        self.store = store      # the driver's store identity, checked by the task (deploy.py)

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
    return [KStoreRange(r.topic, r.partition, bounds[i], bounds[i + 1], r.store)
            for i in range(parts)]


def read_range(opts: ReadOptions, part: InputPartition, schema: Optional[pa.Schema] = None
               ) -> Iterator[pa.RecordBatch]:
    """A task's work: yield the range as Arrow batches, through this worker's read-only reader
    of the store and decode buffers (task_cache: refreshed, as a fresh open would see it)."""
    if not isinstance(part, KStoreRange):
        return          # Spark plans one empty InputPartition(None) when there is nothing to read
    if part.store is not None:      # a host that cannot see the store fails, naming itself
        check(part.store, f"{part.topic}-{part.partition}")
    with task_cache.store(opts.paths) as entry:     # this worker's reader and buffers, refreshed
        try:
            lg = entry.partition_log(part.topic, part.partition)
        except UnknownTopicError:
            _data_loss(opts, f"partition {part.topic}-{part.partition} no longer exists")
            return
        start = part.start
        if part.store is not None:      # fewer offsets here than the driver saw: not silently
            check_end(part.store, f"{part.topic}-{part.partition}", lg.log_end_offset, part.end)
        if start < lg.log_start_offset:
            _data_loss(opts, f"offsets {start}..{lg.log_start_offset - 1} of "
                             f"{part.topic}-{part.partition} are gone")
            start = lg.log_start_offset
        if start > lg.log_end_offset:
            _data_loss(opts, f"offset {start} of {part.topic}-{part.partition} is past its end "
                             f"{lg.log_end_offset}")
            return
        while True:
            try:
                yield from iter_batches(lg, part.topic, part.partition, start, part.end,
                                        include_headers=opts.include_headers, schema=schema,
                                        pool=entry.pool)
                return
            except UnknownTopicError:
                # the topic was deleted under the read (its segments not yet mapped are gone):
                # what was yielded is the old topic's; the rest is lost, as at the open above
                _data_loss(opts, f"partition {part.topic}-{part.partition} no longer exists")
                return
            except OffsetOutOfRangeError as e:
                # retention removed offsets under the read: everything yielded lies below the
                # offset that failed, which lies below the new log start; go on from there
                _data_loss(opts, str(e))
                if lg.log_start_offset <= start or lg.log_start_offset >= part.end:
                    return      # not a removal at the head (a truncation past the end, say)
                start = lg.log_start_offset


class KStoreBatchReader(DataSourceReader):
    """Batch read: one task per partition or offset range."""

    def __init__(self, opts: ReadOptions, schema: Optional[pa.Schema] = None):
        self.opts = opts
        self.pruning = Pruning()
        #: what read() yields: the fixed schema or the subset a user schema named (only its
        #: columns are decoded; without key, value, timestamp and headers, only batch headers)
        self.schema = schema if schema is not None else kafka_schema(opts.include_headers)

    def plan(self) -> list[KStoreRange]:
        o, pr = self.opts, self.pruning
        ranges = []
        ident = identify(o.paths)
        with task_cache.store(o.paths) as entry:      # a reused planning worker's reader
            tps = o.topic_partitions(entry.reader)
            for tp in tps:
                entry.partition_log(*tp)        # a partition created again: a fresh reader
            store = entry.reader
            check_named_partitions(o.starting, "starting", tps)
            check_named_partitions(o.ending, "ending", tps)
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
                    ranges.append(KStoreRange(tp[0], tp[1], start, end, ident))
        return split_ranges(ranges, o.min_partitions, o.max_records_per_partition)

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts, partition, self.schema)


class KStorePushdownReader(KStoreBatchReader):
    """KStoreBatchReader with filter pushdown on topic, partition, offset and timestamp."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if not self.pruning.push(f):
                yield f


def rate_limit(begin: dict[TopicPartition, int], latest: dict[TopicPartition, int],
               max_rows: int) -> dict[TopicPartition, int]:
    """Spark's KafkaMicroBatchStream.rateLimit: at most max_rows new offsets in all, shared out
    in proportion to each partition's backlog; a partition owed less than one still gets one."""
    sizes = {tp: max(0, latest[tp] - begin[tp]) for tp in latest}
    total = sum(sizes.values())
    if total <= max_rows:
        return dict(latest)
    ends = {}
    for tp, size in sizes.items():
        prorate = max_rows * (size / total)
        take = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        ends[tp] = min(latest[tp], begin[tp] + take)
    return ends


class KStoreStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Streaming read. Offsets are {"topic": {"partition": next_offset}}, as Kafka's source
    keeps them; partitions that appear later start at their earliest offset."""

    def __init__(self, opts: ReadOptions, schema: Optional[pa.Schema] = None):
        self.opts = opts
        #: what read() yields, as in KStoreBatchReader: the fixed schema or a user schema's
        #: subset of it (only its columns decoded; offsets-only from batch headers)
        self.schema = schema if schema is not None else kafka_schema(opts.include_headers)
        self._store: Optional[StoreReader] = None
        self._target: Optional[dict] = None
        # minOffsetsPerTrigger: when the last batch was let through (clock() seconds), None
        # before the first trigger, which, as in Spark's Kafka source, is never delayed
        self._last_trigger: Optional[float] = None
        self.clock: Callable[[], float] = time.monotonic     # tests substitute a fake clock
        #: where each partition's last batch read up to, its next start checked against a
        #: truncation below it (KIP-320's check, as a consumer's position gets)
        self._cuts = StreamCuts(lambda msg, then: _data_loss(self.opts, msg, then))

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

    def _latest(self, store: StoreReader) -> dict[TopicPartition, int]:
        return {tp: store.offsets(*tp)[1] for tp in self.opts.topic_partitions(store)}

    def initialOffset(self) -> dict:
        store = self._fresh_store()
        o = self.opts
        tps = o.topic_partitions(store)
        check_named_partitions(o.starting, "starting", tps)
        return self._to_json({tp: _resolve(store, tp, o.starting, False, o.timestamp_strategy)
                              for tp in tps})

    def getDefaultReadLimit(self) -> ReadLimit:
        """maxOffsetsPerTrigger as ReadMaxRows, else minOffsetsPerTrigger as ReadMinRows.
        PySpark has no composite limit (Spark's Kafka source passes both): latestOffset applies
        the options' other bound itself, and maxTriggerDelay, which ReadMinRows cannot carry."""
        o = self.opts
        if o.max_offsets_per_trigger:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.min_offsets_per_trigger:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._to_json(self._latest(self._fresh_store()))

    def reportLatestOffset(self) -> Optional[dict]:
        return self._to_json(self._latest(self._fresh_store()))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        """The end of the next batch, as Spark's Kafka source decides it: everything new, held
        back while fewer than minOffsetsPerTrigger records are new (until maxTriggerDelay has
        passed since the last batch), cut to maxOffsetsPerTrigger shared out by backlog.
        ReadAllAvailable (Trigger.Once) lifts both bounds; AvailableNow never holds back."""
        begin = self._from_json(start)
        store = self._fresh_store()
        latest = self._latest(store)
        back = self._cut_back(store, begin, latest)
        if back:          # a batch that goes back (StreamCuts.start reports it), nothing else
            return self._to_json({**begin, **back})
        if self._target is None and all(tp in begin and latest[tp] <= begin[tp] for tp in latest):
            latest = self._wait_for_data(store, latest)
        if self._target is not None:
            target = self._from_json(self._target)
            latest = {tp: min(v, target[tp]) for tp, v in latest.items() if tp in target}
        for tp in latest:
            if tp not in begin:
                begin[tp] = store.offsets(*tp, refresh=False)[0]    # new partition: earliest
        if isinstance(limit, ReadAllAvailable):
            return self._to_json(latest)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else \
            self.opts.max_offsets_per_trigger
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else \
            self.opts.min_offsets_per_trigger
        if min_rows and self._target is None:
            admitted = self._admit(min_rows, begin, latest, store)
            if admitted is None:
                return start            # as Spark's: the start offsets, so no batch runs
            latest = admitted
        return self._to_json(rate_limit(begin, latest, max_rows) if max_rows else latest)

    def _cut_back(self, store: StoreReader, begin: dict[TopicPartition, int],
                  latest: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The partitions whose next batch must start below their start (StreamCuts.pending),
        with where."""
        out = {}
        for tp in latest:
            if tp in begin:
                try:
                    back = self._cuts.pending(store, tp, begin[tp], store.offsets(*tp, refresh=False)[0])
                except UnknownTopicError:
                    continue
                if back is not None and back != begin[tp]:
                    out[tp] = back
        return out

    def _admit(self, min_rows: int, begin: dict[TopicPartition, int],
               latest: dict[TopicPartition, int], store: StoreReader
               ) -> Optional[dict[TopicPartition, int]]:
        """Spark's KafkaMicroBatchStream.delayBatch: the offsets to read up to, or None to hold
        the batch back because fewer than min_rows records are new in total and maxTriggerDelay
        has not passed since the last batch let through (the first trigger always passes). While
        holding back it waits up to waitForDataMs (never past the delay) for enough records on
        the partitions' notification words, so Spark's trigger loop does not spin on it."""
        delay = self.opts.max_trigger_delay_ms / 1000
        now = self.clock()
        deadline = now + self.opts.wait_for_data_ms / 1000
        if self._last_trigger is not None:
            deadline = min(deadline, self._last_trigger + delay)
        while True:
            if (self._last_trigger is None or now - self._last_trigger >= delay
                    or sum(latest[tp] - begin[tp] for tp in latest) >= min_rows):
                self._last_trigger = now
                return latest
            if now >= deadline:
                return None
            latest = self._wait_for_data(store, latest, deadline - now)
            now = self.clock()

    def _wait_for_data(self, store: StoreReader, latest: dict[TopicPartition, int],
                       timeout: Optional[float] = None) -> dict[TopicPartition, int]:
        """Wait up to `timeout` seconds (default waitForDataMs) for a record past `latest` on
        any partition, on the partitions' notification words (notify.wait_any) instead of
        returning at once to be polled again by Spark's trigger loop, so a record appended
        meanwhile starts a batch within microseconds. A partition that appears or goes away
        meanwhile is found by the next call."""
        tps = sorted(latest)
        if timeout is None:
            timeout = self.opts.wait_for_data_ms / 1000
        if timeout <= 0 or not tps:
            return latest
        try:
            if notify.wait_any([store.log(*tp) for tp in tps], [latest[tp] for tp in tps],
                               timeout):
                return self._latest(store)
        except (UnknownTopicError, SegmentGoneError):
            pass
        return latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = self._from_json(start), self._from_json(end)
        store = self._fresh_store()
        ident = identify(self.opts.paths)
        ranges = []
        self._cuts.begin()
        for tp, e in stop.items():
            try:
                log_start, log_end = store.offsets(*tp)
            except UnknownTopicError:
                _data_loss(self.opts, f"partition {tp[0]}-{tp[1]} no longer exists")
                continue
            s = self._cuts.start(store, tp, begin.get(tp, log_start), log_start)
            if s < log_start:
                _data_loss(self.opts, f"offsets {s}..{log_start - 1} of {tp[0]}-{tp[1]} were "
                                      f"deleted before they were read")
                s = log_start
            if e < s:
                _data_loss(self.opts, f"{tp[0]}-{tp[1]}: end offset {e} is below start {s} "
                                      f"(the partition was recreated?)")
                continue
            s, upto = self._cuts.plan(store, tp, s, e, log_end)
            if s < upto:
                ranges.append(KStoreRange(tp[0], tp[1], s, upto, ident))
        self._cuts.planned()
        return split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts, partition, self.schema)

    def commit(self, end: dict) -> None:
        """Nothing to do: like Spark's Kafka source, offsets live in the query's checkpoint."""

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
