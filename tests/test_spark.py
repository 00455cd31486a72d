"""kstore.spark: the `kstore` PySpark data source against a local SparkSession."""
import os
import subprocess
import sys
import time

import pytest

import kstore
from kstore.partitioner import partition_for_key

pytest.importorskip("pyspark")
ks = pytest.importorskip("kstore.spark")
from pyspark.sql import functions as F  # noqa: E402
from pyspark.sql.datasource import (EqualTo, GreaterThanOrEqual, In, IsNotNull,  # noqa: E402
                                    LessThan, Not)
from spark_helpers import make_store  # noqa: E402


def load(spark, path, **opts):
    r = spark.read.format("kstore")
    for k, v in opts.items():
        r = r.option(k, v)
    return r.load(path)


def offsets(df):
    return sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())


# -- batch read --------------------------------------------------------------------------------
def test_read_schema_and_rows(spark, tmp_path):
    d = make_store(str(tmp_path / "s"), n=30)
    df = load(spark, d, subscribe="t")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    rows = sorted(df.collect(), key=lambda r: (r.partition, r.offset))
    assert len(rows) == 60
    r = rows[31]
    assert (bytes(r.key), bytes(r.value), r.topic, r.partition, r.offset, r.timestampType) == \
        (b"k1", b"p1-1", "t", 1, 1, 0)
    assert r.timestamp.timestamp() == 1.0
    assert load(spark, d, subscribe="t", includeHeaders="true").columns[-1] == "headers"
    assert load(spark, d, subscribe="t").rdd.getNumPartitions() == 2


def test_round_trip_write_then_read(spark, tmp_path):
    d = str(tmp_path / "rt")
    rows = [(None if i % 10 == 0 else f"key{i}", f"value{i}",
             [("h", b"%d" % i)] if i % 3 == 0 else None) for i in range(500)]
    df = spark.createDataFrame(rows, "key string, value string, headers array<struct<key:string,value:binary>>")
    (df.repartition(3).write.format("kstore").mode("append").option("topic", "rt")
     .option("kstore.num.partitions", "4").save(d))
    back = load(spark, d, subscribe="rt", includeHeaders="true").collect()
    assert len(back) == 500
    got = {bytes(r.value).decode(): r for r in back}
    for key, value, headers in rows:
        r = got[value]
        assert (bytes(r.key).decode() if r.key is not None else None) == key
        if key is not None:     # Kafka's default partitioner
            assert r.partition == partition_for_key(key.encode(), 4)
        assert ([(h.key, bytes(h.value)) for h in r.headers] if r.headers else None) == headers
    # offsets are dense per partition, and the store reads back with kstore's own API
    with kstore.LogManager(d) as m:
        assert m.partitions("rt") == [0, 1, 2, 3]
        assert sum(m.log("rt", p).log_end_offset for p in range(4)) == 500
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))


def test_write_partition_column_and_topic_column(spark, tmp_path):
    d = str(tmp_path / "w")
    with kstore.LogManager(d) as m:
        m.create_topic("a", 3)
    df = spark.createDataFrame([("a", 2, "x"), ("b", None, "y"), ("a", 0, "z")],
                               "topic string, partition int, value string")
    df.coalesce(1).write.format("kstore").mode("append").save(d)
    got = sorted((r.topic, r.partition, r.offset, bytes(r.value))
                 for r in load(spark, d, subscribePattern="a|b").collect())
    assert got == [("a", 0, 0, b"z"), ("a", 2, 0, b"x"), ("b", 0, 0, b"y")]


