// The CPU backend's quantizer, fused: absmax, per-channel moments, and the symmetric int8 codes
//     q = round(127 * clamp(x, -s, s) / s)   (nearest: half to even; stochastic: floor(v + u))
// computed as repro.quant's reference does (inv = 127 / s in fp32, v = clamp(x * inv, -127, 127)), so nearest
// codes are bit-identical; stochastic noise comes from Philox (philox.h), the stream the CUDA kernel draws.
//
// Tensors arrive dense (every element once in one block of memory, any permutation of dimensions: NCHW,
// channels-last, ...) as float32, bfloat16 or float16. A per-channel quantity along a dimension of stride
// `inner` and size C sees memory as (outer, C, inner). Every function returns 1 when it met a NaN or an
// Inf (the caller raises), else 0. Multi-threaded with OpenMP (torch's runtime: torch.set_num_threads
// applies), vectorised with AVX2 where the compiler targets it (-march=native), scalar otherwise.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include <omp.h>

#include "bf16.h"
#include "codes.h"
#include "moments.h"
#include "philox.h"

namespace rq {

enum Dtype { F32 = 0, BF16 = 1, F16 = 2 };
// below this many elements a pass stays on one thread, as torch's grain size: a parallel region waits for
// every thread, and on a loaded machine that wait cost milliseconds per call (measured)
constexpr int64_t PARALLEL_MIN = 1 << 15;

static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {  // subnormal: normalise
            int e = -1;
            uint32_t m = mant;
            do {
                ++e;
                m <<= 1;
            } while (!(m & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((m & 0x3FF) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7F800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

template <int DT>
static inline float load1(const void* p, int64_t i) {
    if constexpr (DT == F32) return static_cast<const float*>(p)[i];
    else if constexpr (DT == BF16) return bf16_to_f32(static_cast<const uint16_t*>(p)[i]);
    else return f16_to_f32(static_cast<const uint16_t*>(p)[i]);
}

static inline int8_t code_stochastic(float x, float inv, float u) {
    return (int8_t)(int)clamp_code(std::floor(clamp_code(x * inv) + u));
}

#ifdef __AVX2__
template <int DT>
static inline __m256 load8(const void* p, int64_t i) {
    if constexpr (DT == F32) {
        return _mm256_loadu_ps(static_cast<const float*>(p) + i);
    } else if constexpr (DT == BF16) {
        return load_bf16x8(static_cast<const uint16_t*>(p) + i);
    } else {
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i)));
    }
}

#ifdef __AVX512F__
template <int DT>
static inline __m512 load16(const void* p, int64_t i) {
    const auto* h = reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(p) + i);
    if constexpr (DT == F32) return _mm512_loadu_ps(static_cast<const float*>(p) + i);
    else if constexpr (DT == BF16) return load_bf16x16(static_cast<const uint16_t*>(p) + i);
    else return _mm512_cvtph_ps(_mm256_loadu_si256(h));
}
#endif

// floor(clamp(x inv) + u): in [-127, 128], as 127 + u rounds up to 128 for u >= 1 - 2^-18. Without
// code_stochastic's last clamp: store8 and store32 saturate to int8, which takes 128 to the clamp's 127.
static inline __m256 codes_stochastic8(__m256 x, __m256 inv, __m256 u) {
    return _mm256_floor_ps(_mm256_add_ps(clamp8(_mm256_mul_ps(x, inv)), u));
}

#endif

// ------------------------------------------------------------------------------------------------------
// reductions

// max|x| as the largest magnitude bit pattern: for floats without their sign bit the integer order is the
// float order, and NaN and +-Inf are the patterns from 0x7F800000 up, so one integer max per vector finds the
// maximum and any non-finite value at once. Four independent accumulators: a single max chain (and a second
// one for the non-finite check) held the loop to a vector every few cycles, 6x the time of torch's sum of the
// same tensor (measured)
template <int DT>
static int absmax_impl(const void* x, int64_t n, float* out) {
    constexpr uint32_t MAGNITUDE = 0x7FFFFFFFu, NONFINITE = 0x7F800000u;
    uint32_t best = 0;
#pragma omp parallel reduction(max : best) if (n >= PARALLEL_MIN)
    {
        uint32_t m = 0;
        int64_t i0 = 0;
#ifdef __AVX2__
        const __m256i mag = _mm256_set1_epi32((int)MAGNITUDE);
        __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
        const int64_t nv = n / 32;
#pragma omp for schedule(static) nowait
        for (int64_t v = 0; v < nv; ++v) {
            const int64_t i = 32 * v;
            a0 = _mm256_max_epu32(a0, _mm256_and_si256(_mm256_castps_si256(load8<DT>(x, i)), mag));
            a1 = _mm256_max_epu32(a1, _mm256_and_si256(_mm256_castps_si256(load8<DT>(x, i + 8)), mag));
            a2 = _mm256_max_epu32(a2, _mm256_and_si256(_mm256_castps_si256(load8<DT>(x, i + 16)), mag));
            a3 = _mm256_max_epu32(a3, _mm256_and_si256(_mm256_castps_si256(load8<DT>(x, i + 24)), mag));
        }
        alignas(32) uint32_t t[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(t), _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3)));
        for (uint32_t e : t) m = std::max(m, e);
        i0 = nv * 32;
#endif
#pragma omp single nowait
        for (int64_t i = i0; i < n; ++i) {
            const float a = load1<DT>(x, i);
            uint32_t bits;
            std::memcpy(&bits, &a, sizeof bits);
            m = std::max(m, bits & MAGNITUDE);
        }
        best = std::max(best, m);
    }
    if (best >= NONFINITE) {
        *out = std::numeric_limits<float>::quiet_NaN();
        return 1;
    }
    std::memcpy(out, &best, sizeof best);
    return 0;
}

// max|x|, the sum and the sum of squares of the contiguous run x[i0, i1); returns 1 on a NaN or an Inf
template <int DT>
static int run_stats(const void* x, int64_t i0, int64_t i1, float& mx, double& a1, double& a2) {
    int bad = 0;
    int64_t i = i0;
#ifdef __AVX2__
    __m256 vm = _mm256_setzero_ps(), v1 = _mm256_setzero_ps(), v2 = _mm256_setzero_ps(), vb = _mm256_setzero_ps();
    for (; i + 8 <= i1; i += 8) {
        const __m256 a = load8<DT>(x, i);
        vb = _mm256_or_ps(vb, bad8(a));
        vm = _mm256_max_ps(vm, abs8(a));
        v1 = _mm256_add_ps(v1, a);
        v2 = _mm256_add_ps(v2, _mm256_mul_ps(a, a));
    }
    bad |= _mm256_movemask_ps(vb) != 0;
    alignas(32) float tm[8], t1[8], t2[8];
    _mm256_store_ps(tm, vm);
    _mm256_store_ps(t1, v1);
    _mm256_store_ps(t2, v2);
    for (int l = 0; l < 8; ++l) {
        mx = std::fmax(mx, tm[l]);
        a1 += t1[l];
        a2 += t2[l];
    }
#endif
    for (; i < i1; ++i) {
        const float a = load1<DT>(x, i);
        bad |= nonfinite(a);
        mx = std::fmax(mx, std::fabs(a));
        a1 += a;
        a2 += (double)a * a;
    }
    return bad;
}

