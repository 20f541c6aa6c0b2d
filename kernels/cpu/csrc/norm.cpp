// BatchNorm in training with the activation that follows it (ReLU, ReLU6, or none), in two passes over
// memory each way, writing what the int8 layer next to it needs on the way:
//
//   forward   stats   per channel: shifted sum and sum of squares (the mean and the biased variance), and
//                     min and max of x, from which the output's max|y| follows before y exists (the
//                     output is monotone in x channel by channel);
//             apply   y = clamp(x * a_c + b_c, lo, hi), and the int8 codes of y with s = max|y| (codes.h:
//                     the quantizer's nearest rounding, bit for bit)
//   backward  sums    per channel: sum of g' and of g' (x - mean), g' = g where lo < x * a_c + b_c < hi
//             apply   gx = g' c1_c + (x - mean_c) c2_c + c3_c, and per channel max|gx|, sum and sum of
//                     squares of gx (what the gradient quantizer of the layer before would read gx for)
//
// With a residual r (a ResNet block's end: its last BatchNorm, the sum with the shortcut, the ReLU), the
// forward apply pass writes y = clamp(round(round(x a_c + b_c) + r), lo, hi) and finds max|y| itself (no
// codes: y is not monotone in x); the backward sums pass masks g by the stored y and writes g' out as r's
// gradient, and the apply pass reads that g'.
//
// Unfused, torch's BatchNorm, its activation (with the copy autograd keeps of an in-place ReLU6) and the
// quantizer's max and codes read or write every element 9 times forward and 9 times backward; here 4 and 5
// (docs/kernels.md). Tensors are float32 or bfloat16 (all of one call the same), channels innermost: rows x C
// (N, H, W flattened). The arithmetic is float32's either way; a bfloat16 tensor holds the values rounded to
// nearest even, and what reads a written value back (its codes and scale, the activation's mask, gx's
// statistics) reads the rounded one, as torch's bfloat16 BatchNorm and the layers after it would.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include <omp.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "bf16.h"
#include "codes.h"
#include "moments.h"

// AVX-512 (with BW and VL), where C is a multiple of 16: 16 channels a vector, fewer instructions for passes
// that were bound by them. Each channel's float operations are the AVX2 and scalar loops' own, in the same
// order, so the results are bit for bit the same. Other C keep the AVX2 loops: with 24 channels a 64-byte
// vector straddles cache lines (and a masked last one took longer), measured slower on an Intel AMX Xeon.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RQ_NORM_512 1
#else
#define RQ_NORM_512 0
#endif

