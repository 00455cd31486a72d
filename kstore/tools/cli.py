"""The `kstore` command (also `python -m kstore`), on the standard library's argparse: quickstart,
bench, dump-log, produce, consume, topics, get-offsets, log-dirs, delete-records, assign-replicas.

Exit status: 0 success, 1 an error (printed as `kstore: error: ...`), 2 bad usage or, for
dump-log, corruption found; 130 interrupted."""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from typing import IO, Optional, Sequence

import kstore
from kstore import _core

EPILOG = """examples:
  kstore quickstart                  build a small store in ./kstore-data and tour it
  kstore topics create --log-dirs D --topic T --partitions 3
  kstore produce --log-dirs D --topic T --key-separator : < lines.txt
  kstore consume --log-dirs D --topic T --from-beginning --print-key
  kstore get-offsets --log-dirs D --topic T --time latest
  kstore dump-log --files D/T-0/00000000000000000000.log --print-data-log
  kstore bench --quick               a 100,000-record run against sqlite3 and LMDB

Every command takes --help. Commands that only read (consume, topics list/describe,
get-offsets, log-dirs, dump-log) open the store read-only and work beside a running
application; the others take the store's lock.
exit status: 0 ok, 1 error, 2 usage error (dump-log: corruption found), 130 interrupted
"""

DUMP_EPILOG = """examples:
  kstore dump-log --files 00000000000000000000.log
  kstore dump-log --files 00000000000000000000.log --deep-iteration --print-data-log
  kstore dump-log --files 00000000000000000000.index,00000000000000000000.timeindex
  kstore dump-log --files 00000000000000000000.index --index-sanity-check
exit status: 0 when every file is sound, 2 when corruption or index mismatches were found
"""


def quickstart(dir_: str, out: Optional[IO[str]] = None) -> int:
    """Write a small partition, read it back by offset and by timestamp, and say what happened."""
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    part = os.path.join(dir_, "quickstart-0")
    if os.path.exists(part):
        shutil.rmtree(part)
    config = {"segment.bytes": 16 * 1024, "index.interval.bytes": 1024}
    p(f"kstore {kstore.__version__}: quickstart in {os.path.abspath(part)}")
    p(f"  config: {config} (CRC-32C via {_core.crc32c_implementation()})")
    base_ts = int(time.time() * 1000) - 60_000
    with kstore.Log.open(part, config) as log:
        info = log.append([(b"user-%d" % i, b"clicked page %d" % (i % 7), base_ts + i * 100)
                           for i in range(100)])
        p(f"appended one batch of {info.record_count} records: offsets {info.first_offset}..{info.last_offset}")
        for i in range(100, 400):
            log.append([(b"user-%d" % i, b"clicked page %d" % (i % 7), base_ts + i * 100,
                         [("source", b"quickstart")])])
        p(f"appended 300 single-record batches: log end offset {log.log_end_offset}")
        segs = log.segments
        p(f"segments rolled at segment.bytes={config['segment.bytes']}: {len(segs)} "
          f"(base offsets {', '.join(str(s.base_offset) for s in segs)})")
        r = log.read(250, max_records=1)[0]
        p(f"read by offset 250 → key={r.key!r} value={r.value!r} timestamp={r.timestamp} headers={list(r.headers)}")
        target = base_ts + 123 * 100 + 50
        off = log.offset_for_timestamp(target)
        p(f"first offset with timestamp >= {target}: {off} (via the time index)")
        p(f"latest / earliest / max-timestamp offsets: {log.offset_for_timestamp(-1)} / "
          f"{log.offset_for_timestamp(-2)} / {log.offset_for_timestamp(-3)}")
        log.flush()
        p(f"flushed: recovery point {log.recovery_point}")
    names = sorted(n for n in os.listdir(part) if not n.startswith("."))
    p(f"on disk ({len(names)} files, Kafka's layout):")
    for name in names[:6]:
        p(f"  {name:<34} {os.path.getsize(os.path.join(part, name)):>8} bytes")
    if len(names) > 6:
        p(f"  ... and {len(names) - 6} more")
    with kstore.Log.open(part, config) as log:
        n = sum(1 for _ in log)
        p(f"reopened after a clean close: {n} records, {len(log.recovery_report)} segments needed recovery")
    _tour_manager(os.path.join(dir_, "managed"), p)
    return 0


