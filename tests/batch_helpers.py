"""Shared by the compiled core's tests (test_crc, test_encode, test_decode): one batch builder
call with test defaults, and crcmod's CRC-32C as the oracle; and batches kstore never builds
(craft_v2, txn_batch: a transaction's data and markers) for the consumer and cleaner tests."""
import os

import crcmod.predefined

from kstore import _core

from broker_dirs import varint as _varint

CRC32C = crcmod.predefined.mkPredefinedCrcFun("crc-32c")
NOW = 1_700_000_000_000
ANY_TS = (-(1 << 62), 1 << 62)


def build(records, magic=2, base=0, now=NOW, lat=False, codec=0, require_key=False, ts=ANY_TS):
    b = _core.BatchBuilder()
    b.build(records, magic, base, now, lat, ts[0], ts[1], require_key, codec)
    return b




def _blob(b) -> bytes:
    return _varint(-1) if b is None else _varint(len(b)) + b


def craft_v2(records, base_offset=0, base_ts=NOW, attrs=0, last_delta=None, max_ts=None):
    """A v2 batch built by hand, for what BatchBuilder never writes (compaction gaps in the
    offset deltas, control batches, any lastOffsetDelta): records are (offset delta, timestamp
    delta, key, value); CRC-32C correct."""
    import struct
    body = b""
    for off_delta, ts_delta, k, v in records:
        rec = b"\x00" + _varint(ts_delta) + _varint(off_delta) + _blob(k) + _blob(v) + _varint(0)
        body += _varint(len(rec)) + rec
    if last_delta is None:
        last_delta = records[-1][0] if records else 0
    if max_ts is None:
        max_ts = base_ts + max((r[1] for r in records), default=0)
    tail = struct.pack(">hiqqqhii", attrs, last_delta, base_ts, max_ts, -1, -1, -1, len(records)) + body
    head = struct.pack(">qiib", base_offset, 4 + 1 + 4 + len(tail), 0, 2)
    return head + struct.pack(">I", CRC32C(tail)) + tail


def recrc(raw: bytearray, pos: int = 0) -> None:
    """Rewrite the CRC of the v2 batch at pos after its bytes were changed."""
    import struct
    size = struct.unpack_from(">i", raw, pos + 8)[0] + 12
    struct.pack_into(">I", raw, pos + 17, CRC32C(bytes(raw[pos + 21:pos + size])))


def txn_batch(base, pid, values=(), control=None, ts=NOW, transactional=True):
    """A v2 batch of producer pid: transactional data records (values), or a control batch
    (control = 0 ABORT, 1 COMMIT) as a broker writes them; CRC-32C correct. transactional=False:
    an idempotent producer's data batch."""
    import struct
    attrs = (0x10 if transactional else 0) | (0x20 if control is not None else 0)
    if control is not None:
        recs = [(0, struct.pack(">hh", 0, control), struct.pack(">hi", 0, 0))]
    else:
        recs = [(i, b"k", v) for i, v in enumerate(values)]
    body = b""
    for d, k, v in recs:
        rec = b"\x00" + _varint(0) + _varint(d) + _blob(k) + _blob(v) + _varint(0)
        body += _varint(len(rec)) + rec
    tail = struct.pack(">hiqqqhii", attrs, len(recs) - 1, ts, ts, pid, 0, 0 if control is None else -1,
                       len(recs)) + body
    head = struct.pack(">qiib", base, 4 + 1 + 4 + len(tail), 0, 2)
    return head + struct.pack(">I", CRC32C(tail)) + tail


def markers_then_records(d: str) -> int:
    """A log as compaction leaves it: a segment of transaction markers only, more than a read's
    byte budget (1 MiB), then a segment whose marker is followed by a gap (cleaned away) and
    a record, then one more segment, in d's partition t-0; the record's offset, n + 2."""
    n = (1 << 20) // len(txn_batch(0, 4, control=1)) + 10
    os.makedirs(os.path.join(d, "t-0"))
    files = {0: b"".join(txn_batch(i, 4, control=1) for i in range(n)),      # COMMITs pid 4
             n: txn_batch(n, 5, control=0) + craft_v2([(0, 0, b"a", b"plain")], n + 2),
             n + 3: craft_v2([(0, 0, b"b", b"next")], n + 3)}
    for base, data in files.items():
        with open(os.path.join(d, "t-0", "%020d.log" % base), "wb") as f:
            f.write(data)
    return n + 2


def emptied_marker(base, pid, ts=NOW):
    """A control batch of producer pid with no records, as Kafka's cleaner leaves a marker whose
    transaction has no data left when it is the last batch of a cleaned range."""
    import struct
    tail = struct.pack(">hiqqqhii", 0x30, 0, ts, ts, pid, 0, -1, 0)
    head = struct.pack(">qiib", base, 4 + 1 + 4 + len(tail), 0, 2)
    return head + struct.pack(">I", CRC32C(tail)) + tail


#: Source for child-process scripts (kept self-contained: a child imports only kstore): varint(v),
#: blob(b) and batch(pid, recs, control=None), a transactional batch as a producer (data: recs of
#: (key, value), None allowed) or a broker (control: 0 ABORT, 1 COMMIT) writes it, offset 0
TXN_BATCH_SOURCE = r"""
import struct, time
from kstore._core import crc32c

def varint(v):
    u, out = (v << 1) ^ (v >> 63), bytearray()
    while u >= 0x80:
        out.append((u & 0x7F) | 0x80)
        u >>= 7
    out.append(u)
    return bytes(out)

def blob(b):
    return varint(-1) if b is None else varint(len(b)) + b

def batch(pid, recs, control=None):
    if control is not None:
        recs = [(struct.pack(">hh", 0, control), struct.pack(">hi", 0, 0))]
    body = b""
    for i, (k, v) in enumerate(recs):
        rec = b"\x00" + varint(0) + varint(i) + blob(k) + blob(v) + varint(0)
        body += varint(len(rec)) + rec
    ts = int(time.time() * 1000)
    tail = struct.pack(">hiqqqhii", 0x10 | (0x20 if control is not None else 0), len(recs) - 1,
                       ts, ts, pid, 0, 0 if control is None else -1, len(recs)) + body
    return struct.pack(">qiib", 0, 9 + len(tail), 0, 2) + struct.pack(">I", crc32c(tail)) + tail
"""
