// Exact depthwise 2-D convolutions on the CPU (one input channel per output channel), channels-last int8
// operands, int32 results: forward, input gradient and weight gradient, zero padding handled in place.
// As matmuls these were block-diagonal (the GEMM multiplied 63 zeros for every useful product), and the
// padded copies and the stride-2 input gradient's polyphase scatter cost more than the arithmetic
// (measured on MobileNetV2). Here 16 channels share a vector; vpmaddwd adds the products of two taps
// (forward, input gradient) or of two output positions (weight gradient) in one instruction.
//
// Forward and input gradient are one gather: out[position, c] = sum over taps t of src_t[c] * w[c, t],
// src_t a row of the input (forward) or of the output gradient (input gradient), or zeros where tap t
// falls outside.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "bf16.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace rq {

constexpr int64_t DW_PARALLEL_MIN = 1 << 16;  // output elements below which one thread works
constexpr int MAX_TAPS = 64;
// a scaled output of this many bytes and more: non-temporal stores (gemm.cpp's threshold)
constexpr int64_t STREAM_BYTES = 8 << 20;

struct DwGeometry {
    int64_t N, C, H, W, OH, OW;  // input (H, W) and output (OH, OW) sizes
    int KH, KW, sh, sw, ph, pw, dh, dw;
};

#ifdef __AVX2__
static inline __m256i load16(const int8_t* p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// vpmaddwd on unpacklo/hi pairs leaves channels (0-3, 8-11) in lo and (4-7, 12-15) in hi: put them back.
// scale (nullable): store (float)acc * scale instead, the dequantizing epilogue's arithmetic; bf16: that value
// rounded to bfloat16 (dst then holds bfloat16)
static inline void store16(int32_t* dst, __m256i lo, __m256i hi, bool accumulate, const float* scale = nullptr,
                           bool stream = false, bool bf16 = false) {
    const __m256i c0 = _mm256_permute2x128_si256(lo, hi, 0x20), c1 = _mm256_permute2x128_si256(lo, hi, 0x31);
    __m256i* d0 = reinterpret_cast<__m256i*>(dst);
    __m256i* d1 = reinterpret_cast<__m256i*>(dst + 8);
    if (scale) {
        const __m256 sv = _mm256_set1_ps(*scale);
        const __m256 v0 = _mm256_mul_ps(_mm256_cvtepi32_ps(c0), sv), v1 = _mm256_mul_ps(_mm256_cvtepi32_ps(c1), sv);
        if (bf16) {
            store_bf16x8(reinterpret_cast<uint16_t*>(dst), v0);
            store_bf16x8(reinterpret_cast<uint16_t*>(dst) + 8, v1);
        } else if (stream) {
            _mm256_stream_ps(reinterpret_cast<float*>(dst), v0);
            _mm256_stream_ps(reinterpret_cast<float*>(dst + 8), v1);
        } else {
            _mm256_storeu_ps(reinterpret_cast<float*>(dst), v0);
            _mm256_storeu_ps(reinterpret_cast<float*>(dst + 8), v1);
        }
    } else if (accumulate) {
        _mm256_storeu_si256(d0, _mm256_add_epi32(_mm256_loadu_si256(d0), c0));
        _mm256_storeu_si256(d1, _mm256_add_epi32(_mm256_loadu_si256(d1), c1));
    } else {
        _mm256_storeu_si256(d0, c0);
        _mm256_storeu_si256(d1, c1);
    }
}
#endif

// whether a scaled output of `positions` x C floats at `out` goes out by non-temporal stores: large, and every
// 16-channel block 32-byte aligned
static bool streamed(const void* out, int64_t positions, int64_t C, const float* scale) {
    return scale && positions * C * 4 >= STREAM_BYTES && C % 8 == 0 && reinterpret_cast<uintptr_t>(out) % 32 == 0;
}

// where the forward pass and the input gradient put their sums: int32, or with a scale float32 acc * scale,
// or with bf16 as well that value rounded to bfloat16 (the dequantizing epilogue's bfloat16 output)
struct DwOut {
    void* base;
    const float* scale;
    bool bf16;
    // element i, addressed as store16 writes it (4-byte elements, or 2-byte bfloat16)
    int32_t* at(int64_t i) const {
        return bf16 ? reinterpret_cast<int32_t*>(static_cast<uint16_t*>(base) + i) : static_cast<int32_t*>(base) + i;
    }
};

// body(row) for every row, shared out among the threads where `parallel`; with `stream`, each thread's
// non-temporal stores fenced before the region ends, so that every thread sees them after it
template <class Body>
static void over_rows(int64_t rows, bool parallel, bool stream, Body body) {
#pragma omp parallel if (parallel)
    {
#pragma omp for schedule(static)
        for (int64_t row = 0; row < rows; ++row) body(row);
#ifdef __AVX2__
        if (stream) _mm_sfence();
#endif
    }
}

// Weights as int16 pairs of taps (t, t + 1) per channel, in the lane order of unpacklo/hi for the
// 16-channel blocks (wv) and plainly for the tail (wp).
struct DwWeights {
    int taps, pairs;
    int64_t C, C16;
    std::vector<int16_t> wv, wp;
    DwWeights(const int8_t* w, int64_t C_, int taps_) : taps(taps_), pairs((taps_ + 1) / 2), C(C_), C16(C_ / 16 * 16) {
        wp.assign((size_t)pairs * C * 2, 0);
        for (int64_t c = 0; c < C; ++c)
            for (int t = 0; t < taps; ++t) wp[((size_t)(t / 2) * C + c) * 2 + (t & 1)] = w[c * taps + t];
        wv.assign((size_t)pairs * C16 * 2, 0);
        for (int64_t c0 = 0; c0 < C16; c0 += 16)
            for (int p = 0; p < pairs; ++p)
                for (int half = 0; half < 2; ++half)
                    for (int lane = 0; lane < 8; ++lane) {
                        const int64_t c = c0 + (lane < 4 ? lane : lane + 4) + 4 * half;
                        int16_t* d = wv.data() + (size_t)c0 * pairs * 2 + (size_t)p * 32 + half * 16 + lane * 2;
                        d[0] = wp[((size_t)p * C + c) * 2];
                        d[1] = wp[((size_t)p * C + c) * 2 + 1];
                    }
    }
};

// out's elements from i: sum over taps of src[t][c] * w[c, t] for every channel c (as DwOut says)
static void gather_madd(const int8_t* const* src, const DwWeights& w, const int8_t* wraw, const DwOut& out,
                        int64_t i, bool stream) {
    int64_t c0 = 0;
#ifdef __AVX2__
    for (; c0 < w.C16; c0 += 16) {
        __m256i lo = _mm256_setzero_si256(), hi = lo;
        const int16_t* wc = w.wv.data() + (size_t)c0 * w.pairs * 2;
        for (int p = 0; p < w.pairs; ++p) {
            const __m256i a = load16(src[2 * p] + c0);
            const __m256i b = 2 * p + 1 < w.taps ? load16(src[2 * p + 1] + c0) : _mm256_setzero_si256();
            const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + p * 32));
            const __m256i w1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wc + p * 32 + 16));
            lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(a, b), w0));
            hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(a, b), w1));
        }
        store16(out.at(i + c0), lo, hi, false, out.scale, stream, out.bf16);
    }
