"""Kafka's `__consumer_offsets` records and the consumer protocol's bytes (pure, no I/O).

Layouts from Kafka's message specs (group-coordinator/src/main/resources/common/message/ and
clients/src/main/resources/common/message/ConsumerProtocol*.json, apache/kafka 1eb7644349cb):

- key: i16 version, then OffsetCommitKey (versions 0-1: group, topic string, partition i32) or
  GroupMetadataKey (version 2: group). Versions 3-15 are the KIP-848/KIP-932 group records
  (consumer and share groups): returned as `OtherKey`, which a reader skips.
- OffsetCommitValue v0..v4: offset i64, leaderEpoch i32 (v3+), metadata string, commitTimestamp
  i64, expireTimestamp i64 (v1 only); v4 is flexible (compact strings, tagged fields).
- GroupMetadataValue v0..v4: protocolType, generation i32, protocol?, leader?,
  currentStateTimestamp i64 (v2+), members [memberId, groupInstanceId? (v3+), clientId,
  clientHost, rebalanceTimeout i32 (v1+), sessionTimeout i32, subscription bytes, assignment
  bytes]; v4 flexible.
- ConsumerProtocolSubscription v0..v3 / ConsumerProtocolAssignment v0..v3 (not flexible; a
  newer version is parsed with the newest layout, as Kafka's ConsumerProtocol does).

Kafka writes key version 1 for offsets, value version 3 (1 when an expire timestamp is set)
and group value version 3 (MetadataVersion.offsetCommitValueVersion/groupMetadataValueVersion).
All integers big-endian. Malformed bytes raise CorruptRecordError naming what failed.
"""
from __future__ import annotations

import dataclasses
import functools
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple, Optional, Sequence, Union

from kstore.errors import CorruptRecordError, InvalidConfigError
from kstore.files import OFFSETS_TOPIC
from kstore.topic_partition import TopicPartition

__all__ = [
    "OffsetAndMetadata", "MemberMetadata", "GroupMetadata", "OffsetKey", "GroupKey", "OtherKey",
    "Subscription", "Assignment", "partition_for", "java_string_hash", "offset_commit_key",
    "offset_commit_value", "group_metadata_key", "group_metadata_value", "parse_key",
    "parse_offset_value", "parse_group_value", "subscription_bytes", "assignment_bytes",
    "parse_subscription", "parse_assignment", "CONSUMER_PROTOCOL_TYPE", "OFFSETS_TOPIC",
]

#: GroupMetadataValue.protocolType of groups of Kafka's consumer (ConsumerProtocol.PROTOCOL_TYPE).
CONSUMER_PROTOCOL_TYPE = "consumer"

OFFSET_KEY_VERSION = 1
GROUP_KEY_VERSION = 2
OFFSET_VALUE_VERSION = 3            # 1 when the commit carries an expire timestamp
GROUP_VALUE_VERSION = 3
MAX_VALUE_VERSION = 4               # the first (and latest) flexible version of both values
MAX_RECORD_KEY_VERSION = 15         # ShareGroupStatePartitionMetadataKey
CONSUMER_PROTOCOL_VERSION = 3       # ConsumerProtocol*'s highest version (what Java writes)

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


# -- data ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OffsetAndMetadata:
    """A committed offset (OffsetCommitValue)."""
    offset: int
    metadata: str = ""
    leader_epoch: Optional[int] = None        # -1 on disk for None
    commit_timestamp: int = -1                # ms; filled at commit if -1
    expire_timestamp: Optional[int] = None    # only in value v1

    @classmethod
    def coerce(cls, value: Any) -> "OffsetAndMetadata":
        """A commit()'s value: an OffsetAndMetadata, an int offset, or kafka-python's
        (offset, metadata) tuple; InvalidConfigError for anything else."""
        if isinstance(value, OffsetAndMetadata):
            return value
        if isinstance(value, tuple) and len(value) >= 1:
            return cls(int(value[0]), str(value[1]) if len(value) > 1 and value[1] else "")
        if isinstance(value, int) and value >= 0:
            return cls(value)
        raise InvalidConfigError(f"a committed offset is a non-negative int or an OffsetAndMetadata, not {value!r}")


