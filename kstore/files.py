"""File names of a partition directory (Kafka's LogFileUtils)."""
from __future__ import annotations

import os
import re

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

_NAME = re.compile(r"^(\d{20})(\.[a-z]+)((?:\.deleted|\.cleaned|\.swap)?)$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")


def filename_prefix(offset: int) -> str:
    """The 20-digit zero-padded base offset that names a segment's files."""
    return f"{offset:020d}"


def segment_file(dir_: str, base_offset: int, suffix: str, extra: str = "") -> str:
    return os.path.join(dir_, filename_prefix(base_offset) + suffix + extra)


def parse_name(name: str):
    """(base_offset, suffix, extra) for a segment file name, else None."""
    m = _NAME.match(name)
    if not m:
        return None
    return int(m.group(1)), m.group(2), m.group(3)


def parse_partition_dir(path: str):
    """(topic, partition) for a `topic-N` directory name, else None."""
    m = _PARTITION_DIR.match(os.path.basename(os.path.normpath(path)))
    if not m:
        return None
    return m.group(1), int(m.group(2))
