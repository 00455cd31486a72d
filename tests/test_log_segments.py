"""LogSegments: the ordered snapshot of a log's segments and its lookups by offset (Kafka's
LogSegmentsTest)."""
import pytest

from kstore.log_segments import LogSegments

from segment_helpers import append, make_segment


@pytest.fixture
def three(tmp_path):
    segs = [make_segment(tmp_path, base) for base in (0, 10, 25)]
    yield segs
    for s in segs:
        s.close()


def test_empty():
    ss = LogSegments()
    assert len(ss) == 0 and not ss and ss.bases == [] and ss.views == []
    assert ss.higher(0) is None and ss.index_above(5) == 0 and not ss.has_base(0)


def test_lists_agree_and_are_a_snapshot(three):
    source = list(three)
    ss = LogSegments(source)
    source.pop()
    assert ss.segs == three and ss.bases == [0, 10, 25]
    assert ss.views == [s.view for s in three]
    assert len(ss) == 3 and list(ss) == three and ss[1] is three[1] and ss.active is three[2]


def test_floor_higher_and_above(three):
    ss = LogSegments(three)
    # floor: the segment holding the offset; below the first base it is the first
    for offset, i in [(-5, 0), (0, 0), (9, 0), (10, 1), (24, 1), (25, 2), (10 ** 12, 2)]:
        assert ss.floor_index(offset) == i and ss.floor(offset) is three[i]
    assert ss.higher(0) is three[1] and ss.higher(10) is three[2] and ss.higher(25) is None
    assert ss.higher(-1) is three[0]
    assert [ss.index_above(o) for o in (0, 1, 10, 11, 25, 26)] == [0, 1, 1, 2, 2, 3]
    assert [ss.next_base(i) for i in range(3)] == [10, 25, None]
    assert ss.has_base(10) and not ss.has_base(11)


def test_membership_is_by_identity(tmp_path, three):
    ss = LogSegments(three)
    other = make_segment(tmp_path / "..", 10)
    try:
        assert three[1] in ss and other not in ss
    finally:
        other.close()


def test_without_and_replaced_make_new_sorted_snapshots(tmp_path, three):
    ss = LogSegments(three)
    assert ss.without([three[1]]).bases == [0, 25] and ss.bases == [0, 10, 25]
    new = make_segment(tmp_path, 5)
    try:
        r = ss.replaced([three[0], three[1]], [new])
        assert r.segs == [new, three[2]] and r.bases == [5, 25]
    finally:
        new.close()


def test_total_size(three):
    append(three[0], 0, [b"a"])
    append(three[1], 10, [b"bb", b"cc"])
    ss = LogSegments(three)
    assert ss.total_size() == three[0].size + three[1].size > 0
