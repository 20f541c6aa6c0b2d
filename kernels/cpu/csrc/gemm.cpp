// Exact int8 GEMM on the CPU: C (M x N, int32) = A (M x K, int8) . B (K x N, int8), any strides.
//
// torch's CPU int8 matmul is fast only with AVX512-VNNI (oneDNN); elsewhere it runs a scalar loop (measured
// 2-6 GOPS against 180 GFLOPS of fp32 on a 2-core Zen 3). This one sign-extends the operands to int16 while
// packing them and multiplies pairs with vpmaddwd (AVX2: 16 multiply-adds per instruction, two per cycle,
// where an fp32 FMA does 8), int32 accumulation: exact, wrapping as int32 does (the int32 contract of
// kernels.reference). Goto's blocking with a 6 x 16 register tile (6 broadcasts and 2 loads feed 12
// multiply-adds: 0.98-1.37x, median 1.15x, the former 8 x 8 tile's GEMM on a Zen 3, 1 thread,
// docs/measurements.md); both operands are
// packed the same way, [k pair][W] int32 = the int16 pair (x[k], x[k+1]) of W = 6 rows of A or 16 columns
// of B. Every thread works
// alone (no barrier: under other load a barrier per block cost 30x, measured): it takes a range of rows,
// or, for a long reduction with a small output (weight gradients), a range of K whose partial sums are
// added at the end. Without AVX2 a plain loop computes the same.
//
// With a scale (rq_gemm_s8's `scale`, nullable; one value, or one per row or column of C: rq::OutScale) C is
// float32: every result is written once as (float)acc * scale, the dequantizing epilogue's arithmetic
// (quantize.cpp's dequantize: the exact int32 sum converted to fp32, one fp32 multiply), so the float result is
// bit-identical to the int32 GEMM followed by the epilogue, without the epilogue's pass over the output. The
// int32 partial sums of earlier K blocks go through the same memory.
#include <algorithm>
#include <atomic>
#include <memory>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#include "bf16.h"
#include "gemm_amx.h"
#include "gemm_operand.h"

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace rq {

// rq_allow_amx: whether gemm tries the tile GEMM first (gemm_amx.cpp: AMX, or AVX-512 VNNI; tests and
// comparisons turn it off to reach this file's)
static std::atomic<bool> amx_allowed{true};

constexpr int MR = 6;           // rows of A in the register tile (broadcast, one pair at a time)
constexpr int NR = 16;          // columns of B in the register tile (two vectors of 8)
#ifndef RQ_KC
#define RQ_KC 768
#endif
constexpr int64_t KC = RQ_KC;   // most K per block (even); a reduction is cut into equal blocks
constexpr int64_t MC = 96;      // rows of A per block (multiple of MR)
constexpr int64_t NC = 1024;    // columns of B per block (multiple of NR)
// a scaled C of this many bytes and more: non-temporal stores (Zen 3, docs/measurements.md: plain stores were
// faster at 4.8 MB, non-temporal ones at 12.8 and 38 MB, the two even at 14 MB)
constexpr int64_t STREAM_BYTES = 8 << 20;
constexpr int64_t PAD = 8;      // int32 slack after a packed block: the 6-wide fast packs store 8 at a time

static inline int32_t pair16(int8_t lo, int8_t hi) {
    return (int32_t)((uint32_t)(uint16_t)(int16_t)lo | ((uint32_t)(uint16_t)(int16_t)hi << 16));
}

#ifdef __AVX2__
// 8 x 8 int32 transpose in registers
static inline void transpose8(__m256i v[8]) {
    const __m256i t0 = _mm256_unpacklo_epi32(v[0], v[1]), t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(v[2], v[3]), t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    const __m256i t4 = _mm256_unpacklo_epi32(v[4], v[5]), t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    const __m256i t6 = _mm256_unpacklo_epi32(v[6], v[7]), t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    const __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    const __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    v[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    v[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    v[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    v[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    v[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    v[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    v[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    v[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

// `count` (<= 8) bytes into the low end of an int64 (zeros above), in registers: no call to memcpy per pair,
// and no partial stores read back whole (a store-forwarding stall each: 3/4 of a weight gradient's packing)
static inline int64_t load_bytes(const int8_t* src, int count) {
    uint64_t r;
    if (count == 8) {
        std::memcpy(&r, src, 8);
        return (int64_t)r;
    }
    uint32_t lo = 0;
    uint16_t mid = 0;
    if (count == 6) {
        std::memcpy(&lo, src, 4);
        std::memcpy(&mid, src + 4, 2);
        return (int64_t)((uint64_t)lo | (uint64_t)mid << 32);
    }
    r = 0;
    for (int i = 0; i < count; ++i) r |= (uint64_t)(uint8_t)src[i] << (8 * i);
    return (int64_t)r;
}

// Up to 8 indices from i0 (`count` of them, the rest zeros) into slots [off, off + 8) of a W-wide panel,
// 16 k at a time while whole 16-k runs remain; returns the pairs done. Stores 8 int32 per pair: with
// W < 8 the 8 - W extra land on the next pair's slots (written after) or on the block's PAD slack.
template <int W>
static int64_t pack8(const Operand& x, int64_t i0, int count, int64_t k0, int64_t kc, int32_t* dst, int off) {
    int64_t p = 0;
    if (x.k.unit(k0, 16)) {
        // each index's run along k is contiguous: 16 k of 8 indices -> 8 pairs each, transposed (a table's
        // runs: while the 16 stay inside one)
        int64_t row[8];
        for (int i = 0; i < count; ++i) row[i] = x.idx.off(i0 + i);
        for (; 2 * p + 16 <= kc && x.k.unit(k0 + 2 * p, 16); p += 8) {
            const int8_t* base = x.p + x.k.off(k0 + 2 * p);
            __m256i v[8];
            for (int i = 0; i < 8; ++i)
                v[i] = i < count ? _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(base + row[i])))
                                 : _mm256_setzero_si256();
            transpose8(v);
            for (int j = 0; j < 8; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (p + j) * W + off), v[j]);
        }
    } else if (x.idx.unit(i0, count) || (x.idx.t && x.idx.run >= 8)) {
        // the indices are contiguous at each k: interleave the rows k and k + 1 (`count` bytes read of each;
        // from two runs of a table where the indices straddle them)
        const int split = x.idx.t ? (int)std::min<int64_t>(count, x.idx.run - i0 % x.idx.run) : count;
        const int8_t* base = x.p + x.idx.off(i0);
        const int8_t* rest = split < count ? x.p + x.idx.off(i0 + split) : base;
        for (; 2 * p + 1 < kc; ++p) {
            const int64_t o0 = x.k.off(k0 + 2 * p), o1 = x.k.off(k0 + 2 * p + 1);
            int64_t r0 = load_bytes(base + o0, split), r1 = load_bytes(base + o1, split);
            if (split < count) {  // (little-endian: the second run's bytes above the first's)
                r0 |= load_bytes(rest + o0, count - split) << (8 * split);
                r1 |= load_bytes(rest + o1, count - split) << (8 * split);
            }
            const __m128i lo = _mm_cvtepi8_epi16(_mm_cvtsi64_si128(r0));
            const __m128i hi = _mm_cvtepi8_epi16(_mm_cvtsi64_si128(r1));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + p * W + off), _mm_unpacklo_epi16(lo, hi));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + p * W + off + 4), _mm_unpackhi_epi16(lo, hi));
        }
    }
    return p;
}
#endif

// One W-wide panel: `count` (<= W) consecutive indices from i0, k in [k0, k0 + kc) -> dst[kp][W] (zero padded)
template <int W>
static void pack_panel(const Operand& x, int64_t i0, int count, int64_t k0, int64_t kc, int32_t* dst) {
    const int64_t kp = (kc + 1) / 2;
    int64_t p = 0;
#ifdef __AVX2__
    if (W == 16 && count > 8) {
        const int64_t p0 = pack8<W>(x, i0, 8, k0, kc, dst, 0);
        const int64_t p1 = pack8<W>(x, i0 + 8, count - 8, k0, kc, dst, 8);
        // the halves differ only where one of them is a single index (a strided axis takes it bytewise): the
        // plain loop below then packs the whole panel again
        p = p0 == p1 ? p0 : 0;
    } else if (W == 16) {
        p = pack8<W>(x, i0, count, k0, kc, dst, 0);
        for (int64_t q = 0; q < p; ++q) std::memset(dst + q * W + 8, 0, 8 * sizeof(int32_t));
    } else if (W == 6 && count == 6) {
        p = pack8<W>(x, i0, count, k0, kc, dst, 0);
    }
#endif
    for (; p < kp; ++p) {
        const int64_t k = k0 + 2 * p;
        const bool two = 2 * p + 1 < kc;
        for (int i = 0; i < W; ++i) {
            if (i >= count) {
                dst[p * W + i] = 0;
                continue;
            }
            dst[p * W + i] = pair16(*x.at(i0 + i, k), two ? *x.at(i0 + i, k + 1) : 0);
        }
    }
}

// The rows of a panel (a unit-stride k axis: each index's run of kc bytes) into the cache ahead of their
// packing: the runs are too short for the hardware prefetcher to find (the source's loads held up the packing)
static void prefetch_panel(const Operand& x, int64_t i0, int count, int64_t k0, int64_t kc) {
    if (x.k.t || x.k.stride != 1) return;
    for (int i = 0; i < count; ++i) {
        const char* row = reinterpret_cast<const char*>(x.at(i0 + i, k0));
        for (int64_t b = 0; b < kc; b += 64) __builtin_prefetch(row + b, 0, 3);
        __builtin_prefetch(row + kc - 1, 0, 3);
    }
}

template <int W>
static void pack_block(const Operand& x, int64_t i0, int64_t n, int64_t k0, int64_t kc, int32_t* dst) {
    const int64_t kp = (kc + 1) / 2;
    prefetch_panel(x, i0, (int)std::min<int64_t>(W, n), k0, kc);
    for (int64_t i = 0; i < n; i += W) {
        if (i + W < n) prefetch_panel(x, i0 + i + W, (int)std::min<int64_t>(W, n - i - W), k0, kc);
        pack_panel<W>(x, i0 + i, (int)std::min<int64_t>(W, n - i), k0, kc, dst + (i / W) * kp * W);
    }
}

// C tile (rows x cols of MR x NR) = or += A panel . B panel over kp k pairs; NV: the B vectors (of 8
// columns) worth computing (2, or 1 for a tile of at most 8 columns)
// scale (nullable): the last K block of a scaled GEMM, stored as float (the epilogue's arithmetic)
template <int NV>
__attribute__((noinline)) static void micro_kernel(int64_t kp, const int32_t* a, const int32_t* b, int32_t* c,
                                                   int64_t ldc, int rows, int cols, bool accumulate,
                                                   OutScale scale, bool stream) {
#ifdef __AVX2__
    // 6 x 2 accumulators, named (gcc keeps an array of them in memory): 6 broadcasts and 2 loads feed 12
    // multiply-adds, where the former 8 x 8 tile needed 8 broadcasts for 8 (alone, in L1: 61-77 against 50-68
    // G multiply-adds/s, 1 thread, Zen 3)
    const __m256i z = _mm256_setzero_si256();
    __m256i c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z, c40 = z, c41 = z, c50 = z,
            c51 = z;
#define RQ_ROW(r, lo, hi)                                                       \
    {                                                                           \
        const __m256i x = _mm256_set1_epi32(a[r]);                              \
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(x, b0));                    \
        if constexpr (NV == 2) hi = _mm256_add_epi32(hi, _mm256_madd_epi16(x, b1)); \
    }
    for (int64_t p = 0; p < kp; ++p) {
        const __m256i b0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
        const __m256i b1 = NV == 2 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 8)) : z;
        RQ_ROW(0, c00, c01)
        RQ_ROW(1, c10, c11)
        RQ_ROW(2, c20, c21)
        RQ_ROW(3, c30, c31)
        RQ_ROW(4, c40, c41)
        RQ_ROW(5, c50, c51)
        a += MR;
        b += NR;
    }
#undef RQ_ROW
    const __m256i acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (rows == MR && cols == 8 * NV) {
        for (int r = 0; r < MR; ++r)
            for (int v = 0; v < NV; ++v) {
                __m256i* d = reinterpret_cast<__m256i*>(c + r * ldc + 8 * v);
                const __m256i s = accumulate ? _mm256_add_epi32(_mm256_loadu_si256(d), acc[r][v]) : acc[r][v];
                if (scale) {
                    const __m256 f =
                        scale.axis == 1 ? _mm256_loadu_ps(scale.v + 8 * v) : _mm256_set1_ps(scale.at(r, 0));
                    const __m256 out = _mm256_mul_ps(_mm256_cvtepi32_ps(s), f);
                    if (stream) _mm256_stream_ps(reinterpret_cast<float*>(d), out);
                    else _mm256_storeu_ps(reinterpret_cast<float*>(d), out);
                } else
                    _mm256_storeu_si256(d, s);
            }
        return;
    }
    alignas(32) int32_t tile[MR][NR];
    for (int r = 0; r < MR; ++r)
        for (int v = 0; v < 2; ++v) _mm256_store_si256(reinterpret_cast<__m256i*>(tile[r] + 8 * v), acc[r][v]);
#else
    int32_t tile[MR][NR] = {};
    for (int64_t p = 0; p < kp; ++p)
        for (int r = 0; r < MR; ++r) {
            const int16_t a0 = (int16_t)(a[p * MR + r] & 0xFFFF), a1 = (int16_t)((uint32_t)a[p * MR + r] >> 16);
            for (int n = 0; n < 8 * NV; ++n) {
                const int16_t b0 = (int16_t)(b[p * NR + n] & 0xFFFF), b1 = (int16_t)((uint32_t)b[p * NR + n] >> 16);
                tile[r][n] = (int32_t)((uint32_t)tile[r][n] + (uint32_t)(a0 * b0 + a1 * b1));
            }
        }
#endif
    for (int r = 0; r < rows; ++r)
        for (int n = 0; n < cols; ++n) {
            const int32_t v = accumulate ? (int32_t)((uint32_t)c[r * ldc + n] + (uint32_t)tile[r][n]) : tile[r][n];
            if (scale)
                reinterpret_cast<float*>(c)[r * ldc + n] = (float)v * scale.at(r, n);
            else
                c[r * ldc + n] = v;
        }
}

