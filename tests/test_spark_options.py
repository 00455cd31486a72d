"""The kstore source's contract (issue 17, defects 1 and 5): options refused, accepted or
ignored as Spark's Kafka source does, minOffsetsPerTrigger / maxTriggerDelay, startingOffsets
JSON that leaves out partitions, and filter pushdown that never changes a query's rows.

The option and admission tests need no SparkSession (fast tier); the end-to-end ones use the
`spark` fixture."""
import datetime as dt
import json
import logging
import threading
import time

import pytest

import kstore

pytest.importorskip("pyspark")
ks = pytest.importorskip("kstore.spark")
from pyspark.sql.datasource import (EqualNullSafe, EqualTo, GreaterThan,  # noqa: E402
                                    GreaterThanOrEqual, In, IsNotNull, LessThan,
                                    LessThanOrEqual, Not, StringEndsWith, StringStartsWith)
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadMaxRows,  # noqa: E402
                                              ReadMinRows)
from thread_watchdog import join_all  # noqa: E402
from spark_helpers import make_store  # noqa: E402


def batch_and_stream_refuse(opts, match):
    """A batch read's planning and a streaming read's first offsets both refuse opts alike."""
    with pytest.raises(InvalidConfigError, match=match):
        ks.KStoreDataSource(opts).reader(None).partitions()
    stream = ks.KStoreDataSource(opts).streamReader(None)
    try:
        with pytest.raises(InvalidConfigError, match=match):
            stream.initialOffset()
    finally:
        stream.stop()

from kstore.errors import InvalidConfigError  # noqa: E402
from kstore.spark.options import ReadOptions, check_options, READ_TABLE  # noqa: E402
from kstore.spark.read import KStoreStreamReader, rate_limit  # noqa: E402


def parse(streaming=False, **opts):
    return ReadOptions.parse({"path": "/nonexistent", "subscribe": "t", **opts}, streaming)


# -- defect 5: option names ----------------------------------------------------------------------
def test_a_typo_is_refused_naming_it_and_the_option_meant():
    with pytest.raises(InvalidConfigError, match=r"unknown option\(s\) 'startingoffset' \(did you "
                                                 r"mean 'startingOffsets'\?\)"):
        parse(startingOffset="latest", streaming=True)
    with pytest.raises(InvalidConfigError, match="'maxoffsetpertrigger' .*'maxOffsetsPerTrigger'"):
        parse(maxOffsetPerTrigger="10", streaming=True)
    # keys arrive lower-cased (PySpark's CaseInsensitiveDict); any spelling of a known one passes
    assert parse(STARTINGOFFSETS="earliest", streaming=True).starting.kind.value == "earliest"
    # every unknown name is listed, with none of the ones it knows
    with pytest.raises(InvalidConfigError) as e:
        parse(fooBar="1", startingOffset="latest")
    assert "'foobar'" in str(e.value) and "'startingoffset'" in str(e.value)
    # kstore.* configure the sink's writer; the source has no use for them: refused, not ignored
    with pytest.raises(InvalidConfigError, match="'kstore.num.partitions'"):
        parse(**{"kstore.num.partitions": "3"})


