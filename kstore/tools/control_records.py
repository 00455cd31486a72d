"""Control records as kafka-dump-log prints them: transaction markers and KRaft's quorum records.

A control record's key is `int16 version, int16 type` (Kafka's ControlRecordType: 0 ABORT,
1 COMMIT, 2 LEADER_CHANGE, 3 SNAPSHOT_HEADER, 4 SNAPSHOT_FOOTER, 5 KRAFT_VERSION, 6 KRAFT_VOTERS).
A COMMIT/ABORT value is `int16 version, int32 coordinatorEpoch` (EndTransactionMarker); the KRaft
values are Kafka protocol messages (LeaderChangeMessage, SnapshotHeaderRecord, ...) in their
flexible encoding, read at version 0 as Kafka's ControlRecordUtils reads them, and printed as
their generated JsonConverter writes them (Jackson's compact JSON, fields in schema order,
camelCase names, tagged fields left out). The text forms are DumpLogSegments' (core/src/main/
scala/kafka/tools/DumpLogSegments.scala); LEADER_CHANGE's `LeaderChange: {json}` is later trunk's
printControlRecord (Kafka 3.x, e.g. 3.9.0, printed `controlType: LEADER_CHANGE(2)`).

Values come from disk: every length is checked and a malformed value raises CorruptRecordError,
never IndexError or struct.error.
"""
from __future__ import annotations

import base64
import json
import struct
from typing import Any, Callable, Optional

from kstore.errors import CorruptRecordError

CONTROL_TYPES = {0: "ABORT", 1: "COMMIT", 2: "LEADER_CHANGE", 3: "SNAPSHOT_HEADER",
                 4: "SNAPSHOT_FOOTER", 5: "KRAFT_VERSION", 6: "KRAFT_VOTERS"}


class _Reader:
    """Kafka's protocol primitives over one value (ByteBufferAccessor): big-endian ints,
    unsigned varints, compact strings and arrays, UUIDs, tagged-field sections."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.pos, self.what = data, 0, what

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise CorruptRecordError(f"{self.what}: value ends at byte {len(self.data)}, "
                                     f"{n} more bytes needed at byte {self.pos}")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def _fixed(self, fmt: str) -> int:
        s = struct.Struct(fmt)
        return int(s.unpack(self._take(s.size))[0])

    def int16(self) -> int:
        return self._fixed(">h")

    def uint16(self) -> int:
        return self._fixed(">H")

    def int32(self) -> int:
        return self._fixed(">i")

    def int64(self) -> int:
        return self._fixed(">q")

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            b = self._take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise CorruptRecordError(f"{self.what}: varint longer than 5 bytes at byte {self.pos}")

    def uuid(self) -> str:
        """As org.apache.kafka.common.Uuid.toString: URL-safe base64 without padding."""
        return base64.urlsafe_b64encode(self._take(16)).rstrip(b"=").decode("ascii")

    def string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise CorruptRecordError(f"{self.what}: null string in a non-nullable field at byte {self.pos}")
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptRecordError(f"{self.what}: string is not UTF-8 at byte {self.pos}") from None

    def array(self, item: Callable[[], dict]) -> list:
        n = self.uvarint() - 1
        if n < 0:
            raise CorruptRecordError(f"{self.what}: null array in a non-nullable field at byte {self.pos}")
        if n > len(self.data) - self.pos:      # every element takes at least one byte
            raise CorruptRecordError(f"{self.what}: array of {n} elements in {len(self.data) - self.pos} bytes")
        return [item() for _ in range(n)]

    def tagged_fields(self) -> None:
        """Skip a tagged-field section (the JSON converters do not print unknown tags)."""
        for _ in range(self.uvarint()):
            self.uvarint()
            self._take(self.uvarint())


def _voter_v0(r: _Reader) -> dict:
    d = {"voterId": r.int32()}
    r.tagged_fields()
    return d


def _leader_change(r: _Reader) -> dict:
    d = {"version": r.int16(), "leaderId": r.int32(), "voters": r.array(lambda: _voter_v0(r)),
         "grantingVoters": r.array(lambda: _voter_v0(r))}
    r.tagged_fields()
    return d


def _snapshot_header(r: _Reader) -> dict:
    d = {"version": r.int16(), "lastContainedLogTimestamp": r.int64()}
    r.tagged_fields()
    return d


def _snapshot_footer(r: _Reader) -> dict:
    d = {"version": r.int16()}
    r.tagged_fields()
    return d


def _kraft_version(r: _Reader) -> dict:
    d = {"version": r.int16(), "kRaftVersion": r.int16()}
    r.tagged_fields()
    return d


def _endpoint(r: _Reader) -> dict:
    d: dict[str, Any] = {"name": r.string(), "host": r.string(), "port": r.uint16()}
    r.tagged_fields()
    return d


def _voter(r: _Reader) -> dict:
    d: dict[str, Any] = {"voterId": r.int32(), "voterDirectoryId": r.uuid(),
                         "endpoints": r.array(lambda: _endpoint(r))}
    feature = {"minSupportedVersion": r.int16(), "maxSupportedVersion": r.int16()}
    r.tagged_fields()
    d["kRaftVersionFeature"] = feature
    r.tagged_fields()
    return d


def _voters(r: _Reader) -> dict:
    d = {"version": r.int16(), "voters": r.array(lambda: _voter(r))}
    r.tagged_fields()
    return d


# type id -> (Kafka's message name, reader, DumpLogSegments' label)
_KRAFT = {2: ("LeaderChangeMessage", _leader_change, "LeaderChange:"),
          3: ("SnapshotHeaderRecord", _snapshot_header, "SnapshotHeader"),
          4: ("SnapshotFooterRecord", _snapshot_footer, "SnapshotFooter"),
          5: ("KRaftVersionRecord", _kraft_version, "KRaftVersion"),
          6: ("VotersRecord", _voters, "KRaftVoters")}


def control_type(key: Optional[bytes]) -> int:
    """ControlRecordType.parseTypeId: the type id of a control record's key."""
    if key is None or len(key) < 4:
        raise CorruptRecordError(f"Invalid value size found for end control record key. Must have at "
                                 f"least 4 bytes, but found only {0 if key is None else len(key)}")
    version, type_id = struct.unpack_from(">hh", key)
    if version < 0:
        raise CorruptRecordError(f"Invalid version found for control record: {version}. "
                                 f"May indicate data corruption")
    return int(type_id)