// Per-channel max|x|, and (moments != nullptr) sum and sum of squares, over memory (outer, C, inner).
template <int DT>
static int channel_stats_impl(const void* x, int64_t outer, int64_t C, int64_t inner, float* amax, double* sum,
                              double* sumsq, float* sd) {
    const int nt = omp_get_max_threads();
    std::vector<float> tmax((size_t)nt * C, 0.0f);
    std::vector<double> tsum(sum ? (size_t)nt * C : 0, 0.0), tsq(sum ? (size_t)nt * C : 0, 0.0);
    int bad = 0;
#pragma omp parallel reduction(| : bad) if (outer * C * inner >= PARALLEL_MIN)
    {
        const int t = omp_get_thread_num();
        float* m = tmax.data() + (size_t)t * C;
        double* s1 = sum ? tsum.data() + (size_t)t * C : nullptr;
        double* s2 = sum ? tsq.data() + (size_t)t * C : nullptr;
        if (C == 1) {
            // one channel (the whole tensor): chunks of the flat memory
            const int64_t n = outer * inner, CH = 1 << 14;
#pragma omp for schedule(static)
            for (int64_t i0 = 0; i0 < n; i0 += CH) {
                float mx = 0.0f;
                double a1 = 0.0, a2 = 0.0;
                bad |= run_stats<DT>(x, i0, std::min(n, i0 + CH), mx, a1, a2);
                m[0] = std::fmax(m[0], mx);
                if (sum) {
                    s1[0] += a1;
                    s2[0] += a2;
                }
            }
        } else if (inner == 1) {
            // channels innermost: float partial sums over blocks of rows, flushed into double
            const int64_t BLOCK = 64;
            std::vector<float> p1(sum ? C : 0, 0.0f), p2(sum ? C : 0, 0.0f);
            const int64_t nblocks = (outer + BLOCK - 1) / BLOCK;
#pragma omp for schedule(static)
            for (int64_t blk = 0; blk < nblocks; ++blk) {
                const int64_t o1 = std::min(outer, (blk + 1) * BLOCK);
                for (int64_t o = blk * BLOCK; o < o1; ++o) {
                    const int64_t base = o * C;
                    int64_t c = 0;
#ifdef __AVX2__
                    for (; c + 8 <= C; c += 8) {
                        const __m256 a = load8<DT>(x, base + c);
                        bad |= _mm256_movemask_ps(bad8(a)) != 0;
                        _mm256_storeu_ps(m + c, _mm256_max_ps(_mm256_loadu_ps(m + c), abs8(a)));
                        if (sum) {
                            _mm256_storeu_ps(p1.data() + c, _mm256_add_ps(_mm256_loadu_ps(p1.data() + c), a));
                            _mm256_storeu_ps(p2.data() + c,
                                             _mm256_add_ps(_mm256_loadu_ps(p2.data() + c), _mm256_mul_ps(a, a)));
                        }
                    }
#endif
                    for (; c < C; ++c) {
                        const float a = load1<DT>(x, base + c);
                        bad |= nonfinite(a);
                        m[c] = std::fmax(m[c], std::fabs(a));
                        if (sum) {
                            p1[c] += a;
                            p2[c] += a * a;
                        }
                    }
                }
                if (sum) {
                    for (int64_t c = 0; c < C; ++c) {
                        s1[c] += p1[c];
                        s2[c] += p2[c];
                        p1[c] = p2[c] = 0.0f;
                    }
                }
            }
        } else {
            // a channel is a run of `inner` consecutive elements
#pragma omp for schedule(static)
            for (int64_t oc = 0; oc < outer * C; ++oc) {
                const int64_t c = oc % C, base = oc * inner;
                float mx = 0.0f;
                double a1 = 0.0, a2 = 0.0;
                bad |= run_stats<DT>(x, base, base + inner, mx, a1, a2);
                m[c] = std::fmax(m[c], mx);
                if (sum) {
                    s1[c] += a1;
                    s2[c] += a2;
                }
            }
        }
    }
    for (int64_t c = 0; c < C; ++c) {
        float mx = 0.0f;
        double a1 = 0.0, a2 = 0.0;
        for (int t = 0; t < nt; ++t) {
            mx = std::fmax(mx, tmax[(size_t)t * C + c]);
            if (sum) {
                a1 += tsum[(size_t)t * C + c];
                a2 += tsq[(size_t)t * C + c];
            }
        }
        amax[c] = mx;
        if (sum) {
            sum[c] = a1;
            sumsq[c] = a2;
        }
    }
    if (sum && sd) population_std(sum, sumsq, C, outer * inner, sd);
    return bad;
}

// ------------------------------------------------------------------------------------------------------
// quantization

struct Plan {
    int ndim;
    int64_t size[8], stride[8];
    const float* inv;  // per channel along `axis`, or one value
    int axis;          // logical dimension of the channel (per-channel scale and/or counts), -1: none
    int per_channel;   // inv has one value per channel
    const float* thresh;  // count |x| > thresh[c] per channel (DAIQ's fraction above sigma), or null
    uint32_t* count;      // per thread x channel
    int64_t C;
    uint32_t k0, k1;
};

// Nearest rounding (no noise): a flat pass over memory, seen as (outer, C, inner) around the channel axis.
template <int DT>
static int quantize_flat(const void* x, int8_t* q, const Plan& p, int64_t n) {
    const int64_t C = p.axis >= 0 ? p.size[p.axis] : 1;
    // runs of `inner` consecutive elements of one channel; per tensor, chunks of the flat memory
    const int64_t inner = p.axis >= 0 ? p.stride[p.axis] : std::min<int64_t>(n, 1 << 14);
    const int64_t runs = (n + inner - 1) / inner;
    int bad = 0;
#pragma omp parallel reduction(| : bad) if (n >= PARALLEL_MIN)
    {
        uint32_t* cnt = p.count ? p.count + (size_t)omp_get_thread_num() * p.C : nullptr;
        if (p.axis >= 0 && inner == 1 && C > 1) {
            // channels innermost: lanes are consecutive channels
#pragma omp for schedule(static)
            for (int64_t o = 0; o < n / C; ++o) {
                const int64_t base = o * C;
                int64_t c = 0;
#ifdef __AVX512F__
                for (; !cnt && c + 16 <= C; c += 16) {  // 16 lanes (the counts stay on the 8-lane loop)
                    const __m512 a = load16<DT>(x, base + c);
                    bad |= _mm512_cmp_ps_mask(abs16(a), _mm512_set1_ps(std::numeric_limits<float>::max()),
                                              _CMP_NLE_UQ) != 0;
                    const __m512 inv = p.per_channel ? _mm512_loadu_ps(p.inv + c) : _mm512_set1_ps(p.inv[0]);
                    store16(q + base + c, codes_nearest16(a, inv));
                }
#endif
#ifdef __AVX2__
                for (; c + 8 <= C; c += 8) {
                    const __m256 a = load8<DT>(x, base + c);
                    bad |= _mm256_movemask_ps(bad8(a)) != 0;
                    const __m256 inv = p.per_channel ? _mm256_loadu_ps(p.inv + c) : _mm256_set1_ps(p.inv[0]);
                    store8(q + base + c, codes_nearest8(a, inv));
                    if (cnt) {
                        const __m256i gt = _mm256_castps_si256(
                            _mm256_cmp_ps(abs8(a), _mm256_loadu_ps(p.thresh + c), _CMP_GT_OQ));
                        __m256i* dst = reinterpret_cast<__m256i*>(cnt + c);
                        _mm256_storeu_si256(dst, _mm256_sub_epi32(_mm256_loadu_si256(dst), gt));
                    }
                }
#endif
                for (; c < C; ++c) {
                    const float a = load1<DT>(x, base + c);
                    bad |= nonfinite(a);
                    q[base + c] = code_nearest(a, p.per_channel ? p.inv[c] : p.inv[0]);
                    if (cnt) cnt[c] += std::fabs(a) > p.thresh[c];
                }
            }
        } else {
#pragma omp for schedule(static)
            for (int64_t r = 0; r < runs; ++r) {
                const int64_t c = r % C, base = r * inner, len = std::min(inner, n - base);
                const float inv = p.per_channel ? p.inv[c] : p.inv[0];
                uint32_t above = 0;
                int64_t i = 0;
#ifdef __AVX512F__
                if (!cnt) {  // 16 lanes (the counts stay on the 8-lane loop)
                    const __m512 vinv = _mm512_set1_ps(inv), big = _mm512_set1_ps(std::numeric_limits<float>::max());
                    __mmask16 vb = 0;
                    for (; i + 16 <= len; i += 16) {
                        const __m512 a = load16<DT>(x, base + i);
                        vb |= _mm512_cmp_ps_mask(abs16(a), big, _CMP_NLE_UQ);
                        store16(q + base + i, codes_nearest16(a, vinv));
                    }
                    bad |= vb != 0;
                }
#endif
#ifdef __AVX2__
                const __m256 vinv = _mm256_set1_ps(inv);
                __m256 vb = _mm256_setzero_ps();
                for (; i + 8 <= len; i += 8) {
                    const __m256 a = load8<DT>(x, base + i);
                    vb = _mm256_or_ps(vb, bad8(a));
                    store8(q + base + i, codes_nearest8(a, vinv));
                    if (cnt) {
                        const __m256 gt = _mm256_cmp_ps(abs8(a), _mm256_set1_ps(p.thresh[c]), _CMP_GT_OQ);
                        above += __builtin_popcount(_mm256_movemask_ps(gt));
                    }
                }
                bad |= _mm256_movemask_ps(vb) != 0;
#endif
                for (; i < len; ++i) {
                    const float a = load1<DT>(x, base + i);
                    bad |= nonfinite(a);
                    q[base + i] = code_nearest(a, inv);
                    if (cnt) above += std::fabs(a) > p.thresh[c];
                }
                if (cnt) cnt[c] += above;
            }
        }
    }
    return bad;
}