namespace rq {

// whether rows of C channels take the 16-lane loops
static inline bool wide_rows(int64_t C) { return RQ_NORM_512 && C % 16 == 0; }

// The element types: float, and bfloat16 held as uint16_t: the float a load gives, the float a store keeps
// (round), and mask_bounds, the activation's bounds for z before its rounding.
template <class T>
struct Elem;

template <>
struct Elem<float> {
    static float load(const float* p) { return *p; }
    static float round(float v) { return v; }
    static void store(float* p, float v) { *p = v; }
    static void mask_bounds(float lo, float hi, float& above, float& below) { above = lo, below = hi; }
};

template <>
struct Elem<uint16_t> {
    static float load(const uint16_t* p) { return bf16_to_f32(*p); }
    static float round(float v) { return round_bf16(v); }
    static void store(uint16_t* p, float v) { *p = f32_to_bf16(v); }
    // the activation's mask on the rounded value, lo < round(z) < hi, as above < z < below on z itself:
    // rounding is monotone, so each bound moves to the midpoint between it and its bfloat16 neighbour
    // (or the float next to that midpoint, as the tie goes). lo and hi: bfloat16 values (0, 6) or infinite.
    static void mask_bounds(float lo, float hi, float& above, float& below) {
        above = lo, below = hi;
        if (std::isfinite(lo)) {
            const float m = 0.5f * (lo + bf16_step(lo, true));
            above = round_bf16(m) <= lo ? m : std::nextafter(m, -INFINITY);
        }
        if (std::isfinite(hi)) {
            const float m = 0.5f * (hi + bf16_step(hi, false));
            below = round_bf16(m) >= hi ? m : std::nextafter(m, INFINITY);
        }
    }
    // the bfloat16 value next to the bfloat16 value v, upwards or downwards
    static float bf16_step(float v, bool up) {
        const uint16_t h = f32_to_bf16(v);
        if (v == 0.0f) return bf16_to_f32(up ? 0x0001 : 0x8001);
        return bf16_to_f32((v > 0.0f) == up ? h + 1 : h - 1);  // the magnitude grows, or shrinks
    }
};

// A vector width's operations for element type T, so that each pass's vector loop is written once for 8
// lanes (AVX2) and 16 (AVX-512): the float arithmetic, inside (g where lo < z < hi, else 0), codes (the
// nearest int8 codes, stored), and T's load, round (bf16.h's) and store (of a rounded value, so a bfloat16
// is its upper half; `stream`: a non-temporal store, asked for only where the address is aligned).
#ifdef __AVX2__
template <class T>
struct V8 {
    using F = __m256;
    static constexpr int64_t N = 8;
    static F set1(float v) { return _mm256_set1_ps(v); }
    static F ld(const float* p) { return _mm256_loadu_ps(p); }
    static void st(float* p, F v) { _mm256_storeu_ps(p, v); }
    static F add(F a, F b) { return _mm256_add_ps(a, b); }
    static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F min(F a, F b) { return _mm256_min_ps(a, b); }
    static F max(F a, F b) { return _mm256_max_ps(a, b); }
    static F abs(F v) { return abs8(v); }
    static F inside(F z, F lo, F hi, F g) {
        return _mm256_and_ps(g, _mm256_and_ps(_mm256_cmp_ps(z, lo, _CMP_GT_OQ), _mm256_cmp_ps(z, hi, _CMP_LT_OQ)));
    }
    static void codes(int8_t* q, F v, F inv) { store8(q, codes_nearest8(v, inv)); }
    // the activation's mask of 8 lanes as 8 bits (lane i: bit i), lo < v < hi; and g where a mask's bit is set
    static void store_bits(uint8_t* p, F v, F lo, F hi) {
        *p = (uint8_t)_mm256_movemask_ps(
            _mm256_and_ps(_mm256_cmp_ps(v, lo, _CMP_GT_OQ), _mm256_cmp_ps(v, hi, _CMP_LT_OQ)));
    }
    static F masked_by_bits(const uint8_t* p, F g) {
        const __m256i lane = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        const __m256i on = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(*p), lane), lane);
        return _mm256_and_ps(g, _mm256_castsi256_ps(on));
    }
    static F load(const T* p) {
        if constexpr (std::is_same_v<T, float>) return _mm256_loadu_ps(p);
        else return load_bf16x8(p);
    }
    static F round(F v) {
        if constexpr (std::is_same_v<T, float>) return v;
        else return round_bf16x8(v);
    }
    static void store(T* p, F v, bool stream) {
        if constexpr (std::is_same_v<T, float>) {
            if (stream) _mm256_stream_ps(p, v);
            else _mm256_storeu_ps(p, v);
        } else {  // the upper halves are the bfloat16 values
            const __m256i r = _mm256_srli_epi32(_mm256_castps_si256(v), 16);
            const __m128i h = _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0xD8));
            if (stream) _mm_stream_si128(reinterpret_cast<__m128i*>(p), h);
            else _mm_storeu_si128(reinterpret_cast<__m128i*>(p), h);
        }
    }
};
#endif

#if RQ_NORM_512
template <class T>
struct V16 {
    using F = __m512;
    static constexpr int64_t N = 16;
    static F set1(float v) { return _mm512_set1_ps(v); }
    static F ld(const float* p) { return _mm512_loadu_ps(p); }
    static void st(float* p, F v) { _mm512_storeu_ps(p, v); }
    static F add(F a, F b) { return _mm512_add_ps(a, b); }
    static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F min(F a, F b) { return _mm512_min_ps(a, b); }
    static F max(F a, F b) { return _mm512_max_ps(a, b); }
    static F abs(F v) { return abs16(v); }
    static F inside(F z, F lo, F hi, F g) {
        return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(z, lo, _CMP_GT_OQ) & _mm512_cmp_ps_mask(z, hi, _CMP_LT_OQ), g);
    }
    static void codes(int8_t* q, F v, F inv) { store16(q, codes_nearest16(v, inv)); }
    static void store_bits(uint8_t* p, F v, F lo, F hi) {
        const uint16_t m = _mm512_cmp_ps_mask(v, lo, _CMP_GT_OQ) & _mm512_cmp_ps_mask(v, hi, _CMP_LT_OQ);
        std::memcpy(p, &m, 2);
    }
    static F masked_by_bits(const uint8_t* p, F g) {
        uint16_t m;
        std::memcpy(&m, p, 2);
        return _mm512_maskz_mov_ps(m, g);
    }
    static F load(const T* p) {
        if constexpr (std::is_same_v<T, float>) return _mm512_loadu_ps(p);
        else return load_bf16x16(p);
    }
    static F round(F v) {
        if constexpr (std::is_same_v<T, float>) return v;
        else return round_bf16x16(v);
    }
    static void store(T* p, F v, bool stream) {
        if constexpr (std::is_same_v<T, float>) {
            if (stream) _mm512_stream_ps(p, v);
            else _mm512_storeu_ps(p, v);
        } else {
            const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16));
            if (stream) _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
            else _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
        }
    }
};
#endif

