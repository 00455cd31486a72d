"""`kstore produce` and `kstore consume`: Kafka's console producer and consumer over a local store.

produce reads lines from stdin (optionally "key<sep>value") and appends them in producer-sized
batches; consume prints records in the shape of Kafka's DefaultMessageFormatter, from an offset,
a timestamp, the beginning or the end, and with --follow keeps tailing what the owner appends.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import sys
import threading
import time
from typing import IO, Iterator, Optional

from kstore import _core, notify
from kstore.tools.admin import UsageError, open_manager, open_reader, parse_time
from kstore.errors import (InvalidConfigError, OffsetOutOfRangeError, SegmentGoneError, UnknownTopicError,
                           WakeupError)
from kstore.leader_epoch import epoch_before
from kstore.read_skip import after_empty_read
from kstore.read_committed import TxnFilter
from kstore.tools.java_text import as_java_text
from kstore.tools.progress import Progress

READ_CHUNK = 1 << 20
SCAN_S = 1.0          # --follow without --partition: how often to look for new partitions
TS_TYPES = {0: "CreateTime", 1: "LogAppendTime"}


def _unescape(sep: str) -> bytes:
    """A separator as typed in a shell, \\t, \\n and friends allowed, as UTF-8 (Kafka's
    separator.getBytes(UTF_8)). unicode_escape reads bytes as Latin-1, so the text goes in as
    Latin-1 with other characters as \\uXXXX escapes; an argv byte that was no UTF-8 (a
    surrogateescape) comes back as that byte."""
    text = sep.encode("latin-1", "backslashreplace").decode("unicode_escape")
    return text.encode("utf-8", "surrogateescape")


# -- produce -------------------------------------------------------------------------------------
def produce(args: argparse.Namespace, stdin: Optional[IO[bytes]] = None, err: Optional[IO] = None) -> int:
    """Append stdin's lines to --topic; returns the shell exit status."""
    stdin = stdin if stdin is not None else sys.stdin.buffer
    err = err or sys.stderr
    sep = _unescape(args.key_separator) if args.key_separator is not None else None
    if args.parse_key and sep is None:
        sep = b"\t"                                  # Kafka's key.separator default
    if sep is not None and not sep:
        raise UsageError("--key-separator must not be empty")
    batch_bytes = args.batch_size
    total = _regular_file_size(stdin)
    produced = 0
    line_no = 0
    with open_manager(args) as m, Progress(f"producing to {args.topic}", total, "B") as bar:
        n_parts = m.ensure_topic(args.topic, args.partition)
        if args.partition is not None and not 0 <= args.partition < n_parts:
            raise UnknownTopicError(f"partition {args.partition} of {args.topic!r} does not exist "
                                    f"({n_parts} partitions)")
        fixed = -1 if args.partition is None else args.partition
        sticky = 0
        pending: list[bytes] = []     # read, not split yet: no line end since the last split
        while True:
            chunk = stdin.read(READ_CHUNK)
            if chunk and b"\n" not in chunk and b"\r" not in chunk:
                # inside a long line: keep the read, split once a line end comes (linear, where
                # joining and rescanning what was read at every read was quadratic)
                pending.append(chunk)
                bar.update(len(chunk))
                continue
            data = b"".join(pending + [chunk]) if pending else chunk
            # Kafka's producer sends each line decoded from UTF-8 and encoded again (java_text.py)
            data = as_java_text(data, max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
                                if chunk else len(data))
            # lines split per partition in the core: keys, murmur2, no per-line Python objects
            consumed, lines, parts, bad = _core.split_lines(data, sep, n_parts, fixed, sticky,
                                                            not chunk)
            for p, part in enumerate(parts):
                if part is not None:
                    count, key, value = part
                    m.append_columns(args.topic, p, _core.ColumnInput(count, key=key, value=value),
                                     batch_bytes=batch_bytes)
            produced += lines
            line_no += lines
            if bad != -1:
                text = bytes(data[bad[0]:bad[1]]).decode("utf-8", "replace")
                raise InvalidConfigError(
                    f"No key separator found on line number {line_no + 1}: '{text}'")
            if lines:
                sticky = (sticky + 1) % n_parts         # sticky partitioning for unkeyed lines
            pending = [data[consumed:]] if consumed < len(data) else []
            bar.update(len(chunk))
            if not chunk:
                break
    if args.verbose:
        print(f"Produced {produced} records to {args.topic}", file=err)
    return 0


