"""Topics on disk: the topic config file (kstore-topic-config.json) with its deletion intent,
topic ids and `partition.metadata`, and Kafka's rules for topic names.

The topic config file holds every topic's overrides, its id and the topics whose deletion is
recorded but not finished; a copy is written atomically to every online log dir on each change,
and the newest readable copy wins at start-up.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Sequence

from kstore.config import TOPIC_CONFIG_KEYS
from kstore.errors import InvalidTopicError, UnusableFileError
from kstore.fileio import FileOps, get_file_ops
from kstore.log_dir_failure import LogDirFailureChannel

log = logging.getLogger("kstore.topics")

TOPIC_CONFIG_FILE = "kstore-topic-config.json"
PARTITION_METADATA_FILE = "partition.metadata"
_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]+")     # fullmatch: "$" would accept a final newline


def validate_topic_name(name: str) -> None:
    """Kafka's Topic.validate: non-empty, not '.' or '..', at most 249 of [a-zA-Z0-9._-]."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"Topic name cannot be \"{name}\"")
    if len(name) > 249:
        raise InvalidTopicError(f"Topic name is illegal, it can't be longer than 249 characters, topic name: {name}")
    if not _TOPIC_RE.fullmatch(name):
        raise InvalidTopicError(
            f"Topic name \"{name}\" is illegal, it contains a character other than ASCII "
            f"alphanumerics, '.', '_' and '-'")


def topics_collide(a: str, b: str) -> bool:
    """Kafka's Topic.hasCollision: '.' and '_' are the same character in metric names."""
    return a.replace(".", "_") == b.replace(".", "_")