// Row coefficients: r = sum over d < ndim - 1 of index_d * R[d] (the row-major index of a row).
static void row_coefficients(const Plan& p, int64_t* R) {
    int64_t acc = 1;
    for (int d = p.ndim - 2; d >= 0; --d) {
        R[d] = acc;
        acc *= p.size[d];
    }
}

// Stochastic rounding, any dense layout, one element at a time (Philox once per group of 4).
template <int DT>
static int quantize_stochastic_scalar(const void* x, int8_t* q, const Plan& p) {
    int64_t R[8];
    row_coefficients(p, R);
    const int last = p.ndim - 1;
    const int64_t L = p.size[last], rows = [&] {
        int64_t r = 1;
        for (int d = 0; d < last; ++d) r *= p.size[d];
        return r;
    }();
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (rows * L >= PARALLEL_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        uint32_t* cnt = p.count ? p.count + (size_t)omp_get_thread_num() * p.C : nullptr;
        int64_t idx[8], rem = r, base = 0;
        for (int d = last - 1; d >= 0; --d) {
            idx[d] = rem % p.size[d];
            rem /= p.size[d];
            base += idx[d] * p.stride[d];
        }
        uint32_t words[4];
        for (int64_t j = 0; j < L; ++j) {
            if ((j & 3) == 0) {
                words[0] = (uint32_t)r;
                words[1] = (uint32_t)((uint64_t)r >> 32);
                words[2] = (uint32_t)(j >> 2);
                words[3] = 0;
                philox(words, p.k0, p.k1);
            }
            const int64_t off = base + j * p.stride[last];
            const int64_t c = p.axis < 0 ? 0 : (p.axis == last ? j : idx[p.axis]);
            const float a = load1<DT>(x, off);
            bad |= nonfinite(a);
            q[off] = code_stochastic(a, p.per_channel ? p.inv[c] : p.inv[0], uniform_of(words[j & 3]));
            if (cnt) cnt[c] += std::fabs(a) > p.thresh[c];
        }
    }
    return bad;
}

#ifdef __AVX2__
// rows r = rbase + (m0 + lane) * Rm of 8 lanes, as 64-bit: the low words in c0, the high ones in c1
static inline void row_counters(int64_t m0, __m256i lane, int64_t Rm, int64_t rbase, __m256i& c0, __m256i& c1) {
    const __m256i mi = _mm256_add_epi32(_mm256_set1_epi32((int)m0), lane);
    const __m256i rm_even = _mm256_mul_epu32(mi, _mm256_set1_epi64x(Rm));
    const __m256i rm_odd = _mm256_mul_epu32(_mm256_srli_epi64(mi, 32), _mm256_set1_epi64x(Rm));
    const __m256i r_even = _mm256_add_epi64(rm_even, _mm256_set1_epi64x(rbase));
    const __m256i r_odd = _mm256_add_epi64(rm_odd, _mm256_set1_epi64x(rbase));
    c0 = _mm256_blend_epi32(r_even, _mm256_slli_epi64(r_odd, 32), 0xAA);
    c1 = _mm256_blend_epi32(_mm256_srli_epi64(r_even, 32), r_odd, 0xAA);
}

// Channels-last stochastic rounding runs in two phases per chunk of up to NOISE_CHUNK channels (m): the Philox
// words of all its blocks first (4 x 2048 words, 32 KB: in L1), then the chunk's elements row by row (j), so
// memory is read in order. Reading the four rows of a block in turn, 32-128 bytes each, took 2-3x as long on
// tensors beyond the cache once a row was 1 KB or more (docs/kernels.md).
constexpr int64_t NOISE_CHUNK = 2048;

#ifdef __AVX512F__
// floor(v + u) as codes_stochastic8 (the same float operations, lane by lane), clamped (store16 would saturate too)
static inline __m512 codes_stochastic16(__m512 x, __m512 inv, __m512 u) {
    return clamp16(_mm512_roundscale_ps(_mm512_add_ps(clamp16(_mm512_mul_ps(x, inv)), u), _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC));
}

// rows r = rbase + (m0 + lane) * Rm of 16 lanes, as 64-bit: the low words in c0, the high ones in c1
static inline void row_counters16(int64_t m0, int64_t Rm, int64_t rbase, __m512i& c0, __m512i& c1) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i mi = _mm512_add_epi32(_mm512_set1_epi32((int)m0), lane);
    const __m512i r_even = _mm512_add_epi64(_mm512_mul_epu32(mi, _mm512_set1_epi64(Rm)), _mm512_set1_epi64(rbase));
    const __m512i r_odd = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(mi, 32), _mm512_set1_epi64(Rm)),
                                           _mm512_set1_epi64(rbase));
    c0 = _mm512_mask_blend_epi32(0xAAAA, r_even, _mm512_slli_epi64(r_odd, 32));
    c1 = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(r_even, 32), r_odd);
}

// Blocks of 32 consecutive m (two chains of 16 Philox calls) of one (outer, j4) work item; returns the first
// m left for the 8-lane code. The noise is the 8-lane code's: element (r, j) takes word j % 4 of its call.
// In two phases per chunk of up to NOISE_CHUNK channels, as the 8-lane code: the words, then the elements.
template <int DT>
static int64_t stochastic_inner_blocks16(const void* x, int8_t* q, const Plan& p, int m, int64_t M, int64_t Rm,
                                         int64_t rbase, int64_t base, int64_t j4, int64_t L, int64_t sj,
                                         const int64_t* idx, const PhiloxKeys16& keys, bool rows_below_2_32,
                                         uint32_t* cnt, __mmask16& bad) {
    const int last = p.ndim - 1;
    const int64_t blocks_end = M / 32 * 32;
    alignas(64) uint32_t words[4][NOISE_CHUNK];
    constexpr int64_t ESIZE = DT == F32 ? 4 : 2;
    for (int64_t c0 = 0; c0 < blocks_end; c0 += NOISE_CHUNK) {
        const int64_t c1 = std::min(c0 + NOISE_CHUNK, blocks_end);
        // the chunk's elements asked for before its Philox rounds, which then run while they arrive: on a
        // gradient beyond the caches the element phase waited on memory after the rounds (Intel AMX, 2 threads:
        // cold 16 x 512 x 14 x 14 float32 1.05-1.18 -> 0.97-1.06 ms, docs/measurements.md)
        for (int w = 0; w < 4 && 4 * j4 + w < L; ++w) {
            const char* row = static_cast<const char*>(x) + (base + (4 * j4 + w) * sj + c0) * ESIZE;
            for (int64_t b = 0; b < (c1 - c0) * ESIZE; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
        }
        for (int64_t m0 = c0; m0 < c1; m0 += 32) {
            __m512i a0, a1, b0, b1;
            row_counters16(m0, Rm, rbase, a0, a1);
            row_counters16(m0 + 16, Rm, rbase, b0, b1);
            __m512i a2 = _mm512_set1_epi32((int)j4), a3 = _mm512_setzero_si512(), b2 = a2, b3 = a3;
            if (rows_below_2_32)  // the counters' high row words are 0: only their first words differ
                philox16x2_shared(a0, a1, a2, a3, b0, b1, b2, b3, (uint32_t)j4, p.k0, p.k1, keys);
            else
                philox16x2(a0, a1, a2, a3, b0, b1, b2, b3, keys);
            const __m512i got[2][4] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}};
            for (int w = 0; w < 4; ++w)
                for (int h = 0; h < 2; ++h) _mm512_store_si512(&words[w][m0 - c0 + 16 * h], got[h][w]);
        }
        for (int w = 0; w < 4; ++w) {
            const int64_t j = 4 * j4 + w;
            if (j >= L) break;
            for (int64_t mh = c0; mh < c1; mh += 16) {
                const int64_t off = base + j * sj + mh;
                __m512 inv;
                if (!p.per_channel) inv = _mm512_set1_ps(p.inv[0]);
                else if (p.axis == m) inv = _mm512_loadu_ps(p.inv + mh);
                else inv = _mm512_set1_ps(p.inv[p.axis == last ? j : idx[p.axis]]);
                const __m512 a = load16<DT>(x, off);
                const __m512i word = _mm512_load_si512(&words[w][mh - c0]);
                bad |= _mm512_cmp_ps_mask(abs16(a), _mm512_set1_ps(std::numeric_limits<float>::max()), _CMP_NLE_UQ);
                store16(q + off, codes_stochastic16(a, inv, uniform16(word)));
                if (cnt) {
                    if (p.axis == m) {
                        const __mmask16 gt = _mm512_cmp_ps_mask(abs16(a), _mm512_loadu_ps(p.thresh + mh), _CMP_GT_OQ);
                        uint32_t* dst = cnt + mh;
                        const __m512i cur = _mm512_loadu_si512(dst);
                        _mm512_storeu_si512(dst, _mm512_mask_add_epi32(cur, gt, cur, _mm512_set1_epi32(1)));
                    } else {
                        const int64_t c = p.axis < 0 ? 0 : (p.axis == last ? j : idx[p.axis]);
                        const __mmask16 gt = _mm512_cmp_ps_mask(abs16(a), _mm512_set1_ps(p.thresh[c]), _CMP_GT_OQ);
                        cnt[c] += __builtin_popcount((unsigned)gt);
                    }
                }
            }
        }
    }
    return blocks_end;
}
#endif

