/* MurmurHash3 x64 128-bit for kstore/_compact.pyx (the cleaner's dedupe map). */
#ifndef KSTORE_MURMUR3_H
#define KSTORE_MURMUR3_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>

/* MurmurHash3 x64 128-bit (public domain, Austin Appleby): the cleaner's key hash. 128 bits
 * like Kafka's MD5, several times faster; collisions between distinct keys are ~2^-128. */
static inline uint64_t ks_rotl64(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
static inline uint64_t ks_fmix64(uint64_t k)
{
    k ^= k >> 33; k *= 0xff51afd7ed558ccdULL; k ^= k >> 33; k *= 0xc4ceb9fe1a85ec53ULL; k ^= k >> 33;
    return k;
}
static void ks_murmur3_128(const unsigned char *data, size_t len, uint64_t out[2])
{
    const size_t nblocks = len / 16;
    uint64_t h1 = 0x9747b28cULL, h2 = 0x9747b28cULL;
    const uint64_t c1 = 0x87c37b91114253d5ULL, c2 = 0x4cf5ad432745937fULL;
    size_t i;
    for (i = 0; i < nblocks; i++) {
        uint64_t k1, k2;
        memcpy(&k1, data + i * 16, 8); memcpy(&k2, data + i * 16 + 8, 8);
        k1 *= c1; k1 = ks_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        h1 = ks_rotl64(h1, 27); h1 += h2; h1 = h1 * 5 + 0x52dce729;
        k2 *= c2; k2 = ks_rotl64(k2, 33); k2 *= c1; h2 ^= k2;
        h2 = ks_rotl64(h2, 31); h2 += h1; h2 = h2 * 5 + 0x38495ab5;
    }
    {
        const unsigned char *tail = data + nblocks * 16;
        uint64_t k1 = 0, k2 = 0;
        switch (len & 15) {
        case 15: k2 ^= ((uint64_t)tail[14]) << 48; /* fall through */
        case 14: k2 ^= ((uint64_t)tail[13]) << 40; /* fall through */
        case 13: k2 ^= ((uint64_t)tail[12]) << 32; /* fall through */
        case 12: k2 ^= ((uint64_t)tail[11]) << 24; /* fall through */
        case 11: k2 ^= ((uint64_t)tail[10]) << 16; /* fall through */
        case 10: k2 ^= ((uint64_t)tail[9]) << 8;   /* fall through */
        case 9:  k2 ^= ((uint64_t)tail[8]);
                 k2 *= c2; k2 = ks_rotl64(k2, 33); k2 *= c1; h2 ^= k2; /* fall through */
        case 8:  k1 ^= ((uint64_t)tail[7]) << 56; /* fall through */
        case 7:  k1 ^= ((uint64_t)tail[6]) << 48; /* fall through */
        case 6:  k1 ^= ((uint64_t)tail[5]) << 40; /* fall through */
        case 5:  k1 ^= ((uint64_t)tail[4]) << 32; /* fall through */
        case 4:  k1 ^= ((uint64_t)tail[3]) << 24; /* fall through */
        case 3:  k1 ^= ((uint64_t)tail[2]) << 16; /* fall through */
        case 2:  k1 ^= ((uint64_t)tail[1]) << 8;  /* fall through */
        case 1:  k1 ^= ((uint64_t)tail[0]);
                 k1 *= c1; k1 = ks_rotl64(k1, 31); k1 *= c2; h1 ^= k1;
        }
    }
    h1 ^= len; h2 ^= len;
    h1 += h2; h2 += h1;
    h1 = ks_fmix64(h1); h2 = ks_fmix64(h2);
    h1 += h2; h2 += h1;
    out[0] = h1; out[1] = h2;
}

#endif
