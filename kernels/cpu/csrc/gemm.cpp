// Exact int8 GEMM on the CPU: C (M x N, int32) = A (M x K, int8) . B (K x N, int8), any strides.
//
// torch's CPU int8 matmul is fast only with AVX512-VNNI (oneDNN); elsewhere it runs a scalar loop (measured
// 2-6 GOPS against 180 GFLOPS of fp32 on a 2-core Zen 3). This one sign-extends the operands to int16 while
// packing them and multiplies pairs with vpmaddwd (AVX2: 16 multiply-adds per instruction, two per cycle,
// where an fp32 FMA does 8), int32 accumulation: exact, wrapping as int32 does (the int32 contract of
// kernels.reference). Goto's blocking with an 8 x 8 register tile; both operands are packed the same way,
// [k pair][8] int32 = the int16 pair (x[k], x[k+1]) of 8 rows of A or 8 columns of B. Every thread works
// alone (no barrier: under other load a barrier per block cost 30x, measured): it takes a range of rows,
// or, for a long reduction with a small output (weight gradients), a range of K whose partial sums are
// added at the end. Without AVX2 a plain loop computes the same.
//
// With a scale (rq_gemm_s8's last argument, nullable) C is float32: every result is written once as
// (float)acc * scale, the dequantizing epilogue's arithmetic (quantize.cpp's dequantize: the exact int32
// sum converted to fp32, one fp32 multiply), so the float result is bit-identical to the int32 GEMM
// followed by the epilogue, without the epilogue's pass over the output. The int32 partial sums of
// earlier K blocks go through the same memory.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include <omp.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

namespace rq {

constexpr int R = 8;            // rows (A) and columns (B) of the register tile
constexpr int64_t KC = 512;     // K per block (even)
constexpr int64_t MC = 96;      // rows of A per block (multiple of R)
constexpr int64_t NC = 1024;    // columns of B per block (multiple of R)

struct Operand {
    const int8_t* p;
    int64_t s_idx, s_k;  // element strides of the panel index (m of A, n of B) and of k
};

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
#endif

// One panel: `count` (<= 8) consecutive indices from i0, k in [k0, k0 + kc) -> dst[kp][8] (zero padded)
static void pack_panel(const Operand& x, int64_t i0, int count, int64_t k0, int64_t kc, int32_t* dst) {
    const int64_t kp = (kc + 1) / 2;
    int64_t p = 0;
#ifdef __AVX2__
    if (count == R && x.s_k == 1) {
        // each index's run along k is contiguous: 16 k of 8 indices -> 8 pairs each, transposed
        for (; 2 * p + 16 <= kc; p += 8) {
            __m256i v[8];
            for (int i = 0; i < R; ++i) {
                const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.p + (i0 + i) * x.s_idx + k0 + 2 * p));
                v[i] = _mm256_cvtepi8_epi16(b);  // 16 int16 = 8 (k, k+1) pairs
            }
            transpose8(v);
            for (int j = 0; j < 8; ++j) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (p + j) * R), v[j]);
        }
    } else if (count == R && x.s_idx == 1) {
        // the 8 indices are contiguous at each k: interleave the rows k and k + 1
        for (; 2 * p + 1 < kc; ++p) {
            const int8_t* src = x.p + i0 + (k0 + 2 * p) * x.s_k;
            const __m128i lo = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src)));
            const __m128i hi = _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(src + x.s_k)));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + p * R), _mm_unpacklo_epi16(lo, hi));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + p * R + 4), _mm_unpackhi_epi16(lo, hi));
        }
    }
#endif
    for (; p < kp; ++p) {
        const int64_t k = k0 + 2 * p;
        const bool two = 2 * p + 1 < kc;
        for (int i = 0; i < R; ++i) {
            if (i >= count) {
                dst[p * R + i] = 0;
                continue;
            }
            const int8_t* src = x.p + (i0 + i) * x.s_idx + k * x.s_k;
            dst[p * R + i] = pair16(src[0], two ? src[x.s_k] : 0);
        }
    }
}

