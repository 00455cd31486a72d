"""Partition directories as Kafka brokers write them, built by the tests from the record
format spec (Kafka's DefaultRecordBatch / DefaultRecord / ControlRecordType, KIP-98, KIP-853)
and from byte vectors published with Kafka's and its clients' test suites.

Independent of kstore's encoder: batches are packed here with `struct`, CRC-32C computed by a
table in pure Python (the oracle), so a test compares kstore's reading with the format itself.
"""
from __future__ import annotations

import os
import struct
from typing import Optional, Sequence

NOW = 1_700_000_000_000

# -- CRC-32C (Castagnoli, reflected 0x82F63B78), the oracle ---------------------------------------
_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _TABLE.append(_c)


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def varint(v: int) -> bytes:
    """Kafka's zig-zag varint (ByteUtils.writeVarint / writeVarlong)."""
    u = (v << 1) ^ (v >> 63)
    out = bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)


def _blob(b: Optional[bytes]) -> bytes:
    return varint(-1) if b is None else varint(len(b)) + b


def record(off_delta: int, ts_delta: int, key: Optional[bytes], value: Optional[bytes],
           headers: Sequence[tuple[str, Optional[bytes]]] = ()) -> bytes:
    """One DefaultRecord: length, attributes 0, timestamp delta, offset delta, key, value,
    headers."""
    body = (b"\x00" + varint(ts_delta) + varint(off_delta) + _blob(key) + _blob(value)
            + varint(len(headers)) + b"".join(_blob(k.encode()) + _blob(v) for k, v in headers))
    return varint(len(body)) + body


TRANSACTIONAL = 0x10
CONTROL = 0x20
LOG_APPEND_TIME = 0x08


def v2_batch(base_offset: int, records: Sequence[tuple], *, base_ts: int = NOW,
             attrs: int = 0, max_ts: Optional[int] = None, last_delta: Optional[int] = None,
             producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1,
             leader_epoch: int = -1, codec_payload=None) -> bytes:
    """A v2 record batch: records are (offset delta, timestamp delta, key, value[, headers]).
    codec_payload(bytes) -> bytes compresses the records section (attrs carries the codec id).
    max_ts defaults to the largest record timestamp (for LogAppendTime pass the append time)."""
    body = b"".join(record(*r) for r in records)
    if codec_payload is not None:
        body = codec_payload(body)
    if last_delta is None:
        last_delta = records[-1][0] if records else 0
    if max_ts is None:
        max_ts = base_ts + max((r[1] for r in records), default=0)
    tail = struct.pack(">hiqqqhii", attrs, last_delta, base_ts, max_ts, producer_id,
                       producer_epoch, base_sequence, len(records)) + body
    head = struct.pack(">qii", base_offset, 4 + 1 + 4 + len(tail), leader_epoch) + b"\x02"
    return head + struct.pack(">I", crc32c(tail)) + tail


def control_key(type_id: int) -> bytes:
    """ControlRecordType's key: version 0, type (0 abort, 1 commit, 2 LeaderChange, 3 snapshot
    header, 4 snapshot footer, 5 KRaft version, 6 KRaft voters)."""
    return struct.pack(">hh", 0, type_id)


def end_txn_marker(coordinator_epoch: int) -> bytes:
    """EndTransactionMarker's value: version 0, coordinator epoch."""
    return struct.pack(">hi", 0, coordinator_epoch)


def leader_change(leader_id: int, voters: Sequence[int]) -> bytes:
    """LeaderChangeMessage v0: version, leaderId, voters, grantingVoters (as a KRaft leader's
    first batch carries it)."""
    arr = struct.pack(">i", len(voters)) + b"".join(struct.pack(">i", v) for v in voters)
    return struct.pack(">hi", 0, leader_id) + arr + arr


def write_partition(parent: str, name: str, log_bytes: bytes, *, base_offset: int = 0,
                    extra: Optional[dict[str, bytes]] = None) -> str:
    """A partition dir `parent/name` holding one segment's .log (a broker's indexes left out:
    the open rebuilds them) and the extra files given by name."""
    d = os.path.join(parent, name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"{base_offset:020d}.log"), "wb") as f:
        f.write(log_bytes)
    for fname, data in (extra or {}).items():
        with open(os.path.join(d, fname), "wb") as f:
            f.write(data)
    return d


# -- codecs in Kafka's framings, from their specs (not kstore's compression module) --------------
def xerial_snappy(data: bytes) -> bytes:
    """Kafka's snappy: xerial's SnappyOutputStream (magic, version 1, compat 1, then 32 KiB
    blocks each behind a big-endian length)."""
    import cramjam
    out = [b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)]
    for i in range(0, len(data), 32 * 1024):
        block = bytes(cramjam.snappy.compress_raw(data[i:i + 32 * 1024]))
        out.append(struct.pack(">i", len(block)) + block)
    return b"".join(out)


def kafka_lz4(data: bytes) -> bytes:
    """Kafka's KafkaLZ4BlockOutputStream frame (LZ4 frame spec: magic 0x184D2204, FLG 0x60 =
    version 1 + independent blocks, BD 0x40 = 64 KiB blocks, header checksum = second byte of
    xxh32 over FLG and BD, little-endian block sizes, end mark 0)."""
    import cramjam
    import xxhash
    desc = bytes([0x60, 0x40])
    out = [struct.pack("<I", 0x184D2204), desc, bytes([(xxhash.xxh32_intdigest(desc) >> 8) & 0xFF])]
    for i in range(0, len(data), 64 * 1024):
        raw = data[i:i + 64 * 1024]
        comp = bytes(cramjam.lz4.compress_block(raw, store_size=False))
        out.append(struct.pack("<I", len(comp)) + comp if len(comp) < len(raw)
                   else struct.pack("<I", len(raw) | 0x80000000) + raw)
    out.append(b"\x00" * 4)
    return b"".join(out)


def kafka_index_entries(log_bytes: bytes, interval: int, base_offset: int = 0):
    """The (.index, .timeindex) entries Kafka's LogSegment.recover builds for a .log: an entry
    for a batch once more than `interval` bytes lie between the last entry and it (the batch's
    last offset and position; the time index the max timestamp so far and its offset)."""
    offsets, times = [], []
    pos = last_entry = 0
    max_ts, max_ts_off = -1, -1
    while pos + 61 <= len(log_bytes):
        base, length = struct.unpack_from(">qi", log_bytes, pos)
        if length <= 0:
            break
        last_delta, _bts, bmax = struct.unpack_from(">iqq", log_bytes, pos + 23)
        last = base + last_delta
        if bmax > max_ts:
            max_ts, max_ts_off = bmax, last
        if pos - last_entry > interval:
            offsets.append((last - base_offset, pos))
            if not times or max_ts > times[-1][0]:
                times.append((max_ts, max_ts_off - base_offset))
            last_entry = pos
        pos += length + 12
    return offsets, times
