"""Consumer groups across threads and processes of one machine, on file locks (issue 15).

Kafka's group coordinator is a broker; kstore's groups have no server. Members meet in the
group's directory (group_files.py) and every decision is made by whichever member notices the
need, under the group's exclusive `group.lock`:

- Liveness is a flock: each member holds its member file flock'd for its whole life; the kernel
  drops it when the process dies (kill -9 included). A member is alive iff a non-blocking flock
  attempt on its file fails. flocks belong to open file descriptions, so members in threads of
  one process are as separate as members in different processes (each opens its own).
- A rebalance (on join, leave, a death, a subscription or partition-count change) reads the
  live members' files, picks the protocol (the assignor every member supports, by their votes,
  as Kafka's GroupMetadata.selectProtocol), runs it (assignors.py) and writes the new generation
  (generation + 1, strictly increasing) and its plan to a new state file atomically, rings the group
  bell, and records a GroupMetadata through `coordinator.store_group` as Kafka writes one at
  each generation (an Empty group, generation + 1, when the last member leaves).
- The plan is not what keeps a partition to one reader: its OWNER lock is. A member reads only
  partitions whose owner flock it holds; a new assignee takes it only after the old owner
  released it (after committing its offsets) or died. poll() reports `revoked` (commit, then
  `release`) and `assigned` (owner lock taken: read from the committed offset); a partition
  still held by its old owner is taken at a later poll, woken by the bell the release rings.
- Deaths are noticed by any polling member within heartbeat_interval_ms (a flock attempt on
  each other member's file, twice per interval, so that the takeover, not only the notice,
  fits in the interval), a consumer sleeping at most `poll_timeout()` between polls; topics
  (a pattern's) and partition counts are looked at once per interval;
  `session_timeout_ms` bounds the interval (it must be larger) and is recorded for tools.
- A live member that stops polling for longer than max.poll.interval.ms (rebalance_timeout_ms)
  leaves on its own, as Kafka's heartbeat thread makes it (KIP-62): `expire()`, called by its
  consumer's poll timer (poll_timer.py), drops its member file and owner flocks WITHOUT
  committing and rebalances the others, who take its partitions from the last committed
  offsets. Its commits then raise CommitFailedError; its consumer rejoins as a new member.

A rebalance's GroupMetadata record waits <= 1 s for another process's offsets flock (then logged).
Its log dir offline (coordinator.check_available): a join, poll or rebalance raises the retriable
CoordinatorNotAvailableError, a leave only drops the flocks: nothing is written there.
"""
from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable, Mapping, Optional, Sequence

from kstore import _notify
from kstore.assignors import ConsumerPartitionAssignor, RangeAssignor, assignor_named, select_protocol
from kstore.errors import (CoordinatorNotAvailableError, InvalidConfigError, KStoreError,
                           KStoreStateError, WakeupError)
from kstore.fileio import FileOps, get_file_ops
from kstore.group_files import GroupDir, GroupLockTimeoutError, live_members
from kstore.group_records import (GroupMetadata, MemberMetadata, OffsetAndMetadata,
                                  assignment_bytes, subscription_bytes)
from kstore.notify import writer_bell
from kstore.task_wait import TASK_LOCK_WAIT_S, task_pause
from kstore.topic_partition import TopicPartition

if TYPE_CHECKING:
    from kstore.group_coordinator import GroupCoordinator

__all__ = ["AssignmentChange", "GroupMember", "live_members", "InconsistentGroupProtocolError",
           "CommitFailedError", "GroupLockTimeoutError", "INTERNAL_TOPICS", "NOT_IN_GROUP"]

log = logging.getLogger("kstore.group")

#: Topics a pattern subscription never matches (Kafka's exclude.internal.topics=true).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
PROTOCOL_TYPE = "consumer"


class InconsistentGroupProtocolError(KStoreError):
    """A joining member supports none of the assignors every current member supports."""


#: how long a poll waits to redo a step that failed (Kafka's retry.backoff.ms default)
RETRY_BACKOFF_S = 0.1
#: the most an eviction waits for group.lock (Kafka's leave on a poll timeout never blocks;
#: the consumer's lock is held meanwhile); without it the flocks still go
EXPIRE_LOCK_S = 1.0


class CommitFailedError(KStoreError):
    """A commit for partitions this member does not own (it lost them in a rebalance, or was
    evicted from the group when max_poll_interval_ms passed between its polls)."""


