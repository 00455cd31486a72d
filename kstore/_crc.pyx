# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# cython: embedsignature=True
"""CRC-32C (Kafka v2 batches) and CRC-32 (v0/v1 messages): tables built in C at import, the
CPU's crc32 instruction for CRC-32C where it exists (kstore/_crc.h)."""
from libc.stdint cimport uint8_t, uint32_t

cdef extern from "_crc.h" nogil:
    uint32_t ks_crc32c(uint32_t crc, const unsigned char *p, size_t n)
    uint32_t ks_crc32c_table(uint32_t crc, const unsigned char *p, size_t n)
    uint32_t ks_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
    uint32_t ks_crc32(uint32_t crc, const unsigned char *p, size_t n)
    void ks_crc_init()
    int ks_cpu_has_crc32c()
    int ks_crc32c_use_hw
    int KS_HAVE_HW_CRC

ks_crc_init()


cdef uint32_t crc32c_update(uint32_t crc, const uint8_t* p, size_t n) noexcept nogil:
    return ks_crc32c(crc, p, n)


cdef uint32_t crc32_update(uint32_t crc, const uint8_t* p, size_t n) noexcept nogil:
    return ks_crc32(crc, p, n)


def crc32c_implementation() -> str:
    """'sse4.2' when the CPU's crc32 instruction is in use, else 'table'."""
    return "sse4.2" if ks_crc32c_use_hw else "table"


def _force_table_crc(bint force) -> None:
    """Test hook: use the table path even where the instruction exists."""
    global ks_crc32c_use_hw
    ks_crc32c_use_hw = 0 if force else (1 if (KS_HAVE_HW_CRC and ks_cpu_has_crc32c()) else 0)


def crc32c(data, uint32_t value=0):
    """CRC-32C (Castagnoli) of a bytes-like object; chainable like zlib.crc32."""
    cdef const uint8_t[::1] mv = data
    cdef uint32_t r
    with nogil:
        r = ks_crc32c(value, &mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])
    return r


def crc32c_table(data, uint32_t value=0):
    """CRC-32C through the software table only (the fallback path)."""
    cdef const uint8_t[::1] mv = data
    cdef uint32_t r
    with nogil:
        r = ks_crc32c_table(value, &mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])
    return r


def crc32c_hw(data, uint32_t value=0):
    """CRC-32C through the crc32 instruction; raises RuntimeError if the CPU lacks it."""
    if not (KS_HAVE_HW_CRC and ks_cpu_has_crc32c()):
        raise RuntimeError("this CPU/build has no crc32 instruction")
    cdef const uint8_t[::1] mv = data
    cdef uint32_t r
    with nogil:
        r = ks_crc32c_hw(value, &mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])
    return r


def crc32(data, uint32_t value=0):
    """CRC-32 (IEEE, as zlib.crc32): the checksum of Kafka v0/v1 messages."""
    cdef const uint8_t[::1] mv = data
    cdef uint32_t r
    with nogil:
        r = ks_crc32(value, &mv[0] if mv.shape[0] else <const uint8_t*>"", mv.shape[0])
    return r
