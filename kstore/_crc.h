/* CRC-32C (Castagnoli, Kafka v2 batches) and CRC-32 (IEEE, Kafka v0/v1 messages) for
 * kstore/_crc.pyx, the only file that includes this header.  The software path is slice-by-8
 * over tables built here by ks_crc_init() at import (reflected polynomials 0x82F63B78 and
 * 0xEDB88320; the tests check them against crcmod); on x86-64 with SSE4.2 the CRC-32C path uses
 * the crc32 instruction, chosen at run time.  All functions take and return finalized CRCs, like
 * zlib.crc32(data, value). */
#ifndef KSTORE_CRC_H
#define KSTORE_CRC_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

static uint32_t ks_crc32c_tab[8][256];
static uint32_t ks_crc32_tab[8][256];
static int ks_crc32c_use_hw = 0;

/* Slice-by-8 tables of the reflected CRC with polynomial `poly`: t[0] is the classic bytewise
 * table, t[k] advances a byte k further. */
static void ks_fill_tables(uint32_t t[8][256], uint32_t poly)
{
    int i, k;
    for (i = 0; i < 256; i++) {
        uint32_t c = (uint32_t)i;
        for (k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
        t[0][i] = c;
    }
    for (i = 0; i < 256; i++) {
        uint32_t c = t[0][i];
        for (k = 1; k < 8; k++) { c = t[0][c & 0xff] ^ (c >> 8); t[k][i] = c; }
    }
}

static uint32_t ks_crc_sw(uint32_t t[8][256], uint32_t crc, const unsigned char *p, size_t n)
{
    crc = ~crc;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (n && ((uintptr_t)p & 7)) { crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8); n--; }
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4); memcpy(&hi, p + 4, 4);
        lo ^= crc;
        crc = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
              t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
        p += 8; n -= 8;
    }