@dataclass(frozen=True)
class MemberMetadata:
    """GroupMetadataValue.MemberMetadata: one member of a classic group."""
    member_id: str
    group_instance_id: Optional[str]
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupMetadata:
    """GroupMetadataValue: a classic group as of its last generation (no members: Empty)."""
    protocol_type: str
    generation: int
    protocol: Optional[str]
    leader: Optional[str]
    current_state_timestamp: int
    members: tuple[MemberMetadata, ...] = ()


class OffsetKey(NamedTuple):
    """OffsetCommitKey (key versions 0 and 1)."""
    version: int
    group: str
    topic: str
    partition: int


class GroupKey(NamedTuple):
    """GroupMetadataKey (key version 2)."""
    version: int
    group: str


class OtherKey(NamedTuple):
    """A key of Kafka's newer group records (versions 3-15: consumer/share groups of KIP-848
    and KIP-932), which this coordinator does not interpret."""
    version: int


class Subscription(NamedTuple):
    """ConsumerProtocolSubscription."""
    version: int
    topics: list[str]
    user_data: Optional[bytes]
    owned_partitions: list[TopicPartition]
    generation: int
    rack_id: Optional[str]


class Assignment(NamedTuple):
    """ConsumerProtocolAssignment."""
    version: int
    partitions: list[TopicPartition]
    user_data: Optional[bytes]


# -- partition of a group ---------------------------------------------------------------------
def java_string_hash(s: str) -> int:
    """Java's String.hashCode: s[0]*31^(n-1) + ... over UTF-16 code units, as an int32."""
    b = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for (u,) in struct.iter_unpack(">H", b):
        h = (31 * h + u) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """The `__consumer_offsets` partition of a group: Utils.abs(groupId.hashCode()) % N
    (Utils.abs maps Integer.MIN_VALUE to 0), as Kafka's GroupCoordinatorService.partitionFor."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % num_partitions


# -- writers ------------------------------------------------------------------------------------
class _Writer:
    """Kafka's serialisation primitives; `flexible` switches to compact forms (KIP-482)."""

    def __init__(self, flexible: bool = False):
        self.buf = bytearray()
        self.flexible = flexible

    def i16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def i32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def i64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def uvarint(self, v: int) -> None:
        while v >= 0x80:
            self.buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self.buf.append(v)

    def _len(self, n: int) -> None:       # a string's length (-1: null)
        if self.flexible:
            self.uvarint(n + 1)
        else:
            self.i16(n)

    def string(self, s: Optional[str]) -> None:
        if s is None:
            self._len(-1)
            return
        b = s.encode("utf-8")
        if len(b) > 0x7FFF:
            raise ValueError(f"string of {len(b)} bytes is longer than Kafka's 32767")
        self._len(len(b))
        self.buf += b

    def bytes_(self, b: Optional[bytes]) -> None:
        if b is None:
            if self.flexible:
                self.uvarint(0)
            else:
                self.i32(-1)
            return
        if self.flexible:
            self.uvarint(len(b) + 1)
        else:
            self.i32(len(b))
        self.buf += b

    def array_len(self, n: int) -> None:
        if self.flexible:
            self.uvarint(n + 1)
        else:
            self.i32(n)

    def tags(self) -> None:
        if self.flexible:
            self.uvarint(0)       # no tagged fields


