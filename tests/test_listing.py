"""_listing.split_listing: the one-pass split of a partition directory's listing agrees with
files.parse_name on every name, plain or not."""
import random

import pytest

from kstore._listing import split_listing
from kstore.errors import UnusableFileError
from kstore.files import INDEX_SUFFIXES, LOG_SUFFIX, parse_name


def _by_parse_name(names):
    logs, indexes, refused = [], [], []
    for n in names:
        try:
            p = parse_name(n, "/d")
        except UnusableFileError:
            refused.append(n)
            continue
        if p and not p[2] and p[1] == LOG_SUFFIX:
            logs.append(p[0])
        elif p and not p[2] and p[1] in INDEX_SUFFIXES:
            indexes.append((p[0], n))
    return sorted(logs), indexes, refused


EDGE = ["00000000000000000000.log", "00000000000000000010.index", "00000000000000000010.timeindex",
        "00000000000000000010.txnindex", "00000000000000000010.snapshot", "00000000000000000010.log.swap",
        "00000000000000000010.index.deleted", "00000000000000000010.log.cleaned", "00000000000000000010.log.tmp",
        "09223372036854775807.log", "09223372036854775808.log", "09999999999999999999.log",
        "18446744073709551615.index", "18446744073709551616.log", "99999999999999999999.log",
        "0000000000000000000a.log", "\uff10" + "0" * 19 + ".log", "0" * 19 + ".log", "0" * 21 + ".log",
        "00000000000000000000.LOG", "00000000000000000000.log ", "00000000000000000000.", "leader-epoch-checkpoint",
        "partition.metadata", ".kstore-notify", "x", ""]


def test_split_listing_edge_names():
    logs, indexes, others = split_listing(EDGE)
    assert logs == [0, 9223372036854775807]
    assert indexes == [(10, "00000000000000000010.index"), (10, "00000000000000000010.timeindex"),
                       (10, "00000000000000000010.txnindex")]
    # everything else is left to parse_name, in listing order
    assert others == [n for n in EDGE if n not in {"00000000000000000000.log", "09223372036854775807.log"}
                      and n not in {name for _b, name in indexes}]
    exp_logs, exp_indexes, refused = _by_parse_name(EDGE)
    assert (logs, indexes) == (exp_logs, exp_indexes)
    # the names parse_name refuses (a base above 2^63-1) are among the others, never read as bases
    assert set(refused) <= set(others)
    assert refused == ["09223372036854775808.log", "09999999999999999999.log", "18446744073709551615.index",
                       "18446744073709551616.log", "99999999999999999999.log"]


def test_split_listing_agrees_with_parse_name_on_random_names():
    rng = random.Random(14)
    suffixes = [".log", ".index", ".timeindex", ".txnindex", ".snapshot", ".log.swap", ".log.deleted", ".tmp", ""]
    names = []
    for _ in range(5000):
        digits = "".join(rng.choice("0123456789" if rng.random() < 0.95 else "9a\u0660") for _ in range(rng.choice([19, 20, 20, 20, 21])))
        names.append(digits + rng.choice(suffixes))
    logs, indexes, _others = split_listing(names)
    exp_logs, exp_indexes, _refused = _by_parse_name(names)
    assert logs == exp_logs
    assert indexes == exp_indexes


def test_split_listing_refuses_non_lists():
    with pytest.raises(TypeError):
        split_listing(("00000000000000000000.log",))