#: Kafka's message for a commit by a member no longer in the group (ConsumerCoordinator).
NOT_IN_GROUP = ("Offset commit cannot be completed since the consumer is not part of an active group "
                "for auto partition assignment; it is likely that the consumer was kicked out of the "
                "group (max_poll_interval_ms passed between two calls to poll()).")


@dataclass(frozen=True)
class AssignmentChange:
    """What a join or poll changed for this member."""
    generation: int
    #: give these up: commit their offsets, then `release` them (the member still owns them)
    revoked: frozenset[TopicPartition]
    #: newly OWNED (owner lock taken): read them from their committed offsets
    assigned: frozenset[TopicPartition]


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Held:
    """The descriptors a member holds (its member file's, its owner locks'); closed by a
    finalizer if a member is dropped without leave(), so its flocks do not outlive it."""

    def __init__(self, io: FileOps):
        self.io = io
        self.member_fd: Optional[int] = None
        self.owners: dict[TopicPartition, int] = {}

    def release(self, tp: TopicPartition) -> bool:
        fd = self.owners.pop(tp, None)
        if fd is None:
            return False
        self.io.unlock(fd)
        return True

    def close_all(self) -> None:
        fds = list(self.owners.values()) + ([self.member_fd] if self.member_fd is not None else [])
        self.owners.clear()
        self.member_fd = None
        for fd in fds:
            try:
                self.io.unlock(fd)
            except OSError:
                pass


