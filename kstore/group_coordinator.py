"""Committed offsets and group metadata of a store, in its `__consumer_offsets` topic (the
storage half of Kafka's GroupCoordinator / GroupMetadataManager).

Writes go through OffsetsTopic (offsets_topic.py): the shared-writer protocol under each
partition's flock. One commit is ONE batch (all its offsets: atomic), in the page cache when the
call returns (it survives `kill -9`; fsync only with `flush.messages`).

Reads are incremental: per partition, a read-only Log and the latest value of every key read so
far (tombstones delete), advanced by reading only the records after the last one applied. A
segment we read being replaced (compaction, which may drop tombstones) or the log moving below
our position resets that partition's state, which is then read again.

Records are Kafka's (group_records.py), so a broker reads what kstore wrote and kstore reads a
broker's `__consumer_offsets` (value versions 0-4, GroupMetadata with members; the KIP-848 group
records are skipped; transactional offset commits are read as plain ones).
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, Union

from kstore.broker_config import BrokerConfig
from kstore.clock import SYSTEM_TIME
from kstore.config import LogConfig
from kstore.errors import CorruptRecordError, InvalidConfigError, KStoreError, UnknownTopicError
from kstore.fileio import FileOps, get_file_ops
from kstore.group_records import (CONSUMER_PROTOCOL_TYPE, OFFSETS_TOPIC, GroupKey, GroupMetadata,
                                  MemberMetadata,
                                  OffsetAndMetadata, OffsetKey, group_metadata_key,
                                  group_metadata_value, offset_commit_key, offset_commit_value,
                                  parse_group_value, parse_key, parse_offset_value,
                                  parse_subscription, partition_for)
from kstore.log import Log
from kstore.log_dir_failure import LogDirFailureChannel
from kstore.offsets_topic import GROUPS_DIR, CoordinatorLockTimeout, OffsetsTopic
from kstore.topic_partition import TopicPartition
from kstore.topics import HostedPartitions

if TYPE_CHECKING:
    from kstore.manager import LogManager

__all__ = ["GroupCoordinator", "GroupNotEmptyError", "GroupIdNotFoundError", "GroupRecordError", "CoordinatorLockTimeout", "GROUPS_DIR",
           "OffsetAndMetadata", "GroupMetadata"]

log = logging.getLogger("kstore.groups")


class GroupNotEmptyError(KStoreError):
    """delete_group of a group that still has live members (Kafka's GroupNotEmptyException)."""


class GroupIdNotFoundError(KStoreError):
    """delete_group of a group with no live member, metadata or committed offset (Kafka's
    GroupIdNotFoundException, GROUP_ID_NOT_FOUND)."""


class GroupRecordError(CorruptRecordError):
    """A record of a valid batch that is not a well-formed group record (naming the partition
    and offset): no recovery removes it."""


class _State:
    """One partition's read side: a read-only Log and the latest value of every key read."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: Optional[Log] = None
        self.next = 0                  # the next offset to apply
        self.seen: tuple = ()          # the segments read (a replaced one resets the state)
        self.offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        self.groups: dict[str, GroupMetadata] = {}

    def reset(self) -> None:
        self.next = 0
        self.seen = ()
        self.offsets = {}
        self.groups = {}


class GroupCoordinator:
    """Committed offsets and group metadata of a store, in __consumer_offsets."""

    def __init__(self, store: "LogManager | str | os.PathLike | Sequence[str]", *,
                 num_partitions: Optional[int] = None, lock_timeout: float = 30.0,
                 io: Optional[FileOps] = None, time=None,
                 config: Optional[Mapping[str, Any] | BrokerConfig] = None,
                 failures: Optional[LogDirFailureChannel] = None) -> None:
        """store: a LogManager (its log dirs and broker settings) or log dirs. config: broker
        keys (`offsets.*`) or a BrokerConfig when store is not a LogManager. num_partitions: the
        offsets topic's partition count if it does not exist yet (default
        offsets.topic.num.partitions, 50); once it exists it is fixed and a different explicit
        value is refused. failures: the log dirs' failure channel (default: a LogManager's):
        a write to an offline dir's partition is refused (CoordinatorNotAvailableError)."""
        if isinstance(store, (str, os.PathLike, Sequence)):
            dirs = ([os.fspath(store)] if isinstance(store, (str, os.PathLike))
                    else [os.fspath(d) for d in store])
            cfg = config if isinstance(config, BrokerConfig) else BrokerConfig(config, warn=False)
        else:
            dirs = list(store.log_dirs)
            cfg = store.broker_config
            failures = failures or getattr(store, "log_dir_failure_channel", None)  # a reader's: none
        if not dirs:
            raise InvalidConfigError("a GroupCoordinator needs at least one log dir")
        self.log_dirs = [os.path.abspath(d) for d in dirs]
        self._io = io or get_file_ops()
        self._time = time or SYSTEM_TIME
        self.lock_timeout = lock_timeout
        self.retention_ms = cfg["offsets.retention.minutes"] * 60_000
        self.check_interval_ms = cfg["offsets.retention.check.interval.ms"]
        self._mutex = threading.Lock()        # _states (a leaf)
        self._states: dict[int, _State] = {}
        self._closed = False
        self.topic = OffsetsTopic(self.log_dirs, num_partitions=num_partitions,
                                  default_partitions=cfg["offsets.topic.num.partitions"],
                                  config=LogConfig({"cleanup.policy": "compact",
                                                    "compression.type": "producer",
                                                    "segment.bytes": cfg["offsets.topic.segment.bytes"]}),
                                  io=self._io, time=self._time, lock_timeout=lock_timeout,
                                  failures=failures)
        self.num_partitions = self.topic.num_partitions
        self._hosted = HostedPartitions(self.log_dirs, self._io)     # what commits may name

    # -- where things are ----------------------------------------------------------------------
    def partition_for(self, group_id: str) -> int:
        """The group's __consumer_offsets partition (Kafka's abs(hashCode) % N)."""
        return partition_for(group_id, self.num_partitions)

    def log_dir_for(self, group_id: str) -> str:
        """The log dir holding the group's offsets partition (where .kstore-groups/<g>/ lives):
        the one that already holds it, else the first."""
        return os.path.dirname(self.topic.partition_path(self.partition_for(group_id)))

    def check_available(self, group_id: str) -> int:
        """The group's partition; CoordinatorNotAvailableError if its log dir is offline (under
        a LogManager): Kafka's coordinator of that partition is unavailable, reads and writes."""
        p = self.partition_for(group_id)
        self.topic.check_online(p)
        return p

    def _append(self, p: int, records: list, sleep: Optional[Callable[[float], None]] = None) -> None:
        with self.topic.locked(p, sleep=sleep) as lg:
            lg.append(records)

    # -- reads ---------------------------------------------------------------------------------
    def _state(self, p: int) -> _State:
        with self._mutex:
            s = self._states.get(p)
            if s is None:
                s = self._states[p] = _State()
            return s

    def _advance(self, p: int) -> _State:
        """The partition's state with every record written so far applied (state lock NOT held
        on return: the caller copies what it needs under s.lock)."""
        s = self._state(p)
        try:
            with s.lock:
                self._advance_locked(p, s)
        except GroupRecordError:
            raise
        except CorruptRecordError as e:
            # a crash (power loss) left a torn batch that only a writer's recovery removes: recover
            # under the partition's flock, then read it all again; corruption that recovery
            # cannot explain (a bad record inside a valid batch) is raised
            log.warning("reading %s: %s; recovering it", self.topic.partition_path(p), e)
            with self.topic.locked(p, reopen=True):
                pass
            with s.lock:
                self._forget(s)
                self._advance_locked(p, s)
        return s

    def _forget(self, s: _State) -> None:
        """Drop a partition's read state and its read-only Log (state lock held)."""
        if s.log is not None:
            s.log.close_handlers()
        s.log = None
        s.reset()

    def _advance_locked(self, p: int, s: _State) -> None:
        if self._closed:
            raise KStoreError("GroupCoordinator is closed")
        lg = s.log
        try:
            if lg is None:
                path = self.topic.partition_path(p)
                if not self._io.exists(path):
                    return
                lg = s.log = Log.open(path, LogConfig(), read_only=True, io=self._io)
            else:
                lg.refresh()
        except UnknownTopicError:
            self._forget(s)
            return
        segs = lg.segments
        live = {id(x) for x in segs}
        if (s.seen and any(id(x) not in live for x in s.seen)) or lg.log_end_offset < s.next:
            s.reset()             # a segment we read was replaced (compaction) or cut
        end = lg.log_end_offset
        start = max(s.next, lg.log_start_offset)
        if start < end:
            for chunk in lg.iter_chunks(start):
                for rec in chunk:
                    self._apply(p, s, rec)
                s.next = chunk[-1].offset + 1
        s.next = max(s.next, end)
        s.seen = tuple(segs)

    def _apply(self, p: int, s: _State, rec) -> None:
        key, value = rec.key, rec.value
        if key is None:
            return
        try:
            k = parse_key(key)
            if isinstance(k, OffsetKey):
                tp = TopicPartition(k.topic, k.partition)
                if value is None:
                    g = s.offsets.get(k.group)
                    if g is not None:
                        g.pop(tp, None)
                        if not g:
                            del s.offsets[k.group]
                else:
                    s.offsets.setdefault(k.group, {})[tp] = parse_offset_value(value)
            elif isinstance(k, GroupKey):
                if value is None:
                    s.groups.pop(k.group, None)
                else:
                    s.groups[k.group] = parse_group_value(value)
        except CorruptRecordError as e:
            raise GroupRecordError(
                f"{e} (record at offset {rec.offset} of {self.topic.partition_path(p)})") from None

    # -- the API -------------------------------------------------------------------------------
    def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, Union[OffsetAndMetadata, int]],
                       *, generation: int = -1, member_id: str = "",
                       sleep: Optional[Callable[[float], None]] = None) -> None:
        """Commit offsets as ONE batch of OffsetCommit records in the group's partition (all or
        none survive a crash). A partition the store does not host (HostedPartitions: an unknown
        topic, one being deleted, a partition beyond the count) raises UnknownTopicError and
        nothing is written (Kafka's UNKNOWN_TOPIC_OR_PARTITION). A commit timestamp of -1 becomes now. generation/member_id are
        accepted for Kafka's API shape; ownership is checked by group membership, not here.
        sleep: the pauses of the wait for the partition's flock (may raise: a Consumer's
        wakeup, and then nothing is written)."""
        if not offsets:
            return
        now = self._time.milliseconds()
        recs = []
        for tp, om in offsets.items():
            topic, part = tp
            if not isinstance(om, OffsetAndMetadata):
                om = OffsetAndMetadata(int(om))
            if om.offset < 0:
                raise ValueError(f"cannot commit a negative offset {om.offset} for {topic}-{part}")
            ts = now if om.commit_timestamp == -1 else om.commit_timestamp
            recs.append((offset_commit_key(group_id, topic, part),
                         offset_commit_value(om, commit_timestamp=ts), ts))
        with self.topic.locked(self.partition_for(group_id), sleep=sleep) as lg:
            # under the flock delete_topic's tombstones take: a commit checked before the
            # deletion was recorded lands before them, one after it is refused
            unknown = self._hosted.unknown(TopicPartition(*tp) for tp in offsets)
            if unknown:
                raise UnknownTopicError(f"cannot commit offsets of {', '.join(map(str, sorted(unknown)))}: "
                                        "This server does not host this topic-partition.", unknown)
            lg.append(recs)

    def fetch_offsets(self, group_id: str, partitions: Optional[Iterable[TopicPartition]] = None
                      ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (only those of partitions, if given).
        CoordinatorNotAvailableError (nothing read) while its partition's log dir is offline."""
        s = self._advance(self.check_available(group_id))
        with s.lock:
            mine = dict(s.offsets.get(group_id, {}))
        if partitions is None:
            return mine
        out = {}
        for tp in partitions:
            tp = TopicPartition(*tp)
            if tp in mine:
                out[tp] = mine[tp]
        return out

    def store_group(self, group_id: str, group: GroupMetadata, *,
                    sleep: Optional[Callable[[float], None]] = None) -> None:
        """Write the group's GroupMetadata record (value version 3, as Kafka at each generation).
        sleep: the pauses of the flock wait (may raise: a closing consumer's deadline)."""
        self._append(self.partition_for(group_id),
                     [(group_metadata_key(group_id), group_metadata_value(group),
                       self._time.milliseconds())], sleep)

    def group(self, group_id: str) -> Optional[GroupMetadata]:
        """The group's last GroupMetadata record (None: none, or deleted); as fetch_offsets
        while its log dir is offline."""
        s = self._advance(self.check_available(group_id))
        with s.lock:
            return s.groups.get(group_id)

    def list_groups(self) -> list[str]:
        """Every group with metadata or committed offsets, sorted."""
        out: set[str] = set()
        for p in self.topic.existing_partitions():
            s = self._advance(p)
            with s.lock:
                out.update(s.groups)
                out.update(s.offsets)
        return sorted(out)

    @contextlib.contextmanager
    def group_locked(self, group_id: str) -> Iterator[None]:
        """groups_locked([group_id])."""
        with self.groups_locked([group_id]):
            yield

    @contextlib.contextmanager
    def groups_locked(self, group_ids: Iterable[str]) -> Iterator[None]:
        """Hold, for each group, what a member's join takes (group_files.py): its group.lock,
        or for a group with no directory yet its log dir's groups dir flock, under which alone
        a member makes one. So an admin's look at a group and its write are one step, as under
        Kafka's group lock, whether or not a member ever met here, and nothing is left behind.
        The groups dir flocks first (by path), then group.locks in name order. While held, every
        new group's first join in those log dirs waits: hold it for one step (the tool does)."""
        from kstore.group_files import GroupDir
        gdirs = [GroupDir(self._io, self.log_dir_for(g), g) for g in sorted(set(group_ids))]
        with contextlib.ExitStack() as held:
            parents = {os.path.dirname(gd.path): gd for gd in gdirs if not gd.exists()}
            for _path, gd in sorted(parents.items()):
                fd = gd.lock_groups_dir(self.lock_timeout)
                held.callback(self._io.unlock, fd)
            for gd in gdirs:            # one made before its groups dir's flock was had: exists
                if gd.exists():
                    fd = gd.lock(self.lock_timeout)
                    held.callback(gd.unlock, fd)
            yield

    def delete_group(self, group_id: str) -> None:
        """Tombstones for the group's offsets and metadata, in one batch; GroupNotEmptyError if
        it has live members (group_membership.live_members), GroupIdNotFoundError if it has
        neither metadata nor offsets (nothing written), decided under group_locked so that no
        member joins before the tombstones land."""
        with self.group_locked(group_id):
            self._delete_group(group_id)

    def _delete_group(self, group_id: str) -> None:
        live = self.live_members(group_id)
        if live:
            raise GroupNotEmptyError(
                f"group {group_id!r} has {len(live)} live member(s): "
                f"{', '.join(m.member_id for m in live)}")
        p = self.partition_for(group_id)
        missing = GroupIdNotFoundError(f"group {group_id!r} does not exist")
        if not self._io.exists(self.topic.partition_path(p)):
            raise missing
        with self.topic.locked(p) as lg:
            s = self._state(p)
            with s.lock:
                self._advance_locked(p, s)
                recs = [(offset_commit_key(group_id, t, q), None)
                        for t, q in s.offsets.get(group_id, {})]
                if group_id in s.groups:
                    recs.append((group_metadata_key(group_id), None))
            if not recs:
                raise missing
            lg.append(recs)

    def on_topics_deleted(self, topics: Iterable[str], *,
                          sleep: Optional[Callable[[float], None]] = None) -> int:
        """Tombstone every group's committed offsets of these topics (Kafka's
        onPartitionsDeleted): a topic created again under the name starts with no committed
        offsets, so its consumers reset by auto_offset_reset instead of resuming at the deleted
        topic's offsets (and skipping records). Returns the offsets removed. sleep: the pauses
        of the flock waits (may raise: the deletion retry task gives up)."""
        gone = set(topics)
        total = 0
        for p in self.topic.existing_partitions():
            self.topic.wait_writers(p, sleep=sleep)     # a commit checked before the deletion
            s = self._advance(p)       # was recorded is read here, not skipped and landing after
            with s.lock:
                if not any(tp.topic in gone for offs in s.offsets.values() for tp in offs):
                    continue
            with self.topic.locked(p, sleep=sleep) as lg:
                with s.lock:
                    self._advance_locked(p, s)     # a commit may have landed meanwhile
                    recs = [(offset_commit_key(g, tp.topic, tp.partition), None)
                            for g, offs in sorted(s.offsets.items())
                            for tp in sorted(offs) if tp.topic in gone]
                if recs:
                    lg.append(recs)
                    total += len(recs)
        return total

    def live_members(self, group_id: str) -> Optional[list[MemberMetadata]]:
        """The group's live members from groups15's membership (None: not available)."""
        # CALL SITE for groups15's kstore.group_membership.live_members (issue 15): until it
        # is merged, liveness is unknown (None) and the stored GroupMetadata is used instead
        try:
            mod = importlib.import_module("kstore.group_membership")
        except ModuleNotFoundError as e:
            if e.name != "kstore.group_membership":
                raise
            return None
        live = mod.live_members(self, group_id)     # None: no kstore member ever joined here
        return None if live is None else list(live)

    def expire_offsets(self, now_ms: Optional[int] = None, *,
                       sleep: Optional[Callable[[float], None]] = None,
                       partitions: Optional[Iterable[int]] = None) -> int:
        """Tombstone the offsets Kafka's GroupMetadata.removeExpiredOffsets expires
        (offsets.retention.minutes): of an Empty group, once retention has passed since it
        became Empty (its currentStateTimestamp; else each offset's commit time); of a group
        with no metadata (manual assignment), retention after each commit; of a live consumer
        group, only offsets of topics no member subscribes to. An offset with an explicit
        expire timestamp (value v1) expires then. An Empty group left without offsets gets a
        metadata tombstone (Kafka's Dead). Returns the offsets expired. sleep: the pauses of
        the flock waits (may raise: the partitions done are written, the rest left as they are).
        partitions: only these (default every existing one), in this order."""
        now = self._time.milliseconds() if now_ms is None else now_ms
        total = 0
        for p in self.topic.existing_partitions() if partitions is None else partitions:
            s = self._advance(p)
            with s.lock:
                offsets = {g: dict(o) for g, o in s.offsets.items()}
                groups = dict(s.groups)
            # liveness is asked with no coordinator lock held (membership may write records)
            live = {g: self.live_members(g) for g in offsets
                    if g in groups and groups[g].members}
            if not self._expired(offsets, groups, live, now):
                continue
            with self.topic.locked(p, sleep=sleep) as lg:
                with s.lock:
                    self._advance_locked(p, s)     # a commit may have landed meanwhile
                    expired = self._expired(s.offsets, s.groups, live, now)
                    recs: list[tuple[bytes, None]] = []
                    for g, tps in expired.items():
                        recs.extend((offset_commit_key(g, t, q), None) for t, q in tps)
                        left = set(s.offsets.get(g, {})) - set(tps)
                        meta = s.groups.get(g)
                        if not left and meta is not None and not meta.members:
                            recs.append((group_metadata_key(g), None))
                    total += sum(len(t) for t in expired.values())
                if recs:
                    lg.append(recs)
        return total

    def _expired(self, offsets: Mapping[str, Mapping[TopicPartition, OffsetAndMetadata]],
                 groups: Mapping[str, GroupMetadata], live: Mapping[str, Optional[list]],
                 now: int) -> dict[str, list[TopicPartition]]:
        """The offsets to expire per group (Kafka's removeExpiredOffsets). live: a group's live
        members where known (None: membership unavailable, the record's members count)."""
        out: dict[str, list[TopicPartition]] = {}
        for g, offs in offsets.items():
            meta = groups.get(g)
            subscribed: set[str] = set()
            members = None if meta is None else live.get(g, meta.members)
            if members is None:
                members = meta.members if meta is not None else ()
            if meta is None:
                base_of = None                      # simple consumer: each commit's time
            elif not members:
                # Empty: since it became Empty, if the record says when; else commit times
                ts = meta.current_state_timestamp
                base_of = ts if not meta.members and ts >= 0 else None
            elif meta.protocol_type == CONSUMER_PROTOCOL_TYPE:
                base_of = None                      # live: only topics nobody subscribes to
                try:
                    for m in members:
                        subscribed.update(parse_subscription(m.subscription).topics)
                except CorruptRecordError:
                    continue                        # unknown subscriptions: expire nothing
            else:
                continue                            # a live non-consumer group: never
            dead = []
            for tp, om in offs.items():
                if tp.topic in subscribed:
                    continue
                if om.expire_timestamp is not None:
                    if now >= om.expire_timestamp:
                        dead.append(tp)
                    continue
                base = base_of if base_of is not None else om.commit_timestamp
                if now - base >= self.retention_ms:
                    dead.append(tp)
            if dead:
                out[g] = dead
        return out

    def compact(self, *, min_dirty_ratio: float = 0.0, sleep: Optional[Callable[[float], None]] = None,
                partitions: Optional[Iterable[int]] = None) -> int:
        """Compact every written partition with kstore's cleaner, under the partition's flock
        (Kafka's log cleaner over __consumer_offsets: latest value per key; tombstones dropped
        after delete.retention.ms). The active segment is never cleaned. Returns the partitions
        cleaned. sleep: the pauses of the flock waits (may raise). partitions: as expire_offsets."""
        from kstore.cleaner import Cleaner, LogToClean, Throttler, cleanable_range
        cleaned = 0
        cleaner = Cleaner(16 << 20, 0.9, Throttler(float("inf"), self._time), self._time, self._io)
        for p in self.topic.existing_partitions() if partitions is None else partitions:
            with self.topic.locked(p, sleep=sleep) as lg:
                now = self._time.milliseconds()
                first, uncleanable, clean, dirty, _lag = cleanable_range(lg, lg.log_start_offset, now)
                if not dirty or dirty / (clean + dirty) < min_dirty_ratio:
                    continue
                with cleaner.lock:
                    cleaner.clean(LogToClean((OFFSETS_TOPIC, p), lg, first, uncleanable, clean, dirty))
                cleaned += 1
        return cleaned

    def close(self, sleep: Optional[Callable[[float], None]] = None) -> None:
        """Close every log (OffsetsTopic.close for the writable ones; sleep: its flock waits'
        pauses, which may raise: that Log is then closed unflushed)."""
        if self._closed:
            return
        with self._mutex:
            states = list(self._states.values())
        self.topic.close(sleep)
        self._closed = True
        for s in states:
            with s.lock:
                if s.log is not None:
                    s.log.close_handlers()
                    s.log = None

    def __enter__(self) -> "GroupCoordinator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GroupCoordinator({self.log_dirs!r}, num_partitions={self.num_partitions})"