#endif
    for (; c0 < w.C; ++c0) {
        int32_t acc = 0;
        for (int t = 0; t < w.taps; ++t) acc += (int32_t)src[t][c0] * (int32_t)wraw[c0 * w.taps + t];
        if (out.bf16)
            static_cast<uint16_t*>(out.base)[i + c0] = f32_to_bf16((float)acc * *out.scale);
        else if (out.scale)
            static_cast<float*>(out.base)[i + c0] = (float)acc * *out.scale;
        else
            static_cast<int32_t*>(out.base)[i + c0] = acc;
    }
}

// y[n, oh, ow, c] = sum over taps of x[n, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw, c] * w[c, kh, kw]
static void dw_forward(const int8_t* x, const int8_t* w, const DwOut& y, const DwGeometry& g) {
    const int taps = g.KH * g.KW;
    const DwWeights wt(w, g.C, taps);
    const std::vector<int8_t> zeros(g.C, 0);
    const int64_t rows = g.N * g.OH;
    const bool stream = !y.bf16 && streamed(y.base, rows * g.OW, g.C, y.scale);
    over_rows(rows, rows * g.OW * g.C >= DW_PARALLEL_MIN, stream, [&](int64_t row) {
        const int64_t n = row / g.OH, oh = row % g.OH;
        const int8_t* src[MAX_TAPS];
        for (int64_t ow = 0; ow < g.OW; ++ow) {
            for (int kh = 0; kh < g.KH; ++kh)
                for (int kw = 0; kw < g.KW; ++kw) {
                    const int64_t ih = oh * g.sh - g.ph + (int64_t)kh * g.dh, iw = ow * g.sw - g.pw + (int64_t)kw * g.dw;
                    const bool in = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
                    src[kh * g.KW + kw] = in ? x + ((n * g.H + ih) * g.W + iw) * g.C : zeros.data();
                }
            gather_madd(src, wt, w, y, ((n * g.OH + oh) * g.OW + ow) * g.C, stream);
        }
    });
}