// C[m0:m1, n0:n1] (=, or += when `accumulate`) A[m0:m1, k0:k1] . B[k0:k1, n0:n1], by one thread
// (scale: the epilogue applied with the last K block, k1)
static void gemm_part(int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t k0, int64_t k1, const Operand& a,
                      const Operand& b, int32_t* c, int64_t ldc, bool accumulate, std::vector<int32_t>& apack,
                      std::vector<int32_t>& bpack, OutScale scale, bool stream = false) {
    // equal K blocks (576 = 288 + 288, not 512 + 64: a short block costs a C tile's reload for little work)
    // (multiples of 16 where a table's runs are: the packing's 16-k loads then never straddle two runs)
    const int64_t align = a.k.t || b.k.t ? 16 : 2, nblocks = (k1 - k0 + KC - 1) / KC;
    const int64_t kblock = ((k1 - k0 + nblocks - 1) / nblocks + align - 1) / align * align;
    for (int64_t jc = n0; jc < n1; jc += NC) {
        const int64_t nc = std::min(NC, n1 - jc);
        for (int64_t pc = k0; pc < k1; pc += kblock) {
            const int64_t kc = std::min(kblock, k1 - pc), kp = (kc + 1) / 2;
            pack_block<NR>(b, jc, nc, pc, kc, bpack.data());
            const bool acc = accumulate || pc > k0;
            const OutScale last = pc + kc == k1 ? scale : OutScale{};
            for (int64_t ic = m0; ic < m1; ic += MC) {
                const int64_t mc = std::min(MC, m1 - ic);
                pack_block<MR>(a, ic, mc, pc, kc, apack.data());
                for (int64_t jr = 0; jr < nc; jr += NR) {
                    const int cols = (int)std::min<int64_t>(NR, nc - jr);
                    const auto kernel = cols > 8 ? micro_kernel<2> : micro_kernel<1>;
                    for (int64_t ir = 0; ir < mc; ir += MR)
                        kernel(kp, apack.data() + (ir / MR) * kp * MR, bpack.data() + (jr / NR) * kp * NR,
                               c + (ic + ir) * ldc + jc + jr, ldc, (int)std::min<int64_t>(MR, mc - ir), cols, acc,
                               last.from(ic + ir, jc + jr), stream);
                }
            }
        }
    }
}