// A row's channels from 0 in vector code: lanes(V16<T>{}, c) where the row is wide, then lanes(V8<T>{}, c),
// each returning the channel it stopped at; the caller's scalar loop does the rest.
template <class T, class Lanes>
static inline int64_t vector_part([[maybe_unused]] bool wide, [[maybe_unused]] Lanes lanes) {
    int64_t c = 0;
#if RQ_NORM_512
    if (wide) c = lanes(V16<T>{}, c);
#endif
#ifdef __AVX2__
    c = lanes(V8<T>{}, c);
#endif
    return c;
}

constexpr int64_t NORM_PARALLEL_MIN = 1 << 15;  // elements below which a pass stays on one thread
constexpr int64_t NORM_BLOCK = 64;              // rows whose float sums go into double together
// outputs of this many bytes and more are written with non-temporal stores: they outgrow the caches, and a
// plain store first reads each line it overwrites (forward 16%, backward 22% faster at 38 MB, Zen 3)
constexpr int64_t STREAM_BYTES_MIN = 4 << 20;

// whether an output of rows x C elements at p goes out by non-temporal stores: large enough, and every vector
// (of 8 channels, or 16 in wide rows) whole and aligned
template <class T>
static inline bool streamed(const T* p, int64_t rows, int64_t C) {
    const int64_t lanes = wide_rows(C) ? 16 : 8;
    return rows * C * (int64_t)sizeof(T) >= STREAM_BYTES_MIN && C % 8 == 0 &&
           reinterpret_cast<uintptr_t>(p) % (lanes * sizeof(T)) == 0;
}

// Per-thread, per-channel sums: float over a block of rows, then double; float min / max.
// A thread's values start `stride` after the previous thread's, 64 bytes apart at least: two threads
// writing one cache line kept stealing it from each other (the statistics did not speed up on 2 threads).
struct Partials {
    int nt;
    int64_t C, stride;
    std::vector<double> d1, d2;
    std::vector<float> f1, f2, lo, hi;
    explicit Partials(int64_t C_) : nt(omp_get_max_threads()), C(C_), stride((C_ + 15) / 16 * 16 + 16) {
        const size_t n = (size_t)nt * stride;
        d1.assign(n, 0.0);
        d2.assign(n, 0.0);
        f1.assign(n, 0.0f);
        f2.assign(n, 0.0f);
        lo.assign(n, std::numeric_limits<float>::infinity());
        hi.assign(n, -std::numeric_limits<float>::infinity());
    }
    void flush(size_t o) {
        for (int64_t c = 0; c < C; ++c) {
            d1[o + c] += f1[o + c];
            d2[o + c] += f2[o + c];
            f1[o + c] = f2[o + c] = 0.0f;
        }
    }
    // returns 1 where a sum is not finite: a NaN or an Inf among the values summed (or a square beyond
    // float's range), found here instead of by a test of every element
    int reduce(double* s1, double* s2, float* mn, float* mx) const {
        int bad = 0;
        for (int64_t c = 0; c < C; ++c) {
            double a = 0.0, b = 0.0;
            float l = std::numeric_limits<float>::infinity(), h = -l;
            for (int t = 0; t < nt; ++t) {
                const size_t i = (size_t)t * stride + c;
                a += d1[i];
                b += d2[i];
                l = std::fmin(l, lo[i]);
                h = std::fmax(h, hi[i]);
            }
            s1[c] = a;
            s2[c] = b;
            bad |= !std::isfinite(a) || !std::isfinite(b);
            if (mn) mn[c] = l;
            if (mx) mx[c] = h;
        }
        return bad;
    }
};