def _tour_manager(root: str, p) -> None:
    """Topics under a LogManager: keyed partitioning, retention by size, compaction."""
    if os.path.exists(root):
        shutil.rmtree(root)
    # cleaning on demand only (no background thread racing clean_now for the same log)
    settings = {"log.segment.bytes": 4096, "log.initial.task.delay.ms": 3_600_000, "log.cleaner.threads": 0}
    with kstore.LogManager(root, settings) as m:
        p(f"LogManager on {os.path.abspath(root)}")
        m.create_topic("events", 3, {"retention.bytes": 8192})
        for i in range(300):
            m.append("events", b"device-%d" % (i % 10), b"reading %d" % i)
        md = m.append("events", b"device-3", b"one more")
        p(f"  'events' has 3 partitions; key device-3 always lands on partition {md.partition} "
          f"(murmur2, as a Kafka client)")
        before = sum(len(m.log("events", q).segments) for q in range(3))
        deleted = m.cleanup_logs()
        starts = [m.log("events", q).log_start_offset for q in range(3)]
        p(f"  retention.bytes=8192: deleted {deleted} of {before} segments; log start offsets now {starts}")
        m.create_topic("profiles", 1, {"cleanup.policy": "compact", "min.cleanable.dirty.ratio": 0.01})
        for i in range(500):
            m.append("profiles", b"user-%d" % (i % 20), b"profile version %d" % i)
        lg = m.log("profiles", 0)
        n_before = sum(1 for _ in lg)
        stats = m.clean_now()
        n_after = sum(1 for _ in lg)
        removed = sum(s.records_removed for s in stats)
        p(f"  compacted 'profiles': {n_before} -> {n_after} records ({removed} superseded values "
          f"removed); user-7 reads {[r.value for r in lg if r.key == b'user-7'][-1]!r}")
    p(f"  closed cleanly: {sorted(n for n in os.listdir(root) if not os.path.isdir(os.path.join(root, n)))}")


class _Fmt(argparse.RawDescriptionHelpFormatter):
    pass


def _sub(sub, name: str, help: str, epilog: str, description: Optional[str] = None):
    p = sub.add_parser(name, help=help, description=description or help, epilog=epilog,
                       formatter_class=_Fmt)
    p.set_defaults(subparser=p)          # usage errors print this command's usage
    return p


