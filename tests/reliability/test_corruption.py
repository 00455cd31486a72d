"""The corruption table (facts: crash-and-fault-testing §2c): damage to .log, .index, .timeindex,
checkpoint and topic-config files, each with its expected outcome.

- .log: truncated at every batch boundary +-1, a bit flipped in every header field, random and
  zero tails: the tail from the first bad byte is cut, never a wrong record returned;
- .index / .timeindex: deleted, emptied, cut at every entry boundary +-1, bit flips, garbage:
  rebuilt, and every lookup equals a full scan;
- checkpoints and the topic config: cut at every line boundary +-1, garbage, empty, deleted:
  ignored with a warning and the log fully recovered;
- reads check CRCs: a flipped bit in a segment trusted by a clean shutdown surfaces as
  CorruptRecordError naming the file and the batch's byte position.
"""
import os
import random
import shutil

import pytest

import kstore
from kstore.errors import UnusableFileError
from kstore.tools.dump import batches

CFG = {"segment.bytes": 1500, "index.interval.bytes": 60}
COUNTS = {"log": 0, "index": 0, "checkpoint": 0, "read_crc": 0}
V2_FIELDS = [("baseOffset", 0, 8), ("batchLength", 8, 4), ("partitionLeaderEpoch", 12, 4), ("magic", 16, 1),
             ("crc", 17, 4), ("attributes", 21, 2), ("lastOffsetDelta", 23, 4), ("baseTimestamp", 27, 8),
             ("maxTimestamp", 35, 8), ("producerId", 43, 8), ("producerEpoch", 51, 2),
             ("baseSequence", 53, 4), ("recordCount", 57, 4), ("records", 61, 4)]


def value(o):
    return b"v%05d" % o + b"." * (o % 13)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A standalone log of 60 records in 1-3-record batches over several segments."""
    d = str(tmp_path_factory.mktemp("pristine") / "t-0")
    with kstore.Log.open(d, CFG) as lg:
        o = 0
        while o < 60:
            n = 1 + o % 3
            lg.append([(b"k%d" % (o + j), value(o + j), 1000 + 10 * (o + j)) for j in range(n)])
            o += n
    return d


def fresh(pristine, tmp_path, clean=False):
    d = str(tmp_path / "t-0")
    shutil.copytree(pristine, d)
    if not clean:
        os.unlink(os.path.join(d, ".kstore-clean-shutdown"))     # as after a crash: recover everything
    return d


def seg_files(d, suffix):
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(suffix))


def records(d, clean=False):
    with kstore.Log.open(d, CFG) as lg:
        out = [(r.offset, r.key, r.value) for r in lg]
        leo = lg.log_end_offset
    return out, leo


def expected(n):
    return [(o, b"k%d" % o, value(o)) for o in range(n)]


def first_offset_at_or_after(path, pos):
    """The first offset of the first batch starting at or after byte pos of a .log (or None)."""
    for b in batches(open(path, "rb").read(), path):
        if b["position"] >= pos:
            return b["baseOffset"]
    return None


def cut_points(path):
    heads = list(batches(open(path, "rb").read(), path))
    pts = set()
    for b in heads:
        for p in (b["position"], b["position"] + b["size"]):
            pts.update({p - 1, p, p + 1})
    size = os.path.getsize(path)
    return sorted(p for p in pts if 0 <= p <= size), heads


def replace_file(path, data):
    """A damage case: None deletes the file, bytes replace its contents."""
    if data is None:
        os.unlink(path)
    else:
        with open(path, "wb") as f:
            f.write(data)


# -- .log ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("which", ["first", "last"])
def test_log_truncated_at_every_batch_boundary(pristine, tmp_path, which):
    logs = seg_files(pristine, ".log")
    target = logs[0] if which == "first" else logs[-1]
    pts, heads = cut_points(target)
    for cut in pts:
        case = tmp_path / f"cut{cut}"
        d = fresh(pristine, case)
        path = os.path.join(d, os.path.basename(target))
        with open(path, "r+b") as f:
            f.truncate(cut)
        # the records of the whole batches before the cut survive; a cut inside a batch leaves
        # invalid bytes, and then (Kafka) every later segment goes too. A cut exactly at a batch
        # boundary leaves a valid shorter segment: later segments stay, as in Kafka
        whole = [b for b in heads if b["position"] + b["size"] <= cut]
        n = whole[-1]["lastOffset"] + 1 if whole else int(os.path.basename(target)[:20])
        at_boundary = cut == 0 or any(b["position"] + b["size"] == cut for b in heads)
        got, leo = records(d)
        if at_boundary and which == "first":
            later = int(os.path.basename(seg_files(d, ".log")[1])[:20])
            assert got == expected(n) + expected(60)[later:], f"cut at {cut}"
            assert leo == 60
        else:
            assert got == expected(n), f"cut at {cut}"
            assert leo == n
        COUNTS["log"] += 1


def test_log_bit_flip_in_every_header_field(pristine, tmp_path):
    target = seg_files(pristine, ".log")[1]           # a middle segment
    heads = list(batches(open(target, "rb").read(), target))
    b = heads[1]                                       # its second batch
    for name, off, size in V2_FIELDS:
        for bit in sorted({0, 7, size * 8 - 1}):
            case = tmp_path / f"{name}-{bit}"
            d = fresh(pristine, case)
            path = os.path.join(d, os.path.basename(target))
            with open(path, "r+b") as f:
                f.seek(b["position"] + off + bit // 8)
                byte = f.read(1)[0]
                f.seek(-1, 1)
                f.write(bytes([byte ^ (1 << (bit % 8))]))
            got, leo = records(d)
            if name == "partitionLeaderEpoch":
                # outside the CRC and not validated, as in Kafka: harmless, nothing lost
                assert got == expected(60), name
            else:
                # never a wrong record: the damaged batch and everything after it are cut
                assert got == expected(b["baseOffset"]), (name, bit, len(got))
            COUNTS["log"] += 1


@pytest.mark.parametrize("tail", ["random", "zeros"])
def test_log_junk_tail_on_the_active_segment(pristine, tmp_path, tail):
    """Kafka's testCorruptLog: 1-1024 bytes appended to the active .log; every record survives."""
    rng = random.Random(7)
    for i, n in enumerate([1, 13, 61, 512, 1024]):
        d = fresh(pristine, tmp_path / f"{tail}{i}")
        path = seg_files(d, ".log")[-1]
        with open(path, "ab") as f:
            f.write(rng.randbytes(n) if tail == "random" else bytes(n))
        got, leo = records(d)
        assert got == expected(60) and leo == 60
        COUNTS["log"] += 1


