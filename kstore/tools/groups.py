"""`kstore consumer-groups`: Kafka's kafka-consumer-groups.sh over a store's __consumer_offsets.

--list, --describe (offsets; --members [--verbose]; --state), --delete and --reset-offsets
(--to-earliest | --to-latest | --to-datetime | --to-offset | --shift-by; --dry-run, the default,
or --execute), with the same columns, widths and messages as Kafka's ConsumerGroupCommand, or
JSON with --json. Log end offsets come from a read-only StoreReader; committed offsets and group
metadata from the GroupCoordinator (group_coordinator.py). Live members are groups15's
`live_members` where that module is present, else the members of the group's last
GroupMetadata record (GroupCoordinator.live_members is the one call site).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from typing import IO, Any, Callable, Optional

from kstore.errors import KStoreError, UnknownTopicError
from kstore.group_records import MemberMetadata, OffsetAndMetadata, parse_assignment
from kstore.topic_partition import TopicPartition
from kstore.tools.java_datetime import get_date_time

MISSING = "-"

EPILOG = """examples:
  kstore consumer-groups --log-dirs D --list
  kstore consumer-groups --log-dirs D --describe --group G [--members [--verbose] | --state]
  kstore consumer-groups --log-dirs D --delete --group G
  kstore consumer-groups --log-dirs D --reset-offsets --group G --topic T:0,1 --to-earliest --execute
  kstore consumer-groups --log-dirs D --reset-offsets --group G --all-topics --shift-by -10
Without --execute, --reset-offsets only prints the plan (--dry-run). Offsets are reset only while
the group has no live member, as Kafka requires."""


class UsageError(KStoreError):
    """Options that do not make a command (exit status 2)."""


def add_parser(sub: Any, make: Callable[..., argparse.ArgumentParser],
               log_dirs: Callable[[argparse.ArgumentParser, bool], None]) -> None:
    """The consumer-groups subcommand on cli.py's parser (make = cli._sub)."""
    g = make(sub, "consumer-groups", "list, describe, delete consumer groups and reset their "
             "offsets (kafka-consumer-groups)", EPILOG)
    log_dirs(g, True)
    act = g.add_mutually_exclusive_group()
    for name, h in (("list", "list every group"), ("describe", "describe groups"),
                    ("delete", "delete groups (no live member)"),
                    ("reset-offsets", "reset committed offsets")):
        act.add_argument(f"--{name}", action="store_true", help=h)
    g.add_argument("--group", action="append", metavar="G", help="a group (repeatable)")
    g.add_argument("--all-groups", action="store_true", help="every group")
    g.add_argument("--members", action="store_true", help="describe: members")
    g.add_argument("--verbose", action="store_true", help="describe --members: assignments")
    g.add_argument("--state", action="store_true", help="describe: group state")
    g.add_argument("--offsets", action="store_true", help="describe: offsets (the default)")
    g.add_argument("--topic", action="append", metavar="T[:P,P]", help="reset: topic (and partitions)")
    g.add_argument("--all-topics", action="store_true", help="reset: every partition with a committed offset")
    spec = g.add_mutually_exclusive_group()
    spec.add_argument("--to-earliest", action="store_true")
    spec.add_argument("--to-latest", action="store_true")
    spec.add_argument("--to-current", action="store_true")
    spec.add_argument("--to-offset", type=int, metavar="N")
    spec.add_argument("--shift-by", type=int, metavar="N")
    spec.add_argument("--to-datetime", metavar="YYYY-MM-DDTHH:mm:SS.sss")
    g.add_argument("--dry-run", action="store_true", help="reset: only print the plan (default)")
    g.add_argument("--execute", action="store_true", help="reset: commit the new offsets")
    g.add_argument("--json", action="store_true", help="JSON output")


def _log_dirs(args) -> list[str]:
    if args.log_dirs:
        return [d for d in args.log_dirs.split(",") if d]
    if getattr(args, "broker_config", None):
        from kstore.broker_config import BrokerConfig
        from kstore.properties import load_properties
        return BrokerConfig(load_properties(args.broker_config), warn=False).log_dirs
    raise UsageError("--log-dirs (or --broker-config) is required")