static void gemm(int64_t M, int64_t N, int64_t K, Operand a, Operand b, int32_t* c, int64_t ldc,
                 OutScale scale) {
    if (M == 0 || N == 0) return;
    if (K == 0) {  // 0 and 0.0f have the same bits
        for (int64_t m = 0; m < M; ++m) std::memset(c + m * ldc, 0, N * sizeof(int32_t));
        return;
    }
    // small products stay on one thread: a parallel region waits for every thread (milliseconds on a
    // loaded machine, measured)
    const int nt = (double)M * N * K < (double)(1 << 22) ? 1 : std::max(1, omp_get_max_threads());
    const size_t kp_max = (size_t)(std::min(KC, K) + 16) / 2;  // (blocks rounded up to 16, gemm_part)
    const size_t b_size = kp_max * ((std::min(NC, N) + NR - 1) / NR * NR) + PAD, a_size = kp_max * MC + PAD;
    // a long reduction into a small output (weight gradients): each thread a range of K
    const bool split_k = nt > 1 && K >= 8 * std::max(M, N) && K >= 4 * KC;
    if (!split_k) {
        // each thread a range of rows, or of columns where B is the larger operand: every thread packs all of
        // the other operand, so the smaller one is shared (a weight gradient's 784 x 2304 columns packed by
        // both threads for a 256-row A scaled 1.2x on 2 threads, measured)
        const bool by_cols = N > M && N >= 2 * NR * nt;
        const int64_t span = by_cols ? N : M, unit = by_cols ? NR : MR;
        const int64_t step = ((span + nt - 1) / nt + unit - 1) / unit * unit;
        // a scaled C (the final values) larger than the caches: its full tiles by non-temporal stores (no read
        // of the lines they overwrite), 32-byte aligned where C and its row length are
        const bool stream = (bool)scale && (double)M * N * 4 >= (double)STREAM_BYTES && ldc % 8 == 0 &&
                            reinterpret_cast<uintptr_t>(c) % 32 == 0;
#pragma omp parallel num_threads(nt)
        {
            std::vector<int32_t> ap(a_size), bp(b_size);
            const int64_t t = omp_get_thread_num(), lo = std::min(span, t * step), hi = std::min(span, lo + step);
            if (lo < hi) {
                if (by_cols)
                    gemm_part(0, M, lo, hi, 0, K, a, b, c, ldc, false, ap, bp, scale, stream);
                else
                    gemm_part(lo, hi, 0, N, 0, K, a, b, c, ldc, false, ap, bp, scale, stream);
            }
#ifdef __AVX2__
            if (stream) _mm_sfence();  // the non-temporal stores, seen by every thread after the region
#endif
        }
        return;
    }
    std::vector<std::vector<int32_t>> partial(nt - 1, std::vector<int32_t>((size_t)M * N));
    const int64_t per = ((K + nt - 1) / nt + KC - 1) / KC * KC;  // (a multiple of 16: KC is)
#pragma omp parallel num_threads(nt)
    {
        std::vector<int32_t> ap(a_size), bp(b_size);
        const int t = omp_get_thread_num();
        const int64_t k0 = std::min(K, t * per), k1 = std::min(K, k0 + per);
        int32_t* dst = t == 0 ? c : partial[t - 1].data();
        const int64_t ld = t == 0 ? ldc : N;
        if (k0 < k1) {
            gemm_part(0, M, 0, N, k0, k1, a, b, dst, ld, false, ap, bp, OutScale{});
        } else {
            for (int64_t m = 0; m < M; ++m) std::memset(dst + m * ld, 0, N * sizeof(int32_t));
        }
    }
    for (int t = 1; t < nt; ++t)
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n)
                c[m * ldc + n] = (int32_t)((uint32_t)c[m * ldc + n] + (uint32_t)partial[t - 1][m * N + n]);
    if (scale)
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n)
                reinterpret_cast<float*>(c)[m * ldc + n] = (float)c[m * ldc + n] * scale.at(m, n);
}

