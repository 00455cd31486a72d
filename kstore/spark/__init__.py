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

This module holds the data source class and what users import; the work is in ``options``
(source and sink options), ``pushdown`` (filters that narrow a read), ``read`` (offset
resolution, range planning, the batch and stream readers) and ``write`` (staging and commit).
"""
from __future__ import annotations

from typing import Optional

try:
    import pyarrow  # noqa: F401
    from pyspark.sql.datasource import DataSourceStreamArrowWriter  # noqa: F401  (4.2+)
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("kstore.spark needs PySpark >= 4.2 and pyarrow: "
                      "pip install 'kstore[spark]'") from e

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from kstore.arrow import kafka_schema
from kstore.errors import InvalidConfigError
from kstore.spark.options import (FORMAT, HEADERS_DDL, SCHEMA_DDL, STAGING_DIR, OffsetSpec,
                                  ReadOptions, TopicPartition, TopicPlan, WriteOptions,
                                  parse_bool)
from kstore.spark.pushdown import Pruning
from kstore.spark.read import (KStoreBatchReader, KStorePushdownReader, KStoreRange,
                               KStoreStreamReader, read_range, split_ranges)
from kstore.spark.write import (STAGED_BATCH_BYTES, KStoreBatchWriter, KStoreCommitMessage,
                                KStoreStreamWriter, StagedFile, commit_staged, remove_staging,
                                stage_batches)

__all__ = [
    "FORMAT", "HEADERS_DDL", "SCHEMA_DDL", "STAGED_BATCH_BYTES", "STAGING_DIR",
    "KStoreBatchReader", "KStoreBatchWriter", "KStoreCommitMessage", "KStoreDataSource",
    "KStorePushdownReader", "KStoreRange", "KStoreStreamReader", "KStoreStreamWriter",
    "OffsetSpec", "Pruning", "ReadOptions", "StagedFile", "TopicPartition", "TopicPlan",
    "WriteOptions", "commit_staged", "read_range", "register", "remove_staging",
    "split_ranges", "stage_batches",
]


def register(spark: SparkSession) -> None:
    """Register the ``kstore`` format with a SparkSession and turn on Python filter pushdown
    (``spark.sql.python.filterPushdown.enabled``), which the reader implements when read with
    ``pushFilters=true``: Spark refuses to plan a Python reader with pushFilters while that
    setting is off. pushFilters is off by default: PySpark 4.3 reuses a pushdown's read plan for
    later scans of the same DataFrame (see ReadOptions.push_filters)."""
    spark.dataSource.register(KStoreDataSource)
    spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def _spark_types(headers: bool) -> dict[str, str]:
    """Column name -> Spark type (simpleString) of the source's fixed schema."""
    types = {"key": "binary", "value": "binary", "topic": "string", "partition": "int",
             "offset": "bigint", "timestamp": "timestamp", "timestampType": "int"}
    if headers:
        types["headers"] = "array<struct<key:string,value:binary>>"
    return types


class KStoreDataSource(DataSource):
    """The ``kstore`` format. Options: see the module docstring and README's Spark section."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def _headers(self) -> bool:
        return parse_bool({k.lower(): v for k, v in self.options.items()}, "includeheaders", False)

    def schema(self) -> str:
        return SCHEMA_DDL + (HEADERS_DDL if self._headers() else "")

    def _projection(self, schema: Optional[StructType]) -> pa.Schema:
        """The Arrow schema a read produces: the fixed schema, or the subset of its columns a
        user schema names (`.schema("partition int, offset long")`), which decodes only those
        (Spark skips schema() then, and the data source API has no other column-pruning hook).
        A column the source does not have, of another type, or named twice is refused here,
        at planning, naming it."""
        headers = self._headers()
        fixed = kafka_schema(headers)
        if schema is None:
            return fixed
        types = _spark_types(headers)
        seen: set = set()
        fields = []
        for f in schema.fields:
            want = types.get(f.name)
            if want is None:
                hint = " (set includeHeaders=true)" if f.name == "headers" else ""
                raise InvalidConfigError(
                    f"column '{f.name}' is not in the kstore source's schema{hint}: a user schema "
                    f"may name only columns of {', '.join(fixed.names)}")
            if f.dataType.simpleString() != want:
                raise InvalidConfigError(f"column '{f.name}' is {want} in the kstore source, not "
                                         f"{f.dataType.simpleString()}")
            if f.name in seen:
                raise InvalidConfigError(f"column '{f.name}' is named twice in the schema")
            seen.add(f.name)
            fields.append(fixed.field(f.name).with_nullable(f.nullable))
        return pa.schema(fields)

    def reader(self, schema: Optional[StructType]) -> DataSourceReader:
        projection = self._projection(schema)
        opts = ReadOptions.parse(self.options, streaming=False)
        return KStorePushdownReader(opts, projection) if opts.push_filters \
            else KStoreBatchReader(opts, projection)

    def streamReader(self, schema: Optional[StructType]) -> DataSourceStreamReader:
        projection = self._projection(schema)
        return KStoreStreamReader(ReadOptions.parse(self.options, streaming=True), projection)

    def writer(self, schema: StructType, overwrite: bool) -> KStoreBatchWriter:
        if overwrite:
            raise InvalidConfigError("the kstore sink only appends: use .mode('append')")
        return KStoreBatchWriter(WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> KStoreStreamWriter:
        return KStoreStreamWriter(WriteOptions.parse(self.options, schema))
