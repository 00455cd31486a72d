"""The driver of tests/test_spark_cluster.py, run as its own process (one SparkSession on the
standalone cluster, apart from the suite's local[2] session): runs every case and writes
{case: result} as JSON to argv[3]. Usage: cluster_driver.py MASTER_URL BASE OUT."""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import kstore
from kstore.spark import register

MASTER, BASE, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
STORE = os.path.join(BASE, "mnt", "shared", "store")        # shared: every node sees it
MASKED = os.path.join(BASE, "mnt", "shared", "masked")      # an empty dir on every worker
LOCAL = os.path.join(BASE, "mnt", "local", "store")         # absent on every worker
CKPT = os.path.join(BASE, "mnt", "shared", "ckpt")
STAGING = os.path.join(STORE, ".kstore-staging")


def fill(path: str, topic: str, n: int, start: int = 0, partitions: int = 2) -> None:
    """n records, round robin over the partitions: key k<i>, value v<i> (i from start)."""
    with kstore.LogManager(path) as m:
        if topic not in m.topics():
            m.create_topic(topic, partitions)
        for p in range(partitions):
            m.append_batch(topic, p, [(b"k%d" % i, b"v%d" % i)
                                      for i in range(start, start + n) if i % partitions == p])


def rows(df) -> list:
    return sorted((r.partition, r.offset, bytes(r.value).decode())
                  for r in df.select("partition", "offset", "value").collect())


def staging_left() -> list:
    return sorted(os.listdir(STAGING)) if os.path.isdir(STAGING) else []


def main() -> None:
    from pyspark.sql import SparkSession
    spark = (SparkSession.builder.master(MASTER).appName("kstore-cluster-test")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.executor.memory", "512m")
             .config("spark.executor.cores", "1")
             .config("spark.cores.max", "2")
             .config("spark.task.maxFailures", "1")
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.executorEnv.PYTHONPATH", os.environ.get("PYTHONPATH", ""))
             .config("spark.executorEnv.PYTHONSAFEPATH", "1")
             .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .config("spark.executor.extraJavaOptions", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    res: dict = {}

    def case(name):
        def wrap(fn):
            t0 = time.monotonic()
            try:
                res[name] = {"ok": True, **fn()}
            except Exception as e:          # the test module asserts on what happened
                res[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                             "trace": traceback.format_exc()[-4000:]}
            res[name]["secs"] = round(time.monotonic() - t0, 1)
            with open(OUT, "w") as f:
                json.dump(res, f)
            return fn
        return wrap

    def load(path, **opts):
        r = spark.read.format("kstore")
        for k, v in opts.items():
            r = r.option(k, v)
        return r.load(path)

    @case("hosts")
    def _hosts():
        import socket
        sc = spark.sparkContext
        return {"hosts": sorted(set(sc.parallelize(range(8), 8)
                                    .map(lambda _: socket.gethostname()).collect())),
                "kstore": sc.parallelize([0], 1).map(lambda _: kstore.__file__).collect()[0]}

    @case("batch_read")
    def _batch_read():
        fill(STORE, "r", 1000)
        return {"rows": rows(load(STORE, subscribe="r")),
                "split": rows(load(STORE, subscribe="r", minPartitions="6"))}

    @case("stream_read_restart")
    def _stream_read():
        fill(STORE, "s", 600)

        def run():
            got: list = []
            q = (spark.readStream.format("kstore").option("subscribe", "s")
                 .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "250")
                 .load(STORE).writeStream
                 .foreachBatch(lambda df, _batch: got.extend(rows(df)))
                 .option("checkpointLocation", os.path.join(CKPT, "s"))
                 .trigger(availableNow=True).start())
            q.awaitTermination(240)
            q.stop()
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            return sorted(got)

        first = run()
        fill(STORE, "s", 400, start=600)
        second = run()          # restarted from the checkpoint on the shared path
        third = run()
        return {"first": first, "second": second, "third": third}

    @case("batch_write")
    def _batch_write():
        df = spark.range(0, 500, 1, 4).selectExpr("CAST(id AS STRING) AS key",
                                                  "CONCAT('w', CAST(id AS STRING)) AS value")
        df.write.format("kstore").mode("append").option("topic", "w").save(STORE)
        return {"rows": rows(load(STORE, subscribe="w")), "staging": staging_left()}

    @case("stream_write")
    def _stream_write():
        def run():
            q = (spark.readStream.format("kstore").option("subscribe", "r")
                 .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "400")
                 .load(STORE).select("key", "value").writeStream.format("kstore")
                 .option("topic", "w2").option("checkpointLocation", os.path.join(CKPT, "w2"))
                 .trigger(availableNow=True).start(STORE))
            q.awaitTermination(240)
            q.stop()
            return sorted(bytes(r.value).decode() for r in load(STORE, subscribe="w2")
                          .select("value").collect())

        first = run()
        fill(STORE, "r", 100, start=1000)
        second = run()
        return {"first": first, "second": second, "staging": staging_left()}

    def failure(fn):
        try:
            got = fn()
        except Exception as e:
            return {"failed": True, "error": f"{type(e).__name__}: {e}"[-6000:]}
        return {"failed": False, "got": got}

    @case("masked")
    def _masked():
        fill(MASKED, "m", 1000)
        out = {}
        for fodl in ("true", "false"):
            out[f"batch_{fodl}"] = failure(lambda fodl=fodl: load(MASKED, subscribe="m",
                                                        failOnDataLoss=fodl).count())

        def stream():
            q = (spark.readStream.format("kstore").option("subscribe", "m")
                 .option("startingOffsets", "earliest").option("failOnDataLoss", "false")
                 .load(MASKED).writeStream.format("memory").queryName("m1")
                 .option("checkpointLocation", os.path.join(CKPT, "m"))
                 .trigger(availableNow=True).start())
            q.awaitTermination(240)
            if q.exception() is not None:
                raise RuntimeError(str(q.exception()))
            return spark.table("m1").count()

        out["stream_false"] = failure(stream)
        out["write"] = failure(lambda: spark.range(5).selectExpr("CAST(id AS STRING) AS value")
                               .write.format("kstore").mode("append").option("topic", "mw")
                               .save(MASKED))
        out["masked_staging"] = sorted(os.listdir(MASKED))
        return out

    @case("missing")
    def _missing():
        fill(LOCAL, "l", 100)
        return failure(lambda: load(LOCAL, subscribe="l", failOnDataLoss="false").count())

    spark.stop()


if __name__ == "__main__":
    main()