// gemm with the output as int32, float32 (scale) or, `bf16`, float32 rounded to bfloat16 (scale too): the tile
// GEMM where usable and allowed, else the float32 GEMM above into a buffer (not initialised: the GEMM writes all
// of it), rounded by rows on every thread
static void gemm_out(int64_t M, int64_t N, int64_t K, Operand a, Operand b, void* c, int64_t ldc, OutScale scale,
                     bool bf16) {
    if (M == 0 || N == 0) return;
    if (K > 0 && amx_allowed.load(std::memory_order_relaxed) && gemm_amx(M, N, K, a, b, c, OutRows{ldc}, scale, bf16))
        return;
    if (scale.add) {  // this GEMM keeps its int32 sums in C between K blocks: the scaled product apart, then added
        OutScale plain = scale;
        plain.add = false;
        std::unique_ptr<int32_t[]> tmp(new int32_t[(size_t)(M * N)]);
        gemm(M, N, K, a, b, tmp.get(), N, plain);
        const float* f = reinterpret_cast<const float*>(tmp.get());
#pragma omp parallel for if ((double)M * N >= (double)(1 << 16))
        for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) static_cast<float*>(c)[m * ldc + n] += f[m * N + n];
        return;
    }
    if (!bf16) return gemm(M, N, K, a, b, static_cast<int32_t*>(c), ldc, scale);
    std::unique_ptr<int32_t[]> tmp(new int32_t[(size_t)(M * N)]);
    gemm(M, N, K, a, b, tmp.get(), N, scale);
    const float* f = reinterpret_cast<const float*>(tmp.get());
