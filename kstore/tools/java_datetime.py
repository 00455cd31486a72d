"""Kafka's Utils.getDateTime, which kafka-consumer-groups --to-datetime parses with: ISO 8601
'yyyy-MM-ddTHH:mm:ss[.SSS]' read by a non-lenient java.text.SimpleDateFormat with the ISO zone
'XXX' (Z or ±hh:mm), UTC when the text after the T has no zone. Its quirks are kept, because
the offsets a reset picks depend on them: '.5' is 5 ms (SSS is a count of milliseconds), spaces
before a field are skipped, text after the zone is ignored, '+0800' is refused, dates before
1582-10-15 are Julian, and a field's digits wrap as Java's int does.
"""
from __future__ import annotations

from typing import Optional

_MS_PER_DAY = 86_400_000
_EPOCH_JDN = 2_440_588               # 1970-01-01
_CUTOVER_JDN = 2_299_161             # 1582-10-15, GregorianCalendar's default cutover
_MAX_YEAR = 292_278_994              # GregorianCalendar.getMaximum(YEAR)
_MIN_OFFSET_MS, _MAX_OFFSET_MS = -13 * 3_600_000, 14 * 3_600_000   # ZONE_OFFSET's range


class _Fail(Exception):
    """One SimpleDateFormat pattern did not parse the text."""


def _int32(v: int) -> int:
    """Number.intValue() of what DecimalFormat parsed: a long wraps; beyond a long (a Double)
    it saturates."""
    if v >= 1 << 63 or v < -(1 << 63):
        return (1 << 31) - 1 if v > 0 else -(1 << 31)
    return (v + (1 << 31)) % (1 << 32) - (1 << 31)


def _number(text: str, i: int) -> tuple[int, int]:
    """A numeric field at i: spaces and tabs skipped (SimpleDateFormat.subParse), then an
    integer as DecimalFormat reads it (an optional '-', Unicode decimal digits)."""
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    neg = i < n and text[i] == "-"
    start = i + 1 if neg else i
    end = start
    while end < n and text[end].isdecimal():
        end += 1
    if end == start:
        raise _Fail
    v = int(text[start:end])
    return _int32(-v if neg else v), end


def _literal(text: str, i: int, c: str) -> int:
    if i >= len(text) or text[i] != c:
        raise _Fail
    return i + 1


def _zone(text: str, i: int) -> int:
    """The ISO zone 'XXX' (SimpleDateFormat.subParseNumericZone with a colon): Z or ±hh:mm;
    offset in ms."""
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    if i >= n:
        raise _Fail
    c = text[i]
    if c == "Z":
        return 0
    if c not in "+-":
        raise _Fail
    s = text[i + 1:i + 6]
    if len(s) < 5 or s[2] != ":" or not all("0" <= ch <= "9" for ch in s[:2] + s[3:]):
        raise _Fail
    hours, minutes = int(s[:2]), int(s[3:])
    if hours > 23 or minutes > 59:
        raise _Fail
    return (1 if c == "+" else -1) * (hours * 60 + minutes) * 60_000


def _jdn(y: int, m: int, d: int, julian: bool) -> int:
    """The Julian day number of a date in the Julian or the proleptic Gregorian calendar."""
    a = (14 - m) // 12
    yy, mm = y + 4800 - a, m + 12 * a - 3
    days = d + (153 * mm + 2) // 5 + 365 * yy + yy // 4
    return days - 32083 if julian else days - yy // 100 + yy // 400 - 32045


def _month_days(y: int, m: int, julian: bool) -> int:
    if m == 2:
        leap = y % 4 == 0 if julian else (y % 4 == 0 and (y % 100 != 0 or y % 400 == 0))
        return 29 if leap else 28
    return 30 if m in (4, 6, 9, 11) else 31


def _day_number(y: int, m: int, d: int) -> Optional[int]:
    """Days since the epoch of a date as a non-lenient GregorianCalendar takes it (Julian before
    the 1582 cutover, Gregorian from it; the ten days between do not exist); None if invalid."""
    if not (1 <= y <= _MAX_YEAR and 1 <= m <= 12 and 1 <= d <= 31):
        return None
    if d <= _month_days(y, m, False) and _jdn(y, m, d, False) >= _CUTOVER_JDN:
        return _jdn(y, m, d, False) - _EPOCH_JDN
    if d <= _month_days(y, m, True) and _jdn(y, m, d, True) < _CUTOVER_JDN:
        return _jdn(y, m, d, True) - _EPOCH_JDN
    return None


def _parse(text: str, millis: bool) -> int:
    """One of getDateTime's two patterns: yyyy-MM-dd'T'HH:mm:ss[.SSS]XXX; text after the zone
    is ignored (DateFormat.parse(String)). Epoch ms."""
    year, i = _number(text, 0)
    i = _literal(text, i, "-")
    month, i = _number(text, i)
    i = _literal(text, i, "-")
    day, i = _number(text, i)
    i = _literal(text, i, "T")
    hour, i = _number(text, i)
    i = _literal(text, i, ":")
    minute, i = _number(text, i)
    i = _literal(text, i, ":")
    second, i = _number(text, i)
    ms = 0
    if millis:
        i = _literal(text, i, ".")
        ms, i = _number(text, i)
    offset = _zone(text, i)
    days = _day_number(year, month, day)
    if (days is None or not 0 <= hour <= 23 or not 0 <= minute <= 59 or not 0 <= second <= 59
            or not 0 <= ms <= 999 or not _MIN_OFFSET_MS <= offset <= _MAX_OFFSET_MS):
        raise _Fail                          # Calendar.getTime() of a non-lenient calendar
    t = days * _MS_PER_DAY + ((hour * 60 + minute) * 60 + second) * 1000 + ms - offset
    if t >= 1 << 63:                         # past Long.MAX_VALUE: the calendar refuses it
        raise _Fail
    return t


def get_date_time(timestamp: str) -> int:
    """Epoch ms of a timestamp as Kafka's Utils.getDateTime reads it; ValueError where it
    throws ParseException."""
    parts = timestamp.split("T")
    while parts and parts[-1] == "":         # Java's String.split drops trailing empty strings
        parts.pop()
    if len(parts) < 2:
        raise ValueError("Error parsing timestamp. It does not contain a 'T' according to "
                         "ISO8601 format")
    if not any(c in parts[1] for c in "+-Z"):
        timestamp += "Z"
    for millis in (True, False):
        try:
            return _parse(timestamp, millis)
        except _Fail:
            pass
    raise ValueError(f"Unparseable date: \"{timestamp}\"")
