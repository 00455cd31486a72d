"""Loading one log dir at start-up (Kafka's LogManager.loadLogs for one dir).

The clean-shutdown marker, the recovery-point and log-start-offset checkpoints, leftovers of
writes and deletions cut short, then every partition opened (recovered where needed, on
recovery threads when there are megabytes to validate). A partition that fails for its own
reasons is isolated; an error of the disk fails the whole dir. The result says which.
"""
from __future__ import annotations

import bisect
import logging
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional

from kstore._listing import split_listing
from kstore.broker_config import BrokerConfig
from kstore.checkpoint import (LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                               CheckpointError, OffsetCheckpointFile)
from kstore.errors import KStoreError, UnusableFileError
from kstore.fileio import FileOps
from kstore.files import OFFSETS_TOPIC, is_delete_dir, parse_name, partition_dirs
from kstore.gc_pause import gc_paused
from kstore.log import Log
from kstore.log_dir_failure import PARTITION_ERRNOS
from kstore.marker_gate import remove_marker
from kstore.start_file import MANAGER_CLEAN_MARKER
from kstore.topics import TopicConfigs

log = logging.getLogger("kstore.manager")

TopicPartition = tuple[str, int]

CLEAN_SHUTDOWN_FILE = MANAGER_CLEAN_MARKER     # (start_file.py: standalone opens remove it)
# a partition with at least this much to recover loads on a recovery thread (see load())
PARALLEL_RECOVERY_BYTES = 4 << 20


# Kafka's UnifiedLog.DeleteDirPattern, FutureDirPattern, StrayDirPattern
_SUFFIXED = {suffix: re.compile(r"^(\S+)-(\S+)\.(\S+)" + suffix + "$")
             for suffix in ("-delete", "-future", "-stray")}
#: what LogManager.loadLogs leaves out: tiered storage's index cache, KRaft's metadata log
_NOT_LOGS = ("remote-log-index-cache",)
_METADATA_TOPIC = "__cluster_metadata"
#: files a partition directory holds besides segment files (kstore's and Kafka's)
_PARTITION_FILES = ("partition.metadata", "leader-epoch-checkpoint", ".kstore-notify")


def parse_topic_partition_name(name: str) -> Optional[TopicPartition]:
    """Kafka's UnifiedLog.parseTopicPartitionName: (topic, partition) of a log dir child named
    `topic-N`, `topic-N.<id>-delete`, `-future` or `-stray`; None for any other name (Kafka
    throws "is not in the form of topic-partition or topic-partition.uniqueId-delete")."""
    if "-" not in name:
        return None
    for suffix, pattern in _SUFFIXED.items():
        if name.endswith(suffix):
            if not pattern.match(name):
                return None
            name = name[:name.rindex(".")]
            break
    i = name.rindex("-") if "-" in name else -1
    topic, part = name[:i], name[i + 1:]
    # Java's Integer.parseInt: an optional sign, ASCII digits, within 32 bits
    if not topic or not re.fullmatch(r"[+-]?[0-9]+", part, re.ASCII) \
            or not -(1 << 31) <= int(part) < (1 << 31):
        return None
    return topic, int(part)


def check_log_dir_children(io: FileOps, d: str, known_topics: frozenset[str] = frozenset()) -> None:
    """Refuse a log dir holding a directory that is not a partition, naming it, as Kafka's
    LogManager.loadLogs refuses to start on it (parseTopicPartitionName): `photos/`,
    `lost+found/`, `notes-draft/`. Left out as Kafka leaves them: regular files,
    `remote-log-index-cache/`, `__cluster_metadata-N/`. Accepted without being partitions:
    dot-prefixed directories (kstore's own `.kstore-groups/`, `.kstore-staging/`; hidden).
    Beyond Kafka, which would adopt and write into it: a directory named like a partition of a
    topic the store does not know (`my-stuff-2/`) that holds files, none of them a partition's
    (segments, `partition.metadata`, `leader-epoch-checkpoint`)."""
    for name in sorted(io.listdir(d)):
        path = os.path.join(d, name)
        try:
            if not stat.S_ISDIR(io.stat_path(path, follow_symlinks=True).st_mode):
                continue
        except FileNotFoundError:
            continue
        if name in _NOT_LOGS:
            continue
        tp = parse_topic_partition_name(name)
        if tp is None:
            if name.startswith("."):
                continue
            raise UnusableFileError(path, (
                f"'{name}' is not in the form of topic-partition or "
                "topic-partition.uniqueId-delete (if marked for deletion); a log dir should "
                "hold only Kafka topic data: move it out of the log dir"))
        if tp[0] == _METADATA_TOPIC or tp[0] in known_topics or name.endswith(tuple(_SUFFIXED)):
            continue
        try:
            children = io.listdir(path)
        except OSError:
            continue            # the partition's own open reports it (isolated, or the dir offline)
        if children and not any(_partition_file(c, path) for c in children):
            raise UnusableFileError(path, (
                f"a directory named like partition {tp[1]} of topic '{tp[0]}', which this store "
                f"does not know, holding no partition files ({', '.join(sorted(children)[:3])}"
                f"{', ...' if len(children) > 3 else ''}): move it out of the log dir"))


