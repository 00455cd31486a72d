"""Golden-bytes helpers: compare a .log kstore writes now with bytes recorded before batches
carried the partition leader epoch (issue 16 item 4)."""
import struct


def epoch_back_to_unknown(data: bytes, expect: int = 0) -> bytearray:
    """A copy of a v2 .log's bytes with every batch's partitionLeaderEpoch (bytes 12-16 of its
    header, outside the CRC) checked to be `expect` and put back to -1, as main wrote it."""
    out = bytearray(data)
    pos = 0
    while pos < len(out):
        assert struct.unpack_from(">i", out, pos + 12)[0] == expect, f"epoch at position {pos}"
        struct.pack_into(">i", out, pos + 12, -1)
        pos += struct.unpack_from(">i", out, pos + 8)[0] + 12
    return out