#pragma omp parallel for if ((double)M * N >= (double)(1 << 16))
    for (int64_t m = 0; m < M; ++m) {
        uint16_t* row = static_cast<uint16_t*>(c) + m * ldc;
        int64_t n = 0;
#ifdef __AVX2__
        for (; n + 8 <= N; n += 8) store_bf16x8(row + n, _mm256_loadu_ps(f + m * N + n));
#endif
        for (; n < N; ++n) row[n] = f32_to_bf16(f[m * N + n]);
    }
}

}  // namespace rq

extern "C" {

// rq_gemm_s8's `out` flags
enum { OUT_BF16 = 1, OUT_ADD = 2 };

// C[m * ldc + n] = sum_k A[m * sam + k * sak] * B[k * sbk + n * sbn]; with a scale (nullable) C is float32
// and holds (float)sum * scale, with `out` OUT_BF16 that value rounded to bfloat16, with OUT_ADD (float32) C's
// own value plus it; scale_axis -1: scale[0], 0: scale[m] (one per row), 1: scale[n] (one per column)
void rq_gemm_s8(int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t sam, int64_t sak, const int8_t* B,
                int64_t sbk, int64_t sbn, void* C, int64_t ldc, const float* scale, int scale_axis, int out) {
    const bool bf16 = out & OUT_BF16, add = (out & OUT_ADD) && scale && !bf16;
    rq::gemm_out(M, N, K, rq::Operand{A, {sam}, {sak}}, rq::Operand{B, {sbn}, {sbk}}, C, ldc,
                 rq::OutScale{scale, scale_axis, add}, bf16);
}

// rq_gemm_s8 with an axis read through a table (rq::Axis): each operand's m / n axis and k axis take a
// stride, or a table of run starts (nullable) and the run's length; a run's elements are contiguous. `batch`
// products of that shape, item j's A, B and C at A + j * a_step, B + j * b_step (bytes), C + j * c_step
// (elements), and a scale per row or column at scale + j * M or N (rq::Batch). `c_rows` (nullable): row m of
// each item's C at c_rows[m] elements from the item's C, not m * ldc (rq::OutRows)
void rq_gemm_s8_tables(int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t sam, const int64_t* tam,
                       int64_t ram, int64_t sak, const int64_t* tak, int64_t rak, const int8_t* B, int64_t sbk,
                       const int64_t* tbk, int64_t rbk, int64_t sbn, const int64_t* tbn, int64_t rbn, void* C,
                       int64_t ldc, const float* scale, int scale_axis, int bf16, int64_t batch, int64_t a_step,
                       int64_t b_step, int64_t c_step, const int64_t* c_rows) {
    const rq::Operand a{A, {sam, tam, ram}, {sak, tak, rak}}, b{B, {sbn, tbn, rbn}, {sbk, tbk, rbk}};
    const rq::OutScale s{scale, scale_axis};
    const rq::OutRows out{ldc, c_rows};
    const bool amx = M > 0 && N > 0 && K > 0 && rq::amx_allowed.load(std::memory_order_relaxed);
    const rq::Batch items{batch, a_step, b_step, c_step};
    if (batch > 1 && amx && rq::gemm_amx_batch(items, M, N, K, a, b, C, out, s, bf16 != 0)) return;
    const int64_t bytes = bf16 ? 2 : 4;
    for (int64_t j = 0; j < batch; ++j) {  // one item after another, each on every thread
        const rq::BatchItem item(items, j, M, N, a, b, C, bytes, s);
        if (!c_rows) {
            rq::gemm_out(M, N, K, item.a, item.b, item.c, ldc, item.scale, bf16 != 0);
            continue;
        }
        if (amx && rq::gemm_amx(M, N, K, item.a, item.b, item.c, out, item.scale, bf16 != 0)) continue;
        // the other GEMM writes rows ldc apart: into a buffer, then each row to its place
        std::unique_ptr<int8_t[]> tmp(new int8_t[(size_t)(M * N * bytes)]);
        rq::gemm_out(M, N, K, item.a, item.b, tmp.get(), N, item.scale, bf16 != 0);
        int8_t* c = static_cast<int8_t*>(item.c);
        const size_t row = (size_t)(N * bytes);
        for (int64_t m = 0; m < M; ++m) std::memcpy(c + c_rows[m] * bytes, tmp.get() + m * row, row);
    }
}

// whether rq_gemm_s8 runs on the tile GEMM (gemm_amx.cpp: AMX tiles, or AVX-512 VNNI): 1 or 0; `allow` 0 or 1
// turns that off or on first
// (-1: only asks)
int rq_allow_amx(int allow) {
    if (allow >= 0) rq::amx_allowed.store(allow != 0);
    return rq::amx_allowed.load() && rq::tile_gemm_usable() ? 1 : 0;
}

// whether the tile GEMM's products run on AMX tiles (else on AVX-512 VNNI, where it runs at all): the blocks of
// grouped convolutions are chosen by a rule of each kind's own (kernels/cpu/im2col.py, group_block)
int rq_tiles_amx() { return rq::amx_usable() ? 1 : 0; }

}  // extern "C"
