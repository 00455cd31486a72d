"""kstore.spark's sink contract (issue 17 defects 2, 3, 4, 6, 7): staging found and removed by
the commit and stale staging collected (never a live job's); a failed commit creates no topic;
the commit waits for the store's lock with a bound and names its holder; extra columns are
ignored and the input schema is checked when the write is planned, as Spark's Kafka sink."""
import contextlib
import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest

import kstore

pytest.importorskip("pyspark")
ks = pytest.importorskip("kstore.spark")
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType,  # noqa: E402
                               StringType, StructField, StructType, TimestampType)
from kstore.spark import staging  # noqa: E402

HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def schema(*cols):
    return StructType([StructField(n, t) for n, t in cols])


def plan(d, sch=None, **opts):
    o = {"path": d, "topic": "t"}
    o.update(opts)
    return ks.WriteOptions.parse(o, sch or schema(("value", BinaryType())))


def batch(n, start=0):
    return pa.record_batch([pa.array([b"k%d" % i for i in range(start, start + n)]),
                            pa.array([b"v%d" % i for i in range(start, start + n)])],
                           names=["key", "value"])


def read_all(d, topic):
    with kstore.StoreReader(d) as r:
        return sorted((p, x.offset, bytes(x.value)) for t, p in r.partitions() if t == topic
                      for x in r.log(t, p).read(0))


def run(script, *args, timeout=60):
    return subprocess.Popen([sys.executable, "-P", "-c", script, *args], stdout=subprocess.PIPE,
                            stdin=subprocess.PIPE, text=True)


# -- defect 7 and 6: the input schema, checked at planning, extra columns ignored ---------------
@pytest.mark.parametrize("cols,message", [
    ([("value", BinaryType()), ("partition", LongType())],
     "partition attribute unsupported type bigint. partition must be a(n) int"),
    ([("value", BinaryType()), ("partition", StringType())],
     "partition attribute unsupported type string. partition must be a(n) int"),
    ([("value", IntegerType())], "value attribute unsupported type int. value must be a(n) string or binary"),
    ([("key", LongType()), ("value", StringType())],
     "key attribute unsupported type bigint. key must be a(n) string or binary"),
    ([("value", BinaryType()), ("headers", ArrayType(StringType()))],
     "headers attribute unsupported type array<string>. headers must be a(n) "
     "array<struct<key:string,value:binary>>"),
    ([("key", BinaryType())], "Required attribute 'value' not found"),
])
def test_input_schema_is_checked_when_the_write_is_planned(tmp_path, cols, message):
    with pytest.raises(kstore.errors.InvalidConfigError) as e:
        plan(str(tmp_path), schema(*cols))
    assert str(e.value) == message
    assert not os.path.exists(tmp_path / ks.STAGING_DIR)


def test_topic_column_rules_and_extra_columns(tmp_path):
    d = str(tmp_path)
    no_topic = {"path": d}
    with pytest.raises(kstore.errors.InvalidConfigError, match="topic option required when no 'topic'"):
        ks.WriteOptions.parse(no_topic, schema(("value", BinaryType())))
    with pytest.raises(kstore.errors.InvalidConfigError,
                       match=r"topic attribute unsupported type int\. topic must be a\(n\) string"):
        ks.WriteOptions.parse(no_topic, schema(("value", BinaryType()), ("topic", IntegerType())))
    # the option wins: the column is not used, whatever its type (as Kafka's sink)
    wo = plan(d, schema(("value", BinaryType()), ("topic", IntegerType())))
    assert wo.columns == ["value"]
    # a DataFrame read from kstore, as it is: offset, timestampType... ignored; timestamp used
    read_back = schema(("key", BinaryType()), ("value", BinaryType()), ("topic", StringType()),
                       ("partition", IntegerType()), ("offset", LongType()),
                       ("timestamp", TimestampType()), ("timestampType", IntegerType()),
                       ("headers", HEADERS), ("extra", StringType()))
    assert plan(d, read_back).columns == ["key", "value", "partition", "timestamp", "headers"]
    assert ks.WriteOptions.parse({"path": d}, read_back).columns == \
        ["key", "value", "topic", "partition", "timestamp", "headers"]
    # a `timestamp` that is no timestamp is an extra column like any other
    assert plan(d, schema(("value", StringType()), ("timestamp", StringType()))).columns == ["value"]


