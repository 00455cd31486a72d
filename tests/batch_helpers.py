"""Shared by the compiled core's tests (test_crc, test_encode, test_decode): one batch builder
call with test defaults, and crcmod's CRC-32C as the oracle."""
import crcmod.predefined

from kstore import _core

CRC32C = crcmod.predefined.mkPredefinedCrcFun("crc-32c")
NOW = 1_700_000_000_000
ANY_TS = (-(1 << 62), 1 << 62)


def build(records, magic=2, base=0, now=NOW, lat=False, codec=0, require_key=False, ts=ANY_TS):
    b = _core.BatchBuilder()
    b.build(records, magic, base, now, lat, ts[0], ts[1], require_key, codec)
    return b