def test_failed_write_leaves_no_data(spark, tmp_path, watchdog):
    """A task's error fails the write: nothing reaches the logs, and the staging goes. Spark
    calls the abort without waiting for the job's other tasks (cancelled, they may still be
    staging): what such a task stages after the abort stays, flocked, until it ends, and the
    next write's collector removes it then (once unchanged for staleStagingMs: 0 here). The
    test used to expect no staging at once, and failed so once in a spark tier run under load."""
    from kstore.spark.staging import collect_stale
    d = str(tmp_path / "f")
    with kstore.LogManager(d) as m:
        m.create_topic("t", 2)
    df = spark.createDataFrame([(i, "v") for i in range(100)], "partition int, value string")
    df = df.withColumn("partition", F.when(F.col("partition") == 99, 7).otherwise(F.col("partition") % 2))
    with pytest.raises(Exception, match="partition 7 of topic 't' does not exist"):
        df.repartition(4).write.format("kstore").mode("append").option("topic", "t").save(d)
    with kstore.LogManager(d) as m:
        assert [m.log("t", p).log_end_offset for p in (0, 1)] == [0, 0]
    watchdog(60)
    while os.path.exists(os.path.join(d, ks.STAGING_DIR)):   # a cancelled task still staging
        collect_stale(d, 0)
        time.sleep(0.05)


def test_write_needs_the_store_unlocked_and_append_mode(spark, tmp_path):
    d = str(tmp_path / "l")
    df = spark.createDataFrame([("v",)], "value string")
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
        with pytest.raises(Exception, match="LogDirLockedError|Failed to acquire lock"):
            df.write.format("kstore").mode("append").option("topic", "t").save(d)
        assert m.log("t", 0).log_end_offset == 0
    with pytest.raises(Exception, match="append|UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.write.format("kstore").option("topic", "t").save(d)
    with pytest.raises(Exception, match="no topic|topic option required when no .topic. attribute"):
        df.write.format("kstore").mode("append").save(d)


# -- offset options ------------------------------------------------------------------------------
def test_starting_and_ending_offsets(spark, tmp_path):
    d = make_store(str(tmp_path / "o"))
    df = load(spark, d, subscribe="t", startingOffsets='{"t": {"0": 10, "1": -2}}',
              endingOffsets='{"t": {"0": 20, "1": -1}}')
    assert offsets(df) == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(100)]
    df = load(spark, d, assign='{"t": [1]}', startingOffsets="earliest", endingOffsets="latest")
    assert offsets(df) == [(1, o) for o in range(100)]
    with pytest.raises(Exception, match="latest .* not allowed for batch"):
        load(spark, d, subscribe="t", startingOffsets="latest").collect()
    with pytest.raises(Exception, match="missing: t-1"):
        load(spark, d, subscribe="t", startingOffsets='{"t": {"0": 5}}').collect()
    with pytest.raises(Exception, match="endingOffsets .* missing: t-0"):
        load(spark, d, subscribe="t", endingOffsets='{"t": {"1": 5}}').collect()
    with pytest.raises(Exception, match="starting offset 500 of t-0 is past its log end offset 100"):
        load(spark, d, assign='{"t": [0]}', startingOffsets='{"t": {"0": 500}}').collect()
    assert load(spark, d, assign='{"t": [0]}', startingOffsets='{"t": {"0": 500}}',
                failOnDataLoss="false").count() == 0
    with pytest.raises(Exception, match="exactly one of"):
        load(spark, d, subscribe="t", assign='{"t": [0]}').collect()


def test_timestamp_options_resolve_through_the_time_index(spark, tmp_path):
    d = make_store(str(tmp_path / "ts"))
    df = load(spark, d, subscribe="t", startingTimestamp="50000")
    assert offsets(df) == [(p, o) for p in (0, 1) for o in range(50, 100)]
    df = load(spark, d, subscribe="t", startingOffsetsByTimestamp='{"t": {"0": 90500, "1": 0}}',
              endingOffsetsByTimestamp='{"t": {"0": 1000000, "1": 3000}}')
    assert offsets(df) == [(0, o) for o in range(91, 100)] + [(1, 0), (1, 1), (1, 2)]
    df = load(spark, d, subscribe="t", startingTimestamp="10", endingTimestamp="5000")
    assert offsets(df) == [(p, o) for p in (0, 1) for o in range(1, 5)]
    with pytest.raises(Exception, match="has a timestamp >= 999999999"):
        load(spark, d, subscribe="t", startingTimestamp="999999999").collect()
    df = load(spark, d, subscribe="t", startingTimestamp="999999999",
              startingOffsetsByTimestampStrategy="latest")
    assert df.count() == 0


