"""atheris entry point for long fuzzing runs of the compiled core (not run in CI).

    python fuzz/fuzz_decode.py -max_len=4096 -runs=10000000 [corpus_dir]

Each input is fed to the record decoders, the header walk, recovery's scan and the columnar
decoder, as bytes read from a hostile disk. Only kstore exceptions are allowed; anything else
(or a sanitizer report under fuzz/build_sanitized.sh) is a finding. Inputs that start with a
byte >= 0x80 are first re-sealed with a valid CRC-32C so they reach the record parser.
"""
import struct
import sys

import atheris

with atheris.instrument_imports():
    import kstore
    from kstore import _core


def one_input(data: bytes) -> None:
    if len(data) >= 61 and data[0] >= 0x80:
        buf = bytearray(data[1:])
        if len(buf) >= 61:
            end = min(len(buf), 12 + int.from_bytes(buf[8:12], "big"))
            if end > 21:
                struct.pack_into(">I", buf, 17, kstore.crc32c(bytes(buf[21:end])))
        data = bytes(buf)
    try:
        _core.decode_batches(data, -1, True, True)
        _core.decode_batches(data, -1, False)
        m = _core.Mapping.from_bytes(data)
        _core.batch_headers(m, 0, len(data))
        _core.recover_scan(m, len(data), 0, 64, 1024, 1024)
        _core.decode_columns(m, 0, len(data), 0, 1 << 62, _core.Columns())
    except kstore.KStoreError:
        pass


def main() -> None:
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