def _regular_file_size(f) -> Optional[int]:
    try:
        st = os.fstat(f.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


# -- consume -------------------------------------------------------------------------------------
class Formatter:
    """Kafka's DefaultMessageFormatter: [ts][partition][offset][headers][key] value, separated by
    key.separator, one record per line."""

    def __init__(self, args):
        self.sep = _unescape(args.key_separator) if args.key_separator is not None else b"\t"
        self.line_sep = _unescape(args.line_separator)
        self.print_key = args.print_key
        self.print_ts = args.print_timestamp
        self.print_part = args.print_partition
        self.print_off = args.print_offset
        self.print_headers = args.print_headers
        self.print_value = not args.no_value
        self.simple = not (self.print_key or self.print_ts or self.print_part or self.print_off
                           or self.print_headers) and self.print_value

    def format(self, partition: int, records: list) -> bytes:
        if self.simple:
            ls = self.line_sep
            return b"".join((b"null" if r.value is None else r.value) + ls for r in records)
        return b"".join(self._one(partition, r) for r in records)

    def _one(self, partition: int, r) -> bytes:
        parts = []
        if self.print_ts:
            t = TS_TYPES.get(r.timestamp_type)
            parts.append(f"{t}:{r.timestamp}".encode() if t else b"NO_TIMESTAMP")
        if self.print_part:
            parts.append(b"Partition:%d" % partition)
        if self.print_off:
            parts.append(b"Offset:%d" % r.offset)
        if self.print_headers:
            hs = [k.encode() + b":" + (b"null" if v is None else v) for k, v in r.headers]
            parts.append(b",".join(hs) if hs else b"NO_HEADERS")
        if self.print_key:
            parts.append(b"null" if r.key is None else r.key)
        if self.print_value:
            parts.append(b"null" if r.value is None else r.value)
        return self.sep.join(parts) + self.line_sep


def consume(args: argparse.Namespace, out: Optional[IO[bytes]] = None, err: Optional[IO] = None) -> int:
    """Print records of --topic; returns the shell exit status."""
    if getattr(args, "group", None):
        return consume_group(args, out, err)
    out = out if out is not None else sys.stdout.buffer
    err = err or sys.stderr
    starts = [s for s in (args.from_beginning, args.offset is not None, args.time is not None) if s]
    if len(starts) > 1:
        raise UsageError("give at most one of --from-beginning, --offset and --time")
    if args.offset is not None and args.offset not in ("earliest", "latest") and args.partition is None:
        raise UsageError("--offset with a number needs --partition (as Kafka's console consumer)")
    fmt = Formatter(args)
    limit = args.max_messages if args.max_messages is not None and args.max_messages >= 0 else None
    timeout = args.timeout_ms / 1000 if args.timeout_ms is not None else None
    count = shown = 0              # records written; of them, flushed out
    gone = False                   # stdout's reader went away
    with open_reader(args) as store, _StopOnSignal() as stop:
        if args.topic not in store.topics():
            if not args.follow:
                raise UnknownTopicError(f"Topic '{args.topic}' does not exist in {','.join(store.log_dirs)}")
        positions: dict[int, int] = {}
        ahead: set[int] = set()     # --offset past the log end with --follow: waiting there
        # --isolation-level read_committed: each partition's transactions; and the log end a
        # partition held at its last stable offset waits past (its position is below the end)
        txns: Optional[dict[int, TxnFilter]] = {} if args.isolation_level == "read_committed" else None
        held: dict[int, int] = {}
        read_from: dict[int, tuple] = {}    # the log (and incarnation) of each position
        epochs: dict[int, int] = {}         # the leader epoch of the record before each position

        def discover(first: bool) -> None:
            for _t, p in store.partitions(args.topic):
                if p in positions or (args.partition is not None and p != args.partition):
                    continue
                lg = store.log(args.topic, p)
                positions[p] = _start_offset(lg, args, appeared=not first)
                read_from[p] = (lg, lg.incarnation)
                if positions[p] > lg.log_end_offset:
                    ahead.add(p)
                    print(f"kstore consume: {_past_end(positions[p], f'{args.topic}-{p}', lg.log_end_offset)}"
                          "; waiting for it", file=err, flush=True)
            if first and args.partition is not None and args.partition not in positions and not args.follow:
                raise UnknownTopicError(f"partition {args.partition} of {args.topic!r} does not exist")

        def recreated(p: int, lg) -> bool:
            """The partition was deleted and created again since its position was read: a new
            log, read from its start."""
            if read_from.get(p, (lg, lg.incarnation)) == (lg, lg.incarnation):
                return False
            print(f"kstore consume: {args.topic}-{p} was deleted and re-created; reading it "
                  "from its start", file=err)
            positions[p] = lg.log_start_offset
            epochs.pop(p, None)
            read_from[p] = (lg, lg.incarnation)
            ahead.discard(p)
            if txns is not None:
                txns.pop(p, None)
            return True

        def cut(p: int, lg, past_end: bool = False) -> bool:
            """KIP-320 (Log.diverging_epoch): the position was past a cut of the log, whose
            records appended again below it would be skipped: back to where its epoch ends
            (unknown: the log start or end, as --from-beginning says), as Kafka's consumer."""
            div = lg.diverging_epoch(positions[p], epochs.get(p, -1), past_end)
            if div is None:
                return False
            new = div[1] if div[0] >= 0 else \
                (lg.log_start_offset if args.from_beginning else lg.log_end_offset)
            print(f"kstore consume: truncation detected for {args.topic}-{p} at offset "
                  f"{positions[p]}; resuming at {new}", file=err)
            positions[p] = new
            epochs[p] = div[0]
            held.pop(p, None)
            if txns is not None:
                txns.pop(p, None)
            return True

        discover(first=True)
        last_data = time.monotonic()
        last_scan = last_data
        rescanned = args.follow        # the log start checkpoints were (re)read: refresh with them
        try:
            while not stop.signum:
                got = 0
                skipped = False        # passed over aborted records, markers or a gap
                for p in sorted(positions):
                    try:
                        lg = store.log(args.topic, p, refresh=rescanned)
                        if recreated(p, lg):
                            continue
                        end = lg.log_end_offset       # what the read can see
                        # the LSO before the read (as the Fetcher: never a later log's)
                        f = None if txns is None else txns.setdefault(p, TxnFilter(positions[p]))
                        lso = f.stable_offset(lg) if f is not None else 0
                        recs = lg.read(positions[p], max_bytes=READ_CHUNK)
                        if recreated(p, lg):     # found by the read's own refresh
                            continue
                        if recs and recs[0].leader_epoch > epochs.get(p, -1) >= 0 and \
                                cut(p, lg):
                            skipped = True
                            continue
                    except UnknownTopicError:
                        if not args.follow:
                            raise
                        # the topic was deleted: found again (from its start) if it comes back
                        print(f"kstore consume: {args.topic}-{p} was deleted", file=err)
                        del positions[p]
                        read_from.pop(p, None)
                        continue
                    except OffsetOutOfRangeError:
                        if recreated(p, lg):
                            continue
                        if p in ahead and positions[p] > lg.log_end_offset:
                            continue             # not there yet: the wait below is for it
                        if positions[p] > lg.log_end_offset and cut(p, lg, past_end=True):
                            skipped = True
                            continue
                        positions[p] = _resume_at(lg, positions[p], f"{args.topic}-{p}", err)
                        if txns is not None:
                            txns.pop(p, None)
                        continue
                    ahead.discard(p)
                    held.pop(p, None)
                    if f is not None and recs:
                        raw, (recs, nxt) = recs, f.committed(recs, positions[p], lso)
                        if not recs:
                            if nxt > positions[p]:
                                positions[p] = nxt     # only aborted records: read on past them
                                skipped = True
                                e = epoch_before(raw, nxt)         # (of the aborted records passed)
                                epochs[p] = epochs.get(p, -1) if e is None else e
                            else:                      # at the last stable offset: wait for a
                                held[p] = lg.log_end_offset     # marker (appended past the end)
                            continue
                    if not recs:
                        # the end, transaction markers, or nothing left at or after the position
                        # in its segment (a compacted tail): on to the next batch with records
                        nxt = after_empty_read(lg, positions[p], end)
                        skipped = skipped or nxt != positions[p]
                        positions[p] = nxt
                        continue
                    if limit is not None and count + len(recs) > limit:
                        recs = recs[:limit - count]
                    _write(out, fmt.format(p, recs))
                    count += len(recs)
                    got += len(recs)
                    positions[p] = recs[-1].offset + 1
                    epochs[p] = recs[-1].leader_epoch
                    if limit is not None and count >= limit:
                        break
                _flush(out)                # out: now they count ("Processed a total")
                shown = count
                if limit is not None and count >= limit:
                    break
                rescanned = False
                now = time.monotonic()
                if got or skipped:
                    last_data = now
                    continue
                if not args.follow:
                    break
                if timeout is not None and now - last_data >= timeout:
                    break
                # a partition given and deleted is looked for again, as every one is without it
                scanning = args.partition is None or args.partition not in positions
                if scanning and now - last_scan >= SCAN_S:
                    store.refresh()                 # new partitions (or the topic) appear
                    discover(first=False)
                    last_scan = now
                    rescanned = True
                    continue
                # a partition held at its last stable offset waits for appends past its end
                wait_at = {p: max(o, held.get(p, o)) for p, o in positions.items()}
                try:
                    with stop.waiting():
                        _wait(store, args.topic, wait_at, min(
                            SCAN_S - (now - last_scan) if scanning else notify.SLICE_S,
                            timeout - (now - last_data) if timeout is not None else notify.SLICE_S),
                            args.poll_ms / 1000)
                except _Signalled:
                    break
        except _StdoutFailed:
            gone = True
        except KeyboardInterrupt:              # not the main thread (no handlers): as a stop
            pass
        finally:
            try:
                out.flush()
            except OSError:
                gone = True
    if gone:
        _stdout_gone(out, err)
    else:
        shown = count
    _say(err, f"Processed a total of {shown} messages")
    return stop.status


def consume_group(args: argparse.Namespace, out: Optional[IO[bytes]] = None, err: Optional[IO] = None) -> int:
    """consume --group G: a kstore.Consumer in group G subscribed to --topic, printing what it
    polls and committing as it goes (auto-commit, and at the end the position after the last
    record printed). Without --follow it stops once its partitions are read to their end."""
    from kstore.consumer import Consumer
    from kstore.tools.admin import UsageError
    out = out if out is not None else sys.stdout.buffer
    err = err or sys.stderr
    if args.partition is not None or args.offset is not None or args.time is not None:
        raise UsageError("--group cannot be combined with --partition, --offset or --time "
                                 "(the group decides the partitions and starts at its committed offsets)")
    fmt = Formatter(args)
    limit = args.max_messages if args.max_messages is not None and args.max_messages >= 0 else None
    timeout = args.timeout_ms / 1000 if args.timeout_ms is not None else None
    count = 0
    gone = False                   # stdout's reader went away
    with open_reader(args) as store, _StopOnSignal() as stop, Consumer(
            store, args.topic, group_id=args.group, isolation_level=args.isolation_level,
            auto_offset_reset="earliest" if args.from_beginning else "latest") as c:
        stop.attach(c)
        if args.topic not in store.topics() and not args.follow:
            raise UnknownTopicError(f"Topic '{args.topic}' does not exist in {','.join(store.log_dirs)}")
        last_data = time.monotonic()
        unflushed: dict = {}       # partition -> first offset of records not known to be out
        try:
            while limit is None or count < limit:
                # never more than --max-messages is left: what is committed was printed
                got = c.poll(timeout_ms=notify.SLICE_S * 1000 if args.follow else 200,
                             max_records=None if limit is None else limit - count)
                for tp, recs in got.items():
                    unflushed.setdefault(tp, recs[0].offset)
                for tp, recs in got.items():
                    _write(out, fmt.format(tp.partition, recs))
                _flush(out)                    # out: now they count, and may be committed
                count += sum(len(recs) for recs in got.values())
                unflushed.clear()
                now = time.monotonic()
                if got:
                    last_data = now
                    continue
                if not args.follow:
                    ends = c.end_offsets(c.assignment())
                    if c.assignment() and all(c.position(tp) >= e for tp, e in ends.items()):
                        break
                    if not c.assignment() and now - last_data >= 1.0:
                        break
                if timeout is not None and now - last_data >= timeout:
                    break
        except (KeyboardInterrupt, WakeupError):
            pass
        except _StdoutFailed:
            # as Kafka's resetUnconsumedOffsets: close commits only what went out
            gone = True
            for tp, first in unflushed.items():
                c.seek(tp, first)
        finally:
            try:
                out.flush()
            except OSError:
                gone = True
    if gone:
        _stdout_gone(out, err)
    _say(err, f"Processed a total of {count} messages")
    return stop.status


class _Signalled(Exception):
    """A stop signal came while the plain consume waited for data."""


class _StopOnSignal:
    """SIGTERM, SIGINT and SIGHUP stop a consume as the shutdown hook of Kafka's console
    consumer does: a group consumer is woken (its poll raises WakeupError), then closed,
    committing the position after the last record printed; a plain consume leaves its wait at
    once (`waiting()`) or its loop at the next round. Then "Processed a total" is printed and
    the exit status is the JVM's, 128 + the signal's number (`status`). The handlers stay until
    the consumer's close is done (a signal during it, e.g. in its commit's wait for another
    process's flock, does not kill it before the commit), as the JVM ignores signals while the
    hook runs. Main thread only (signals); elsewhere a no-op."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

    def __init__(self) -> None:
        self._consumer = None
        self.signum = 0                 # the first stop signal, 0 if none came
        self._waiting = False
        self._old: dict = {}

    def _handle(self, signum: int, _frame: object) -> None:
        self.signum = self.signum or signum
        if self._consumer is not None:
            self._consumer.wakeup()
        if self._waiting:
            self._waiting = False
            raise _Signalled()

    @property
    def status(self) -> int:
        """The exit status: 0, or 128 + the signal's number (Kafka's JVM: 143 after SIGTERM)."""
        return 128 + self.signum if self.signum else 0

    def attach(self, c) -> None:
        """The consumer to wake; woken at once if a signal came while it was being made."""
        self._consumer = c
        if self.signum:
            c.wakeup()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """A wait a signal ends at once (raising _Signalled); nothing is printed inside it."""
        if self.signum:
            raise _Signalled()
        self._waiting = True
        try:
            yield
        finally:
            self._waiting = False

    def __enter__(self) -> "_StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            self._old = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


class _StdoutFailed(Exception):
    """A write or flush of stdout failed: its reader went away (| head), a full disk, a
    terminal gone (EIO). Any of them is Kafka's PrintStream.checkError(): the consume ends."""