def test_min_partitions_and_max_records_per_partition_split_ranges(spark, tmp_path):
    d = make_store(str(tmp_path / "m"))
    df = load(spark, d, subscribe="t", minPartitions="6")
    assert df.rdd.getNumPartitions() == 6
    assert offsets(df) == [(p, o) for p in (0, 1) for o in range(100)]
    df = load(spark, d, subscribe="t", maxRecordsPerPartition="30")
    assert df.rdd.getNumPartitions() == 8
    assert offsets(df) == [(p, o) for p in (0, 1) for o in range(100)]


def test_user_schema_other_than_a_subset_is_rejected(spark, tmp_path):
    # a subset of the fixed columns is accepted (tests/test_spark_count.py); other types are not
    d = make_store(str(tmp_path / "u"), n=1)
    with pytest.raises(Exception, match="column 'value' is binary in the kstore source, not string"):
        spark.read.format("kstore").schema("value string").option("subscribe", "t").load(d).collect()


# -- pushdown ------------------------------------------------------------------------------------
def test_pushdown_prunes_partitions_offsets_and_timestamps(tmp_path):
    import datetime as dt
    d = make_store(str(tmp_path / "p"), partitions=3)
    opts = {"path": d, "subscribe": "t", "pushFilters": "true"}

    def plan(*filters):
        r = ks.KStoreDataSource(opts).reader(None)
        rest = list(r.pushFilters(list(filters)))
        return [(x.topic, x.partition, x.start, x.end) for x in r.partitions()], rest

    assert plan()[0] == [("t", p, 0, 100) for p in range(3)]
    ranges, rest = plan(EqualTo(("partition",), 1), GreaterThanOrEqual(("offset",), 7))
    assert ranges == [("t", 1, 7, 100)] and rest == []
    ranges, rest = plan(In(("partition",), (0, 2)), LessThan(("offset",), 5))
    assert ranges == [("t", 0, 0, 5), ("t", 2, 0, 5)] and rest == []
    ts = GreaterThanOrEqual(("timestamp",), dt.datetime(1970, 1, 1, 0, 1, 30, tzinfo=dt.timezone.utc))
    ranges, rest = plan(ts)
    assert ranges == [("t", p, 90, 100) for p in range(3)] and rest == [ts]
    ranges, _ = plan(EqualTo(("topic",), "other"))
    assert ranges == []


def test_pushdown_leaves_not_and_null_checks_to_spark(spark, tmp_path):
    d = make_store(str(tmp_path / "pn"), partitions=3)
    r = ks.KStoreDataSource({"path": d, "subscribe": "t", "pushFilters": "true"}).reader(None)
    filters = [Not(EqualTo(("partition",), 1)), IsNotNull(("offset",))]
    assert list(r.pushFilters(filters)) == filters
    assert len(r.partitions()) == 3
    df = load(spark, d, subscribe="t")
    assert offsets(df.where("NOT (partition = 1)")) == [(p, o) for p in (0, 2) for o in range(100)]


def test_pushdown_in_spark_plans_fewer_tasks(spark, tmp_path):
    d = make_store(str(tmp_path / "ps"), partitions=3)
    df = load(spark, d, subscribe="t", pushFilters="true")
    assert df.rdd.getNumPartitions() == 3
    q = df.where("partition = 1 and offset >= 90")
    assert q.rdd.getNumPartitions() == 1
    assert offsets(q) == [(1, o) for o in range(90, 100)]
    df = load(spark, d, subscribe="t", pushFilters="true")   # one query per DataFrame (4.3)
    q = df.where(F.col("timestamp") >= F.lit("1970-01-01 00:01:35").cast("timestamp"))
    assert offsets(q) == [(p, o) for p in range(3) for o in range(95, 100)]


