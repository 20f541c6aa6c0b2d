// Philox4x32-10 on the CPU: the same function as kernels/cuda/philox.cuh (Salmon et al., SC 2011), scalar,
// 8 lanes at a time with AVX2 and 16 with AVX-512, so the CPU and the GPU draw the same noise for the same key
// and element.
//
// The stream (shared with the CUDA quantizer): a tensor is read as rows x L, L its last dimension and a row
// every index of the other dimensions in row-major order; element (r, j) takes word j % 4 of
// philox(counter = (r low, r high, j / 4, 0), key = (k0, k1)), and u = (word >> 8) * 2^-24 in [0, 1).
#pragma once

#include <cstdint>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace rq {

constexpr uint32_t PHILOX_M0 = 0xD2511F53u, PHILOX_M1 = 0xCD9E8D57u;
constexpr uint32_t PHILOX_W0 = 0x9E3779B9u, PHILOX_W1 = 0xBB67AE85u;

inline void philox(uint32_t c[4], uint32_t k0, uint32_t k1) {
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {
            k0 += PHILOX_W0;
            k1 += PHILOX_W1;
        }
        const uint64_t p0 = (uint64_t)PHILOX_M0 * c[0], p1 = (uint64_t)PHILOX_M1 * c[2];
        const uint32_t n0 = (uint32_t)(p1 >> 32) ^ c[1] ^ k0, n2 = (uint32_t)(p0 >> 32) ^ c[3] ^ k1;
        c[0] = n0;
        c[1] = (uint32_t)p1;
        c[2] = n2;
        c[3] = (uint32_t)p0;
    }
}

inline float uniform_of(uint32_t word) { return (float)(word >> 8) * 5.9604644775390625e-08f; }  // 2^-24

// u of element (r, j): one Philox call per element (scalar paths, tails)
inline float philox_uniform(uint64_t r, uint64_t j, uint32_t k0, uint32_t k1) {
    uint32_t c[4] = {(uint32_t)r, (uint32_t)(r >> 32), (uint32_t)(j >> 2), 0u};
    philox(c, k0, k1);
    return uniform_of(c[j & 3]);
}

#ifdef __AVX2__
// The round keys of one call, broadcast: 10 x (k0, k1).
struct PhiloxKeys {
    __m256i k0[10], k1[10];
    PhiloxKeys(uint32_t a, uint32_t b) {
        for (int i = 0; i < 10; ++i) {
            k0[i] = _mm256_set1_epi32((int)a);
            k1[i] = _mm256_set1_epi32((int)b);
            a += PHILOX_W0;
            b += PHILOX_W1;
        }
    }
};

// (hi, lo) of the 32 x 32 -> 64-bit products a * m, lane by lane
static inline void mul_hilo(__m256i a, __m256i m, __m256i& hi, __m256i& lo) {
    const __m256i even = _mm256_mul_epu32(a, m);                          // lanes 0, 2, 4, 6 as 64-bit
    const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);  // lanes 1, 3, 5, 7
    hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

// 8 Philox4x32-10 calls at once: counters (c0..c3 per lane) in, the four words per lane out in place.
static inline void philox8(__m256i& c0, __m256i& c1, __m256i& c2, __m256i& c3, const PhiloxKeys& key) {
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    for (int round = 0; round < 10; ++round) {
        __m256i hi0, lo0, hi1, lo1;
        mul_hilo(c0, m0, hi0, lo0);
        mul_hilo(c2, m1, hi1, lo1);
        const __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), key.k0[round]);
        const __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), key.k1[round]);
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
}

// two independent sets of 8 calls, their rounds (from r0) interleaved: each round's multiplies wait for the
// last round's, and a second chain fills those cycles (about 1.6x the rate of one chain, measured)
static inline void philox8x2_rounds(__m256i& a0, __m256i& a1, __m256i& a2, __m256i& a3, __m256i& b0, __m256i& b1,
                                    __m256i& b2, __m256i& b3, const PhiloxKeys& key, int r0) {
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    for (int round = r0; round < 10; ++round) {
        __m256i ahi0, alo0, ahi1, alo1, bhi0, blo0, bhi1, blo1;
        mul_hilo(a0, m0, ahi0, alo0);
        mul_hilo(b0, m0, bhi0, blo0);
        mul_hilo(a2, m1, ahi1, alo1);
        mul_hilo(b2, m1, bhi1, blo1);
        const __m256i an0 = _mm256_xor_si256(_mm256_xor_si256(ahi1, a1), key.k0[round]);
        const __m256i bn0 = _mm256_xor_si256(_mm256_xor_si256(bhi1, b1), key.k0[round]);
        const __m256i an2 = _mm256_xor_si256(_mm256_xor_si256(ahi0, a3), key.k1[round]);
        const __m256i bn2 = _mm256_xor_si256(_mm256_xor_si256(bhi0, b3), key.k1[round]);
        a0 = an0;
        a1 = alo1;
        a2 = an2;
        a3 = alo0;
        b0 = bn0;
        b1 = blo1;
        b2 = bn2;
        b3 = blo0;
    }
}

