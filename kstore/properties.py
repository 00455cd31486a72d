"""Java .properties files (server.properties) read exactly as java.util.Properties.load does:
its LineReader (comments, blank lines, line continuations, whitespace), load0 (`=`/`:`/space
separators) and loadConvert (backslash escapes, strict \\uXXXX). Only \\n and \\r end a line
(not Python's other line breaks: \\f, \\v, \\x1c-\\x1e, \\x85 are data); bytes are ISO-8859-1,
as Properties.load(InputStream), which Kafka's Utils.loadProps uses. A malformed \\uXXXX fails
the load, as Java's IllegalArgumentException fails a broker's start.
"""
from __future__ import annotations

import re
from typing import Iterator, Optional

from kstore.errors import InvalidConfigError

_WS = " \t\f"
_EOL = "\r\n"
_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "f": "\f"}
_HEX = frozenset("0123456789abcdefABCDEF")


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(offset where it starts, logical line) of every key/value line: Java's LineReader."""
    i, n = 0, len(text)
    while i < n:
        buf: list[str] = []
        start = i
        skip_ws, appended, backslash = True, False, False
        while True:
            if i >= n:                                   # end of input
                if buf:
                    yield start, "".join(buf[:-1] if backslash else buf)
                return
            c = text[i]
            i += 1
            if skip_ws:
                if c in _WS or (not appended and c in _EOL):
                    continue
                skip_ws = appended = False
            if not buf:
                start = i - 1
                if c in "#!":                            # a comment: the rest of the line
                    while i < n and text[i] not in _EOL:
                        i += 1
                    skip_ws = True
                    continue
            if c not in _EOL:
                buf.append(c)
                backslash = not backslash if c == "\\" else False
                continue
            if not buf:                                  # a continued line that was only "\"
                skip_ws = True
                continue
            if i >= n:
                yield start, "".join(buf[:-1] if backslash else buf)
                return
            if not backslash:
                yield start, "".join(buf)
                break
            buf.pop()                                    # "\" at the end: the line goes on
            skip_ws, appended, backslash = True, True, False
            if c == "\r" and text[i] == "\n":
                i += 1


def _convert(s: str) -> Optional[str]:
    """Java's loadConvert: escapes resolved; None for a malformed \\uXXXX."""
    if "\\" not in s:
        return s
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        i += 1
        if c != "\\":
            out.append(c)
            continue
        if i == n:        # not reached: the reader removes a line's trailing unescaped "\"
            break
        c = s[i]
        i += 1
        if c == "u":
            digits = s[i:i + 4]
            if len(digits) < 4 or not _HEX.issuperset(digits):
                return None
            out.append(chr(int(digits, 16)))
            i += 4
        else:
            out.append(_ESCAPES.get(c, c))
    # Java strings are UTF-16: an escaped surrogate pair is one character
    return "".join(out).encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def _split(line: str) -> tuple[str, str]:
    """Java's load0: the key ends at the first unescaped '=', ':' or whitespace; then
    whitespace, at most one '=' or ':' (if the key did not end at one), whitespace."""
    n = len(line)
    key_len, value_start, has_sep, backslash = 0, n, False, False
    while key_len < n:
        c = line[key_len]
        if not backslash and c in "=:":
            value_start, has_sep = key_len + 1, True
            break
        if not backslash and c in _WS:
            value_start = key_len + 1
            break
        backslash = not backslash if c == "\\" else False
        key_len += 1
    while value_start < n:
        c = line[value_start]
        if c not in _WS:
            if has_sep or c not in "=:":
                break
            has_sep = True
        value_start += 1
    return line[:key_len], line[value_start:]


def parse_properties(text: str, source: str = "properties") -> dict[str, str]:
    """Key/value pairs of a properties text; later keys override earlier ones. A malformed
    \\uXXXX raises InvalidConfigError naming source and the line."""
    props: dict[str, str] = {}
    for start, line in _logical_lines(text):
        raw_key, raw_value = _split(line)
        key, value = _convert(raw_key), _convert(raw_value)
        if key is None or value is None:
            lineno = len(re.findall(r"\r\n|\r|\n", text[:start])) + 1
            raise InvalidConfigError(f"{source}, line {lineno}: Malformed \\uxxxx encoding "
                                     f"(java.util.Properties refuses it): {line!r}")
        props[key] = value
    return props


def load_properties(path: str) -> dict[str, str]:
    """A properties file's pairs, its bytes read as ISO-8859-1 (Properties.load(InputStream))."""
    with open(path, encoding="latin-1", newline="") as f:
        return parse_properties(f.read(), path)
