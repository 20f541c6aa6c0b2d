// VNNI's operand layout from rows of bytes, shared by the tile GEMM's packing (gemm_amx.cpp) and the direct
// grouped kernel's (grouped.cpp).
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>

namespace rq {

// four k (16 consecutive indices each) -> one VNNI row: index n's four bytes in dword n
inline __m512i interleave4(__m128i c0, __m128i c1, __m128i c2, __m128i c3) {
    const __m128i a = _mm_unpacklo_epi8(c0, c1), b = _mm_unpackhi_epi8(c0, c1);
    const __m128i c = _mm_unpacklo_epi8(c2, c3), d = _mm_unpackhi_epi8(c2, c3);
    __m512i v = _mm512_castsi128_si512(_mm_unpacklo_epi16(a, c));
    v = _mm512_inserti32x4(v, _mm_unpackhi_epi16(a, c), 1);
    v = _mm512_inserti32x4(v, _mm_unpacklo_epi16(b, d), 2);
    return _mm512_inserti32x4(v, _mm_unpackhi_epi16(b, d), 3);
}

}  // namespace rq
#endif
