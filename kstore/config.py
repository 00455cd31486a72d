"""Topic-level configuration (Kafka's LogConfig): names, defaults, validation.

Values may be given as Python values or as the strings a properties file holds. A bad value
raises InvalidConfigError naming the key, the value and what is valid.
"""
from __future__ import annotations

import difflib
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from kstore.errors import InvalidConfigError

log = logging.getLogger("kstore.config")

LONG_MAX = (1 << 63) - 1
# A count, offset or duration bound that never binds; below 2**63 so that adding a clock reading
# or an offset to it cannot overflow the core's int64 arithmetic.
NO_LIMIT = 1 << 62
INT_MAX = (1 << 31) - 1


# -- value parsers ---------------------------------------------------------------------------
# A parser takes (key, value), value a Python value or the string a properties file holds, and
# returns the parsed value or raises InvalidConfigError naming the key, the value and what is
# valid. Topic keys (below) and broker keys (broker_config.py) are declared with them.
Parser = Callable[[str, Any], Any]


#: what Java's String.trim() strips (ConfigDef.parseType trims before parsing): code points <= ' '
_JAVA_TRIM = "".join(map(chr, range(33)))
#: Double.parseDouble's grammar (Double.valueOf's javadoc; ASCII digits only)
_JAVA_DOUBLE = re.compile(r"[+-]?(NaN|Infinity|((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?"
                          r"|0[xX]([0-9a-fA-F]+\.?|[0-9a-fA-F]*\.[0-9a-fA-F]+)[pP][+-]?\d+)"
                          r"[fFdD]?)", re.ASCII)


def java_long(text: str) -> int:
    """Long.parseLong of the trimmed text, as Kafka's ConfigDef parses INT and LONG values: a
    sign, then decimal digits only (Python's int() would also take '1_000' and Unicode spaces);
    ValueError otherwise."""
    s = text.strip(_JAVA_TRIM)
    digits = s[1:] if s[:1] in ("+", "-") else s
    if not digits or not digits.isdecimal():
        raise ValueError(text)
    return int(s)


def java_double(text: str) -> float:
    """Double.parseDouble of the trimmed text (ConfigDef's DOUBLE): Java's grammar, with its
    f/d suffixes and hex floats; ValueError otherwise (Python's float() would take 'inf')."""
    s = text.strip(_JAVA_TRIM)
    m = _JAVA_DOUBLE.fullmatch(s)
    if m is None:
        raise ValueError(text)
    if s[-1] in "fFdD":
        s = s[:-1]
    if "x" in s or "X" in s:
        return float.fromhex(s)
    return float(s.replace("Infinity", "inf"))


def _parse_int(key: str, value: Any, lo: int, hi: int, valid: str) -> int:
    if isinstance(value, bool):
        raise InvalidConfigError(f"Invalid value {value!r} for configuration {key}: expected an integer, {valid}")
    if isinstance(value, str):
        try:
            value = java_long(value)
        except ValueError:
            raise InvalidConfigError(
                f"Invalid value {value!r} for configuration {key}: expected an integer, {valid}") from None
    if not isinstance(value, int):
        raise InvalidConfigError(f"Invalid value {value!r} for configuration {key}: expected an integer, {valid}")
    if value < lo or value > hi:
        raise InvalidConfigError(f"Invalid value {value} for configuration {key}: {valid}")
    return value


def int_parser(lo: int = -(1 << 31), hi: int = INT_MAX, valid: Optional[str] = None) -> Parser:
    """A Java int in [lo, hi]; `valid` replaces the range in error messages."""
    v = valid or _range_text(lo, hi)
    return lambda key, value: _parse_int(key, value, lo, hi, v)


def long_parser(lo: int = -(1 << 63), hi: int = LONG_MAX, valid: Optional[str] = None) -> Parser:
    """A Java long in [lo, hi]; `valid` replaces the range in error messages."""
    v = valid or _range_text(lo, hi)
    return lambda key, value: _parse_int(key, value, lo, hi, v)


def _range_text(lo: int, hi: int) -> str:
    if hi in (INT_MAX, LONG_MAX):
        return f"value must be at least {lo}"
    return f"value must be in [{lo}, {hi}]"


