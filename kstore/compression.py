"""Compression codecs by Kafka id, in Kafka's own framings.

- gzip: the stdlib's zlib (always available).
- snappy: xerial's block stream (SnappyOutputStream: an 8-byte magic, version and compat ints,
  then blocks of a big-endian length and a raw snappy block of up to 32 KiB), as Kafka writes it;
  a bare snappy block is read too.
- lz4: Kafka's LZ4 frame (KafkaLZ4BlockOutputStream: magic 0x184D2204, independent 64 KiB
  blocks, no block or content checksums). Under message format v0 Kafka computes the header
  checksum over the magic as well; kstore writes that quirk for v0 and accepts it when reading v0.
- zstd: standard zstd frames.

snappy, lz4 and zstd come from cramjam (one maintained, wheel-shipped binding of all three) and
xxhash (lz4's header checksum): `pip install 'kstore[compression]'`. A missing codec raises
UnsupportedCodecError naming that extra.
"""
from __future__ import annotations

import struct
import zlib
from typing import Literal

from kstore import _core
from kstore.errors import UnsupportedCodecError

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_IDS = {"none": NONE, "uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4,
             "zstd": ZSTD}
CODEC_NAMES = {v: k for k, v in CODEC_IDS.items() if k != "uncompressed"}

#: Kafka's default levels (GzipCompression: Deflater's default = 6; Lz4Compression: 9;
#: ZstdCompression: 3).
DEFAULT_LEVELS = {GZIP: 6, LZ4: 9, ZSTD: 3}

try:
    import cramjam as _cramjam
except ImportError:  # pragma: no cover - exercised only without the extra
    _cramjam = None  # type: ignore[assignment]  # checked by available()
try:
    import xxhash as _xxhash
except ImportError:  # pragma: no cover
    _xxhash = None  # type: ignore[assignment]  # checked by available()


def available(codec: int) -> bool:
    """Whether this installation can read and write `codec`."""
    if codec in (NONE, GZIP):
        return True
    if codec == LZ4:
        return _cramjam is not None and _xxhash is not None
    return _cramjam is not None


def _unsupported(codec: int) -> UnsupportedCodecError:
    name = CODEC_NAMES.get(codec, f"#{codec}")
    if codec in (SNAPPY, LZ4, ZSTD):
        return UnsupportedCodecError(
            f"compression codec '{name}' needs the kstore[compression] extra "
            f"(pip install 'kstore[compression]'), which brings cramjam and xxhash")
    return UnsupportedCodecError(f"unknown compression codec id {codec}")


# -- snappy (xerial) ----------------------------------------------------------------------------
_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024


def _snappy_compress(data: bytes) -> bytes:
    out = [_XERIAL_HEADER]
    for i in range(0, len(data), _XERIAL_BLOCK):
        block = bytes(_cramjam.snappy.compress_raw(data[i:i + _XERIAL_BLOCK]))
        out.append(struct.pack(">i", len(block)))
        out.append(block)
    return b"".join(out)


def _snappy_decompress(data: bytes) -> bytes:
    if not data.startswith(_XERIAL_MAGIC) or len(data) < 16:
        return bytes(_cramjam.snappy.decompress_raw(data))
    out = []
    pos = 16
    while pos < len(data):
        if pos + 4 > len(data):
            raise ValueError("truncated xerial snappy block length")
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise ValueError(f"xerial snappy block of {n} bytes runs past the data")
        out.append(bytes(_cramjam.snappy.decompress_raw(data[pos:pos + n])))
        pos += n
    return b"".join(out)


# -- lz4 (Kafka's frame) ------------------------------------------------------------------------
_LZ4_MAGIC = 0x184D2204
_LZ4_BLOCK = 64 * 1024
_LZ4_BLOCK_SIZES = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}


def _lz4_hc(header: bytes) -> int:
    return (_xxhash.xxh32_intdigest(header) >> 8) & 0xFF