// Stochastic rounding when the innermost dimension in memory, m, is not the last logical one (a
// channels-last gradient): 8 consecutive m share a Philox call with its 4 words for 4 consecutive j.
template <int DT>
static int quantize_stochastic_inner(const void* x, int8_t* q, const Plan& p, int m) {
    int64_t R[8];
    row_coefficients(p, R);
    const int last = p.ndim - 1;
    const int64_t L = p.size[last], M = p.size[m], J4 = (L + 3) / 4, sj = p.stride[last];
    int od[8], no = 0;  // the other dimensions
    int64_t outer = 1;
    for (int d = 0; d < last; ++d)
        if (d != m) {
            od[no++] = d;
            outer *= p.size[d];
        }
    const PhiloxKeys keys(p.k0, p.k1);
#ifdef __AVX512F__
    const PhiloxKeys16 keys16(p.k0, p.k1);
#endif
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int64_t Rm = R[m];
    const bool rows_below_2_32 = (uint64_t)(outer * M) <= (1ull << 32);  // every row r < 2^32
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (outer * L * M >= PARALLEL_MIN)
    for (int64_t t = 0; t < outer * J4; ++t) {
        uint32_t* cnt = p.count ? p.count + (size_t)omp_get_thread_num() * p.C : nullptr;
        const int64_t j4 = t % J4;
        int64_t rem = t / J4, base = 0, rbase = 0, idx[8] = {0};
        for (int k = no - 1; k >= 0; --k) {
            const int d = od[k];
            idx[d] = rem % p.size[d];
            rem /= p.size[d];
            base += idx[d] * p.stride[d];
            rbase += idx[d] * R[d];
        }
        __m256 vb = _mm256_setzero_ps();
        int64_t first = 0;
#ifdef __AVX512F__
        __mmask16 bad16 = 0;
        first = stochastic_inner_blocks16<DT>(x, q, p, m, M, Rm, rbase, base, j4, L, sj, idx, keys16, rows_below_2_32,
                                                  cnt, bad16);
        bad |= bad16 != 0;
#endif
        alignas(32) uint32_t words[4][NOISE_CHUNK + 16];  // a last partial block's lanes past M land in the slack
        for (int64_t c0 = first; c0 < M; c0 += NOISE_CHUNK) {
            const int64_t c1 = std::min(c0 + NOISE_CHUNK, M);
            for (int64_t m0 = c0; m0 < c1; m0 += 16) {  // two blocks' Philox rounds interleaved where two remain
                __m256i a0, a1, b0, b1;
                row_counters(m0, lane, Rm, rbase, a0, a1);
                __m256i a2 = _mm256_set1_epi32((int)j4), a3 = _mm256_setzero_si256(), b2 = a2, b3 = a3;
                const bool two = m0 + 8 < c1;
                if (two) {
                    row_counters(m0 + 8, lane, Rm, rbase, b0, b1);
                    if (rows_below_2_32)  // the counters' high row words are 0: only their first words differ
                        philox8x2_shared(a0, a1, a2, a3, b0, b1, b2, b3, (uint32_t)j4, p.k0, p.k1, keys);
                    else
                        philox8x2(a0, a1, a2, a3, b0, b1, b2, b3, keys);
                } else {
                    philox8(a0, a1, a2, a3, keys);
                }
                const __m256i got[2][4] = {{a0, a1, a2, a3}, {b0, b1, b2, b3}};
                for (int h = 0; h < (two ? 2 : 1); ++h)
                    for (int w = 0; w < 4; ++w)
                        _mm256_store_si256(reinterpret_cast<__m256i*>(&words[w][m0 - c0 + 8 * h]), got[h][w]);
            }
            for (int w = 0; w < 4; ++w) {
                const int64_t j = 4 * j4 + w;
                if (j >= L) break;
                const int64_t row = base + j * sj;
                // the codes of the 8 channels from m0 (floor(v + u), in [-127, 128]), counted where asked
                auto codes8 = [&](int64_t m0) {
                    const __m256 u = uniform8(_mm256_load_si256(reinterpret_cast<const __m256i*>(&words[w][m0 - c0])));
                    __m256 inv;
                    if (!p.per_channel) inv = _mm256_set1_ps(p.inv[0]);
                    else if (p.axis == m) inv = _mm256_loadu_ps(p.inv + m0);
                    else inv = _mm256_set1_ps(p.inv[p.axis == last ? j : idx[p.axis]]);  // per_channel: axis >= 0
                    const __m256 a = load8<DT>(x, row + m0);
                    vb = _mm256_or_ps(vb, bad8(a));
                    if (cnt) {
                        if (p.axis == m) {
                            const __m256i gt =
                                _mm256_castps_si256(_mm256_cmp_ps(abs8(a), _mm256_loadu_ps(p.thresh + m0), _CMP_GT_OQ));
                            __m256i* dst = reinterpret_cast<__m256i*>(cnt + m0);
                            _mm256_storeu_si256(dst, _mm256_sub_epi32(_mm256_loadu_si256(dst), gt));
                        } else {
                            const int64_t c = p.axis < 0 ? 0 : (p.axis == last ? j : idx[p.axis]);
                            const __m256 gt = _mm256_cmp_ps(abs8(a), _mm256_set1_ps(p.thresh[c]), _CMP_GT_OQ);
                            cnt[c] += __builtin_popcount(_mm256_movemask_ps(gt));
                        }
                    }
                    return codes_stochastic8(a, inv, u);
                };
                int64_t m0 = c0;
                for (; m0 + 32 <= c1; m0 += 32) {
                    const __m256 v0 = codes8(m0), v1 = codes8(m0 + 8), v2 = codes8(m0 + 16), v3 = codes8(m0 + 24);
                    store32(q + row + m0, v0, v1, v2, v3);
                }
                for (; m0 + 8 <= c1; m0 += 8) store8(q + row + m0, codes8(m0));
                if (m0 < c1) {  // the last channels, fewer than 8
                    alignas(32) float us[8];
                    _mm256_store_ps(us, uniform8(_mm256_load_si256(reinterpret_cast<const __m256i*>(&words[w][m0 - c0]))));
                    for (int64_t l = 0; m0 + l < c1; ++l) {
                        const int64_t c = p.axis == m ? m0 + l : (p.axis == last ? j : (p.axis >= 0 ? idx[p.axis] : 0));
                        const float a = load1<DT>(x, row + m0 + l);
                        bad |= nonfinite(a);
                        q[row + m0 + l] = code_stochastic(a, p.per_channel ? p.inv[c] : p.inv[0], us[l]);
                        if (cnt) cnt[c] += std::fabs(a) > p.thresh[c];
                    }
                }
            }
        }
        bad |= _mm256_movemask_ps(vb) != 0;
    }
    return bad;
}