def _write(out: IO[bytes], data: bytes) -> None:
    """All of data, as Kafka's PrintStream writes it: a signal (a stop) interrupting a write
    blocked on a full pipe makes BufferedWriter.write return the short count it wrote."""
    view = memoryview(data)
    try:
        while view:
            n = out.write(view)
            view = view[n if n is not None else 0:]
    except OSError as e:
        raise _StdoutFailed(e) from e


def _flush(out: IO[bytes]) -> None:
    try:
        out.flush()
    except OSError as e:
        raise _StdoutFailed(e) from e


def _stdout_gone(out: IO[bytes], err: IO) -> None:
    """stdout failed (_StdoutFailed): say so as Kafka's console consumer does, and point fd 1
    at /dev/null so the interpreter's last flush of what is buffered is quiet."""
    _say(err, "Unable to write to standard out, closing consumer.")
    if out is sys.stdout.buffer:
        _to_devnull(sys.stdout)


def _say(err: IO, line: str) -> None:
    """A last line on stderr, which may be gone too (a terminal closed: EIO): then dropped, as
    Kafka's System.err drops it, and fd 2 pointed at /dev/null so the exit status stays ours."""
    try:
        print(line, file=err, flush=True)
    except OSError:
        if err is sys.stderr:
            _to_devnull(sys.stderr)