# -- streaming -----------------------------------------------------------------------------------
def run_available_now(spark, d, out, ckpt, **opts):
    r = spark.readStream.format("kstore")
    for k, v in {"subscribe": "t", "startingOffsets": "earliest", **opts}.items():
        r = r.option(k, v)
    q = (r.load(d).select("partition", "offset", "value").writeStream.format("parquet")
         .option("path", out).option("checkpointLocation", ckpt).trigger(availableNow=True).start())
    q.awaitTermination(180)
    if q.exception():
        raise q.exception()
    return [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]


def test_streaming_available_now_rate_limit_and_restart(spark, tmp_path):
    d = make_store(str(tmp_path / "st"))
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    batches = run_available_now(spark, d, out, ckpt, maxOffsetsPerTrigger="70")
    assert batches == [70, 70, 60]
    with kstore.LogManager(d) as m:
        for i in range(5):
            m.log("t", i % 2).append([(b"new", b"n%d" % i)])
    assert run_available_now(spark, d, out, ckpt, maxOffsetsPerTrigger="70") == [5]
    got = sorted((r.partition, r.offset) for r in spark.read.parquet(out).collect())
    assert got == [(0, o) for o in range(103)] + [(1, o) for o in range(102)]


def test_streaming_data_loss(spark, tmp_path):
    d = make_store(str(tmp_path / "dl"), partitions=1, n=10)
    out, ckpt = str(tmp_path / "out"), str(tmp_path / "ckpt")
    assert run_available_now(spark, d, out, ckpt) == [10]
    with kstore.LogManager(d) as m:
        lg = m.log("t", 0)
        for i in range(10):
            lg.append([(b"k", b"more%d" % i)])
        lg.delete_records(15)          # offsets 10..14 were never read
    with pytest.raises(Exception, match="Some data may have been lost"):
        run_available_now(spark, d, out, ckpt)
    assert run_available_now(spark, d, out, ckpt, failOnDataLoss="false") == [5]
    got = sorted(r.offset for r in spark.read.parquet(out).collect())
    assert got == list(range(10)) + list(range(15, 20))


def test_streaming_sink(spark, tmp_path):
    d = make_store(str(tmp_path / "sk"), n=20)
    q = (spark.readStream.format("kstore").option("subscribe", "t")
         .option("startingOffsets", "earliest").load(d)
         .select("key", F.upper(F.col("value").cast("string")).alias("value"), "partition")
         .writeStream.format("kstore").option("topic", "copy")
         .option("kstore.num.partitions", "2")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start(d))
    q.awaitTermination(180)
    assert q.exception() is None
    with kstore.StoreReader(d) as r:
        for p in (0, 1):
            recs = r.log("copy", p).read(0)
            assert [bytes(x.value) for x in recs] == [b"P%d-%d" % (p, i) for i in range(20)]


# -- beside a running writer ---------------------------------------------------------------------
WRITER = """
import sys, time, kstore
d, stop = sys.argv[1], sys.argv[2]
import os
with kstore.LogManager(d, {"log.segment.bytes": 4096}) as m:
    m.create_topic("live", 2)
    print("ready", flush=True)
    i = 0
    while not os.path.exists(stop):
        m.append("live", b"k%d" % i, b"v" * 50, partition=i % 2)
        i += 1
        if i % 50 == 0:
            time.sleep(0.005)
"""


def test_read_while_another_process_appends(spark, tmp_path):
    d, stop = str(tmp_path / "live"), str(tmp_path / "stop")
    p = subprocess.Popen([sys.executable, "-c", WRITER, d, stop], stdout=subprocess.PIPE,
                         cwd=str(tmp_path))
    try:
        assert p.stdout.readline().strip() == b"ready"
        time.sleep(0.5)
        counts = []
        for _ in range(3):
            got = offsets(load(spark, d, subscribe="live"))
            for part in (0, 1):
                offs = [o for q, o in got if q == part]
                assert offs == list(range(len(offs)))        # a prefix: nothing torn or skipped
            counts.append(len(got))
        assert counts[0] > 0 and counts == sorted(counts)
    finally:
        open(stop, "w").close()
        p.wait(30)
    assert p.returncode == 0


