"""Consumer partition assignors: Kafka's RangeAssignor and RoundRobinAssignor.

A group's members share the partitions of the topics they subscribe to; the member that runs a
rebalance (group_membership.py) calls the assignor the group agreed on with every member's
subscription and the partition count of each subscribed topic, and writes the result as the new
generation's plan. Both give Kafka's results for the same inputs (the clients' classes, without
rack awareness: kstore's partitions have no replicas):

- `RangeAssignor` ("range"): per topic, partitions in numeric order split into contiguous
  ranges over that topic's subscribers sorted by member (the first `count % members` get one
  more). A member's list holds its topics in the order Java's HashMap iterates the topic map
  (what the Kafka client sends), each topic's partitions ascending.
- `RoundRobinAssignor` ("roundrobin"): every partition of every subscribed topic (topics sorted,
  partitions ascending) dealt in turn to the members sorted, skipping a member not subscribed to
  the partition's topic.

`select_protocol` picks the assignor a group uses (Kafka's GroupMetadata.selectProtocol).

Members sort as Kafka's `MemberInfo`: those with a group instance id (static membership) first,
by instance id, then the others by member id; strings compare as Java's `String.compareTo`
(UTF-16 code units).
"""
from __future__ import annotations

from typing import Any, Mapping, Optional, Protocol, Sequence

from kstore.group_records import java_string_hash
from kstore.topic_partition import TopicPartition

__all__ = ["ConsumerPartitionAssignor", "RangeAssignor", "RoundRobinAssignor", "ASSIGNORS",
           "assignor_named", "assignors_from", "select_protocol"]


class ConsumerPartitionAssignor(Protocol):
    """What a group member needs of an assignor (Kafka's ConsumerPartitionAssignor, the
    eager subset): a protocol name and a pure assign()."""

    name: str

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Sequence[str]],
               group_instance_ids: Optional[Mapping[str, Optional[str]]] = None,
               ) -> dict[str, list[TopicPartition]]:
        """member id -> its partitions, for every member in subscriptions (possibly empty).
        partitions_per_topic: partition count of each existing topic (others are skipped);
        subscriptions: member id -> subscribed topics; group_instance_ids: member id -> its
        static instance id (None or missing: a dynamic member)."""
        ...


def _java_key(s: str) -> bytes:
    """A sort key ordering strings as Java's String.compareTo (UTF-16 code unit order)."""
    return s.encode("utf-16-be", "surrogatepass")


def _hashmap_order(keys: Sequence[str]) -> list[str]:
    """keys in the order a java.util.HashMap built by inserting them in this order iterates
    them: by bucket (the spread hash masked by a table sized for the count at load factor
    0.75), equal buckets in insertion order."""
    capacity = 16
    while len(keys) > capacity * 3 // 4:
        capacity *= 2

    def bucket(k: str) -> int:
        h = java_string_hash(k) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (capacity - 1)
    return sorted(keys, key=bucket)       # sorted() is stable: ties keep insertion order


def _member_key(member_id: str, instance_id: Optional[str]) -> tuple:
    """Kafka's MemberInfo.compareTo as a sort key."""
    if instance_id is not None:
        return (0, _java_key(instance_id))
    return (1, _java_key(member_id))


def _sorted_members(member_ids, group_instance_ids: Optional[Mapping[str, Optional[str]]]) -> list[str]:
    ids = group_instance_ids or {}
    return sorted(member_ids, key=lambda m: _member_key(m, ids.get(m)))


def _check_counts(partitions_per_topic: Mapping[str, int]) -> None:
    for topic, n in partitions_per_topic.items():
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"partition count of topic {topic!r} must be an int >= 0, not {n!r}")


class RangeAssignor:
    """Kafka's RangeAssignor ("range"), without racks; see the module doc."""

    name = "range"

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Sequence[str]],
               group_instance_ids: Optional[Mapping[str, Optional[str]]] = None,
               ) -> dict[str, list[TopicPartition]]:
        _check_counts(partitions_per_topic)
        assignment: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        consumers_per_topic: dict[str, list[str]] = {}
        for member, topics in subscriptions.items():
            for topic in topics:
                consumers_per_topic.setdefault(topic, []).append(member)
        for topic in _hashmap_order(list(partitions_per_topic)):
            n = partitions_per_topic[topic]
            consumers = _sorted_members(dict.fromkeys(consumers_per_topic.get(topic, ())),
                                        group_instance_ids)
            if n == 0 or not consumers:
                continue
            per, extra = divmod(n, len(consumers))
            for i, member in enumerate(consumers):
                start = per * i + min(i, extra)
                length = per + (1 if i < extra else 0)
                assignment[member].extend(TopicPartition(topic, p) for p in range(start, start + length))
        return assignment


class RoundRobinAssignor:
    """Kafka's RoundRobinAssignor ("roundrobin"); see the module doc."""

    name = "roundrobin"

    def assign(self, partitions_per_topic: Mapping[str, int],
               subscriptions: Mapping[str, Sequence[str]],
               group_instance_ids: Optional[Mapping[str, Optional[str]]] = None,
               ) -> dict[str, list[TopicPartition]]:
        _check_counts(partitions_per_topic)
        assignment: dict[str, list[TopicPartition]] = {m: [] for m in subscriptions}
        members = _sorted_members(subscriptions, group_instance_ids)
        subscribed = {m: set(subscriptions[m]) for m in members}
        topics = sorted({t for ts in subscriptions.values() for t in ts}, key=_java_key)
        i = 0
        for topic in topics:
            for p in range(partitions_per_topic.get(topic, 0)):
                while topic not in subscribed[members[i]]:
                    i = (i + 1) % len(members)
                assignment[members[i]].append(TopicPartition(topic, p))
                i = (i + 1) % len(members)
        return assignment


#: The assignors kstore knows, by Kafka's protocol name.
ASSIGNORS: dict[str, type] = {"range": RangeAssignor, "roundrobin": RoundRobinAssignor}


def assignor_named(name: str) -> ConsumerPartitionAssignor:
    """A new assignor for a protocol name ("range", "roundrobin"); ValueError for others."""
    try:
        return ASSIGNORS[name]()
    except KeyError:
        raise ValueError(f"unknown partition assignor {name!r} (known: {', '.join(ASSIGNORS)})") from None


def assignors_from(names: Sequence[Any]) -> list[ConsumerPartitionAssignor]:
    """partition_assignment_strategy: assignor names ("range", "roundrobin"), classes or objects."""
    return [assignor_named(n) if isinstance(n, str) else n() if isinstance(n, type) else n
            for n in names]


def select_protocol(members: Sequence[dict], leader: Optional[str]) -> Optional[str]:
    """Kafka's selectProtocol: the assignors every member supports; each member votes for the
    first of its own list among them; most votes wins (a tie: the leader's preference)."""
    if not members:
        return None
    common = set(members[0]["assignors"]).intersection(*(m["assignors"] for m in members[1:]))
    if not common:
        return None
    votes: dict[str, int] = {}
    for m in members:
        vote = next(a for a in m["assignors"] if a in common)
        votes[vote] = votes.get(vote, 0) + 1
    first = next((m for m in members if m["member_id"] == leader), members[0])
    rank = {a: i for i, a in enumerate(first["assignors"])}
    return max(votes, key=lambda a: (votes[a], -rank.get(a, len(rank))))