def _partition_file(name: str, path: str) -> bool:
    try:
        if parse_name(name, path) is not None:
            return True
    except UnusableFileError:
        return True             # a segment name out of range: the partition's open refuses it
    return name in _PARTITION_FILES or name.startswith(_PARTITION_FILES) or name.endswith(
        (".log.tmp", ".checkpoint", ".tmp"))


class FailedPartition(NamedTuple):
    """A partition isolated at start-up: untouched on disk, its checkpoint entries kept as they
    were read (None: it had none)."""
    dir: str                          # its log dir
    path: str
    why: str
    recovery_point: Optional[int]
    log_start_offset: Optional[int]

    def checkpointed(self, checkpoint: str) -> Optional[int]:
        """Its entry in the checkpoint file named `checkpoint`, as read at start-up."""
        if checkpoint == RECOVERY_POINT_CHECKPOINT:
            return self.recovery_point
        if checkpoint == LOG_START_OFFSET_CHECKPOINT:
            return self.log_start_offset
        return None


@dataclass
class DirLoad:
    """What loading one log dir gave."""
    dir: str
    clean: bool = False           # it was shut down cleanly: its logs skipped recovery
    logs: list[tuple[TopicPartition, Log]] = field(default_factory=list)
    failed: dict[TopicPartition, FailedPartition] = field(default_factory=dict)
    to_delete: list[tuple[str, int]] = field(default_factory=list)   # (`-delete` dir, found at ms)
    checkpoint_errors: list[str] = field(default_factory=list)
    error: Optional[OSError] = None   # the dir failed: its logs were closed, it goes offline


