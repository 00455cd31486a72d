"""Compression codecs by Kafka id: gzip from the stdlib; snappy, lz4 and zstd arrive with the
`kstore[compression]` extra (a later issue) and raise UnsupportedCodecError until then."""
from __future__ import annotations

import zlib

from kstore import _core
from kstore.errors import UnsupportedCodecError

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_IDS = {"none": NONE, "uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4,
             "zstd": ZSTD}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items() if k != "uncompressed"}

# Kafka's gzip default level is 6 (GzipCompression.DEFAULT_LEVEL = Deflater.DEFAULT_COMPRESSION).
gzip_level = 6


def _unsupported(codec: int) -> UnsupportedCodecError:
    name = CODEC_NAMES.get(codec, f"#{codec}")
    return UnsupportedCodecError(
        f"compression codec '{name}' (id {codec}) is not supported by this kstore build; "
        f"only gzip is built in (snappy, lz4 and zstd come with the kstore[compression] extra)")


def decompress(codec: int, data: bytes) -> bytes:
    """Decompress one batch's (or wrapper's) payload."""
    if codec == GZIP:
        d = zlib.decompressobj(wbits=31)
        out = d.decompress(data)
        if not d.eof:
            raise ValueError("truncated gzip stream")
        return out
    raise _unsupported(codec)


def compress(codec: int, data: bytes) -> bytes:
    """Compress one batch's payload."""
    if codec == GZIP:
        c = zlib.compressobj(gzip_level, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    raise _unsupported(codec)


_core._set_codecs(decompress, compress)
