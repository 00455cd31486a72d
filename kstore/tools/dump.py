"""`kstore dump-log`: Kafka's DumpLogSegments for .log, .index and .timeindex files, with the
same fields and line shapes as kafka-dump-log, plus --json. Reads files as they are (never
writes); CRCs are verified and a malformed batch is reported with its file and byte position.
"""
from __future__ import annotations

import argparse
import json
import os
import struct
import sys

import numpy as np
from typing import IO, Any, Iterator, Optional

from kstore import _core
from kstore.compression import CODEC_NAMES
from kstore.errors import CorruptRecordError
from kstore.fileio import get_file_ops
from kstore.files import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, parse_name
from kstore.index import OFFSET_DTYPE, TIME_DTYPE
from kstore.tools.progress import Progress

_V2 = struct.Struct(">qiiBIhiqqqhii")      # the 61-byte v2 batch header


def _read(path: str, limit: int = -1) -> bytes:
    """The file's bytes (at most limit when limit > 0) through FileOps: a FIFO or a symlink
    given as a segment is refused with UnusableFileError, never waited on or followed."""
    io = get_file_ops()
    if limit <= 0:
        return io.read_file(path)
    fd = io.open(path, os.O_RDONLY)
    try:
        out, pos = [], 0
        while pos < limit:
            b = io.pread(fd, min(limit - pos, 1 << 20), pos)
            if not b:
                break
            out.append(b)
            pos += len(b)
        return b"".join(out)
    finally:
        io.close(fd)


def _base_offset_of(path: str) -> int:
    p = parse_name(os.path.basename(path), os.path.dirname(path))
    return p[0] if p else 0


def batches(data: bytes, path: str) -> Iterator[dict]:
    """Every batch's header fields, as kafka-dump-log prints them (Kafka's names)."""
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
            d.update(baseSequence=seq, lastSequence=-1 if seq < 0 else seq + last - base,
                     producerId=pid, producerEpoch=pepoch, partitionLeaderEpoch=leader_epoch,
                     isTransactional=bool(attrs & 16), isControl=bool(attrs & 32),
                     deleteHorizonMs=first_ts if attrs & 64 else None)
            valid = crc == _core.crc32c(raw[21:])
        else:
            crc = struct.unpack_from(">I", raw, 12)[0]
            valid = crc == _core.crc32(raw[16:])
        d.update(timestampType="LogAppendTime" if attrs & 8 else "CreateTime",
                 timestamp=max_ts, compresscodec=CODEC_NAMES.get(attrs & 7, str(attrs & 7)),
                 crc=crc, isvalid=valid)
        yield d
    if end < len(data) and any(data[end:]):
        raise CorruptRecordError(f"{path}: found {len(data) - end} bytes at position {end} that "
                                 f"are not a valid batch (truncated or corrupt)")


def _records(data: bytes, pos: int, size: int) -> list:
    return _core.decode_batches(data[pos:pos + size], -1, True, True)


def dump_log(path: str, out: IO, *, deep: bool, print_data: bool, max_bytes: int,
             as_json: bool, bar: Optional[Progress] = None) -> int:
    data = _read(path, max_bytes)
    bar = bar or Progress("", enabled=False)
    problems = 0
    if not as_json:
        out.write(f"Dumping {path}\nLog starting offset: {_base_offset_of(path)}\n")
    try:
        for b in batches(data, path):
            bar.update(b["size"])
            if not b["isvalid"]:
                problems += 1
            recs = []
            if deep or print_data:
                try:
                    recs = _records(data, b["position"], b["size"])
                except CorruptRecordError as e:
                    problems += 1
                    raise CorruptRecordError(f"{path}: {e} (batch at position {b['position']})") from None
            if as_json:
                b = dict(b)
                if deep or print_data:
                    b["records"] = [_record_json(r, print_data, b.get("isControl", False)) for r in recs]
                out.write(json.dumps(b) + "\n")
                continue
            out.write(_batch_line(b) + "\n")
            for r in recs:
                out.write(_record_line(r, b, print_data) + "\n")
    except CorruptRecordError as e:
        problems += 1
        if as_json:
            out.write(json.dumps({"error": str(e)}) + "\n")
        else:
            out.write(f"Found corruption: {e}\n")
    return problems


