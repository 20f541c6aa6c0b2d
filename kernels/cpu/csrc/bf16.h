// bfloat16 <-> float32 as torch converts them (round to nearest even, NaN kept a NaN), shared by the
// quantizer's loads and epilogue (quantize.cpp) and the fused BatchNorm's bfloat16 tensors (norm.cpp): one
// definition, so a value rounded in one kernel is the value the other reads.
#pragma once

#include <cstdint>
#include <cstring>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace rq {

static inline float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x40);  // NaN stays NaN
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// f as the float its bfloat16 holds (what a kernel reading the bfloat16 back sees)
static inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

#ifdef __AVX2__
static inline __m256 load_bf16x8(const uint16_t* src) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// f32_to_bf16 on 8 lanes, the same arithmetic, each in the low half of its 32-bit lane
static inline __m256i bf16_bits8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)), 16);
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)), _mm256_set1_epi32(0x7F800000));
    return _mm256_blendv_epi8(r, _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40)), nan);
}

// round_bf16 on 8 lanes for values made by float arithmetic: their NaNs are quiet, so a NaN is kept as it
// is (a blend, not f32_to_bf16's quiet bit: 4 operations fewer) and its upper half stays a NaN's
static inline __m256 round_bf16x8(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lsb)),
                                       _mm256_set1_epi32((int)0xFFFF0000u));
    return _mm256_blendv_ps(_mm256_castsi256_ps(r), v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

// f32_to_bf16 on 8 lanes, stored (a scalar loop over the lanes made the bfloat16 epilogue 4x slower than the
// float32 one, measured on an Intel AMX Xeon)
static inline void store_bf16x8(uint16_t* dst, __m256 v) {
    // values < 2^16: packus keeps them; it packs within 128-bit lanes, the permute puts lanes 0 and 1 together
    const __m256i r = bf16_bits8(v);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm256_castsi256_si128(packed));
}
#endif

#ifdef __AVX512F__
static inline __m512 load_bf16x16(const uint16_t* src) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// round_bf16x8 on 16 lanes
static inline __m512 round_bf16x16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lsb)),
                                       _mm512_set1_epi32((int)0xFFFF0000u));
    return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), v);
}
#endif

}  // namespace rq
