"""Filter pushdown for the ``kstore`` source: which filters on topic, partition, offset and
timestamp narrow a read's plan (Pruning), and which Spark must still check itself."""
from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Any, Optional

from pyspark.sql.datasource import (EqualNullSafe, EqualTo, Filter, GreaterThan,
                                    GreaterThanOrEqual, In, LessThan, LessThanOrEqual,
                                    StringStartsWith)

from kstore.config import NO_LIMIT
from kstore.spark.options import TopicPartition

def _to_ms(v: Any) -> Optional[int]:
    """A filter's timestamp literal as epoch milliseconds, rounded down (None if not a time)."""
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=_dt.timezone.utc)
        us = (v - _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)) // _dt.timedelta(microseconds=1)
        return us // 1000
    return None


@dataclass
class Pruning:
    """What pushed filters allow: topics/partitions to keep, an offset range, and a lower bound
    on timestamps (resolved through the time index)."""
    topics: Optional[set] = None
    topic_prefixes: Optional[list] = None
    partitions: Optional[set] = None
    partition_lo: int = 0
    partition_hi: int = 1 << 31
    offset_lo: int = 0
    offset_hi: int = NO_LIMIT
    ts_lo: Optional[int] = None

    def keeps(self, tp: TopicPartition) -> bool:
        t, p = tp
        if self.topics is not None and t not in self.topics:
            return False
        if self.topic_prefixes and not all(t.startswith(x) for x in self.topic_prefixes):
            return False
        if self.partitions is not None and p not in self.partitions:
            return False
        return self.partition_lo <= p < self.partition_hi

    def push(self, f: Filter) -> bool:
        """Narrow by one filter; True when it is fully handled (Spark need not re-check it)."""
        attribute: tuple[str, ...] = getattr(f, "attribute", ())   # Not(child) has none
        col = attribute[0] if len(attribute) == 1 else None
        if col == "topic":
            if isinstance(f, (EqualTo, EqualNullSafe)) and isinstance(f.value, str):
                self.topics = {f.value} if self.topics is None else self.topics & {f.value}
                return True
            if isinstance(f, In) and all(isinstance(v, str) for v in f.value):
                names = set(f.value)
                self.topics = names if self.topics is None else self.topics & names
                return True
            if isinstance(f, StringStartsWith):
                self.topic_prefixes = (self.topic_prefixes or []) + [f.value]
                return True
            return False
        if col in ("partition", "offset"):
            value = getattr(f, "value", None)          # IsNull/IsNotNull have none
            vals = f.value if isinstance(f, In) else () if value is None else (value,)
            if not vals or not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
                return False
            lo, hi = (self.partition_lo, self.partition_hi) if col == "partition" else \
                (self.offset_lo, self.offset_hi)
            exact = True
            if isinstance(f, (EqualTo, EqualNullSafe)):
                lo, hi = max(lo, f.value), min(hi, f.value + 1)
            elif isinstance(f, GreaterThan):
                lo = max(lo, f.value + 1)
            elif isinstance(f, GreaterThanOrEqual):
                lo = max(lo, f.value)
            elif isinstance(f, LessThan):
                hi = min(hi, f.value)
            elif isinstance(f, LessThanOrEqual):
                hi = min(hi, f.value + 1)
            elif isinstance(f, In):
                if col == "partition":
                    self.partitions = set(vals) if self.partitions is None else self.partitions & set(vals)
                    return True
                lo, hi = max(lo, min(vals)), min(hi, max(vals) + 1)
                exact = False
            else:
                return False
            if col == "partition":
                self.partition_lo, self.partition_hi = lo, hi
            else:
                self.offset_lo, self.offset_hi = lo, hi
            return exact
        if col == "timestamp":
            # only a lower bound prunes: CreateTime timestamps need not grow with offsets, but the
            # first offset with timestamp >= T bounds every match from below. Spark re-checks.
            if isinstance(f, (GreaterThan, GreaterThanOrEqual, EqualTo, EqualNullSafe)):
                ms = _to_ms(f.value)
                if ms is not None:
                    self.ts_lo = ms if self.ts_lo is None else max(self.ts_lo, ms)
            return False
        return False
