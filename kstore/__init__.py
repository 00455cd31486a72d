"""kstore: Kafka's broker log storage as an embeddable library.

    import kstore
    with kstore.Log.open("data/clicks-0", {"segment.bytes": 1 << 20}) as log:
        info = log.append([(b"k", b"v")])
        log.read(info.first_offset)
"""
from __future__ import annotations

import logging

# one logger hierarchy, `kstore.*`: silent unless the application configures logging
logging.getLogger("kstore").addHandler(logging.NullHandler())

from kstore import compression as _compression  # noqa: F401,E402  (registers the codecs)
from kstore._core import AppendInfo, Record, crc32, crc32c  # noqa: E402
from kstore.config import LogConfig  # noqa: E402
from kstore.errors import (CorruptRecordError, DataLossError, IndexOffsetOverflowError,  # noqa: E402
                           InvalidConfigError, InvalidOffsetError, InvalidRecordError,
                           KStoreError, KStoreStateError, LogDirOfflineError,
                           LogDirLockedError, LogSegmentOffsetOverflowError,
                           OffsetOutOfRangeError, LogTruncationError, RecordTooLargeError, TopicExistsError,
                           InvalidTopicError, KafkaStorageError, UnknownTopicError,
                           UnknownPartitionCountError, UnsupportedCodecError)
from kstore.fileio import FileOps, get_file_ops, set_file_ops  # noqa: E402
from kstore.offset_index import OffsetIndex  # noqa: E402
from kstore.time_index import TimeIndex  # noqa: E402
from kstore.log import Log  # noqa: E402
from kstore.manager import LogManager  # noqa: E402
from kstore.producer import RecordMetadata  # noqa: E402
from kstore.assignment import assign_replicas  # noqa: E402
from kstore.clock import MockTime  # noqa: E402
from kstore.scheduler import MockScheduler, Scheduler  # noqa: E402
from kstore.segment import LogSegment  # noqa: E402
from kstore.reader import StoreReader  # noqa: E402
from kstore.topic_partition import TopicPartition  # noqa: E402
from kstore.consumer import (Consumer, ConsumerRebalanceListener, ConsumerRecord,  # noqa: E402
                             OffsetAndTimestamp)
from kstore.async_consumer import AsyncConsumer  # noqa: E402
from kstore.group_membership import CommitFailedError  # noqa: E402
from kstore.group_records import OffsetAndMetadata  # noqa: E402
from kstore.errors import ConcurrentModificationError, NoOffsetForPartitionError  # noqa: E402
from kstore.errors import StoreNotVisibleError, UnsafeFilesystemError, WakeupError  # noqa: E402
from kstore.errors import ApiTimeoutError, CoordinatorNotAvailableError  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ApiTimeoutError", "CoordinatorNotAvailableError", "LogManager", "RecordMetadata", "assign_replicas", "MockTime", "MockScheduler", "Scheduler",
    "LogDirLockedError", "TopicExistsError", "InvalidTopicError", "UnknownTopicError", "UnknownPartitionCountError", "KafkaStorageError",
    "AppendInfo", "CorruptRecordError", "DataLossError", "StoreReader", "FileOps", "IndexOffsetOverflowError", "InvalidConfigError",
    "InvalidOffsetError", "InvalidRecordError", "KStoreError", "KStoreStateError", "Log",
    "LogConfig", "LogDirOfflineError", "LogSegment", "LogSegmentOffsetOverflowError",
    "OffsetIndex", "OffsetOutOfRangeError", "LogTruncationError", "Record", "RecordTooLargeError", "TimeIndex",
    "UnsupportedCodecError", "crc32", "crc32c", "get_file_ops", "set_file_ops", "TopicPartition",
    "Consumer", "AsyncConsumer", "ConsumerRebalanceListener", "ConsumerRecord", "OffsetAndTimestamp",
    "OffsetAndMetadata", "NoOffsetForPartitionError", "StoreNotVisibleError", "UnsafeFilesystemError",
    "CommitFailedError", "ConcurrentModificationError", "WakeupError",
]