def main(args, out: IO[str] = sys.stdout, err: IO[str] = sys.stderr) -> int:
    """Run one consumer-groups action; the exit status."""
    from kstore.group_coordinator import GroupCoordinator
    from kstore.reader import StoreReader
    dirs = _log_dirs(args)
    with GroupCoordinator(dirs) as gc, StoreReader(dirs) as reader:
        cmd = _Command(args, gc, reader, out, err)
        if args.list:
            return cmd.list_groups()
        groups = gc.list_groups() if args.all_groups else (args.group or [])
        if not groups and not args.all_groups:
            raise UsageError("--group (or --all-groups) is required")
        if args.describe:
            return cmd.describe(groups)
        if args.delete:
            return cmd.delete(groups)
        if args.reset_offsets:
            return cmd.reset(groups)
    raise UsageError("one of --list, --describe, --delete, --reset-offsets is required")


#: Kafka's words when a reset names a topic or partition the cluster does not host (its
#: describeTopics, or the broker's OffsetCommit, fails with UNKNOWN_TOPIC_OR_PARTITION)
UNKNOWN_TOPIC_FAILURE = ("Executing consumer group command failed due to "
                         "UnknownTopicOrPartitionException: This server does not host this topic-partition.")


class _NoOffset(KStoreError):
    """A reset's partition has no start, end or timestamp offset (not hosted)."""


def _quoted(groups: list[str]) -> str:
    """Kafka's list of group names in deleteGroups' lines: each quoted, joined by ', '."""
    return ", ".join(f"'{g}'" for g in groups)


def _error(out: IO[str], msg: str) -> None:
    """Kafka's printError: on stdout, after a blank line."""
    print(f"\nError: {msg}", file=out)


