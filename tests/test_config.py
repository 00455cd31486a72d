"""LogConfig: Kafka's defaults, parsing of properties-style strings, validation messages."""
import pytest

from jvm_harness import JavaHarness, needs_jdk, write_texts
from kstore.config import LONG_MAX, LogConfig, magic_for_format_version
from kstore.errors import InvalidConfigError


def test_defaults_are_kafkas():
    c = LogConfig()
    assert c.segment_bytes == 1073741824
    assert c.segment_ms == 604800000
    assert c.segment_index_bytes == 10485760
    assert c.index_interval_bytes == 4096
    assert c.retention_ms == 604800000 and c.retention_bytes == -1
    assert c.cleanup_policy == ("delete",)
    assert c.max_message_bytes == 1048588
    assert c.flush_messages == LONG_MAX and c.flush_ms == LONG_MAX
    assert c.file_delete_delay_ms == 60000
    assert c.magic == 2 and not c.log_append_time and c.codec == 0


def test_strings_are_parsed():
    c = LogConfig({"segment.bytes": "2048", "preallocate": "true", "cleanup.policy": "compact, delete",
                   "min.cleanable.dirty.ratio": "0.25", "message.timestamp.type": "LogAppendTime"})
    assert c.segment_bytes == 2048 and c.preallocate is True
    assert c.compact and c.delete and c.min_cleanable_dirty_ratio == 0.25 and c.log_append_time


@pytest.mark.parametrize("key,value,msg", [
    ("segment.bytes", 13, "segment.bytes: value must be at least 14"),
    ("segment.bytes", "abc", "expected an integer"),
    ("segment.bytes", True, "expected an integer"),
    ("segment.ms", 0, "at least 1"),
    ("retention.ms", -2, "at least -1"),
    ("cleanup.policy", "compact,zap", "compact, delete"),
    ("min.cleanable.dirty.ratio", 1.5, r"\[0.0, 1.0\]"),
    ("message.timestamp.type", "Sometimes", "CreateTime, LogAppendTime"),
    ("compression.type", "brotli", "one of"),
    ("compression.gzip.level", 10, "-1 or in"),
    ("preallocate", "maybe", "true or false"),
    ("message.format.version", "banana", "Kafka version"),
])
def test_bad_values_name_key_value_and_range(key, value, msg):
    with pytest.raises(InvalidConfigError, match=msg) as ei:
        LogConfig({key: value})
    assert key in str(ei.value) and str(value) in str(ei.value)


def test_min_lag_above_max_lag_rejected():
    with pytest.raises(InvalidConfigError, match="max.compaction.lag.ms"):
        LogConfig({"min.compaction.lag.ms": 10, "max.compaction.lag.ms": 5})


def test_unknown_key_is_rejected_as_kafka_rejects_it():
    """Kafka's LogConfig.validateNames: "Unknown topic config name: K", here with the key meant."""
    with pytest.raises(InvalidConfigError) as ei:
        LogConfig({"segmnt.bytes": 5})
    assert str(ei.value) == "Unknown topic config name: segmnt.bytes (did you mean segment.bytes?)"
    with pytest.raises(InvalidConfigError) as ei:
        LogConfig({"log.segment.bytes": 4096})
    assert str(ei.value) == ("Unknown topic config name: log.segment.bytes (log.segment.bytes is a broker "
                             "setting; the topic config is segment.bytes)")
    with pytest.raises(InvalidConfigError) as ei:
        LogConfig({"progress": True})
    assert str(ei.value) == "Unknown topic config name: progress"
    # every topic config Kafka 3.9/4.0 defines is accepted
    c = LogConfig({"remote.log.copy.disable": "true", "remote.log.delete.on.disable": False})
    assert c.get("remote.log.copy.disable") is True


def test_stored_unknown_keys_are_logged_not_warned(caplog):
    """strict=False (overrides an earlier version stored): ignored and logged on kstore.config,
    never through warnings.warn."""
    import logging
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with caplog.at_level(logging.WARNING, logger="kstore.config"):
            c = LogConfig({"segment.bites": 5, "segment.bytes": 4096}, strict=False)
    assert c.segment_bytes == 4096 and c.overrides == {"segment.bytes": 4096}
    assert [(r.name, r.getMessage()) for r in caplog.records] == \
        [("kstore.config", "unknown topic config name segment.bites ignored")]
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("kstore").handlers)


def test_timestamp_difference_fallback():
    c = LogConfig({"message.timestamp.difference.max.ms": 100})
    assert c.timestamp_before_max_ms == 100 and c.timestamp_after_max_ms == 100
    c = LogConfig({"message.timestamp.difference.max.ms": 100, "message.timestamp.after.max.ms": 5})
    assert c.timestamp_after_max_ms == 5


@pytest.mark.parametrize("v,m", [("0.8.2", 0), ("0.9.0.1", 0), ("0.10.0", 1), ("0.10.2-IV0", 1),
                                 ("0.11.0", 2), ("3.0-IV1", 2)])
def test_format_version_to_magic(v, m):
    assert magic_for_format_version(v) == m