def _lz4_compress(data: bytes, level: int, magic: int) -> bytes:
    flg, bd = 0x60, 4 << 4          # version 01, independent blocks; 64 KiB blocks
    head = struct.pack("<IBB", _LZ4_MAGIC, flg, bd)
    hc = _lz4_hc(head if magic == 0 else head[4:])     # v0: Kafka's broken checksum
    out = [head, bytes([hc])]
    mode: Literal["default", "high_compression"] = "high_compression" if level > 9 else "default"
    for i in range(0, len(data), _LZ4_BLOCK):
        raw = data[i:i + _LZ4_BLOCK]
        comp = bytes(_cramjam.lz4.compress_block(raw, mode=mode, compression=level,
                                                  store_size=False))
        if len(comp) >= len(raw):
            out.append(struct.pack("<I", len(raw) | 0x80000000))
            out.append(raw)
        else:
            out.append(struct.pack("<I", len(comp)))
            out.append(comp)
    out.append(b"\x00\x00\x00\x00")
    return b"".join(out)


def _lz4_decompress(data: bytes, magic: int) -> bytes:
    if len(data) < 7 or struct.unpack_from("<I", data, 0)[0] != _LZ4_MAGIC:
        raise ValueError("not an LZ4 frame (bad magic)")
    flg, bd = data[4], data[5]
    if flg >> 6 != 1:
        raise ValueError(f"unsupported LZ4 frame version {flg >> 6}")
    if not flg & 0x20:
        raise ValueError("LZ4 frames with dependent blocks are not supported (neither by Kafka)")
    block_checksum, content_size, _content_checksum = flg & 0x10, flg & 0x08, flg & 0x04
    max_block = _LZ4_BLOCK_SIZES.get((bd >> 4) & 7)
    if max_block is None:
        raise ValueError(f"unsupported LZ4 block size code {(bd >> 4) & 7}")
    hlen = 6 + (8 if content_size else 0)
    if len(data) < hlen + 1:
        raise ValueError("truncated LZ4 frame header")
    hc = data[hlen]
    if hc != _lz4_hc(data[4:hlen]) and not (magic == 0 and hc == _lz4_hc(data[:hlen])):
        raise ValueError("LZ4 frame header checksum mismatch")
    pos = hlen + 1
    out = []
    scratch = bytearray(max_block)
    while True:
        if pos + 4 > len(data):
            raise ValueError("truncated LZ4 frame: no end mark")
        (n,) = struct.unpack_from("<I", data, pos)
        pos += 4
        if n == 0:
            break
        raw, n = n & 0x80000000, n & 0x7FFFFFFF
        if pos + n > len(data) or n > max_block:
            raise ValueError(f"LZ4 block of {n} bytes runs past the frame or its block size")
        block = data[pos:pos + n]
        pos += n + (4 if block_checksum else 0)
        if raw:
            out.append(bytes(block))
        else:
            k = _cramjam.lz4.decompress_block_into(bytes(block), scratch)
            out.append(bytes(scratch[:k]))
    return b"".join(out)


# -- entry points used by the core ----------------------------------------------------------------
def decompress(codec: int, data: bytes, magic: int = 2) -> bytes:
    """Decompress one batch's (or legacy wrapper's) payload."""
    if codec == GZIP:
        d = zlib.decompressobj(wbits=31)
        out = d.decompress(data)
        while d.eof and d.unused_data:            # concatenated gzip members
            rest = d.unused_data
            d = zlib.decompressobj(wbits=31)
            out += d.decompress(rest)
        if not d.eof:
            raise ValueError("truncated gzip stream")
        return out
    if not available(codec):
        raise _unsupported(codec)
    if codec == SNAPPY:
        return _snappy_decompress(data)
    if codec == LZ4:
        return _lz4_decompress(data, magic)
    if codec == ZSTD:
        return bytes(_cramjam.zstd.decompress(data))
    raise _unsupported(codec)


def compress(codec: int, data: bytes, level=None, magic: int = 2) -> bytes:
    """Compress one batch's payload at `level` (None: Kafka's default for the codec; gzip's -1
    is Deflater's default, 6)."""
    if level is None:
        level = DEFAULT_LEVELS.get(codec, -1)
    if codec == GZIP:
        c = zlib.compressobj(DEFAULT_LEVELS[GZIP] if level < 0 else level, zlib.DEFLATED, 31)
        return c.compress(data) + c.flush()
    if not available(codec):
        raise _unsupported(codec)
    if codec == SNAPPY:
        return _snappy_compress(data)
    if codec == LZ4:
        return _lz4_compress(data, level, magic)
    if codec == ZSTD:
        return bytes(_cramjam.zstd.compress(data, level))
    raise _unsupported(codec)


_core.set_codecs(decompress, compress)
