"""Options of the ``kstore`` source and sink, as Spark's Kafka source and sink name them:
parsed and checked once on the driver into picklable ReadOptions and WriteOptions (with a
TopicPlan per topic: how a write task encodes for it)."""
from __future__ import annotations

import difflib
import json
import logging
import os
import re
import uuid
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Mapping, Optional

from kstore.broker_config import BrokerConfig
from kstore.config import LogConfig
from kstore.errors import InvalidConfigError, UnknownTopicError
from kstore.reader import StoreReader, split_log_dirs

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

Options = Mapping[str, Any]

log = logging.getLogger("kstore.spark")

FORMAT = "kstore"
STAGING_DIR = ".kstore-staging"

SCHEMA_DDL = ("key BINARY, value BINARY, topic STRING, partition INT, offset BIGINT, "
              "timestamp TIMESTAMP, timestampType INT")
HEADERS_DDL = ", headers ARRAY<STRUCT<key: STRING, value: BINARY>>"

TopicPartition = tuple[str, int]


def parse_bool(opts: Options, key: str, default: bool) -> bool:
    """Option `key` (lower-cased options), which must be true or false; default when absent."""
    v = opts.get(key)
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in ("true", "false"):
        return s == "true"
    raise InvalidConfigError(f"option '{key}' must be true or false, got {v!r}")


def _int(opts: Options, key: str, minimum: int = 1) -> Optional[int]:
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