def _batch_line(b: dict) -> str:
    if b["magic"] == 2:
        horizon = f"OptionalLong[{b['deleteHorizonMs']}]" if b["deleteHorizonMs"] is not None \
            else "OptionalLong.empty"
        return (f"baseOffset: {b['baseOffset']} lastOffset: {b['lastOffset']} count: {b['count']} "
                f"baseSequence: {b['baseSequence']} lastSequence: {b['lastSequence']} "
                f"producerId: {b['producerId']} producerEpoch: {b['producerEpoch']} "
                f"partitionLeaderEpoch: {b['partitionLeaderEpoch']} "
                f"isTransactional: {str(b['isTransactional']).lower()} "
                f"isControl: {str(b['isControl']).lower()} deleteHorizonMs: {horizon} "
                f"position: {b['position']} {b['timestampType']}: {b['timestamp']} "
                f"size: {b['size']} magic: 2 compresscodec: {b['compresscodec']} "
                f"crc: {b['crc']} isvalid: {str(b['isvalid']).lower()}")
    return (f"baseOffset: {b['baseOffset']} lastOffset: {b['lastOffset']} count: {b['count']} "
            f"position: {b['position']} {b['timestampType']}: {b['timestamp']} size: {b['size']} "
            f"magic: {b['magic']} compresscodec: {b['compresscodec']} crc: {b['crc']} "
            f"isvalid: {str(b['isvalid']).lower()}")


def _text(b: Optional[bytes]) -> str:
    return "null" if b is None else b.decode("utf-8", "replace")


def _record_line(r, b: dict, print_data: bool) -> str:
    ts_type = {0: "CreateTime", 1: "LogAppendTime"}.get(r.timestamp_type, "NoTimestampType")
    line = (f"| offset: {r.offset} {ts_type}: {r.timestamp} "
            f"keySize: {-1 if r.key is None else len(r.key)} "
            f"valueSize: {-1 if r.value is None else len(r.value)}")
    if b["magic"] == 2:
        seq = b["baseSequence"]
        line += (f" sequence: {-1 if seq < 0 else seq + r.offset - b['baseOffset']} "
                 f"headerKeys: [{','.join(k for k, _v in r.headers)}]")
    if b.get("isControl"):
        line += " " + control_text(r.key, r.value)
    elif print_data:
        line += f" key: {_text(r.key)} payload: {_text(r.value)}"
    return line


CONTROL_TYPES = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER",
                 4: "SNAPSHOT_FOOTER", 5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}


def control_fields(key: Optional[bytes], value: Optional[bytes]) -> dict:
    """A control record's meaning (Kafka's ControlRecordType / EndTransactionMarker): the key is
    version int16 + type int16; a COMMIT/ABORT value is version int16 + coordinatorEpoch int32."""
    if key is None or len(key) < 4:
        return {"controlType": "UNKNOWN(-1)", "error": "control record key shorter than 4 bytes"}
    _version, type_id = struct.unpack_from(">hh", key)
    name = CONTROL_TYPES.get(type_id)
    if type_id in (0, 1):
        if value is None or len(value) < 6:
            return {"endTxnMarker": name, "error": "end transaction marker value shorter than 6 bytes"}
        return {"endTxnMarker": name, "coordinatorEpoch": struct.unpack_from(">i", value, 2)[0]}
    return {"controlType": f"{name or 'UNKNOWN'}({type_id})"}


def control_text(key: Optional[bytes], value: Optional[bytes]) -> str:
    """As kafka-dump-log prints it: "endTxnMarker: COMMIT coordinatorEpoch: 0"."""
    return " ".join(f"{k}: {v}" for k, v in control_fields(key, value).items())


