"""Topics on disk: the topic config file (kstore-topic-config.json), and Kafka's rules for
topic names.

The topic config file holds every topic's overrides, its id and the topics whose deletion is
recorded but not finished; a copy is written atomically to every log dir, and the newest
readable copy wins at start-up.
"""
from __future__ import annotations

import json
import logging
import os
import re
from typing import Optional, Sequence

from kstore.errors import InvalidTopicError, UnusableFileError
from kstore.fileio import FileOps, get_file_ops

log = logging.getLogger("kstore.topics")

TOPIC_CONFIG_FILE = "kstore-topic-config.json"
_TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]+$")


def validate_topic_name(name: str) -> None:
    """Kafka's Topic.validate: non-empty, not '.' or '..', at most 249 of [a-zA-Z0-9._-]."""
    if not isinstance(name, str) or not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError(f"Topic name cannot be \"{name}\"")
    if len(name) > 249:
        raise InvalidTopicError(f"Topic name is illegal, it can't be longer than 249 characters, topic name: {name}")
    if not _TOPIC_RE.match(name):
        raise InvalidTopicError(
            f"Topic name \"{name}\" is illegal, it contains a character other than ASCII "
            f"alphanumerics, '.', '_' and '-'")


def read_topic_config_file(log_dirs: Sequence[str], io: Optional[FileOps] = None) -> Optional[dict]:
    """The newest readable topic-config file among the log dirs ({"version", "topics":
    {topic: overrides}, "topic_ids"}), or None. Unreadable copies are skipped with a warning."""
    io = io or get_file_ops()
    best = None
    for d in log_dirs:
        path = os.path.join(d, TOPIC_CONFIG_FILE)
        if not io.exists(path):
            continue
        try:
            data = json.loads(io.read_file(path).decode("utf-8"))
            if best is None or data["version"] > best["version"]:
                best = data
        except (ValueError, KeyError, TypeError, OSError, UnusableFileError) as e:
            log.warning("ignoring unreadable topic config file %s: %s", path, e)
    return best