class _Reader:
    """Kafka's primitives over hostile bytes: every length checked before use."""

    def __init__(self, b: bytes, what: str, flexible: bool = False):
        self.b = memoryview(b).cast("B") if not isinstance(b, bytes) else b
        self.pos = 0
        self.what = what
        self.flexible = flexible

    def fail(self, why: str) -> CorruptRecordError:
        return CorruptRecordError(f"malformed {self.what}: {why} at byte {self.pos} of {len(self.b)}")

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.b):
            raise self.fail(f"{n} bytes needed, {len(self.b) - self.pos} left")
        out = bytes(self.b[self.pos:self.pos + n])
        self.pos += n
        return out

    def i16(self) -> int:
        return _I16.unpack(self._take(2))[0]

    def i32(self) -> int:
        return _I32.unpack(self._take(4))[0]

    def i64(self) -> int:
        return _I64.unpack(self._take(8))[0]

    def uvarint(self) -> int:
        v = shift = 0
        while True:
            if self.pos >= len(self.b):
                raise self.fail("varint runs past the end")
            c = self.b[self.pos]
            self.pos += 1
            v |= (c & 0x7F) << shift
            if not c & 0x80:
                return v
            shift += 7
            if shift > 28:
                raise self.fail("varint longer than 5 bytes")

    def _len(self, nullable: bool, wide: bool = False) -> int:
        if self.flexible:
            n = self.uvarint() - 1
        else:
            n = self.i32() if wide else self.i16()
        if n < -1 or (n == -1 and not nullable):
            raise self.fail(f"length {n}")
        return n

    def string(self, nullable: bool = False) -> Optional[str]:
        n = self._len(nullable)
        if n == -1:
            return None
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.fail(f"string not UTF-8 ({e.reason})") from None

    def bytes_(self, nullable: bool = False) -> Optional[bytes]:
        n = self._len(nullable, wide=True)
        return None if n == -1 else self._take(n)

    def array_len(self) -> int:
        n = self.uvarint() - 1 if self.flexible else self.i32()
        if n < 0 or n > len(self.b) - self.pos:      # every element takes at least a byte
            raise self.fail(f"array length {n}")
        return n

    def tags(self) -> None:
        """Skip a tagged-field section (flexible versions): none of these structs has tags."""
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())

    def end(self) -> None:
        if self.pos != len(self.b):
            raise self.fail(f"{len(self.b) - self.pos} bytes left over")


# -- keys ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4096)
def offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    """OffsetCommitKey, key version 1 (what Kafka writes). Cached: a consumer commits the same
    keys again and again."""
    w = _Writer()
    w.i16(OFFSET_KEY_VERSION)
    w.string(group)
    w.string(topic)
    w.i32(partition)
    return bytes(w.buf)


def group_metadata_key(group: str) -> bytes:
    """GroupMetadataKey, key version 2."""
    w = _Writer()
    w.i16(GROUP_KEY_VERSION)
    w.string(group)
    return bytes(w.buf)


def parse_key(b: bytes) -> Union[OffsetKey, GroupKey, OtherKey]:
    """A `__consumer_offsets` record key. An unknown version raises CorruptRecordError. Cached
    (the same keys come back with every commit; results are immutable)."""
    return _parse_key(b if type(b) is bytes else bytes(b))


@functools.lru_cache(maxsize=4096)
def _parse_key(b: bytes) -> Union[OffsetKey, GroupKey, OtherKey]:
    r = _Reader(b, "__consumer_offsets key")
    v = r.i16()
    if v in (0, 1):
        r.what = f"OffsetCommitKey v{v}"
        group, topic, part = r.string(), r.string(), r.i32()
        r.end()
        return OffsetKey(v, group, topic, part)  # type: ignore[arg-type]  # not nullable
    if v == 2:
        r.what = "GroupMetadataKey v2"
        group = r.string()
        r.end()
        return GroupKey(v, group)  # type: ignore[arg-type]
    if 3 <= v <= MAX_RECORD_KEY_VERSION:
        return OtherKey(v)
    raise CorruptRecordError(f"unknown __consumer_offsets key version {v}")


# -- values -------------------------------------------------------------------------------------
_V3_HEAD = struct.Struct(">hqi")
_EMPTY_STRING = _I16.pack(0)


def offset_commit_value(o: OffsetAndMetadata, version: Optional[int] = None, *,
                        commit_timestamp: Optional[int] = None) -> bytes:
    """OffsetCommitValue: version 3 (Kafka's), 1 when o has an expire timestamp; any of 0-4
    when asked (v4 flexible). commit_timestamp overrides o's."""
    ts = o.commit_timestamp if commit_timestamp is None else commit_timestamp
    if version is None:
        if o.expire_timestamp is None:         # the usual commit: packed directly
            meta = _EMPTY_STRING if not o.metadata else None
            if meta is not None:
                return (_V3_HEAD.pack(3, o.offset, -1 if o.leader_epoch is None else o.leader_epoch)
                        + meta + _I64.pack(ts))
            version = OFFSET_VALUE_VERSION
        else:
            version = 1
    if ts != o.commit_timestamp:
        o = dataclasses.replace(o, commit_timestamp=ts)
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise ValueError(f"OffsetCommitValue has versions 0-{MAX_VALUE_VERSION}, not {version}")
    w = _Writer(flexible=version >= 4)
    w.i16(version)
    w.i64(o.offset)
    if version >= 3:
        w.i32(-1 if o.leader_epoch is None else o.leader_epoch)
    w.string(o.metadata)
    w.i64(o.commit_timestamp)
    if version == 1:
        w.i64(-1 if o.expire_timestamp is None else o.expire_timestamp)
    w.tags()
    return bytes(w.buf)