def _to_devnull(stream: IO) -> None:
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, stream.fileno())
        os.close(fd)
    except (OSError, ValueError):
        pass


def _wait(store, topic: str, positions: dict[int, int], timeout: float, poll_s: float) -> None:
    """Until a followed partition has records past its position, or timeout: one futex_waitv
    over their notification words (notify.wait_any; a poll when there are none to wait on). A
    partition deleted meanwhile ends the wait: the read that follows reports it."""
    if not positions:
        time.sleep(max(0.0, min(timeout, poll_s)))
        return
    parts = sorted(positions)
    try:
        notify.wait_any([store.log(topic, p) for p in parts], [positions[p] for p in parts],
                        max(0.0, timeout))
    except (UnknownTopicError, SegmentGoneError):
        pass


def _resume_at(lg, pos: int, name: str, err) -> int:
    """Where to go on after OffsetOutOfRangeError: the log start if pos is gone (retention,
    compaction), the log end if the log was truncated below pos (as Kafka's consumer resets)."""
    if pos > lg.log_end_offset:
        print(f"kstore consume: offset {pos} of {name} is past the log end {lg.log_end_offset} "
              f"(truncated); resuming there", file=err)
        return lg.log_end_offset
    print(f"kstore consume: offset {pos} of {name} is gone (retention); resuming at the log "
          f"start {lg.log_start_offset}", file=err)
    return lg.log_start_offset


