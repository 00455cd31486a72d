"""kstore._txn_scan: txn_headers, the header walk of read_committed's transaction scans, and
producer_headers, the cleaner's walk for producer state."""
import struct

import pytest

from kstore._txn_scan import producer_headers, txn_headers

from batch_helpers import craft_v2


def _txn(base, pid, attrs=0x10):
    b = bytearray(craft_v2([(0, 0, b"k", b"v")], base, attrs=attrs))
    struct.pack_into(">q", b, 43, pid)
    return bytes(b)


def test_only_transactional_v2_batches_are_listed_with_their_positions():
    plain = craft_v2([(0, 0, b"k", b"v"), (1, 0, b"k", b"w")], 0)
    data = plain + _txn(2, 7) + _txn(3, 7, attrs=0x30) + craft_v2([(0, 0, b"k", b"x")], 4)
    a, b = len(plain), len(plain) + len(_txn(2, 7))
    assert txn_headers(data) == ([(2, 2, 7, 0x10, a, b), (3, 3, 7, 0x30, b, b + len(_txn(3, 7, 0x30)))],
                                 4, None)


def test_the_walk_stops_at_a_partial_batch_and_names_malformed_bytes():
    data = craft_v2([(0, 0, b"k", b"v")], 5) + _txn(6, 1)
    assert txn_headers(data[:-3]) == ([], 5, None)           # the data ends inside a batch
    assert txn_headers(b"") == ([], -1, None)
    bad = bytearray(data)
    struct.pack_into(">i", bad, len(craft_v2([(0, 0, b"k", b"v")], 5)) + 8, 3)   # size 3 < 14
    batches, last, why = txn_headers(bytes(bad))
    assert (batches, last) == ([], 5)
    assert why == ("record size is smaller than the minimum record overhead (14) "
                   f"(batch at offset 6, position {len(craft_v2([(0, 0, b'k', b'v')], 5))})")


def test_producer_headers_list_every_v2_batch_with_a_producer_id():
    plain = craft_v2([(0, 0, b"k", b"v")], 0, max_ts=1234)
    idem = bytearray(_txn(1, 5, attrs=0))
    struct.pack_into(">h", idem, 51, 3)                      # producer epoch 3
    data = plain + bytes(idem) + _txn(2, 7) + _txn(3, 7, attrs=0x30)
    a = len(plain)
    b = a + len(idem)
    c = b + len(_txn(2, 7))
    ts = struct.unpack_from(">q", idem, 35)[0]
    assert producer_headers(data) == ([(1, 1, 5, 0, 3, ts, a, b), (2, 2, 7, 0x10, -1, ts, b, c),
                                       (3, 3, 7, 0x30, -1, ts, c, len(data))], 3, None)
    assert producer_headers(data[:-3])[1:] == (2, None)


def test_last_whole_batch_is_the_start_of_the_last_well_formed_batch():
    from kstore._txn_scan import last_whole_batch
    data = b"".join(_txn(i, 7, 0x10) for i in range(3))
    a, b = len(_txn(0, 7, 0x10)), 2 * len(_txn(0, 7, 0x10))
    assert last_whole_batch(data) == b and last_whole_batch(data, a) == b
    assert last_whole_batch(data[:-3]) == a                     # the last one cut short
    assert last_whole_batch(data[:10]) == -1 and last_whole_batch(b"") == -1
    with pytest.raises(ValueError):
        last_whole_batch(data, len(data) + 1)
