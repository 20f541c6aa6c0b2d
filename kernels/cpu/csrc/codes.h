// The int8 codes as repro.quant's reference computes them (nearest rounding), shared by the quantizer
// (quantize.cpp) and the kernels that write codes while they make a tensor (norm.cpp): one definition, so
// both give bit-identical codes.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace rq {

constexpr float QMAXF = 127.0f;

static inline bool nonfinite(float v) { return !(std::fabs(v) <= std::numeric_limits<float>::max()); }

// repro.quant's reference: where(s > 0, 127 / s.clamp_min(FLT_MIN), 0), and torch evaluates 127 / s as
// s.reciprocal() * 127 (two roundings; 127.0f / s differs in the last bit for some s)
static inline float inv_scale(float s) {
    return s > 0.0f ? (1.0f / std::fmax(s, std::numeric_limits<float>::min())) * QMAXF : 0.0f;
}

// fmax(v, -127) then fmin(., 127), NaN included (a NaN becomes -127, as fmax returns the other operand), in
// comparisons the compiler inlines: std::fmin / std::fmax stay calls into libm, four of them an element
static inline float clamp_code(float v) {
    v = v > -QMAXF ? v : -QMAXF;
    return v < QMAXF ? v : QMAXF;
}

static inline int8_t code_nearest(float x, float inv) {
    return (int8_t)(int)std::nearbyint(clamp_code(x * inv));
}

#ifdef __AVX2__
static inline __m256 abs8(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// lanes that are NaN or +-Inf
static inline __m256 bad8(__m256 v) {
    return _mm256_cmp_ps(abs8(v), _mm256_set1_ps(std::numeric_limits<float>::max()), _CMP_NLE_UQ);
}

static inline __m256 clamp8(__m256 v) {
    return _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-QMAXF)), _mm256_set1_ps(QMAXF));
}

static inline __m256 codes_nearest8(__m256 x, __m256 inv) {
    return _mm256_round_ps(clamp8(_mm256_mul_ps(x, inv)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// 8 integral floats -> 8 int8 at q, saturating to [-128, 127]
static inline void store8(int8_t* q, __m256 v) {
    const __m256i i = _mm256_cvtps_epi32(v);
    const __m128i p16 = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q), _mm_packs_epi16(p16, p16));
}

// 32 integral floats (four vectors, in order) -> 32 int8 at q, saturating as store8: two packs and one
// permutation for the four vectors, where store8 takes an extract and two packs for each (the shuffle unit
// held up the stochastic rounding's element loop, measured)
static inline void store32(int8_t* q, __m256 v0, __m256 v1, __m256 v2, __m256 v3) {
    const __m256i p01 = _mm256_packs_epi32(_mm256_cvtps_epi32(v0), _mm256_cvtps_epi32(v1));
    const __m256i p23 = _mm256_packs_epi32(_mm256_cvtps_epi32(v2), _mm256_cvtps_epi32(v3));
    const __m256i b = _mm256_packs_epi16(p01, p23);  // 4-byte groups per 128-bit lane: v0, v1, v2, v3
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                        _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}
#endif

#ifdef __AVX512F__
static inline __m512 abs16(__m512 v) { return _mm512_abs_ps(v); }

static inline __m512 clamp16(__m512 v) {
    return _mm512_min_ps(_mm512_max_ps(v, _mm512_set1_ps(-QMAXF)), _mm512_set1_ps(QMAXF));
}

static inline __m512 codes_nearest16(__m512 x, __m512 inv) {
    return _mm512_roundscale_ps(clamp16(_mm512_mul_ps(x, inv)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// 16 integral floats -> 16 int8 at q, saturating as store8
static inline void store16(int8_t* q, __m512 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
}
#endif

}  // namespace rq