def _log_dirs(p, write: bool) -> None:
    p.add_argument("--log-dirs", metavar="DIR[,DIR]",
                   help="the store's log dirs, comma-separated (in place of --bootstrap-server)"
                   + ("" if write else "; opened read-only"))
    if write:
        p.add_argument("--broker-config", metavar="server.properties",
                       help="broker settings (num.partitions, log.segment.bytes, ...); its log.dirs "
                            "is used when --log-dirs is not given")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="kstore", description="Kafka's log storage, embedded.",
                                 epilog=EPILOG, formatter_class=_Fmt)
    ap.add_argument("--version", action="version", version=f"kstore {kstore.__version__}")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")

    q = _sub(sub, "quickstart", "build a small store and tour it",
             "example:\n  kstore quickstart --dir ./kstore-data")
    q.add_argument("--dir", default="./kstore-data", help="log dir to write (default ./kstore-data)")
    sub.add_parser("bench", help="benchmark against sqlite3 and LMDB (see kstore bench --help)",
                   add_help=False)

    d = _sub(sub, "dump-log", "print the batches, records or index entries of segment files",
             DUMP_EPILOG, "Kafka's kafka-dump-log: batch headers (CRCs verified), records, "
                          "and index entries checked against their .log.")
    d.add_argument("--files", required=True,
                   help="comma-separated .log/.index/.timeindex/.txnindex files (and KRaft .checkpoint snapshots)")
    d.add_argument("--print-data-log", action="store_true", help="print keys and values (implies --deep-iteration)")
    d.add_argument("--deep-iteration", action="store_true", help="print every record, not only batch headers")
    d.add_argument("--verify-index-only", action="store_true", help="check index entries against the .log; print only mismatches")
    d.add_argument("--index-sanity-check", action="store_true", help="check that the index files are well formed")
    d.add_argument("--max-bytes", type=int, default=-1,
                   help="read at most this many bytes of each .log; a batch cut there is not reported")
    d.add_argument("--skip-record-metadata", action="store_true",
                   help="print only the records' keys and values, not their offsets and sizes")
    d.add_argument("--json", action="store_true", help="one JSON object per batch or entry")

    p = _sub(sub, "produce", "append lines from stdin to a topic (kafka-console-producer)", """examples:
  echo hello | kstore produce --log-dirs D --topic T
  kstore produce --log-dirs D --topic T --key-separator : < users.txt     lines are key:value
  kstore produce --log-dirs D --topic T --partition 0 --batch-size 65536 < big.txt
A missing topic is created with num.partitions (auto.create.topics.enable, as a broker does).
Keyed lines go to murmur2(key) % partitions; unkeyed ones stick to one partition per input chunk.
A line without the separator stops the command with exit status 1 (earlier lines are kept).""")
    _log_dirs(p, write=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--key-separator", metavar="SEP",
                   help="split each line into key SEP value (escapes such as \\t allowed)")
    p.add_argument("--parse-key", action="store_true", help="lines are keyed (separator default \\t)")
    p.add_argument("--partition", type=int, help="append every line to this partition")
    p.add_argument("--batch-size", type=int, default=16384, metavar="BYTES",
                   help="bytes per record batch, as the producer's batch.size: a batch closes "
                        "before a record whose estimated encoded size (32 bytes + key + value) "
                        "would take it past this (default 16384)")
    p.add_argument("--verbose", action="store_true", help="say how many records were appended")

    c = _sub(sub, "consume", "print a topic's records (kafka-console-consumer)", """examples:
  kstore consume --log-dirs D --topic T --from-beginning
  kstore consume --log-dirs D --topic T --partition 0 --offset 42 --max-messages 10
  kstore consume --log-dirs D --topic T --time 2026-01-01T00:00:00Z --print-timestamp --print-key
  kstore consume --log-dirs D --topic T --follow          tail new records until Ctrl-C
Without --from-beginning, --offset or --time, reading starts at the end (Kafka's default), so
only --follow prints anything. The last line on stderr is "Processed a total of N messages".""")
    _log_dirs(c, write=False)
    c.add_argument("--topic", required=True)
    c.add_argument("--partition", type=int, help="read only this partition")
    c.add_argument("--from-beginning", action="store_true", help="start at the log start offset")
    c.add_argument("--offset", metavar="N|earliest|latest", help="start offset (a number needs --partition)")
    c.add_argument("--time", metavar="TIME", help="start at the first record with timestamp >= TIME "
                   "(epoch ms or ISO-8601), found through the time index")
    c.add_argument("--follow", "-f", action="store_true", help="keep waiting for new records")
    c.add_argument("--max-messages", type=int, help="stop after this many records")
    c.add_argument("--timeout-ms", type=int, help="with --follow, stop after this long without a record")
    c.add_argument("--poll-ms", type=int, default=100,
                   help="with --follow, how often to look while no partition can be waited on (default 100)")
    c.add_argument("--print-key", action="store_true")
    c.add_argument("--print-timestamp", action="store_true")
    c.add_argument("--print-partition", action="store_true")
    c.add_argument("--print-offset", action="store_true")
    c.add_argument("--print-headers", action="store_true")
    c.add_argument("--no-value", action="store_true", help="do not print values")
    c.add_argument("--group", metavar="G", help="consume as a member of consumer group G: its partitions "
                   "shared with the group's other members, starting at the committed offsets, committing "
                   "as it goes (--from-beginning: where the group has no committed offset)")
    c.add_argument("--key-separator", metavar="SEP", help="between printed fields (default \\t)")
    c.add_argument("--line-separator", metavar="SEP", default="\\n", help="after each record (default \\n)")
    c.add_argument("--isolation-level", choices=["read_uncommitted", "read_committed"],
                   default="read_uncommitted", help="read_committed: only committed transactions' "
                   "records, up to the last stable offset (default read_uncommitted)")

    t = _sub(sub, "topics", "create, list, describe, delete or alter topics (kafka-topics)", """examples:
  kstore topics create --log-dirs D --topic T --partitions 3 --config cleanup.policy=compact
  kstore topics list --log-dirs D
  kstore topics describe --log-dirs D --topic T [--json]
  kstore topics alter --log-dirs D --topic T --config retention.ms=3600000 --delete-config segment.bytes
  kstore topics alter --log-dirs D --topic T --partitions 6
  kstore topics delete --log-dirs D --topic T""")
    t.add_argument("action", choices=["create", "list", "describe", "delete", "alter"])
    _log_dirs(t, write=True)
    t.add_argument("--topic")
    t.add_argument("--partitions", type=int, help="create: the count (default num.partitions); alter: grow to")
    t.add_argument("--config", action="append", metavar="KEY=VALUE", help="a topic config override (repeatable)")
    t.add_argument("--delete-config", action="append", metavar="KEY", help="alter: remove an override (repeatable)")
    t.add_argument("--if-not-exists", action="store_true")
    t.add_argument("--if-exists", action="store_true")
    t.add_argument("--exclude-internal", action="store_true", help="list: hide topics starting with __")
    t.add_argument("--json", action="store_true", help="describe: JSON")

    g = _sub(sub, "get-offsets", "offsets by time: earliest, latest, max-timestamp or a timestamp "
             "(kafka-get-offsets)", """examples:
  kstore get-offsets --log-dirs D --topic T                 latest, as topic:partition:offset
  kstore get-offsets --log-dirs D --topic T --time earliest
  kstore get-offsets --log-dirs D --time 1767225600000 --partitions 0,1
An empty offset means no record has a timestamp at or after --time.""")
    _log_dirs(g, write=False)
    g.add_argument("--topic", help="one topic (default: all)")
    g.add_argument("--partitions", metavar="P[,P]", help="only these partitions")
    g.add_argument("--time", default="latest",
                   help="earliest (-2), latest (-1, default), max-timestamp (-3), epoch ms or ISO-8601")

    ld = _sub(sub, "log-dirs", "size of every partition per log dir, as JSON (kafka-log-dirs --describe)",
              """example:
  kstore log-dirs --log-dirs D1,D2 --topic-list clicks,orders""")
    _log_dirs(ld, write=False)
    ld.add_argument("--topic-list", metavar="T[,T]", help="only these topics")
    ld.add_argument("--broker-id", type=int, default=0, help="the broker id to report (default 0)")

    dr = _sub(sub, "delete-records", "advance log start offsets, deleting what is below "
              "(kafka-delete-records)", """examples:
  kstore delete-records --log-dirs D --offset-json-file delete.json
      delete.json: {"partitions": [{"topic": "T", "partition": 0, "offset": 100}], "version": 1}
  kstore delete-records --log-dirs D --topic T --partition 0 --offset 100
  kstore delete-records --log-dirs D --topic T --offset -1        everything, every partition
Offset -1 means the high watermark. Exit status 1 when any partition failed.""")
    _log_dirs(dr, write=True)
    dr.add_argument("--offset-json-file", metavar="FILE")
    dr.add_argument("--topic")
    dr.add_argument("--partition", metavar="P[,P]", help="default: every partition of --topic")
    dr.add_argument("--offset", type=int)

    ar = _sub(sub, "assign-replicas", "propose a replica assignment, as kafka-reassign-partitions "
              "--generate", """examples:
  kstore assign-replicas --log-dirs D --topic T --broker-list 0,1,2 --replication-factor 2
  kstore assign-replicas --log-dirs D --topics-to-move-json-file topics.json --broker-list 1,2,3
  kstore assign-replicas --topic T --partitions 6 --broker-list 0,1,2 --replication-factor 3 \\
      --start-index 0 --shift 0 --json
The layout is Kafka's rack-unaware assignReplicasToBrokers; the start index and shift are random
unless given, as Kafka's.""")
    _log_dirs(ar, write=False)
    ar.add_argument("--topic", action="append", help="a topic to assign (repeatable)")
    ar.add_argument("--topics-to-move-json-file", metavar="FILE")
    ar.add_argument("--partitions", type=int, help="a partition count instead of reading the store")
    ar.add_argument("--broker-list", required=True, metavar="ID[,ID]")
    ar.add_argument("--replication-factor", type=int, default=1)
    ar.add_argument("--start-index", type=int)
    ar.add_argument("--shift", type=int)
    ar.add_argument("--broker-id", type=int, default=0, help="this store's broker id (the current assignment)")
    ar.add_argument("--json", action="store_true", help="print only the proposed assignment")
    from kstore.tools import groups
    groups.add_parser(sub, _sub, _log_dirs)
    return ap


