"""A worked pipeline: clickstream topic -> Spark windowed aggregation -> compacted results topic
-> served by key to an application through kstore's own API.

    python examples/clickstream_pipeline.py [DATA_DIR]      (default ./kstore-pipeline)

1. An application appends page-view events to the topic `clicks` (keyed by user, so one user's
   clicks stay in order on one partition), as it would in production.
2. Spark reads `clicks` with the `kstore` format, counts views per page per minute, and appends
   the counts to `page-views`, a compacted topic keyed by "page|minute".
3. More clicks arrive; the job runs again from the checkpointed offsets (a streaming query with
   trigger(availableNow=True)) and appends updated counts for the minutes they touch.
4. The cleaner compacts `page-views` down to the latest count per key, and the serving side
   loads it into a dict and answers lookups by key.

Run again in the same DATA_DIR, it starts over (the topics and the Spark checkpoint of the
previous run removed first) and reports the same. It exits with status 1 if a served count
differs from the clicks it produced.
"""
from __future__ import annotations

import json
import os
import random
import shutil
import sys
from collections import Counter
from datetime import datetime, timezone

import kstore

PAGES = ["/", "/search", "/cart", "/checkout", "/help"]
T0 = 1_767_225_600_000          # 2026-01-01T00:00:00Z


def reset(data_dir: str, checkpoints: str) -> list[str]:
    """Remove what a previous run left in data_dir (its topics, removed at once: a delete
    delay of 0) and its Spark checkpoints, so that every run counts the same clicks. Returns
    the topics removed."""
    shutil.rmtree(checkpoints, ignore_errors=True)
    if not os.path.isdir(data_dir):
        return []
    with kstore.LogManager(data_dir, {"log.segment.delete.delay.ms": 0}) as m:
        old = [t for t in ("clicks", "page-views") if t in m.topics()]
        for t in old:
            m.delete_topic(t)
        m.delete_logs()
    return old


def produce_clicks(data_dir: str, n: int, seed: int, t_start: int) -> Counter:
    """Append n click events; returns the expected per-(page, minute) counts."""
    rng = random.Random(seed)
    expected: Counter = Counter()
    with kstore.LogManager(data_dir) as m:
        if "clicks" not in m.topics():
            m.create_topic("clicks", 3)
            m.create_topic("page-views", 1, {"cleanup.policy": "compact", "segment.bytes": 4096,
                                             "min.cleanable.dirty.ratio": 0.01})
        for i in range(n):
            ts = t_start + i * 250                      # 4 clicks a second
            page = rng.choice(PAGES)
            user = f"user{rng.randrange(40)}"
            m.append("clicks", user.encode(), json.dumps({"user": user, "page": page}).encode(),
                     timestamp=ts)
            expected[(page, ts // 60000 * 60000)] += 1
    return expected


def aggregate(spark, data_dir: str, checkpoint: str) -> None:
    """One run of the Spark job: the clicks not yet processed, re-counted per page and minute."""
    from pyspark.sql import functions as F

    def write_counts(batch_df, batch_id):
        # the minutes touched by this micro-batch, recounted over all clicks so far (a batch read
        # of the same topic), then appended as the new latest value of each key
        touched = batch_df.select(F.window("timestamp", "1 minute").start.alias("minute")).distinct()
        clicks = (spark.read.format("kstore").option("subscribe", "clicks").load(data_dir)
                  .select(F.get_json_object(F.col("value").cast("string"), "$.page").alias("page"),
                          F.window("timestamp", "1 minute").alias("w")))
        counts = (clicks.join(touched, clicks.w.start == touched.minute)
                  .groupBy("page", "w").count())
        (counts.select(
            F.concat_ws("|", "page", F.date_format("w.start", "yyyy-MM-dd'T'HH:mm'Z'")).alias("key"),
            F.to_json(F.struct("page", F.col("w.start").alias("minute"), "count")).alias("value"),
            F.col("w.end").alias("timestamp"))
         .write.format("kstore").mode("append").option("topic", "page-views").save(data_dir))

    q = (spark.readStream.format("kstore").option("subscribe", "clicks")
         .option("startingOffsets", "earliest").load(data_dir)
         .writeStream.foreachBatch(write_counts).option("checkpointLocation", checkpoint)
         .trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception():
        raise q.exception()


class PageViews:
    """The serving side: the compacted topic loaded into a dict, answering by key."""

    def __init__(self, data_dir: str):
        self.latest: dict[str, dict] = {}
        with kstore.StoreReader(data_dir) as store:
            lg = store.log("page-views", 0)
            for chunk in lg.iter_chunks():
                for r in chunk:
                    self.latest[r.key.decode()] = json.loads(r.value)

    def get(self, page: str, minute_ms: int) -> int:
        minute = datetime.fromtimestamp(minute_ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%MZ")
        v = self.latest.get(f"{page}|{minute}")
        return v["count"] if v else 0


def compact(data_dir: str) -> int:
    """Run the cleaner once over the results topic; returns how many records it holds after."""
    with kstore.LogManager(data_dir) as m:
        lg = m.log("page-views", 0)
        lg.roll()                      # the active segment is never cleaned
        m.clean_now()
        return sum(len(c) for c in lg.iter_chunks())


def main(data_dir: str = "kstore-pipeline", spark=None) -> dict:
    own = spark is None
    if own:
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYTHONSAFEPATH", "1")   # workers import the installed kstore
        from pyspark.sql import SparkSession
        spark = (SparkSession.builder.master("local[2]").appName("kstore-clickstream")
                 .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
                 .config("spark.sql.session.timeZone", "UTC").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
    from kstore.spark import register
    register(spark)
    checkpoint = os.path.join(data_dir + "-checkpoints", "page-views")
    try:
        if reset(data_dir, os.path.dirname(checkpoint)):
            print(f"{data_dir}: starting over (removed the previous run's topics)", file=sys.stderr)
        expected = produce_clicks(data_dir, 1200, seed=1, t_start=T0)            # minutes 0-4
        aggregate(spark, data_dir, checkpoint)
        expected += produce_clicks(data_dir, 600, seed=2, t_start=T0 + 240_000)  # minutes 4-6
        aggregate(spark, data_dir, checkpoint)
        kept = compact(data_dir)
        served = PageViews(data_dir)
        report = {
            "clicks": sum(expected.values()),
            "keys": len(expected),
            "records_after_compaction": kept,
            "mismatches": sum(served.get(p, m) != c for (p, m), c in expected.items()),
            "example": {f"{p} @ minute {(m - T0) // 60000}": served.get(p, m)
                        for (p, m) in sorted(expected)[:3]},
        }
    finally:
        if own:
            spark.stop()
    return report


if __name__ == "__main__":
    result = main(*sys.argv[1:2])
    print(json.dumps(result, indent=2))
    sys.exit(1 if result["mismatches"] else 0)
