"""java_datetime.py: kafka-consumer-groups --to-datetime read as Kafka's Utils.getDateTime reads
it. The table's epoch ms were printed by Java 17 running getDateTime's logic (a non-lenient
SimpleDateFormat) on the same texts; the differential test compares random texts with the JVM
when a JDK is installed."""
import random

import pytest

from jvm_harness import JavaHarness, needs_jdk, write_texts
from kstore.tools.java_datetime import get_date_time

# text -> epoch ms from the JVM (None: ParseException)
JAVA = [
    ('2026-11-24T10:00:00.000', 1795514400000),
    ('2026-11-24T10:00:00', 1795514400000),
    ('2026-11-24T10:00:00.5', 1795514400005),
    ('2026-11-24T10:00:00.5Z', 1795514400005),
    ('2026-11-24T10:00:00.1234Z', None),
    ('2026-11-24T10:00:00+0800', None),
    ('2026-11-24T10:00:00+08', None),
    ('2026-11-24T10:00:00.000+08:00', 1795485600000),
    ('2026-1-5T1:2:3.4Z', 1767574923004),
    ('2026-11-24T10:00:00.000Zjunk', 1795514400000),
    ('2026-02-29T00:00:00Z', None),
    ('2024-02-29T00:00:00Z', 1709164800000),
    ('1582-10-10T00:00:00Z', None),
    ('1582-10-04T00:00:00Z', -12219379200000),
    ('1500-02-29T00:00:00Z', -14825894400000),
    ('0000-01-01T00:00:00Z', None),
    ('2026-11-24T24:00:00Z', None),
    ('2026-11-24T23:59:60Z', None),
    ('2026- 11-24T10:00:00Z', 1795514400000),
    ('2026-11-24T10:00:00 Z', 1795514400000),
    ('٢026-11-24T10:00:00Z', 1795514400000),
    ('2026-11-24T10:00:00.-5Z', None),
    ('-2026-11-24T10:00:00Z', None),
    ('2026-11-24T10:00:00.000-00:30', 1795516200000),
    ('12026-11-24T10:00:00Z', 317365034400000),
    ('2026-11-24T10:00', None),
    ('2026-11-24T', None),
    ('2026-11-24T10:00:00.000+24:00', None),
    ('2026-11-24t10:00:00Z', None),
]


@pytest.mark.parametrize("text,expected", JAVA)
def test_what_java_reads(text, expected):
    if expected is None:
        with pytest.raises(ValueError):
            get_date_time(text)
    else:
        assert get_date_time(text) == expected


def test_no_zone_is_utc_whatever_the_local_zone(monkeypatch):
    """Kafka appends 'Z' when the text after the T has no zone: a reset by --to-datetime picks
    the same offsets on every machine (kstore used the local zone)."""
    import time
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert get_date_time("2023-11-14T22:13:40.000") == 1_700_000_020_000
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


_JAVA = """
import java.nio.file.*; import java.text.*;
public class GetDateTime {
  // the logic of Kafka's Utils.getDateTime
  static long getDateTime(String timestamp) throws ParseException {
    final String[] parts = timestamp.split("T");
    if (parts.length < 2) throw new ParseException("no T", timestamp.length());
    final String second = parts[1];
    if (!(second.contains("+") || second.contains("-") || second.contains("Z"))) timestamp = timestamp + "Z";
    SimpleDateFormat f = new SimpleDateFormat();
    f.setLenient(false);
    try { f.applyPattern("yyyy-MM-dd'T'HH:mm:ss.SSSXXX"); return f.parse(timestamp).getTime(); }
    catch (ParseException e) { f.applyPattern("yyyy-MM-dd'T'HH:mm:ssXXX"); return f.parse(timestamp).getTime(); }
  }
  public static void main(String[] a) throws Exception {
    for (String line : Files.readAllLines(Paths.get(a[0]))) {
      StringBuilder s = new StringBuilder();
      for (String h : line.split(",")) if (!h.isEmpty()) s.append((char) Integer.parseInt(h, 16));
      String out;
      try { out = Long.toString(getDateTime(s.toString())); } catch (ParseException e) { out = "ERR"; }
      System.out.println(out);
    }
  }
}
"""


@needs_jdk
def test_random_texts_read_as_the_jvm_reads_them(tmp_path):
    """5000 timestamps built from valid and invalid years (Julian, the 1582 gap, wrapping, the
    long's end), months, days, times, millisecond texts and zones, some with a character
    replaced: kstore's epoch ms (or refusal) equal the JVM's."""
    harness = JavaHarness(tmp_path, "GetDateTime", _JAVA)
    rng = random.Random(14)

    parts = [["2026", "2024", "1582", "1500", "0", "12026", "-5", "4294969322", "292278994",
              "\u0661\u0669\u0667\u0660", "2026 "], ["-"],
             ["11", "02", "2", "10", "13", "0", " 5"], ["-"],
             ["24", "29", "30", "31", "4", "5", "10", "15", "0", "32"], ["T"],
             ["10", "0", "23", "24"], [":"], ["00", "59", "60", "5"], [":"], ["00", "59", "60", "7"],
             ["", ".000", ".5", ".999", ".1000", ".-5", ". 5", ".12"],
             ["", "Z", "+08:00", "-00:30", "+0800", "+08", "+14:00", "+14:01", "-13:01", " Z",
              "Zjunk", "z", "+8:00"]]

    def one():
        t = "".join(rng.choice(p) for p in parts)
        if rng.random() < 0.2:
            k = rng.randrange(len(t))
            t = t[:k] + rng.choice("-:T. Z+0") + t[k + 1:]
        return t
    texts = [one() for _ in range(5000)]
    write_texts(tmp_path / "in.txt", texts)
    java = harness.run("in.txt").split()
    assert len(java) == len(texts)
    for text, want in zip(texts, java):
        try:
            got = str(get_date_time(text))
        except ValueError:
            got = "ERR"
        assert got == want, repr(text)