class _Command:
    def __init__(self, args, gc, reader, out: IO[str], err: IO[str]):
        self.args, self.gc, self.reader, self.out, self.err = args, gc, reader, out, err

    # -- state ------------------------------------------------------------------------------
    def members(self, g: str) -> list[MemberMetadata]:
        live = self.gc.live_members(g)
        if live is not None:
            return live
        meta = self.gc.group(g)        # groups15 absent: the last generation's members
        return list(meta.members) if meta is not None else []

    def state(self, g: str) -> str:
        if self.members(g):
            return "Stable"
        if self.gc.group(g) is None and not self.gc.fetch_offsets(g):
            return "Dead"
        return "Empty"

    def should_print(self, g: str, state: str, rows: int) -> bool:
        """Kafka's shouldPrintMemberState."""
        if state == "Dead":
            _error(self.out, f"Consumer group '{g}' does not exist.")
        elif state == "Empty":
            print(f"\nConsumer group '{g}' has no active members.", file=self.err)
        return state != "Dead" and rows > 0

    def end_offset(self, tp: TopicPartition) -> Optional[int]:
        try:
            return self.reader.offsets(tp.topic, tp.partition).log_end_offset
        except (UnknownTopicError, KStoreError):
            return None

    def start_offset(self, tp: TopicPartition) -> Optional[int]:
        try:
            return self.reader.offsets(tp.topic, tp.partition).log_start_offset
        except (UnknownTopicError, KStoreError):
            return None

    # -- --list -----------------------------------------------------------------------------
    def list_groups(self) -> int:
        groups = self.gc.list_groups()
        if self.args.json:
            print(json.dumps({"groups": groups}), file=self.out)
        else:
            for g in groups:
                print(g, file=self.out)
        return 0

    # -- --describe ---------------------------------------------------------------------------
    def offset_rows(self, g: str) -> list[dict]:
        """Kafka's collectGroupsOffsets: members with partitions first (most partitions first,
        each one's partitions by number), then committed partitions no member holds."""
        committed = self.gc.fetch_offsets(g)
        rows: list[dict] = []
        assigned: set[TopicPartition] = set()
        ms = [(m, parse_assignment(m.assignment)) for m in self.members(g)]
        for m, parts in sorted((x for x in ms if x[1]), key=lambda x: -len(x[1])):
            assigned.update(parts)
            for tp in sorted(parts, key=lambda t: t.partition):
                rows.append(self.row(g, tp, committed.get(tp), m.member_id, m.client_host, m.client_id))
        rest = sorted((tp for tp in committed if tp not in assigned), key=lambda t: (t.partition, t.topic))
        for tp in rest:
            rows.append(self.row(g, tp, committed[tp], MISSING, MISSING, MISSING))
        return rows

    def row(self, g: str, tp: TopicPartition, om: Optional[OffsetAndMetadata], cid: str, host: str,
            client: str) -> dict:
        end = self.end_offset(tp)
        cur = om.offset if om is not None else None
        lag = end - cur if end is not None and cur is not None and cur != -1 else None
        return {"group": g, "topic": tp.topic, "partition": tp.partition, "current_offset": cur,
                "log_end_offset": end, "lag": lag, "consumer_id": cid, "host": host, "client_id": client}

    def describe(self, groups: list[str]) -> int:
        a = self.args
        out: list[dict] = []
        for g in sorted(set(groups)):          # Kafka's TreeMap: by group id, each once
            state = self.state(g)
            if a.members:
                self.describe_members(g, state, out)
            elif a.state:
                self.describe_state(g, state, out)
            else:
                rows = self.offset_rows(g)
                if a.json:
                    out.append({"group": g, "state": state, "offsets": rows})
                    continue
                if not self.should_print(g, state, len(rows)):
                    continue
                w = [max([15] + [len(str(r[k])) for r in rows]) for k in ("group", "topic", "consumer_id", "host")]
                fmt = (f"\n{{:<{w[0]}}} {{:<{w[1]}}} {{:<10}} {{:<15}} {{:<15}} {{:<15}} "
                       f"{{:<{w[2]}}} {{:<{w[3]}}} {{}}")
                self.out.write(fmt.format("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                                          "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"))
                for r in rows:
                    self.out.write(fmt.format(*(MISSING if r[k] is None else r[k] for k in (
                        "group", "topic", "partition", "current_offset", "log_end_offset", "lag",
                        "consumer_id", "host", "client_id"))))
                print(file=self.out)
        if a.json:
            print(json.dumps(out if len(out) != 1 else out[0]), file=self.out)
        return 0

    def describe_members(self, g: str, state: str, out: list) -> None:
        ms = self.members(g)
        rows: list[dict[str, Any]] = [{"group": g, "consumer_id": m.member_id, "group_instance_id": m.group_instance_id or "",
                 "host": m.client_host, "client_id": m.client_id,
                 "assignment": parse_assignment(m.assignment)} for m in ms]
        if self.args.json:
            out.append({"group": g, "state": state, "members": [
                {**r, "assignment": [list(tp) for tp in r["assignment"]]} for r in rows]})
            return
        if not self.should_print(g, state, len(rows)) and state == "Dead":
            return
        w = {k: max([17 if k == "group_instance_id" else 15] + [len(r[k]) for r in rows])
             for k in ("group", "consumer_id", "group_instance_id", "host", "client_id")}
        inst = any(r["group_instance_id"] for r in rows)
        cols = ["group", "consumer_id"] + (["group_instance_id"] if inst else []) + ["host", "client_id"]
        fmt = " ".join(f"{{:<{w[k]}}}" for k in cols) + " {:<15} "
        heads = {"group": "GROUP", "consumer_id": "CONSUMER-ID", "group_instance_id": "GROUP-INSTANCE-ID",
                 "host": "HOST", "client_id": "CLIENT-ID"}
        self.out.write("\n" + fmt.format(*(heads[k] for k in cols), "#PARTITIONS"))
        if self.args.verbose:
            self.out.write("ASSIGNMENT")
        print(file=self.out)
        for r in rows:
            self.out.write(fmt.format(*(r[k] for k in cols), len(r["assignment"])))
            if self.args.verbose:
                by: dict[str, list[int]] = {}
                for t, p in r["assignment"]:
                    by.setdefault(t, []).append(p)
                parts = sorted("(" + ",".join(sorted(str(p) for p in ps)) + ")" for ps in by.values())
                self.out.write(", ".join(parts) if parts else MISSING)
            print(file=self.out)

    def describe_state(self, g: str, state: str, out: list) -> None:
        meta = self.gc.group(g)
        strategy = (meta.protocol or "") if meta is not None else ""
        coordinator = f"{self.gc.log_dir_for(g)}/__consumer_offsets-{self.gc.partition_for(g)}  (0)"
        n = len(self.members(g))
        if self.args.json:
            out.append({"group": g, "coordinator": coordinator, "assignment_strategy": strategy,
                        "state": state, "members": n})
            return
        if not self.should_print(g, state, 1):
            return
        fmt = f"\n{{:<{max(25, len(coordinator))}}} {{:<25}} {{:<20}} {{:<15}} {{}}"
        self.out.write(fmt.format("GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"))
        self.out.write(fmt.format(g, coordinator, strategy, state, n))
        print(file=self.out)

    # -- --delete -------------------------------------------------------------------------------
    def delete(self, groups: list[str]) -> int:
        from kstore.group_coordinator import GroupIdNotFoundError, GroupNotEmptyError
        ok, failed = [], {}
        for g in dict.fromkeys(groups):     # Kafka's DeleteGroups request holds a set
            try:        # looks and writes under the group's lock, as Kafka's DeleteGroups
                self.gc.delete_group(g)
                ok.append(g)
            except GroupIdNotFoundError:
                failed[g] = "GroupIdNotFoundException: The group id does not exist."
            except GroupNotEmptyError:
                failed[g] = "GroupNotEmptyException: The group is not empty."
        if self.args.json:
            print(json.dumps({"deleted": ok, "failed": failed}), file=self.out)
        elif not failed:
            print(f"Deletion of requested consumer groups ({_quoted(ok)}) was successful.", file=self.out)
        else:
            _error(self.out, "Deletion of some consumer groups failed:")
            for g, why in failed.items():
                print(f"* Group '{g}' could not be deleted due to: {why}", file=self.out)
            if ok:
                print(f"\nThese consumer groups were deleted successfully: {_quoted(ok)}", file=self.out)
        return 1 if failed else 0

    # -- --reset-offsets ------------------------------------------------------------------------
    def partitions_to_reset(self, g: str) -> list[TopicPartition]:
        a = self.args
        if a.all_topics:
            return sorted(self.gc.fetch_offsets(g))
        if not a.topic:
            raise UsageError("--reset-offsets needs --topic or --all-topics")
        out = []
        for spec in a.topic:
            topic, _, parts = spec.partition(":")
            if parts:
                try:
                    out += [TopicPartition(topic, int(p)) for p in parts.split(",") if p]
                except ValueError:
                    raise UsageError(f"--topic {spec}: partitions must be numbers") from None
            else:
                out += [TopicPartition(*tp) for tp in self.reader.partitions(topic)]
                if not self.reader.partitions(topic):     # Kafka's describeTopics fails
                    raise UnknownTopicError(f"unknown topic {topic} in {self.gc.log_dirs}")
        return out

    def reset(self, groups: list[str]) -> int:
        a = self.args
        if a.dry_run and a.execute:
            raise UsageError("--dry-run and --execute are exclusive")
        groups = list(dict.fromkeys(groups))     # Kafka's describe/alter requests hold a set
        if a.execute and len(groups) > 1:
            failed = self._check_all(groups)     # a group that fails: none is written
            if failed is not None:
                return failed
        plan: dict[str, dict[TopicPartition, int]] = {}
        for g in groups:
            # --execute: what a member's join takes for this group (groups_locked: group.lock,
            # or the groups dir's flock if it has no directory yet), from the look at its
            # state to its write, as under Kafka's group lock; one group at a time, so
            # another group's first join waits at most for one group's step
            with self.gc.group_locked(g) if a.execute else contextlib.nullcontext():
                state = self.state(g)
                if state not in ("Empty", "Dead"):
                    _error(self.out, f"Assignments can only be reset if the group '{g}' is inactive, "
                                     f"but the current state is {state}.")
                    continue
                try:
                    plan[g] = {tp: self.new_offset(g, tp) for tp in self.partitions_to_reset(g)}
                except _NoOffset as e:               # Kafka's printUsageAndExit: stderr, status 1
                    print(e, file=self.err)
                    return 1
                except UnknownTopicError:            # nothing is committed for this group
                    _error(self.out, UNKNOWN_TOPIC_FAILURE)
                    return 1
                if a.execute:
                    self.gc.commit_offsets(g, {tp: OffsetAndMetadata(o) for tp, o in plan[g].items()})
        if a.json:
            print(json.dumps([{"group": g, "topic": tp.topic, "partition": tp.partition, "new_offset": o}
                              for g, offs in plan.items() for tp, o in sorted(offs.items())]), file=self.out)
        else:
            fmt = "\n{:<30} {:<30} {:<10} {:<15}"
            if plan:
                self.out.write(fmt.format("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"))
            for g, offs in plan.items():
                for tp, o in sorted(offs.items()):
                    self.out.write(fmt.format(g, tp.topic, tp.partition, o))
            print(file=self.out)
        return 0 if len(plan) == len(groups) else 1

    def _check_all(self, groups: list[str]) -> Optional[int]:
        """--execute over several groups: every inactive group's new offsets computed first,
        holding no lock and saying nothing but a failure (its status, else None), so that one
        failing group fails the command before any is written. A failure met only at the
        write's own look (a topic deleted between the two) ends the command there."""
        quiet, err = io.StringIO(), self.err
        self.err = quiet                          # clamping notes: said by the pass that writes
        try:
            for g in groups:
                if self.state(g) in ("Empty", "Dead"):
                    for tp in self.partitions_to_reset(g):
                        self.new_offset(g, tp)
        except _NoOffset as e:
            print(e, file=err)
            return 1
        except UnknownTopicError:
            _error(self.out, UNKNOWN_TOPIC_FAILURE)
            return 1
        finally:
            self.err = err
        return None

    def new_offset(self, g: str, tp: TopicPartition) -> int:
        """Kafka's prepareOffsetsToReset for one partition, clamped to [log start, log end]."""
        a = self.args
        start, end = self.start_offset(tp), self.end_offset(tp)
        if start is None or end is None:          # not hosted: Kafka's ListOffsets has no answer
            what = ("starting offset" if a.to_earliest else "ending offset" if a.to_latest
                    else "offset by timestamp" if a.to_datetime is not None else None)
            if what is not None:
                raise _NoOffset(f"Error getting {what} of topic partition: {tp}")
            if a.shift_by is not None and self.gc.fetch_offsets(g, [tp]).get(tp) is None:
                raise KStoreError(f"Cannot shift offset for partition {tp} since there is no "
                                  f"current committed offset")
            raise UnknownTopicError(f"unknown topic partition {tp} in {self.gc.log_dirs}")
        if a.to_earliest:
            return start
        if a.to_latest:
            return end
        current = self.gc.fetch_offsets(g, [tp]).get(tp)
        if a.to_current:
            return current.offset if current is not None else end
        if a.shift_by is not None:
            if current is None:
                raise KStoreError(f"Cannot shift offset for partition {tp} since there is no "
                                  f"current committed offset")
            want = current.offset + a.shift_by
        elif a.to_offset is not None:
            want = a.to_offset
        elif a.to_datetime is not None:
            ts = parse_datetime(a.to_datetime)
            log = self.reader.log(tp.topic, tp.partition, refresh=True)
            found = log.offset_for_timestamp(ts)
            return end if found is None else found
        else:
            raise UsageError("--reset-offsets needs one of --to-earliest, --to-latest, --to-current, "
                             "--to-offset, --shift-by, --to-datetime")
        if want > end:
            print(f"New offset ({want}) is higher than latest offset for topic partition {tp}. "
                  f"Value will be set to {end}", file=self.err)
            return end
        if want < start:
            print(f"New offset ({want}) is lower than earliest offset for topic partition {tp}. "
                  f"Value will be set to {start}", file=self.err)
            return start
        return want


def parse_datetime(s: str) -> int:
    """--to-datetime as Kafka reads it (Utils.getDateTime, java_datetime.py): epoch ms; UTC
    when no zone is given."""
    try:
        return get_date_time(s)
    except ValueError as e:
        raise UsageError(f"--to-datetime {s}: {e}: expected YYYY-MM-DDTHH:mm:SS.sss, optionally "
                         "with a zone (Z or +hh:mm)") from None
