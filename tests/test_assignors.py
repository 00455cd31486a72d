"""kstore.assignors: Kafka's RangeAssignor and RoundRobinAssignor, case by case from Kafka's
RangeAssignorTest / RoundRobinAssignorTest (clients module, non-rack cases) and the classes'
documented examples."""
from __future__ import annotations

import pytest

from kstore.assignors import RangeAssignor, RoundRobinAssignor, assignor_named
from kstore.group_records import java_string_hash
from kstore.topic_partition import TopicPartition as TP

T1, T2 = "topic1", "topic2"


def parse(s: str) -> list[TP]:
    """'t1-0, t2-3' -> [TP('t1', 0), TP('t2', 3)] (Kafka's toSortedString format)."""
    out = []
    for part in filter(None, (p.strip() for p in s.split(","))):
        topic, _, n = part.rpartition("-")
        out.append(TP(topic, int(n)))
    return out


def test_java_string_hash_vectors():
    # values of "...".hashCode() in Java
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    assert java_string_hash("polygenelubricants") == -2147483648    # Integer.MIN_VALUE
    assert java_string_hash("\U0001F600") == 1772899           # a surrogate pair: two code units


def test_assignor_names():
    assert RangeAssignor.name == "range" and RoundRobinAssignor.name == "roundrobin"
    assert isinstance(assignor_named("range"), RangeAssignor)
    with pytest.raises(ValueError, match="sticky"):
        assignor_named("sticky")


@pytest.mark.parametrize("cls", [RangeAssignor, RoundRobinAssignor])
def test_one_consumer_no_topic_and_nonexistent_topic(cls):
    assert cls().assign({}, {"consumer": []}) == {"consumer": []}
    assert cls().assign({}, {"consumer": ["topic"]}) == {"consumer": []}


@pytest.mark.parametrize("cls", [RangeAssignor, RoundRobinAssignor])
def test_one_consumer_one_topic_only_subscribed(cls):
    a = cls().assign({"topic": 3, "other": 3}, {"consumer": ["topic"]})
    assert a == {"consumer": [TP("topic", 0), TP("topic", 1), TP("topic", 2)]}


@pytest.mark.parametrize("cls", [RangeAssignor, RoundRobinAssignor])
def test_one_consumer_multiple_topics(cls):
    a = cls().assign({T1: 1, T2: 2}, {"consumer": [T1, T2]})
    assert a == {"consumer": [TP(T1, 0), TP(T2, 0), TP(T2, 1)]}


@pytest.mark.parametrize("cls", [RangeAssignor, RoundRobinAssignor])
def test_two_consumers_one_topic(cls):
    subs = {"consumer1": ["topic"], "consumer2": ["topic"]}
    assert cls().assign({"topic": 1}, subs) == {"consumer1": [TP("topic", 0)], "consumer2": []}
    assert cls().assign({"topic": 2}, subs) == {"consumer1": [TP("topic", 0)], "consumer2": [TP("topic", 1)]}


@pytest.mark.parametrize("cls", [RangeAssignor, RoundRobinAssignor])
def test_multiple_consumers_mixed_topics(cls):
    subs = {"consumer1": [T1], "consumer2": [T1, T2], "consumer3": [T1]}
    assert cls().assign({T1: 3, T2: 2}, subs) == {
        "consumer1": [TP(T1, 0)], "consumer2": [TP(T1, 1), TP(T2, 0), TP(T2, 1)], "consumer3": [TP(T1, 2)]}


def test_range_two_consumers_two_topics_six_partitions():
    subs = {"consumer1": [T1, T2], "consumer2": [T1, T2]}
    assert RangeAssignor().assign({T1: 3, T2: 3}, subs) == {
        "consumer1": [TP(T1, 0), TP(T1, 1), TP(T2, 0), TP(T2, 1)], "consumer2": [TP(T1, 2), TP(T2, 2)]}


def test_range_static_members_sort_by_instance_id_first():
    subs = {"consumer-b": [T1, T2], "consumer-a": [T1, T2]}
    both = RangeAssignor().assign({T1: 3, T2: 3}, subs, {"consumer-b": "instance1", "consumer-a": "instance2"})
    one = RangeAssignor().assign({T1: 3, T2: 3}, subs, {"consumer-b": "instance1"})
    for a in (both, one):
        assert a == {"consumer-b": [TP(T1, 0), TP(T1, 1), TP(T2, 0), TP(T2, 1)],
                     "consumer-a": [TP(T1, 2), TP(T2, 2)]}


