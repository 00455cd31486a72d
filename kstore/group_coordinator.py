"""Committed offsets and group metadata of a store, in its `__consumer_offsets` topic (the
storage half of Kafka's GroupCoordinator / GroupMetadataManager).

`__consumer_offsets-N` are shared-writer partitions: any process (a consumer beside a producer's
LogManager, a tool, the manager's own expiry task) appends to one under an exclusive flock of the
partition directory, waited for up to `lock_timeout` seconds. A LogManager leaves these
directories out of its registry, so its `.lock` never excludes a committer. The writer opens the
partition as a managed Log (it takes no lock itself: the flock is ours) and keeps it open between
commits while nobody else wrote: the partition's notification word (`.kstore-notify`, bumped by
every writer) and its file identity unchanged since our last append; otherwise the stale Log is
dropped without a flush and the partition reopened, which recovers a tail a killed committer
left torn. One commit is ONE batch (all its offsets: atomic), in the page cache when the call
returns (it survives `kill -9`; fsync only with `flush.messages`).

Reads are incremental: per partition, a read-only Log and the state of every key read so far
(latest value per key; tombstones delete), advanced by reading only the records after the last
one applied. A segment we read being replaced (compaction, which may drop tombstones) or the log
moving below our position resets that partition's state and re-reads it.

Records are Kafka's (group_records.py), so a broker reads what kstore wrote and kstore reads a
broker's `__consumer_offsets` (value versions 0-4; transactional commits are read as plain ones).
"""
from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import threading
import time as _time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Optional, Sequence, Union

from kstore.broker_config import BrokerConfig
from kstore.clock import SYSTEM_TIME
from kstore.config import LogConfig
from kstore.errors import CorruptRecordError, InvalidConfigError, KStoreError, UnknownTopicError
from kstore.fileio import FileOps, get_file_ops
from kstore.files import partition_dirs
from kstore.group_records import (CONSUMER_PROTOCOL_TYPE, OFFSETS_TOPIC, GroupKey, GroupMetadata,
                                  OffsetAndMetadata, OffsetKey, group_metadata_key,
                                  group_metadata_value, offset_commit_key, offset_commit_value,
                                  parse_group_value, parse_key, parse_offset_value,
                                  parse_subscription, partition_for)
from kstore.log import Log
from kstore.notify import NOTIFY_FILE
from kstore.topic_partition import TopicPartition
from kstore.topics import new_topic_id, write_partition_metadata

if TYPE_CHECKING:
    from kstore.manager import LogManager

__all__ = ["GroupCoordinator", "GroupNotEmptyError", "CoordinatorLockTimeout", "GROUPS_DIR",
           "OffsetAndMetadata", "GroupMetadata"]

log = logging.getLogger("kstore.groups")

#: Per log dir: the offsets topic's record and groups15's per-group directories.
GROUPS_DIR = ".kstore-groups"
#: The offsets topic's partition count and topic id, fixed once written (in GROUPS_DIR).
TOPIC_FILE = "offsets-topic.json"
_TOPIC_FILE_LOCK = "offsets-topic.lock"


class GroupNotEmptyError(KStoreError):
    """delete_group of a group that still has live members (Kafka's GroupNotEmptyException)."""


class CoordinatorLockTimeout(KStoreError):
    """Another writer held a `__consumer_offsets` partition for longer than lock_timeout."""


def _flock_holder(path: str) -> Optional[int]:
    """The pid holding a flock on path, from /proc/locks (Linux), for error messages only."""
    try:
        ino = os.stat(path).st_ino
        with open("/proc/locks") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 6 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(ino):
                    return int(parts[4])
    except (OSError, ValueError):
        pass
    return None


