"""Helpers shared by the log test modules (unit and reliability)."""
import os
import struct

NOW = 1_700_000_000_000


def files(d):
    """The segment files of a partition dir: not kstore's dot files, nor the
    leader-epoch-checkpoint every writable open keeps (tests/test_leader_epoch.py)."""
    return sorted(n for n in os.listdir(d) if not n.startswith(".kstore") and n != "leader-epoch-checkpoint")


def values(log, start=None):
    return [r.value for r in log.read(log.log_start_offset if start is None else start, max_bytes=1 << 30)]


def big_value(offset: int, gen: str = "o") -> bytes:
    """A value that names its offset (and generation), 2 KB: batches span several pages."""
    return (b"%s%05d" % (gen.encode(), offset)) * 333


def tagged_value(offset: int) -> bytes:
    return b"%d." % offset * 40


def log_with_stale_index_entry(open_log, log_dir):
    """20 one-record batches, reopened after the .index entry for offset 5 was rewritten to
    point at the batch of offset 12 (stale after a crash, or damaged)."""
    cfg = {"index.interval.bytes": 1}
    log = open_log(cfg)
    for i in range(20):
        log.append([(None, b"v%d" % i, NOW + i)])
    entries = [log.active_segment.offset_index.entry(n) for n in range(log.active_segment.offset_index.entries)]
    log.close()
    idx_path = os.path.join(log_dir, "00000000000000000000.index")
    raw = bytearray(open(idx_path, "rb").read())
    slot = [o for o, _ in entries].index(5)
    raw[slot * 8 + 4: slot * 8 + 8] = struct.pack(">i", dict(entries)[12])
    open(idx_path, "wb").write(bytes(raw))
    return open_log(cfg)