def test_range_static_member_assignment_persistent():
    ids = {"consumer1": "instance1", "consumer2": "instance2", "consumer3": "instance3"}
    subs = {m: [T1, T2] for m in ["consumer1", "consumer2", "consumer3", "consumer4"]}
    expected = {"consumer1": [TP(T1, 0), TP(T1, 1), TP(T2, 0)], "consumer2": [TP(T1, 2), TP(T2, 1)],
                "consumer3": [TP(T1, 3), TP(T2, 2)], "consumer4": [TP(T1, 4), TP(T2, 3)]}
    assert RangeAssignor().assign({T1: 5, T2: 4}, subs, ids) == expected
    del subs["consumer4"]
    subs["consumer5"] = [T1, T2]
    expected["consumer5"] = expected.pop("consumer4")
    assert RangeAssignor().assign({T1: 5, T2: 4}, subs, ids) == expected


def by_instance(a, ids):
    return {ids[m]: ps for m, ps in a.items() if m in ids}


@pytest.mark.parametrize("cls, expected", [
    (RangeAssignor, {"instance1": [TP(T1, 0), TP(T1, 1), TP(T2, 0), TP(T2, 1)],
                     "instance2": [TP(T1, 2), TP(T1, 3), TP(T2, 2), TP(T2, 3)],
                     "instance3": [TP(T1, 4), TP(T2, 4)]}),
    (RoundRobinAssignor, {"instance1": [TP(T1, 0), TP(T1, 3), TP(T2, 1), TP(T2, 4)],
                          "instance2": [TP(T1, 1), TP(T1, 4), TP(T2, 2)],
                          "instance3": [TP(T1, 2), TP(T2, 0), TP(T2, 3)]}),
])
def test_static_assignment_persistent_after_member_id_changes(cls, expected):
    ids = {"consumer1": "instance1", "consumer2": "instance2", "consumer3": "instance3"}
    subs = {m: [T1, T2] for m in ids}
    assert by_instance(cls().assign({T1: 5, T2: 5}, subs, ids), ids) == expected
    ids2 = {"consumer1": "instance1", "consumer5": "instance2", "consumer4": "instance3"}
    subs2 = {m: [T1, T2] for m in ids2}
    assert by_instance(cls().assign({T1: 5, T2: 5}, subs2, ids2), ids2) == expected


@pytest.mark.parametrize("topics, consumer_topics, expected", [
    # RangeAssignorTest's non-rack-aware expectations (consumers consumer0..2)
    ({"t1": 6, "t2": 7, "t3": 2}, [["t1", "t2", "t3"]] * 3,
     ["t1-0, t1-1, t2-0, t2-1, t2-2, t3-0", "t1-2, t1-3, t2-3, t2-4, t3-1", "t1-4, t1-5, t2-5, t2-6"]),
    ({"t1": 6, "t2": 7, "t3": 2}, [["t1", "t2", "t3"]] * 2 + [["t1", "t3"]],
     ["t1-0, t1-1, t2-0, t2-1, t2-2, t2-3, t3-0", "t1-2, t1-3, t2-4, t2-5, t2-6, t3-1", "t1-4, t1-5"]),
    ({"t1": 5, "t2": 5, "t3": 5}, [["t1", "t2", "t3"]] * 3,
     ["t1-0, t1-1, t2-0, t2-1, t3-0, t3-1", "t1-2, t1-3, t2-2, t2-3, t3-2, t3-3", "t1-4, t2-4, t3-4"]),
    ({"t1": 5, "t2": 5, "t3": 5}, [["t1", "t2", "t3"]] * 2 + [["t1", "t3"]],
     ["t1-0, t1-1, t2-0, t2-1, t2-2, t3-0, t3-1", "t1-2, t1-3, t2-3, t2-4, t3-2, t3-3", "t1-4, t3-4"]),
    ({"t1": 6, "t2": 6, "t3": 2, "t4": 2}, [["t1", "t2"]] * 2 + [["t3", "t4"]] * 2,
     ["t1-0, t1-1, t1-2, t2-0, t2-1, t2-2", "t1-3, t1-4, t1-5, t2-3, t2-4, t2-5", "t3-0, t4-0", "t3-1, t4-1"]),
    ({"t1": 6, "t2": 6, "t3": 2, "t4": 2}, [["t1", "t2", "t3", "t4"]] * 4,
     ["t1-0, t1-1, t2-0, t2-1, t3-0, t4-0", "t1-2, t1-3, t2-2, t2-3, t3-1, t4-1", "t1-4, t2-4", "t1-5, t2-5"]),
    ({"t1": 6, "t2": 6, "t3": 2, "t4": 2, "t5": 4, "t6": 4},
     [["t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9"]] * 3,
     ["t1-0, t1-1, t2-0, t2-1, t3-0, t4-0, t5-0, t5-1, t6-0, t6-1",
      "t1-2, t1-3, t2-2, t2-3, t3-1, t4-1, t5-2, t6-2", "t1-4, t1-5, t2-4, t2-5, t5-3, t6-3"]),
])
def test_range_kafka_non_rack_cases(topics, consumer_topics, expected):
    subs = {f"consumer{i}": ts for i, ts in enumerate(consumer_topics)}
    a = RangeAssignor().assign(topics, subs)
    assert {m: sorted(ps) for m, ps in a.items()} == {f"consumer{i}": parse(e) for i, e in enumerate(expected)}