#ifdef __AVX512F__
// The 16 words of 4 consecutive calls per 128-bit lane (call 4k + i in lane k of e_i, words in order) as
// 4 vectors of 16 consecutive elements: a 4 x 4 transpose of 128-bit lanes.
static inline void words_in_memory_order16(__m512i c0, __m512i c1, __m512i c2, __m512i c3, __m512 u[4]) {
    const __m512i a01 = _mm512_unpacklo_epi32(c0, c1), b01 = _mm512_unpacklo_epi32(c2, c3);
    const __m512i a23 = _mm512_unpackhi_epi32(c0, c1), b23 = _mm512_unpackhi_epi32(c2, c3);
    const __m512i e0 = _mm512_unpacklo_epi64(a01, b01), e1 = _mm512_unpackhi_epi64(a01, b01);
    const __m512i e2 = _mm512_unpacklo_epi64(a23, b23), e3 = _mm512_unpackhi_epi64(a23, b23);
    const __m512i t0 = _mm512_shuffle_i32x4(e0, e1, 0x44), t1 = _mm512_shuffle_i32x4(e2, e3, 0x44);
    const __m512i t2 = _mm512_shuffle_i32x4(e0, e1, 0xEE), t3 = _mm512_shuffle_i32x4(e2, e3, 0xEE);
    u[0] = uniform16(_mm512_shuffle_i32x4(t0, t1, 0x88));
    u[1] = uniform16(_mm512_shuffle_i32x4(t0, t1, 0xDD));
    u[2] = uniform16(_mm512_shuffle_i32x4(t2, t3, 0x88));
    u[3] = uniform16(_mm512_shuffle_i32x4(t2, t3, 0xDD));
}

// Blocks of 128 elements of row r from j (two chains of 16 Philox calls); returns the first j left for the
// 8-lane code. The noise is the 8-lane code's: element (r, j) takes word j % 4 of call (r, j / 4).
template <int DT>
static int64_t stochastic_row_blocks16(const void* x, int8_t* q, const Plan& p, int64_t r, int64_t base, int64_t j,
                                       int64_t j1, bool row_channel, int64_t rc, const PhiloxKeys16& keys,
                                       uint32_t* cnt, __mmask16& bad) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const __m512i lo = _mm512_set1_epi32((int)(uint32_t)r), hi = _mm512_set1_epi32((int)(uint32_t)((uint64_t)r >> 32));
    for (; j + 128 <= j1; j += 128) {
        __m512i a0 = lo, a1 = hi, a2 = _mm512_add_epi32(_mm512_set1_epi32((int)(j >> 2)), lane);
        __m512i a3 = _mm512_setzero_si512(), b0 = lo, b1 = hi, b3 = a3;
        __m512i b2 = _mm512_add_epi32(a2, _mm512_set1_epi32(16));
        philox16x2(a0, a1, a2, a3, b0, b1, b2, b3, keys);
        __m512 u[8];
        words_in_memory_order16(a0, a1, a2, a3, u);
        words_in_memory_order16(b0, b1, b2, b3, u + 4);
        for (int v = 0; v < 8; ++v) {
            const int64_t jv = j + 16 * v, off = base + jv;
            const __m512 a = load16<DT>(x, off);
            bad |= _mm512_cmp_ps_mask(abs16(a), _mm512_set1_ps(std::numeric_limits<float>::max()), _CMP_NLE_UQ);
            __m512 inv;
            if (!p.per_channel) inv = _mm512_set1_ps(p.inv[0]);
            else if (row_channel) inv = _mm512_set1_ps(p.inv[rc]);
            else inv = _mm512_loadu_ps(p.inv + jv);
            store16(q + off, codes_stochastic16(a, inv, u[v]));
            if (cnt) {
                if (row_channel) {
                    const __mmask16 gt = _mm512_cmp_ps_mask(abs16(a), _mm512_set1_ps(p.thresh[rc]), _CMP_GT_OQ);
                    cnt[rc] += __builtin_popcount((unsigned)gt);
                } else {
                    const __mmask16 gt = _mm512_cmp_ps_mask(abs16(a), _mm512_loadu_ps(p.thresh + jv), _CMP_GT_OQ);
                    uint32_t* dst = cnt + jv;
                    const __m512i cur = _mm512_loadu_si512(dst);
                    _mm512_storeu_si512(dst, _mm512_mask_add_epi32(cur, gt, cur, _mm512_set1_epi32(1)));
                }
            }
        }
    }
    return j;
}
#endif

// Stochastic rounding when the last logical dimension is contiguous (NCHW, linear layers): 8 Philox calls
// give the 32 noise words of 32 consecutive elements of a row, transposed into memory order. Where built
// with AVX-512, rows shorter than ROW_BLOCKED_BELOW go to quantize_stochastic_rows_blocked16, and longer ones
// take 16-lane blocks of 128 elements first.
template <int DT>
static int quantize_stochastic_rows(const void* x, int8_t* q, const Plan& p) {
    const int last = p.ndim - 1;
    const int64_t L = p.size[last];
    int64_t rows = 1;
    for (int d = 0; d < last; ++d) rows *= p.size[d];
    const int64_t CHUNK = 1024;  // elements of a row per work item, so one long row is shared out too
    const int64_t per_row = (L + CHUNK - 1) / CHUNK;
    const PhiloxKeys keys(p.k0, p.k1);
#ifdef __AVX512F__
    const PhiloxKeys16 keys16(p.k0, p.k1);
#endif
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (rows * L >= PARALLEL_MIN)
    for (int64_t t = 0; t < rows * per_row; ++t) {
        uint32_t* cnt = p.count ? p.count + (size_t)omp_get_thread_num() * p.C : nullptr;
        const int64_t r = t / per_row, j0 = (t % per_row) * CHUNK, j1 = std::min(L, j0 + CHUNK);
        int64_t idx[8] = {0}, rem = r, base = 0;
        for (int d = last - 1; d >= 0; --d) {
            idx[d] = rem % p.size[d];
            rem /= p.size[d];
            base += idx[d] * p.stride[d];
        }
        // the channel is constant along the row (or there is one channel): rc; else it is j
        const bool row_channel = p.axis != last;
        const int64_t rc = p.axis >= 0 && p.axis != last ? idx[p.axis] : 0;
        __m256 vb = _mm256_setzero_ps();
        __m256i n0 = _mm256_setzero_si256(), n1 = n0, n2 = n0, n3 = n0;  // the next block's words
        bool have_next = false;
        int64_t j_start = j0;  // a multiple of 32: the 8-lane code's blocks go on from here
#ifdef __AVX512F__
        __mmask16 bad16 = 0;
        j_start = stochastic_row_blocks16<DT>(x, q, p, r, base, j0, j1, row_channel, rc, keys16, cnt, bad16);
        bad |= bad16 != 0;
#endif
        for (int64_t j = j_start; j < j1; j += 32) {
            __m256i c0, c1, c2, c3;
            if (have_next) {  // computed with the previous block
                c0 = n0, c1 = n1, c2 = n2, c3 = n3;
                have_next = false;
            } else {
                c0 = _mm256_set1_epi32((int)(uint32_t)r), c1 = _mm256_set1_epi32((int)(uint32_t)((uint64_t)r >> 32));
                c2 = _mm256_add_epi32(_mm256_set1_epi32((int)(j >> 2)), lane), c3 = _mm256_setzero_si256();
                if (j + 32 < j1) {  // two blocks' Philox rounds interleaved
                    n0 = c0, n1 = c1, n3 = c3;
                    n2 = _mm256_add_epi32(c2, _mm256_set1_epi32(8));
                    philox8x2(c0, c1, c2, c3, n0, n1, n2, n3, keys);
                    have_next = true;
                } else {
                    philox8(c0, c1, c2, c3, keys);
                }
            }
            // words[w] lane l = element 4l + w: transpose to memory order (4 x 8 -> 4 vectors of 8)
            const __m256i a01 = _mm256_unpacklo_epi32(c0, c1), b01 = _mm256_unpacklo_epi32(c2, c3);
            const __m256i a23 = _mm256_unpackhi_epi32(c0, c1), b23 = _mm256_unpackhi_epi32(c2, c3);
            const __m256i e0 = _mm256_unpacklo_epi64(a01, b01), e1 = _mm256_unpackhi_epi64(a01, b01);
            const __m256i e2 = _mm256_unpacklo_epi64(a23, b23), e3 = _mm256_unpackhi_epi64(a23, b23);
            const __m256 u[4] = {uniform8(_mm256_permute2x128_si256(e0, e1, 0x20)),
                                 uniform8(_mm256_permute2x128_si256(e2, e3, 0x20)),
                                 uniform8(_mm256_permute2x128_si256(e0, e1, 0x31)),
                                 uniform8(_mm256_permute2x128_si256(e2, e3, 0x31))};
            // the codes of the 8 elements from j + 8 v (floor(v + u), in [-127, 128]), counted where asked
            auto codes8 = [&](int v) {
                const int64_t jv = j + 8 * v;
                const __m256 a = load8<DT>(x, base + jv);
                vb = _mm256_or_ps(vb, bad8(a));
                __m256 inv;
                if (!p.per_channel) inv = _mm256_set1_ps(p.inv[0]);
                else if (row_channel) inv = _mm256_set1_ps(p.inv[rc]);
                else inv = _mm256_loadu_ps(p.inv + jv);
                if (cnt) {
                    if (row_channel) {
                        const __m256 gt = _mm256_cmp_ps(abs8(a), _mm256_set1_ps(p.thresh[rc]), _CMP_GT_OQ);
                        cnt[rc] += __builtin_popcount(_mm256_movemask_ps(gt));
                    } else {
                        const __m256i gt =
                            _mm256_castps_si256(_mm256_cmp_ps(abs8(a), _mm256_loadu_ps(p.thresh + jv), _CMP_GT_OQ));
                        __m256i* dst = reinterpret_cast<__m256i*>(cnt + jv);
                        _mm256_storeu_si256(dst, _mm256_sub_epi32(_mm256_loadu_si256(dst), gt));
                    }
                }
                return codes_stochastic8(a, inv, u[v]);
            };
            if (j + 32 <= j1) {
                const __m256 v0 = codes8(0), v1 = codes8(1), v2 = codes8(2), v3 = codes8(3);
                store32(q + base + j, v0, v1, v2, v3);
                continue;
            }
            for (int v = 0; v < 4; ++v) {
                const int64_t jv = j + 8 * v;
                if (jv >= j1) break;
                const int64_t off = base + jv;
                if (jv + 8 <= j1) {
                    store8(q + off, codes8(v));
                } else {
                    alignas(32) float us[8];
                    _mm256_store_ps(us, u[v]);
                    for (int64_t l = 0; jv + l < j1; ++l) {
                        const int64_t c = row_channel ? rc : jv + l;
                        const float a = load1<DT>(x, off + l);
                        bad |= nonfinite(a);
                        q[off + l] = code_stochastic(a, p.per_channel ? p.inv[c] : p.inv[0], us[l]);
                        if (cnt) cnt[c] += std::fabs(a) > p.thresh[c];
                    }
                }
            }
        }
        bad |= _mm256_movemask_ps(vb) != 0;
    }
    return bad;
}