// dx[n, ih, iw, c] = sum over taps with ih = oh*sh - ph + kh*dh (and the same for w) of g[n, oh, ow, c] * w[c, kh, kw]
// With a stride, only the taps with (ih + ph - kh*dh) % sh == 0 (and so for w) can reach an input position, and
// which ones depends only on (ih % sh, iw % sw): each such phase gathers its own taps with its own weights
// (a stride-2 3x3 layer: 1, 2, 2 or 4 taps instead of 9 of which the rest multiplied zero rows; measured 2.6x
// the forward pass's time on MobileNetV2, issue 64). The sums are the same exact int32 sums.
static void dw_input_grad(const int8_t* gy, const int8_t* w, const DwOut& dx, const DwGeometry& g) {
    const int taps = g.KH * g.KW;
    const int phases = g.sh * g.sw;
    std::vector<std::vector<int>> ptaps(phases);  // per phase (ih % sh, iw % sw): its taps kh * KW + kw
    std::vector<std::vector<int64_t>> poff(phases);  // and for each, (ph - kh * dh, pw - kw * dw)
    std::vector<std::vector<int8_t>> pw(phases);  // and their weights, [c][tap of the phase]
    std::vector<DwWeights> pwt;
    pwt.reserve(phases);
    for (int a = 0; a < g.sh; ++a)
        for (int b = 0; b < g.sw; ++b) {
            const int ph = a * g.sw + b;
            for (int kh = 0; kh < g.KH; ++kh)
                for (int kw = 0; kw < g.KW; ++kw) {
                    const int64_t rh = ((a + g.ph - (int64_t)kh * g.dh) % g.sh + g.sh) % g.sh;
                    const int64_t rw = ((b + g.pw - (int64_t)kw * g.dw) % g.sw + g.sw) % g.sw;
                    if (rh == 0 && rw == 0) {
                        ptaps[ph].push_back(kh * g.KW + kw);
                        poff[ph].push_back(g.ph - (int64_t)kh * g.dh);
                        poff[ph].push_back(g.pw - (int64_t)kw * g.dw);
                    }
                }
            const int nt = (int)ptaps[ph].size();
            pw[ph].resize((size_t)g.C * std::max(1, nt));
            for (int64_t c = 0; c < g.C; ++c)
                for (int t = 0; t < nt; ++t) pw[ph][c * nt + t] = w[c * taps + ptaps[ph][t]];
            pwt.emplace_back(pw[ph].data(), g.C, nt);
        }
    const std::vector<int8_t> zeros(g.C, 0);
    const int64_t rows = g.N * g.H;
    const bool stream = !dx.bf16 && streamed(dx.base, rows * g.W, g.C, dx.scale);
    over_rows(rows, rows * g.W * g.C >= DW_PARALLEL_MIN, stream, [&](int64_t row) {
        const int64_t n = row / g.H, ih = row % g.H;
        const int8_t* src[MAX_TAPS];
        for (int64_t iw = 0; iw < g.W; ++iw) {
            const int ph = (int)(ih % g.sh) * g.sw + (int)(iw % g.sw);
            const int64_t* off = poff[ph].data();
            const int nt = (int)ptaps[ph].size();
            for (int t = 0; t < nt; ++t) {
                const int64_t th = ih + off[2 * t], tw = iw + off[2 * t + 1];  // = oh * sh, ow * sw (divisible)
                const int64_t oh = g.sh == 1 ? th : th / g.sh, ow = g.sw == 1 ? tw : tw / g.sw;
                const bool in = th >= 0 && tw >= 0 && oh < g.OH && ow < g.OW;
                src[t] = in ? gy + ((n * g.OH + oh) * g.OW + ow) * g.C : zeros.data();
            }
            gather_madd(src, pwt[ph], pw[ph].data(), dx, ((n * g.H + ih) * g.W + iw) * g.C, stream);
        }
    });
}