def test_kafka_options_that_do_not_apply_are_accepted_with_one_note(caplog):
    spark_kafka = {"kafka.bootstrap.servers": "host:9092", "kafka.group.id": "g",
                   "groupIdPrefix": "x", "fetchOffset.numRetries": "3",
                   "fetchOffset.retryIntervalMs": "10", "kafkaConsumer.pollTimeoutMs": "512",
                   "kafka.security.protocol": "SSL"}
    with caplog.at_level(logging.INFO, logger="kstore.spark"):
        o = parse(streaming=True, **spark_kafka)
    notes = [r.getMessage() for r in caplog.records if r.name == "kstore.spark"]
    assert len(notes) == 1
    for name in ("kafka.bootstrap.servers", "kafka.group.id", "groupIdPrefix",
                 "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
                 "kafkaConsumer.pollTimeoutMs", "kafka.security.protocol"):
        assert name in notes[0]
    assert o.subscribe == ["t"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kstore.spark"):
        parse(streaming=True, startingOffsets="earliest")
    assert not [r for r in caplog.records if r.name == "kstore.spark"]     # nothing to note


def test_kafka_settings_spark_refuses_are_refused():
    for key, why in (("kafka.auto.offset.reset", "startingOffsets"),
                     ("kafka.key.deserializer", "keys are read as bytes"),
                     ("kafka.value.deserializer", "values are read as bytes"),
                     ("kafka.enable.auto.commit", "checkpoint"),
                     ("kafka.interceptor.classes", "not supported")):
        with pytest.raises(InvalidConfigError, match=f"'{key}' is refused: .*{why}"):
            parse(**{key: "x"})



def test_kafka_isolation_level_read_committed_is_refused(caplog):
    """Spark's connector reads only committed records with kafka.isolation.level=read_committed;
    the source reads as read_uncommitted. Before, the option was ignored with a note and the job
    got aborted transactions' records; now it is refused, naming the option, and
    read_uncommitted (what the source does) is accepted as before."""
    for value in ("read_committed", "READ_COMMITTED", "bogus"):
        with pytest.raises(InvalidConfigError, match=r"'kafka.isolation.level' = '%s' is refused: "
                           r".*read_uncommitted.*isolation_level='read_committed'" % value):
            parse(**{"kafka.isolation.level": value})
    with caplog.at_level(logging.INFO, logger="kstore.spark"):
        assert parse(**{"kafka.isolation.level": "read_uncommitted"}).subscribe == ["t"]
    assert any("kafka.isolation.level" in r.getMessage() for r in caplog.records)

def test_batch_reads_note_the_trigger_options_they_do_not_use(caplog):
    with caplog.at_level(logging.INFO, logger="kstore.spark"):
        parse(maxOffsetsPerTrigger="10", minOffsetsPerTrigger="5", maxTriggerDelay="1m")
    notes = [r.getMessage() for r in caplog.records if r.name == "kstore.spark"]
    assert len(notes) == 1 and all(n in notes[0] for n in
                                   ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"))


def test_check_options_returns_what_it_noted():
    opts = {"path": "/x", "kafka.bootstrap.servers": "h", "groupidprefix": "g", "subscribe": "t"}
    assert check_options(opts, READ_TABLE) == ["groupIdPrefix", "kafka.bootstrap.servers"]


# -- defect 5: option values ---------------------------------------------------------------------
def test_max_trigger_delay_takes_spark_durations_and_refuses_others():
    for raw, ms in (("15m", 900_000), ("10s", 10_000), ("500ms", 500), ("250", 250),
                    ("2min", 120_000), ("1h", 3_600_000), ("1d", 86_400_000), ("1500us", 1),
                    (" 3S ", 3000)):
        assert parse(streaming=True, maxTriggerDelay=raw).max_trigger_delay_ms == ms
    assert parse(streaming=True).max_trigger_delay_ms == 900_000          # Spark's default, 15m
    for bad in ("soon", "", "-5s", "1.5s", "10 sec", "5w"):
        with pytest.raises(InvalidConfigError, match=f"'maxtriggerdelay' must be a duration .*{bad!r}"):
            parse(streaming=True, maxTriggerDelay=bad)


def test_trigger_limits_are_checked():
    o = parse(streaming=True, minOffsetsPerTrigger="20", maxOffsetsPerTrigger="30")
    assert (o.min_offsets_per_trigger, o.max_offsets_per_trigger) == (20, 30)
    with pytest.raises(InvalidConfigError, match=r"'minOffsetsPerTrigger' \(31\) is higher than "
                                                 r"'maxOffsetsPerTrigger' \(30\)"):
        parse(streaming=True, minOffsetsPerTrigger="31", maxOffsetsPerTrigger="30")
    for key, bad in (("minOffsetsPerTrigger", "many"), ("minOffsetsPerTrigger", "-1"),
                     ("maxOffsetsPerTrigger", "0"), ("minPartitions", "0"),
                     ("maxRecordsPerPartition", "x"), ("failOnDataLoss", "yes"),
                     ("includeHeaders", "1"), ("pushFilters", "no"), ("waitForDataMs", "-1")):
        with pytest.raises(InvalidConfigError, match=f"option '{key.lower()}'"):
            parse(streaming=True, **{key: bad})


def test_offset_and_timestamp_options_are_still_validated():
    with pytest.raises(InvalidConfigError, match="for batch queries only"):
        parse(streaming=True, endingOffsets="latest")
    with pytest.raises(InvalidConfigError, match="for batch queries only"):
        parse(streaming=True, endingTimestamp="5")
    with pytest.raises(InvalidConfigError, match="for batch queries only"):
        parse(streaming=True, endingOffsetsByTimestamp='{"t": {"0": 5}}')
    with pytest.raises(InvalidConfigError, match="latest .* not allowed for batch"):
        parse(startingOffsets="latest")
    with pytest.raises(InvalidConfigError, match="latest .* not allowed for batch"):
        parse(startingOffsets='{"t": {"0": -1}}')
    with pytest.raises(InvalidConfigError, match="cannot be 'earliest'"):
        parse(endingOffsets="earliest")
    with pytest.raises(InvalidConfigError, match="-2, earliest, is not allowed"):
        parse(endingOffsets='{"t": {"0": -2}}')
    with pytest.raises(InvalidConfigError, match="must be an integer"):
        parse(startingTimestamp="noon")
    with pytest.raises(InvalidConfigError, match="not valid JSON"):
        parse(startingOffsetsByTimestamp="{t: 0}")
    with pytest.raises(InvalidConfigError, match="'error' or 'latest'"):
        parse(startingTimestamp="5", startingOffsetsByTimestampStrategy="earliest")
    # Spark's checkOffsetLimitValidity: same partitions on both sides, no start after its end
    with pytest.raises(InvalidConfigError, match="name different partitions: t-1"):
        parse(startingOffsets='{"t": {"0": 1, "1": 2}}', endingOffsets='{"t": {"0": 5}}')
    with pytest.raises(InvalidConfigError, match="starting offset 9 of t-0 is after its ending offset 5"):
        parse(startingOffsets='{"t": {"0": 9}}', endingOffsets='{"t": {"0": 5}}')
    with pytest.raises(InvalidConfigError, match="starting timestamp 9 of t-0 is after"):
        parse(startingOffsetsByTimestamp='{"t": {"0": 9}}', endingOffsetsByTimestamp='{"t": {"0": 5}}')
    o = parse(startingOffsets='{"t": {"0": -2}}', endingOffsets='{"t": {"0": -1}}')
    assert o.starting.offsets == {("t", 0): -2} and o.ending.offsets == {("t", 0): -1}


# -- startingOffsets JSON that leaves out partitions: the same rule for batch and streaming ------
@pytest.mark.parametrize("key,value", [
    ("startingOffsets", '{"t": {"0": 5}}'),
    ("startingOffsetsByTimestamp", '{"t": {"0": 5000}}'),
])
def test_json_that_leaves_out_a_partition_fails_batch_and_streaming_alike(tmp_path, key, value):
    """Spark's KafkaOffsetReader asserts, for batch and streaming alike, that per-partition
    starting offsets name exactly the partitions read: t-1 left out fails both, naming it."""
    d = make_store(str(tmp_path / "s"), n=10)
    opts = {"path": d, "subscribe": "t", key: value}
    batch_and_stream_refuse(opts, f"{key} gives specific partitions.*missing: t-1$")


def test_json_naming_a_partition_the_query_does_not_read_fails_both(tmp_path):
    d = make_store(str(tmp_path / "s"), n=10)
    opts = {"path": d, "assign": '{"t": [0]}', "startingOffsets": '{"t": {"0": 1, "1": 2}}'}
    batch_and_stream_refuse(opts, "not read by the query: t-1")


def test_json_naming_every_partition_starts_batch_and_streaming_at_the_same_offsets(tmp_path):
    d = make_store(str(tmp_path / "s"), n=10)
    opts = {"path": d, "subscribe": "t", "startingOffsets": '{"t": {"0": 4, "1": -2}}'}
    batch = [(r.partition, r.start, r.end) for r in ks.KStoreDataSource(opts).reader(None).partitions()]
    assert batch == [(0, 4, 10), (1, 0, 10)]
    stream = ks.KStoreDataSource(opts).streamReader(None)
    try:
        assert stream.initialOffset() == {"t": {"0": 4, "1": 0}}
    finally:
        stream.stop()


# -- minOffsetsPerTrigger / maxTriggerDelay: the admission rule (no SparkSession) ----------------
class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def stream_reader(d, **opts):
    o = ReadOptions.parse({"path": d, "subscribe": "t", "startingOffsets": "earliest",
                           "waitForDataMs": "0", **opts}, streaming=True)
    r = KStoreStreamReader(o)
    r.clock = FakeClock()
    return r


def test_rate_limit_shares_out_by_backlog_and_starves_no_partition():
    a, b, c = ("t", 0), ("t", 1), ("t", 2)
    assert rate_limit({a: 0, b: 0, c: 0}, {a: 100, b: 300, c: 1}, 40) == {a: 9, b: 29, c: 1}
    assert rate_limit({a: 5, b: 0}, {a: 10, b: 3}, 8) == {a: 10, b: 3}       # under the limit
    assert rate_limit({a: 5, b: 0}, {a: 5, b: 30}, 8) == {a: 5, b: 8}


def test_min_offsets_per_trigger_holds_batches_back_until_enough_records_or_the_delay(tmp_path):
    d = make_store(str(tmp_path / "m"), n=3)
    with kstore.LogManager(d) as m:
        r = stream_reader(d, minOffsetsPerTrigger="10", maxTriggerDelay="30s")
        try:
            assert r.getDefaultReadLimit() == ReadMinRows(10)
            limit = r.getDefaultReadLimit()
            start = r.initialOffset()
            assert start == {"t": {"0": 0, "1": 0}}
            # the first trigger is never held back (Spark: lastTriggerMillis starts at 0)
            end = r.latestOffset(start, limit)
            assert end == {"t": {"0": 3, "1": 3}}
            r.clock.now += 1
            for i in range(9):                          # 9 new records in all: held back
                m.log("t", i % 2).append([(b"k", b"v")])
            assert r.latestOffset(end, limit) is end
            r.clock.now += 1
            m.log("t", 1).append([(b"k", b"v")])        # the 10th: let through, all of them
            end2 = r.latestOffset(end, limit)
            assert end2 == {"t": {"0": 8, "1": 8}}
            # one record, held back until 30 s after the last batch let through, then let go
            m.log("t", 0).append([(b"k", b"v")])
            r.clock.now += 29.5
            assert r.latestOffset(end2, limit) is end2
            r.clock.now += 0.5
            assert r.latestOffset(end2, limit) == {"t": {"0": 9, "1": 8}}
            # the delay counts from that trigger: one more record waits again
            m.log("t", 1).append([(b"k", b"v")])
            end3 = {"t": {"0": 9, "1": 8}}
            r.clock.now += 10
            assert r.latestOffset(end3, limit) is end3
            # ReadAllAvailable (Trigger.Once) lifts the bound
            assert r.latestOffset(end3, ReadAllAvailable()) == {"t": {"0": 9, "1": 9}}
        finally:
            r.stop()


def test_min_and_max_offsets_per_trigger_are_both_bounds(tmp_path):
    d = make_store(str(tmp_path / "mm"), n=0)
    with kstore.LogManager(d) as m:
        r = stream_reader(d, minOffsetsPerTrigger="20", maxOffsetsPerTrigger="30",
                          maxTriggerDelay="15m")
        try:
            limit = r.getDefaultReadLimit()
            assert limit == ReadMaxRows(30)         # PySpark has no composite limit
            start = r.initialOffset()
            assert r.latestOffset(start, limit) == start    # first trigger: nothing there
            r.clock.now += 1
            for i in range(19):
                m.log("t", i % 2).append([(b"k", b"v")])
            assert r.latestOffset(start, limit) is start    # 19 < 20
            for i in range(19, 100):
                m.log("t", i % 2).append([(b"k", b"v")])
            end = r.latestOffset(start, limit)            # 100 new: cut to 30 by backlog
            assert end == {"t": {"0": 15, "1": 15}}
            end = r.latestOffset(end, limit)
            assert end == {"t": {"0": 30, "1": 30}}
            # a ReadMinRows limit from Spark, with maxOffsetsPerTrigger still applied from options
            end = r.latestOffset(end, ReadMinRows(20))
            assert end == {"t": {"0": 45, "1": 45}}
            assert r.latestOffset(end, limit) is end     # 5 + 5 left < 20: held back
        finally:
            r.stop()


def test_available_now_never_holds_back(tmp_path):
    d = make_store(str(tmp_path / "an"), n=2)
    r = stream_reader(d, minOffsetsPerTrigger="1000", maxTriggerDelay="1h")
    try:
        start = r.initialOffset()
        r.prepareForTriggerAvailableNow()
        limit = r.getDefaultReadLimit()
        end = r.latestOffset(start, limit)
        assert end == {"t": {"0": 2, "1": 2}}
        r.clock.now += 1
        assert r.latestOffset(end, limit) == end     # the target reached; no wait for more
    finally:
        r.stop()


def test_a_held_back_trigger_waits_for_records_on_the_notification_words(tmp_path, watchdog):
    """While fewer than minOffsetsPerTrigger records are new, latestOffset waits (up to
    waitForDataMs) for more instead of returning at once to Spark's polling loop; records
    appended by another thread meanwhile let the batch through within that call."""
    watchdog(120)
    d = make_store(str(tmp_path / "w"), n=0)
    with kstore.LogManager(d) as m:
        o = ReadOptions.parse({"path": d, "subscribe": "t", "startingOffsets": "earliest",
                               "minOffsetsPerTrigger": "6", "maxTriggerDelay": "1h",
                               "waitForDataMs": "60000"}, streaming=True)
        r = KStoreStreamReader(o)
        try:
            start = r.initialOffset()
            m.log("t", 0).append([(b"k", b"v")])
            end = r.latestOffset(start, ReadMinRows(6))      # the first trigger: let through
            assert end == {"t": {"0": 1, "1": 0}}

            def append():
                for i in range(6):
                    time.sleep(0.05)
                    m.log("t", i % 2).append([(b"k", b"v")])
            t = threading.Thread(target=append)
            t.start()
            t0 = time.monotonic()
            end = r.latestOffset(end, ReadMinRows(6))
            join_all([t], 60)
            assert end == {"t": {"0": 4, "1": 3}}
            assert time.monotonic() - t0 < 60        # let through by the 6th record, not a timeout
        finally:
            r.stop()


# -- defect 1: pushdown pushes exactly what it handles, and never changes the rows ---------------
def test_push_filters_returns_the_very_objects_it_does_not_handle(tmp_path):
    d = make_store(str(tmp_path / "p"), partitions=3, n=5)
    ts = dt.datetime(1970, 1, 1, 0, 0, 2, tzinfo=dt.timezone.utc)
    handled = [EqualTo(("partition",), 1), EqualNullSafe(("topic",), "t"), In(("topic",), ("t", "u")),
               StringStartsWith(("topic",), "t"), GreaterThanOrEqual(("offset",), 1),
               LessThan(("offset",), 4), In(("partition",), (1, 2)), GreaterThan(("partition",), 0),
               LessThanOrEqual(("partition",), 1), EqualNullSafe(("offset",), 2)]
    not_handled = [Not(EqualTo(("partition",), 1)), Not(In(("partition",), (0,))),
                   Not(EqualTo(("topic",), "t")), IsNotNull(("offset",)), In(("offset",), (1, 3)),
                   GreaterThanOrEqual(("timestamp",), ts), StringEndsWith(("topic",), "t"),
                   EqualTo(("value",), b"p1-2"), EqualTo(("timestampType",), 0),
                   EqualNullSafe(("topic",), None), In(("topic",), ("t", None)),
                   EqualTo(("partition",), True), EqualTo(("key", "x"), 1)]
    r = ks.KStoreDataSource({"path": d, "subscribe": "t", "pushFilters": "true"}).reader(None)
    rest = list(r.pushFilters(handled + not_handled))
    assert len(rest) == len(not_handled) and all(a is b for a, b in zip(rest, not_handled))
    assert [(x.partition, x.start, x.end) for x in r.partitions()] == [(1, 2, 3)]


PUSHDOWN_QUERIES = [
    "partition != 1", "partition <> 1", "NOT partition = 1", "NOT partition IN (0, 2)",
    "partition = 1", "partition <=> 1", "partition IN (0, 2)", "partition > 0 AND partition <= 1",
    "partition >= 5", "partition < 0", "offset >= 40 AND offset < 45", "offset <=> 7",
    "offset IN (3, 17, 60)", "offset != 3", "NOT offset > 10", "offset > -3 AND offset <= 2",
    "topic = 't'", "topic <=> 't'", "topic != 't'", "topic = 'u'", "topic IN ('u', 't')",
    "topic IN ('u', NULL)", "NOT topic IN ('u')", "topic LIKE 't%'", "topic LIKE '%t'",
    "topic LIKE '%u%'", "topic <=> NULL", "topic IS NOT NULL", "topic IS NULL",
    "timestamp >= TIMESTAMP '1970-01-01 00:00:30.500'",
    "timestamp > TIMESTAMP '1970-01-01 00:00:30'",
    "timestamp = TIMESTAMP '1970-01-01 00:00:07'",
    "timestamp <=> TIMESTAMP '1970-01-01 00:00:07'",
    "timestamp < TIMESTAMP '1970-01-01 00:00:05'",
    "timestamp != TIMESTAMP '1970-01-01 00:00:05'",
    "timestamp >= TIMESTAMP '2100-01-01 00:00:00'",
    "partition = 2 AND offset >= 40 AND timestamp >= TIMESTAMP '1970-01-01 00:00:42'",
    "partition != 2 AND offset < 3", "topic = 't' AND partition IN (1, 2) AND offset >= 48",
    "(partition = 1 OR offset = 3)", "(topic = 'u' OR partition = 0) AND offset < 2",
    "NOT (partition = 1 AND offset < 40)", "value = X'70312D33'", "key <=> NULL",
    "timestampType = 0 AND partition = 0 AND offset = 1",
]


def pushdown_store(d):
    """Topic t: 3 partitions of 50 records, timestamps of partition p growing by 1 s per offset
    from p * 10 s (a timestamp bound prunes a different range in each partition); topic u: one."""
    with kstore.LogManager(d, {"log.segment.bytes": 2048}) as m:
        m.create_topic("t", 3)
        m.create_topic("u", 1)
        for p in range(3):
            for i in range(50):
                m.log("t", p).append([(b"k%d" % i, b"p%d-%d" % (p, i), p * 10_000 + 1000 * i)])
        m.log("u", 0).append([(None, b"u", 5)])
    return d


def rows(df, q):
    return sorted(tuple(r) for r in df.where(q).select("topic", "partition", "offset").collect())


def test_pushdown_gives_exactly_the_rows_spark_gives_without_it(spark, tmp_path):
    """Each filter kind (and AND/OR combinations) through Spark with pushFilters=true and
    without pushdown: the same rows. One DataFrame per query with pushdown: PySpark 4.3 keeps a
    pushdown's read plan on the DataFrame's data source (see the next test)."""
    d = pushdown_store(str(tmp_path / "pd"))
    off = spark.read.format("kstore").option("subscribePattern", "t|u").load(d)
    for q in PUSHDOWN_QUERIES:
        on = (spark.read.format("kstore").option("subscribePattern", "t|u")
              .option("pushFilters", "true").load(d))
        assert rows(on, q) == rows(off, q), q
    # the handled ones prune the plan (fewer tasks), the others leave it whole
    on = spark.read.format("kstore").option("subscribePattern", "t|u").option("pushFilters", "true")
    assert on.load(d).where("partition = 1 AND offset >= 45").rdd.getNumPartitions() == 1
    assert on.load(d).where("partition != 1").rdd.getNumPartitions() == 4


def test_a_dataframe_reused_across_queries_reads_every_row_by_default(spark, tmp_path):
    """The default (no pushdown): a DataFrame queried first with pushable filters, then with
    none Spark can push (an OR) and none at all, gives every query its rows. (With
    pushFilters=true PySpark 4.3 answered the OR query from the first query's pruned plan:
    [(t, 1, 48), (t, 1, 49)] instead of 52 rows.)"""
    d = pushdown_store(str(tmp_path / "re"))
    df = spark.read.format("kstore").option("subscribePattern", "t|u").load(d)
    assert rows(df, "topic = 't' AND partition IN (1, 2) AND offset >= 48") == \
        [("t", p, o) for p in (1, 2) for o in (48, 49)]
    assert rows(df, "(partition = 1 OR offset = 3)") == \
        sorted([("t", 0, 3), ("t", 2, 3)] + [("t", 1, o) for o in range(50)])
    assert df.count() == 151


# -- minOffsetsPerTrigger / maxTriggerDelay in a running query ------------------------------------
def run_stream(spark, d, tmp_path, name, **opts):
    r = spark.readStream.format("kstore")
    for k, v in {"subscribe": "t", "startingOffsets": "earliest", "waitForDataMs": "100",
                 **opts}.items():
        r = r.option(k, v)
    return (r.load(d).select("partition", "offset").writeStream.format("parquet")
            .option("path", str(tmp_path / f"{name}-out"))
            .option("checkpointLocation", str(tmp_path / f"{name}-ck")).start())


def batch_sizes(q):
    """(rows, offsets advanced) of each micro-batch with data, from its progress report."""
    out = []
    for p in q.recentProgress:
        if not p["numInputRows"]:
            continue
        src = p["sources"][0]
        s, e = json.loads(src["startOffset"] or "{}"), json.loads(src["endOffset"])
        moved = sum(v - s.get("t", {}).get(k, 0) for k, v in e["t"].items())
        out.append((p["numInputRows"], moved))
    return out


def wait_until(cond, timeout, what):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_streaming_batches_obey_min_and_max_offsets_per_trigger(spark, tmp_path, watchdog):
    """A thread appends 100 records in bursts of 3 while the query runs with
    minOffsetsPerTrigger=20, maxOffsetsPerTrigger=30 (delay 15m, so it never lets a small batch
    through): every micro-batch reads 20 to 30 records; the remainder (< 20) stays unread."""
    watchdog(300)
    d = make_store(str(tmp_path / "s"), n=0)
    q = run_stream(spark, d, tmp_path, "a", minOffsetsPerTrigger="20", maxOffsetsPerTrigger="30")
    try:
        wait_until(lambda: "Waiting" in q.status["message"], 120, "no first trigger")
        with kstore.LogManager(d) as m:
            for i in range(100):
                m.log("t", i % 2).append([(b"k", b"v%d" % i)])
                if i % 3 == 2:
                    time.sleep(0.03)
        wait_until(lambda: sum(n for n, _ in batch_sizes(q)) >= 81, 120,
                   f"fewer than 81 records read: {batch_sizes(q)}")
        time.sleep(1.0)       # any batch that would break the bound has time to show
        sizes = batch_sizes(q)
        assert all(n == moved and 20 <= n <= 30 for n, moved in sizes), sizes
        assert 81 <= sum(n for n, _ in sizes) <= 100
    finally:
        q.stop()
    assert q.exception() is None


def test_streaming_max_trigger_delay_lets_a_small_batch_through(spark, tmp_path, watchdog):
    """minOffsetsPerTrigger=1000 that 5 new records never reach: the batch of 5 runs once
    maxTriggerDelay=2s has passed since the last trigger let through (that it is held back
    until then is asserted with a fake clock above: wall time here only bounds it from above)."""
    watchdog(300)
    d = make_store(str(tmp_path / "s"), n=0)
    q = run_stream(spark, d, tmp_path, "b", minOffsetsPerTrigger="1000", maxTriggerDelay="2s")
    try:
        wait_until(lambda: "Waiting" in q.status["message"], 120, "no first trigger")
        with kstore.LogManager(d) as m:         # one batch of 5: visible all at once
            m.log("t", 0).append([(b"k", b"v%d" % i) for i in range(5)])
        wait_until(lambda: batch_sizes(q), 120, "the small batch never ran")
        time.sleep(0.5)
        assert batch_sizes(q) == [(5, 5)]
    finally:
        q.stop()
    assert q.exception() is None