// Blocks of rows shared out among the threads, row by row: body(o, r) adds row r into the thread's Partials
// at offset o (float sums of a channel in memory, in L1). Two other orders measured slower on Zen 3: sums
// of 4 rows in registers before they go to memory, and a walk down the rows 8 channels at a time with the
// sums in registers (which missed the cache at every row).
template <class Body>
static void over_rows(int64_t rows, int64_t C, Partials& P, Body body) {
    const int64_t nblocks = (rows + NORM_BLOCK - 1) / NORM_BLOCK;
#pragma omp parallel if (rows * C >= NORM_PARALLEL_MIN)
    {
#pragma omp for schedule(static)
        for (int64_t blk = 0; blk < nblocks; ++blk) {
            const size_t o = (size_t)omp_get_thread_num() * P.stride;
            const int64_t r1 = std::min(rows, (blk + 1) * NORM_BLOCK);
            for (int64_t r = blk * NORM_BLOCK; r < r1; ++r) body(o, r);
            P.flush(o);
        }
#ifdef __AVX2__
        _mm_sfence();  // a body's non-temporal stores, seen by every thread after the region
#endif
    }
}

// Forward statistics of x (rows x C): sums of d = x - shift_c and d^2, min and max per channel. Returns 1 on
// a NaN or an Inf (Partials::reduce). The shift (the first row) keeps E[d^2] - E[d]^2 from cancelling where
// |mean| >> std.
template <class T>
static int norm_stats(const T* x, int64_t rows, int64_t C, const float* shift, double* s1, double* s2, float* mn,
                      float* mx) {
    using E = Elem<T>;
    Partials P(C);
    const bool wide = wide_rows(C);
    over_rows(rows, C, P, [&](size_t o, int64_t r) {
        float *p1 = P.f1.data() + o, *p2 = P.f2.data() + o, *lo = P.lo.data() + o, *hi = P.hi.data() + o;
        const T* row = x + r * C;
        int64_t c = vector_part<T>(wide, [&](auto v, int64_t c) {
            using V = decltype(v);
            for (; c + V::N <= C; c += V::N) {
                const auto a = V::load(row + c), d = V::sub(a, V::ld(shift + c));
                V::st(p1 + c, V::add(V::ld(p1 + c), d));
                V::st(p2 + c, V::add(V::ld(p2 + c), V::mul(d, d)));
                V::st(lo + c, V::min(V::ld(lo + c), a));
                V::st(hi + c, V::max(V::ld(hi + c), a));
            }
            return c;
        });
        for (; c < C; ++c) {
            const float a = E::load(row + c), d = a - shift[c];
            p1[c] += d;
            p2[c] += d * d;
            lo[c] = std::fmin(lo[c], a);
            hi[c] = std::fmax(hi[c], a);
        }
    });
    return P.reduce(s1, s2, mn, mx);
}

static inline float activate(float z, float lo, float hi) { return std::fmin(std::fmax(z, lo), hi); }

// max|y| over the channels, y = clamp(x a_c + b_c, lo, hi) at each channel's min and max of x: the same float
// operations as the apply pass, each monotone in x, so this is the largest |y| that pass writes
static float norm_output_absmax(const float* mn, const float* mx, int64_t C, const float* a, const float* b, float lo,
                                float hi) {
    float s = 0.0f;
    for (int64_t c = 0; c < C; ++c) {
        const float y0 = activate(mn[c] * a[c] + b[c], lo, hi), y1 = activate(mx[c] * a[c] + b[c], lo, hi);
        s = std::fmax(s, std::fmax(std::fabs(y0), std::fabs(y1)));
    }
    return s;
}

// y = clamp(x a_c + b_c, lo, hi); q (unless null) = the nearest codes of y (as stored) with scale s
template <class T>
static void norm_apply(const T* x, T* y, int8_t* q, int64_t rows, int64_t C, const float* a, const float* b, float lo,
                       float hi, float s) {
    using E = Elem<T>;
    const float inv = inv_scale(s);
    const bool stream = streamed(y, rows, C);
    const bool wide = wide_rows(C);
#pragma omp parallel if (rows * C >= NORM_PARALLEL_MIN)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t base = r * C;
            int64_t c = vector_part<T>(wide, [&](auto v, int64_t c) {
                using V = decltype(v);
                const auto vlo = V::set1(lo), vhi = V::set1(hi), vinv = V::set1(inv);
                for (; c + V::N <= C; c += V::N) {
                    const auto z = V::add(V::mul(V::load(x + base + c), V::ld(a + c)), V::ld(b + c));
                    const auto out = V::round(V::min(V::max(z, vlo), vhi));
                    V::store(y + base + c, out, stream);
                    if (q) V::codes(q + base + c, out, vinv);  // read next by the convolution: cached
                }
                return c;
            });
            for (; c < C; ++c) {
                const float v = E::round(activate(E::load(x + base + c) * a[c] + b[c], lo, hi));
                E::store(y + base + c, v);
                if (q) q[base + c] = code_nearest(v, inv);
            }
        }