// Stochastic rounding of rows shorter than 8 (the last feature maps of an NCHW network: W of 7, 4, 3): the
// Philox calls of 8 rows at once (element (r, j) takes word j % 4 of call (r, j / 4), as everywhere), then
// the elements one by one. The scalar code made one call per 4 elements, 10 rounds of 64-bit multiplies.
template <int DT>
static int quantize_stochastic_short_rows(const void* x, int8_t* q, const Plan& p) {
    const int last = p.ndim - 1;
    const int64_t L = p.size[last], J4 = (L + 3) / 4;
    int64_t rows = 1;
    for (int d = 0; d < last; ++d) rows *= p.size[d];
    const PhiloxKeys keys(p.k0, p.k1);
    const int64_t blocks = (rows + 7) / 8;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (rows * L >= PARALLEL_MIN)
    for (int64_t b = 0; b < blocks; ++b) {
        uint32_t* cnt = p.count ? p.count + (size_t)omp_get_thread_num() * p.C : nullptr;
        const int64_t r0 = 8 * b, nr = std::min<int64_t>(8, rows - r0);
        alignas(32) uint32_t lo[8], hi[8], words[2][4][8];
        for (int l = 0; l < 8; ++l) {
            const uint64_t r = (uint64_t)(r0 + l);
            lo[l] = (uint32_t)r;
            hi[l] = (uint32_t)(r >> 32);
        }
        for (int64_t j4 = 0; j4 < J4; ++j4) {
            __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
            __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
            __m256i c2 = _mm256_set1_epi32((int)j4), c3 = _mm256_setzero_si256();
            philox8(c0, c1, c2, c3, keys);
            const __m256i got[4] = {c0, c1, c2, c3};
            for (int w = 0; w < 4; ++w) _mm256_store_si256(reinterpret_cast<__m256i*>(words[j4][w]), got[w]);
        }
        int64_t idx[8] = {0}, rem = r0, base = 0;  // row r0's index; the next rows' by carrying (no division)
        for (int d = last - 1; d >= 0; --d) {
            idx[d] = rem % p.size[d];
            rem /= p.size[d];
            base += idx[d] * p.stride[d];
        }
        for (int64_t l = 0; l < nr; ++l) {
            if (l > 0) {
                for (int d = last - 1; d >= 0; --d) {
                    base += p.stride[d];
                    if (++idx[d] < p.size[d]) break;
                    base -= p.size[d] * p.stride[d];
                    idx[d] = 0;
                }
            }
            for (int64_t j = 0; j < L; ++j) {
                const int64_t off = base + j * p.stride[last];
                const int64_t c = p.axis < 0 ? 0 : (p.axis == last ? j : idx[p.axis]);
                const float a = load1<DT>(x, off);
                bad |= nonfinite(a);
                q[off] = code_stochastic(a, p.per_channel ? p.inv[c] : p.inv[0], uniform_of(words[j >> 2][j & 3][l]));
                if (cnt) cnt[c] += std::fabs(a) > p.thresh[c];
            }
        }
    }
    return bad;
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// Stochastic rounding of rows shorter than ROW_BLOCKED_BELOW (NCHW feature maps: W of 7-112) with 16-lane
// Philox. A block of rows numbers its calls k = row * J4 + j / 4 in order, 16 a vector, and stores their
// words in that order: row l's noise is then the run u[4 * J4 * l, + L), and its elements go 16 at a time.
// The rows code drew 8 calls per row and block of 32 elements, most of them unused on a row of 7 or 28.
constexpr int64_t ROW_BLOCKED_BELOW = 128;
constexpr int64_t ROW_BLOCK_WORDS = 4096;  // 16 KB of noise per block of rows (in L1)

template <int DT>
static inline __m512 load16_masked(const void* p, int64_t i, __mmask16 m) {
    const auto* h = static_cast<const uint16_t*>(p) + i;
    if constexpr (DT == F32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
    else if constexpr (DT == BF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, h)), 16));
    else return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h));
}