def double_parser(lo: float, hi: float) -> Parser:
    """A number in [lo, hi], as a float."""
    def parse(key: str, value: Any) -> float:
        try:
            if isinstance(value, bool):
                raise ValueError
            v = java_double(value) if isinstance(value, str) else float(value)
        except (TypeError, ValueError):
            raise InvalidConfigError(
                f"Invalid value {value!r} for configuration {key}: expected a number in [{lo}, {hi}]") from None
        if not (lo <= v <= hi):
            raise InvalidConfigError(f"Invalid value {value} for configuration {key}: value must be in [{lo}, {hi}]")
        return v
    return parse


def parse_bool(key: str, value: Any) -> bool:
    """true or false (any case, as a string), or a bool."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InvalidConfigError(f"Invalid value {value!r} for configuration {key}: expected true or false")


def choice_parser(*options: str, case_insensitive: bool = False) -> Parser:
    """One of `options` (returned as spelled there)."""
    def parse(key: str, value: Any) -> str:
        if isinstance(value, str):
            for o in options:
                if value.strip() == o or (case_insensitive and value.strip().lower() == o.lower()):
                    return o
        raise InvalidConfigError(
            f"Invalid value {value!r} for configuration {key}: must be one of {', '.join(options)}")
    return parse


def _cleanup_policy(key, value):
    items = value if isinstance(value, (list, tuple, set, frozenset)) else str(value).split(",")
    out = []
    for item in items:
        item = str(item).strip().lower()
        if item not in ("compact", "delete"):
            raise InvalidConfigError(
                f"Invalid value {value!r} for configuration {key}: must be a list of compact, delete")
        if item not in out:
            out.append(item)
    if not out:
        raise InvalidConfigError(f"Invalid value {value!r} for configuration {key}: empty list")
    return tuple(sorted(out))


def parse_str(key: str, value: Any) -> str:
    """Any value as a string; a list or tuple joined with commas."""
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


_VERSION = re.compile(r"^(\d+)\.(\d+)")


def _message_format(key, value):
    v = str(value).strip()
    m = _VERSION.match(v)
    if not m:
        raise InvalidConfigError(
            f"Invalid value {value!r} for configuration {key}: expected a Kafka version such as 0.10.2 or 3.0-IV1")
    return v


def magic_for_format_version(version: str) -> int:
    """Record format a Kafka message.format.version selects: <0.10 → v0, 0.10.x → v1, else v2."""
    m = _VERSION.match(version)
    if m is None:
        raise InvalidConfigError(f"Invalid message.format.version {version!r}: expected a Kafka version")
    major, minor = int(m.group(1)), int(m.group(2))
    if major == 0 and minor < 10:
        return 0
    if major == 0 and minor == 10:
        return 1
    return 2


@dataclass(frozen=True)
class ConfigKey:
    name: str
    default: Any
    parse: Parser
    broker: tuple[str, ...] = ()     # broker synonyms, highest priority first
    doc: str = ""


_KEYS = [
    ConfigKey("segment.bytes", 1073741824, int_parser(14), ("log.segment.bytes",), "segment size before a roll"),
    ConfigKey("segment.ms", 604800000, long_parser(1), ("log.roll.ms", "log.roll.hours"), "segment age before a roll"),
    ConfigKey("segment.jitter.ms", 0, long_parser(0), ("log.roll.jitter.ms", "log.roll.jitter.hours")),
    ConfigKey("segment.index.bytes", 10485760, int_parser(4), ("log.index.size.max.bytes",)),
    ConfigKey("index.interval.bytes", 4096, int_parser(0), ("log.index.interval.bytes",)),
    ConfigKey("retention.ms", 604800000, long_parser(-1), ("log.retention.ms", "log.retention.minutes", "log.retention.hours")),
    ConfigKey("retention.bytes", -1, long_parser(), ("log.retention.bytes",)),
    ConfigKey("cleanup.policy", ("delete",), _cleanup_policy, ("log.cleanup.policy",)),
    ConfigKey("delete.retention.ms", 86400000, long_parser(0), ("log.cleaner.delete.retention.ms",)),
    ConfigKey("min.cleanable.dirty.ratio", 0.5, double_parser(0.0, 1.0), ("log.cleaner.min.cleanable.ratio",)),
    ConfigKey("min.compaction.lag.ms", 0, long_parser(0), ("log.cleaner.min.compaction.lag.ms",)),
    ConfigKey("max.compaction.lag.ms", LONG_MAX, long_parser(1), ("log.cleaner.max.compaction.lag.ms",)),
    ConfigKey("file.delete.delay.ms", 60000, long_parser(0), ("log.segment.delete.delay.ms",)),
    ConfigKey("flush.messages", LONG_MAX, long_parser(1), ("log.flush.interval.messages",)),
    ConfigKey("flush.ms", LONG_MAX, long_parser(0), ("log.flush.interval.ms", "log.flush.scheduler.interval.ms")),
    ConfigKey("max.message.bytes", 1048588, int_parser(0), ("message.max.bytes",)),
    ConfigKey("message.timestamp.type", "CreateTime", choice_parser("CreateTime", "LogAppendTime"), ("log.message.timestamp.type",)),
    ConfigKey("message.timestamp.difference.max.ms", LONG_MAX, long_parser(0), ("log.message.timestamp.difference.max.ms",)),
    ConfigKey("message.timestamp.before.max.ms", None, long_parser(0), ("log.message.timestamp.before.max.ms",)),
    ConfigKey("message.timestamp.after.max.ms", None, long_parser(0), ("log.message.timestamp.after.max.ms",)),
    ConfigKey("message.format.version", "3.0-IV1", _message_format, ("log.message.format.version",)),
    ConfigKey("preallocate", False, parse_bool, ("log.preallocate",)),
    ConfigKey("compression.type", "producer", choice_parser("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"), ("compression.type",)),
    ConfigKey("compression.gzip.level", -1, int_parser(-1, 9, "value must be -1 or in [1, 9]"), ("compression.gzip.level",)),
    ConfigKey("compression.lz4.level", 9, int_parser(1, 17), ("compression.lz4.level",)),
    ConfigKey("compression.zstd.level", 3, int_parser(-131072, 22), ("compression.zstd.level",)),
    ConfigKey("min.insync.replicas", 1, int_parser(1), ("min.insync.replicas",)),
    ConfigKey("unclean.leader.election.enable", False, parse_bool, ("unclean.leader.election.enable",)),
    ConfigKey("message.downconversion.enable", True, parse_bool, ("log.message.downconversion.enable",)),
    ConfigKey("leader.replication.throttled.replicas", "", parse_str),
    ConfigKey("follower.replication.throttled.replicas", "", parse_str),
    ConfigKey("remote.storage.enable", False, parse_bool),
    ConfigKey("local.retention.ms", -2, long_parser(-2)),
    ConfigKey("local.retention.bytes", -2, long_parser(-2)),
    ConfigKey("remote.log.copy.disable", False, parse_bool),
    ConfigKey("remote.log.delete.on.disable", False, parse_bool),
]

TOPIC_CONFIG_KEYS: dict[str, ConfigKey] = {k.name: k for k in _KEYS}
_BROKER_SYNONYMS = {s: k.name for k in _KEYS for s in k.broker}


def bad_max_records(n: int) -> int:
    """Log.read's guard (kept out of its hot line): a negative max_records is refused."""
    raise InvalidConfigError(f"max_records {n}: expected None (no limit) or a count >= 0")


