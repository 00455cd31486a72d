"""Input text as Kafka's console producer turns it into record bytes: its LineMessageReader
reads an InputStreamReader(UTF-8) and sends line.getBytes(UTF-8), so every malformed UTF-8
sequence becomes U+FFFD (EF BF BD), one per malformed sequence as the JDK's UTF-8 decoder cuts
them (an encoded surrogate ED A0 80 is one; Python's "replace" makes three). Valid UTF-8 is
left as it is, untouched and uncopied.
"""
from __future__ import annotations

import codecs

_HANDLER = "kstore-java-utf8-replace"


def _cont(b: int) -> bool:
    return b & 0xC0 == 0x80


def malformed_length(data: bytes, i: int) -> int:
    """How many bytes at data[i] the JDK's UTF-8 decoder (sun.nio.cs.UTF_8, decodeArrayLoop and
    malformedN) replaces with one U+FFFD; data ends the input (a truncated sequence at its end
    is one malformed input, CharsetDecoder's end-of-input rule)."""
    rem = len(data) - i
    b1 = data[i]
    if 0xC2 <= b1 <= 0xDF:                               # 2 bytes: the second is no continuation
        return 1
    if 0xE0 <= b1 <= 0xEF:                               # 3 bytes
        bad2 = rem > 1 and ((b1 == 0xE0 and data[i + 1] & 0xE0 == 0x80) or not _cont(data[i + 1]))
        if rem < 3:
            return 1 if bad2 else rem
        if bad2:
            return 1
        return 2 if not _cont(data[i + 2]) else 3        # 3: an encoded surrogate
    if 0xF0 <= b1 <= 0xF7:                               # 4 bytes
        def bad_first(b2: int) -> bool:
            return (b1 > 0xF4 or (b1 == 0xF0 and not 0x90 <= b2 <= 0xBF)
                    or (b1 == 0xF4 and b2 & 0xF0 != 0x80) or not _cont(b2))
        if rem < 4:
            if b1 > 0xF4 or (rem > 1 and bad_first(data[i + 1])):
                return 1
            if rem > 2 and not _cont(data[i + 2]):
                return 2
            return rem
        if bad_first(data[i + 1]):
            return 1
        return 2 if not _cont(data[i + 2]) else 3
    return 1                                             # 80-C1, F8-FF


def _replace(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeDecodeError):
        raise exc
    return "\ufffd", exc.start + malformed_length(exc.object, exc.start)


codecs.register_error(_HANDLER, _replace)


def as_java_text(data: bytes, end: int) -> bytes:
    """data with its first `end` bytes (whole lines: a sequence cut at `end` counts as
    malformed) as Kafka's console producer would send them: data itself when they are valid
    UTF-8 (the usual case, checked at C speed), else re-encoded with the JDK's replacements."""
    if data.isascii():
        return data
    head = memoryview(data)[:end]
    try:
        codecs.utf_8_decode(head, "strict", True)
        return data
    except UnicodeDecodeError:
        return bytes(head).decode("utf-8", _HANDLER).encode("utf-8") + data[end:]
