"""kstore._lines: split_lines, the console producer's line splitter, and murmur2."""
import re

import pytest
from hypothesis import given, settings, strategies as st

from kstore import _core


# -- split_lines: the console producer's line splitter --------------------------------------
def _rows_of(part):
    """(key, value) pairs of one partition's split_lines output."""
    count, key, value = part
    vo, vd = value[0].tolist(), bytes(value[1])
    if key is None:
        return [(None, vd[vo[i]:vo[i + 1]]) for i in range(count)]
    ko, kd = key[0].tolist(), bytes(key[1])
    return [(kd[ko[i]:ko[i + 1]], vd[vo[i]:vo[i + 1]]) for i in range(count)]


def test_split_lines_keys_partitions_and_partial_lines():
    from kstore.partitioner import partition_for_key
    data = b"a\tx\r\nbb\tyy\n\tz\nc\t\nlast\tpartial"
    consumed, lines, parts, bad = _core.split_lines(data, b"\t", 3, -1, 0, False)
    assert (consumed, lines, bad) == (len(data) - len(b"last\tpartial"), 4, -1)
    want = {}
    for k, v in [(b"a", b"x"), (b"bb", b"yy"), (b"", b"z"), (b"c", b"")]:
        want.setdefault(partition_for_key(k, 3), []).append((k, v))
    assert {p: _rows_of(x) for p, x in enumerate(parts) if x} == want
    consumed, lines, parts, bad = _core.split_lines(data, b"\t", 3, -1, 0, True)
    assert (consumed, lines) == (len(data), 5)
    assert (b"last", b"partial") in _rows_of(parts[partition_for_key(b"last", 3)])
    # a fixed partition; unkeyed lines go to the sticky one, blank lines are empty values
    _c, _l, parts, _b = _core.split_lines(b"k::v\nk2::v2::w\n", b"::", 4, 2, 0, True)
    assert [p is None for p in parts] == [True, True, False, True]
    assert _rows_of(parts[2]) == [(b"k", b"v"), (b"k2", b"v2::w")]
    _c, lines, parts, _b = _core.split_lines(b"v1\n\nv3\n", None, 2, -1, 1, True)
    assert lines == 3 and parts[0] is None and _rows_of(parts[1]) == [(None, b"v1"), (None, b""), (None, b"v3")]
    assert _core.split_lines(b"no newline yet", None, 1, -1, 0, False)[:2] == (0, 0)


def test_split_lines_ends_lines_as_javas_read_line():
    """Kafka's console producer reads lines with BufferedReader.readLine: \\r alone ends a line
    too (before, 'a\\rb' was one record), \\r\\n is one end, and a \\r that is the last byte
    of a call's data waits for the next call, which may start with its \\n."""
    data = b"a\rb\r\nc\n\rd\r"
    consumed, lines, parts, bad = _core.split_lines(data, None, 1, -1, 0, False)
    assert (consumed, lines, bad) == (8, 4, -1)
    assert _rows_of(parts[0]) == [(None, b"a"), (None, b"b"), (None, b"c"), (None, b"")]
    consumed, lines, parts, bad = _core.split_lines(data[8:] + b"\ne", None, 1, -1, 0, True)
    assert (consumed, lines) == (4, 2) and _rows_of(parts[0]) == [(None, b"d"), (None, b"e")]
    _c, lines, parts, _b = _core.split_lines(b"k\tv\rk2\tv2\r", b"\t", 1, -1, 0, True)
    assert lines == 2 and _rows_of(parts[0]) == [(b"k", b"v"), (b"k2", b"v2")]


def test_split_lines_stops_before_a_line_without_the_separator():
    data = b"k:v\nk2:v2\noops\nk3:v3\n"
    consumed, lines, parts, bad = _core.split_lines(data, b":", 1, -1, 0, True)
    assert (lines, bad, consumed) == (2, (10, 14), 10)
    assert data[bad[0]:bad[1]] == b"oops"
    assert _rows_of(parts[0]) == [(b"k", b"v"), (b"k2", b"v2")]


def test_split_lines_rejects_bad_arguments():
    with pytest.raises(ValueError):
        _core.split_lines(b"x\n", b"", 1, -1, 0, True)
    with pytest.raises(ValueError):
        _core.split_lines(b"x\n", None, 2, 2, 0, True)
    with pytest.raises(ValueError):
        _core.split_lines(b"x\n", None, 2, -1, 2, True)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.sampled_from([None, b"\t", b":", b"ab"]), st.integers(1, 4),
       st.booleans())
def test_split_lines_matches_a_python_model(data, sep, n, final):
    from kstore.partitioner import partition_for_key
    consumed, lines, parts, bad = _core.split_lines(data, sep, n, -1, n - 1, final)
    # Java's BufferedReader.readLine: a line ends at \n, \r or \r\n; not final, the bytes after
    # the last line end stay, and so does a line ending at a last \r (its \n may follow)
    model = re.split(rb"\r\n|\r|\n", data)
    rest = model.pop()                  # after the last line end (b"" if the data ends with one)
    if final and rest:
        model.append(rest)
    if not final and data.endswith(b"\r") and model:
        model.pop()
    want, ok = {}, 0
    for line in model:
        if sep is not None:
            if sep not in line:
                break
            k, v = line.split(sep, 1)
            want.setdefault(partition_for_key(k, n), []).append((k, v))
        else:
            want.setdefault(n - 1, []).append((None, line))
        ok += 1
    assert lines == ok
    assert (bad == -1) == (ok == len(model))
    assert {p: _rows_of(x) for p, x in enumerate(parts) if x} == want