static void pack_block(const Operand& x, int64_t i0, int64_t n, int64_t k0, int64_t kc, int32_t* dst) {
    const int64_t kp = (kc + 1) / 2;
    for (int64_t i = 0; i < n; i += R)
        pack_panel(x, i0 + i, (int)std::min<int64_t>(R, n - i), k0, kc, dst + (i / R) * kp * R);
}

// C tile (rows x cols of 8 x 8) = or += A panel . B panel over kp k pairs
// scale (nullable): the last K block of a scaled GEMM, stored as float (the epilogue's arithmetic)
__attribute__((noinline)) static void micro_kernel(int64_t kp, const int32_t* a, const int32_t* b, int32_t* c,
                                                   int64_t ldc, int rows, int cols, bool accumulate,
                                                   const float* scale) {
#ifdef __AVX2__
    __m256i c0 = _mm256_setzero_si256(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    for (int64_t p = 0; p < kp; ++p) {
        const __m256i bv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
        c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(_mm256_set1_epi32(a[0]), bv));
        c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(_mm256_set1_epi32(a[1]), bv));
        c2 = _mm256_add_epi32(c2, _mm256_madd_epi16(_mm256_set1_epi32(a[2]), bv));
        c3 = _mm256_add_epi32(c3, _mm256_madd_epi16(_mm256_set1_epi32(a[3]), bv));
        c4 = _mm256_add_epi32(c4, _mm256_madd_epi16(_mm256_set1_epi32(a[4]), bv));
        c5 = _mm256_add_epi32(c5, _mm256_madd_epi16(_mm256_set1_epi32(a[5]), bv));
        c6 = _mm256_add_epi32(c6, _mm256_madd_epi16(_mm256_set1_epi32(a[6]), bv));
        c7 = _mm256_add_epi32(c7, _mm256_madd_epi16(_mm256_set1_epi32(a[7]), bv));
        a += R;
        b += R;
    }
    const __m256i acc[R] = {c0, c1, c2, c3, c4, c5, c6, c7};
    if (rows == R && cols == R) {
        for (int r = 0; r < R; ++r) {
            __m256i* d = reinterpret_cast<__m256i*>(c + r * ldc);
            const __m256i v = accumulate ? _mm256_add_epi32(_mm256_loadu_si256(d), acc[r]) : acc[r];
            if (scale)
                _mm256_storeu_ps(reinterpret_cast<float*>(d), _mm256_mul_ps(_mm256_cvtepi32_ps(v), _mm256_set1_ps(*scale)));
            else
                _mm256_storeu_si256(d, v);
        }
        return;
    }
    alignas(32) int32_t tile[R][R];
    for (int r = 0; r < R; ++r) _mm256_store_si256(reinterpret_cast<__m256i*>(tile[r]), acc[r]);
#else
    int32_t tile[R][R] = {};
    for (int64_t p = 0; p < kp; ++p)
        for (int r = 0; r < R; ++r) {
            const int16_t a0 = (int16_t)(a[p * R + r] & 0xFFFF), a1 = (int16_t)((uint32_t)a[p * R + r] >> 16);
            for (int n = 0; n < R; ++n) {
                const int16_t b0 = (int16_t)(b[p * R + n] & 0xFFFF), b1 = (int16_t)((uint32_t)b[p * R + n] >> 16);
                tile[r][n] = (int32_t)((uint32_t)tile[r][n] + (uint32_t)(a0 * b0 + a1 * b1));
            }
        }
#endif
    for (int r = 0; r < rows; ++r)
        for (int n = 0; n < cols; ++n) {
            const int32_t v = accumulate ? (int32_t)((uint32_t)c[r * ldc + n] + (uint32_t)tile[r][n]) : tile[r][n];
            if (scale)
                reinterpret_cast<float*>(c)[r * ldc + n] = (float)v * *scale;
            else
                c[r * ldc + n] = v;
        }
}