_V3_FIXED = struct.Struct(">hqih")


def parse_offset_value(b: bytes) -> OffsetAndMetadata:
    """OffsetCommitValue v0..v4."""
    n = len(b)
    if n >= 24 and b[0] == 0 and b[1] == 3:       # the usual value (v3): one unpack
        _v, offset, epoch, mlen = _V3_FIXED.unpack_from(b)
        if mlen >= 0 and 16 + mlen + 8 == n:
            try:
                meta = b[16:16 + mlen].decode("utf-8") if mlen else ""
            except UnicodeDecodeError:
                pass                               # the general path names the fault
            else:
                return OffsetAndMetadata(offset, meta, None if epoch == -1 else epoch,
                                         _I64.unpack_from(b, 16 + mlen)[0], None)
    r = _Reader(b, "OffsetCommitValue")
    v = r.i16()
    if not 0 <= v <= MAX_VALUE_VERSION:
        raise CorruptRecordError(f"unknown OffsetCommitValue version {v}")
    r.what = f"OffsetCommitValue v{v}"
    r.flexible = v >= 4
    offset = r.i64()
    epoch = r.i32() if v >= 3 else -1
    metadata = r.string()
    commit_ts = r.i64()
    expire = r.i64() if v == 1 else -1
    r.tags()
    r.end()
    return OffsetAndMetadata(offset, metadata or "", None if epoch == -1 else epoch, commit_ts,
                             None if v != 1 or expire == -1 else expire)


def group_metadata_value(g: GroupMetadata, version: int = GROUP_VALUE_VERSION) -> bytes:
    """GroupMetadataValue in version 0..4 (Kafka writes 3)."""
    if not 0 <= version <= MAX_VALUE_VERSION:
        raise ValueError(f"GroupMetadataValue has versions 0-{MAX_VALUE_VERSION}, not {version}")
    w = _Writer(flexible=version >= 4)
    w.i16(version)
    w.string(g.protocol_type)
    w.i32(g.generation)
    w.string(g.protocol)
    w.string(g.leader)
    if version >= 2:
        w.i64(g.current_state_timestamp)
    w.array_len(len(g.members))
    for m in g.members:
        w.string(m.member_id)
        if version >= 3:
            w.string(m.group_instance_id)
        w.string(m.client_id)
        w.string(m.client_host)
        if version >= 1:
            w.i32(m.rebalance_timeout)
        w.i32(m.session_timeout)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
        w.tags()
    w.tags()
    return bytes(w.buf)


def parse_group_value(b: bytes) -> GroupMetadata:
    """GroupMetadataValue v0..v4 (fields a version lacks take the schema's defaults)."""
    r = _Reader(b, "GroupMetadataValue")
    v = r.i16()
    if not 0 <= v <= MAX_VALUE_VERSION:
        raise CorruptRecordError(f"unknown GroupMetadataValue version {v}")
    r.what = f"GroupMetadataValue v{v}"
    r.flexible = v >= 4
    protocol_type = r.string()
    generation = r.i32()
    protocol = r.string(nullable=True)
    leader = r.string(nullable=True)
    ts = r.i64() if v >= 2 else -1
    members = []
    for _ in range(r.array_len()):
        member_id = r.string()
        instance = r.string(nullable=True) if v >= 3 else None
        client_id = r.string()
        host = r.string()
        rebalance = r.i32() if v >= 1 else -1
        session = r.i32()
        sub = r.bytes_()
        asg = r.bytes_()
        r.tags()
        members.append(MemberMetadata(member_id, instance, client_id, host, rebalance,  # type: ignore[arg-type]
                                      session, sub, asg))  # type: ignore[arg-type]
    r.tags()
    r.end()
    return GroupMetadata(protocol_type, generation, protocol, leader, ts, tuple(members))  # type: ignore[arg-type]