static inline void philox8x2(__m256i& a0, __m256i& a1, __m256i& a2, __m256i& a3, __m256i& b0, __m256i& b1,
                             __m256i& b2, __m256i& b3, const PhiloxKeys& key) {
    philox8x2_rounds(a0, a1, a2, a3, b0, b1, b2, b3, key, 0);
}

// philox8x2 for calls whose counters differ only in their first word: (c0, 0, j4, 0), as the channels-last
// quantizer's calls of one work item (rows below 2^32, one j / 4). Round 0's product M1 * j4 and round 1's
// M0 * (its output) are then the same in every lane, one scalar product each instead of two vector ones:
// the same words, 7-8% faster (measured alone, Zen 3).
static inline void philox8x2_shared(__m256i& a0, __m256i& a1, __m256i& a2, __m256i& a3, __m256i& b0, __m256i& b1,
                                    __m256i& b2, __m256i& b3, uint32_t j4, uint32_t k0, uint32_t k1,
                                    const PhiloxKeys& key) {
    const __m256i m0 = _mm256_set1_epi32((int)PHILOX_M0), m1 = _mm256_set1_epi32((int)PHILOX_M1);
    // round 0: (c0, 0, j4, 0) -> (hi(M1 j4) ^ k0, lo(M1 j4), hi(M0 c0) ^ k1, lo(M0 c0)); the first two shared
    const uint64_t p1 = (uint64_t)PHILOX_M1 * j4;
    const uint32_t s0 = (uint32_t)(p1 >> 32) ^ k0, s1 = (uint32_t)p1;
    __m256i ahi, alo, bhi, blo;
    mul_hilo(a0, m0, ahi, alo);
    mul_hilo(b0, m0, bhi, blo);
    const __m256i a2r = _mm256_xor_si256(ahi, key.k1[0]), b2r = _mm256_xor_si256(bhi, key.k1[0]);
    // round 1: M0 * s0 shared; M1 * (the third word) per lane
    const uint64_t q0 = (uint64_t)PHILOX_M0 * s0;
    __m256i ahi1, alo1, bhi1, blo1;
    mul_hilo(a2r, m1, ahi1, alo1);
    mul_hilo(b2r, m1, bhi1, blo1);
    const __m256i x1 = _mm256_set1_epi32((int)(s1 ^ (k0 + PHILOX_W0)));
    const __m256i x3 = _mm256_set1_epi32((int)((uint32_t)(q0 >> 32) ^ (k1 + PHILOX_W1)));
    a0 = _mm256_xor_si256(ahi1, x1);
    b0 = _mm256_xor_si256(bhi1, x1);
    a1 = alo1;
    b1 = blo1;
    a2 = _mm256_xor_si256(alo, x3);
    b2 = _mm256_xor_si256(blo, x3);
    a3 = b3 = _mm256_set1_epi32((int)(uint32_t)q0);
    philox8x2_rounds(a0, a1, a2, a3, b0, b1, b2, b3, key, 2);
}

static inline __m256 uniform8(__m256i word) {
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(word, 8)), _mm256_set1_ps(5.9604644775390625e-08f));
}
#endif

#ifdef __AVX512F__
// The same calls 16 lanes at a time (a CPU with 512-bit vectors runs twice the elements per instruction).
struct PhiloxKeys16 {
    __m512i k0[10], k1[10];
    PhiloxKeys16(uint32_t a, uint32_t b) {
        for (int i = 0; i < 10; ++i) {
            k0[i] = _mm512_set1_epi32((int)a);
            k1[i] = _mm512_set1_epi32((int)b);
            a += PHILOX_W0;
            b += PHILOX_W1;
        }
    }
};

static inline __m512i xor3_16(__m512i a, __m512i b, __m512i c) { return _mm512_ternarylogic_epi32(a, b, c, 0x96); }

// The 16-lane calls run as four sets of 8 in "slot form": set h's word w in the low 32 bits of each 64-bit
// lane of s[h][w], the high bits ignored, as _mm512_mul_epu32 reads only the low halves. A round then costs
// per set two products, two shifts and two three-way xors, against 18 instructions per 16 lanes when each
// product is split into 32-bit lanes again (even/odd shifts and blends): 0.41-0.49 -> 0.36-0.43 ns a word on
// one thread (Intel AMX, docs/measurements.md).
static inline void philox_slot_rounds(__m512i s[4][4], const PhiloxKeys16& key, int r0) {
    const __m512i m0 = _mm512_set1_epi64(PHILOX_M0), m1 = _mm512_set1_epi64(PHILOX_M1);
    for (int round = r0; round < 10; ++round) {
#pragma GCC unroll 4
        for (int h = 0; h < 4; ++h) {
            const __m512i p0 = _mm512_mul_epu32(s[h][0], m0), p1 = _mm512_mul_epu32(s[h][2], m1);
            s[h][0] = xor3_16(_mm512_srli_epi64(p1, 32), s[h][1], key.k0[round]);
            s[h][2] = xor3_16(_mm512_srli_epi64(p0, 32), s[h][3], key.k1[round]);
            s[h][1] = p1;  // lo(p1) in the low half
            s[h][3] = p0;
        }
    }
}