#ifdef __AVX2__
        _mm_sfence();  // the non-temporal stores, seen by every thread after the region
#endif
    }
}

// The activation's mask of a residual's output, one bit an element: row r's at bits + r * mask_row_bytes(C),
// channel c its byte c / 8's bit c % 8 (a row's bytes its own: the threads share out rows)
static inline int64_t mask_row_bytes(int64_t C) { return (C + 7) / 8; }

// With a residual r (ResNet blocks: the block's last BatchNorm, the sum with the shortcut, its ReLU):
// y = clamp(round(round(x a_c + b_c) + r), lo, hi), the rounding T's as torch rounds the BatchNorm's output
// and the sum, and the mask lo < y < hi as bits (what the backward pass reads instead of y: 1/32 of a
// float32 y's bytes, and y is not kept for it). max|y| (scale) comes out of this pass, since y is no longer
// monotone in x; its codes are left to the quantizer, which then needs one pass over y instead of two.
// Returns 1 on a NaN or an Inf in the sum (the sums of round(t + r) are found on the way: a clamp would hide
// a NaN).
template <class T>
static int norm_apply_residual(const T* x, const T* res, T* y, uint8_t* bits, int64_t rows, int64_t C,
                               const float* a, const float* b, float lo, float hi, float* scale) {
    using E = Elem<T>;
    Partials P(C);  // f1: sums of the sum before the clamp; hi: max|y|
    const bool stream = streamed(y, rows, C);
    const bool wide = wide_rows(C);
    over_rows(rows, C, P, [&](size_t o, int64_t r) {
        float *p1 = P.f1.data() + o, *m = P.hi.data() + o;
        const T *xr = x + r * C, *rr = res + r * C;
        T* out = y + r * C;
        uint8_t* rb = bits + r * mask_row_bytes(C);
        int64_t c = vector_part<T>(wide, [&](auto v, int64_t c) {
            using V = decltype(v);
            const auto vlo = V::set1(lo), vhi = V::set1(hi);
            for (; c + V::N <= C; c += V::N) {  // c: a multiple of 8, so the lanes' bits are whole bytes
                const auto t = V::round(V::add(V::mul(V::load(xr + c), V::ld(a + c)), V::ld(b + c)));
                const auto u = V::round(V::add(t, V::load(rr + c)));
                const auto w = V::min(V::max(u, vlo), vhi);  // lo, hi: values of T, so w needs no rounding
                V::store(out + c, w, stream);
                V::store_bits(rb + c / 8, w, vlo, vhi);
                V::st(p1 + c, V::add(V::ld(p1 + c), u));
                V::st(m + c, V::max(V::ld(m + c), V::abs(w)));
            }
            return c;
        });
        std::fill(rb + c / 8, rb + mask_row_bytes(C), (uint8_t)0);  // the tail's bytes (c: a multiple of 8)
        for (; c < C; ++c) {
            const float t = E::round(E::load(xr + c) * a[c] + b[c]), u = E::round(t + E::load(rr + c));
            const float w = activate(u, lo, hi);
            E::store(out + c, w);
            rb[c / 8] |= (uint8_t)((w > lo && w < hi) << (c % 8));
            p1[c] += u;
            m[c] = std::fmax(m[c], std::fabs(w));
        }
    });
    std::vector<double> s1(C), s2(C);
    std::vector<float> mx(C);
    if (P.reduce(s1.data(), s2.data(), nullptr, mx.data())) return 1;
    float s = 0.0f;
    for (int64_t c = 0; c < C; ++c) s = std::fmax(s, mx[c]);
    *scale = s;
    return 0;
}

// g' = g where lo < x a + b < hi (torch's activation backward passes the gradient where its input, the
// BatchNorm's output, lies strictly inside the bounds; lo and hi from Elem::mask_bounds, so that the stored
// output decides)
static inline float masked1(float g, float x, float a, float b, float lo, float hi) {
    const float z = x * a + b;
    return (z > lo && z < hi) ? g : 0.0f;
}

