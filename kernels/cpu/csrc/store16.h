// 16 int32 sums of one row of C written as the GEMMs' epilogue writes them (gemm_amx.cpp, grouped.cpp): int32, or
// float32 v * scale, or that value rounded to bfloat16; one definition, so both kernels' outputs are bit for bit
// the same.
#pragma once

#ifdef __AVX512F__
#include <immintrin.h>

#include <cstdint>

#include "bf16.h"
#include "gemm_operand.h"

namespace rq {

// `scale` from the first of the 16 (a per-column scale: its 16 values from there)
inline void store16(__m512i v, __mmask16 m, void* c, int64_t at, OutScale scale, bool bf16) {
    if (!scale) {
        _mm512_mask_storeu_epi32(static_cast<int32_t*>(c) + at, m, v);
        return;
    }
    const __m512 s = scale.axis == 1 ? _mm512_maskz_loadu_ps(m, scale.v) : _mm512_set1_ps(*scale.v);
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), s);
    if (!bf16) {
        float* out = static_cast<float*>(c) + at;
        if (scale.add) f = _mm512_add_ps(_mm512_maskz_loadu_ps(m, out), f);  // fl(C + fl(acc * scale))
        if (scale.stream && m == (__mmask16)0xFFFF && reinterpret_cast<uintptr_t>(out) % 64 == 0)
            _mm512_stream_ps(out, f);
        else
            _mm512_mask_storeu_ps(out, m, f);
        return;
    }
    const __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(round_bf16x16(f)), 16);
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(c) + at, m, _mm512_cvtepi32_epi16(bits));
}

}  // namespace rq
#endif
