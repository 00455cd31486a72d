"""Arrow views of kstore data: records decoded in bulk into pyarrow RecordBatches with Spark's
Kafka source schema, and Arrow columns encoded into v2 record batches. Both directions run in
the Cython core over whole buffers; Python touches only batches, never single records.

Needs pyarrow (the `kstore[spark]` extra).
"""
from __future__ import annotations

from typing import Iterator, Optional

import numpy as np

try:
    import pyarrow as pa
    import pyarrow.compute as pc
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("kstore.arrow needs pyarrow: pip install 'kstore[spark]'") from e

from kstore import _core
from kstore.errors import InvalidRecordError
from kstore.log import Log

#: Records per RecordBatch by default, and the cap on a batch's key/value/header bytes.
DEFAULT_BATCH_RECORDS = 1 << 16
DEFAULT_BATCH_BYTES = 64 << 20
#: Decode buffers iter_batches keeps for reuse (Spark's worker holds at most three batches).
POOL_SIZE = 4

HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))


def kafka_schema(include_headers: bool = False) -> pa.Schema:
    """The schema of Spark's Kafka source, as Arrow (timestamps in microseconds, UTC)."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", HEADER_TYPE))
    return pa.schema(fields)


def _bitmap(valid: np.ndarray) -> tuple[Optional[pa.Buffer], int]:
    """(Arrow validity bitmap or None when nothing is null, null count)."""
    nulls = int(valid.size - np.count_nonzero(valid))
    if nulls == 0:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _binary(typ: pa.DataType, n: int, offsets: np.ndarray, data: np.ndarray,
            valid: Optional[np.ndarray]) -> pa.Array:
    bitmap, nulls = _bitmap(valid) if valid is not None else (None, 0)
    return pa.Array.from_buffers(typ, n, [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


def _constant_string(value: str, n: int) -> pa.Array:
    b = value.encode("utf-8")
    offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(b))
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(b * n)], null_count=0)


#: Columns of Spark's Kafka source schema that need record bytes, and the flag of a Columns that
#: keeps them (topic, partition and offset come from the range and the batch headers).
RECORD_COLUMNS = {"key": "keys", "value": "values", "timestamp": "timestamps",
                  "timestampType": "timestamps", "headers": "headers"}


def columns_for(schema: pa.Schema) -> _core.Columns:
    """An empty Columns that decodes only what `schema` (a subset of kafka_schema's fields)
    needs: without key, value, timestamp or headers it keeps offsets only, taken from batch
    headers wherever a batch has no gaps."""
    headers, keys, values, timestamps = _kind(schema)
    return _core.Columns(headers, keys=keys, values=values, timestamps=timestamps)


def _kind(schema: pa.Schema) -> tuple[bool, bool, bool, bool]:
    """(headers, keys, values, timestamps): what a Columns for schema keeps."""
    flags = {RECORD_COLUMNS[name] for name in schema.names if name in RECORD_COLUMNS}
    return ("headers" in flags, "keys" in flags, "values" in flags, "timestamps" in flags)


def _headers_array(a: dict, cols: _core.Columns, topic: str, partition: int, n: int) -> pa.Array:
    m = cols.header_count
    hkeys = _binary(pa.string(), m, a["header_key_offsets"], a["header_key_data"], None)
    try:
        hkeys.validate(full=True)
    except pa.ArrowInvalid as e:
        raise InvalidRecordError(
            f"a header key of {topic}-{partition} near offset "
            f"{int(a['offset'][0]) if n else -1} is not valid UTF-8: {e}") from None
    hvals = _binary(pa.binary(), m, a["header_value_offsets"], a["header_value_data"],
                    a["header_value_valid"])
    items = pa.StructArray.from_arrays([hkeys, hvals], fields=list(HEADER_TYPE.value_type))
    bitmap, nulls = _bitmap(a["headers_valid"])
    return pa.Array.from_buffers(HEADER_TYPE, n, [bitmap, pa.py_buffer(a["headers_offsets"])],
                                 null_count=nulls, children=[items])


def columns_to_batch(cols: _core.Columns, topic: str, partition: int,
                     schema: Optional[pa.Schema] = None, copy: bool = True) -> pa.RecordBatch:
    """A RecordBatch from decoded columns, in Spark's Kafka source schema or in `schema` (any
    subset of its fields, in any order; cols must hold the record columns it names, see
    columns_for): over copies of them, or with copy=False over their memory (cols stays frozen
    until the batch is released)."""
    if schema is None:
        schema = kafka_schema(cols.headers)
    a = cols.arrays() if copy else cols.views()
    n = cols.count
    arrays = []
    for name in schema.names:
        if name == "key":
            arr = _binary(pa.binary(), n, a["key_offsets"], a["key_data"], a["key_valid"])
        elif name == "value":
            arr = _binary(pa.binary(), n, a["value_offsets"], a["value_data"], a["value_valid"])
        elif name == "topic":
            arr = _constant_string(topic, n)
        elif name == "partition":
            arr = pa.array(np.full(n, partition, dtype=np.int32))
        elif name == "offset":
            arr = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(a["offset"])],
                                        null_count=0)
        elif name == "timestamp":
            arr = pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n,
                                        [None, pa.py_buffer(a["timestamp"])], null_count=0)
        elif name == "timestampType":
            arr = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(a["timestampType"])],
                                        null_count=0)
        elif name == "headers":
            arr = _headers_array(a, cols, topic, partition, n)
        else:
            raise ValueError(f"'{name}' is not a column of the Kafka source schema")
        arrays.append(arr)
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


class ColumnsPool:
    """Decode buffers (Columns) kept for reuse by iter_batches, by the columns they keep. A
    Columns is handed out again only once no batch over its memory is alive (live_views == 0),
    so a batch a consumer still holds never changes; at most `size` of a kind are kept (more in
    use at once are made and dropped). Reusing a pool across reads saves growing and first
    touching the buffers (several MB per batch) on every read: a Spark task's read keeps one
    (spark/task_cache.py). One thread at a time: a pool belongs to one read."""

    def __init__(self, size: int = POOL_SIZE):
        self.size = size
        self._kinds: dict[tuple[bool, ...], list[_core.Columns]] = {}

    def take(self, schema: pa.Schema) -> _core.Columns:
        """An empty Columns that decodes what schema needs (columns_for) and no live batch uses."""
        kept = self._kinds.setdefault(_kind(schema), [])
        cols = next((c for c in kept if not c.live_views), None)
        if cols is None:
            cols = columns_for(schema)
            if len(kept) < self.size:
                kept.append(cols)
        cols.clear()
        return cols


def iter_batches(log: Log, topic: str, partition: int, start: int, stop: int, *,
                 include_headers: bool = False, batch_records: int = DEFAULT_BATCH_RECORDS,
                 batch_bytes: int = DEFAULT_BATCH_BYTES, verify_crc: bool = True,
                 schema: Optional[pa.Schema] = None, pool: Optional[ColumnsPool] = None
                 ) -> Iterator[pa.RecordBatch]:
    """RecordBatches of the records with start <= offset < stop (stopping at the log end), in
    `schema` (default: kafka_schema(include_headers); any subset of its fields, of which only the
    named columns are decoded: see columns_for).

    The batches are zero-copy views of decode buffers, which are reused once the batches over
    them are released: a consumer that sends each batch on (as Spark does) keeps two or three
    buffers in use, and one that keeps every batch gets a fresh buffer per batch (the pool stays
    at POOL_SIZE, so finding a free one never scans more). `pool`: buffers to reuse across
    reads (default: a new ColumnsPool for this read)."""
    if schema is None:
        schema = kafka_schema(include_headers)
    if pool is None:
        pool = ColumnsPool()
    offset = start
    while offset < stop:
        cols = pool.take(schema)
        nxt = log.read_columns(offset, stop, cols, max_records=batch_records,
                               max_data=batch_bytes, verify_crc=verify_crc)
        if cols.count:
            yield columns_to_batch(cols, topic, partition, schema, copy=False)
        elif nxt <= offset:
            return
        offset = nxt


# -- writing ------------------------------------------------------------------------------------
def _as_binary(arr: pa.Array, what: str) -> pa.Array:
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type) or \
            pa.types.is_large_binary(arr.type):
        return pc.cast(arr, pa.binary())
    if pa.types.is_null(arr.type):
        return pa.nulls(len(arr), pa.binary())
    if not pa.types.is_binary(arr.type):
        raise InvalidRecordError(f"column '{what}' must be binary or string, not {arr.type}")
    return arr


def _binary_buffers(arr: pa.Array, what: str):
    """(int32 offsets[n+1], data, validity uint8[n] or None) of a binary/string array."""
    arr = _as_binary(arr, what)
    n = len(arr)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32)[arr.offset: arr.offset + n + 1] \
        if bufs[1] is not None else np.zeros(n + 1, dtype=np.int32)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    valid = None
    if arr.null_count:
        valid = arr.is_valid().to_numpy(zero_copy_only=False).view(np.uint8)
    return offsets, data, valid


def _column(batch: pa.RecordBatch, name: str) -> Optional[pa.Array]:
    i = batch.schema.get_field_index(name)
    return None if i < 0 else batch.column(i)


def column_input(batch: pa.RecordBatch) -> _core.ColumnInput:
    """The key, value, timestamp and headers columns of a batch (Spark's Kafka sink columns,
    plus an optional `timestamp`) as core input for BatchBuilder.build_columns."""
    n = batch.num_rows
    value = _column(batch, "value")
    if value is None:
        raise InvalidRecordError("the data to write needs a 'value' column")
    key = _column(batch, "key")
    ts = _column(batch, "timestamp")
    timestamps = None
    if ts is not None:
        if not pa.types.is_timestamp(ts.type):
            raise InvalidRecordError(f"column 'timestamp' must be a timestamp, not {ts.type}")
        ms = pc.cast(pc.cast(ts, pa.timestamp("ms", tz="UTC")), pa.int64())
        timestamps = np.ascontiguousarray(ms.fill_null(-1).to_numpy(zero_copy_only=False),
                                          dtype=np.int64)
    headers = None
    h = _column(batch, "headers")
    if h is not None and not pa.types.is_null(h.type):
        if not (pa.types.is_list(h.type) and pa.types.is_struct(h.type.value_type)):
            raise InvalidRecordError(f"column 'headers' must be array<struct<key, value>>, not {h.type}")
        lo = np.frombuffer(h.buffers()[1], dtype=np.int32)[h.offset: h.offset + n + 1]
        lv = h.is_valid().to_numpy(zero_copy_only=False).view(np.uint8) if h.null_count else None
        items = h.values
        if items.null_count:
            raise InvalidRecordError("column 'headers' holds a null header")
        hk = _binary_buffers(items.field("key"), "headers.key")
        hv = _binary_buffers(items.field("value"), "headers.value")
        if hk[2] is not None:
            raise InvalidRecordError("column 'headers' holds a header with a null key")
        headers = (lo, lv, hk[0], hk[1], hv[0], hv[1], hv[2])
    return _core.ColumnInput(
        n, key=None if key is None else _binary_buffers(key, "key"),
        value=_binary_buffers(value, "value"), timestamps=timestamps, headers=headers)


def key_hashes(batch: pa.RecordBatch) -> np.ndarray:
    """Kafka's default partitioner before the modulo, per row: toPositive(murmur2(key)), or -1
    for a null key (int64)."""
    key = _column(batch, "key")
    if key is None:
        return np.full(batch.num_rows, -1, dtype=np.int64)
    return _core.ColumnInput(batch.num_rows, key=_binary_buffers(key, "key")).key_hashes()
