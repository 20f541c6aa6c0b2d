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
// Unfused, torch's BatchNorm, its activation (with the copy autograd keeps of an in-place ReLU6) and the
// quantizer's max and codes read or write every element 9 times forward and 9 times backward; here 4 and 5
// (docs/kernels.md). Tensors are float32, channels innermost: rows x C (N, H, W flattened).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <omp.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "codes.h"
#include "moments.h"

namespace rq {

constexpr int64_t NORM_PARALLEL_MIN = 1 << 15;  // elements below which a pass stays on one thread
constexpr int64_t NORM_BLOCK = 64;              // rows whose float sums go into double together
// outputs of this many bytes and more are written with non-temporal stores: they outgrow the caches, and a
// plain store first reads each line it overwrites (forward 16%, backward 22% faster at 38 MB, Zen 3)
constexpr int64_t STREAM_BYTES = 4 << 20;

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
static int norm_stats(const float* x, int64_t rows, int64_t C, const float* shift, double* s1, double* s2, float* mn,
                      float* mx) {
    Partials P(C);
    over_rows(rows, C, P, [&](size_t o, int64_t r) {
        float *p1 = P.f1.data() + o, *p2 = P.f2.data() + o, *lo = P.lo.data() + o, *hi = P.hi.data() + o;
        const float* row = x + r * C;
        int64_t c = 0;
#ifdef __AVX2__
        for (; c + 8 <= C; c += 8) {
            const __m256 a = _mm256_loadu_ps(row + c), d = _mm256_sub_ps(a, _mm256_loadu_ps(shift + c));
            _mm256_storeu_ps(p1 + c, _mm256_add_ps(_mm256_loadu_ps(p1 + c), d));
            _mm256_storeu_ps(p2 + c, _mm256_add_ps(_mm256_loadu_ps(p2 + c), _mm256_mul_ps(d, d)));
            _mm256_storeu_ps(lo + c, _mm256_min_ps(_mm256_loadu_ps(lo + c), a));
            _mm256_storeu_ps(hi + c, _mm256_max_ps(_mm256_loadu_ps(hi + c), a));
        }
#endif
        for (; c < C; ++c) {
            const float a = row[c], d = a - shift[c];
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

// y = clamp(x a_c + b_c, lo, hi); q (unless null) = the nearest codes of y with scale s
static void norm_apply(const float* x, float* y, int8_t* q, int64_t rows, int64_t C, const float* a, const float* b,
                       float lo, float hi, float s) {
    const float inv = inv_scale(s);
    const bool stream = rows * C * 4 >= STREAM_BYTES && C % 8 == 0 && reinterpret_cast<uintptr_t>(y) % 32 == 0;
#pragma omp parallel if (rows * C >= NORM_PARALLEL_MIN)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
            const int64_t base = r * C;
            int64_t c = 0;
#ifdef __AVX2__
            const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi), vinv = _mm256_set1_ps(inv);
            for (; c + 8 <= C; c += 8) {
                const __m256 z = _mm256_add_ps(
                    _mm256_mul_ps(_mm256_loadu_ps(x + base + c), _mm256_loadu_ps(a + c)), _mm256_loadu_ps(b + c));
                const __m256 v = _mm256_min_ps(_mm256_max_ps(z, vlo), vhi);
                if (stream) _mm256_stream_ps(y + base + c, v);
                else _mm256_storeu_ps(y + base + c, v);
                if (q) store8(q + base + c, codes_nearest8(v, vinv));  // read next by the convolution: cached
            }
#endif
            for (; c < C; ++c) {
                const float v = activate(x[base + c] * a[c] + b[c], lo, hi);
                y[base + c] = v;
                if (q) q[base + c] = code_nearest(v, inv);
            }
        }
#ifdef __AVX2__
        _mm_sfence();  // the non-temporal stores, seen by every thread after the region
#endif
    }
}

// g' = g where lo < x a + b < hi (torch's activation backward passes the gradient where its output lies
// strictly inside the bounds); the vector form also gives d = x - mean, for the 8 channels from c
static inline float masked1(float g, float x, float a, float b, float lo, float hi) {
    const float z = x * a + b;
    return (z > lo && z < hi) ? g : 0.0f;
}

#ifdef __AVX2__
static inline void masked8(const float* gr, const float* xr, const float* a, const float* b, const float* mean,
                           int64_t c, __m256 lo, __m256 hi, __m256& gp, __m256& d) {
    const __m256 xv = _mm256_loadu_ps(xr + c);
    const __m256 z = _mm256_add_ps(_mm256_mul_ps(xv, _mm256_loadu_ps(a + c)), _mm256_loadu_ps(b + c));
    const __m256 inside = _mm256_and_ps(_mm256_cmp_ps(z, lo, _CMP_GT_OQ), _mm256_cmp_ps(z, hi, _CMP_LT_OQ));
    gp = _mm256_and_ps(_mm256_loadu_ps(gr + c), inside);
    d = _mm256_sub_ps(xv, _mm256_loadu_ps(mean + c));
}
#endif

// Backward sums per channel: of g' and of g' (x - mean_c)
static void norm_grad_sums(const float* g, const float* x, int64_t rows, int64_t C, const float* a, const float* b,
                           float lo, float hi, const float* mean, double* sg, double* sgx) {
    Partials P(C);
    over_rows(rows, C, P, [&](size_t o, int64_t r) {
        float *p1 = P.f1.data() + o, *p2 = P.f2.data() + o;
        const float *gr = g + r * C, *xr = x + r * C;
        int64_t c = 0;
#ifdef __AVX2__
        const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
        for (; c + 8 <= C; c += 8) {
            __m256 gp, d;
            masked8(gr, xr, a, b, mean, c, vlo, vhi, gp, d);
            _mm256_storeu_ps(p1 + c, _mm256_add_ps(_mm256_loadu_ps(p1 + c), gp));
            _mm256_storeu_ps(p2 + c, _mm256_add_ps(_mm256_loadu_ps(p2 + c), _mm256_mul_ps(gp, d)));
        }
#endif
        for (; c < C; ++c) {
            const float gp = masked1(gr[c], xr[c], a[c], b[c], lo, hi);
            p1[c] += gp;
            p2[c] += gp * (xr[c] - mean[c]);
        }
    });
    P.reduce(sg, sgx, nullptr, nullptr);
}

// gx = g' c1_c + (x - mean_c) c2_c + c3_c, with per channel max|gx| (gmax), sum (s1) and sum of squares (s2)
// of gx. Returns 1 where gx has a NaN or an Inf (Partials::reduce).
static int norm_grad_apply(const float* g, const float* x, float* gx, int64_t rows, int64_t C, const float* a,
                           const float* b, float lo, float hi, const float* mean, const float* c1, const float* c2,
                           const float* c3, float* gmax, double* s1, double* s2) {
    Partials P(C);  // hi holds max|gx| (from -inf: every |gx| is above it)
    const bool stream = rows * C * 4 >= STREAM_BYTES && C % 8 == 0 && reinterpret_cast<uintptr_t>(gx) % 32 == 0;
    over_rows(rows, C, P, [&](size_t o, int64_t r) {
        float *p1 = P.f1.data() + o, *p2 = P.f2.data() + o, *m = P.hi.data() + o;
        const float *gr = g + r * C, *xr = x + r * C;
        float* out = gx + r * C;
        int64_t c = 0;
#ifdef __AVX2__
        const __m256 vlo = _mm256_set1_ps(lo), vhi = _mm256_set1_ps(hi);
        for (; c + 8 <= C; c += 8) {
            __m256 gp, d;
            masked8(gr, xr, a, b, mean, c, vlo, vhi, gp, d);
            const __m256 v = _mm256_add_ps(
                _mm256_add_ps(_mm256_mul_ps(gp, _mm256_loadu_ps(c1 + c)), _mm256_mul_ps(d, _mm256_loadu_ps(c2 + c))),
                _mm256_loadu_ps(c3 + c));
            if (stream) _mm256_stream_ps(out + c, v);
            else _mm256_storeu_ps(out + c, v);
            _mm256_storeu_ps(m + c, _mm256_max_ps(_mm256_loadu_ps(m + c), abs8(v)));
            _mm256_storeu_ps(p1 + c, _mm256_add_ps(_mm256_loadu_ps(p1 + c), v));
            _mm256_storeu_ps(p2 + c, _mm256_add_ps(_mm256_loadu_ps(p2 + c), _mm256_mul_ps(v, v)));
        }
#endif
        for (; c < C; ++c) {
            const float gp = masked1(gr[c], xr[c], a[c], b[c], lo, hi);
            const float v = gp * c1[c] + (xr[c] - mean[c]) * c2[c] + c3[c];
            out[c] = v;
            m[c] = std::fmax(m[c], std::fabs(v));
            p1[c] += v;
            p2[c] += v * v;
        }
    });
    return P.reduce(s1, s2, nullptr, gmax);
}

// The forward pass: statistics, the per-channel coefficients (in double), y's scale, then y and its codes.
// weight / bias may be null (no affine). The running statistics (unless null) move towards the batch's as
// torch's BatchNorm moves them (Normalization.cpp, batch_norm_cpu_update_stats_template: in double, from
// the float32 mean and the unbiased variance, with momentum `factor`), here rather than in five torch ops
// (tens of microseconds a layer). Returns 1 on a NaN or an Inf in x or in the scale.
static int norm_forward(const float* x, float* y, int8_t* q, int64_t rows, int64_t C, const float* weight,
                        const float* bias, double eps, float lo, float hi, float* mean, double* invstd, double* var,
                        float* a, float* b, float* scale, float* running_mean, float* running_var, double factor) {
    std::vector<double> s1(C), s2(C);
    std::vector<float> mn(C), mx(C);
    if (norm_stats(x, rows, C, x, s1.data(), s2.data(), mn.data(), mx.data())) return 1;  // shift: row 0
    for (int64_t c = 0; c < C; ++c) {
        const double d = s1[c] / rows, m = (double)x[c] + d;
        var[c] = std::max(0.0, s2[c] / rows - d * d);
        invstd[c] = 1.0 / std::sqrt(var[c] + eps);
        const double ac = weight ? invstd[c] * weight[c] : invstd[c];
        mean[c] = (float)m;
        a[c] = (float)ac;
        b[c] = (float)((bias ? (double)bias[c] : 0.0) - m * ac);
    }
    *scale = norm_output_absmax(mn.data(), mx.data(), C, a, b, lo, hi);
    if (!std::isfinite(*scale)) return 1;
    const double bessel = (double)rows / (double)std::max<int64_t>(1, rows - 1);  // biased -> unbiased
    for (int64_t c = 0; c < C; ++c) {
        if (running_mean) running_mean[c] = (float)(factor * mean[c] + (1.0 - factor) * running_mean[c]);
        if (running_var) running_var[c] = (float)(factor * (var[c] * bessel) + (1.0 - factor) * running_var[c]);
    }
    norm_apply(x, y, q, rows, C, a, b, lo, hi, *scale);
    return 0;
}

// The backward pass: the sums, the weight's and bias's gradients, then gx with its per-channel max, sums and
// standard deviation (gx = invstd w (g' - sum(g') / n - (x - mean) invstd^2 sum(g' (x - mean)) / n)).
// Returns 1 where gx has a NaN or an Inf.
static int norm_backward(const float* g, const float* x, float* gx, int64_t rows, int64_t C, const float* weight,
                         const float* a, const float* b, float lo, float hi, const float* mean, const double* invstd,
                         float* gw, float* gb, float* gmax, double* m1, double* m2, float* sd) {
    std::vector<double> sg(C), sgx(C);
    norm_grad_sums(g, x, rows, C, a, b, lo, hi, mean, sg.data(), sgx.data());
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

int rq_norm_forward(const float* x, float* y, int8_t* q, int64_t rows, int64_t C, const float* weight, const float* bias,
                    double eps, float lo, float hi, float* mean, double* invstd, double* var, float* a, float* b,
                    float* scale, float* running_mean, float* running_var, double factor) {
    return norm_forward(x, y, q, rows, C, weight, bias, eps, lo, hi, mean, invstd, var, a, b, scale, running_mean,
                        running_var, factor);
}

int rq_norm_backward(const float* g, const float* x, float* gx, int64_t rows, int64_t C, const float* weight,
                     const float* a, const float* b, float lo, float hi, const float* mean, const double* invstd,
                     float* gw, float* gb, float* gmax, double* m1, double* m2, float* sd) {
    return norm_backward(g, x, gx, rows, C, weight, a, b, lo, hi, mean, invstd, gw, gb, gmax, m1, m2, sd);
}

}  // extern "C"
