"""kstore._decode and kstore._scan on hostile input: corruption is found and reported as
kstore's errors (never a crash); Records pickle."""
import pytest
from hypothesis import given, settings, strategies as st

import kstore
from kstore import _core
from kstore.errors import CorruptRecordError
from batch_helpers import NOW, build


# -- hostile input ---------------------------------------------------------------------------
def test_crc_flip_detected_with_position():
    raw = build([(b"k", b"v" * 10)]).getvalue() * 2
    bad = bytearray(raw)
    bad[len(raw) // 2 + 70] ^= 1
    with pytest.raises(CorruptRecordError) as ei:
        _core.decode_batches(bytes(bad))
    assert ei.value.position == len(raw) // 2
    assert "CRC mismatch" in str(ei.value)


@pytest.mark.parametrize("delta", [0, 2])
def test_record_offset_deltas_out_of_order_or_past_the_batch_are_corrupt(delta):
    """A CRC-valid batch whose second record repeats offset delta 0 (or claims 2, past the
    batch's last offset delta 1) would yield an offset twice or outside the batch: corrupt."""
    import struct
    raw = bytearray(build([(b"a", b"x"), (b"b", b"y")]).getvalue())
    second = 61 + 1 + raw[61] // 2            # first record: its length varint, then its body
    assert raw[second + 3] == 2               # length, attributes, timestamp delta 0, offset delta 1
    raw[second + 3] = delta * 2               # zig-zag
    struct.pack_into(">I", raw, 17, _core.crc32c(bytes(raw[21:])))
    with pytest.raises(CorruptRecordError) as ei:
        _core.decode_batches(bytes(raw))
    assert f"record 1 of the batch: offset delta {delta} after 0, last offset delta 1" in str(ei.value)
    assert ei.value.position == 0
    cols = _core.Columns()
    with pytest.raises(CorruptRecordError) as ei:
        _core.decode_columns(_core.Mapping.from_bytes(bytes(raw)), 0, len(raw), 0, 1 << 62, cols)
    assert "offset delta is not above the previous one or past the batch's last" in str(ei.value)


def _valid_batch_strategy():
    rec = st.tuples(st.one_of(st.none(), st.binary(max_size=20)), st.one_of(st.none(), st.binary(max_size=40)),
                    st.integers(0, 1 << 45))
    return st.tuples(st.lists(rec, min_size=1, max_size=8), st.sampled_from([0, 1, 2]), st.sampled_from([0, 1]))


@given(_valid_batch_strategy(), st.data())
@settings(max_examples=300, deadline=None)
def test_mutated_batches_only_raise_kstore_errors(spec, data):
    recs, magic, codec = spec
    raw = bytearray(build(recs, magic=magic, codec=codec).getvalue())
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "truncate", "extend", "set"]))
        if kind == "flip" and raw:
            i = data.draw(st.integers(0, len(raw) - 1))
            raw[i] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "truncate" and raw:
            del raw[data.draw(st.integers(0, len(raw) - 1)):]
        elif kind == "extend":
            raw += data.draw(st.binary(max_size=30))
        elif kind == "set" and len(raw) > 4:
            i = data.draw(st.integers(0, len(raw) - 4))
            raw[i:i + 4] = data.draw(st.binary(min_size=4, max_size=4))
    for verify in (True, False):
        try:
            _core.decode_batches(bytes(raw), verify_crc=verify)
        except kstore.KStoreError:
            pass


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_random_bytes_recover_scan_never_crashes(data):
    import tempfile
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        m = _core.Mapping(f.fileno(), len(data), False)
        res = _core.recover_scan(m, len(data), 0, 4096, 100, 100)
        assert 0 <= res["valid_bytes"] <= len(data)
        if len(data):
            assert _core.batch_headers(m, 0, res["valid_bytes"]) is not None
        m.close()


def test_record_pickles_and_compares():
    import pickle
    r = _core.decode_batches(build([(b"k", b"v", NOW, [("a", b"b")])], base=5).getvalue())[0]
    r2 = pickle.loads(pickle.dumps(r))
    assert r2 == r and r2.offset == 5 and r2.headers == (("a", b"b"),)


def test_recover_scan_result_is_typed_and_still_a_dict():
    import tempfile
    raw = build([(b"k", b"v")], base=7).getvalue() + b"\x00" * 40
    with tempfile.TemporaryFile() as f:
        f.write(raw)
        f.flush()
        m = _core.Mapping(f.fileno(), len(raw), False)
        res = _core.recover_scan(m, len(raw), 7, 4096, 10, 10)
        m.close()
    assert isinstance(res, dict) and res.valid_bytes == res["valid_bytes"] == len(raw) - 40
    assert res.next_offset == 8 and res.batches == 1 and res.tail_zero
    assert res.status is _core.ScanStatus.CORRUPT and res["status"] == "corrupt"
    assert {"corrupt": 1}.get(res.status) == 1 and f"{res.status}" == "corrupt"