// masked1 on V::N channels from c, with d = x - mean
template <class V, class T>
static inline void masked(const T* gr, const T* xr, const float* a, const float* b, const float* mean, int64_t c,
                          typename V::F lo, typename V::F hi, typename V::F& gp, typename V::F& d) {
    const auto xv = V::load(xr + c);
    const auto z = V::add(V::mul(xv, V::ld(a + c)), V::ld(b + c));
    gp = V::inside(z, lo, hi, V::load(gr + c));
    d = V::sub(xv, V::ld(mean + c));
}

// Backward sums per channel: of g' and of g' (x - mean_c)
template <class T>
static void norm_grad_sums(const T* g, const T* x, int64_t rows, int64_t C, const float* a, const float* b, float lo,
                           float hi, const float* mean, double* sg, double* sgx) {
    using E = Elem<T>;
    Partials P(C);
    const bool wide = wide_rows(C);
    over_rows(rows, C, P, [&](size_t o, int64_t r) {
        float *p1 = P.f1.data() + o, *p2 = P.f2.data() + o;
        const T *gr = g + r * C, *xr = x + r * C;
        int64_t c = vector_part<T>(wide, [&](auto v, int64_t c) {
            using V = decltype(v);
            const auto vlo = V::set1(lo), vhi = V::set1(hi);
            for (; c + V::N <= C; c += V::N) {
                typename V::F gp, d;
                masked<V>(gr, xr, a, b, mean, c, vlo, vhi, gp, d);
                V::st(p1 + c, V::add(V::ld(p1 + c), gp));
                V::st(p2 + c, V::add(V::ld(p2 + c), V::mul(gp, d)));
            }
            return c;
        });
        for (; c < C; ++c) {
            const float xc = E::load(xr + c), gp = masked1(E::load(gr + c), xc, a[c], b[c], lo, hi);
            p1[c] += gp;
            p2[c] += gp * (xc - mean[c]);
        }
    });
    P.reduce(sg, sgx, nullptr, nullptr);
}

// With a residual: g' = g where lo < y < hi (the forward pass's mask bits of the stored output y, as torch's
// ReLU backward reads y), written to gr (the gradient of the shortcut and of the BatchNorm's output), and the
// sums of g' and g' (x - mean_c)
template <class T>
static void norm_grad_sums_residual(const T* g, const uint8_t* bits, const T* x, T* gr, int64_t rows, int64_t C,
                                    const float* mean, double* sg, double* sgx) {
    using E = Elem<T>;
    Partials P(C);
    const bool stream = streamed(gr, rows, C);
    const bool wide = wide_rows(C);
    over_rows(rows, C, P, [&](size_t o, int64_t r) {
        float *p1 = P.f1.data() + o, *p2 = P.f2.data() + o;
        const T *gv = g + r * C, *xr = x + r * C;
        const uint8_t* rb = bits + r * mask_row_bytes(C);
        T* out = gr + r * C;
        int64_t c = vector_part<T>(wide, [&](auto v, int64_t c) {
            using V = decltype(v);
            for (; c + V::N <= C; c += V::N) {
                const auto gp = V::masked_by_bits(rb + c / 8, V::load(gv + c));
                const auto d = V::sub(V::load(xr + c), V::ld(mean + c));
                V::store(out + c, gp, stream);  // a value of T already: no rounding
                V::st(p1 + c, V::add(V::ld(p1 + c), gp));
                V::st(p2 + c, V::add(V::ld(p2 + c), V::mul(gp, d)));
            }
            return c;
        });
        for (; c < C; ++c) {
            const float gp = (rb[c / 8] >> (c % 8)) & 1 ? E::load(gv + c) : 0.0f;
            E::store(out + c, gp);
            p1[c] += gp;
            p2[c] += gp * (E::load(xr + c) - mean[c]);
        }
    });
    P.reduce(sg, sgx, nullptr, nullptr);
}

