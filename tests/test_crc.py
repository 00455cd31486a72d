"""kstore._crc: CRC-32C (both paths) and CRC-32 against independent implementations (crcmod,
zlib); the tables are built in C, so kstore itself needs no crcmod."""
import os
import random
import subprocess
import sys
import zlib

import crcmod.predefined
import pytest
from hypothesis import given, settings, strategies as st

import kstore
from kstore import _core
from batch_helpers import CRC32C, build

CRC32 = crcmod.predefined.mkPredefinedCrcFun("crc-32")


def test_crc32c_kafka_vector():
    assert kstore.crc32c(b"123456789") == 0xE3069283
    assert _core.crc32c_table(b"123456789") == 0xE3069283


# the hardware path's tiers (three streams of 16 KiB, 4 KiB, 1 KiB, then one stream): lengths
# at and beside each tier's 3-block boundary, and a 126 KB batch that passes through all four
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 63, 1023, 3071, 3072, 3073, 4096, 9216, 12287,
                               12288, 12289, 49151, 49152, 49153, 49152 + 12288 + 3072 + 5,
                               65536, 100_003, 126_979])
def test_crc32c_matches_crcmod_both_paths(n):
    data = random.Random(n).randbytes(n)
    want = CRC32C(data)
    assert kstore.crc32c(data) == want
    assert _core.crc32c_table(data) == want
    if _core.crc32c_implementation() == "sse4.2":
        assert _core.crc32c_hw(data) == want
    # chaining works like zlib.crc32
    assert kstore.crc32c(data[n // 3:], kstore.crc32c(data[: n // 3])) == want


def test_crc32c_unaligned_views():
    data = os.urandom(20000)
    for off in range(9):
        view = memoryview(data)[off:]
        assert kstore.crc32c(view) == CRC32C(bytes(view))


def test_forced_table_path_gives_same_results():
    data = os.urandom(50000)
    want = CRC32C(data)
    try:
        _core._force_table_crc(True)
        assert _core.crc32c_implementation() == "table"
        assert kstore.crc32c(data) == want
        b = build([(b"k", b"v")])
        assert _core.decode_batches(b.getvalue())[0].value == b"v"
    finally:
        _core._force_table_crc(False)


@given(st.binary(max_size=5000))
@settings(max_examples=200, deadline=None)
def test_crc32_and_crc32c_random(data):
    assert kstore.crc32(data) == zlib.crc32(data)
    assert kstore.crc32c(data) == CRC32C(data)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 255, 256, 4099])
def test_crc32_matches_crcmod(n):
    data = random.Random(n).randbytes(n)
    assert kstore.crc32(data) == CRC32(data) == zlib.crc32(data)


def test_kstore_imports_without_crcmod(tmp_path):
    code = "import sys, kstore; kstore.crc32c(b'x'); sys.exit('crcmod' in sys.modules)"
    # cwd outside the checkout: `python -c` puts the cwd first on sys.path, and the source tree
    # (no compiled modules in CI) would shadow the installed package
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=str(tmp_path),
                   env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