def test_options_unknown_refused_kafka_accepted(tmp_path):
    with pytest.raises(kstore.errors.InvalidConfigError, match=r"unknown option\(s\) \['lockimeoutms'\]"):
        plan(str(tmp_path), lockImeoutMs="10")
    wo = plan(str(tmp_path), **{"kafka.bootstrap.servers": "h:9092", "checkpointLocation": "/x",
                                "lockTimeoutMs": "250", "staleStagingMs": "0"})
    assert (wo.lock_timeout_ms, wo.stale_staging_ms) == (250, 0)
    with pytest.raises(kstore.errors.InvalidConfigError, match="lockTimeoutMs|locktimeoutms"):
        plan(str(tmp_path), lockTimeoutMs="soon")


# -- defect 2: staging found by the commit, stale staging collected -----------------------------
def test_commit_removes_exactly_its_staging_even_from_a_fresh_writer(tmp_path):
    d = str(tmp_path)
    wo = plan(d)
    msgs = [ks.stage_batches(wo, iter([batch(10, 10 * i)])) for i in range(3)]
    assert all(m.staging == wo.staging for m in msgs)
    assert len(os.listdir(wo.staging)) == 3
    # the streaming commit runs in a writer PySpark builds afresh: another planned id
    fresh = plan(d)
    assert fresh.staging != wo.staging
    assert ks.commit_staged(fresh, msgs) == 30
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))
    assert read_all(d, "t") == [(0, i, b"v%d" % i) for i in range(30)]


STAGER = r"""
import sys, pyarrow as pa, kstore.spark as ks
from kstore.spark.write import _Stager
wo = ks.WriteOptions.parse({"path": sys.argv[1], "topic": "t"},
                           __import__("pyspark.sql.types", fromlist=["x"]).StructType.fromJson(
                               {"type": "struct", "fields": [{"name": "value", "type": "binary",
                                "nullable": True, "metadata": {}}]}))
st = _Stager(wo, "other-job")
st.add(pa.record_batch([pa.array([b"a", b"b"])], names=["value"]))
print(wo.staging, flush=True)
sys.stdin.readline()                       # a long task: still staging
st.add(pa.record_batch([pa.array([b"c"])], names=["value"]))
msg = st.finish()
print(ks.commit_staged(wo, [msg]), flush=True)
"""


def test_stale_staging_is_collected_but_never_a_live_jobs(tmp_path, watchdog):
    watchdog(120)
    d = str(tmp_path)
    kstore.LogManager(d).close()
    other = run(STAGER, d)
    try:
        live = other.stdout.readline().strip()
        assert os.path.isdir(live)
        root = os.path.join(d, ks.STAGING_DIR)
        old = int(time.time() * 1000) - 10_000
        # a dead task's staging (its lock released at death), and one of a driver gone before
        # its commit: old and unlocked
        dead = os.path.join(root, "w-dead")
        os.makedirs(dead)
        with open(os.path.join(dead, "p0-a0-x-0.batches"), "wb") as f:
            f.write(b"x" * 100)
        fresh = os.path.join(root, "q-fresh-b3")   # finished tasks awaiting their commit
        os.makedirs(fresh)
        for p in (live, dead, os.path.join(dead, "p0-a0-x-0.batches")):
            os.utime(p, ns=(old * 1_000_000,) * 2)
        for f in os.listdir(live):
            os.utime(os.path.join(live, f), ns=(old * 1_000_000,) * 2)
        # a second job plans with a 5 s bound: removes only the dead one
        assert staging.collect_stale(d, 5000) == ["w-dead"]
        assert sorted(os.listdir(root)) == sorted([os.path.basename(live), "q-fresh-b3"])
        # even with a 0 bound the live job's staging stays: its task holds the lock
        assert staging.collect_stale(d, 0) == ["q-fresh-b3"]
        assert os.listdir(root) == [os.path.basename(live)]
        out, _ = other.communicate("go\n", timeout=60)
        assert out.strip() == "3" and other.returncode == 0
    finally:
        if other.poll() is None:
            other.kill()
            other.wait(10)
    assert read_all(d, "t") == [(0, 0, b"a"), (0, 1, b"b"), (0, 2, b"c")]
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))


