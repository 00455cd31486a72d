"""Structure-aware fuzzing (facts: crash-and-fault-testing §3): Hypothesis builds real batches
(every magic, codecs, headers, nulls), then mutates them (bit flips, byte overwrites, extreme
values in length/count/varint positions, truncation, insertion), optionally re-sealing the CRC so
the mutation reaches the record parser. The record decoders, the header walk, recovery's scan,
the index loader and the checkpoint reader may only return a value or raise kstore's own
exceptions: never IndexError, struct.error, MemoryError, a crash or a hang.

Long runs: KSTORE_FUZZ_EXAMPLES=100000; an atheris entry point and a sanitizer build are in
fuzz/ (see the README's Reliability section).
"""
import os
import struct
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kstore
from kstore import _core
from kstore.checkpoint import CheckpointError, OffsetCheckpointFile

EXAMPLES = int(os.environ.get("KSTORE_FUZZ_EXAMPLES", "400"))
COUNTS = {"examples": 0, "crashes": 0}
CFG = settings(max_examples=EXAMPLES, deadline=2000, derandomize=False,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                      HealthCheck.function_scoped_fixture])

blob = st.one_of(st.none(), st.binary(max_size=40))
record = st.tuples(blob, blob, st.integers(0, 2 ** 41),
                   st.lists(st.tuples(st.text(max_size=5), blob), max_size=2))
CODECS = [0, 1, 2, 3, 4]          # none, gzip, snappy, lz4, zstd (the last three need kstore[compression])


@st.composite
def batches(draw):
    """Bytes of 1-3 valid batches (magic 0, 1 or 2, a codec), as a producer would send them."""
    b = _core.BatchBuilder()
    out, base = b"", draw(st.integers(0, 1000))
    for _ in range(draw(st.integers(1, 3))):
        magic = draw(st.sampled_from([2, 2, 2, 1, 0]))
        recs = draw(st.lists(record, min_size=1, max_size=5))
        if magic < 2:
            recs = [(k, v, t) for k, v, t, _h in recs]
        codec = draw(st.sampled_from(CODECS))
        try:
            b.build(recs, magic, base, 0, False, -(1 << 62), 1 << 62, False, codec)
        except kstore.UnsupportedCodecError:
            b.build(recs, magic, base, 0, False, -(1 << 62), 1 << 62, False, 0)
        data = b.getvalue()
        out += data
        base += len(recs)
    return out


@st.composite
def mutated(draw):
    data = bytearray(draw(batches()))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "byte", "int", "truncate", "insert", "zero"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte":
            data[i] = draw(st.integers(0, 255))
        elif kind == "int":          # extreme values where lengths, counts and varints live
            v = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF]))
            pos = draw(st.sampled_from([8, 57, 61, 62, 63, i]))
            if pos + 4 <= len(data):
                struct.pack_into(">I", data, pos, v)
        elif kind == "truncate":
            del data[i:]
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        else:
            data[i:i + draw(st.integers(1, 64))] = bytes(min(64, len(data) - i))
    end = 12 + int.from_bytes(data[8:12], "big") if len(data) >= 12 else 0
    if draw(st.booleans()) and len(data) >= 61 and data[16] == 2 and 21 <= end <= len(data):
        # re-seal the first batch's CRC so the mutation reaches the record parser
        struct.pack_into(">I", data, 17, kstore.crc32c(bytes(data[21:end])))
    return bytes(data)


def only_kstore_errors(fn, *a):
    COUNTS["examples"] += 1
    try:
        return fn(*a)
    except kstore.KStoreError:
        return None
    except Exception as e:          # anything else is a bug
        COUNTS["crashes"] += 1
        raise AssertionError(f"{fn.__name__} raised {type(e).__name__}: {e}") from e


@CFG
@given(mutated())
def test_record_decoders_raise_only_kstore_errors(data):
    only_kstore_errors(_core.decode_batches, data, -1, True)
    only_kstore_errors(_core.decode_batches, data, -1, False)
    only_kstore_errors(_core.decode_batches, data, -1, True, True)
    m = _core.Mapping.from_bytes(data)
    only_kstore_errors(_core.batch_headers, m, 0, len(data))
    only_kstore_errors(_core.recover_scan, m, len(data), 0, 64, 1024, 1024)
    cols = _core.Columns()
    only_kstore_errors(_core.decode_columns, m, 0, len(data), 0, 1 << 62, cols)


@CFG
@given(mutated())
def test_segment_recovery_and_reads_of_mutated_logs(data):
    """A mutated .log recovered by Log.open: never a crash, and whatever it keeps reads back."""
    with tempfile.TemporaryDirectory() as d:
        part = os.path.join(d, "t-0")
        os.mkdir(part)
        with open(os.path.join(part, "00000000000000000000.log"), "wb") as f:
            f.write(data)

        def run():
            with kstore.Log.open(part) as lg:
                got = [r.offset for r in lg]
                assert got == sorted(set(got))
                for o in got[:5]:
                    assert lg.read(o, max_records=1)[0].offset == o
                lg.append([(None, b"after")])
        only_kstore_errors(run)


@CFG
@given(st.binary(max_size=200), st.booleans())
def test_index_loader_never_trusts_garbage(raw, clean):
    """Arbitrary .index and .timeindex bytes beside a valid .log: opened, read and looked up
    exactly as a full scan (the index is rebuilt, or each entry checked)."""
    with tempfile.TemporaryDirectory() as d:
        part = os.path.join(d, "t-0")
        with kstore.Log.open(part, {"index.interval.bytes": 40}) as lg:
            for i in range(12):
                lg.append([(None, b"v%d" % i, 1000 + i)])
        for suffix in (".index", ".timeindex"):
            with open(os.path.join(part, "00000000000000000000" + suffix), "wb") as f:
                f.write(raw)
        if not clean:
            os.unlink(os.path.join(part, ".kstore-clean-shutdown"))

        def run():
            with kstore.Log.open(part) as lg:
                assert [r.offset for r in lg] == list(range(12))
                for o in range(12):
                    assert lg.read(o, max_records=1)[0].offset == o
                for ts in range(998, 1014):
                    want = next((o for o in range(12) if 1000 + o >= ts), None)
                    assert lg.offset_for_timestamp(ts) == want
        only_kstore_errors(run)


@CFG
@given(st.one_of(st.binary(max_size=120),
                 st.lists(st.text(alphabet="0123456789 -\nab\t", max_size=12), max_size=6).map(
                     lambda ls: "\n".join(ls).encode())))
def test_checkpoint_reader_returns_offsets_or_checkpoint_error(raw):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "recovery-point-offset-checkpoint")
        with open(path, "wb") as f:
            f.write(raw)
        COUNTS["examples"] += 1
        try:
            out = OffsetCheckpointFile(path).read()
        except CheckpointError:
            return
        assert all(isinstance(t, str) and p >= 0 and isinstance(o, int) for (t, p), o in out.items())


@pytest.fixture(scope="module", autouse=True)
def _file_counts(reliability_counts):
    yield
    reliability_counts["fuzz"] = dict(COUNTS)