def _past_end(pos: int, name: str, end: int) -> str:
    return f"offset {pos} of {name} is past the log end {end} (OffsetOutOfRange)"


def _start_offset(lg, args, appeared: bool) -> int:
    """Where to start reading a partition: a partition that appears while following starts at
    its beginning (nothing in it was seen yet)."""
    if appeared:
        return lg.log_start_offset
    if args.from_beginning or args.offset == "earliest":
        return lg.log_start_offset
    if args.offset is not None and args.offset != "latest":
        try:
            off = int(args.offset)
        except ValueError:
            raise UsageError(f"--offset {args.offset!r}: expected earliest, latest or a number") from None
        if off < 0:
            raise UsageError(f"--offset {off}: must not be negative")
        if off > lg.log_end_offset and not args.follow:
            # Kafka's fetch answers OFFSET_OUT_OF_RANGE; without --follow there is nothing to
            # wait for (with it, the caller waits there)
            raise OffsetOutOfRangeError(_past_end(off, f"{args.topic}-{args.partition}", lg.log_end_offset))
        return max(off, lg.log_start_offset)
    if args.time is not None:
        ts = parse_time(args.time)
        off = lg.offset_for_timestamp(ts)
        return lg.log_end_offset if off is None else off
    return lg.log_end_offset