// dw[c, kh, kw] = sum over n, oh, ow of x[n, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw, c] * g[n, oh, ow, c]
static void dw_weight_grad(const int8_t* x, const int8_t* gy, int32_t* dw, const DwGeometry& g) {
    const int taps = g.KH * g.KW;
    const int64_t C = g.C, C16 = C / 16 * 16, rows = g.N * g.OH;
    const bool parallel = rows * g.OW * C >= DW_PARALLEL_MIN;
    const int nt = parallel ? omp_get_max_threads() : 1;
    std::vector<int32_t> part((size_t)nt * taps * C, 0);  // per thread: [tap][C] partial sums
#pragma omp parallel for schedule(static) if (parallel)
    for (int64_t row = 0; row < rows; ++row) {
        int32_t* acc = part.data() + (size_t)omp_get_thread_num() * taps * C;
        const int64_t n = row / g.OH, oh = row % g.OH;
        const int8_t* grow = gy + (n * g.OH + oh) * g.OW * C;
        for (int kh = 0; kh < g.KH; ++kh) {
            const int64_t ih = oh * g.sh - g.ph + (int64_t)kh * g.dh;
            if (ih < 0 || ih >= g.H) continue;
            const int8_t* xrow = x + (n * g.H + ih) * g.W * C;
            for (int kw = 0; kw < g.KW; ++kw) {
                // the output positions whose tap kw falls inside: iw = ow*sw - pw + kw*dw in [0, W)
                const int64_t shift = (int64_t)kw * g.dw - g.pw;
                int64_t ow0 = shift >= 0 ? 0 : (-shift + g.sw - 1) / g.sw;
                int64_t ow1 = g.W - 1 - shift < 0 ? 0 : (g.W - 1 - shift) / g.sw + 1;
                ow1 = std::min(ow1, g.OW);
                if (ow0 >= ow1) continue;
                int32_t* at = acc + (size_t)(kh * g.KW + kw) * C;
                const int8_t* xs = xrow + shift * C;  // xs + ow * sw * C is the tap's input position
                int64_t c0 = 0;
#ifdef __AVX2__
                for (; c0 < C16; c0 += 16) {
                    __m256i lo = _mm256_setzero_si256(), hi = lo;
                    int64_t ow = ow0;
                    for (; ow + 1 < ow1; ow += 2) {  // two output positions per vpmaddwd
                        const __m256i x0 = load16(xs + ow * g.sw * C + c0), x1 = load16(xs + (ow + 1) * g.sw * C + c0);
                        const __m256i g0 = load16(grow + ow * C + c0), g1 = load16(grow + (ow + 1) * C + c0);
                        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(x0, x1), _mm256_unpacklo_epi16(g0, g1)));
                        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(x0, x1), _mm256_unpackhi_epi16(g0, g1)));
                    }
                    if (ow < ow1) {
                        const __m256i x0 = load16(xs + ow * g.sw * C + c0), g0 = load16(grow + ow * C + c0);
                        const __m256i z = _mm256_setzero_si256();
                        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(x0, z), _mm256_unpacklo_epi16(g0, z)));
                        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(x0, z), _mm256_unpackhi_epi16(g0, z)));
                    }
                    store16(at + c0, lo, hi, true);
                }
#endif
                for (; c0 < C; ++c0) {
                    uint32_t s = 0;
                    for (int64_t ow = ow0; ow < ow1; ++ow)
                        s += (uint32_t)((int32_t)xs[ow * g.sw * C + c0] * (int32_t)grow[ow * C + c0]);
                    at[c0] = (int32_t)((uint32_t)at[c0] + s);
                }
            }
        }
    }
    for (int64_t c = 0; c < C; ++c)
        for (int t = 0; t < taps; ++t) {
            uint32_t s = 0;
            for (int th = 0; th < nt; ++th) s += (uint32_t)part[((size_t)th * taps + t) * C + c];
            dw[c * taps + t] = (int32_t)s;
        }
}

}  // namespace rq

extern "C" {

// geometry: N, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw (H, W: the unpadded input)
static rq::DwGeometry dw_geometry(const int64_t* v) {
    return rq::DwGeometry{v[0], v[1], v[2], v[3], v[4], v[5], (int)v[6], (int)v[7], (int)v[8], (int)v[9],
                          (int)v[10], (int)v[11], (int)v[12], (int)v[13]};
}

// forward and input gradient: with a scale (nullable) the output is float32, (float)acc * *scale, or with bf16
// (a scale given) that value as bfloat16
int rq_dw_forward(const int8_t* x, const int8_t* w, void* y, const int64_t* geometry, const float* scale, int bf16) {
    const rq::DwGeometry g = dw_geometry(geometry);
    if (g.KH * g.KW > rq::MAX_TAPS) return 1;
    rq::dw_forward(x, w, rq::DwOut{y, scale, scale && bf16}, g);
    return 0;
}

int rq_dw_input_grad(const int8_t* gy, const int8_t* w, void* dx, const int64_t* geometry, const float* scale,
                     int bf16) {
    const rq::DwGeometry g = dw_geometry(geometry);
    if (g.KH * g.KW > rq::MAX_TAPS) return 1;
    rq::dw_input_grad(gy, w, rq::DwOut{dx, scale, scale && bf16}, g);
    return 0;
}

int rq_dw_weight_grad(const int8_t* x, const int8_t* gy, int32_t* dw, const int64_t* geometry) {
    rq::dw_weight_grad(x, gy, dw, dw_geometry(geometry));
    return 0;
}

}  // extern "C"
