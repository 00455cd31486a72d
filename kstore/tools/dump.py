"""`kstore dump-log`: Kafka's DumpLogSegments for .log, .index, .timeindex and KRaft .checkpoint
files, line for line as kafka-dump-log prints them (core/src/main/scala/kafka/tools/
DumpLogSegments.scala, Kafka 3.x/4.x; the line shapes are in tests/data/dump/ with the source
line of each), plus --json. Reads files as they are (never writes). A header that is not a
batch stops the dump with Kafka's "Found N invalid bytes at the end of NAME" and, on stderr,
the file, the byte position and what is wrong; a zero-filled tail (the active segment's runway)
is not corruption, and with --max-bytes a batch cut by the limit is not either.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys
from typing import IO, Any, Iterator, Optional

import numpy as np

from kstore import _core
from kstore.compression import CODEC_NAMES, decompress
from kstore.errors import CorruptRecordError, KStoreError
from kstore.fileio import get_file_ops
from kstore.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX, parse_name
from kstore.index import OFFSET_DTYPE, TIME_DTYPE
from kstore.log_tail import stop_reason
from kstore.tools.control_records import control_fields, control_text
from kstore.tools.progress import Progress

SNAPSHOT_SUFFIX = ".checkpoint"            # KRaft snapshots (Snapshots.SUFFIX)
BOOTSTRAP_SNAPSHOT = "bootstrap.checkpoint"
_V2 = struct.Struct(">qiiBIhiqqqhii")      # the 61-byte v2 batch header
_LEGACY = struct.Struct(">qiIbb")          # offset, size, crc, magic, attributes
INT_MAX = (1 << 31) - 1
NO_SEQUENCE = -1
TIMESTAMP_TYPES = {-1: "NoTimestampType", 0: "CreateTime", 1: "LogAppendTime"}


#: reads of a file that shrank under them before the dump takes the last one
READ_TRIES = 10


def _read(path: str, limit: int = -1) -> bytes:
    """The file's bytes (at most limit when limit > 0) through FileOps: a FIFO or a symlink
    given as a segment is refused with UnusableFileError, never waited on or followed. A read
    past the file's size then is read again (READ_TRIES in all): the live writer trimmed the
    active segment's index at a roll under it, and the copy is torn (a size that is no multiple
    of the entry size, zeroed entries). A file that grew (appends) was read to a valid point."""
    io = get_file_ops()
    fd = io.open(path, os.O_RDONLY)
    try:
        for _ in range(READ_TRIES):
            out, pos = [], 0
            while limit <= 0 or pos < limit:
                b = io.pread(fd, 1 << 20 if limit <= 0 else min(limit - pos, 1 << 20), pos)
                if not b:
                    break
                out.append(b)
                pos += len(b)
            if pos <= io.size(fd):
                break
        return b"".join(out)
    finally:
        io.close(fd)


def _base_offset_of(path: str) -> int:
    p = parse_name(os.path.basename(path), os.path.dirname(path))
    return p[0] if p else 0


def increment_sequence(seq: int, delta: int) -> int:
    """DefaultRecordBatch.incrementSequence: sequences wrap past Integer.MAX_VALUE to 0."""
    if seq > INT_MAX - delta:
        return delta - (INT_MAX - seq) - 1
    return seq + delta


def batches(data: bytes, path: str) -> Iterator[dict]:
    """Every batch's header fields, as kafka-dump-log prints them (Kafka's names). Raises
    CorruptRecordError (with path and position) when non-zero bytes follow the last batch."""
    m = _core.Mapping.from_bytes(data)
    heads = _core.batch_headers(m, 0, len(data))
    end = heads[-1][0] + heads[-1][3] if heads else 0
    for pos, base, last, size, magic, attrs, max_ts, count in heads:
        raw = data[pos:pos + size]
        d: dict[str, Any] = {"baseOffset": base, "lastOffset": last, "count": count, "position": pos,
                             "size": size, "magic": magic}
        if magic == 2:
            (_b, _l, leader_epoch, _m, crc, _a, _lod, first_ts, _mts, pid, pepoch, seq,
             _n) = _V2.unpack_from(raw)
            d.update(baseSequence=seq,
                     lastSequence=NO_SEQUENCE if seq == NO_SEQUENCE else increment_sequence(seq, last - base),
                     producerId=pid, producerEpoch=pepoch, partitionLeaderEpoch=leader_epoch,
                     isTransactional=bool(attrs & 16), isControl=bool(attrs & 32),
                     deleteHorizonMs=first_ts if attrs & 64 else None)
            valid = crc == _core.crc32c(raw[21:])
            ts_type = 1 if attrs & 8 else 0
        else:
            crc = struct.unpack_from(">I", raw, 12)[0]
            valid = crc == _core.crc32(raw[16:])
            ts_type = -1 if magic == 0 else (1 if attrs & 8 else 0)
        d.update(timestampType=TIMESTAMP_TYPES[ts_type], timestamp=max_ts,
                 compresscodec=CODEC_NAMES.get(attrs & 7, str(attrs & 7)), crc=crc, isvalid=valid)
        yield d
    why = stop_reason(data, end)
    if why is not None:
        e = CorruptRecordError(f"found {len(data) - end} bytes that are not a valid batch: {why[0]}")
        e.path, e.position = path, end
        raise e


# -- records -------------------------------------------------------------------------------------
class _Entry:
    """One record as DumpLogSegments sees it (Record / AbstractLegacyRecordBatch)."""
    __slots__ = ("offset", "timestamp", "key", "value", "header_keys", "crc", "valid")

    def __init__(self, offset: int, timestamp: int, key: Optional[bytes], value: Optional[bytes],
                 header_keys: list, crc: Optional[int] = None, valid: bool = True) -> None:
        self.offset, self.timestamp, self.key, self.value = offset, timestamp, key, value
        self.header_keys, self.crc, self.valid = header_keys, crc, valid


def _legacy_messages(data: bytes, what: str) -> list[tuple[int, int, int, int, Optional[bytes], Optional[bytes], int, bool]]:
    """(offset, magic, attributes, timestamp, key, value, crc, valid) of each legacy message in
    `data` (a v0/v1 message set); a message cut short by the end ends the set, as Kafka's
    DataLogInputStream does; a malformed one raises CorruptRecordError."""
    out = []
    pos = 0
    while len(data) - pos >= 12:
        offset, size = struct.unpack_from(">qi", data, pos)
        if size < 14:
            raise CorruptRecordError(f"{what}: message at byte {pos} has size {size}, below the "
                                     f"minimum record overhead (14)")
        if pos + 12 + size > len(data):
            break
        _o, _s, crc, magic, attrs = _LEGACY.unpack_from(data, pos)
        body = data[pos + 16:pos + 12 + size]
        q = pos + 18
        ts = -1
        if magic == 1:
            if size < 22:
                raise CorruptRecordError(f"{what}: v1 message at byte {pos} is shorter than 22 bytes")
            ts = struct.unpack_from(">q", data, q)[0]
            q += 8
        elif magic != 0:
            raise CorruptRecordError(f"{what}: message at byte {pos} has magic {magic}")
        end = pos + 12 + size
        fields = []
        for _ in range(2):
            if q + 4 > end:
                raise CorruptRecordError(f"{what}: message at byte {pos}: key/value lengths run past its end")
            n = struct.unpack_from(">i", data, q)[0]
            q += 4
            if n < -1 or q + max(n, 0) > end:
                raise CorruptRecordError(f"{what}: message at byte {pos}: length {n} does not fit its size")
            fields.append(None if n < 0 else data[q:q + n])
            q += max(n, 0)
        out.append((offset, magic, attrs & 0xFF, ts, fields[0], fields[1], crc, crc == _core.crc32(body)))
        pos = end
    return out


def _legacy_entries(data: bytes, b: dict, what: str) -> list[_Entry]:
    """The records of one v0/v1 entry: itself when uncompressed; else its inner messages with
    Kafka's offsets (AbstractLegacyRecordBatch.DeepRecordsIterator: v1 inner offsets are
    relative to the wrapper's, v0 ones absolute; a v1 LogAppendTime wrapper's timestamp wins)."""
    raw = data[b["position"]:b["position"] + b["size"]]
    (off, magic, attrs, ts, key, value, crc, valid), = _legacy_messages(raw, what)
    codec = attrs & 7
    if codec == 0:
        return [_Entry(off, ts, key, value, [], crc, valid)]
    if value is None:
        raise CorruptRecordError(f"{what}: Found invalid compressed record set with null value (magic = {magic})")
    try:
        payload = decompress(codec, value, magic)
    except KStoreError:
        raise                               # a codec this installation lacks
    except Exception as e:  # noqa: BLE001  (zlib.error, cramjam's errors: hostile bytes)
        raise CorruptRecordError(f"{what}: the {CODEC_NAMES.get(codec, codec)} payload does not "
                                 f"decompress: {e}") from None
    inner = _legacy_messages(payload, what)
    if not inner:
        raise CorruptRecordError(f"{what}: Found invalid compressed record set with no inner records")
    base = -1
    if magic == 1:
        base = 0 if off == 0 else off - inner[-1][0]
        if off != 0 and base < 0:
            raise CorruptRecordError(f"{what}: wrapper offset {off} is less than the last inner "
                                     f"message offset {inner[-1][0]}")
    lat = magic == 1 and attrs & 8
    return [_Entry(o if base < 0 else base + o, -1 if m == 0 else (ts if lat else t), k, v, [], c, ok)
            for o, m, _a, t, k, v, c, ok in inner]


def _v2_entries(data: bytes, b: dict) -> list[_Entry]:
    recs = _core.decode_batches(data[b["position"]:b["position"] + b["size"]], -1, False, True)
    lat = b["timestampType"] == "LogAppendTime"
    return [_Entry(r.offset, b["timestamp"] if lat else r.timestamp, r.key, r.value,
                   [k for k, _v in r.headers]) for r in recs]


def entries(data: bytes, b: dict, path: str) -> list[_Entry]:
    """The records of batch `b` of `data`, as Kafka's deep iteration yields them (CRCs are not
    checked here: the batch line says isvalid). Raises CorruptRecordError naming file and
    position when the records do not parse."""
    what = f"{path}: batch at position {b['position']}"
    try:
        return _legacy_entries(data, b, what) if b["magic"] < 2 else _v2_entries(data, b)
    except CorruptRecordError as e:
        if e.path is None:
            e.path, e.position = path, b["position"]
        raise


# -- text ------------------------------------------------------------------------------------
def batch_line(b: dict) -> str:
    """DumpLogSegments.printBatchLevel."""
    if b["magic"] >= 2:
        horizon = f"OptionalLong[{b['deleteHorizonMs']}]" if b["deleteHorizonMs"] is not None \
            else "OptionalLong.empty"
        head = (f"baseOffset: {b['baseOffset']} lastOffset: {b['lastOffset']} count: {b['count']} "
                f"baseSequence: {b['baseSequence']} lastSequence: {b['lastSequence']} "
                f"producerId: {b['producerId']} producerEpoch: {b['producerEpoch']} "
                f"partitionLeaderEpoch: {b['partitionLeaderEpoch']} "
                f"isTransactional: {str(b['isTransactional']).lower()} "
                f"isControl: {str(b['isControl']).lower()} deleteHorizonMs: {horizon}")
    else:
        head = f"offset: {b['lastOffset']}"
    return (f"{head} position: {b['position']} {b['timestampType']}: {b['timestamp']} "
            f"size: {b['size']} magic: {b['magic']} compresscodec: {b['compresscodec']} "
            f"crc: {b['crc']} isvalid: {str(b['isvalid']).lower()}")


def _text(v: bytes) -> str:
    return v.decode("utf-8", "replace")        # StringDecoder: new String(bytes, UTF_8)


def record_line(r: _Entry, b: dict, print_data: bool, skip_metadata: bool = False) -> str:
    """One record's line (DumpLogSegments.dumpLog's deep iteration). A null key prints no
    key field and a null value no payload field; a legacy record carries `isValid` and its
    CRC (with the closing brace Kafka's format string prints); a control record its meaning.
    --skip-record-metadata leaves only "| key: K payload: V" (Kafka's prefix rules)."""
    line, prefix = "", "| "
    if not skip_metadata:
        line = (f"| offset: {r.offset} {b['timestampType']}: {r.timestamp} "
                f"keySize: {-1 if r.key is None else len(r.key)} "
                f"valueSize: {-1 if r.value is None else len(r.value)}")
        prefix = " "
        if b["magic"] >= 2:
            seq = b["baseSequence"]
            seq = NO_SEQUENCE if seq < 0 else increment_sequence(seq, r.offset - b["baseOffset"])
            line += f" sequence: {seq} headerKeys: [{','.join(r.header_keys)}]"
        else:
            line += f" isValid: {str(r.valid).lower()} crc: {r.crc}}}"
        if b.get("isControl"):
            line += " " + control_text(r.key, r.value)
    if print_data and not b.get("isControl"):
        if r.key is not None:
            line += f"{prefix}key: {_text(r.key)}"
        if r.value is not None:
            line += f" payload: {_text(r.value)}"     # Kafka's own spacing, also without metadata
    return line


def _record_json(r: _Entry, b: dict, print_data: bool) -> dict:
    d: dict[str, Any] = {"offset": r.offset, "timestamp": r.timestamp,
                         "keySize": -1 if r.key is None else len(r.key),
                         "valueSize": -1 if r.value is None else len(r.value)}
    if b["magic"] >= 2:
        d["headerKeys"] = r.header_keys
    else:
        d.update(isValid=r.valid, crc=r.crc)
    if b.get("isControl"):
        d.update(control_fields(r.key, r.value))
    elif print_data:
        if r.key is not None:
            d["key"] = _text(r.key)
        if r.value is not None:
            d["payload"] = _text(r.value)
    return d


# -- .log / .checkpoint ------------------------------------------------------------------------
def _header_line(path: str) -> str:
    name = os.path.basename(path)
    if name.endswith(SNAPSHOT_SUFFIX):
        if name == BOOTSTRAP_SNAPSHOT:
            return "KRaft bootstrap snapshot"
        stem = name[:-len(SNAPSHOT_SUFFIX)]
        offset, _, epoch = stem.partition("-")
        if offset.isdigit() and epoch.isdigit():
            return f"Snapshot end offset: {int(offset)}, epoch: {int(epoch)}"
        return f"Snapshot end offset: ?, epoch: ? ({name} is not <offset>-<epoch>.checkpoint)"
    return f"Log starting offset: {_base_offset_of(path)}"


def dump_log(path: str, out: IO, *, deep: bool, print_data: bool, max_bytes: int,
             as_json: bool, bar: Optional[Progress] = None, err: Optional[IO] = None,
             skip_metadata: bool = False) -> int:
    """Dump one .log (or KRaft .checkpoint); returns how many problems it found (corrupt
    batches or records, trailing bytes that are not a batch)."""
    err = err or sys.stderr
    data = _read(path, max_bytes)
    bar = bar or Progress("", enabled=False)
    problems = 0
    last = -1
    gaps: list[tuple[int, int]] = []
    if not as_json:
        out.write(f"{_header_line(path)}\n")
    it = batches(data, path)
    while True:
        try:
            b = next(it)
        except StopIteration:
            break
        except CorruptRecordError as e:
            pos = e.position or 0
            why = stop_reason(data, pos)
            if max_bytes > 0 and len(data) >= max_bytes and why is not None and why[1]:
                break                    # --max-bytes stops where it stops (Kafka's slice)
            problems += 1
            n = len(data) - pos
            if as_json:
                out.write(json.dumps({"error": str(e), "position": pos, "invalidBytes": n}) + "\n")
            else:
                out.write(f"Found {n} invalid bytes at the end of {os.path.basename(path)}\n")
                err.write(f"kstore dump-log: {e}\n")
            break
        bar.update(b["size"])
        if not b["isvalid"]:
            problems += 1
        recs: list[_Entry] = []
        errors: list[str] = []
        if deep or print_data:
            try:
                recs = entries(data, b, path)
            except KStoreError as e:
                errors.append(str(e) if isinstance(e, CorruptRecordError)
                              else f"{path}: batch at position {b['position']}: {e}")
        for r in recs:
            if last != -1 and r.offset != last + 1:
                gaps.append((last, r.offset))
            last = r.offset
        if as_json:
            row = dict(b)
            if deep or print_data:
                row["records"] = [_guarded(_record_json, r, b, path, errors, print_data) for r in recs]
            if errors:
                row["errors"] = errors
            out.write(json.dumps(row) + "\n")
        else:
            out.write(batch_line(b) + "\n")
            out.write("".join(_guarded(record_line, r, b, path, errors, print_data, skip_metadata)
                              + "\n" for r in recs))
        problems += len(errors)
        err.write("".join(f"kstore dump-log: {e}\n" for e in errors))
    if gaps and not as_json:
        err.write(f"Non-consecutive offsets in {os.path.abspath(path)}\n")
        err.write("".join(f"  {a} is followed by {c}\n" for a, c in reversed(gaps)))
    return problems


def _guarded(fmt, r: _Entry, b: dict, path: str, errors: list[str], *args):
    """fmt(r, b, *args); a control record whose key or value does not parse is shown as a
    plain record (its meaning unknown) and reported in `errors` with file and offset."""
    try:
        return fmt(r, b, *args)
    except CorruptRecordError as e:
        errors.append(f"{path}: control record at offset {r.offset} (batch at position "
                      f"{b['position']}): {e}")
        return fmt(r, dict(b, isControl=False), False, *args[1:])


# -- .index / .timeindex -----------------------------------------------------------------------
def dump_index(path: str, out: IO, *, verify_only: bool, sanity_check: bool, as_json: bool,
               log_path: Optional[str] = None) -> int:
    """Entries of a .index ("offset: O position: P") or .timeindex ("timestamp: T offset: O");
    with the segment's .log beside it, each entry is checked against the log as Kafka does.
    A .index without a whole entry prints "<path> is empty." (DumpLogSegments.dumpIndex)."""
    time_index = path.endswith(TIME_INDEX_SUFFIX)
    dtype = TIME_DTYPE if time_index else OFFSET_DTYPE      # the on-disk entry layouts
    esize = dtype.itemsize
    base = _base_offset_of(path)
    raw = _read(path)
    if not time_index and len(raw) < esize:
        out.write((json.dumps({"file": path, "entries": 0}) if as_json else f"{path} is empty.") + "\n")
        return 0
    arr = np.frombuffer(raw, dtype=dtype, count=len(raw) // esize)
    # a sparse file after a crash: the first later entry at the base offset ends the entries
    stop = np.flatnonzero(arr["relative_offset"][1:] == 0)
    arr = arr[:int(stop[0]) + 1] if stop.size else arr
    if time_index:
        keys = arr["timestamp"].astype(np.int64)
        entries_ = list(zip(keys.tolist(), (arr["relative_offset"].astype(np.int64) + base).tolist()))
        unordered = bool((np.diff(keys) < 0).any())
    else:
        keys = arr["relative_offset"].astype(np.int64) + base
        entries_ = list(zip(keys.tolist(), arr["position"].astype(np.int64).tolist()))
        unordered = bool((np.diff(keys) <= 0).any())
    problems = []
    if unordered:
        problems.append(f"{path}: entries are not increasing")
    if len(raw) % esize:
        problems.append(f"{path}: size {len(raw)} is not a multiple of the entry size {esize}")
    if log_path and os.path.exists(log_path) and not time_index:
        log_data = _read(log_path)
        starts = {}
        try:
            for h in batches(log_data, log_path):
                starts[h["position"]] = h
        except CorruptRecordError as e:
            problems.append(str(e))          # entries past the corruption show as mismatches
        for off, pos in entries_:
            head = starts.get(pos)
            if head is None:
                problems.append(f"{path}: entry offset {off} points at position {pos}, which "
                                f"is not the start of a batch in {log_path}")
            elif head["lastOffset"] != off:
                problems.append(f"{path}: entry offset {off} position {pos}: the batch there ends "
                                f"at offset {head['lastOffset']}")
    if not verify_only and not sanity_check:
        for a, b in entries_:
            if as_json:
                out.write(json.dumps({"timestamp": a, "offset": b} if time_index
                                     else {"offset": a, "position": b}) + "\n")
            elif time_index:
                out.write(f"timestamp: {a} offset: {b}\n")
            else:
                out.write(f"offset: {a} position: {b}\n")
    if sanity_check and not problems:
        out.write(f"{path} passed sanity check.\n")
    for p in problems:
        out.write((json.dumps({"error": p}) if as_json else f"Mismatches in :{p}") + "\n")
    return len(problems)


def dump_txn_index(path: str, out: IO, err: IO, as_json: bool) -> int:
    """A .txnindex's aborted transactions as DumpLogSegments.dumpTxnIndex prints them:
    34-byte AbortedTxn entries (version int16 -- printed, as Kafka's version() reads it, as the
    entry's first byte --, producerId, firstOffset, lastOffset, lastStableOffset as int64s)."""
    raw = _read(path)
    problems = 0
    for pos in range(0, len(raw) - len(raw) % 34, 34):
        version = struct.unpack_from(">b", raw, pos)[0]
        if version > 0:
            err.write(f"kstore dump-log: {path}: position {pos}: unexpected aborted transaction "
                      f"version {version} (current version is 0)\n")
            return problems + 1
        pid, first, last, lso = struct.unpack_from(">qqqq", raw, pos + 2)
        if as_json:
            out.write(json.dumps({"version": version, "producerId": pid, "firstOffset": first,
                                  "lastOffset": last, "lastStableOffset": lso}) + "\n")
        else:
            out.write(f"version: {version} producerId: {pid} firstOffset: {first} "
                      f"lastOffset: {last} lastStableOffset: {lso}\n")
    if len(raw) % 34:
        problems += 1
        err.write(f"kstore dump-log: {path}: position {len(raw) - len(raw) % 34}: "
                  f"{len(raw) % 34} bytes, not a whole 34-byte aborted transaction entry\n")
    return problems


def main(args: argparse.Namespace, out: Optional[IO[str]] = None, err: Optional[IO[str]] = None) -> int:
    """kstore dump-log: 0 when every file is sound, 2 when something is corrupt, 1 when a
    file is missing."""
    out = out or sys.stdout
    err = err or sys.stderr
    problems = 0
    paths = [p for p in args.files.split(",") if p]
    for path in paths:
        if not os.path.exists(path):
            print(f"kstore dump-log: {path}: no such file", file=err)
            return 1
    logs = [p for p in paths if p.endswith((LOG_SUFFIX, SNAPSHOT_SUFFIX))]
    total = sum(os.path.getsize(p) for p in logs)
    if args.max_bytes > 0:
        total = sum(min(os.path.getsize(p), args.max_bytes) for p in logs)
    with Progress("dumping", total, "B") as bar:
        for path in paths:
            problems += _dump_one(path, args, out, err, bar)
    return 2 if problems else 0


def _dump_one(path: str, args, out: IO, err: IO, bar: Progress) -> int:
    """Dump one file as DumpLogSegments.main does: "Dumping <path>", then by suffix (a .log
    is dumped whatever the index options say); returns how many problems it showed."""
    if not args.json:
        out.write(f"Dumping {path}\n")
    if path.endswith((LOG_SUFFIX, SNAPSHOT_SUFFIX)):
        return dump_log(path, out, deep=args.deep_iteration, print_data=args.print_data_log,
                        max_bytes=args.max_bytes, as_json=args.json, bar=bar, err=err,
                        skip_metadata=getattr(args, "skip_record_metadata", False))
    if path.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX)):
        return dump_index(path, out, verify_only=args.verify_index_only,
                          sanity_check=args.index_sanity_check, as_json=args.json,
                          log_path=path.rsplit(".", 1)[0] + LOG_SUFFIX)
    if path.endswith(TXN_INDEX_SUFFIX):
        return dump_txn_index(path, out, err, args.json)
    print(f"Ignoring unknown file {path}", file=err)
    return 0