def _json(opts: Options, key: str) -> dict:
    try:
        data = json.loads(opts[key])
    except ValueError as e:
        raise InvalidConfigError(f"option '{key}' is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise InvalidConfigError(f"option '{key}' must be a JSON object, got {opts[key]!r}")
    return data


def _partition_map(opts: Options, key: str) -> dict[TopicPartition, int]:
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


# -- option names: one table per side ------------------------------------------------------------
# Spark hands a Python data source its options with lower-cased keys; each table maps the
# lower-cased name to its spelling in the docs (for messages). An option in none of a side's
# tables is refused, naming it (and the nearest known name): a typo must never change silently
# what is read or written.

@dataclass(frozen=True)
class OptionTable:
    """The option names one side (source or sink) knows.

    known: options it implements. ignored: Spark Kafka options with no meaning here (no broker,
    no consumer group), accepted with one logged note naming them, so a job written for Spark's
    Kafka connector runs unchanged. refused: options refused with the reason (Spark's Kafka
    source refuses the same). passthrough_prefix: a prefix whose options are all accepted as
    ignored (Kafka client settings, ``kafka.*``) unless refused by name."""
    side: str
    known: Mapping[str, str]
    ignored: Mapping[str, str] = field(default_factory=dict)
    refused: Mapping[str, str] = field(default_factory=dict)
    passthrough_prefix: Optional[str] = None


def _names(*names: str) -> dict[str, str]:
    return {n.lower(): n for n in names}


_KAFKA_CONSUMER_REFUSED = {     # as KafkaSourceProvider.validateGeneralOptions refuses them
    "kafka.auto.offset.reset": "Kafka option 'auto.offset.reset' is not supported: set the "
                               "source option 'startingOffsets' to 'earliest' or 'latest'",
    "kafka.key.deserializer": "Kafka option 'key.deserializer' is not supported: keys are read "
                              "as bytes; deserialize them with DataFrame operations",
    "kafka.value.deserializer": "Kafka option 'value.deserializer' is not supported: values are "
                                "read as bytes; deserialize them with DataFrame operations",
    "kafka.enable.auto.commit": "Kafka option 'enable.auto.commit' is not supported: offsets "
                                "live in the query's checkpoint",
    "kafka.interceptor.classes": "Kafka option 'interceptor.classes' is not supported",
}

READ_TABLE = OptionTable(
    side="source",
    known=_names(
        "path", "assign", "subscribe", "subscribePattern",
        "startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp",
        "startingOffsetsByTimestampStrategy",
        "endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp",
        "failOnDataLoss", "includeHeaders", "minPartitions", "maxRecordsPerPartition",
        "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
        "pushFilters", "waitForDataMs"),            # the last two are kstore's own
    ignored=_names("groupIdPrefix", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
                   "kafkaConsumer.pollTimeoutMs"),
    refused=_KAFKA_CONSUMER_REFUSED,
    passthrough_prefix="kafka.",        # kafka.bootstrap.servers, kafka.group.id, kafka.security.*
)
# The sink's table (WRITE_TABLE) belongs with WriteOptions: define it like READ_TABLE (topic,
# includeHeaders?, kstore.* as its passthrough of broker settings, kafka.* ignored) and call
# check_options(opts, WRITE_TABLE) at the top of WriteOptions.parse.


def check_options(opts: Options, table: OptionTable, unused: tuple[str, ...] = ()) -> list[str]:
    """Refuse the options `table` does not know (InvalidConfigError naming each, with the nearest
    known name), and log ONE note naming the accepted options that do nothing here: the table's
    ignored ones, its passthrough prefix's, and `unused` (known names this query has no use for,
    e.g. trigger limits in a batch read). `opts` has lower-cased keys. Returns the names noted."""
    unknown, ignored = [], []
    for key in sorted(opts):
        if key in table.refused:
            raise InvalidConfigError(f"kstore {table.side}: option '{key}' is refused: "
                                     f"{table.refused[key]}")
        if key in table.known:
            if key in unused:
                ignored.append(table.known[key])
            continue
        if key in table.ignored:
            ignored.append(table.ignored[key])
        elif table.passthrough_prefix and key.startswith(table.passthrough_prefix):
            ignored.append(key)
        else:
            unknown.append(key)
    if unknown:
        hints = []
        for key in unknown:
            near = difflib.get_close_matches(key, list(table.known), n=1, cutoff=0.75)
            hints.append(f"'{key}'" + (f" (did you mean '{table.known[near[0]]}'?)" if near else ""))
        raise InvalidConfigError(
            f"kstore {table.side}: unknown option(s) {', '.join(hints)}; it takes "
            + ", ".join(sorted(table.known.values(), key=str.lower))
            + (f", and {table.passthrough_prefix}* settings (ignored)" if table.passthrough_prefix
               else ""))
    if ignored:
        log.warning("kstore %s: ignoring option(s) of Spark's Kafka connector that do not apply "
                    "to a local store: %s", table.side, ", ".join(ignored))
    return ignored


_DURATION = re.compile(r"(\d+)\s*(us|ms|s|m|min|h|d)?")
_DURATION_MS = {"us": 0.001, "ms": 1, None: 1, "s": 1000, "m": 60_000, "min": 60_000,
                "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(opts: Options, key: str, default: str) -> int:
    """Option `key` as a duration in ms, in Spark's format (JavaUtils.timeStringAsMs): a whole
    number with an optional unit us, ms, s, m/min, h or d (no unit: ms), e.g. 15m, 10s, 500ms."""
    raw = str(opts.get(key, default))
    m = _DURATION.fullmatch(raw.strip().lower())
    if m is None:
        raise InvalidConfigError(f"option '{key}' must be a duration such as 15m, 10s or 500ms "
                                 f"(units us, ms, s, m, min, h, d), got {raw!r}")
    return int(int(m.group(1)) * _DURATION_MS[m.group(2)])


class OffsetKind(Enum):
    """How an OffsetSpec names its offsets (Spark's Kafka source options)."""
    EARLIEST = "earliest"
    LATEST = "latest"
    OFFSETS = "offsets"         # per partition: {tp: offset}, -2 earliest, -1 latest
    TIMESTAMP = "timestamp"     # one ms timestamp for every partition
    TIMESTAMPS = "timestamps"   # per partition: {tp: ms}


@dataclass
class OffsetSpec:
    """Where a range starts or ends: `offsets` holds the per-partition offsets (OFFSETS) or
    timestamps (TIMESTAMPS), `timestamp` the one timestamp of TIMESTAMP."""
    kind: OffsetKind
    offsets: dict[TopicPartition, int] = field(default_factory=dict)
    timestamp: int = 0


def _offset_spec(opts: Options, prefix: str, default: str, is_end: bool) -> OffsetSpec:
    ts_key, by_ts_key, off_key = f"{prefix}timestamp", f"{prefix}offsetsbytimestamp", f"{prefix}offsets"
    ts = _int(opts, ts_key, 0)
    if ts is not None:                       # precedence: timestamp > by-timestamp > offsets
        return OffsetSpec(OffsetKind.TIMESTAMP, timestamp=ts)
    if opts.get(by_ts_key) is not None:
        return OffsetSpec(OffsetKind.TIMESTAMPS, offsets=_partition_map(opts, by_ts_key))
    raw = str(opts.get(off_key, default)).strip()
    if raw.lower() in ("earliest", "latest"):
        if is_end and raw.lower() == "earliest":
            raise InvalidConfigError(f"option '{prefix}Offsets' cannot be 'earliest'")
        return OffsetSpec(OffsetKind(raw.lower()))
    offs = _partition_map(opts, off_key)
    for tp, v in offs.items():
        if v < -2 or (is_end and v == -2):
            raise InvalidConfigError(f"option '{prefix}Offsets': invalid offset {v} for {tp[0]}-{tp[1]}"
                                     + (" (-2, earliest, is not allowed for an ending offset)" if v == -2 else ""))
    return OffsetSpec(OffsetKind.OFFSETS, offsets=offs)


def _check_start_not_after_end(start: OffsetSpec, end: OffsetSpec) -> None:
    """Spark's checkOffsetLimitValidity: per-partition starting and ending offsets (or
    timestamps) name the same partitions, and no start lies after its end (-2/-1 aside)."""
    if start.kind is not end.kind or start.kind not in (OffsetKind.OFFSETS, OffsetKind.TIMESTAMPS):
        return
    what = "offsets" if start.kind is OffsetKind.OFFSETS else "timestamps"
    if set(start.offsets) != set(end.offsets):
        raise InvalidConfigError(
            f"the starting and ending {what} name different partitions: "
            + ", ".join(f"{t}-{p}" for t, p in sorted(set(start.offsets) ^ set(end.offsets))))
    for tp, s in sorted(start.offsets.items()):
        e = end.offsets[tp]
        if s >= 0 and e >= 0 and s > e:
            raise InvalidConfigError(f"the starting {what[:-1]} {s} of {tp[0]}-{tp[1]} is after "
                                     f"its ending {what[:-1]} {e}")


# trigger limits: a batch read accepts them and notes that they do nothing (as Spark's Kafka source)
_STREAMING_ONLY = ("maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay", "waitfordatams")


@dataclass
class ReadOptions:
    """The source options of one query, parsed and checked once on the driver (picklable)."""
    paths: list
    assign: Optional[list] = None            # [(topic, partition)]
    subscribe: Optional[list] = None         # [topic]
    pattern: Optional[str] = None
    starting: OffsetSpec = field(default_factory=lambda: OffsetSpec(OffsetKind.EARLIEST))
    ending: OffsetSpec = field(default_factory=lambda: OffsetSpec(OffsetKind.LATEST))
    timestamp_strategy: str = "error"
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: Optional[int] = None
    max_records_per_partition: Optional[int] = None
    max_offsets_per_trigger: Optional[int] = None
    min_offsets_per_trigger: Optional[int] = None
    max_trigger_delay_ms: int = 15 * 60_000  # Spark's default maxTriggerDelay, 15m
    # off by default: PySpark 4.3's JVM keeps the read plan a pushdown produced on the data
    # source instance (PythonDataSourceV2.setReadInfo), and a later scan of the same DataFrame
    # with no pushable filter reuses it, reading only the earlier query's rows
    push_filters: bool = False
    wait_for_data_ms: int = 500              # streaming: how long latestOffset waits for news

    @classmethod
    def parse(cls, opts: Options, streaming: bool) -> "ReadOptions":
        opts = {str(k).lower(): v for k, v in dict(opts).items()}
        check_options(opts, READ_TABLE, () if streaming else _STREAMING_ONLY)
        iso = opts.get("kafka.isolation.level")
        if iso is not None and str(iso).strip().lower() != "read_uncommitted":
            # Spark's connector hands it to its consumer; ignoring it would return aborted and
            # open transactions' records to a job that asked for committed ones only
            raise InvalidConfigError(
                f"kstore source: option 'kafka.isolation.level' = {iso!r} is refused: the source "
                "reads as read_uncommitted (aborted and open transactions' records included); "
                "use kstore.Consumer(isolation_level='read_committed') for committed records only")
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
            if o.starting.kind is OffsetKind.LATEST or (o.starting.kind is OffsetKind.OFFSETS and
                                               -1 in o.starting.offsets.values()):
                raise InvalidConfigError("option 'startingOffsets': latest (-1) is not allowed "
                                         "for batch queries")
            o.ending = _offset_spec(opts, "ending", "latest", True)
            _check_start_not_after_end(o.starting, o.ending)
        strategy = str(opts.get("startingoffsetsbytimestampstrategy", "error")).lower()
        if strategy not in ("error", "latest"):
            raise InvalidConfigError("option 'startingOffsetsByTimestampStrategy' must be 'error' or 'latest'")
        o.timestamp_strategy = strategy
        o.fail_on_data_loss = parse_bool(opts, "failondataloss", True)
        o.include_headers = parse_bool(opts, "includeheaders", False)
        o.min_partitions = _int(opts, "minpartitions")
        o.max_records_per_partition = _int(opts, "maxrecordsperpartition")
        o.max_offsets_per_trigger = _int(opts, "maxoffsetspertrigger")
        o.min_offsets_per_trigger = _int(opts, "minoffsetspertrigger", 0)
        o.max_trigger_delay_ms = parse_duration_ms(opts, "maxtriggerdelay", "15m")
        if (o.min_offsets_per_trigger is not None and o.max_offsets_per_trigger is not None
                and o.min_offsets_per_trigger > o.max_offsets_per_trigger):
            raise InvalidConfigError(
                f"option 'minOffsetsPerTrigger' ({o.min_offsets_per_trigger}) is higher than "
                f"'maxOffsetsPerTrigger' ({o.max_offsets_per_trigger})")
        o.push_filters = parse_bool(opts, "pushfilters", False)
        o.wait_for_data_ms = _int(opts, "waitfordatams", 0) or (0 if "waitfordatams" in opts else 500)
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
        assert self.pattern is not None       # parse() sets one of assign, subscribe, pattern
        rx = re.compile(self.pattern)
        return [tp for tp in store.partitions() if rx.fullmatch(tp[0])]



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



#: Sink options kstore reads (lower-cased, as Spark hands them), and those it accepts without
#: effect: Spark's (checkpointLocation) and Spark's Kafka sink's that mean nothing here.
WRITE_OPTIONS = frozenset({"path", "topic", "locktimeoutms", "stalestagingms", "checkpointlocation"})
WRITE_OPTIONS_NOT_APPLICABLE = frozenset({"includeheaders"})
#: Default of lockTimeoutMs: how long a commit waits for the store's writer lock.
DEFAULT_LOCK_TIMEOUT_MS = 5000
#: Default of staleStagingMs: staging no task or commit holds, untouched this long, is collected.
DEFAULT_STALE_STAGING_MS = 3_600_000


def _check_write_options(opts: Options) -> None:
    """Refuse options the sink does not know, naming them (a typo must not pass silently);
    Kafka's own (`kafka.*`, ...) are accepted with one logged note, as they do not apply."""
    unknown = sorted(k for k in opts if k not in WRITE_OPTIONS and k not in WRITE_OPTIONS_NOT_APPLICABLE
                     and not k.startswith(("kstore.", "kafka.", "__")))
    if unknown:
        raise InvalidConfigError(
            f"kstore sink: unknown option(s) {unknown}; it takes path, topic, lockTimeoutMs, "
            "staleStagingMs and kstore.<broker key> (Kafka's kafka.* are accepted and ignored)")
    ignored = sorted(k for k in opts if k.startswith("kafka.") or k in WRITE_OPTIONS_NOT_APPLICABLE)
    if ignored:
        import logging
        logging.getLogger("kstore.spark").info(
            "kstore sink: option(s) %s do not apply to a kstore store and are ignored", ignored)


def check_sink_schema(schema: StructType, topic_option: bool) -> list[str]:
    """Spark's Kafka sink's rules for its input, checked when the write is planned (before any
    task runs), with its messages: value (string or binary) required, key string or binary,
    topic string (unless the 'topic' option is set: then the column is not used), partition
    int, headers array<struct<key string, value binary>>. Other columns are ignored, as Kafka's
    sink does, except kstore's one addition: a `timestamp` column of timestamp type sets the
    records' CreateTime. Returns the columns a task uses, in the schema's order."""
    from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, StringType, StructField,
                                   StructType as ST, TimestampNTZType, TimestampType)
    fields = {f.name: f.dataType for f in schema.fields}
    headers_type = ArrayType(ST([StructField("key", StringType()), StructField("value", BinaryType())]))

    def same(a, b) -> bool:          # Spark's sameType: nullability aside
        if isinstance(a, ArrayType) and isinstance(b, ArrayType):
            return same(a.elementType, b.elementType)
        if isinstance(a, ST) and isinstance(b, ST):
            return ([f.name for f in a.fields] == [f.name for f in b.fields]
                    and all(same(x.dataType, y.dataType) for x, y in zip(a.fields, b.fields)))
        return type(a) is type(b)

    rules = [("key", (StringType(), BinaryType())), ("value", (StringType(), BinaryType())),
             ("headers", (headers_type,)), ("partition", (IntegerType(),))]
    if not topic_option:
        if "topic" not in fields:
            raise InvalidConfigError("topic option required when no 'topic' attribute is present. "
                                     "Use the topic option for setting a topic.")
        rules.append(("topic", (StringType(),)))
    if "value" not in fields:
        raise InvalidConfigError("Required attribute 'value' not found")
    for name, desired in rules:
        t = fields.get(name)
        if t is not None and not any(same(t, d) for d in desired):
            raise InvalidConfigError(
                f"{name} attribute unsupported type {t.simpleString()}. {name} must be a(n) "
                + " or ".join(d.simpleString() for d in desired))
    used = {n for n, _ in rules} | ({"timestamp"} if isinstance(fields.get("timestamp"),
                                                               (TimestampType, TimestampNTZType)) else set())
    return [f.name for f in schema.fields if f.name in used]


@dataclass
class WriteOptions:
    paths: list
    topic: Optional[str]
    broker: dict
    staging: str                # a batch write's staging dir (a micro-batch's: staging.py)
    plans: dict                 # topic -> TopicPlan (topics known when the write was planned)
    default_plan: TopicPlan     # for topics that appear only in the data (auto-created)
    auto_create: bool
    columns: list = field(default_factory=lambda: ["key", "value", "topic", "partition", "headers"])
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    stale_staging_ms: int = DEFAULT_STALE_STAGING_MS

    @classmethod
    def parse(cls, opts: Options, schema: StructType) -> "WriteOptions":
        opts = {str(k).lower(): v for k, v in dict(opts).items()}
        _check_write_options(opts)
        if not opts.get("path"):
            raise InvalidConfigError("kstore sink: give the log dirs with .save(path) or the "
                                     "'path' option (comma-separated)")
        paths = split_log_dirs(opts["path"])
        topic = opts.get("topic")
        columns = check_sink_schema(schema, topic is not None)
        lock_timeout = _int(opts, "locktimeoutms", 0)
        stale = _int(opts, "stalestagingms", 0)
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
        return cls(paths, topic, broker, os.path.join(paths[0], STAGING_DIR, "w-" + uuid.uuid4().hex),
                   plans, plan(bc.log_config(None), bc["num.partitions"], False), auto, columns,
                   DEFAULT_LOCK_TIMEOUT_MS if lock_timeout is None else lock_timeout,
                   DEFAULT_STALE_STAGING_MS if stale is None else stale)