template <int DT>
static int quantize_stochastic_rows_blocked16(const void* x, int8_t* q, const Plan& p) {
    const int last = p.ndim - 1;
    const int64_t L = p.size[last], J4 = (L + 3) / 4;
    int64_t rows = 1;
    for (int d = 0; d < last; ++d) rows *= p.size[d];
    const int64_t R = std::max<int64_t>(1, ROW_BLOCK_WORDS / (4 * J4));  // rows per block
    const int64_t blocks = (rows + R - 1) / R;
    const PhiloxKeys16 keys(p.k0, p.k1);
    const bool row_channel = p.axis != last;  // the channel is constant along a row (or there is one)
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (rows * L >= PARALLEL_MIN)
    for (int64_t b = 0; b < blocks; ++b) {
        uint32_t* cnt = p.count ? p.count + (size_t)omp_get_thread_num() * p.C : nullptr;
        const int64_t r0 = b * R, nr = std::min(R, rows - r0), K = nr * J4;
        alignas(64) float u[ROW_BLOCK_WORDS + 128];
        // each lane's (row in the block, call in the row) for calls k..k+15, stepped by 16 = q16 * J4 + r16
        alignas(64) int32_t rr0[16], jj0[16];
        for (int i = 0; i < 16; ++i) {
            rr0[i] = (int32_t)(i / J4);
            jj0[i] = (int32_t)(i % J4);
        }
        __m512i rr = _mm512_load_si512(rr0), j4 = _mm512_load_si512(jj0);
        const __m512i q16 = _mm512_set1_epi32((int32_t)(16 / J4)), r16 = _mm512_set1_epi32((int32_t)(16 % J4));
        const __m512i vJ4 = _mm512_set1_epi32((int32_t)J4), one = _mm512_set1_epi32(1);
        const __m512i rlo = _mm512_set1_epi32((int)(uint32_t)r0);
        const __m512i rhi = _mm512_set1_epi32((int)(uint32_t)((uint64_t)r0 >> 32));
        auto next = [&](__m512i& c0, __m512i& c1, __m512i& c2, __m512i& c3) {
            c0 = _mm512_add_epi32(rlo, rr);  // row r0 + rr as 64 bits
            c1 = _mm512_mask_add_epi32(rhi, _mm512_cmplt_epu32_mask(c0, rr), rhi, one);
            c2 = j4;
            c3 = _mm512_setzero_si512();
            j4 = _mm512_add_epi32(j4, r16);  // r16 < J4: at most one wrap
            rr = _mm512_add_epi32(rr, q16);
            const __mmask16 wrap = _mm512_cmpge_epi32_mask(j4, vJ4);
            j4 = _mm512_mask_sub_epi32(j4, wrap, j4, vJ4);
            rr = _mm512_mask_add_epi32(rr, wrap, rr, one);
        };
        int64_t idx[8] = {0}, rem = r0, base = 0;  // row r0's index; the next rows' by carrying
        for (int d = last - 1; d >= 0; --d) {
            idx[d] = rem % p.size[d];
            rem /= p.size[d];
            base += idx[d] * p.stride[d];
        }
        // the block's inputs and codes, fetched while Philox runs (the rows are adjacent in an NCHW tensor;
        // elsewhere a prefetch reads a line that will not be used, and never faults)
        // (without it the element phase read each block cold: docs/kernels.md)
        constexpr int64_t ESIZE = DT == F32 ? 4 : 2;
        const char* xb = static_cast<const char*>(x) + base * ESIZE;
        const char* qb = reinterpret_cast<const char*>(q + base);
        for (int64_t k = 0; k < K; k += 32) {  // calls past the block's last one fill the slack, unread
            __m512i a0, a1, a2, a3, b0, b1, b2, b3;
            for (int64_t c = 0; c < 128 * ESIZE; c += 64) _mm_prefetch(xb + 4 * k * ESIZE + c, _MM_HINT_T0);
            for (int64_t c = 0; c < 128; c += 64) _mm_prefetch(qb + 4 * k + c, _MM_HINT_ET0);
            next(a0, a1, a2, a3);
            next(b0, b1, b2, b3);
            philox16x2(a0, a1, a2, a3, b0, b1, b2, b3, keys);
            words_in_memory_order16(a0, a1, a2, a3, reinterpret_cast<__m512*>(u + 4 * k));
            words_in_memory_order16(b0, b1, b2, b3, reinterpret_cast<__m512*>(u + 4 * k + 64));
        }
        __mmask16 vb = 0;
        for (int64_t l = 0; l < nr; ++l) {
            if (l > 0) {
                for (int d = last - 1; d >= 0; --d) {
                    base += p.stride[d];
                    if (++idx[d] < p.size[d]) break;
                    base -= p.size[d] * p.stride[d];
                    idx[d] = 0;
                }
            }
            const int64_t rc = p.axis >= 0 && row_channel ? idx[p.axis] : 0;
            const float* ur = u + 4 * J4 * l;
            for (int64_t j = 0; j < L; j += 16) {
                const __mmask16 m = j + 16 <= L ? (__mmask16)0xFFFF : (__mmask16)((1u << (L - j)) - 1);
                const int64_t off = base + j;
                const __m512 a = load16_masked<DT>(x, off, m);
                vb |= _mm512_cmp_ps_mask(abs16(a), _mm512_set1_ps(std::numeric_limits<float>::max()), _CMP_NLE_UQ);
                __m512 inv;
                if (!p.per_channel) inv = _mm512_set1_ps(p.inv[0]);
                else if (row_channel) inv = _mm512_set1_ps(p.inv[rc]);
                else inv = _mm512_maskz_loadu_ps(m, p.inv + j);
                const __m512 v = codes_stochastic16(a, inv, _mm512_maskz_loadu_ps(m, ur + j));
                _mm_mask_storeu_epi8(q + off, m, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
                if (cnt) {
                    const __m512 t =
                        row_channel ? _mm512_set1_ps(p.thresh[rc]) : _mm512_maskz_loadu_ps(m, p.thresh + j);
                    const __mmask16 gt = _mm512_mask_cmp_ps_mask(m, abs16(a), t, _CMP_GT_OQ);
                    if (row_channel) {
                        cnt[rc] += __builtin_popcount((unsigned)gt);
                    } else {
                        const __m512i cur = _mm512_maskz_loadu_epi32(m, cnt + j);
                        _mm512_mask_storeu_epi32(cnt + j, m, _mm512_mask_add_epi32(cur, gt, cur, one));
                    }
                }
            }
        }
        bad |= vb != 0;
    }
    return bad;
}
#endif

template <int DT>
static int quantize_impl(const void* x, int8_t* q, const Plan& p, int stochastic, int64_t n) {
    if (!stochastic) return quantize_flat<DT>(x, q, p, n);
#ifdef __AVX2__
    const int last = p.ndim - 1;
    int m = -1;  // the innermost dimension in memory (stride 1, more than one element)
    for (int d = 0; d < p.ndim; ++d)
        if (p.stride[d] == 1 && p.size[d] > 1) m = d;
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
    if (m == last && p.size[last] < ROW_BLOCKED_BELOW) return quantize_stochastic_rows_blocked16<DT>(x, q, p);
#endif
    if (m == last && p.size[last] >= 8) return quantize_stochastic_rows<DT>(x, q, p);
    if (m == last) return quantize_stochastic_short_rows<DT>(x, q, p);
    int64_t Rm = 1;  // the row coefficient of m must fit the 32-bit lane arithmetic
    for (int d = m + 1; d < last; ++d) Rm *= p.size[d];
    if (m >= 0 && m != last && p.size[m] >= 8 && Rm < (1LL << 31) && p.size[m] < (1LL << 31))
        return quantize_stochastic_inner<DT>(x, q, p, m);
#endif
    return quantize_stochastic_scalar<DT>(x, q, p);
}

// ------------------------------------------------------------------------------------------------------
// the dequantizing epilogue: out = acc * scale (per tensor, or per channel over memory (outer, C, inner)),
// float32 (in place over acc allowed) or bfloat16 (round to nearest even, as torch's .to(bfloat16))

// acc * scale for one run of `len` elements that share the scale `sc`, at element offset i of both buffers.
static inline void dequantize_run(const int32_t* acc, void* out, int out_bf16, int64_t i, int64_t len, float sc) {
    int64_t j = i;
    const int64_t end = i + len;
#ifdef __AVX2__
    const __m256 sv = _mm256_set1_ps(sc);
    for (; j + 8 <= end; j += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + j))), sv);
        if (!out_bf16) _mm256_storeu_ps(static_cast<float*>(out) + j, v);
        else store_bf16x8(static_cast<uint16_t*>(out) + j, v);
    }
#endif
    for (; j < end; ++j) {
        const float v = (float)acc[j] * sc;
        if (!out_bf16) static_cast<float*>(out)[j] = v;
        else static_cast<uint16_t*>(out)[j] = f32_to_bf16(v);
    }
}