def test_range_list_order_is_java_hashmap_order():
    # in a 16-slot table "t10" (hash 113043) falls in bucket 2, "t1" (3645) in 13, "t2" in 14:
    # Kafka's client lists a member's partitions topic by topic in that order
    a = RangeAssignor().assign({"t2": 1, "t1": 1, "t10": 1}, {"c": ["t1", "t2", "t10"]})
    assert a == {"c": [TP("t10", 0), TP("t1", 0), TP("t2", 0)]}


def test_roundrobin_two_dynamic_consumers_two_topics_six_partitions():
    subs = {"consumer1": [T1, T2], "consumer2": [T1, T2]}
    assert RoundRobinAssignor().assign({T1: 3, T2: 3}, subs) == {
        "consumer1": [TP(T1, 0), TP(T1, 2), TP(T2, 1)], "consumer2": [TP(T1, 1), TP(T2, 0), TP(T2, 2)]}


def test_roundrobin_static_members():
    subs = {"consumer-b": [T1, T2], "consumer-a": [T1, T2]}
    expected = {"consumer-b": [TP(T1, 0), TP(T1, 2), TP(T2, 1)], "consumer-a": [TP(T1, 1), TP(T2, 0), TP(T2, 2)]}
    assert RoundRobinAssignor().assign({T1: 3, T2: 3}, subs, {"consumer-b": "instance1", "consumer-a": "instance2"}) == expected
    assert RoundRobinAssignor().assign({T1: 3, T2: 3}, subs, {"consumer-b": "instance1"}) == expected


def test_roundrobin_static_member_assignment_persistent():
    ids = {"consumer1": "instance1", "consumer2": "instance2", "consumer3": "instance3"}
    subs = {m: [T1, T2] for m in ["consumer1", "consumer2", "consumer3", "consumer4"]}
    expected = {"consumer1": [TP(T1, 0), TP(T2, 1)], "consumer2": [TP(T1, 1), TP(T2, 2)],
                "consumer3": [TP(T1, 2)], "consumer4": [TP(T2, 0)]}
    assert RoundRobinAssignor().assign({T1: 3, T2: 3}, subs, ids) == expected
    del subs["consumer4"]
    subs["consumer5"] = [T1, T2]
    expected["consumer5"] = expected.pop("consumer4")
    assert RoundRobinAssignor().assign({T1: 3, T2: 3}, subs, ids) == expected


def test_javadoc_examples():
    subs = {"C0": ["t0", "t1"], "C1": ["t0", "t1"]}
    assert RangeAssignor().assign({"t0": 3, "t1": 3}, subs) == {
        "C0": [TP("t0", 0), TP("t0", 1), TP("t1", 0), TP("t1", 1)], "C1": [TP("t0", 2), TP("t1", 2)]}
    assert RoundRobinAssignor().assign({"t0": 3, "t1": 3}, subs) == {
        "C0": [TP("t0", 0), TP("t0", 2), TP("t1", 1)], "C1": [TP("t0", 1), TP("t1", 0), TP("t1", 2)]}
    # unequal subscriptions: C0 {t0}, C1 {t0, t1}, C2 {t0, t1, t2}; 1, 2 and 3 partitions
    subs = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    assert RoundRobinAssignor().assign({"t0": 1, "t1": 2, "t2": 3}, subs) == {
        "C0": [TP("t0", 0)], "C1": [TP("t1", 0)],
        "C2": [TP("t1", 1), TP("t2", 0), TP("t2", 1), TP("t2", 2)]}


def test_members_sort_as_java_strings():
    # U+FF21 (one code unit) sorts after U+1F600 (a surrogate pair, 0xD83D first) in Java,
    # before it in Python's code point order
    a, b = "\uff21", "\U0001F600"
    assert RoundRobinAssignor().assign({"t": 2}, {a: ["t"], b: ["t"]}) == {b: [TP("t", 0)], a: [TP("t", 1)]}


@pytest.mark.parametrize("cls", [RangeAssignor, RoundRobinAssignor])
def test_every_partition_once_and_balanced(cls):
    import random
    rnd = random.Random(7)
    for _ in range(200):
        topics = {f"t{i}": rnd.randrange(0, 9) for i in range(rnd.randrange(1, 5))}
        members = [f"m{rnd.randrange(1000)}" for _ in range(rnd.randrange(1, 6))]
        subs = {m: list(topics) for m in members}
        a = cls().assign(topics, subs)
        got = sorted(tp for ps in a.values() for tp in ps)
        assert got == sorted(TP(t, p) for t, n in topics.items() for p in range(n))
        sizes = [len(ps) for ps in a.values()]
        if cls is RoundRobinAssignor:
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("cls", [RangeAssignor, RoundRobinAssignor])
def test_bad_counts_refused(cls):
    with pytest.raises(ValueError, match="topic 't'"):
        cls().assign({"t": -1}, {"c": ["t"]})