// the words of sets 0, 1 back into a's 16 lanes (even lanes from set 0, odd from set 1), of sets 2, 3 into b's
static inline void philox_slot_merge(__m512i s[4][4], __m512i* a[4], __m512i* b[4]) {
    for (int w = 0; w < 4; ++w) {
        *a[w] = _mm512_mask_blend_epi32(0xAAAA, s[0][w], _mm512_slli_epi64(s[1][w], 32));
        *b[w] = _mm512_mask_blend_epi32(0xAAAA, s[2][w], _mm512_slli_epi64(s[3][w], 32));
    }
}

// two sets of 16 calls: counters (a0..a3, b0..b3 per lane) in, the four words per lane out in place
static inline void philox16x2(__m512i& a0, __m512i& a1, __m512i& a2, __m512i& a3, __m512i& b0, __m512i& b1,
                              __m512i& b2, __m512i& b3, const PhiloxKeys16& key) {
    __m512i* a[4] = {&a0, &a1, &a2, &a3};
    __m512i* b[4] = {&b0, &b1, &b2, &b3};
    __m512i s[4][4];
    for (int w = 0; w < 4; ++w) {
        s[0][w] = *a[w];
        s[1][w] = _mm512_srli_epi64(*a[w], 32);
        s[2][w] = *b[w];
        s[3][w] = _mm512_srli_epi64(*b[w], 32);
    }
    philox_slot_rounds(s, key, 0);
    philox_slot_merge(s, a, b);
}

// philox16x2 for counters (c0, 0, j4, 0), c0 per lane (a0, b0 in; the channels-last quantizer's calls of one
// work item, rows below 2^32): rounds 0 and 1 share one of their two products, as philox8x2_shared
static inline void philox16x2_shared(__m512i& a0, __m512i& a1, __m512i& a2, __m512i& a3, __m512i& b0, __m512i& b1,
                                     __m512i& b2, __m512i& b3, uint32_t j4, uint32_t k0, uint32_t k1,
                                     const PhiloxKeys16& key) {
    const __m512i m0 = _mm512_set1_epi64(PHILOX_M0), m1 = _mm512_set1_epi64(PHILOX_M1);
    // round 0: (c0, 0, j4, 0) -> (hi(M1 j4) ^ k0, lo(M1 j4), hi(M0 c0) ^ k1, lo(M0 c0)), the first two shared
    const uint64_t p1 = (uint64_t)PHILOX_M1 * j4;
    const uint32_t s0 = (uint32_t)(p1 >> 32) ^ k0, s1 = (uint32_t)p1;
    // round 1: M0 s0 shared, M1 (the third word) per lane
    const uint64_t q0 = (uint64_t)PHILOX_M0 * s0;
    const __m512i x1 = _mm512_set1_epi32((int)(s1 ^ (k0 + PHILOX_W0)));
    const __m512i x3 = _mm512_set1_epi32((int)((uint32_t)(q0 >> 32) ^ (k1 + PHILOX_W1)));
    const __m512i c0[4] = {a0, _mm512_srli_epi64(a0, 32), b0, _mm512_srli_epi64(b0, 32)};
    __m512i s[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < 4; ++h) {
        const __m512i p0 = _mm512_mul_epu32(c0[h], m0);  // round 0
        const __m512i r1 = _mm512_mul_epu32(_mm512_xor_si512(_mm512_srli_epi64(p0, 32), key.k1[0]), m1);  // round 1
        s[h][0] = _mm512_xor_si512(_mm512_srli_epi64(r1, 32), x1);
        s[h][1] = r1;
        s[h][2] = _mm512_xor_si512(p0, x3);  // lo(M0 c0) ^ hi(M0 s0) ^ k1 in the low half
        s[h][3] = _mm512_set1_epi32((int)(uint32_t)q0);
    }
    philox_slot_rounds(s, key, 2);
    __m512i* a[4] = {&a0, &a1, &a2, &a3};
    __m512i* b[4] = {&b0, &b1, &b2, &b3};
    philox_slot_merge(s, a, b);
}

static inline __m512 uniform16(__m512i word) {
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(word, 8)), _mm512_set1_ps(5.9604644775390625e-08f));
}
#endif

}  // namespace rq