def test_a_commit_whose_staging_was_collected_appends_nothing(tmp_path):
    d = str(tmp_path)
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
    wo = plan(d)
    a = ks.stage_batches(wo, iter([batch(5)]))
    b = ks.stage_batches(wo, iter([batch(5, 5)]))
    os.unlink(b.staged[0].path)
    with pytest.raises(kstore.KStoreError, match=f"staged file {b.staged[0].path} .* is gone"):
        ks.commit_staged(wo, [a, b])
    assert read_all(d, "t") == []
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))


# -- defect 3: a failed commit leaves no topic ---------------------------------------------------
def test_a_failed_commit_creates_no_topic(tmp_path):
    d = str(tmp_path)
    with kstore.LogManager(d) as m:
        m.create_topic("old", 1)
    wo = ks.WriteOptions.parse({"path": d}, schema(("topic", StringType()), ("value", BinaryType())))
    good = pa.record_batch([pa.array(["old"] * 3), pa.array([b"a", b"b", b"c"])], names=["topic", "value"])
    new = pa.record_batch([pa.array(["new"] * 2), pa.array([b"x", b"y"])], names=["topic", "value"])
    m1 = ks.stage_batches(wo, iter([good]))
    m2 = ks.stage_batches(wo, iter([new]))
    with open(m2.staged[0].path, "r+b") as f:        # a staged batch torn on its way
        f.seek(20)
        f.write(b"\xff\xff\xff\xff")
    with pytest.raises(kstore.CorruptRecordError):
        ks.commit_staged(wo, [m1, m2])
    with kstore.LogManager(d) as m:
        assert m.topics() == ["old"]
        assert m.log("old", 0).log_end_offset == 3        # at least once: what landed stays
    with kstore.StoreReader(d) as r:
        assert [t for t, _p in r.partitions()] == ["old"]
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))


# -- defect 4: the commit waits for the store's lock, bounded, naming the holder -----------------
HOLDER = r"""
import sys, time, kstore
m = kstore.LogManager(sys.argv[1])
print("held", flush=True)
if sys.argv[2] == "forever":
    sys.stdin.readline()
else:
    time.sleep(float(sys.argv[2]))
m.close()
"""


@contextlib.contextmanager
def staged_while_held(d, hold, lock_timeout_ms):
    """Topic t, 4 records staged for it, and another process holding the store's lock for
    `hold` seconds (or until told, "forever"): yields (write options, message, holder)."""
    with kstore.LogManager(d) as m:
        m.create_topic("t", 1)
    wo = plan(d, lockTimeoutMs=lock_timeout_ms)
    msg = ks.stage_batches(wo, iter([batch(4)]))
    holder = run(HOLDER, d, hold)
    try:
        assert holder.stdout.readline().strip() == "held"
        yield wo, msg, holder
    finally:
        if holder.poll() is None:
            holder.communicate("\n", timeout=30)


def test_commit_retries_while_an_application_holds_the_store_briefly(tmp_path, watchdog):
    watchdog(120)
    d = str(tmp_path)
    with staged_while_held(d, "0.5", "20000") as (wo, msg, holder):
        t0 = time.monotonic()
        assert ks.commit_staged(wo, [msg]) == 4
        assert time.monotonic() - t0 < 20
        assert holder.wait(30) == 0
    assert [v for _p, _o, v in read_all(d, "t")] == [b"v0", b"v1", b"v2", b"v3"]


