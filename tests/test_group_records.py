"""group_records: Kafka's __consumer_offsets keys/values and ConsumerProtocol bytes, field by
field, against Java's String.hashCode and kafka-python's JSON-schema encoders built from Kafka's
own message specs (tests/kafka_messages/)."""
from __future__ import annotations

import os
import struct
import sys
import warnings

import pytest

from kstore import CorruptRecordError, TopicPartition
from kstore.group_records import (GroupKey, GroupMetadata, MemberMetadata, OffsetAndMetadata,
                                  OffsetKey, OtherKey, assignment_bytes, group_metadata_key,
                                  group_metadata_value, java_string_hash, offset_commit_key,
                                  offset_commit_value, parse_assignment, parse_group_value,
                                  parse_key, parse_offset_value, parse_subscription,
                                  partition_for, subscription_bytes)

sys.path.insert(0, os.path.dirname(__file__))
kafka_messages = pytest.importorskip("kafka_messages")
api_data = pytest.importorskip("kafka.protocol.api_data")


with warnings.catch_warnings():       # kafka-python loads the specs with a deprecated API
    warnings.simplefilter("ignore", DeprecationWarning)

    class OffsetCommitKey(api_data.ApiData, load_json=kafka_messages):
        pass

    class OffsetCommitValue(api_data.ApiData, load_json=kafka_messages):
        pass

    class GroupMetadataKey(api_data.ApiData, load_json=kafka_messages):
        pass

    class GroupMetadataValue(api_data.ApiData, load_json=kafka_messages):
        pass


def s16(s: str) -> bytes:
    b = s.encode()
    return struct.pack(">h", len(b)) + b


# -- partition_for ------------------------------------------------------------------------------
# (string, Java's String.hashCode, Utils.abs(h) % 50, % 10): printed by Java 17 (H.java in the
# commit message of this test); "foo" % 10 == 4 is Kafka's GroupCoordinatorServiceTest's case
JAVA = [
    ("", 0, 0, 0),
    ("foo", 101574, 24, 4),
    ("polygenelubricants", -2147483648, 0, 0),      # Integer.MIN_VALUE: Utils.abs -> 0
    ("my-group", -1906497762, 12, 2),
    ("console-consumer-12345", 158455506, 6, 6),
    ("g\u00e9n\u00e9ral", -592135200, 0, 0),
    ("\U0001F600grp", 1276929186, 36, 6),            # a surrogate pair: two UTF-16 units
    ("consumer-group-with-a-rather-long-name-0123456789", 2112141797, 47, 7),
]


@pytest.mark.parametrize("s,h,p50,p10", JAVA)
def test_partition_for_matches_java(s, h, p50, p10):
    assert java_string_hash(s) == h
    assert partition_for(s, 50) == p50
    assert partition_for(s, 10) == p10


def test_partition_for_rejects_no_partitions():
    with pytest.raises(ValueError):
        partition_for("g", 0)


# -- keys ------------------------------------------------------------------------------------------
def test_offset_commit_key_bytes():
    b = offset_commit_key("grp", "topic", 7)
    assert b == struct.pack(">h", 1) + s16("grp") + s16("topic") + struct.pack(">i", 7)
    assert b == OffsetCommitKey(group="grp", topic="topic", partition=7).encode(version=1)
    assert parse_key(b) == OffsetKey(1, "grp", "topic", 7)
    assert parse_key(bytearray(b)) == parse_key(memoryview(b)) == OffsetKey(1, "grp", "topic", 7)
    # key version 0 (written by 0.8.2-era brokers) has the same layout
    assert parse_key(OffsetCommitKey(group="g", topic="t", partition=0).encode(version=0)) == OffsetKey(0, "g", "t", 0)


def test_group_metadata_key_bytes():
    b = group_metadata_key("grp\u00e9")
    assert b == struct.pack(">h", 2) + s16("grp\u00e9")
    assert b == GroupMetadataKey(group="grp\u00e9").encode(version=2)
    assert parse_key(b) == GroupKey(2, "grp\u00e9")


def test_newer_group_record_keys_are_other_and_unknown_is_corrupt():
    assert parse_key(struct.pack(">h", 3) + s16("g")) == OtherKey(3)
    assert parse_key(struct.pack(">h", 15) + b"anything") == OtherKey(15)
    with pytest.raises(CorruptRecordError, match="key version 16"):
        parse_key(struct.pack(">h", 16) + s16("g"))
    with pytest.raises(CorruptRecordError, match="key version -1"):
        parse_key(struct.pack(">h", -1))


# -- OffsetCommitValue ----------------------------------------------------------------------------
def test_offset_value_v3_default_bytes():
    o = OffsetAndMetadata(1234, "meta", 5, 1700000000000)
    b = offset_commit_value(o)
    assert b == (struct.pack(">hqi", 3, 1234, 5) + s16("meta") + struct.pack(">q", 1700000000000))
    assert parse_offset_value(b) == o


