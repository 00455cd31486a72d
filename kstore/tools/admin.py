"""Operator commands over a store: `kstore topics`, `get-offsets`, `log-dirs`, `delete-records`
and `assign-replicas`, shaped after Kafka's kafka-topics, GetOffsetShell, kafka-log-dirs,
kafka-delete-records and kafka-reassign-partitions, with --log-dirs in place of a broker.

Commands that only read open the store read-only (no lock), so they work beside a running
application; commands that write take the store's lock and fail clearly while another process
holds it.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from datetime import datetime, timedelta, timezone
from typing import IO, Any, Optional

from kstore.assignment import assign_replicas
from kstore.broker_config import BrokerConfig
from kstore.errors import InvalidConfigError, KStoreError, UnknownTopicError
from kstore.manager import LogManager
from kstore.properties import load_properties
from kstore.log_tail import tail_problem
from kstore.tools.progress import Progress
from kstore.reader import StoreReader, split_log_dirs
from kstore.topics import read_topic_config_file

# A command-line process is short-lived: it must not start retention, flushes or cleaning of
# its own in the middle of the command (the store's owner does those), only recover and close.
CLI_BROKER_SETTINGS = {"log.initial.task.delay.ms": 365 * 86_400_000, "log.cleaner.enable": False}

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


class UsageError(InvalidConfigError):
    """Options that do not make a command (missing, contradictory or malformed): the CLI prints
    the subcommand's usage and exits with status 2, as for argparse's own usage errors."""
SPECIAL_TIMES = {"latest": -1, "earliest": -2, "max-timestamp": -3}


class _LoadProgress:
    """Recovery progress for a LogManager's startup (a bar only on a terminal)."""

    def __init__(self) -> None:
        self.bar: Optional[Progress] = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            self.bar = Progress("loading partitions", total, "partitions")
        self.bar.set(done, total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def open_manager(args: argparse.Namespace) -> LogManager:
    """The store for a command that writes: takes the directory lock, recovers if needed.
    With --broker-config, the file's settings (its log.dirs unless --log-dirs is given); an
    empty one writes to Kafka's default /tmp/kafka-logs, which is said on stderr."""
    settings: dict[str, Any] = dict(CLI_BROKER_SETTINGS)
    progress = _LoadProgress()
    try:
        if getattr(args, "broker_config", None):
            props: dict[str, Any] = dict(load_properties(args.broker_config))
            props.update(settings)
            if args.log_dirs:
                props["log.dirs"] = ",".join(split_log_dirs(args.log_dirs))
            note = BrokerConfig(props, warn=False).default_log_dir_note()
            if note:
                logging.getLogger("kstore.config").warning("%s: %s", args.broker_config, note)
            return LogManager(None, props, progress=progress)
        return LogManager(split_log_dirs(_need_log_dirs(args)), settings, progress=progress)
    finally:
        progress.close()


def open_reader(args: argparse.Namespace) -> StoreReader:
    """The store for a command that only reads: read-only, lock-free."""
    return StoreReader(_need_log_dirs(args))


def _need_log_dirs(args) -> str:
    if not args.log_dirs:
        raise UsageError("--log-dirs is required (a comma-separated list of log dirs)")
    return args.log_dirs


def parse_time(text: str) -> int:
    """--time: earliest, latest, max-timestamp, -1/-2/-3, epoch milliseconds, or ISO-8601
    (a time without a zone is UTC)."""
    t = text.strip().lower()
    if t in SPECIAL_TIMES:
        return SPECIAL_TIMES[t]
    try:
        v = int(t)
    except ValueError:
        try:
            dt = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
        except ValueError:
            raise UsageError(
                f"--time {text!r}: expected earliest, latest, max-timestamp, epoch milliseconds "
                f"or an ISO-8601 time") from None
        if dt.tzinfo is None:
            dt = dt.replace(tzinfo=timezone.utc)
        return (dt - _EPOCH) // timedelta(milliseconds=1)      # exact, no float rounding
    if v < -3:
        raise UsageError(f"--time {v}: negative values other than -1, -2, -3 are not times")
    return v


def parse_config_pairs(pairs: Optional[list[str]]) -> dict[str, Optional[str]]:
    """--config k=v, repeatable as kafka-topics' (a value may hold commas: cleanup.policy=compact,delete).
    A value of None (added by `alter --delete-config`) removes an override."""
    out: dict[str, Optional[str]] = {}
    for kv in pairs or []:
        k, eq, v = kv.partition("=")
        if not eq or not k.strip():
            raise UsageError(f"--config {kv!r}: expected key=value")
        out[k.strip()] = v.strip()
    return out


def _partition_list(text: Optional[str]) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise UsageError(f"--partitions {text!r}: expected a comma-separated list of numbers") from None


def _topics_of(store: StoreReader, topic: Optional[str]) -> list[str]:
    names = store.topics()
    if topic is None:
        return names
    if topic in names:
        return [topic]
    raise UnknownTopicError(f"Topic '{topic}' does not exist in {','.join(store.log_dirs)}")


# -- kstore topics ---------------------------------------------------------------------------------
def topics(args: argparse.Namespace, out: IO[str]) -> int:
    action = args.action
    if action == "list":
        with open_reader(args) as store:
            for t in store.topics():
                if not args.exclude_internal or not t.startswith("__"):
                    out.write(t + "\n")
        return 0
    if action == "describe":
        return _describe(args, out)
    if not args.topic:
        raise UsageError(f"kstore topics {action} needs --topic")
    if action == "create":
        config = parse_config_pairs(args.config)
        with open_manager(args) as m:
            if args.topic in m.topics():
                if args.if_not_exists:
                    return 0
            m.create_topic(args.topic, args.partitions, config)
            out.write(f"Created topic {args.topic}.\n")
        return 0
    if action == "delete":
        with open_manager(args) as m:
            if args.topic not in m.topics():
                if args.if_exists:
                    return 0
                raise UnknownTopicError(f"Topic '{args.topic}' does not exist as expected")
            m.delete_topic(args.topic)
        out.write(f"Deleted topic {args.topic} (its directories are renamed *-delete and "
                  f"removed after file.delete.delay.ms by the store's owner).\n")
        return 0
    if action == "alter":
        config = parse_config_pairs(args.config)
        for k in args.delete_config or []:
            config[k.strip()] = None
        if not config and args.partitions is None:
            raise UsageError("kstore topics alter needs --config, --delete-config or --partitions")
        with open_manager(args) as m:
            if args.topic not in m.topics():
                raise UnknownTopicError(f"Topic '{args.topic}' does not exist")
            if args.partitions is not None:
                new = m.add_partitions(args.topic, args.partitions)
                out.write(f"Added partitions {new} to {args.topic}.\n")
            if config:
                cfg = m.alter_topic_config(args.topic, config)
                out.write(f"Completed updating config for topic {args.topic}: "
                          f"{_config_text(cfg.overrides)}\n")
        return 0
    raise InvalidConfigError(f"unknown topics action {action!r}")


def _config_text(overrides: dict) -> str:
    return ",".join(f"{k}={v if not isinstance(v, tuple) else ','.join(v)}"
                    for k, v in sorted(overrides.items()))


def _describe(args, out: IO) -> int:
    with open_reader(args) as store:
        conf = read_topic_config_file(store.log_dirs) or {}
        described: list[dict[str, Any]] = []
        for t in _topics_of(store, args.topic):
            parts = []
            for _t, p in store.partitions(t):
                lg = store.log(t, p)
                warn_unreadable(lg)
                parts.append({"partition": p, "logDir": os.path.dirname(lg.dir),
                              "logStartOffset": lg.log_start_offset, "logEndOffset": lg.log_end_offset,
                              "size": lg.size, "segments": len(lg.segments)})
            described.append({"topic": t, "topicId": _topic_id(store, t, conf),
                              "partitionCount": len(parts), "replicationFactor": 1,
                              "configs": dict(sorted(conf.get("topics", {}).get(t, {}).items())),
                              "partitions": parts})
    if args.json:
        out.write(json.dumps(described if args.topic is None else described[0]) + "\n")
        return 0
    for d in described:
        configs = ",".join(f"{k}={v}" for k, v in d["configs"].items())
        out.write(f"Topic: {d['topic']}\tTopicId: {d['topicId']}\tPartitionCount: {d['partitionCount']}"
                  f"\tReplicationFactor: 1\tConfigs: {configs}\n")
        for p in d["partitions"]:
            out.write(f"\tTopic: {d['topic']}\tPartition: {p['partition']}\tLogDir: {p['logDir']}"
                      f"\tLogStartOffset: {p['logStartOffset']}\tLogEndOffset: {p['logEndOffset']}"
                      f"\tSize: {p['size']}\tSegments: {p['segments']}\n")
    return 0


def warn_unreadable(lg: Any, err: Optional[IO[str]] = None) -> int:
    """Say on stderr (file, position, what) when a segment holds bytes past what the read-only
    view could validate, so that a garbage .log is not shown as an empty partition without a
    word (Kafka's dump reports such bytes); returns how many segments did."""
    n = 0
    for seg in lg.segments:
        problem = tail_problem(seg.log_path, seg.size)
        if problem is not None:
            n += 1
            print(f"kstore: warning: {problem}", file=err or sys.stderr)
    return n


def _topic_id(store: StoreReader, topic: str, conf: dict) -> str:
    tid = conf.get("topic_ids", {}).get(topic)
    if tid:
        return tid
    for _t, p in store.partitions(topic):       # a broker's partition.metadata
        try:
            with open(os.path.join(store.log(topic, p).dir, "partition.metadata")) as f:
                for line in f:
                    if line.startswith("topic_id:"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return "-"


# -- kstore get-offsets ------------------------------------------------------------------------
def get_offsets(args: argparse.Namespace, out: IO[str]) -> int:
    """GetOffsetShell: topic:partition:offset lines. A partition asked for by number that the
    topic does not have is an error, and so is a filter that matches nothing (Kafka's "Could
    not match any topic-partitions with the specified filters")."""
    ts = parse_time(args.time)
    wanted = _partition_list(args.partitions)
    lines = []
    with open_reader(args) as store:
        for t in _topics_of(store, args.topic):
            have = [p for _t, p in store.partitions(t)]
            if args.topic is not None and wanted is not None:
                missing = [p for p in wanted if p not in have]
                if missing:
                    raise UnknownTopicError(
                        f"Topic '{t}' has no partition {', '.join(map(str, missing))} (its partitions: "
                        f"{', '.join(map(str, have)) or 'none'})")
            for p in have:
                if wanted is not None and p not in wanted:
                    continue
                off = store.log(t, p, refresh=True).offset_for_timestamp(ts)
                lines.append(f"{t}:{p}:{'' if off is None else off}\n")
    if not lines and (wanted is not None or args.topic is None):
        raise UnknownTopicError("Could not match any topic-partitions with the specified filters")
    out.write("".join(lines))
    return 0


# -- kstore log-dirs -----------------------------------------------------------------------------
def log_dirs(args: argparse.Namespace, out: IO[str]) -> int:
    topics_wanted = None if not args.topic_list else {t for t in args.topic_list.split(",") if t}
    dirs = split_log_dirs(_need_log_dirs(args))
    entries: list[dict[str, Any]] = []
    for d in dirs:
        if not os.path.isdir(d):
            entries.append({"logDir": d, "error": f"KafkaStorageException: {d} is not a directory",
                            "partitions": []})
            continue
        parts = []
        with StoreReader(d) as store:
            for t, p in store.partitions():
                if topics_wanted is not None and t not in topics_wanted:
                    continue
                warn_unreadable(store.log(t, p))
                parts.append({"partition": f"{t}-{p}", "size": store.log(t, p).size,
                              "offsetLag": 0, "isFuture": False})
        entries.append({"logDir": d, "error": None, "partitions": parts})
    out.write(json.dumps({"version": 1, "brokers": [{"broker": args.broker_id, "logDirs": entries}]})
              + "\n")
    return 0


# -- kstore delete-records -----------------------------------------------------------------------
def delete_records(args: argparse.Namespace, out: IO[str]) -> int:
    """Advance log start offsets (Kafka's DeleteRecords): offset -1 means the high watermark."""
    wanted: list[tuple[str, Optional[int], int]]      # partition None: every partition
    if args.offset_json_file:
        try:
            with open(args.offset_json_file, encoding="utf-8") as f:
                spec = json.load(f)
            wanted = [(str(e["topic"]), int(e["partition"]), int(e["offset"])) for e in spec["partitions"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InvalidConfigError(f"--offset-json-file {args.offset_json_file}: {e} (expected "
                                     f'{{"partitions": [{{"topic": T, "partition": P, "offset": O}}], '
                                     f'"version": 1}})') from None
    elif args.topic is not None and args.offset is not None:
        given = _partition_list(args.partition)
        chosen: list[Optional[int]] = list(given) if given else [None]
        wanted = [(args.topic, p, args.offset) for p in chosen]
    else:
        raise UsageError("give --offset-json-file, or --topic and --offset (and optionally --partition)")
    for t, p, off in wanted:
        if off < -1:
            raise UsageError(f"offset {off} for {t}{'' if p is None else f'-{p}'}: an offset to delete "
                             f"records before is >= 0, or -1 for the high watermark")
    out.write("Executing records delete operation\n")
    failures = 0
    lines = []
    with open_manager(args) as m:
        expanded = []
        for t, p, off in wanted:
            if p is None:
                if t not in m.topics():
                    raise UnknownTopicError(f"Topic '{t}' does not exist")
                expanded += [(t, q, off) for q in m.partitions(t)]
            else:
                expanded.append((t, p, off))
        for t, p, off in expanded:
            try:
                lg = m.log(t, p)
                low = lg.delete_records(lg.high_watermark if off == -1 else off)
                lines.append(f"partition: {t}-{p}\tlow_watermark: {low}")
            except KStoreError as e:
                failures += 1
                lines.append(f"partition: {t}-{p}\terror: {e}")
        m.checkpoint_log_start_offsets()
    out.write("Records delete operation completed:\n" + "".join(line + "\n" for line in lines))
    return 1 if failures else 0


# -- kstore assign-replicas ----------------------------------------------------------------------
def assign(args: argparse.Namespace, out: IO[str]) -> int:
    try:
        brokers = [int(b) for b in args.broker_list.split(",") if b.strip()]
    except ValueError:
        raise UsageError(f"--broker-list {args.broker_list!r}: expected broker ids like 0,1,2") from None
    if len(set(brokers)) != len(brokers):
        raise UsageError(f"--broker-list {args.broker_list!r} repeats a broker id")
    counts: dict[str, int] = {}
    if args.partitions is not None:
        if not args.topic or len(args.topic) != 1:
            raise UsageError("--partitions needs exactly one --topic")
        counts[args.topic[0]] = args.partitions
    else:
        names = list(args.topic or [])
        if args.topics_to_move_json_file:
            try:
                with open(args.topics_to_move_json_file, encoding="utf-8") as f:
                    names += [str(e["topic"]) for e in json.load(f)["topics"]]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise InvalidConfigError(f"--topics-to-move-json-file {args.topics_to_move_json_file}: "
                                         f'{e} (expected {{"topics": [{{"topic": T}}], "version": 1}})') from None
        if not names:
            raise UsageError("give --topic (repeatable) or --topics-to-move-json-file")
        with open_reader(args) as store:
            for t in names:
                counts[t] = len(store.partitions(_topics_of(store, t)[0]))
    current, proposed = [], []
    for t, n in counts.items():
        plan = assign_replicas(n, brokers, args.replication_factor,
                               start_index=args.start_index, shift=args.shift)
        for p in range(n):
            current.append({"topic": t, "partition": p, "replicas": [args.broker_id], "log_dirs": ["any"]})
            proposed.append({"topic": t, "partition": p, "replicas": plan[p],
                             "log_dirs": ["any"] * len(plan[p])})
    if args.json:        # the plain output's two documents, under the names its headings give
        out.write(json.dumps({"current": {"version": 1, "partitions": current},
                              "proposed": {"version": 1, "partitions": proposed}},
                             separators=(",", ":")) + "\n")
        return 0
    out.write("Current partition replica assignment\n")
    out.write(json.dumps({"version": 1, "partitions": current}, separators=(",", ":")) + "\n\n")
    out.write("Proposed partition reassignment configuration\n")
    out.write(json.dumps({"version": 1, "partitions": proposed}, separators=(",", ":")) + "\n")
    return 0