// gx = g' c1_c + (x - mean_c) c2_c + c3_c, with per channel max|gx| (gmax), sum (s1) and sum of squares (s2)
// of gx as stored. Returns 1 where gx has a NaN or an Inf (Partials::reduce).
template <class T>
static int norm_grad_apply(const T* g, const T* x, T* gx, int64_t rows, int64_t C, const float* a, const float* b,
                           float lo, float hi, const float* mean, const float* c1, const float* c2, const float* c3,
                           float* gmax, double* s1, double* s2) {
    using E = Elem<T>;
    Partials P(C);  // hi holds max|gx| (from -inf: every |gx| is above it)
    const bool stream = streamed(gx, rows, C);
    const bool wide = wide_rows(C);
    over_rows(rows, C, P, [&](size_t o, int64_t r) {
        float *p1 = P.f1.data() + o, *p2 = P.f2.data() + o, *m = P.hi.data() + o;
        const T *gr = g + r * C, *xr = x + r * C;
        T* out = gx + r * C;
        int64_t c = vector_part<T>(wide, [&](auto v, int64_t c) {
            using V = decltype(v);
            const auto vlo = V::set1(lo), vhi = V::set1(hi);
            for (; c + V::N <= C; c += V::N) {
                typename V::F gp, d;
                masked<V>(gr, xr, a, b, mean, c, vlo, vhi, gp, d);
                const auto w = V::round(
                    V::add(V::add(V::mul(gp, V::ld(c1 + c)), V::mul(d, V::ld(c2 + c))), V::ld(c3 + c)));
                V::store(out + c, w, stream);
                V::st(m + c, V::max(V::ld(m + c), V::abs(w)));
                V::st(p1 + c, V::add(V::ld(p1 + c), w));
                V::st(p2 + c, V::add(V::ld(p2 + c), V::mul(w, w)));
            }
            return c;
        });
        for (; c < C; ++c) {
            const float xc = E::load(xr + c), gp = masked1(E::load(gr + c), xc, a[c], b[c], lo, hi);
            const float v = E::round(gp * c1[c] + (xc - mean[c]) * c2[c] + c3[c]);
            E::store(out + c, v);
            m[c] = std::fmax(m[c], std::fabs(v));
            p1[c] += v;
            p2[c] += v * v;
        }
    });
    return P.reduce(s1, s2, nullptr, gmax);
}

// The forward pass: statistics, the per-channel coefficients (in double), y's scale, then y and its codes;
// with a residual res (not null), y = clamp(BatchNorm(x) + res, lo, hi), its scale and its activation's mask
// bits (rows x mask_row_bytes(C)), no codes.
// weight / bias may be null (no affine). The running statistics (unless null) move towards the batch's as
// torch's BatchNorm moves them (Normalization.cpp, batch_norm_cpu_update_stats_template: in double, from
// the float32 mean and the unbiased variance, with momentum `factor`), here rather than in five torch ops
// (tens of microseconds a layer). Returns 1 on a NaN or an Inf in x, in the residual's sum or in the scale
// (the running statistics unchanged then).
template <class T>
static int norm_forward(const T* x, const T* res, T* y, int8_t* q, uint8_t* bits, int64_t rows, int64_t C,
                        const float* weight, const float* bias, double eps, float lo, float hi, float* mean,
                        double* invstd, double* var, float* a, float* b, float* scale, float* running_mean,
                        float* running_var, double factor) {
    std::vector<double> s1(C), s2(C);
    std::vector<float> mn(C), mx(C), shift(C);
    for (int64_t c = 0; c < C; ++c) shift[c] = Elem<T>::load(x + c);  // row 0
    if (norm_stats(x, rows, C, shift.data(), s1.data(), s2.data(), mn.data(), mx.data())) return 1;
    for (int64_t c = 0; c < C; ++c) {
        const double d = s1[c] / rows, m = (double)shift[c] + d;
        var[c] = std::max(0.0, s2[c] / rows - d * d);
        invstd[c] = 1.0 / std::sqrt(var[c] + eps);
        const double ac = weight ? invstd[c] * weight[c] : invstd[c];
        mean[c] = (float)m;
        a[c] = (float)ac;
        b[c] = (float)((bias ? (double)bias[c] : 0.0) - m * ac);
    }
    if (res) {
        if (norm_apply_residual(x, res, y, bits, rows, C, a, b, lo, hi, scale)) return 1;
    } else {
        // rounding is monotone and odd: the largest |y| stored is the largest |y| rounded
        *scale = Elem<T>::round(norm_output_absmax(mn.data(), mx.data(), C, a, b, lo, hi));
        if (!std::isfinite(*scale)) return 1;
        norm_apply(x, y, q, rows, C, a, b, lo, hi, *scale);
    }
    const double bessel = (double)rows / (double)std::max<int64_t>(1, rows - 1);  // biased -> unbiased
    for (int64_t c = 0; c < C; ++c) {
        if (running_mean) running_mean[c] = (float)(factor * mean[c] + (1.0 - factor) * running_mean[c]);
        if (running_var) running_var[c] = (float)(factor * (var[c] * bessel) + (1.0 - factor) * running_var[c]);
    }
    return 0;
}

