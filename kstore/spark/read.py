"""Reading a store from Spark: offsets resolved per partition (timestamps through the time
index), ranges planned and split into tasks, each task decoding its range into Arrow batches;
the batch readers and the stream reader (Kafka-source offsets, rate limits)."""
from __future__ import annotations

import logging
import math
from typing import Iterable, Iterator, Optional, Sequence

import pyarrow as pa
from pyspark.sql.datasource import (DataSourceReader, DataSourceStreamReader, Filter,
                                    InputPartition)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows,
                                              SupportsTriggerAvailableNow)

from kstore import notify
from kstore.arrow import iter_batches, kafka_schema
from kstore.errors import (DataLossError, InvalidConfigError, OffsetOutOfRangeError,
                           SegmentGoneError, UnknownTopicError)
from kstore.reader import StoreReader
from kstore.spark.options import OffsetKind, OffsetSpec, ReadOptions, TopicPartition
from kstore.spark.deploy import StoreIdentity, check, check_end, identify
from kstore.spark.pushdown import Pruning

log = logging.getLogger("kstore.spark")


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
    """A task's work: open the store read-only and yield the range as Arrow batches."""
    if not isinstance(part, KStoreRange):
        return          # Spark plans one empty InputPartition(None) when there is nothing to read
    if part.store is not None:      # a host that cannot see the store fails, naming itself
        check(part.store, f"{part.topic}-{part.partition}")
    with StoreReader(opts.paths) as store:
        try:
            lg = store.log(part.topic, part.partition)
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
                                        include_headers=opts.include_headers, schema=schema)
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

    def __init__(self, opts: ReadOptions):
        self.opts = opts
        self.pruning = Pruning()

    def plan(self) -> list[KStoreRange]:
        o, pr = self.opts, self.pruning
        ranges = []
        ident = identify(o.paths)
        with StoreReader(o.paths) as store:
            tps = o.topic_partitions(store)
            for name, spec in (("startingOffsets", o.starting), ("endingOffsets", o.ending)):
                if spec.kind is OffsetKind.OFFSETS and spec.offsets:
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
                    ranges.append(KStoreRange(tp[0], tp[1], start, end, ident))
        return split_ranges(ranges, o.min_partitions, o.max_records_per_partition)

    def partitions(self) -> Sequence[InputPartition]:
        return self.plan()

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts, partition, kafka_schema(self.opts.include_headers))


class KStorePushdownReader(KStoreBatchReader):
    """KStoreBatchReader with filter pushdown on topic, partition, offset and timestamp."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
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

    def _latest(self, store: StoreReader) -> dict[TopicPartition, int]:
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
        self._target = self._to_json(self._latest(self._fresh_store()))

    def reportLatestOffset(self) -> Optional[dict]:
        return self._to_json(self._latest(self._fresh_store()))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = self._from_json(start)
        store = self._fresh_store()
        latest = self._latest(store)
        if self._target is None and all(tp in begin and latest[tp] <= begin[tp] for tp in latest):
            latest = self._wait_for_data(store, latest)
        if self._target is not None:
            target = self._from_json(self._target)
            latest = {tp: min(v, target[tp]) for tp, v in latest.items() if tp in target}
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

    def _wait_for_data(self, store: StoreReader, latest: dict[TopicPartition, int]
                       ) -> dict[TopicPartition, int]:
        """Nothing new since the last batch: wait up to waitForDataMs on the partitions'
        notification words (notify.wait_any) instead of returning at once to be polled again by
        Spark's trigger loop, so a record appended meanwhile starts a batch within microseconds.
        A partition that appears or goes away meanwhile is found by the next call."""
        tps = sorted(latest)
        if not self.opts.wait_for_data_ms or not tps:
            return latest
        try:
            if notify.wait_any([store.log(*tp) for tp in tps], [latest[tp] for tp in tps],
                               self.opts.wait_for_data_ms / 1000):
                return self._latest(store)
        except (UnknownTopicError, SegmentGoneError):
            pass
        return latest

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin, stop = self._from_json(start), self._from_json(end)
        store = self._fresh_store()
        ident = identify(self.opts.paths)
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
                ranges.append(KStoreRange(tp[0], tp[1], s, e, ident))
        return split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.opts, partition, kafka_schema(self.opts.include_headers))

    def commit(self, end: dict) -> None:
        """Nothing to do: like Spark's Kafka source, offsets live in the query's checkpoint."""

    def stop(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
