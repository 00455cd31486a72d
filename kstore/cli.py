"""The `kstore` command (also `python -m kstore`). Subcommands: quickstart, bench, dump-log."""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import kstore

EPILOG = """examples:
  kstore quickstart                  build a small store in ./kstore-data and tour it
  kstore quickstart --dir /tmp/demo  the same somewhere else
  kstore bench --quick               a 100,000-record run against sqlite3 and LMDB
  kstore bench --json > bench.json   the full run, for machines
  kstore dump-log --files kstore-data/clicks-0/00000000000000000000.log --print-data-log
"""

DUMP_EPILOG = """examples:
  kstore dump-log --files 00000000000000000000.log
  kstore dump-log --files 00000000000000000000.log --deep-iteration --print-data-log
  kstore dump-log --files 00000000000000000000.index,00000000000000000000.timeindex
  kstore dump-log --files 00000000000000000000.index --index-sanity-check
exit status: 0 when every file is sound, 2 when corruption or index mismatches were found
"""


def quickstart(dir_: str, out=None) -> int:
    """Write a small partition, read it back by offset and by timestamp, and say what happened."""
    out = out or sys.stdout
    p = lambda *a: print(*a, file=out)  # noqa: E731
    part = os.path.join(dir_, "quickstart-0")
    if os.path.exists(part):
        shutil.rmtree(part)
    config = {"segment.bytes": 16 * 1024, "index.interval.bytes": 1024}
    p(f"kstore {kstore.__version__}: quickstart in {os.path.abspath(part)}")
    p(f"  config: {config} (CRC-32C via {kstore._core.crc32c_implementation()})")
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="kstore", description="Kafka's log storage, embedded.",
                                 epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--version", action="version", version=f"kstore {kstore.__version__}")
    sub = ap.add_subparsers(dest="command")
    q = sub.add_parser("quickstart", help="build a small store and tour it",
                       epilog="example: kstore quickstart --dir ./kstore-data",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    q.add_argument("--dir", default="./kstore-data", help="log dir to write (default ./kstore-data)")
    sub.add_parser("bench", help="benchmark against sqlite3 and LMDB (see kstore bench --help)",
                   add_help=False)
    d = sub.add_parser("dump-log", help="print the batches, records or index entries of segment files",
                       description="Kafka's kafka-dump-log: batch headers (CRCs verified), records, "
                                   "and index entries checked against their .log.",
                       epilog=DUMP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    d.add_argument("--files", required=True, help="comma-separated .log/.index/.timeindex files")
    d.add_argument("--print-data-log", action="store_true", help="print keys and values (implies --deep-iteration)")
    d.add_argument("--deep-iteration", action="store_true", help="print every record, not only batch headers")
    d.add_argument("--verify-index-only", action="store_true", help="check index entries against the .log; print only mismatches")
    d.add_argument("--index-sanity-check", action="store_true", help="check that the index files are well formed")
    d.add_argument("--max-bytes", type=int, default=-1, help="read at most this many bytes of each .log")
    d.add_argument("--json", action="store_true", help="one JSON object per batch or entry")
    args, rest = ap.parse_known_args(argv)
    try:
        if args.command == "dump-log":
            if rest:
                ap.error(f"unrecognized arguments: {' '.join(rest)}")
            from kstore import dump
            return dump.main(args)
        if args.command == "quickstart":
            if rest:
                ap.error(f"unrecognized arguments: {' '.join(rest)}")
            return quickstart(args.dir)
        if args.command == "bench":
            from kstore import bench
            return bench.main(rest)
        ap.print_help()
        return 2
    except kstore.KStoreError as e:
        print(f"kstore: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