def new_topic_id() -> str:
    """A new Kafka topic id: a random UUID shown as URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def write_partition_metadata(io: FileOps, partition_dir: str, topic_id: str) -> None:
    """Write the partition's `partition.metadata` (Kafka's PartitionMetadataFile: `version: 0`,
    `topic_id: <id>`) unless it is there already."""
    path = os.path.join(partition_dir, PARTITION_METADATA_FILE)
    if not io.exists(path):
        io.write_atomic(path, f"version: 0\ntopic_id: {topic_id}\n".encode())


def read_topic_config_file(log_dirs: Sequence[str], io: Optional[FileOps] = None,
                           strict: bool = False) -> Optional[dict]:
    """The newest readable topic config file among the log dirs as its JSON document
    ({"version", "topics": {topic: overrides}, "topic_ids", "deleting"}), or None. Unreadable
    copies are skipped with a warning; strict (a writable store's start), when every copy there
    is unreadable, raises UnusableFileError instead: starting without the overrides would let
    retention and the cleaner treat compacted or kept-forever topics by Kafka's defaults and
    delete their records, and the next topic change would write the loss down.
    TopicConfigFile.read gives it typed."""
    io = io or get_file_ops()
    best = None
    bad: list[tuple[str, BaseException]] = []
    for d in log_dirs:
        path = os.path.join(d, TOPIC_CONFIG_FILE)
        try:
            io.stat_path(path)          # not exists(): it says False for any error and for a
        except (FileNotFoundError, NotADirectoryError):   # dangling symlink (a lost mount)
            continue                    # none (ENOTDIR: the log dir is a file, refused as such)
        except OSError as e:
            log.warning("ignoring unreadable topic config file %s: %s", path, e)
            bad.append((path, e))
            continue
        try:
            data = json.loads(io.read_file(path).decode("utf-8"))
            _check_shape(data)
            if best is None or data["version"] > best["version"]:
                best = data
        except (ValueError, KeyError, TypeError, OSError, UnusableFileError) as e:
            log.warning("ignoring unreadable topic config file %s: %s", path, e)
            bad.append((path, e))
    if strict and best is None and bad:
        path, why = bad[0]
        raise UnusableFileError(path, f"unreadable ({why}): without it every topic's overrides "
                                "(retention.ms, cleanup.policy, ...) would fall back to Kafka's "
                                "defaults and retention could delete records they keep; restore "
                                "it, or remove it to start with the defaults")
    return best


def _check_shape(doc: Any) -> None:
    """ValueError unless doc has the topic config file's shape: valid JSON of another shape (a
    hand edit, a stray write) is as unreadable as torn bytes, not a crash of the open."""
    def is_map(v: Any, values: type) -> bool:
        return isinstance(v, dict) and all(isinstance(x, values) for x in v.values())
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object but {type(doc).__name__}")
    v = doc.get("version")
    if not isinstance(v, int) or isinstance(v, bool):
        raise ValueError(f"'version' is {v!r}, not an integer")
    for key, ok in (("topics", is_map(doc.get("topics", {}), dict)),
                    ("topic_ids", is_map(doc.get("topic_ids", {}), str)),
                    ("deleting", isinstance(doc.get("deleting", []), list)
                     and all(isinstance(t, str) for t in doc.get("deleting", []))),
                    ("partitions", isinstance(doc.get("partitions", {}), dict))):
        if not ok:
            raise ValueError(f"{key!r} has the wrong shape: {doc.get(key)!r:.80}")


@dataclass
class TopicConfigFile:
    """The content of kstore-topic-config.json."""
    version: int = 0
    topics: dict[str, dict[str, Any]] = field(default_factory=dict)   # topic -> overrides
    topic_ids: dict[str, str] = field(default_factory=dict)
    deleting: list[str] = field(default_factory=list)   # deletions recorded, not finished
    partitions: dict[str, int] = field(default_factory=dict)   # topic -> partition count

    @classmethod
    def read(cls, log_dirs: Sequence[str], io: Optional[FileOps] = None,
             strict: bool = False) -> Optional[TopicConfigFile]:
        """The newest readable copy among the log dirs, or None (see read_topic_config_file)."""
        doc = read_topic_config_file(log_dirs, io, strict)
        if doc is None:
            return None
        return cls(doc["version"], {t: dict(c) for t, c in doc.get("topics", {}).items()},
                   dict(doc.get("topic_ids", {})), list(doc.get("deleting", [])),
                   {t: n for t, n in doc.get("partitions", {}).items()
                    if isinstance(n, int) and not isinstance(n, bool) and n > 0})

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {"version": self.version, "topics": self.topics,
                               "topic_ids": self.topic_ids, "deleting": self.deleting}
        if self.partitions:
            doc["partitions"] = self.partitions
        return json.dumps(doc, sort_keys=True, indent=1).encode()


class TopicConfigs:
    """A store's topic config file, kept in memory and written to every online log dir on each
    change (a dir whose write fails is reported offline through the failure channel).

    Changes are made under the owner's registry lock (LogRegistry.lock); `overrides` and
    `deleting` may be read without it.
    """

    def __init__(self, log_dirs: Sequence[str], failures: LogDirFailureChannel, io: FileOps):
        self._dirs = list(log_dirs)
        self._failures = failures
        self._io = io
        self._file = TopicConfigFile()

    def load(self, strict: bool = False) -> None:
        """Take the newest readable copy in the online log dirs (none: no topics); strict (a
        writable store): UnusableFileError if every copy there is unreadable."""
        got = TopicConfigFile.read([d for d in self._dirs if not self._failures.is_offline(d)],
                                   self._io, strict)
        if got is not None:
            self._file = got

    def persist(self) -> None:
        """Write a new version to every online log dir."""
        f = self._file
        f.version += 1
        data = f.to_json()
        for d in self._dirs:
            if self._failures.is_offline(d):
                continue
            try:
                self._io.write_atomic(os.path.join(d, TOPIC_CONFIG_FILE), data)
            except OSError as e:
                self._failures.mark_offline(d, e)

    def overrides(self, topic: str) -> Optional[dict[str, Any]]:
        """The topic's overrides as stored (strings for lists), None for a topic with none. A
        key that is not a topic config (a hand edit, a newer version's key) is logged and
        left out: stored configs load as Kafka loads them; only create and alter reject."""
        stored = self._file.topics.get(topic)
        if stored is None:
            return None
        unknown = [k for k in stored if k not in TOPIC_CONFIG_KEYS]
        if unknown:
            log.warning("topic %s: unknown topic config names in %s ignored: %s", topic,
                        TOPIC_CONFIG_FILE, ", ".join(unknown))
            return {k: v for k, v in stored.items() if k in TOPIC_CONFIG_KEYS}
        return stored

    def set_overrides(self, topic: str, overrides: Mapping[str, Any]) -> None:
        """Keep the topic's parsed overrides (LogConfig.overrides); not persisted yet."""
        self._file.topics[topic] = {k: v if not isinstance(v, tuple) else ",".join(v)
                                    for k, v in overrides.items()}

    def add_topic(self, topic: str, overrides: Mapping[str, Any], partitions: Optional[int] = None) -> None:
        """A new topic: its overrides, a new topic id and its partition count; not persisted yet."""
        self.set_overrides(topic, overrides)
        self._file.topic_ids[topic] = new_topic_id()
        if partitions is not None:
            self._file.partitions[topic] = partitions

    def partition_count(self, topic: str) -> Optional[int]:
        """The topic's partition count as created, grown or set (set_partition_count); None
        when it was never recorded (a broker's partitions, or a topic of an older kstore)."""
        return self._file.partitions.get(topic)

    def created_here(self, topic: str) -> bool:
        """The topic has a topic id in the config file: kstore created (or grew) it."""
        return topic in self._file.topic_ids

    def set_partition_count(self, topic: str, count: int) -> None:
        """Record the topic's partition count; not persisted yet."""
        self._file.partitions[topic] = count

    def known_topics(self) -> frozenset[str]:
        """Topics this store created or configured (in the topic config file)."""
        f = self._file
        return frozenset(f.topics) | frozenset(f.topic_ids) | frozenset(f.partitions)

    def topic_id(self, topic: str) -> str:
        """The topic's id, made (and kept, not persisted yet) if it has none."""
        tid = self._file.topic_ids.get(topic)
        if tid is None:
            tid = self._file.topic_ids[topic] = new_topic_id()
        return tid

    @property
    def deleting(self) -> tuple[str, ...]:
        """Topics whose deletion is recorded but not finished."""
        return tuple(self._file.deleting)

    def is_deleting(self, topic: str) -> bool:
        return topic in self._file.deleting

    def record_deletion(self, topic: str) -> None:
        """Forget the topic's overrides and id and record its deletion, durably."""
        f = self._file
        if topic not in f.deleting:
            f.deleting.append(topic)
        f.topics.pop(topic, None)
        f.topic_ids.pop(topic, None)
        f.partitions.pop(topic, None)
        self.persist()

    def finish_deletions(self, topics: Iterable[str]) -> None:
        """Drop the record of deletions that are done, durably."""
        done = set(topics)
        self._file.deleting = [t for t in self._file.deleting if t not in done]
        self.persist()


class HostedPartitions:
    """Which partitions a store hosts, as Kafka's broker decides an OffsetCommit's
    UNKNOWN_TOPIC_OR_PARTITION: a partition below its topic's recorded count, or (count not
    recorded: a broker's dirs, an older kstore's topic) one with a directory in a log dir; never
    one of a topic whose deletion is recorded. The topic config files are read at each call and
    parsed only when their bytes changed (an inode, size and mtime can all repeat); racing
    threads each use data at least as new as their own read (_load's snapshot)."""

    def __init__(self, log_dirs: Sequence[str], io: Optional[FileOps] = None):
        self._dirs = list(log_dirs)
        self._io = io or get_file_ops()
        #: (the files' bytes, counts, deleting): one attribute, replaced whole, so a thread
        #: never pairs one parse's counts with another's deletions
        self._snap: tuple[tuple, dict[str, int], frozenset[str]] = ((), {}, frozenset())

    def _load(self) -> tuple[tuple, dict[str, int], frozenset[str]]:
        """The snapshot of the files as this call read them (parsed only if their bytes changed
        since the cached one): the caller uses what this returns, never the cache, which a
        slower thread may have set back to an older parse."""
        seen: list[Optional[bytes]] = []
        for d in self._dirs:
            try:
                seen.append(self._io.read_file(os.path.join(d, TOPIC_CONFIG_FILE)))
            except (OSError, UnusableFileError):
                seen.append(None)
        snap = self._snap
        if tuple(seen) != snap[0]:
            f = TopicConfigFile.read(self._dirs, self._io)
            snap = self._snap = (tuple(seen), dict(f.partitions) if f is not None else {},
                                 frozenset(f.deleting) if f is not None else frozenset())
        return snap

    def unknown(self, tps: Iterable[Sequence[Any]]) -> list:
        """Of tps ((topic, partition) pairs), those the store does not host, in order."""
        _seen, counts, deleting = self._load()
        out = []
        for tp in tps:
            topic, p = tp[0], tp[1]
            n = counts.get(topic)
            if topic in deleting or not isinstance(p, int) or p < 0:
                out.append(tp)
            elif n is not None:
                if p >= n:
                    out.append(tp)
            elif not any(self._io.exists(os.path.join(d, f"{topic}-{p}")) for d in self._dirs):
                out.append(tp)
        return out
