/*
 * SHA-256 (FIPS 180-4) of two messages at once with the x86 SHA extensions.
 *
 * The compression function works on the state as two registers, ABEF and
 * CDGH. Each group of four rounds takes four message words W[t..t+3] plus
 * their constants; sha256rnds2 does two rounds, so a group is two of them.
 * For t >= 16 the words come from the schedule:
 *   W[g] = msg2(msg1(W[g-4], W[g-3]) + alignr(W[g-1], W[g-2], 4), W[g-1])
 * where msg1 adds sigma0 of the next word, alignr brings in W[t-7] and
 * msg2 adds sigma1 of W[t-2]. Hashing two blocks of two messages side by
 * side gives the CPU two independent chains of sha256rnds2 to overlap.
 */
#include "chashlanes.h"
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t initial[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

#define SHA_TARGET __attribute__((target("sha,sse4.1,ssse3")))

/* a..h <-> ABEF, CDGH. */
SHA_TARGET static inline void load_state(const uint32_t s[8], __m128i *abef, __m128i *cdgh) {
    __m128i dcba = _mm_loadu_si128((const __m128i *)&s[0]);
    __m128i hgfe = _mm_loadu_si128((const __m128i *)&s[4]);
    __m128i cdab = _mm_shuffle_epi32(dcba, 0xB1);
    __m128i efgh = _mm_shuffle_epi32(hgfe, 0x1B);
    *abef = _mm_alignr_epi8(cdab, efgh, 8);
    *cdgh = _mm_blend_epi16(efgh, cdab, 0xF0);
}

SHA_TARGET static inline void store_state(uint32_t s[8], __m128i abef, __m128i cdgh) {
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&s[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&s[4], _mm_alignr_epi8(dchg, feba, 8));
}

/* Four rounds, group g (0..15) of a block at p; W is a ring of the last four word groups. */
#define GROUP(g, W, abef, cdgh, p) do {                                                              \
        if ((g) < 4) {                                                                               \
            W[(g) & 3] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)((p) + 16 * (g))), bswap); \
        } else {                                                                                     \
            __m128i sum = _mm_add_epi32(_mm_sha256msg1_epu32(W[(g) & 3], W[((g) + 1) & 3]),          \
                                        _mm_alignr_epi8(W[((g) + 3) & 3], W[((g) + 2) & 3], 4));     \
            W[(g) & 3] = _mm_sha256msg2_epu32(sum, W[((g) + 3) & 3]);                               \
        }                                                                                            \
        __m128i words = _mm_add_epi32(W[(g) & 3], _mm_loadu_si128((const __m128i *)&K[4 * (g)]));   \
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, words);                                             \
        abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(words, 0x0E));                    \
    } while (0)

#define BSWAP_WORDS _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL)

SHA_TARGET static void blocks_one(uint32_t s[8], const uint8_t *p, size_t blocks) {
    const __m128i bswap = BSWAP_WORDS;
    __m128i abef, cdgh, W[4];
    load_state(s, &abef, &cdgh);
    for (; blocks > 0; blocks--, p += 64) {
        __m128i abef0 = abef, cdgh0 = cdgh;
#pragma clang loop unroll(full)
        for (int g = 0; g < 16; g++) GROUP(g, W, abef, cdgh, p);
        abef = _mm_add_epi32(abef, abef0);
        cdgh = _mm_add_epi32(cdgh, cdgh0);
    }
    store_state(s, abef, cdgh);
}

SHA_TARGET static void blocks_two(uint32_t s1[8], const uint8_t *p1, uint32_t s2[8], const uint8_t *p2, size_t blocks) {
    const __m128i bswap = BSWAP_WORDS;
    __m128i abef1, cdgh1, abef2, cdgh2, W1[4], W2[4];
    load_state(s1, &abef1, &cdgh1);
    load_state(s2, &abef2, &cdgh2);
    for (; blocks > 0; blocks--, p1 += 64, p2 += 64) {
        __m128i abef10 = abef1, cdgh10 = cdgh1, abef20 = abef2, cdgh20 = cdgh2;
#pragma clang loop unroll(full)
        for (int g = 0; g < 16; g++) {
            GROUP(g, W1, abef1, cdgh1, p1);
            GROUP(g, W2, abef2, cdgh2, p2);
        }
        abef1 = _mm_add_epi32(abef1, abef10);
        cdgh1 = _mm_add_epi32(cdgh1, cdgh10);
        abef2 = _mm_add_epi32(abef2, abef20);
        cdgh2 = _mm_add_epi32(cdgh2, cdgh20);
    }
    store_state(s1, abef1, cdgh1);
    store_state(s2, abef2, cdgh2);
}

/* The padded end of a message of `total` bytes whose last `count` (< 64)
 * are at `rest`: one or two blocks into `out`; returns how many. */
static size_t padded_end(const uint8_t *rest, size_t count, uint64_t total, uint8_t out[128]) {
    memset(out, 0, 128);
    memcpy(out, rest, count);
    out[count] = 0x80;
    size_t blocks = count + 9 <= 64 ? 1 : 2;
    uint64_t bits = total * 8;
    for (int i = 0; i < 8; i++) out[blocks * 64 - 1 - i] = (uint8_t)(bits >> (8 * i));
    return blocks;
}

static void big_endian(const uint32_t s[8], uint8_t out[32]) {
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s[i] >> 8);
        out[4 * i + 3] = (uint8_t)s[i];
    }
}

int ubq_sha256_lanes_available(void) {
    static int known = -1;
    if (known >= 0) return known;
    unsigned a, b, c, d;
    int yes = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSSE3) && (c & bit_SSE4_1)
        && __get_cpuid_max(0, 0) >= 7 && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
    known = yes;
    return yes;
}

int ubq_sha256_two(const void *first, size_t first_count, uint8_t first_digest[32],
                   const void *second, size_t second_count, uint8_t second_digest[32]) {
    if (!ubq_sha256_lanes_available()) return -1;
    const uint8_t *p1 = first, *p2 = second;
    uint32_t s1[8], s2[8];
    memcpy(s1, initial, sizeof s1);
    memcpy(s2, initial, sizeof s2);
    size_t b1 = first_count / 64, b2 = second_count / 64, both = b1 < b2 ? b1 : b2;
    blocks_two(s1, p1, s2, p2, both);
    blocks_one(s1, p1 + 64 * both, b1 - both);
    blocks_one(s2, p2 + 64 * both, b2 - both);
    uint8_t end1[128], end2[128];
    size_t e1 = padded_end(p1 + 64 * b1, first_count % 64, first_count, end1);
    size_t e2 = padded_end(p2 + 64 * b2, second_count % 64, second_count, end2);
    if (e1 == e2) {
        blocks_two(s1, end1, s2, end2, e1);
    } else {
        blocks_one(s1, end1, e1);
        blocks_one(s2, end2, e2);
    }
    big_endian(s1, first_digest);
    big_endian(s2, second_digest);
    return 0;
}

#else

int ubq_sha256_lanes_available(void) { return 0; }

int ubq_sha256_two(const void *first, size_t first_count, uint8_t first_digest[32],
                   const void *second, size_t second_count, uint8_t second_digest[32]) {
    (void)first; (void)first_count; (void)first_digest;
    (void)second; (void)second_count; (void)second_digest;
    return -1;
}

#endif