// The backward pass: the sums, the weight's and bias's gradients, then gx with its per-channel max, sums and
// standard deviation (gx = invstd w (g' - sum(g') / n - (x - mean) invstd^2 sum(g' (x - mean)) / n)).
// With a residual (bits, the forward's mask of its output y, not null), g' is masked by them and written to gr
// first.
// Returns 1 where gx has a NaN or an Inf.
template <class T>
static int norm_backward(const T* g, const uint8_t* bits, const T* x, T* gr, T* gx, int64_t rows, int64_t C,
                         const float* weight, const float* a, const float* b, float lo, float hi, const float* mean,
                         const double* invstd, float* gw, float* gb, float* gmax, double* m1, double* m2, float* sd) {
    std::vector<double> sg(C), sgx(C);
    if (bits) {
        norm_grad_sums_residual(g, bits, x, gr, rows, C, mean, sg.data(), sgx.data());
        g = gr;  // the apply pass reads g' as it is: no mask left
        lo = -std::numeric_limits<float>::infinity(), hi = std::numeric_limits<float>::infinity();
    } else {
        Elem<T>::mask_bounds(lo, hi, lo, hi);
        norm_grad_sums(g, x, rows, C, a, b, lo, hi, mean, sg.data(), sgx.data());
    }
    std::vector<float> c1(C), c2(C), c3(C);
    for (int64_t c = 0; c < C; ++c) {
        const double k = weight ? invstd[c] * weight[c] : invstd[c];
        c1[c] = (float)k;
        c2[c] = (float)(-k * invstd[c] * invstd[c] * sgx[c] / rows);
        c3[c] = (float)(-k * sg[c] / rows);
        gw[c] = (float)(sgx[c] * invstd[c]);
        gb[c] = (float)sg[c];
    }
    const int bad =
        norm_grad_apply(g, x, gx, rows, C, a, b, lo, hi, mean, c1.data(), c2.data(), c3.data(), gmax, m1, m2);
    population_std(m1, m2, C, rows, sd);
    return bad;
}

}  // namespace rq

using namespace rq;

extern "C" {

// bf16: x, res, y (g, x, gr, gx) are bfloat16, else float32; res (bits, gr) null: no residual; bits: the mask
// of a residual's output (norm_apply_residual)
int rq_norm_forward(const void* x, const void* res, void* y, int8_t* q, uint8_t* bits, int64_t rows, int64_t C,
                    const float* weight, const float* bias, double eps, float lo, float hi, float* mean,
                    double* invstd, double* var, float* a, float* b, float* scale, float* running_mean,
                    float* running_var, double factor, int bf16) {
    if (bf16)
        return norm_forward(static_cast<const uint16_t*>(x), static_cast<const uint16_t*>(res),
                            static_cast<uint16_t*>(y), q, bits, rows, C, weight, bias, eps, lo, hi, mean, invstd, var,
                            a, b, scale, running_mean, running_var, factor);
    return norm_forward(static_cast<const float*>(x), static_cast<const float*>(res), static_cast<float*>(y), q, bits,
                        rows, C, weight, bias, eps, lo, hi, mean, invstd, var, a, b, scale, running_mean, running_var,
                        factor);
}

int rq_norm_backward(const void* g, const uint8_t* bits, const void* x, void* gr, void* gx, int64_t rows, int64_t C,
                     const float* weight, const float* a, const float* b, float lo, float hi, const float* mean,
                     const double* invstd, float* gw, float* gb, float* gmax, double* m1, double* m2, float* sd,
                     int bf16) {
    if (bf16)
        return norm_backward(static_cast<const uint16_t*>(g), bits, static_cast<const uint16_t*>(x),
                             static_cast<uint16_t*>(gr), static_cast<uint16_t*>(gx), rows, C, weight, a, b, lo, hi,
                             mean, invstd, gw, gb, gmax, m1, m2, sd);
    return norm_backward(static_cast<const float*>(g), bits, static_cast<const float*>(x),
                         static_cast<float*>(gr), static_cast<float*>(gx), rows, C, weight, a, b, lo, hi, mean, invstd,
                         gw, gb, gmax, m1, m2, sd);
}

}  // extern "C"