def unknown_key_error(key: str) -> InvalidConfigError:
    """Kafka's LogConfig.validateNames error ("Unknown topic config name: K"), with the topic
    key meant when `key` is a near miss or a broker-level synonym."""
    hint = ""
    if key in _BROKER_SYNONYMS:
        hint = f" ({key} is a broker setting; the topic config is {_BROKER_SYNONYMS[key]})"
    else:
        close = difflib.get_close_matches(key, list(TOPIC_CONFIG_KEYS), n=1, cutoff=0.8)
        if close:
            hint = f" (did you mean {close[0]}?)"
    return InvalidConfigError(f"Unknown topic config name: {key}{hint}")



class LogConfig:
    """Validated topic-level settings; attributes use Python names (segment_bytes, ...)."""

    __slots__ = ("_values", "_overrides", "segment_bytes", "segment_ms", "segment_jitter_ms",
                 "segment_index_bytes", "index_interval_bytes", "retention_ms", "retention_bytes",
                 "cleanup_policy", "compact", "delete", "delete_retention_ms", "file_delete_delay_ms",
                 "flush_messages", "flush_ms", "max_message_bytes", "log_append_time",
                 "timestamp_before_max_ms", "timestamp_after_max_ms", "magic", "preallocate",
                 "codec", "max_compaction_lag_ms", "min_compaction_lag_ms",
                 "min_cleanable_dirty_ratio", "compression_type", "max_segment_ms",
                 "compression_level")

    def __init__(self, overrides: Optional[Mapping[str, Any]] = None,
                 defaults: Optional[Mapping[str, Any]] = None, *, strict: bool = True):
        """`overrides` are topic configs as given: an unknown key raises InvalidConfigError as
        Kafka rejects it; with strict=False (overrides stored by an earlier version) it is
        logged on the `kstore.config` logger and ignored."""
        values = {k.name: k.default for k in _KEYS}
        if defaults:
            for key, value in defaults.items():
                if key in TOPIC_CONFIG_KEYS:
                    values[key] = TOPIC_CONFIG_KEYS[key].parse(key, value)
        self._overrides = {}
        for key, value in (overrides or {}).items():
            spec = TOPIC_CONFIG_KEYS.get(key)
            if spec is None:
                if strict:
                    raise unknown_key_error(key)
                log.warning("unknown topic config name %s ignored", key)
                continue
            parsed = spec.parse(key, value)
            values[key] = parsed
            self._overrides[key] = parsed
        if values["min.compaction.lag.ms"] > values["max.compaction.lag.ms"]:
            raise InvalidConfigError(
                f"Invalid value {values['min.compaction.lag.ms']} for configuration min.compaction.lag.ms: "
                f"must not exceed max.compaction.lag.ms ({values['max.compaction.lag.ms']})")
        self._values = values
        self.segment_bytes = values["segment.bytes"]
        self.segment_ms = values["segment.ms"]
        self.segment_jitter_ms = values["segment.jitter.ms"]
        self.segment_index_bytes = values["segment.index.bytes"]
        self.index_interval_bytes = values["index.interval.bytes"]
        self.retention_ms = values["retention.ms"]
        self.retention_bytes = values["retention.bytes"]
        self.cleanup_policy = values["cleanup.policy"]
        self.compact = "compact" in self.cleanup_policy
        self.delete = "delete" in self.cleanup_policy
        self.delete_retention_ms = values["delete.retention.ms"]
        self.file_delete_delay_ms = values["file.delete.delay.ms"]
        self.flush_messages = values["flush.messages"]
        self.flush_ms = values["flush.ms"]
        self.max_message_bytes = values["max.message.bytes"]
        self.log_append_time = values["message.timestamp.type"] == "LogAppendTime"
        diff = values["message.timestamp.difference.max.ms"]
        before = values["message.timestamp.before.max.ms"]
        after = values["message.timestamp.after.max.ms"]
        self.timestamp_before_max_ms = diff if before is None else before
        self.timestamp_after_max_ms = diff if after is None else after
        self.magic = magic_for_format_version(values["message.format.version"])
        self.preallocate = values["preallocate"]
        self.compression_type = values["compression.type"]
        from kstore.compression import CODEC_IDS
        ct = self.compression_type
        self.codec = CODEC_IDS.get(ct, 0) if ct != "producer" else 0
        #: the level compression.{gzip,lz4,zstd}.level gives this topic's codec (None: none)
        self.compression_level = {1: values["compression.gzip.level"],
                                  3: values["compression.lz4.level"],
                                  4: values["compression.zstd.level"]}.get(self.codec)
        if self.codec == 4 and self.magic < 2:
            raise InvalidConfigError(
                "Invalid value zstd for configuration compression.type: zstd needs message format v2 "
                f"(message.format.version is {values['message.format.version']})")
        self.max_compaction_lag_ms = values["max.compaction.lag.ms"]
        self.min_compaction_lag_ms = values["min.compaction.lag.ms"]
        self.min_cleanable_dirty_ratio = values["min.cleanable.dirty.ratio"]
        # segment.ms, capped by max.compaction.lag.ms on compacted topics (Kafka's maxSegmentMs)
        self.max_segment_ms = min(self.max_compaction_lag_ms, self.segment_ms) if self.compact \
            else self.segment_ms

    def get(self, key: str) -> Any:
        return self._values[key]

    @property
    def overrides(self) -> dict[str, Any]:
        """The keys set explicitly (not defaults)."""
        return dict(self._overrides)

    @property
    def max_index_size(self) -> int:
        return self.segment_index_bytes

    def random_segment_jitter(self, rng) -> int:
        """abs(rand) % min(segment.jitter.ms, segment.ms), or 0 without jitter."""
        if self.segment_jitter_ms == 0:
            return 0
        return rng.randrange(0, 1 << 31) % min(self.segment_jitter_ms, self.segment_ms)

    def __repr__(self) -> str:
        return f"LogConfig({self._overrides!r})"
