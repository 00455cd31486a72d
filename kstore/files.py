"""File names of a partition directory (Kafka's LogFileUtils)."""
from __future__ import annotations

import os
import re
import stat
import uuid

from kstore.errors import UnusableFileError

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

#: Kafka's topic of committed offsets: shared-writer partitions (offsets_topic.py), never a
#: LogManager's own logs
OFFSETS_TOPIC = "__consumer_offsets"

SEGMENT_SUFFIXES = (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)
INDEX_SUFFIXES = (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)

# ASCII digits only: \d would take other scripts' digits, which int() reads as an offset
_NAME = re.compile(r"^([0-9]{20})(\.[a-z]+)((?:\.deleted|\.cleaned|\.swap)?)$", re.ASCII)
PARTITION_DIR = re.compile(r"^(.+)-([0-9]+)$", re.ASCII)
# `topic-N.<32 hex>-delete`; a long topic's name is cut, partition number and all (Kafka)
_DELETE_DIR = re.compile(r"^(.+)\.([0-9a-f]{32})-delete$", re.ASCII)
INT64_MAX = (1 << 63) - 1
_NOT_PARTITIONS = ("remote-log-index-cache", "__cluster_metadata")


def filename_prefix(offset: int) -> str:
    """The 20-digit zero-padded base offset that names a segment's files."""
    return f"{offset:020d}"


def segment_file(dir_: str, base_offset: int, suffix: str, extra: str = "") -> str:
    return os.path.join(dir_, filename_prefix(base_offset) + suffix + extra)


#: the plain segment file names by length (20 digits and a suffix: the names a listing meets
#: most), which parse_name reads by their shape without the regex
_PLAIN_AT = {20 + len(s): s for s in SEGMENT_SUFFIXES}


def parse_name(name: str, dir_: str | None = None):
    """(base_offset, suffix, extra) for a segment file name, else None. A 20-digit name above
    2^63-1 (no offset can be) raises UnusableFileError naming the file (under dir_ if given)."""
    suffix = _PLAIN_AT.get(len(name))
    if suffix is not None and name.endswith(suffix) and name.isascii() and name[:20].isdigit() \
            and int(name[:20]) <= INT64_MAX:
        return int(name[:20]), suffix, ""
    m = _NAME.match(name)
    if not m:
        return None
    base = int(m.group(1))
    if base > INT64_MAX:
        raise UnusableFileError(os.path.join(dir_, name) if dir_ else name,
                                "its base offset is above 2^63-1")
    return base, m.group(2), m.group(3)


def delete_dir_name(topic: str, partition: int) -> str:
    """Kafka's name for a deleted partition's directory: `topic-N.<32 hex>-delete`, the topic
    part cut so that the whole stays within 255 bytes (UnifiedLog.logDeleteDirName)."""
    suffix = f".{uuid.uuid4().hex}-delete"
    prefix = f"{topic}-{partition}"
    return prefix[: 255 - len(suffix)] + suffix


def is_delete_dir(name: str) -> bool:
    """A deleted topic's partition directory awaiting removal (`topic-N.<uuid>-delete`)."""
    return _DELETE_DIR.match(name) is not None


def partition_dirs(io, log_dir: str) -> list[tuple[tuple[str, int], str]]:
    """((topic, partition), path) of every live partition directory in a log dir, sorted by
    name: not the deleted (`-delete`), future or stray ones, nor Kafka's special directories,
    nor regular files. Symlinks and special files with a partition's name are listed, for the
    caller's open to refuse (FileOps.check_dir) rather than skip them silently."""
    out = []
    for name in sorted(io.listdir(log_dir)):
        if name in _NOT_PARTITIONS or _DELETE_DIR.match(name) or name.endswith(("-future", "-stray")):
            continue
        m = PARTITION_DIR.match(name)
        if not m or m.group(1) in _NOT_PARTITIONS:      # KRaft's __cluster_metadata-0
            continue
        path = os.path.join(log_dir, name)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue        # removed since the listing
        if not stat.S_ISREG(mode):
            out.append(((m.group(1), int(m.group(2))), path))
    return out