def test_a_task_with_fail_on_data_loss_false_reads_on_past_offsets_retention_removed(tmp_path, monkeypatch):
    """DeleteRecords lands while a task reads its range (after its start was resolved): with
    failOnDataLoss=false the task goes on from the new log start to the end of its range,
    never dropping records that still exist (no Spark session: the task function itself)."""
    import kstore.spark.read as read_mod
    from kstore.spark.options import ReadOptions
    d = str(tmp_path)
    with kstore.LogManager(d, {"log.segment.bytes": "400"}) as m:
        m.create_topic("t", 1)
        for i in range(60):
            m.append("t", None, b"%d" % i, partition=0)
        cut = m.log("t", 0).segments[2].base_offset
    real = read_mod.iter_batches
    calls = []

    def deleted_first(lg, topic, partition, start, stop, **kw):
        if not calls:                     # retention moves the start before the task's first read
            with kstore.LogManager(d) as w:
                w.log("t", 0).delete_records(cut)
        calls.append(start)
        return real(lg, topic, partition, start, stop, **kw)
    monkeypatch.setattr(read_mod, "iter_batches", deleted_first)
    opts = ReadOptions.parse({"path": d, "subscribe": "t", "failOnDataLoss": "false"}, streaming=False)
    got = [o for b in read_mod.read_range(opts, read_mod.KStoreRange("t", 0, 0, 50))
           for o in b.column("offset").to_pylist()]
    assert calls == [0, cut]
    assert got == list(range(cut, 50))


def test_stream_latest_offset_waits_for_new_data_instead_of_returning_at_once(tmp_path, watchdog):
    """latestOffset with nothing new waits (up to waitForDataMs) on the partitions'
    notification words: an append by another thread ends the wait with its offsets; with
    nothing appended it returns the same offsets once the wait is over. No SparkSession needed."""
    import threading
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    from kstore.spark.options import ReadOptions
    from kstore.spark.read import KStoreStreamReader
    from thread_watchdog import join_all
    watchdog(120)
    d = make_store(str(tmp_path / "w"), partitions=2, n=3)
    with kstore.LogManager(d) as m:
        opts = ReadOptions.parse({"path": d, "subscribe": "t", "startingOffsets": "latest",
                                  "waitForDataMs": "30000"}, streaming=True)
        assert opts.wait_for_data_ms == 30000
        r = KStoreStreamReader(opts)
        try:
            start = r.initialOffset()
            assert start == {"t": {"0": 3, "1": 3}}
            t = threading.Thread(target=lambda: (time.sleep(0.2), m.log("t", 1).append([(b"k", b"v")])))
            t.start()
            t0 = time.monotonic()
            assert r.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 3, "1": 4}}
            assert time.monotonic() - t0 < 30
            join_all([t], 30)
            # no wait when there is news already; a short wait with none returns the same offsets
            assert r.latestOffset(start, ReadAllAvailable()) == {"t": {"0": 3, "1": 4}}
            r.opts.wait_for_data_ms = 50
            end = {"t": {"0": 3, "1": 4}}
            assert r.latestOffset(end, ReadAllAvailable()) == end
        finally:
            r.stop()
    off = ReadOptions.parse({"path": d, "subscribe": "t", "waitForDataMs": "0"}, streaming=True)
    assert off.wait_for_data_ms == 0
    assert ReadOptions.parse({"path": d, "subscribe": "t"}, streaming=True).wait_for_data_ms == 500