class _Writer:
    """One partition's write side in this coordinator: its Log kept between commits."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: Optional[Log] = None
        self.word = -1                 # the notification word after our last change
        self.notify_ino = -1


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
                 config: Optional[Mapping[str, Any]] = None) -> None:
        """store: a LogManager (its log dirs and broker settings) or log dirs. config: broker
        keys (`offsets.*`) when store is not a LogManager. num_partitions: the offsets topic's
        partition count if it does not exist yet (default offsets.topic.num.partitions, 50);
        once it exists it is fixed and a different explicit value is refused."""
        if isinstance(store, (str, os.PathLike)):
            dirs = [os.fspath(store)]
            cfg = BrokerConfig(config, warn=False)
        elif isinstance(store, Sequence):
            dirs = [os.fspath(d) for d in store]
            cfg = BrokerConfig(config, warn=False)
        else:
            dirs = list(store.log_dirs)
            cfg = store.broker_config
        if not dirs:
            raise InvalidConfigError("a GroupCoordinator needs at least one log dir")
        self.log_dirs = [os.path.abspath(d) for d in dirs]
        self._io = io or get_file_ops()
        self._time = time or SYSTEM_TIME
        self.lock_timeout = lock_timeout
        self.retention_ms = cfg["offsets.retention.minutes"] * 60_000
        self.check_interval_ms = cfg["offsets.retention.check.interval.ms"]
        self._config = LogConfig({"cleanup.policy": "compact", "compression.type": "producer",
                                  "segment.bytes": cfg["offsets.topic.segment.bytes"]})
        self._mutex = threading.Lock()        # the maps below (a leaf)
        self._writers: dict[int, _Writer] = {}
        self._states: dict[int, _State] = {}
        self._paths: dict[int, str] = {}
        self._closed = False
        recorded = self._read_topic_file()
        if recorded is not None:
            n = recorded["num_partitions"]
            if num_partitions is not None and num_partitions != n:
                raise InvalidConfigError(
                    f"{OFFSETS_TOPIC} has {n} partitions in {self.log_dirs} (fixed when it was "
                    f"created), not {num_partitions}")
            self._topic_id = recorded.get("topic_id")
        else:
            n = num_partitions if num_partitions is not None else cfg["offsets.topic.num.partitions"]
            self._topic_id = None
        if n < 1:
            raise InvalidConfigError(f"offsets.topic.num.partitions must be >= 1, got {n}")
        self.num_partitions = n
        self._recorded = recorded is not None

    # -- where things are ----------------------------------------------------------------------
    def partition_for(self, group_id: str) -> int:
        """The group's __consumer_offsets partition (Kafka's abs(hashCode) % N)."""
        return partition_for(group_id, self.num_partitions)

    def log_dir_for(self, group_id: str) -> str:
        """The log dir holding the group's offsets partition (where .kstore-groups/<g>/ lives):
        the one that already holds it, else the first."""
        return os.path.dirname(self._partition_path(self.partition_for(group_id)))

    def _partition_path(self, p: int) -> str:
        path = self._paths.get(p)
        if path is not None:
            return path
        name = f"{OFFSETS_TOPIC}-{p}"
        for d in self.log_dirs:
            cand = os.path.join(d, name)
            if self._io.exists(cand):
                self._paths[p] = cand
                return cand
        return os.path.join(self.log_dirs[0], name)

    def _existing_partitions(self) -> list[int]:
        found = []
        for d in self.log_dirs:
            if not self._io.exists(d):
                continue
            for (topic, p), path in partition_dirs(self._io, d):
                if topic == OFFSETS_TOPIC and p not in found:
                    if p >= self.num_partitions:
                        raise InvalidConfigError(
                            f"{path} exists but {OFFSETS_TOPIC} has {self.num_partitions} "
                            f"partitions here; pass num_partitions (offsets.topic.num.partitions)")
                    self._paths.setdefault(p, path)
                    found.append(p)
        return sorted(found)

    # -- the topic record ----------------------------------------------------------------------
    def _read_topic_file(self) -> Optional[dict]:
        for d in self.log_dirs:
            path = os.path.join(d, GROUPS_DIR, TOPIC_FILE)
            if self._io.exists(path):
                try:
                    rec = json.loads(self._io.read_file(path))
                    n = rec["num_partitions"]
                    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                        raise ValueError(f"num_partitions {n!r}")
                    return rec
                except (ValueError, KeyError, TypeError) as e:
                    raise KStoreError(f"unreadable {path}: {e}") from None
        return None

    def _ensure_recorded(self) -> None:
        """Record the partition count (and a topic id) before the first write, under a lock
        file so two first writers agree; a different count recorded meanwhile is refused."""
        if self._recorded:
            return
        d = os.path.join(self.log_dirs[0], GROUPS_DIR)
        self._mkdir(d)
        fd = self._wait_lock(os.path.join(d, _TOPIC_FILE_LOCK), directory=False,
                             what=f"{OFFSETS_TOPIC}'s record in {d}")
        try:
            rec = self._read_topic_file()
            if rec is None:
                rec = {"version": 0, "num_partitions": self.num_partitions,
                       "topic_id": new_topic_id()}
                self._io.write_atomic(os.path.join(d, TOPIC_FILE), json.dumps(rec).encode())
            elif rec["num_partitions"] != self.num_partitions:
                raise InvalidConfigError(
                    f"{OFFSETS_TOPIC} was created with {rec['num_partitions']} partitions in "
                    f"{self.log_dirs} meanwhile, not {self.num_partitions}")
            self._topic_id = rec.get("topic_id")
            self._recorded = True
        finally:
            self._io.unlock(fd)

    def _mkdir(self, path: str) -> None:
        if self._io.exists(path):
            return
        try:
            self._io.mkdir(path)
        except FileExistsError:
            return
        self._io.fsync_dir(os.path.dirname(path))

    # -- the shared-writer protocol ------------------------------------------------------------
    def _wait_lock(self, path: str, *, directory: bool, what: str) -> int:
        """flock path exclusively, waiting up to lock_timeout (polling: 0.2 ms doubling to 20 ms)."""
        deadline = _time.monotonic() + self.lock_timeout
        pause = 0.0002
        while True:
            fd = self._io.try_lock(path, directory=directory)
            if fd is not None:
                return fd
            if _time.monotonic() >= deadline:
                pid = _flock_holder(path)
                holder = f" (held by pid {pid})" if pid is not None else ""
                raise CoordinatorLockTimeout(
                    f"timed out after {self.lock_timeout} s waiting for {what}{holder}")
            _time.sleep(pause)
            pause = min(pause * 2, 0.02)

    def _writer(self, p: int) -> _Writer:
        with self._mutex:
            w = self._writers.get(p)
            if w is None:
                w = self._writers[p] = _Writer()
            return w

    @contextlib.contextmanager
    def _locked(self, p: int) -> Iterator[Log]:
        """The partition's writable Log, with its flock held for the block."""
        if self._closed:
            raise KStoreError("GroupCoordinator is closed")
        self._ensure_recorded()
        w = self._writer(p)
        with w.lock:
            path = self._partition_path(p)
            created = not self._io.exists(path)
            if created:
                self._mkdir(os.path.dirname(path))
                self._mkdir(path)
                self._paths[p] = path
            fd = self._wait_lock(path, directory=True, what=f"the writer's lock of {path}")
            try:
                lg = self._writable(p, w, path)
                if self._topic_id:
                    write_partition_metadata(self._io, path, self._topic_id)
                yield lg
                bell = lg.notifier.bell
                w.word = bell.load() if bell.shared else -1
            finally:
                self._io.unlock(fd)

    def _still_ours(self, w: _Writer, path: str) -> bool:
        """Whether our kept Log still describes the partition (flock held): nobody bumped its
        notification word since our last change and the word's file is the one we mapped."""
        lg = w.log
        if lg is None or lg.closed or w.word == -1:
            return False
        bell = lg.notifier.bell
        try:
            ino = self._io.stat_path(os.path.join(path, NOTIFY_FILE)).st_ino
        except OSError:
            return False
        return bell.shared and not bell.closed and bell.load() == w.word and ino == w.notify_ino

    def _writable(self, p: int, w: _Writer, path: str) -> Log:
        """Our Log of the partition if nobody else changed it since our last write, else a
        fresh open (recovering a tail a killed writer tore)."""
        if self._still_ours(w, path):
            return w.log  # type: ignore[return-value]  # checked by _still_ours
        if w.log is not None:
            w.log.close_handlers()     # stale: its idea of the files is not theirs any more
            w.log = None
        lg = Log.open(path, self._config, clean_shutdown=False, recovery_point=0, io=self._io,
                      time=self._time)
        w.log = lg
        try:
            w.notify_ino = self._io.stat_path(os.path.join(path, NOTIFY_FILE)).st_ino
        except OSError:
            w.notify_ino = -1
        return lg

    def _append(self, p: int, records: list) -> None:
        with self._locked(p) as lg:
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
        with s.lock:
            self._advance_locked(p, s)
        return s

    def _advance_locked(self, p: int, s: _State) -> None:
        if self._closed:
            raise KStoreError("GroupCoordinator is closed")
        lg = s.log
        try:
            if lg is None:
                path = self._partition_path(p)
                if not self._io.exists(path):
                    return
                lg = s.log = Log.open(path, LogConfig(), read_only=True, io=self._io)
            else:
                lg.refresh()
        except UnknownTopicError:
            if s.log is not None:
                s.log.close_handlers()
            s.log = None
            s.reset()
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
            raise CorruptRecordError(
                f"{e} (record at offset {rec.offset} of {self._partition_path(p)})") from None

    # -- the API -------------------------------------------------------------------------------
    def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, Union[OffsetAndMetadata, int]],
                       *, generation: int = -1, member_id: str = "") -> None:
        """Commit offsets as ONE batch of OffsetCommit records in the group's partition (all or
        none survive a crash). A commit timestamp of -1 becomes now. generation/member_id are
        accepted for Kafka's API shape; ownership is checked by group membership, not here."""
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
            if om.commit_timestamp == -1:
                om = replace(om, commit_timestamp=now)
            recs.append((offset_commit_key(group_id, topic, part), offset_commit_value(om),
                         om.commit_timestamp))
        self._append(self.partition_for(group_id), recs)

    def fetch_offsets(self, group_id: str, partitions: Optional[Iterable[TopicPartition]] = None
                      ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (only those of partitions, if given)."""
        s = self._advance(self.partition_for(group_id))
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

    def store_group(self, group_id: str, group: GroupMetadata) -> None:
        """Write the group's GroupMetadata record (value version 3, as Kafka at each generation)."""
        self._append(self.partition_for(group_id),
                     [(group_metadata_key(group_id), group_metadata_value(group),
                       self._time.milliseconds())])

    def group(self, group_id: str) -> Optional[GroupMetadata]:
        """The group's last GroupMetadata record (None: none, or deleted)."""
        s = self._advance(self.partition_for(group_id))
        with s.lock:
            return s.groups.get(group_id)

    def list_groups(self) -> list[str]:
        """Every group with metadata or committed offsets, sorted."""
        out: set[str] = set()
        for p in self._existing_partitions():
            s = self._advance(p)
            with s.lock:
                out.update(s.groups)
                out.update(s.offsets)
        return sorted(out)

    def delete_group(self, group_id: str) -> None:
        """Tombstones for the group's offsets and metadata, in one batch; GroupNotEmptyError if
        it has live members (group_membership.live_members)."""
        live = self._live_members(group_id)
        if live:
            raise GroupNotEmptyError(
                f"group {group_id!r} has {len(live)} live member(s): "
                f"{', '.join(m.member_id for m in live)}")
        p = self.partition_for(group_id)
        if not self._io.exists(self._partition_path(p)):
            return
        with self._locked(p):
            s = self._state(p)
            with s.lock:
                self._advance_locked(p, s)
                recs = [(offset_commit_key(group_id, t, q), None)
                        for t, q in s.offsets.get(group_id, {})]
                if group_id in s.groups:
                    recs.append((group_metadata_key(group_id), None))
            if recs:
                self._append_locked(p, recs)

    def _append_locked(self, p: int, records: list) -> None:
        w = self._writer(p)
        assert w.log is not None
        w.log.append(records)

    def _live_members(self, group_id: str) -> Optional[list]:
        """The group's live members from groups15's membership (None: not available)."""
        # CALL SITE for groups15's kstore.group_membership.live_members (issue 15): until it
        # is merged, liveness is unknown (None) and the stored GroupMetadata is used instead
        try:
            mod = importlib.import_module("kstore.group_membership")
        except ImportError:
            return None
        return list(mod.live_members(self, group_id))

    def expire_offsets(self, now_ms: Optional[int] = None) -> int:
        """Tombstone the offsets Kafka's GroupMetadata.removeExpiredOffsets expires
        (offsets.retention.minutes): of an Empty group, once retention has passed since it
        became Empty (its currentStateTimestamp; else each offset's commit time); of a group
        with no metadata (manual assignment), retention after each commit; of a live consumer
        group, only offsets of topics no member subscribes to. An offset with an explicit
        expire timestamp (value v1) expires then. An Empty group left without offsets gets a
        metadata tombstone (Kafka's Dead). Returns the offsets expired."""
        now = self._time.milliseconds() if now_ms is None else now_ms
        total = 0
        for p in self._existing_partitions():
            s = self._advance(p)
            with s.lock:
                candidates = bool(self._expired(s, now))
            if not candidates:
                continue
            with self._locked(p):
                with s.lock:
                    self._advance_locked(p, s)     # a commit may have landed meanwhile
                    expired = self._expired(s, now)
                    recs: list[tuple[bytes, None]] = []
                    for g, tps in expired.items():
                        recs.extend((offset_commit_key(g, t, q), None) for t, q in tps)
                        left = set(s.offsets.get(g, {})) - set(tps)
                        meta = s.groups.get(g)
                        if not left and meta is not None and not meta.members:
                            recs.append((group_metadata_key(g), None))
                    total += sum(len(t) for t in expired.values())
                if recs:
                    self._append_locked(p, recs)
        return total

    def _expired(self, s: _State, now: int) -> dict[str, list[TopicPartition]]:
        out: dict[str, list[TopicPartition]] = {}
        for g, offs in s.offsets.items():
            meta = s.groups.get(g)
            subscribed: set[str] = set()
            if meta is None:
                base_of = None                      # simple consumer: commit time
            elif not meta.members or self._live_members(g) == []:
                base_of = meta.current_state_timestamp if not meta.members and meta.current_state_timestamp >= 0 else None
            elif meta.protocol_type == CONSUMER_PROTOCOL_TYPE:
                base_of = None
                try:
                    for m in meta.members:
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

    def compact(self, *, min_dirty_ratio: float = 0.0) -> int:
        """Compact every written partition with kstore's cleaner, under the partition's flock
        (Kafka's log cleaner over __consumer_offsets: latest value per key; tombstones dropped
        after delete.retention.ms). The active segment is never cleaned. Returns the partitions
        cleaned."""
        from kstore.cleaner import Cleaner, LogToClean, Throttler, cleanable_range
        cleaned = 0
        cleaner = Cleaner(16 << 20, 0.9, Throttler(float("inf"), self._time), self._time, self._io)
        for p in self._existing_partitions():
            with self._locked(p) as lg:
                now = self._time.milliseconds()
                first, uncleanable, clean, dirty, _lag = cleanable_range(lg, lg.log_start_offset, now)
                if not dirty or dirty / (clean + dirty) < min_dirty_ratio:
                    continue
                with cleaner.lock:
                    cleaner.clean(LogToClean((OFFSETS_TOPIC, p), lg, first, uncleanable, clean, dirty))
                cleaned += 1
        return cleaned

    def close(self) -> None:
        """Close every log. A writable Log nobody else wrote since is closed cleanly (flushed,
        its runway trimmed); a stale one is dropped."""
        if self._closed:
            return
        with self._mutex:
            writers = dict(self._writers)
            states = list(self._states.values())
        for p, w in writers.items():
            with w.lock:
                lg = w.log
                if lg is None:
                    continue
                path = self._partition_path(p)
                try:
                    fd = self._wait_lock(path, directory=True, what=f"the writer's lock of {path}")
                except (OSError, KStoreError) as e:
                    log.warning("closing %s without a flush: %s", lg.dir, e)
                    lg.close_handlers()
                    w.log = None
                    continue
                try:
                    if self._still_ours(w, path):
                        lg.close()
                    else:
                        lg.close_handlers()
                finally:
                    w.log = None
                    self._io.unlock(fd)
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