def test_max_segment_ms_for_compacted_topics():
    assert LogConfig({"cleanup.policy": "compact", "max.compaction.lag.ms": 1000}).max_segment_ms == 1000
    assert LogConfig({"max.compaction.lag.ms": 1000}).max_segment_ms == 604800000


def test_zstd_needs_v2():
    with pytest.raises(InvalidConfigError, match="zstd"):
        LogConfig({"compression.type": "zstd", "message.format.version": "0.10.2"})


# text -> what Java's Long.parseLong(text.trim()) gives (None: NumberFormatException), as
# Kafka's ConfigDef.parseType parses INT and LONG settings
JAVA_LONGS = [("42", 42), (" 42\t", 42), ("+42", 42), ("-7", -7), ("\x0042\x1f", 42),
              ("\u0663", 3), ("\uff11\uff12", 12), ("1_000", None), ("42\xa0", None),
              ("\x8542", None), ("4 2", None), ("0x10", None), ("", None), ("+", None),
              ("1e3", None), ("42L", None)]
# text -> Double.parseDouble(text.trim()) (None: NumberFormatException)
JAVA_DOUBLES = [("0.5", 0.5), (" .5 ", 0.5), ("5.", 5.0), ("1e-1", 0.1), ("0.25d", 0.25),
                ("0.25F", 0.25), ("0x1p-2", 0.25), ("0X.8P0", 0.5), ("+1", 1.0),
                ("Infinity", float("inf")), ("inf", None), ("1_0", None), ("0x1", None),
                ("\u0663", None), ("0.5\xa0", None), ("1e", None), ("NaNd", None)]


@pytest.mark.parametrize("text,expected", JAVA_LONGS)
def test_integers_parse_as_javas_parse_long(text, expected):
    from kstore.config import java_long
    if expected is None:
        with pytest.raises(ValueError):
            java_long(text)
        with pytest.raises(InvalidConfigError, match="segment.ms: expected an integer"):
            LogConfig({"segment.ms": text})
    else:
        assert java_long(text) == expected


@pytest.mark.parametrize("text,expected", JAVA_DOUBLES)
def test_doubles_parse_as_javas_parse_double(text, expected):
    from kstore.config import java_double
    if expected is None:
        with pytest.raises(ValueError):
            java_double(text)
        with pytest.raises(InvalidConfigError, match="min.cleanable.dirty.ratio: expected a number"):
            LogConfig({"min.cleanable.dirty.ratio": text})
    else:
        assert java_double(text) == expected


def test_nan_ratio_is_refused():
    """Kafka's Range validator lets NaN through (every comparison with it is false); a NaN
    min.cleanable.dirty.ratio would never let the cleaner choose a log, so kstore refuses it."""
    with pytest.raises(InvalidConfigError, match=r"value must be in \[0.0, 1.0\]"):
        LogConfig({"min.cleanable.dirty.ratio": "NaN"})


_JAVA_NUMBERS = """
import java.nio.file.*;
public class Numbers {
  public static void main(String[] a) throws Exception {
    for (String line : Files.readAllLines(Paths.get(a[0]))) {
      StringBuilder s = new StringBuilder();
      for (String h : line.split(",")) if (!h.isEmpty()) s.append((char) Integer.parseInt(h, 16));
      String v = s.toString().trim(), l, d;
      try { l = Long.toString(Long.parseLong(v)); } catch (NumberFormatException e) { l = "ERR"; }
      try { double x = Double.parseDouble(v); d = Double.isNaN(x) ? "NaN" : Long.toHexString(Double.doubleToRawLongBits(x)); }
      catch (NumberFormatException e) { d = "ERR"; }
      System.out.println(l + " " + d);
    }
  }
}
"""


@needs_jdk
def test_random_numbers_parse_as_the_jvm_parses_them(tmp_path):
    """10000 random texts of digits, signs, exponents, suffixes, hex and Java/Unicode spaces:
    java_long and java_double agree with Long.parseLong and Double.parseDouble of the trimmed
    text (Java's overflow is an error where kstore's range check refuses the value later)."""
    import random
    import struct
    from kstore.config import java_double, java_long
    numbers = JavaHarness(tmp_path, "Numbers", _JAVA_NUMBERS)
    pieces = ["0", "1", "9", "+", "-", ".", "e", "E", "x", "p", "P", "a", "f", "d", "D", "_",
              " ", "\t", "\x00", "\x1f", "\xa0", "\u0663", "\uff11", "NaN", "Infinity", "inf",
              "0x", "1e", "\x85"]
    rng = random.Random(14)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 6))) for _ in range(10000)]
    write_texts(tmp_path / "in.txt", texts)
    java = numbers.run("in.txt").splitlines()
    assert len(java) == len(texts)
    for text, line in zip(texts, java):
        want_long, want_double = line.split()
        try:
            got_long = str(java_long(text))
            if want_long == "ERR" and not -(1 << 63) <= int(got_long) < 1 << 63:
                got_long = "ERR"                    # overflow: refused by the range check
        except ValueError:
            got_long = "ERR"
        try:
            x = java_double(text)
            got_double = "NaN" if x != x else "%x" % struct.unpack("<Q", struct.pack("<d", x))[0]
        except ValueError:
            got_double = "ERR"
        assert (got_long, got_double) == (want_long, want_double), repr(text)
