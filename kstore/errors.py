"""kstore's exceptions, in one module shared by the Python classes and the compiled core."""
from __future__ import annotations


class KStoreError(Exception):
    """Base class of every error kstore raises on purpose."""


class CorruptRecordError(KStoreError):
    """Bytes on disk fail validation (size, CRC, offsets, record layout).

    ``path`` and ``position`` name the file and byte position at fault when known.
    """

    path: str | None = None
    position: int | None = None

    def __str__(self) -> str:
        msg = super().__str__()
        where = []
        if self.path is not None:
            where.append(str(self.path))
        if self.position is not None:
            where.append(f"position {self.position}")
        return f"{msg} ({', '.join(where)})" if where else msg


class OffsetOutOfRangeError(KStoreError):
    """The requested offset lies outside [log_start_offset, log_end_offset]."""


class LogTruncationError(OffsetOutOfRangeError):
    """A consumer's position is past a truncation of its log, with auto_offset_reset "none"
    (Kafka's LogTruncationException): divergent_offsets maps each such partition to the first
    offset known to diverge; seek there (or elsewhere) to go on."""

    def __init__(self, message: str, divergent_offsets: dict):
        super().__init__(message)
        self.divergent_offsets = divergent_offsets


class ConcurrentModificationError(KStoreError):
    """A Consumer called from a second thread while another thread is inside one of its methods:
    Kafka's ConcurrentModificationException (the consumer is not safe for multi-threaded access;
    close() may be called from any thread)."""


class WakeupError(KStoreError):
    """Consumer.wakeup() interrupted a blocking call (poll, commit, committed) or the next one:
    Kafka's WakeupException. The consumer stays usable, at the same positions."""


class NoOffsetForPartitionError(KStoreError):
    """A consumer with auto_offset_reset="none" has no committed offset for a partition: Kafka's
    NoOffsetForPartitionException (a position out of the log's range raises
    OffsetOutOfRangeError then, as Kafka's). ``partitions`` names them."""

    def __init__(self, message: str, partitions=()):
        super().__init__(message)
        self.partitions = frozenset(partitions)


class RecordTooLargeError(KStoreError):
    """A batch exceeds max.message.bytes or segment.bytes."""


class InvalidRecordError(KStoreError):
    """A record is malformed as input: wrong types, a bad timestamp, a missing key."""


class InvalidConfigError(KStoreError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class InvalidOffsetError(KStoreError):
    """An index append that does not increase, or an offset that cannot be used."""


class IndexOffsetOverflowError(InvalidOffsetError):
    """An offset more than 2^31-1 above a segment's base offset."""


class LogSegmentOffsetOverflowError(KStoreError):
    """A segment holds offsets that do not fit its relative-offset space."""


class UnsupportedCodecError(KStoreError):
    """A compression codec that this installation cannot read or write."""


class KStoreStateError(KStoreError):
    """An operation on a closed log, or one that conflicts with the log's state."""


class SegmentGoneError(KStoreStateError):
    """A segment was deleted or replaced (retention, compaction, truncation, a closed log) while a
    read was using it. Log reads catch it and go on with the log's current segments, or raise
    OffsetOutOfRangeError when the offset itself is gone; it names the segment's file."""


class LogDirOfflineError(KStoreError):
    """A log directory hit an I/O error and takes no more writes until reopened."""


class ApiTimeoutError(KStoreError):
    """A Consumer call bounded by default_api_timeout_ms (or its own timeout_ms) ran out while a
    retriable error lasted, e.g. a partition on an offline log dir: Kafka's TimeoutException."""


class CoordinatorNotAvailableError(KStoreError):
    """A group's `__consumer_offsets` partition is on an offline log dir (or its write failed
    on the disk): nothing was written there. Retriable, as Kafka's COORDINATOR_NOT_AVAILABLE /
    NOT_COORDINATOR; what was committed before stays."""


class KafkaStorageError(LogDirOfflineError, OSError):
    """An I/O error (ENOSPC, EIO, EROFS, ...) in a log's file operation, naming the log; keeps the
    errno. Once raised, the log refuses writes (fsync is never retried) until it is reopened."""


def with_path(exc: CorruptRecordError, path, base_position: int = 0) -> CorruptRecordError:
    """Attach the file name (and shift the position) to an error raised by the core."""
    exc.path = str(path)
    if exc.position is not None:
        exc.position += base_position
    return exc


class LogDirLockedError(KStoreError):
    """Another LogManager (in this process or another) holds the log directory's lock."""


class UnusableFileError(KStoreError):
    """A path in a store that is not what belongs there: a symlink, FIFO, socket, device or
    directory where a regular file belongs, a non-directory (or a symlink) where a directory
    belongs, or a segment name whose offset does not fit in 64 bits. kstore refuses it without
    following, opening or deleting it. Not an OSError: it never takes a log dir offline."""

    def __init__(self, path, why: str):
        self.path = str(path)
        super().__init__(f"refusing {self.path}: {why}")


class PartitionLoadError(KStoreError):
    """A partition that failed to load when its LogManager started (e.g. a file kstore refuses
    in its directory). It stays on disk untouched; every use of it raises this, with the reason,
    until it is repaired and the store reopened."""


class UnknownTopicError(KStoreError):
    """The topic does not exist (and auto.create.topics.enable is off), or the partition is not
    the store's: Kafka's UNKNOWN_TOPIC_OR_PARTITION. ``partitions``: those at fault, if named."""

    def __init__(self, message: str = "", partitions=()):
        super().__init__(message)
        self.partitions = frozenset(partitions)


class UnknownPartitionCountError(KStoreError):
    """A keyed append to a topic whose partition count the store does not know (its log dirs
    hold some partitions of a broker's topic): give the partition, or the count
    (LogManager.set_partition_count)."""


class TopicExistsError(KStoreError):
    """create_topic for a topic that already exists."""


class InvalidTopicError(KStoreError, ValueError):
    """A topic name that breaks Kafka's rules, or an impossible partition count."""


class DataLossError(KStoreError):
    """Offsets a reader was asked for are gone (deleted by retention, or the partition was
    recreated); raised when failOnDataLoss is true, as Spark's Kafka source does."""


class StoreNotVisibleError(KStoreError):
    """A process (a Spark task on an executor) cannot see the store it was planned on: a log
    dir is missing at that path on its host, or what stands there is empty or another store
    (the store identity differs). Names the host and the path; never a DataLossError."""

    def __init__(self, host: str, path: str, why: str):
        self.host, self.path = host, str(path)
        super().__init__(
            f"host {host} cannot see the kstore store at {self.path}: {why}. Every node of a "
            "cluster must mount the store's shared storage at the same path (README: Running "
            "on a cluster)")


class UnsafeFilesystemError(KStoreError):
    """A store on a filesystem that cannot give what an operation needs (e.g. an NFS mount
    whose locks are local to one client, so two writers on two nodes would both hold them)."""