def test_missing_and_empty_log_files(pristine, tmp_path):
    d = fresh(pristine, tmp_path / "empty")
    last = seg_files(d, ".log")[-1]
    base = int(os.path.basename(last)[:20])
    open(last, "wb").close()
    assert records(d) == (expected(base), base)
    d = fresh(pristine, tmp_path / "deleted")
    os.unlink(seg_files(d, ".log")[-1])
    for suffix in (".index", ".timeindex"):
        os.unlink(seg_files(d, suffix)[-1])
    got, leo = records(d)
    assert got == expected(base) and leo == base
    COUNTS["log"] += 2


# -- indexes -----------------------------------------------------------------------------------------
def assert_lookups_equal_scan(d):
    with kstore.Log.open(d, CFG) as lg:
        for o in range(60):
            assert lg.read(o, max_records=1)[0].offset == o
        for ts in range(990, 1600, 7):
            want = next((o for o in range(60) if 1000 + 10 * o >= ts), None)
            assert lg.offset_for_timestamp(ts) == want, ts
    # (an entry damaged into another plausible, still increasing one passes the load-time check;
    # each lookup checks the entry against the batch it points at, so reads stay exact)


def index_damages(path, esize, rng):
    raw = open(path, "rb").read()
    yield "deleted", None
    yield "empty", b""
    for k in range(len(raw) // esize + 1):
        for p in (k * esize - 1, k * esize, k * esize + 1):
            if 0 <= p < len(raw):
                yield f"cut{p}", raw[:p]
    for i in range(0, len(raw), 3):
        flipped = bytearray(raw)
        flipped[i] ^= 1 << (i % 8)
        yield f"flip{i}", bytes(flipped)
    yield "garbage", rng.randbytes(len(raw) or 64)
    yield "zeros", bytes(4096)
    yield "reversed", b"".join(raw[j:j + esize] for j in range(len(raw) - esize, -1, -esize))


@pytest.mark.parametrize("clean", [False, True], ids=["after-crash", "after-clean-close"])
@pytest.mark.parametrize("suffix,esize", [(".index", 8), (".timeindex", 12)])
def test_index_damage_is_rebuilt_and_lookups_equal_a_scan(pristine, tmp_path, suffix, esize, clean):
    rng = random.Random(3)
    target = os.path.basename(seg_files(pristine, suffix)[1])
    for name, data in dict(index_damages(os.path.join(pristine, target), esize, rng)).items():
        d = fresh(pristine, tmp_path / f"{name}", clean=clean)
        path = os.path.join(d, target)
        replace_file(path, data)
        assert_lookups_equal_scan(d)
        COUNTS["index"] += 1


# -- checkpoints and the topic config ----------------------------------------------------------------
@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("store") / "s")
    with kstore.LogManager(root, {"log.segment.bytes": 1500, "log.cleaner.enable": False}) as m:
        m.create_topic("a", 2, {"cleanup.policy": "compact"})
        for i in range(80):
            m.append("a", b"k%d" % (i % 9), value(i), partition=i % 2, timestamp=1000 + i)
        m.log("a", 0).delete_records(4)
    return root