#: the loggers whose warnings a command prints: configuration (server.properties, topic configs)
#: and the store's topic config file (an unreadable one is ignored: its overrides are not in force)
WARNING_LOGGERS = ("kstore.config", "kstore.topics")


class _StderrHandler(logging.Handler):
    """Configuration warnings (WARNING_LOGGERS) as one stderr line each while a command runs:
    "kstore: warning: ..."; written to the sys.stderr of the moment, each distinct one once (a
    follow re-reads the topic config file every scan)."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self._said: set[str] = set()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
            if msg in self._said:
                return
            self._said.add(msg)
            sys.stderr.write(f"kstore: warning: {msg}\n")
        except Exception:  # noqa: BLE001  (logging's contract: never raise from emit)
            self.handleError(record)


def main(argv: Optional[Sequence[str]] = None) -> int:
    handler = _StderrHandler(logging.WARNING)
    loggers = [logging.getLogger(name) for name in WARNING_LOGGERS]
    for lg in loggers:
        lg.addHandler(handler)
    try:
        return _main(argv)
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def _main(argv: Optional[Sequence[str]]) -> int:
    ap = build_parser()
    args, rest = ap.parse_known_args(argv)
    usage = getattr(args, "subparser", None) or ap
    if rest and args.command != "bench":
        usage.error(f"unrecognized arguments: {' '.join(rest)}")
    if getattr(args, "broker_config", None) and not os.path.isfile(args.broker_config):
        usage.error(f"--broker-config {args.broker_config}: no such file")
    try:
        cmd = args.command
        if cmd == "dump-log":
            from kstore.tools import dump
            return dump.main(args)
        if cmd == "quickstart":
            return quickstart(args.dir)
        if cmd == "bench":
            from kstore.tools import bench
            return bench.main(rest)
        if cmd == "consumer-groups":
            from kstore.tools import groups
            try:
                return groups.main(args, sys.stdout, sys.stderr)
            except groups.UsageError as e:
                usage.error(str(e))
        if cmd is not None:
            from kstore.tools import admin
            try:
                if cmd in ("produce", "consume"):
                    from kstore.tools import console
                    return console.produce(args) if cmd == "produce" else console.consume(args)
                run = {"topics": admin.topics, "get-offsets": admin.get_offsets,
                       "log-dirs": admin.log_dirs, "delete-records": admin.delete_records,
                       "assign-replicas": admin.assign}[cmd]
                return run(args, sys.stdout)
            except admin.UsageError as e:       # options that do not make a command: exit 2
                usage.error(str(e))
        ap.print_help()
        return 2
    except kstore.KStoreError as e:
        print(f"kstore: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        try:                       # the reader went away (| head): quiet, as other tools are
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except OSError as e:
        # a path that is not what it should be, a permission, a failing disk: one line, no
        # traceback, as for kstore's own errors
        where = f"{e.filename}: " if e.filename else ""
        print(f"kstore: error: {where}{e.strerror or e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