class LogDirLoader:
    """Loads log dirs for one LogManager: `load(d)` may run for several dirs at once."""

    def __init__(self, cfg: BrokerConfig, topics: TopicConfigs, *, read_only: bool, io: FileOps,
                 time: Any, scheduler: Any, on_loaded: Optional[Callable[[], None]] = None):
        self._cfg = cfg
        self._topics = topics
        self._read_only = read_only
        self._io = io
        self._time = time
        self._scheduler = scheduler
        self._on_loaded = on_loaded       # called after each partition (progress)

    def partitions(self, d: str) -> list[tuple[TopicPartition, str]]:
        """partition_dirs(d), less the partitions of topics being deleted (a read-only manager
        cannot finish a deletion, and must not show what is being deleted) and, for a writable
        manager, `__consumer_offsets`: shared-writer partitions that any process appends to
        under the partition's flock (group_coordinator.py), never the manager's own logs."""
        return [job for job in partition_dirs(self._io, d)
                if not self._topics.is_deleting(job[0][0])
                and not (job[0][0] == OFFSETS_TOPIC and not self._read_only)]

    def check_names(self, d: str) -> None:
        """check_log_dir_children(d) for this store's topics: UnusableFileError naming the
        first directory of d that is not a partition."""
        check_log_dir_children(self._io, d, self._topics.known_topics())

    def _renamed_at(self, d: str, name: str) -> int:
        """When a `-delete` dir was renamed, in ms: its mtime, which delete_topic sets to the
        rename's time (so file.delete.delay.ms counts from the deletion across restarts, not
        from each start-up, which never freed space where no process outlives the delay); a
        dir renamed by a broker has the time of its last entry change, earlier. Never later
        than now."""
        now = self._time.milliseconds()
        try:
            st = self._io.stat_path(os.path.join(d, name))
        except OSError:
            return now
        return min(now, st.st_mtime_ns // 1_000_000)

    def _read_checkpoint(self, d: str, name: str, res: DirLoad) -> dict[TopicPartition, int]:
        cp = OffsetCheckpointFile(os.path.join(d, name), self._io)
        try:
            return cp.read()
        except (CheckpointError, OSError) as e:
            # never trusted, never fatal: the logs it covers are recovered in full
            msg = f"{e}; treating it as absent"
            log.warning("%s", msg)
            res.checkpoint_errors.append(msg)
            return {}

    def load(self, d: str) -> DirLoad:
        """Load every partition of d. An OSError of the dir is returned in `error`, with the
        logs already opened closed again. Cyclic garbage collection waits meanwhile
        (gc_pause.py: the load makes only long-lived objects)."""
        with gc_paused():
            return self._load(d)

    def _load(self, d: str) -> DirLoad:
        io = self._io
        res = DirLoad(d)
        opened: list[tuple[TopicPartition, Log]] = []
        try:
            marker = os.path.join(d, CLEAN_SHUTDOWN_FILE)
            clean = res.clean = io.exists(marker)
            if clean and not self._read_only:
                # deleted before loading, so a crash during loading is recovered next time (KAFKA-10471)
                # durably gone before any file changes: in the background when io is the
                # manager's MarkerGate (every changing operation waits for it)
                remove_marker(io, marker, d)
            recovery = self._read_checkpoint(d, RECOVERY_POINT_CHECKPOINT, res)
            starts = self._read_checkpoint(d, LOG_START_OFFSET_CHECKPOINT, res)
            if not self._read_only:
                for name in sorted(io.listdir(d)):
                    if name.endswith(".tmp") and not os.path.isdir(os.path.join(d, name)):
                        io.unlink(os.path.join(d, name))    # a checkpoint or config write cut short
                        continue
                    if is_delete_dir(name) and os.path.isdir(os.path.join(d, name)):
                        res.to_delete.append((os.path.join(d, name), self._renamed_at(d, name)))
            jobs = self.partitions(d)
            threads = self._cfg["num.recovery.threads.per.data.dir"]
            # one LogConfig per topic, shared by its partitions (immutable; an alter replaces it)
            configs: dict[str, Any] = {}

            #: each partition's listing, made when planning (bytes_to_recover) and reused by
            #: its load: nothing else changes a partition directory during start-up
            listings: dict[str, list[str]] = {}

            def load(job: tuple[TopicPartition, str]) -> None:
                tp, path = job
                try:
                    io.check_dir(path)       # a symlinked or special partition dir is refused
                    cfg = configs.get(tp[0])
                    if cfg is None:
                        cfg = configs[tp[0]] = self._cfg.log_config(self._topics.overrides(tp[0]))
                    lg = Log.open(path, cfg, recovery_point=recovery.get(tp, 0),
                                  log_start_offset=starts.get(tp), clean_shutdown=clean, io=io,
                                  time=self._time, scheduler=self._scheduler,
                                  read_only=self._read_only, listing=listings.pop(path, None))
                except (OSError, KStoreError) as e:
                    if self._read_only and not io.exists(path):
                        # the writer deleted the topic since the scan: not an error of this dir
                        log.info("partition %s was deleted while opening it read-only", path)
                        return
                    if isinstance(e, OSError) and e.errno not in PARTITION_ERRNOS:
                        raise            # a failing disk: the whole dir goes offline
                    res.failed[tp] = _isolate(d, tp, path, e, recovery.get(tp), starts.get(tp))
                else:
                    opened.append((tp, lg))
                if self._on_loaded is not None:
                    self._on_loaded()
            # Recovery threads pay off only where a GIL-free CRC scan dominates: partitions with
            # megabytes to validate. Loading many small partitions is Python and syscalls, where
            # threads only queue on the GIL (measured: 1,000 tiny partitions 1.4 s on one
            # thread, 2.1 s on two), so those load on this thread.
            big: list[tuple[TopicPartition, str]] = []
            small: list[tuple[TopicPartition, str]] = []
            for job in jobs:
                if threads > 1 and not clean:
                    names = list_partition(io, job[1])
                    if names is not None:
                        listings[job[1]] = names
                    if names is not None and bytes_to_recover(
                            io, job[1], recovery.get(job[0], 0), PARALLEL_RECOVERY_BYTES,
                            names) >= PARALLEL_RECOVERY_BYTES:
                        big.append(job)
                        continue
                small.append(job)
            for job in small:
                load(job)
            if big:
                with ThreadPoolExecutor(max_workers=threads) as pool:
                    list(pool.map(load, big))
        except OSError as e:
            for _tp, lg in opened:
                lg.close_handlers()
            res.error = e
            res.failed = {}               # the whole dir is offline: it says why
            return res
        res.logs = opened
        return res


def _isolate(d: str, tp: TopicPartition, path: str, e: BaseException,
             recovery: Optional[int], start: Optional[int]) -> FailedPartition:
    """Isolate a partition that failed to load: logged as an ERROR, listed by
    failed_partitions, untouched on disk (its checkpoint entries are kept as they were);
    every use raises PartitionLoadError."""
    why = f"{type(e).__name__}: {e}"
    log.error("partition %s-%d (%s) failed to load and is isolated: %s", tp[0], tp[1], path, why)
    return FailedPartition(d, path, why, recovery, start)


def list_partition(io: FileOps, path: str) -> Optional[list[str]]:
    """The names in a partition directory, through io; None if it cannot be listed (the load
    that follows lists it again and reports what is wrong with the dir)."""
    try:
        return io.listdir(path)
    except (OSError, KStoreError):
        return None


def bytes_to_recover(io: FileOps, path: str, recovery_point: int,
                     enough: Optional[int] = None, names: Optional[list[str]] = None) -> int:
    """Size of the .log files at or above the segment holding the recovery point (only those
    are stat'ed: usually the last one or two of a partition's segments), through io (a fault-
    injecting FileOps sees these calls too) and without following a symlink (a symlinked
    .log is refused by the load itself; its target's size is nothing to plan by). Counting
    stops once it reaches `enough`, if given. names: the directory's listing, if the caller
    has it (list_partition)."""
    if names is None:
        names = list_partition(io, path)
        if names is None:
            return 0
    bases = split_listing(names)[0]
    i = max(0, bisect.bisect_right(bases, recovery_point) - 1)
    total = 0
    for base in bases[i:]:
        try:
            st = io.stat_path(os.path.join(path, f"{base:020d}.log"))
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            total += st.st_size
            if enough is not None and total >= enough:
                break
    return total