def _record_json(r, print_data: bool, control: bool = False) -> dict:
    d = {"offset": r.offset, "timestamp": r.timestamp, "timestampType": r.timestamp_type,
         "keySize": -1 if r.key is None else len(r.key),
         "valueSize": -1 if r.value is None else len(r.value),
         "headerKeys": [k for k, _v in r.headers]}
    if control:
        d.update(control_fields(r.key, r.value))
    elif print_data:
        d.update(key=None if r.key is None else _text(r.key), payload=_text(r.value))
    return d


def dump_index(path: str, out: IO, *, verify_only: bool, sanity_check: bool, as_json: bool,
               log_path: Optional[str] = None) -> int:
    """Entries of a .index ("offset: O position: P") or .timeindex ("timestamp: T offset: O");
    with the segment's .log beside it, each entry is checked against the log as Kafka does."""
    time_index = path.endswith(TIME_INDEX_SUFFIX)
    dtype = TIME_DTYPE if time_index else OFFSET_DTYPE      # the on-disk entry layouts
    esize = dtype.itemsize
    base = _base_offset_of(path)
    raw = _read(path)
    arr = np.frombuffer(raw, dtype=dtype, count=len(raw) // esize)
    zero = np.logical_and.reduce([arr[name] == 0 for name in dtype.names or ()])
    zero[:1] = False                       # the first entry may be all zeros; later ones are padding
    arr = arr[:int(np.argmax(zero))] if zero.any() else arr
    if time_index:
        keys = arr["timestamp"].astype(np.int64)
        entries = list(zip(keys.tolist(), (arr["relative_offset"].astype(np.int64) + base).tolist()))
        unordered = bool((np.diff(keys) < 0).any())
    else:
        keys = arr["relative_offset"].astype(np.int64) + base
        entries = list(zip(keys.tolist(), arr["position"].astype(np.int64).tolist()))
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
        for off, pos in entries:
            head = starts.get(pos)
            if head is None:
                problems.append(f"{path}: entry offset {off} points at position {pos}, which "
                                f"is not the start of a batch in {log_path}")
            elif head["lastOffset"] != off:
                problems.append(f"{path}: entry offset {off} position {pos}: the batch there ends "
                                f"at offset {head['lastOffset']}")
    if not verify_only and not sanity_check:
        if not as_json:
            out.write(f"Dumping {path}\n")
        for a, b in entries:
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


def main(args: argparse.Namespace, out: Optional[IO[str]] = None) -> int:
    out = out or sys.stdout
    problems = 0
    paths = [p for p in args.files.split(",") if p]
    for path in paths:
        if not os.path.exists(path):
            print(f"kstore dump-log: {path}: no such file", file=sys.stderr)
            return 1
    logs = [p for p in paths if p.endswith(LOG_SUFFIX)]
    total = sum(os.path.getsize(p) for p in logs)
    if args.max_bytes > 0:
        total = sum(min(os.path.getsize(p), args.max_bytes) for p in logs)
    with Progress("dumping", total, "B") as bar:
        for path in paths:
            problems += _dump_one(path, args, out, bar)
    return 2 if problems else 0


def _dump_one(path: str, args, out: IO, bar: Progress) -> int:
    """Dump one file; returns how many problems it showed."""
    if path.endswith(LOG_SUFFIX):
        if args.verify_index_only or args.index_sanity_check:
            return 0
        return dump_log(path, out, deep=args.deep_iteration, print_data=args.print_data_log,
                        max_bytes=args.max_bytes, as_json=args.json, bar=bar)
    if path.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX)):
        return dump_index(path, out, verify_only=args.verify_index_only,
                          sanity_check=args.index_sanity_check, as_json=args.json,
                          log_path=path.rsplit(".", 1)[0] + LOG_SUFFIX)
    print(f"kstore dump-log: {path}: not a .log, .index or .timeindex file (ignored)", file=sys.stderr)
    return 0