def all_records(root):
    with kstore.LogManager(root, {"log.cleaner.enable": False}) as m:
        return {p: [(r.offset, r.value) for r in m.log("a", p)] for p in m.partitions("a")}


def file_damages(raw: bytes, rng):
    yield "deleted", None
    yield "empty", b""
    ends = [i + 1 for i, c in enumerate(raw) if c == 0x0A]
    for e in [0] + ends:
        for p in (e - 1, e, e + 1):
            if 0 < p < len(raw):
                yield f"cut{p}", raw[:p]
    yield "garbage", rng.randbytes(len(raw))
    yield "not-utf8", b"\xff\xfe" + raw
    yield "extra-field", raw.replace(b"\n", b" 7\n", 3)


@pytest.mark.parametrize("name", ["recovery-point-offset-checkpoint", "log-start-offset-checkpoint",
                                  "kstore-topic-config.json"])
def test_damaged_checkpoint_or_config_is_ignored_or_refused_and_the_log_recovered(store, tmp_path, name):
    want = all_records(store)
    rng = random.Random(5)
    raw = open(os.path.join(store, name), "rb").read()
    for case, data in dict(file_damages(raw, rng)).items():
        root = str(tmp_path / case)
        shutil.copytree(store, root)
        os.unlink(os.path.join(root, ".kafka_cleanshutdown"))
        path = os.path.join(root, name)
        replace_file(path, data)
        if name == "kstore-topic-config.json" and data is not None:
            # unreadable: a writable start refuses it (the overrides would be lost, and with
            # them records: 'a' is compacted, its records from 1970); readers go on without it
            with pytest.raises(UnusableFileError, match="restore it, or remove it") as ei:
                kstore.LogManager(root, {"log.cleaner.enable": False})
            assert ei.value.path == path
            with kstore.StoreReader(root) as r:
                logs = {p: r.log("a", p) for _t, p in r.partitions("a")}
                assert {p: [(x.offset, x.value) for x in lg.read(lg.log_start_offset, max_bytes=1 << 30)]
                        for p, lg in logs.items()} == want, case
            os.unlink(path)                       # the operator's choice: Kafka's defaults
        got = all_records(root)
        if name == "log-start-offset-checkpoint":
            # without it the start falls back to the first segment's base: nothing is lost
            assert {p: [r for r in got[p] if r[0] >= want[p][0][0]] for p in got} == want
        else:
            assert got == want, case
        COUNTS["checkpoint"] += 1


# -- reads verify CRCs ---------------------------------------------------------------------------------
def test_reads_verify_crcs_and_name_file_and_position(pristine, tmp_path):
    """Under a clean-shutdown marker nothing is re-validated at open; a flipped bit in any byte a
    CRC covers surfaces at read time, never as wrong data."""
    target = seg_files(pristine, ".log")[1]
    heads = list(batches(open(target, "rb").read(), target))
    b = heads[1]
    for rel in range(21, b["size"], 5):          # every 5th byte of the CRC-covered region
        d = fresh(pristine, tmp_path / f"b{rel}", clean=True)
        path = os.path.join(d, os.path.basename(target))
        with open(path, "r+b") as f:
            f.seek(b["position"] + rel)
            c = f.read(1)[0]
            f.seek(-1, 1)
            f.write(bytes([c ^ 0x10]))
        with kstore.Log.open(d, CFG) as lg:
            with pytest.raises(kstore.CorruptRecordError) as e:
                lg.read(b["baseOffset"], max_records=1)
            assert e.value.path == path and e.value.position == b["position"]
            assert [r.offset for r in lg.read(0, max_records=b["baseOffset"])] == list(range(b["baseOffset"]))
        COUNTS["read_crc"] += 1


@pytest.fixture(scope="module", autouse=True)
def _file_counts(reliability_counts):
    yield
    reliability_counts["corruption"] = dict(COUNTS)