// C[m0:m1, :] (=, or += when `accumulate`) A[m0:m1, k0:k1] . B[k0:k1, :], by one thread
// (scale: the epilogue applied with the last K block, k1)
static void gemm_part(int64_t m0, int64_t m1, int64_t N, int64_t k0, int64_t k1, const Operand& a,
                      const Operand& b, int32_t* c, int64_t ldc, bool accumulate, std::vector<int32_t>& apack,
                      std::vector<int32_t>& bpack, const float* scale) {
    for (int64_t jc = 0; jc < N; jc += NC) {
        const int64_t nc = std::min(NC, N - jc);
        for (int64_t pc = k0; pc < k1; pc += KC) {
            const int64_t kc = std::min(KC, k1 - pc), kp = (kc + 1) / 2;
            pack_block(b, jc, nc, pc, kc, bpack.data());
            const bool acc = accumulate || pc > k0;
            const float* last = pc + kc == k1 ? scale : nullptr;
            for (int64_t ic = m0; ic < m1; ic += MC) {
                const int64_t mc = std::min(MC, m1 - ic);
                pack_block(a, ic, mc, pc, kc, apack.data());
                for (int64_t jr = 0; jr < nc; jr += R)
                    for (int64_t ir = 0; ir < mc; ir += R)
                        micro_kernel(kp, apack.data() + (ir / R) * kp * R, bpack.data() + (jr / R) * kp * R,
                                     c + (ic + ir) * ldc + jc + jr, ldc, (int)std::min<int64_t>(R, mc - ir),
                                     (int)std::min<int64_t>(R, nc - jr), acc, last);
            }
        }
    }
}

static void gemm(int64_t M, int64_t N, int64_t K, Operand a, Operand b, int32_t* c, int64_t ldc,
                 const float* scale) {
    if (M == 0 || N == 0) return;
    if (K == 0) {  // 0 and 0.0f have the same bits
        for (int64_t m = 0; m < M; ++m) std::memset(c + m * ldc, 0, N * sizeof(int32_t));
        return;
    }
    // small products stay on one thread: a parallel region waits for every thread (milliseconds on a
    // loaded machine, measured)
    const int nt = (double)M * N * K < (double)(1 << 22) ? 1 : std::max(1, omp_get_max_threads());
    const size_t kp_max = (size_t)(std::min(KC, K) + 1) / 2;
    const size_t b_size = kp_max * ((std::min(NC, N) + R - 1) / R * R), a_size = kp_max * MC;
    // a long reduction into a small output (weight gradients): each thread a range of K
    const bool split_k = nt > 1 && K >= 8 * std::max(M, N) && K >= 4 * KC;
    if (!split_k) {
        const int64_t rows = (M + nt - 1) / nt, step = (rows + R - 1) / R * R;
#pragma omp parallel num_threads(nt)
        {
            std::vector<int32_t> ap(a_size), bp(b_size);
            const int64_t t = omp_get_thread_num(), m0 = std::min(M, t * step), m1 = std::min(M, m0 + step);
            if (m0 < m1) gemm_part(m0, m1, N, 0, K, a, b, c, ldc, false, ap, bp, scale);
        }
        return;
    }
    std::vector<std::vector<int32_t>> partial(nt - 1, std::vector<int32_t>((size_t)M * N));
    const int64_t per = ((K + nt - 1) / nt + KC - 1) / KC * KC;
#pragma omp parallel num_threads(nt)
    {
        std::vector<int32_t> ap(a_size), bp(b_size);
        const int t = omp_get_thread_num();
        const int64_t k0 = std::min(K, t * per), k1 = std::min(K, k0 + per);
        int32_t* dst = t == 0 ? c : partial[t - 1].data();
        const int64_t ld = t == 0 ? ldc : N;
        if (k0 < k1) {
            gemm_part(0, M, N, k0, k1, a, b, dst, ld, false, ap, bp, nullptr);
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
                reinterpret_cast<float*>(c)[m * ldc + n] = (float)c[m * ldc + n] * *scale;
}

}  // namespace rq

extern "C" {

// C[m * ldc + n] = sum_k A[m * sam + k * sak] * B[k * sbk + n * sbn]; with a scale (nullable) C is float32
// and holds (float)sum * *scale
void rq_gemm_s8(int64_t M, int64_t N, int64_t K, const int8_t* A, int64_t sam, int64_t sak, const int8_t* B,
                int64_t sbk, int64_t sbn, int32_t* C, int64_t ldc, const float* scale) {
    rq::gemm(M, N, K, rq::Operand{A, sam, sak}, rq::Operand{B, sbn, sbk}, C, ldc, scale);
}

}  // extern "C"