#endif
    while (n--) crc = t[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define KS_HAVE_HW_CRC 1

/* Three independent streams hide the 3-cycle latency of crc32; the partial CRCs are merged
 * by shifting through zero bytes with the same instruction-free table method (crc of zeros is
 * linear), using one multiply-by-x^(8*block) table per block size.  The blocks are tiered:
 * 16 KiB streams while 48 KiB are left, then 4 KiB, then 1 KiB, the rest on one stream.  From
 * memory rather than cache the long blocks matter: three streams 1 KiB apart ran a 126 KB
 * batch at ~6 GB/s (the prefetcher sees three short runs per 3 KiB), 16 KiB apart at ~15 GB/s
 * (AMD EPYC, one core; in cache both run at ~21 GB/s). */
#define KS_TIERS 3
static const size_t ks_tier_blk[KS_TIERS] = {16384, 4096, 1024};
static uint32_t ks_crc32c_shift_tab[KS_TIERS][4][256];   /* multiply-by-x^(8*blk), bytewise */
#define KS_PREFETCH 1024

__attribute__((target("sse4.2")))
static uint64_t ks_crc32c_hw_raw(uint64_t c, const unsigned char *p, size_t n)
{
    while (n && ((uintptr_t)p & 7)) { c = _mm_crc32_u8((uint32_t)c, *p++); n--; }
    while (n >= 8) { uint64_t v; memcpy(&v, p, 8); c = _mm_crc32_u64(c, v); p += 8; n -= 8; }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return c;
}

static inline uint32_t ks_shift(int tier, uint32_t c)
{
    uint32_t (*t)[256] = ks_crc32c_shift_tab[tier];
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

__attribute__((target("sse4.2")))
static uint32_t ks_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c0 = (uint32_t)~crc;
    int tier;
    while (n && ((uintptr_t)p & 7)) { c0 = _mm_crc32_u8((uint32_t)c0, *p++); n--; }
    for (tier = 0; tier < KS_TIERS; tier++) {
        const size_t blk = ks_tier_blk[tier];
        while (n >= 3 * blk) {
            uint64_t c1 = 0, c2 = 0;
            const unsigned char *p1 = p + blk, *p2 = p + 2 * blk;
            size_t i, j;
            for (i = 0; i < blk; i += 64) {
                /* a hint only: never faults, past the data included */
                __builtin_prefetch(p + i + KS_PREFETCH);
                __builtin_prefetch(p1 + i + KS_PREFETCH);
                __builtin_prefetch(p2 + i + KS_PREFETCH);
                for (j = i; j < i + 64; j += 8) {
                    uint64_t v0, v1, v2;
                    memcpy(&v0, p + j, 8); memcpy(&v1, p1 + j, 8); memcpy(&v2, p2 + j, 8);
                    c0 = _mm_crc32_u64(c0, v0); c1 = _mm_crc32_u64(c1, v1);
                    c2 = _mm_crc32_u64(c2, v2);
                }
            }
            /* state after block0 shifted over block1, xor block1's zero-init state, and so on */
            c0 = ks_shift(tier, (uint32_t)c0) ^ (uint32_t)c1;
            c0 = ks_shift(tier, (uint32_t)c0) ^ (uint32_t)c2;
            p += 3 * blk; n -= 3 * blk;
        }
    }
    c0 = ks_crc32c_hw_raw(c0, p, n);
    return ~(uint32_t)c0;
}

/* Raw (unfinalized) register update over n zero bytes, software: used to build the shift tables. */
static uint32_t ks_zeros_sw(uint32_t c, size_t n)
{
    while (n--) c = ks_crc32c_tab[0][c & 0xff] ^ (c >> 8);
    return c;
}

/* The tiers' tables, smallest first: 1 KiB by the software CRC over zeros, each larger one by
 * applying the one before it four times (a shift over zeros is linear in the register). */
static void ks_init_shift(void)
{
    int i, k, tier, r;
    for (k = 0; k < 4; k++)
        for (i = 0; i < 256; i++)
            ks_crc32c_shift_tab[KS_TIERS - 1][k][i] =
                ks_zeros_sw(((uint32_t)i) << (8 * k), ks_tier_blk[KS_TIERS - 1]);
    for (tier = KS_TIERS - 2; tier >= 0; tier--)
        for (k = 0; k < 4; k++)
            for (i = 0; i < 256; i++) {
                uint32_t c = ((uint32_t)i) << (8 * k);
                for (r = 0; r < (int)(ks_tier_blk[tier] / ks_tier_blk[tier + 1]); r++)
                    c = ks_shift(tier + 1, c);
                ks_crc32c_shift_tab[tier][k][i] = c;
            }
}

static int ks_cpu_has_crc32c(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2");
}
#else
#define KS_HAVE_HW_CRC 0
static uint32_t ks_crc32c_hw(uint32_t crc, const unsigned char *p, size_t n) { (void)p; (void)n; return crc; }
static void ks_init_shift(void) {}
static int ks_cpu_has_crc32c(void) { return 0; }
#endif

/* Build every table and choose the CRC-32C path (the instruction where the CPU has it). */
static void ks_crc_init(void)
{
    ks_fill_tables(ks_crc32c_tab, 0x82F63B78u);
    ks_fill_tables(ks_crc32_tab, 0xEDB88320u);
    ks_init_shift();
    ks_crc32c_use_hw = (KS_HAVE_HW_CRC && ks_cpu_has_crc32c()) ? 1 : 0;
}

static inline uint32_t ks_crc32c(uint32_t crc, const unsigned char *p, size_t n)
{
    if (ks_crc32c_use_hw) return ks_crc32c_hw(crc, p, n);
    return ks_crc_sw(ks_crc32c_tab, crc, p, n);
}

static inline uint32_t ks_crc32c_table(uint32_t crc, const unsigned char *p, size_t n)
{
    return ks_crc_sw(ks_crc32c_tab, crc, p, n);
}

static inline uint32_t ks_crc32(uint32_t crc, const unsigned char *p, size_t n)
{
    return ks_crc_sw(ks_crc32_tab, crc, p, n);
}

#endif