static void dequantize_impl(const int32_t* acc, void* out, int out_bf16, int64_t outer, int64_t C, int64_t inner,
                            const float* scale, int per_channel) {
    const int64_t n = outer * C * inner;
    if (per_channel && inner >= 64) {
        // one run per (outer, channel) row with its scale: no division per vector (a weight gradient's
        // per-output-channel scales, inner = Cin * prod(k); 5-8x the per-tensor time before, measured)
        const int64_t rows = outer * C;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
        for (int64_t r = 0; r < rows; ++r) dequantize_run(acc, out, out_bf16, r * inner, inner, scale[r % C]);
        return;
    }
    const int64_t CH = 1 << 14;
#pragma omp parallel for schedule(static) if (n >= PARALLEL_MIN)
    for (int64_t i0 = 0; i0 < n; i0 += CH) {
        const int64_t i1 = std::min(n, i0 + CH);
        int64_t i = i0;
#ifdef __AVX2__
        if (!per_channel || inner == 1 || inner >= 8) {
            for (; i + 8 <= i1; i += 8) {
                __m256 sv;
                if (!per_channel) sv = _mm256_set1_ps(scale[0]);
                else if (inner == 1) {
                    const int64_t c = i % C;
                    if (c + 8 > C) break;  // a vector that wraps around the channels: scalar from here
                    sv = _mm256_loadu_ps(scale + c);
                } else {
                    const int64_t c = (i / inner) % C;
                    if (((i + 7) / inner) % C != c) break;
                    sv = _mm256_set1_ps(scale[c]);
                }
                const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + i))), sv);
                if (!out_bf16) _mm256_storeu_ps(static_cast<float*>(out) + i, v);
                else store_bf16x8(static_cast<uint16_t*>(out) + i, v);
            }
        }
#endif
        for (; i < i1; ++i) {
            const float sc = per_channel ? scale[(i / inner) % C] : scale[0];
            const float v = (float)acc[i] * sc;
            if (!out_bf16) static_cast<float*>(out)[i] = v;
            else static_cast<uint16_t*>(out)[i] = f32_to_bf16(v);
        }
    }
}

}  // namespace rq

using namespace rq;

// rq_quantize's plan of a tensor of `ndim` dimensions (0: one element); n gets its element count
static Plan make_plan(int ndim, const int64_t* size, const int64_t* stride, int axis, int per_channel, int64_t& n) {
    Plan p{};
    p.ndim = ndim > 0 ? ndim : 1;
    n = 1;
    for (int d = 0; d < p.ndim; ++d) {
        p.size[d] = ndim > 0 ? size[d] : 1;
        p.stride[d] = ndim > 0 ? stride[d] : 1;
        n *= p.size[d];
    }
    p.axis = axis;
    p.per_channel = per_channel;
    p.C = axis >= 0 ? p.size[axis] : 1;
    return p;
}

static int quantize_dt(const void* x, int dt, int8_t* q, const Plan& p, int stochastic, int64_t n) {
    switch (dt) {
        case F32: return quantize_impl<F32>(x, q, p, stochastic, n);
        case BF16: return quantize_impl<BF16>(x, q, p, stochastic, n);
        default: return quantize_impl<F16>(x, q, p, stochastic, n);
    }
}

// the per-thread counts of a pass (thread t's at t * C), summed per channel
static void sum_counts(const std::vector<uint32_t>& counts, int64_t C, int64_t* out) {
    const int nt = omp_get_max_threads();
    for (int64_t c = 0; c < C; ++c) {
        int64_t s = 0;
        for (int t = 0; t < nt; ++t) s += counts[(size_t)t * C + c];
        out[c] = s;
    }
}

#define RQ_DISPATCH(dt, fn, ...)                                  \
    switch (dt) {                                                 \
        case F32: return fn<F32>(__VA_ARGS__);                    \
        case BF16: return fn<BF16>(__VA_ARGS__);                  \
        default: return fn<F16>(__VA_ARGS__);                     \
    }

extern "C" {

int rq_absmax(const void* x, int dt, int64_t n, float* out) { RQ_DISPATCH(dt, absmax_impl, x, n, out) }

// sum, sumsq and sd (the population standard deviation) may be null: the maxima alone
int rq_channel_stats(const void* x, int dt, int64_t outer, int64_t C, int64_t inner, float* amax, double* sum,
                     double* sumsq, float* sd) {
    RQ_DISPATCH(dt, channel_stats_impl, x, outer, C, inner, amax, sum, sumsq, sd)
}

void rq_dequantize(const int32_t* acc, void* out, int out_bf16, int64_t outer, int64_t C, int64_t inner,
                   const float* scale, int per_channel) {
    dequantize_impl(acc, out, out_bf16, outer, C, inner, scale, per_channel);
}

// scale: one value (axis < 0 or per_channel == 0) or one per channel along `axis`; thresh (nullable):
// count[c] = #{|x| > thresh[c]} along `axis`.
int rq_quantize(const void* x, int dt, int8_t* q, int ndim, const int64_t* size, const int64_t* stride,
                const float* scale, int axis, int per_channel, int stochastic, uint32_t k0, uint32_t k1,
                const float* thresh, int64_t* count) {
    int64_t n;
    Plan p = make_plan(ndim, size, stride, axis, per_channel, n);
    if (n == 0) return 0;
    std::vector<float> inv(per_channel ? p.C : 1);
    for (size_t c = 0; c < inv.size(); ++c) inv[c] = inv_scale(scale[c]);
    p.inv = inv.data();
    p.thresh = thresh;
    std::vector<uint32_t> counts(thresh ? (size_t)omp_get_max_threads() * p.C : 0, 0u);
    p.count = thresh ? counts.data() : nullptr;
    p.k0 = k0;
    p.k1 = k1;
    const int bad = quantize_dt(x, dt, q, p, stochastic, n);
    if (thresh) sum_counts(counts, p.C, count);
    return bad;
}

// DAIQ's backward quantization of G in one call (repro/methods/daiq.py states the rule, Algorithm 1): the GX
// codes per tensor with s = max_c gmax[c] (stream kx) and the counts of |g| > sigma[c]; then each channel's
// clip value s[c] by MCS from the fraction above sigma (gaussian[c] = fraction > lam: s[c] = gmax[c]; else
// keep * prev[c] + A * gmax[c], gmax[c] where that is not positive; gmax itself where prev is null, the first
// iteration); then the GW codes with s per channel along `axis` (stream kw). axis < 0: the whole tensor is one
// channel (DAIQ's MCS ablation). float32 arithmetic in the order of the torch ops of repro.methods.daiq
// (keep = 1 - kA and A rounded to float32, as torch rounds a Python scalar), so every code and scale is
// theirs bit for bit. Returns 1 for a non-finite G, 2 for a non-finite scale.
int rq_daiq_codes(const void* x, int dt, int8_t* gx, int8_t* gw, int ndim, const int64_t* size,
                  const int64_t* stride, int axis, const float* gmax, const float* sigma, const float* prev,
                  float keep, float A, float lam, uint32_t kx0, uint32_t kx1, uint32_t kw0, uint32_t kw1,
                  float* gx_scale, float* s, uint8_t* gaussian) {
    int64_t n;
    Plan p = make_plan(ndim, size, stride, axis, 0, n);
    const int64_t C = p.C;
    float smax = 0.0f;
    bool finite = true;
    for (int64_t c = 0; c < C; ++c) {
        finite &= std::isfinite(gmax[c]);
        smax = std::max(smax, gmax[c]);
    }
    *gx_scale = smax;
    if (!finite) return 2;
    std::vector<uint32_t> counts((size_t)omp_get_max_threads() * C, 0u);
    std::vector<int64_t> total(C, 0);
    const float inv_x = inv_scale(smax);
    p.inv = &inv_x;
    p.thresh = sigma;
    p.count = counts.data();
    p.k0 = kx0;
    p.k1 = kx1;
    if (n > 0 && quantize_dt(x, dt, gx, p, 1, n)) return 1;
    sum_counts(counts, C, total.data());
    const int64_t per_channel = std::max<int64_t>(1, n / std::max<int64_t>(1, C));
    for (int64_t c = 0; c < C; ++c) {
        const float above = (float)((double)total[c] / (double)per_channel);
        gaussian[c] = above > lam;
        float v = gmax[c];
        if (prev) {
            const float inverted_t = keep * prev[c] + A * gmax[c];  // -ffp-contract=off: two roundings, as torch
            v = gaussian[c] ? gmax[c] : inverted_t;
            if (!(v > 0.0f)) v = gmax[c];
        }
        s[c] = v;
        finite &= std::isfinite(v);
    }
    if (!finite) return 2;
    std::vector<float> inv_w(C);
    for (int64_t c = 0; c < C; ++c) inv_w[c] = inv_scale(s[c]);
    p.per_channel = axis >= 0;
    p.inv = inv_w.data();
    p.thresh = nullptr;
    p.count = nullptr;
    p.k0 = kw0;
    p.k1 = kw1;
    return n > 0 && quantize_dt(x, dt, gw, p, 1, n) ? 1 : 0;
}

}  // extern "C"
