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
_DELETE_DIR = re.compile(r"^(.+)-(\d+)\.([0-9a-f]{32})-delete$")
_NOT_PARTITIONS = ("remote-log-index-cache", "__cluster_metadata")


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


def is_delete_dir(name: str) -> bool:
    """A deleted topic's partition directory awaiting removal (`topic-N.<uuid>-delete`)."""
    return _DELETE_DIR.match(name) is not None


def partition_dirs(io, log_dir: str) -> list[tuple[tuple[str, int], str]]:
    """((topic, partition), path) of every live partition directory in a log dir, sorted by
    name: not the deleted (`-delete`), future or stray ones, nor Kafka's special directories."""
    out = []
    for name in sorted(io.listdir(log_dir)):
        if name in _NOT_PARTITIONS or _DELETE_DIR.match(name) or name.endswith(("-future", "-stray")):
            continue
        m = _PARTITION_DIR.match(name)
        if not m:
            continue
        path = os.path.join(log_dir, name)
        if os.path.isdir(path):
            out.append(((m.group(1), int(m.group(2))), path))
    return out