def control_fields(key: Optional[bytes], value: Optional[bytes]) -> dict:
    """A control record's meaning as a dict: {"endTxnMarker": "COMMIT", "coordinatorEpoch": 5},
    {"LeaderChange": {...}}, ... or {"controlType": "UNKNOWN(9)"}. Raises CorruptRecordError."""
    type_id = control_type(key)
    if type_id in (0, 1):
        if value is None or len(value) < 6:
            raise CorruptRecordError(f"Invalid value size found for end transaction marker. Must have "
                                     f"at least 6 bytes, but found only {0 if value is None else len(value)}")
        version, epoch = struct.unpack_from(">hi", value)
        if version < 0:
            raise CorruptRecordError(f"Invalid version found for end transaction marker: {version}. "
                                     f"May indicate data corruption")
        return {"endTxnMarker": CONTROL_TYPES[type_id], "coordinatorEpoch": epoch}
    if type_id in _KRAFT:
        name, read, label = _KRAFT[type_id]
        if value is None:
            raise CorruptRecordError(f"{name}: the control record has a null value")
        return {label.rstrip(":"): read(_Reader(value, name))}
    return {"controlType": f"{CONTROL_TYPES.get(type_id, 'UNKNOWN')}({type_id})"}


def control_text(key: Optional[bytes], value: Optional[bytes]) -> str:
    """The text DumpLogSegments appends to a control record's line, without the leading space:
    "endTxnMarker: COMMIT coordinatorEpoch: 5", 'LeaderChange: {"version":0,...}',
    'SnapshotHeader {"version":0,"lastContainedLogTimestamp":...}', "controlType: UNKNOWN(9)"."""
    type_id = control_type(key)
    fields = control_fields(key, value)
    if type_id in _KRAFT:
        label = _KRAFT[type_id][2]
        return f"{label} {_jackson(fields[label.rstrip(':')])}"
    return " ".join(f"{k}: {v}" for k, v in fields.items())


def _jackson(obj: Any) -> str:
    """Jackson's ObjectNode.toString: compact, non-ASCII kept, fields in insertion order."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