def test_offset_value_v1_when_expire_timestamp():
    o = OffsetAndMetadata(9, "", None, 100, expire_timestamp=200)
    b = offset_commit_value(o)
    assert b == struct.pack(">hq", 1, 9) + s16("") + struct.pack(">qq", 100, 200)
    assert parse_offset_value(b) == o


def test_offset_value_no_epoch_is_minus_one():
    b = offset_commit_value(OffsetAndMetadata(1, "", None, 2))
    assert b[10:14] == b"\xff\xff\xff\xff"
    assert parse_offset_value(b).leader_epoch is None


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_offset_value_every_version_matches_kafka_schema(version):
    o = OffsetAndMetadata(2**40 + 3, "m\u00e9ta", 7 if version >= 3 else None, 1700000000123,
                          1700000999999 if version == 1 else None)
    ref = OffsetCommitValue(offset=o.offset, leader_epoch=7, metadata=o.metadata,
                            commit_timestamp=o.commit_timestamp,
                            expire_timestamp=1700000999999).encode(version=version)
    assert offset_commit_value(o, version) == ref
    assert parse_offset_value(ref) == o


def test_offset_value_v4_flexible_layout_and_tagged_fields():
    b = offset_commit_value(OffsetAndMetadata(5, "m", 3, 7), version=4)
    # version, offset, epoch, compact string (len+1 varint), commit ts, empty tag section
    assert b == struct.pack(">hqi", 4, 5, 3) + b"\x02m" + struct.pack(">q", 7) + b"\x00"
    # unknown tagged fields (tag 9, 3 bytes) are skipped, as Kafka's readers do
    tagged = b[:-1] + b"\x01\x09\x03abc"
    assert parse_offset_value(tagged) == OffsetAndMetadata(5, "m", 3, 7)


def test_offset_value_hostile_bytes():
    good = offset_commit_value(OffsetAndMetadata(5, "meta", 1, 2))
    for cut in range(len(good)):
        with pytest.raises(CorruptRecordError):
            parse_offset_value(good[:cut])
    with pytest.raises(CorruptRecordError, match="left over"):
        parse_offset_value(good + b"\x00")
    with pytest.raises(CorruptRecordError, match="OffsetCommitValue version 5"):
        parse_offset_value(struct.pack(">h", 5) + good[2:])
    bad_len = struct.pack(">hqi", 3, 1, 1) + struct.pack(">h", 30000) + b"x"
    with pytest.raises(CorruptRecordError, match="bytes needed"):
        parse_offset_value(bad_len)
    with pytest.raises(CorruptRecordError, match="not UTF-8"):
        parse_offset_value(struct.pack(">hqi", 3, 1, 1) + b"\x00\x01\xff" + struct.pack(">q", 0))


# -- GroupMetadataValue -------------------------------------------------------------------------
MEMBER = MemberMetadata("consumer-1-uuid", None, "consumer-1", "/127.0.0.1", 300000, 45000,
                        subscription_bytes(["t"]), assignment_bytes([TopicPartition("t", 0)]))
GROUP = GroupMetadata("consumer", 4, "range", "consumer-1-uuid", 1700000000000, (MEMBER,))


def _ref_group(g: GroupMetadata):
    return GroupMetadataValue(
        protocol_type=g.protocol_type, generation=g.generation, protocol=g.protocol,
        leader=g.leader, current_state_timestamp=g.current_state_timestamp,
        members=[GroupMetadataValue.MemberMetadata(
            member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
            client_host=m.client_host, rebalance_timeout=m.rebalance_timeout,
            session_timeout=m.session_timeout, subscription=m.subscription,
            assignment=m.assignment) for m in g.members])


def test_group_value_v3_bytes_field_by_field():
    b = group_metadata_value(GROUP)
    sub, asg = MEMBER.subscription, MEMBER.assignment
    want = (struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 4) + s16("range")
            + s16("consumer-1-uuid") + struct.pack(">q", 1700000000000) + struct.pack(">i", 1)
            + s16("consumer-1-uuid") + struct.pack(">h", -1) + s16("consumer-1") + s16("/127.0.0.1")
            + struct.pack(">ii", 300000, 45000) + struct.pack(">i", len(sub)) + sub
            + struct.pack(">i", len(asg)) + asg)
    assert b == want
    assert parse_group_value(b) == GROUP


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_group_value_every_version_matches_kafka_schema(version):
    m2 = MemberMetadata("static-uuid", "instance-1" if version >= 3 else None, "c2", "/10.0.0.2",
                        60000 if version >= 1 else -1, 10000, b"", b"\x00\x01")
    g = GroupMetadata("consumer", 7, "roundrobin", None,
                      1700000000000 if version >= 2 else -1, (MEMBER if version >= 1 else
                      MemberMetadata(MEMBER.member_id, None, MEMBER.client_id, MEMBER.client_host,
                                     -1, MEMBER.session_timeout, MEMBER.subscription,
                                     MEMBER.assignment), m2))
    ref = _ref_group(g).encode(version=version)
    assert group_metadata_value(g, version) == ref
    assert parse_group_value(ref) == g