def _stream_batch(r, start):
    """One micro-batch of a KStoreStreamReader as Spark runs it (no SparkSession): the end,
    the planned ranges and the (offset, value) rows its tasks read."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable
    end = r.latestOffset(start, ReadAllAvailable())
    parts = r.partitions(start, end)
    rows = [(o, v) for p in parts for b in r.read(p)
            for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist())]
    return end, [(p.start, p.end) for p in parts], rows


@pytest.mark.parametrize("fail_on_data_loss", ["true", "false"])
def test_a_stream_past_a_truncation_reads_what_was_appended_again(tmp_path, caplog, fail_on_data_loss):
    """A streaming query read t-0 to 10; the log was cut to 5 and 8 records appended again
    (5..12, leader epoch 1). Its next batch began at 10: the new 5..9 were never read. Now the
    cut is found by the epoch of the record before 10 (0, ending at 5): failOnDataLoss=true
    fails the batch (the records read at 5..9 are gone), false reads from 5, logged."""
    import logging
    from kstore.spark.options import ReadOptions
    from kstore.spark.read import KStoreStreamReader
    d = make_store(str(tmp_path / "s"), partitions=1, n=10)
    opts = ReadOptions.parse({"path": d, "subscribe": "t", "startingOffsets": "earliest",
                              "failOnDataLoss": fail_on_data_loss, "waitForDataMs": "0"},
                             streaming=True)
    r = KStoreStreamReader(opts)
    try:
        end, ranges, rows = _stream_batch(r, r.initialOffset())
        assert end == {"t": {"0": 10}} and ranges == [(0, 10)] and len(rows) == 10
        with kstore.LogManager(d) as m:
            lg = m.log("t", 0)
            assert lg.truncate_to(5)
            for i in range(8):
                lg.append([(b"k", b"new%d" % i)])
        if fail_on_data_loss == "true":
            with pytest.raises(kstore.DataLossError, match=r"^t-0 was truncated below offset 10, "
                               r"which the query had read up to: leader epoch 0 ends at 5\. Some "
                               r"data may have been lost"):
                _stream_batch(r, end)
            return
        with caplog.at_level(logging.WARNING, "kstore.spark"):
            back, ranges, rows = _stream_batch(r, end)     # latestOffset goes back to the cut
        assert (back, ranges, rows) == ({"t": {"0": 5}}, [], [])
        assert [x.getMessage() for x in caplog.records if x.name == "kstore.spark"] == [
            "t-0 was truncated below offset 10, which the query had read up to: leader epoch 0 "
            "ends at 5; reading it again from 5 (failOnDataLoss=false)"]
        end2, ranges, rows = _stream_batch(r, back)
        assert end2 == {"t": {"0": 13}} and ranges == [(5, 13)]
        assert rows == [(5 + i, b"new%d" % i) for i in range(8)]
        with kstore.LogManager(d) as m:          # no cut since: no check fires
            m.log("t", 0).append([(b"k", b"more")])
        end3, ranges, rows = _stream_batch(r, end2)
        assert (end3, ranges, rows) == ({"t": {"0": 14}}, [(13, 14)], [(13, b"more")])
        # a cut between latestOffset and the planning: the range stops at the log end (14),
        # and the next batch, which Spark starts at the planned end (17), goes back to 14
        with kstore.LogManager(d) as m:
            m.log("t", 0).append([(b"k", b"x%d" % i) for i in range(3)])
        from pyspark.sql.streaming.datasource import ReadAllAvailable
        end4 = r.latestOffset(end3, ReadAllAvailable())
        assert end4 == {"t": {"0": 17}}
        with kstore.LogManager(d) as m:
            assert m.log("t", 0).truncate_to(14)
        assert [(p.start, p.end) for p in r.partitions(end3, end4)] == []
        with kstore.LogManager(d) as m:
            m.log("t", 0).append([(b"k", b"y%d" % i) for i in range(4)])
        caplog.clear()
        with caplog.at_level(logging.WARNING, "kstore.spark"):
            assert _stream_batch(r, end4) == ({"t": {"0": 14}}, [], [])
        assert [x.getMessage() for x in caplog.records if x.name == "kstore.spark"] == [
            "t-0: offsets 14..16 were cut before the batch that planned them read them; reading "
            "from 14 (failOnDataLoss=false)"]
        assert _stream_batch(r, {"t": {"0": 14}})[1:] == ([(14, 18)], [(14 + i, b"y%d" % i) for i in range(4)])
    finally:
        r.stop()


@pytest.mark.parametrize("change", ["cut regrown to the same end", "deleted and created again"])
def test_a_stream_with_nothing_new_after_a_change_under_it_reads_again(tmp_path, caplog, change):
    """Read to 10; then the log was cut to 5 and grew back to exactly 10 (or the topic was
    deleted and created again with 10 records): nothing looks new, but latestOffset returns the
    cut (or the new log's start) as the end, so Spark plans a batch (an end equal to the start
    plans none), which reports it (failOnDataLoss=true fails, false logs), and the next batch
    reads the new records instead of none of them."""
    import logging
    from kstore.spark.options import ReadOptions
    from kstore.spark.read import KStoreStreamReader
    for fail in ("true", "false"):
        d = make_store(str(tmp_path / fail), partitions=1, n=10)
        opts = ReadOptions.parse({"path": d, "subscribe": "t", "startingOffsets": "earliest",
                                  "failOnDataLoss": fail, "waitForDataMs": "0"}, streaming=True)
        r = KStoreStreamReader(opts)
        try:
            end, _ranges, rows = _stream_batch(r, r.initialOffset())
            assert end == {"t": {"0": 10}} and len(rows) == 10
            with kstore.LogManager(d) as m:
                if change == "deleted and created again":
                    m.delete_topic("t")
                    m.create_topic("t", 1)
                    lg = m.log("t", 0)
                    lg.append([(b"k", b"%s%d" % (fail.encode(), i)) for i in range(10)])
                    back, news = 0, ("t-0 was deleted and created again since the query read it "
                                     "up to 10; reading the new one from its start 0")
                else:
                    lg = m.log("t", 0)
                    lg.truncate_to(5)
                    lg.append([(b"k", b"%s%d" % (fail.encode(), i)) for i in range(5, 10)])
                    back, news = 5, ("t-0 was truncated below offset 10, which the query had "
                                     "read up to: leader epoch 0 ends at 5; reading it again "
                                     "from 5")
                final = [(x.offset, x.value) for x in lg.read(0, 100, 1 << 20)]
            from pyspark.sql.streaming.datasource import ReadAllAvailable
            assert r.latestOffset(end, ReadAllAvailable()) == {"t": {"0": back}}
            if fail == "true":
                with pytest.raises(kstore.DataLossError, match="^" + news.split("; reading")[0]
                                   + r"\. Some data may have been lost"):
                    _stream_batch(r, end)
                continue
            caplog.clear()
            with caplog.at_level(logging.WARNING, "kstore.spark"):
                assert _stream_batch(r, end) == ({"t": {"0": back}}, [], [])
            assert [x.getMessage() for x in caplog.records if x.name == "kstore.spark"] == [
                news + " (failOnDataLoss=false)"]
            end2, ranges, rows = _stream_batch(r, {"t": {"0": back}})
            assert end2 == {"t": {"0": 10}} and ranges == [(back, 10)] and rows == final[back:]
        finally:
            r.stop()


def test_a_stream_beside_a_thread_cutting_its_log_misses_nothing(tmp_path, watchdog):
    """A writer thread appends to t-0 and cuts its tail now and then (a new leader epoch each
    time) while a stream reader (failOnDataLoss=false) runs micro-batches: at the end, for every
    offset of the final log, the last value the stream read there is the final one (nothing
    appended again below a batch's start was skipped)."""
    import random
    import threading
    from kstore.spark.options import ReadOptions
    from kstore.spark.read import KStoreStreamReader
    from thread_watchdog import join_all
    watchdog(120)
    d = str(tmp_path / "s")
    rng = random.Random(5)
    with kstore.LogManager(d, {"log.segment.bytes": 4096}) as m:
        m.create_topic("t", 1)
        lg = m.log("t", 0)
        stop = threading.Event()
        cuts = [0]

        def write():
            n = 0
            while not stop.is_set():
                if rng.random() < 0.1 and lg.log_end_offset > 5:
                    lg.truncate_to(lg.log_end_offset - rng.randint(1, 5))
                    cuts[0] += 1
                else:
                    lg.append([(b"k", b"v%d" % n) for _ in range(rng.randint(1, 3))])
                    n += 1
                time.sleep(0.001)
        opts = ReadOptions.parse({"path": d, "subscribe": "t", "startingOffsets": "earliest",
                                  "failOnDataLoss": "false", "waitForDataMs": "10"},
                                 streaming=True)
        r = KStoreStreamReader(opts)
        last: dict = {}
        th = threading.Thread(target=write)
        th.start()
        try:
            start = r.initialOffset()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                start, _ranges, rows = _stream_batch(r, start)
                last.update(rows)
            stop.set()
            join_all([th], 30)
            for _ in range(3):               # the batches after the last cut
                start, _ranges, rows = _stream_batch(r, start)
                last.update(rows)
        finally:
            stop.set()
            join_all([th], 30)
            r.stop()
        final = {rec.offset: rec.value for rec in lg.read(0, 1 << 30, 1 << 30)}
    assert cuts[0] > 20 and len(final) > 200
    assert {o: last.get(o) for o in final} == final


def test_a_cut_while_a_batch_is_planned_moves_its_start_back(tmp_path, caplog, monkeypatch):
    """The window inside partitions(): its start (10) was checked, then the log is cut to 5 and
    regrown to 20 before the end's epoch is read (from the new records, epoch 1). The start is
    checked again after that read, so the range begins at 5, reported; the old order would
    plan [10, 20) marked with epoch 1 and never read the new 5..9."""
    import logging
    from kstore.spark import stream_cuts
    from kstore.spark.options import ReadOptions
    from kstore.spark.read import KStoreStreamReader
    d = make_store(str(tmp_path / "s"), partitions=1, n=10)
    opts = ReadOptions.parse({"path": d, "subscribe": "t", "startingOffsets": "earliest",
                              "failOnDataLoss": "false", "waitForDataMs": "0"}, streaming=True)
    r = KStoreStreamReader(opts)
    try:
        end, _ranges, rows = _stream_batch(r, r.initialOffset())
        assert end == {"t": {"0": 10}} and len(rows) == 10
        with kstore.LogManager(d) as m:
            m.log("t", 0).append([(b"k", b"old%d" % i) for i in range(10, 15)])
        from pyspark.sql.streaming.datasource import ReadAllAvailable
        end2 = r.latestOffset(end, ReadAllAvailable())
        assert end2 == {"t": {"0": 15}}
        real = stream_cuts.StreamCuts._epoch_before

        def cut_first(store, tp, offset):
            with kstore.LogManager(d) as m:
                lg = m.log("t", 0)
                lg.truncate_to(5)
                lg.append([(b"k", b"new%d" % i) for i in range(5, 20)])
            store.log(*tp, refresh=True)
            return real(store, tp, offset)
        monkeypatch.setattr(stream_cuts.StreamCuts, "_epoch_before", staticmethod(cut_first))
        with caplog.at_level(logging.WARNING, "kstore.spark"):
            parts = r.partitions(end, end2)
        monkeypatch.setattr(stream_cuts.StreamCuts, "_epoch_before", staticmethod(real))
        assert [(p.start, p.end) for p in parts] == [(5, 15)]
        assert [x.getMessage() for x in caplog.records if x.name == "kstore.spark"] == [
            "t-0 was truncated below offset 10 while the batch was planned: leader epoch 0 ends "
            "at 5; reading it again from 5 (failOnDataLoss=false)"]
        rows = [(o, v) for p in parts for b in r.read(p)
                for o, v in zip(b.column("offset").to_pylist(), b.column("value").to_pylist())]
        assert rows == [(o, b"new%d" % o) for o in range(5, 15)]
        assert _stream_batch(r, end2)[1:] == ([(15, 20)], [(o, b"new%d" % o) for o in range(15, 20)])
    finally:
        r.stop()