class GroupMember:
    """One member of a consumer group (see the module doc). Thread-safe; one consumer uses it.
    Lock: `_lock` guards the member's state (owned partitions, descriptors) and is held across
    its group.lock wait (interrupt() may end a join's) and a rebalance (locks.py)."""

    def __init__(self, coordinator: "GroupCoordinator", group_id: str, *,
                 topics: Optional[Sequence[str]] = None, pattern: "Optional[re.Pattern[str]]" = None,
                 partitions_for: Callable[[str], int],
                 list_topics: Callable[[], list[str]],
                 assignors: Sequence[ConsumerPartitionAssignor] = (RangeAssignor(),),
                 client_id: str = "kstore", session_timeout_ms: int = 45000,
                 heartbeat_interval_ms: int = 3000, rebalance_timeout_ms: int = 300000,
                 io: Optional[FileOps] = None, lock_timeout: float = 30.0,
                 interrupt: Optional[Callable[[], None]] = None) -> None:
        if (topics is None) == (pattern is None):
            raise InvalidConfigError("subscribe to topics or to a pattern (exactly one)")
        if isinstance(topics, str):
            raise InvalidConfigError("topics must be a sequence of topic names, not a string")
        if not assignors:
            raise InvalidConfigError("a group member needs at least one partition assignor")
        names = [a.name for a in assignors]
        if len(set(names)) != len(names):
            raise InvalidConfigError(f"partition assignors listed twice: {names}")
        if not 0 < heartbeat_interval_ms < session_timeout_ms:
            raise InvalidConfigError(
                f"heartbeat.interval.ms ({heartbeat_interval_ms}) must be positive and lower "
                f"than session.timeout.ms ({session_timeout_ms})")
        self._coordinator = coordinator
        self.group_id = group_id
        self.io = io or get_file_ops()
        self._gdir = GroupDir(self.io, coordinator.log_dir_for(group_id), group_id)
        self.member_id = f"{client_id}-{uuid.uuid4()}"
        self.client_id = client_id
        self._pattern = pattern
        self._topics: list[str] = sorted(set(topics)) if topics is not None else []
        self._partitions_for = partitions_for
        self._list_topics = list_topics
        self._assignors = {a.name: a for a in assignors}
        self._assignor_names = names
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self._lock_timeout, self._interrupt = lock_timeout, interrupt   # (raises: ends a join's wait)
        self._lock = threading.Lock()
        self._held = _Held(self.io)
        weakref.finalize(self, self._held.close_all)
        self._bell: Optional[_notify.Bell] = None
        self._bell_ident: Optional[tuple[int, int]] = None
        self._seen = -1                         # the bell's counter at the last step
        self._next_heartbeat = 0.0              # the next liveness check (every interval / 2)
        self._next_metadata = 0.0               # the next look at topics and partition counts
        self._generation = -1
        self._target: frozenset[TopicPartition] = frozenset()
        self._owned: set[TopicPartition] = set()
        self._revoking: set[TopicPartition] = set()
        self._joined_ms = 0
        self._joined = False
        self._closed = False
        self.expired = False                    # left by expire(): commits fail as Kafka's
        self._meta_dirty = False

    # -- public ------------------------------------------------------------------------------
    def join(self) -> AssignmentChange:
        """Join the group (a rebalance) and take the partitions of the new plan that are free;
        the rest come with later polls, as their old owners release them."""
        with self._lock:
            if self._closed or self._joined:
                raise KStoreStateError(f"member {self.member_id} {'left' if self._closed else 'already joined'}")
            self._coordinator.check_available(self.group_id)     # nothing made on an offline dir
            self._gdir.make(self._lock_timeout, self._interrupt)
            bell = self._bell = writer_bell(self.io, self._gdir.path)
            self._bell_ident = self._gdir.bell_ident()
            self._seen = bell.load() >> 1
            if self._pattern is not None:
                self._topics = self._resolve()
            self._joined_ms = now_ms()
            try:
                fd = self._gdir.lock(self._lock_timeout, self._interrupt)
            except BaseException:
                bell.close()
                self._bell = None
                raise
            try:
                self._coordinator.check_available(self.group_id)     # offline while we waited?
                self._gdir.clean_temps()
                live = self._gdir.scan_members(reap=True)
                self._check_protocols(live)
                meta = self._meta()
                self._held.member_fd = self._gdir.add_member(self.member_id, meta)
                try:
                    state = self._rebalance(live + [meta])
                except BaseException:
                    member_fd, self._held.member_fd = self._held.member_fd, None
                    self._gdir.remove_member(self.member_id, member_fd)
                    raise
                self._joined = True
            finally:
                self._gdir.unlock(fd)
                if not self._joined:
                    bell.close()
                    self._bell = None
            self._next_heartbeat = time.monotonic() + self.heartbeat_interval_ms / 2000
            self._next_metadata = time.monotonic() + self.heartbeat_interval_ms / 1000
            # the word first, then the state: a generation written after this load rings again
            self._seen = bell.load() >> 1
            change = self._apply(self._gdir.read_state() or state)
            assert change is not None
            return change

    def poll(self) -> Optional[AssignmentChange]:
        """What changed since the last join/poll, or None. Without a ring of the bell and
        before the next heartbeat: one atomic load, no syscall. A heartbeat (twice per interval)
        checks the other members' liveness, once per interval this member's pattern and
        partition counts too, and rebalances if any changed; a ring re-reads the group state
        and retries the partitions still held by others. A step cut short (a wakeup, a
        group.lock timeout) is redone whole by the next poll, one that failed (an I/O error)
        by the first RETRY_BACKOFF_S later: a loop catching the error is not hot."""
        with self._lock:
            bell = self._check_joined()
            now = time.monotonic()
            word = bell.load() >> 1
            if word == self._seen and now < self._next_heartbeat:
                return None
            before = (self._seen, self._next_heartbeat, self._next_metadata)
            try:
                self._seen = word
                self._coordinator.check_available(self.group_id)     # retried after the backoff
                state = self._gdir.read_state()
                if now >= self._next_heartbeat:
                    self._next_heartbeat = now + self.heartbeat_interval_ms / 2000
                    metadata = now >= self._next_metadata
                    if metadata:
                        self._next_metadata = now + self.heartbeat_interval_ms / 1000
                        self._check_bell()
                    if self._needs_rebalance(state, metadata):
                        state = self._locked_rebalance()
                if state is None:
                    state = self._locked_rebalance()
                return self._apply(state)
            except (WakeupError, GroupLockTimeoutError):     # cut short, not failed
                self._seen, self._next_heartbeat, self._next_metadata = before
                raise
            except BaseException:
                self._next_heartbeat, self._next_metadata = now + RETRY_BACKOFF_S, before[2]
                raise

    def release(self, partitions: Iterable[TopicPartition]) -> None:
        """Give up partitions (after committing their offsets): their owner locks are dropped
        and the bell rung, so their new owners take them at once. A partition still in this
        member's plan is taken again at a later poll (reported as assigned)."""
        with self._lock:
            bell = self._check_joined()
            released = False
            for tp in partitions:
                tp = TopicPartition(*tp)
                if self._held.release(tp):
                    released = True
                    self._owned.discard(tp)
                    self._revoking.discard(tp)
            if released and self._available():
                bell.ring(self._generation, 0, 0, 0)

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata],
               sleep: Optional[Callable[[float], None]] = None) -> None:
        """coordinator.commit_offsets (its flock wait paused by sleep) for partitions this member
        owns (CommitFailedError for any other: it lost them), with its generation and member id."""
        with self._lock:
            if self.expired:
                raise CommitFailedError(f"group {self.group_id!r}: member {self.member_id}: {NOT_IN_GROUP}")
            self._check_joined()
            lost = [tp for tp in offsets if TopicPartition(*tp) not in self._owned]
            if lost:
                raise CommitFailedError(
                    f"group {self.group_id!r}: member {self.member_id} does not own {sorted(lost)} "
                    f"(generation {self._generation}): the commit is refused")
            gen, member = self._generation, self.member_id
        self._coordinator.commit_offsets(self.group_id, offsets, generation=gen, member_id=member, sleep=sleep)

    def owned(self) -> frozenset[TopicPartition]:
        """Partitions whose owner lock this member holds (revoked ones until released)."""
        with self._lock:
            return frozenset(self._owned)

    def assignment(self) -> frozenset[TopicPartition]:
        """This member's partitions in the current generation's plan (owned or not yet)."""
        with self._lock:
            return self._target

    def generation(self) -> int:
        """The generation of the plan this member last applied (-1 before join)."""
        return self._generation

    def notify_word(self) -> _notify.Bell:
        """The group bell (a `_notify.Bell`): arm it, poll(), then sleep on it with the logs'
        words (`_notify.wait_any`) up to poll_timeout(): data, a rebalance or a release ends it."""
        with self._lock:
            return self._check_joined()

    def poll_timeout(self) -> float:
        """Seconds until the next heartbeat is due: the longest a consumer may sleep unpolled."""
        return max(0.0, self._next_heartbeat - time.monotonic())

    def subscribe(self, topics: Optional[Sequence[str]] = None,
                  pattern: "Optional[re.Pattern[str]]" = None) -> None:
        """Change the subscription: recorded in the member file at the next poll's rebalance."""
        if (topics is None) == (pattern is None):
            raise InvalidConfigError("subscribe to topics or to a pattern (exactly one)")
        with self._lock:
            self._pattern = pattern
            self._topics = sorted(set(topics)) if topics is not None else self._resolve()
            self._meta_dirty = True
            self._next_heartbeat = self._next_metadata = 0.0

    def leave(self, timeout: Optional[float] = None, sleep: Optional[Callable[[float], None]] = None) -> None:
        """Leave: release every partition (commit first), remove the membership, rebalance the
        others (without group.lock, they see it dead at their next heartbeat). Idempotent.
        timeout: the most group.lock is waited for; sleep: the offsets flock's pauses (close's)."""
        with self._lock:
            self._leave(None if timeout is None else min(self._lock_timeout, timeout), sleep)

    def expire(self) -> bool:
        """Leave because max.poll.interval.ms passed since the consumer's last poll (Kafka's
        maybeLeaveGroup("consumer poll timeout has expired.")): as leave(), but the caller
        commits nothing, and every later commit raises CommitFailedError. False if the member
        had already left (or never joined)."""
        with self._lock:
            if self._closed or not self._joined:
                return False
            self.expired = True
            self._leave(min(self._lock_timeout, EXPIRE_LOCK_S))
            return True

    def _leave(self, lock_timeout: Optional[float] = None, sleep: Optional[Callable] = None) -> None:
        """Drop the member and owner flocks, rebalancing the others under group.lock if it
        comes within lock_timeout (default the member's); else they do at their heartbeat."""
        if self._closed:
            return
        self._closed = True
        bell, self._bell = self._bell, None
        if not self._joined:
            self._held.close_all()
            return
        try:
            if not self._available():      # the flocks go (finally), nothing written there
                log.warning("group %r: %s left, its log dir offline", self.group_id, self.member_id)
                return
            fd = self._gdir.lock(self._lock_timeout if lock_timeout is None else lock_timeout)
            try:
                member_fd, self._held.member_fd = self._held.member_fd, None
                if member_fd is not None:
                    self._gdir.remove_member(self.member_id, member_fd)
                self._held.close_all()
                self._rebalance(bell=bell, sleep=sleep)
            finally:
                self._gdir.unlock(fd)
        except GroupLockTimeoutError as e:
            log.warning("%s; member %s left without a rebalance (the others see it gone at "
                        "their next heartbeat)", e, self.member_id)
        finally:
            self._held.close_all()
            self._owned.clear()
            self._revoking.clear()
            if bell is not None:
                bell.close()

    close = leave

    def describe(self) -> list[MemberMetadata]:
        """The group's live members (consumer-groups --describe)."""
        return live_members(self._coordinator, self.group_id, self.io) or []

    def __enter__(self) -> "GroupMember":
        return self

    def __exit__(self, *exc) -> None:
        self.leave()

    # -- internals ---------------------------------------------------------------------------
    def _check_joined(self) -> _notify.Bell:
        if self._closed or not self._joined or self._bell is None:
            raise KStoreStateError(f"member {self.member_id} of group {self.group_id!r} "
                                   f"{'left' if self._closed else 'has not joined'}")
        return self._bell

    def _available(self) -> bool:
        """Whether the group's log dir is online (coordinator.check_available)."""
        try:
            return self._coordinator.check_available(self.group_id) >= 0
        except CoordinatorNotAvailableError:
            return False

    def _resolve(self) -> list[str]:
        assert self._pattern is not None
        return sorted(t for t in set(self._list_topics())
                      if t not in INTERNAL_TOPICS and self._pattern.fullmatch(t))

    def _meta(self) -> dict:
        return {"member_id": self.member_id, "group_instance_id": None, "client_id": self.client_id,
                "client_host": "/127.0.0.1", "pid": os.getpid(), "joined_ms": self._joined_ms,
                "session_timeout": self.session_timeout_ms, "rebalance_timeout": self.rebalance_timeout_ms,
                "heartbeat_interval": self.heartbeat_interval_ms, "topics": list(self._topics),
                "pattern": self._pattern.pattern if self._pattern is not None else None,
                "assignors": list(self._assignor_names)}

    def _check_protocols(self, live: Sequence[dict]) -> None:
        if not live:
            return
        common = set(live[0]["assignors"]).intersection(*(m["assignors"] for m in live[1:]))
        if not common.intersection(self._assignor_names):
            raise InconsistentGroupProtocolError(
                f"group {self.group_id!r}: this member's assignors {self._assignor_names} share none "
                f"with those every member supports ({sorted(common)})")

    def _count(self, topic: str) -> int:
        try:
            n = self._partitions_for(topic)
        except (KStoreError, KeyError, OSError):
            return 0
        return n if isinstance(n, int) and n > 0 else 0

    def _needs_rebalance(self, state: Optional[dict], metadata: bool) -> bool:
        """A heartbeat: does the group need a new generation? Liveness every time, the
        subscription's topics and partition counts if metadata."""
        if state is None or self._meta_dirty:
            return True
        ids = [m["member_id"] for m in state["members"]]
        if self.member_id not in ids:
            return True
        if any(not self._gdir.is_alive(m) for m in ids if m != self.member_id):
            return True
        if not metadata:
            return False
        if self._pattern is not None:
            topics = self._resolve()
            if topics != self._topics:
                self._topics = topics
                self._meta_dirty = True
                return True
        return any(self._count(t) != state["partitions"].get(t, 0) for t in self._topics)

    def _check_bell(self) -> None:
        """Map the group bell again if its file was replaced (a heartbeat's stat)."""
        ident = self._gdir.bell_ident()
        if self._bell is not None and ident != self._bell_ident and ident is not None:
            old, self._bell = self._bell, writer_bell(self.io, self._gdir.path)
            self._bell_ident = self._gdir.bell_ident()
            self._seen = -1
            old.close()                         # a sleeper on it keeps it mapped until it wakes

    def _locked_rebalance(self) -> dict:
        self._gdir.make(self._lock_timeout, self._interrupt)    # its directory removed?
        self._check_bell()
        fd = self._gdir.lock(self._lock_timeout, self._interrupt)
        try:
            self._coordinator.check_available(self.group_id)     # offline while we waited?
            mfd = self._held.member_fd
            if mfd is not None and (self._meta_dirty or not self._gdir.is_alive(self.member_id)):
                self._held.member_fd = self._gdir.update_member(mfd, self._meta())
            state = self._rebalance()
            self._meta_dirty = False        # only now: a rebalance that raised is redone
            return state
        finally:
            self._gdir.unlock(fd)

    def _base_generation(self, state: Optional[dict]) -> int:
        """The generation the next one follows: the newest state file's (even unreadable), or
        with no readable state the group's last stored GroupMetadata's if higher."""
        base = self._gdir.newest_generation()
        if state is not None:
            return max(base, state["generation"])
        try:
            stored = self._coordinator.group(self.group_id)
        except (KStoreError, OSError) as e:
            log.warning("group %r: its stored metadata is unreadable (%s)", self.group_id, e)
            return base
        return max(base, stored.generation if stored is not None else 0)

    def _rebalance(self, live: Optional[list[dict]] = None, bell: Optional[_notify.Bell] = None,
                   sleep: Optional[Callable[[float], None]] = None) -> dict:
        """Caller holds group.lock. The group state for the live members: the current one if
        nothing changed, else a new generation written, rung and recorded."""
        gdir = self._gdir
        state = gdir.read_state()
        if live is None:
            gdir.clean_temps()
            live = gdir.scan_members(reap=True)
        live = sorted(live, key=lambda m: (m["joined_ms"], m["member_id"]))
        leader = state.get("leader") if state is not None else None
        if leader not in [m["member_id"] for m in live]:
            leader = live[0]["member_id"] if live else None
        protocol = select_protocol(live, leader)
        if live and protocol is None:
            protocol = live[0]["assignors"][0]      # refused at join; a hostile member file
        topics = sorted({t for m in live for t in m["topics"]})
        counts = {t: self._count(t) for t in topics}
        ppt = {t: n for t, n in counts.items() if n > 0}
        if state is not None and (state["members"] == live and state["partitions"] == ppt
                                  and state.get("protocol") == protocol and state.get("leader") == leader):
            return state
        generation = self._base_generation(state) + 1
        plan: dict[str, list[TopicPartition]] = {}
        if live:
            assert protocol is not None
            assignor = self._assignors.get(protocol)
            if assignor is None:
                try:
                    assignor = assignor_named(protocol)
                except ValueError:
                    # a leaving member that does not know the others' protocol: its file is
                    # gone, so a remaining member rebalances at its next heartbeat
                    log.info("group %r: protocol %r unknown here: rebalance left to the members",
                             self.group_id, protocol)
                    return state if state is not None else {}
            subs = {m["member_id"]: m["topics"] for m in live}
            static = {m["member_id"]: m["group_instance_id"] for m in live if m.get("group_instance_id")}
            # the design's two-argument assign() unless a member is static (a custom assignor)
            plan = assignor.assign(ppt, subs, static) if static else assignor.assign(ppt, subs)
        new = {"version": 1, "generation": generation, "protocol_type": PROTOCOL_TYPE,
               "protocol": protocol, "leader": leader, "state_ts": now_ms(), "partitions": ppt,
               "members": live, "assignment": {m: [[t, p] for t, p in ps] for m, ps in plan.items()}}
        gdir.write_state(new)
        ring = bell or self._bell
        if ring is not None:
            ring.ring(generation, 0, 0, 0)
        self._store(new, plan, sleep)
        return new

    def _store(self, state: dict, plan: Mapping[str, Sequence[TopicPartition]],
               sleep: Optional[Callable[[float], None]]) -> None:
        """The generation's GroupMetadata record, as Kafka writes at each generation; its flock
        wait is sleep's (close()'s) or TASK_LOCK_WAIT_S; a failure is logged: the state file rules."""
        members = tuple(MemberMetadata(
            m["member_id"], m.get("group_instance_id"), m["client_id"], m["client_host"],
            m["rebalance_timeout"], m["session_timeout"], subscription_bytes(m["topics"]),
            assignment_bytes(list(plan.get(m["member_id"], ())))) for m in state["members"])
        group = GroupMetadata(PROTOCOL_TYPE, state["generation"], state["protocol"], state["leader"],
                              state["state_ts"], members)
        try:
            self._coordinator.store_group(self.group_id, group, sleep=sleep or task_pause(None, TASK_LOCK_WAIT_S))
        except (KStoreError, OSError) as e:
            log.warning("group %r generation %d: its GroupMetadata record was not written (%s)",
                        self.group_id, state["generation"], e)

    def _apply(self, state: dict) -> Optional[AssignmentChange]:
        """Take up the plan of state: what to revoke, the free partitions to own."""
        gen = state["generation"]
        target = frozenset(TopicPartition(t, p) for t, p in state["assignment"].get(self.member_id, ()))
        changed = gen != self._generation
        self._generation = gen
        self._target = target
        self._revoking -= target
        revoked = (self._owned - target) - self._revoking
        self._revoking |= revoked
        assigned = set()
        for tp in sorted(target - self._owned):
            fd = self._gdir.try_own(tp.topic, tp.partition)
            if fd is not None:
                self._held.owners[tp] = fd
                self._owned.add(tp)
                assigned.add(tp)
        if changed or revoked or assigned:
            return AssignmentChange(gen, frozenset(revoked), frozenset(assigned))
        return None