def test_empty_group_and_null_protocol():
    g = GroupMetadata("consumer", 12, None, None, 5, ())
    b = group_metadata_value(g)
    assert b == (struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 12)
                 + struct.pack(">hh", -1, -1) + struct.pack(">q", 5) + struct.pack(">i", 0))
    assert parse_group_value(b) == g


def test_group_value_hostile_bytes():
    good = group_metadata_value(GROUP)
    for cut in range(0, len(good), 3):
        with pytest.raises(CorruptRecordError):
            parse_group_value(good[:cut])
    # a member count far beyond the bytes left: refused before any allocation
    huge = struct.pack(">h", 3) + s16("c") + struct.pack(">i", 1) + struct.pack(">hh", -1, -1) + \
        struct.pack(">q", 0) + struct.pack(">i", 2**31 - 1)
    with pytest.raises(CorruptRecordError, match="array length"):
        parse_group_value(huge)
    with pytest.raises(CorruptRecordError, match="length -1"):     # member id is not nullable
        parse_group_value(struct.pack(">h", 0) + struct.pack(">h", -1))


# -- ConsumerProtocol ----------------------------------------------------------------------------
def test_subscription_bytes_v3_and_kafka_python():
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as Ref
    owned = [TopicPartition("a", 0), TopicPartition("a", 2), TopicPartition("b", 1)]
    b = subscription_bytes(["a", "b"], owned, b"ud", generation=3, rack_id="r1")
    want = (struct.pack(">hi", 3, 2) + s16("a") + s16("b") + struct.pack(">i", 2) + b"ud"
            + struct.pack(">i", 2) + s16("a") + struct.pack(">iii", 2, 0, 2)
            + s16("b") + struct.pack(">ii", 1, 1) + struct.pack(">i", 3) + s16("r1"))
    assert b == want
    ref = Ref(topics=["a", "b"], user_data=b"ud", owned_partitions=[
        Ref.TopicPartition(topic="a", partitions=[0, 2]), Ref.TopicPartition(topic="b", partitions=[1])],
        generation_id=3, rack_id="r1").encode(version=3)
    assert b == ref
    s = parse_subscription(b)
    assert (s.version, s.topics, s.user_data, s.owned_partitions, s.generation, s.rack_id) == \
        (3, ["a", "b"], b"ud", owned, 3, "r1")


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_versions_read_kafka_python(version):
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as Ref
    ref = Ref(topics=["x"], user_data=None, owned_partitions=[Ref.TopicPartition(topic="x", partitions=[4])],
              generation_id=9, rack_id=None).encode(version=version)
    assert subscription_bytes(["x"], [TopicPartition("x", 4)], generation=9, version=version) == ref
    s = parse_subscription(ref)
    assert s.topics == ["x"] and s.user_data is None
    assert s.owned_partitions == ([TopicPartition("x", 4)] if version >= 1 else [])
    assert s.generation == (9 if version >= 2 else -1)


def test_subscription_newer_version_parsed_as_v3():
    b = subscription_bytes(["x"], version=3)
    future = struct.pack(">h", 4) + b[2:] + b"future-field"
    assert parse_subscription(future).topics == ["x"]


def test_assignment_bytes_and_kafka_python():
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as Ref
    parts = [TopicPartition("t", 1), TopicPartition("t", 3), TopicPartition("u", 0)]
    b = assignment_bytes(parts)
    assert b == (struct.pack(">hi", 3, 2) + s16("t") + struct.pack(">iii", 2, 1, 3) + s16("u")
                 + struct.pack(">ii", 1, 0) + struct.pack(">i", -1))
    for v in range(4):
        ref = Ref(assigned_partitions=[Ref.TopicPartition(topic="t", partitions=[1, 3]),
                                       Ref.TopicPartition(topic="u", partitions=[0])],
                  user_data=None).encode(version=v)
        assert assignment_bytes(parts, version=v) == ref
        assert parse_assignment(ref) == parts
    assert parse_assignment(b"") == []


def test_consumer_protocol_hostile_bytes():
    good = assignment_bytes([TopicPartition("t", 1)])
    for cut in range(1, len(good)):
        with pytest.raises(CorruptRecordError):
            parse_assignment(good[:cut])
    good = subscription_bytes(["t"], [TopicPartition("t", 1)])
    for cut in range(len(good)):
        with pytest.raises(CorruptRecordError):
            parse_subscription(good[:cut])