# -- ConsumerProtocol -----------------------------------------------------------------------------
def _grouped(partitions: Sequence[TopicPartition]) -> dict[str, list[int]]:
    """Partitions by topic, topics in first-seen order (Kafka's groupPartitionsByTopic)."""
    out: dict[str, list[int]] = {}
    for t, p in partitions:
        out.setdefault(t, []).append(p)
    return out


def _write_partitions(w: _Writer, partitions: Sequence[TopicPartition]) -> None:
    by_topic = _grouped(partitions)
    w.i32(len(by_topic))
    for t, ps in by_topic.items():
        w.string(t)
        w.i32(len(ps))
        for p in ps:
            w.i32(p)


def _read_partitions(r: _Reader) -> list[TopicPartition]:
    out = []
    for _ in range(r.array_len()):
        t = r.string()
        for _ in range(r.array_len()):
            out.append(TopicPartition(t, r.i32()))  # type: ignore[arg-type]
    return out


def subscription_bytes(topics: Sequence[str], owned: Sequence[TopicPartition] = (),
                       user_data: Optional[bytes] = None, *, generation: int = -1,
                       rack_id: Optional[str] = None,
                       version: int = CONSUMER_PROTOCOL_VERSION) -> bytes:
    """ConsumerProtocolSubscription (Java's client writes version 3; kafka-python 0)."""
    if not 0 <= version <= CONSUMER_PROTOCOL_VERSION:
        raise ValueError(f"ConsumerProtocolSubscription has versions 0-3, not {version}")
    w = _Writer()
    w.i16(version)
    w.i32(len(topics))
    for t in topics:
        w.string(t)
    w.bytes_(user_data)
    if version >= 1:
        _write_partitions(w, owned)
    if version >= 2:
        w.i32(generation)
    if version >= 3:
        w.string(rack_id)
    return bytes(w.buf)


def parse_subscription(b: bytes) -> Subscription:
    """ConsumerProtocolSubscription; a version above 3 is read with version 3's layout and any
    bytes after it ignored (Kafka's rule for this struct)."""
    r = _Reader(b, "ConsumerProtocolSubscription")
    v = r.i16()
    if v < 0:
        raise r.fail(f"version {v}")
    topics = [r.string() for _ in range(r.array_len())]
    user_data = r.bytes_(nullable=True)
    owned = _read_partitions(r) if v >= 1 else []
    generation = r.i32() if v >= 2 else -1
    rack = r.string(nullable=True) if v >= 3 else None
    if v <= CONSUMER_PROTOCOL_VERSION:
        r.end()
    return Subscription(v, topics, user_data, owned, generation, rack)  # type: ignore[arg-type]


def assignment_bytes(partitions: Sequence[TopicPartition], user_data: Optional[bytes] = None, *,
                     version: int = CONSUMER_PROTOCOL_VERSION) -> bytes:
    """ConsumerProtocolAssignment (the layout is the same in versions 0-3)."""
    if not 0 <= version <= CONSUMER_PROTOCOL_VERSION:
        raise ValueError(f"ConsumerProtocolAssignment has versions 0-3, not {version}")
    w = _Writer()
    w.i16(version)
    _write_partitions(w, partitions)
    w.bytes_(user_data)
    return bytes(w.buf)


def parse_assignment_full(b: bytes) -> Assignment:
    """ConsumerProtocolAssignment with its version and user data."""
    r = _Reader(b, "ConsumerProtocolAssignment")
    v = r.i16()
    if v < 0:
        raise r.fail(f"version {v}")
    parts = _read_partitions(r)
    user_data = r.bytes_(nullable=True)
    if v <= CONSUMER_PROTOCOL_VERSION:
        r.end()
    return Assignment(v, parts, user_data)


def parse_assignment(b: bytes) -> list[TopicPartition]:
    """The partitions of a ConsumerProtocolAssignment (empty bytes: no assignment yet, as a
    group member's before its first sync)."""
    if not b:
        return []
    return parse_assignment_full(b).partitions