def test_commit_fails_within_the_bound_naming_the_holder(tmp_path, watchdog):
    watchdog(120)
    d = str(tmp_path)
    with staged_while_held(d, "forever", "1000") as (wo, msg, holder):
        t0 = time.monotonic()
        with pytest.raises(kstore.LogDirLockedError) as e:
            ks.commit_staged(wo, [msg])
        waited = time.monotonic() - t0
        assert 1.0 <= waited < 30
        assert f"held by pid {holder.pid} on " in str(e.value)
        assert "lockTimeoutMs=1000" in str(e.value)
    assert read_all(d, "t") == []
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))


# -- in Spark ------------------------------------------------------------------------------------
@pytest.mark.spark
def test_spark_round_trip_of_a_dataframe_read_from_kstore(spark, tmp_path):
    d = str(tmp_path / "rt")
    with kstore.LogManager(d) as m:
        m.create_topic("src", 2)
        m.create_topic("dst", 2)
        for p in range(2):
            m.log("src", p).append([(b"k%d" % i, b"v%d-%d" % (p, i), 1000 * i, [("h", b"%d" % i)])
                                    for i in range(20)])
    df = spark.read.format("kstore").option("subscribe", "src").option("includeHeaders", "true").load(d)
    df.write.format("kstore").mode("append").option("topic", "dst").save(d)
    with kstore.StoreReader(d) as r:
        for p in range(2):
            got = [(x.offset, x.key, x.value, x.timestamp, list(x.headers)) for x in r.log("dst", p).read(0)]
            assert [(o, bytes(k), bytes(v), ts, [(hk, bytes(hv)) for hk, hv in h])
                    for o, k, v, ts, h in got] == \
                [(i, b"k%d" % i, b"v%d-%d" % (p, i), 1000 * i, [("h", b"%d" % i)]) for i in range(20)]
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))


@pytest.mark.spark
def test_spark_refuses_a_bad_schema_before_any_task_runs(spark, tmp_path):
    d = str(tmp_path / "bad")
    df = spark.createDataFrame([(1, "v")], "partition long, value string")
    with pytest.raises(Exception, match=r"partition attribute unsupported type bigint"):
        df.write.format("kstore").mode("append").option("topic", "t").save(d)
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))


@pytest.mark.spark
def test_spark_streaming_sink_leaves_no_staging(spark, tmp_path):
    d = str(tmp_path / "ss")
    with kstore.LogManager(d) as m:
        m.create_topic("in", 2)
        for p in range(2):
            m.log("in", p).append([(b"k%d" % i, b"p%d-%d" % (p, i), 0) for i in range(30)])
    q = (spark.readStream.format("kstore").option("subscribe", "in")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "20").load(d)
         .select("key", "value", "partition", "offset")
         .writeStream.format("kstore").option("topic", "out").option("kstore.num.partitions", "2")
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start(d))
    q.awaitTermination(180)
    assert q.exception() is None
    assert len(q.recentProgress) >= 3                   # several micro-batches, several commits
    assert read_all(d, "out") == read_all(d, "in")
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))


@pytest.mark.spark
def test_spark_two_concurrent_writes_both_land(spark, tmp_path, watchdog):
    """Two jobs writing at once: each one's planning collects stale staging, never the other's."""
    import threading

    from thread_watchdog import join_all
    watchdog(300)
    d = str(tmp_path / "cc")
    kstore.LogManager(d).close()
    errors = []

    def job(topic):
        try:
            # a Python thread is a new JVM thread: without the active session Spark does not
            # find the registered Python data source there
            spark._jvm.org.apache.spark.sql.SparkSession.setActiveSession(spark._jsparkSession)
            df = spark.range(2000).selectExpr("cast(id as string) AS key", "cast(id as string) AS value")
            df.repartition(4).write.format("kstore").mode("append").option("topic", topic).save(d)
        except Exception as e:           # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=job, args=(t,)) for t in ("a", "b")]
    for t in threads:
        t.start()
    join_all(threads, 240)
    assert errors == []
    for topic in ("a", "b"):
        assert sorted(int(v) for _p, _o, v in read_all(d, topic)) == list(range(2000))
    assert not os.path.exists(os.path.join(d, ks.STAGING_DIR))
