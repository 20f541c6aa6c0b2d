// Grouped convolutions on AVX-512 VNNI straight from the padded input (kernels/cpu/im2col.py, _direct_grouped):
// no packed A, no block-diagonal operand, no row sums.
//
// Why its own kernel: the tile GEMM (gemm_amx.cpp) does a grouped product as blocks of groups, each an
// ungrouped GEMM with a block-diagonal weight; on VNNI it packs the implicit im2col of each 16-channel group a
// tile at a time, sums each row of A for its sign correction and multiplies the zeros between a block's groups,
// so RegNetX's grouped 3x3 products ran at about 100 G useful int8 multiply-adds a second where its dense ones
// reach 750 G (AMD Zen 5, docs/measurements.md). Here a block is a few groups whose outputs fill one or two vectors
// of 16 (one group of 16 or 32, two of 8, four of 4): each output pixel's int8 codes are broadcast 4 bytes at a
// time from where they lie in the padded input, against the block's weight packed once a call in VNNI's layout,
// 8 pixels x 16 or 32 outputs in registers. VPDPBUSD multiplies unsigned by signed bytes, so the input is read as
// x + 128 (its padded copy made with every byte XOR 0x80 and a border of 0x80, im2col.flipped_padded) and 128
// times each output's sum of weights over the block's k starts the sums: exact int32 sums, wrapping as every
// sum here does, the same C as kernels.reference. On AMD Zen 4: 200-227 G useful a second on 2 threads on
// RegNetX's layers, whole steps 1-6% faster than on the tile GEMM's blocks (docs/measurements.md).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define RQ_GROUPED 1
#include <immintrin.h>

#include "store16.h"
#include "vnni_rows.h"
#endif

namespace {

#ifdef RQ_GROUPED
constexpr int64_t STRIP = 64;  // output rows a unit of work (8 micro-tiles of 8)

// What every phase of a grouped product shares: block j's groups from starts[j], its blk * a input channels
// (bytes) and blk * b outputs; the weight element (group g, tap t, input i, output o) at w[g * wg + i * wi + o *
// wo + (the phase's tap offset)]; C, its scale and dtype
struct Grouped {
    int64_t a, b, blk, nblocks;
    const int64_t* starts;
    const int8_t* w;
    int64_t wg, wi, wo;
    void* c;
    int64_t ldc;
    rq::OutScale scale;
    bool bf16;
    // a block of several groups of 16 input channels in all and one vector of outputs (RegNetY's 8 + 8,
    // ResNeXt's 4 x 4) multiplies no zeros: per tap its 16 bytes are loaded once and each quad step gives every
    // lane its own group's quad (tile8_lanes), so a tap takes a / 4 steps, not the block's 4
    bool lanes() const { return blk > 1 && blk * a == 16 && blk * b <= 16 && a % 4 == 0; }
    int64_t quads() const { return lanes() ? a / 4 : blk * a / 4; }
    int vectors() const { return blk * b > 16 ? 2 : 1; }
};

// One phase (the forward pass: the only one; a strided input gradient: one per input phase): output row m reads
// the taps at x + rows[m] + taps[t] + (its block's first input channel), the weight's tap t at wt[t], and is
// written at c_rows[m] elements of C (null: m * ldc)
struct Phase {
    const uint8_t* x;
    const int64_t* rows;
    int64_t M;
    const int64_t* taps;
    int64_t T;
    const int64_t* wt;
    const int64_t* c_rows;
};

int64_t packed_bytes(const Grouped& g, const Phase& ph) { return ph.T * g.quads() * g.vectors() * 64; }

// block j's weight for the phase's taps as VNNI rows [tap][quad][vector] (lane o's four k in dword o, zeros
// between the groups and past the block's outputs) and -128 times each output's sum of those weights (the start
// of its sums). Read as the weight lies (im2col.direct_weight): a block of one group whose outputs or inputs are
// contiguous (the layers' channels-last weight) a VNNI row at a time; else a quad a dword, or byte by byte
void pack_block(const Grouped& g, const Phase& ph, int64_t j, int8_t* dst, int32_t* bias) {
    const int64_t row = g.quads() * g.vectors() * 64, quad = g.vectors() * 64;  // one tap's bytes, one quad's
    std::memset(dst, 0, (size_t)packed_bytes(g, ph));
    int32_t sums[32] = {};
    if (g.lanes()) {  // VNNI row (t, q): lane o its group's inputs 4q .. 4q + 3
        for (int64_t o = 0; o < g.blk * g.b; ++o) {
            const int8_t* src = g.w + (g.starts[j] + o / g.b) * g.wg + (o % g.b) * g.wo;
            int32_t sum = 0;
            for (int64_t t = 0; t < ph.T; ++t)
                for (int64_t i = 0; i < g.a; ++i) {
                    const int8_t val = src[i * g.wi + ph.wt[t]];
                    dst[t * row + (i / 4) * 64 + 4 * o + i % 4] = val;
                    sum += val;
                }
            sums[o] = sum;
        }
    } else if (g.blk == 1 && g.a % 4 == 0 && (g.wo == 1 || (g.wi == 1 && 16 * g.wo < (int64_t)1 << 31))) {
        // a VNNI row (tap t, quad q) of 16 outputs at a time: outputs contiguous (wo 1: an input gradient's
        // channels-last weight) by four 16-byte loads interleaved, inputs contiguous (wi 1: a forward pass's) by
        // one gather of 16 outputs' quads
        const int8_t* wg = g.w + g.starts[j] * g.wg;
        const __m512i lane = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                                _mm512_set1_epi32((int32_t)g.wo));
        for (int v = 0; v < g.vectors(); ++v) {
            const int n = (int)std::min<int64_t>(16, g.b - 16 * v);
            const __mmask16 m = n == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
            __m512i sum = _mm512_setzero_si512();
            for (int64_t t = 0; t < ph.T; ++t)
                for (int64_t q = 0; q < g.a / 4; ++q) {
                    const int8_t* at = wg + 16 * v * g.wo + ph.wt[t] + 4 * q * g.wi;
                    __m512i r;
                    if (g.wo == 1) {
                        __m128i c[4];
                        for (int e = 0; e < 4; ++e) c[e] = _mm_maskz_loadu_epi8(m, at + e * g.wi);
                        r = rq::interleave4(c[0], c[1], c[2], c[3]);
                    } else {
                        r = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), m, lane, at, 1);
                    }
                    _mm512_store_si512(dst + t * row + q * quad + 64 * v, r);
                    sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(1), r);  // each lane's four bytes
                }
            _mm512_storeu_si512(sums + 16 * v, sum);
        }
    } else {
        for (int64_t gi = 0; gi < g.blk; ++gi) {  // only the diagonal's weights: group gi's b outputs, a inputs
            const int8_t* wg = g.w + (g.starts[j] + gi) * g.wg;
            for (int64_t ol = 0; ol < g.b; ++ol) {
                const int64_t o = gi * g.b + ol, i0 = gi * g.a;
                int8_t* col = dst + (o / 16) * 64 + 4 * (o % 16);
                int32_t sum = 0;
                for (int64_t t = 0; t < ph.T; ++t) {
                    const int8_t* src = wg + ol * g.wo + ph.wt[t];
                    int8_t* d = col + t * row;
                    if (g.wi == 1 && g.a % 4 == 0) {  // (i0 then a multiple of 4: whole quads)
                        for (int64_t q = 0; q < g.a / 4; ++q) std::memcpy(d + (i0 / 4 + q) * quad, src + 4 * q, 4);
                        for (int64_t ii = 0; ii < g.a; ++ii) sum += src[ii];
                    } else {
                        for (int64_t ii = 0; ii < g.a; ++ii) {
                            const int8_t val = src[ii * g.wi];
                            d[(i0 + ii) / 4 * quad + (i0 + ii) % 4] = val;
                            sum += val;
                        }
                    }
                }
                sums[o] = sum;
            }
        }
    }
    for (int o = 0; o < 32; ++o) bias[o] = (int32_t)((uint32_t)sums[o] * (uint32_t)(-128));
}

// block j's first output the block before it has not written (an overlapping last block: block_starts)
int64_t first_new_output(const Grouped& g, int64_t j) {
    return j > 0 ? std::max<int64_t>(0, (g.starts[j - 1] + g.blk - g.starts[j]) * g.b) : 0;
}

// rows [m0, m0 + count) (count <= 8) of block j: 8 rows x NV vectors of 16 outputs in registers; QC the quads
// a tap where known when compiled (the loop over them unrolled), else 0
template <int NV, int QC>
void tile8(const Grouped& g, const Phase& ph, int64_t j, int64_t m0, int count, const int8_t* wp,
           const int32_t* bias) {
    const int64_t Q = QC > 0 ? QC : g.quads(), ch = g.starts[j] * g.a;
    const uint8_t* base[8];
    for (int r = 0; r < 8; ++r) base[r] = ph.x + ph.rows[m0 + (r < count ? r : 0)] + ch;
    __m512i acc[8][NV];
    for (int v = 0; v < NV; ++v) {
        const __m512i b0 = _mm512_loadu_si512(bias + 16 * v);
        for (int r = 0; r < 8; ++r) acc[r][v] = b0;
    }
    for (int64_t t = 0; t < ph.T; ++t) {
        const int64_t tap = ph.taps[t];
        const int8_t* wt = wp + t * Q * NV * 64;
        for (int64_t q = 0; q < Q; ++q) {
            __m512i bv[NV];
            for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_si512(wt + (q * NV + v) * 64);
            for (int r = 0; r < 8; ++r) {
                int32_t quad;
                std::memcpy(&quad, base[r] + tap + 4 * q, 4);
                const __m512i u = _mm512_set1_epi32(quad);
                for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbusd_epi32(acc[r][v], u, bv[v]);
            }
        }
    }
    // outputs of groups the block before already wrote (an overlapping last block) are not written again
    const int64_t cb = g.blk * g.b, lo = first_new_output(g, j);
    const int64_t col0 = g.starts[j] * g.b;
    const rq::OutRows out{g.ldc, ph.c_rows};
    for (int v = 0; v < NV; ++v) {
        const int64_t first = std::max<int64_t>(lo - 16 * v, 0), last = std::min<int64_t>(cb - 16 * v, 16);
        if (first >= last) continue;
        const __mmask16 mask = (__mmask16)(((1u << last) - 1) & ~((1u << first) - 1));
        for (int r = 0; r < count; ++r) {
            const int64_t col = col0 + 16 * v;
            rq::store16(acc[r][v], mask, g.c, out.off(m0 + r) + col, g.scale.from(m0 + r, col), g.bf16);
        }
    }
}

// tile8 for a block of several groups in one vector (Grouped::lanes): per pixel and tap the block's 16 input
// bytes broadcast to every 128-bit lane, and for quad step q each output lane takes its group's quad q (one
// VPERMD); QG = a / 4 quad steps a tap
template <int QG>
void tile8_lanes(const Grouped& g, const Phase& ph, int64_t j, int64_t m0, int count, const int8_t* wp,
                 const int32_t* bias) {
    const int64_t ch = g.starts[j] * g.a;
    const uint8_t* base[8];
    for (int r = 0; r < 8; ++r) base[r] = ph.x + ph.rows[m0 + (r < count ? r : 0)] + ch;
    alignas(64) int32_t index[QG][16];
    for (int q = 0; q < QG; ++q)
        for (int o = 0; o < 16; ++o) index[q][o] = (int32_t)((o / g.b) * QG + q);
    __m512i idx[QG];
    for (int q = 0; q < QG; ++q) idx[q] = _mm512_load_si512(index[q]);
    __m512i acc[8];
    const __m512i b0 = _mm512_loadu_si512(bias);
    for (int r = 0; r < 8; ++r) acc[r] = b0;
    for (int64_t t = 0; t < ph.T; ++t) {
        const int64_t tap = ph.taps[t];
        const int8_t* wt = wp + t * QG * 64;
        __m512i bv[QG];
        for (int q = 0; q < QG; ++q) bv[q] = _mm512_load_si512(wt + q * 64);
        for (int r = 0; r < 8; ++r) {
            const __m128i row = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base[r] + tap));
            const __m512i bytes = _mm512_broadcast_i32x4(row);
            for (int q = 0; q < QG; ++q)
                acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_permutexvar_epi32(idx[q], bytes), bv[q]);
        }
    }
    const int64_t cb = g.blk * g.b, lo = first_new_output(g, j);
    const __mmask16 mask = (__mmask16)(((1u << cb) - 1) & ~((1u << lo) - 1));
    const rq::OutRows out{g.ldc, ph.c_rows};
    const int64_t col = g.starts[j] * g.b;
    for (int r = 0; r < count; ++r)
        rq::store16(acc[r], mask, g.c, out.off(m0 + r) + col, g.scale.from(m0 + r, col), g.bf16);
}

// tile8 for this product's vectors and quads a tap (4 or 8: 16 or 32 input channels a block, unrolled)
template <int NV>
void tile_nv(const Grouped& g, const Phase& ph, int64_t j, int64_t m0, int count, const int8_t* wp,
             const int32_t* bias) {
    if (NV == 1 && g.lanes()) return g.a == 8 ? tile8_lanes<2>(g, ph, j, m0, count, wp, bias)
                                              : tile8_lanes<1>(g, ph, j, m0, count, wp, bias);
    switch (g.quads()) {
        case 4: return tile8<NV, 4>(g, ph, j, m0, count, wp, bias);
        case 8: return tile8<NV, 8>(g, ph, j, m0, count, wp, bias);
        default: return tile8<NV, 0>(g, ph, j, m0, count, wp, bias);
    }
}

// Every phase's weights packed first (phase by phase, block by block), then units of (block, strip of rows), each
// computing that strip of every phase, so that a strided input gradient's phases write neighbouring positions of
// dx close in time (measured no faster than a call a phase on AMD Zen 4: the float32 writes bound either way; kept
// for its one call)
void run(const Grouped& g, const Phase* phases, int64_t nphases) {
    std::vector<int64_t> offset((size_t)nphases + 1, 0);  // of each phase's packed blocks
    int64_t strips = 0;
    double work = 0;
    for (int64_t p = 0; p < nphases; ++p) {
        offset[p + 1] = offset[p] + g.nblocks * packed_bytes(g, phases[p]);
        strips = std::max(strips, (phases[p].M + STRIP - 1) / STRIP);
        work += (double)phases[p].M * g.nblocks * packed_bytes(g, phases[p]);
    }
    int8_t* packed = static_cast<int8_t*>(std::aligned_alloc(64, (size_t)std::max<int64_t>(64, offset[nphases])));
    std::vector<int32_t> bias((size_t)(nphases * g.nblocks * 32));
    const int nt = work < (double)(1 << 22) ? 1 : std::max(1, omp_get_max_threads());
#pragma omp parallel num_threads(nt)
    {
#pragma omp for schedule(static)
        for (int64_t pj = 0; pj < nphases * g.nblocks; ++pj) {
            const int64_t p = pj / g.nblocks, j = pj % g.nblocks;
            pack_block(g, phases[p], j, packed + offset[p] + j * packed_bytes(g, phases[p]), bias.data() + 32 * pj);
        }
#pragma omp for schedule(static)
        for (int64_t u = 0; u < g.nblocks * strips; ++u) {
            const int64_t j = u / strips, m0 = u % strips * STRIP;
            for (int64_t p = 0; p < nphases; ++p) {
                const Phase& ph = phases[p];
                const int8_t* wp = packed + offset[p] + j * packed_bytes(g, ph);
                const int32_t* bj = bias.data() + 32 * (p * g.nblocks + j);
                for (int64_t m = m0; m < std::min(ph.M, m0 + STRIP); m += 8) {
                    const int count = (int)std::min<int64_t>(8, ph.M - m);
                    if (g.vectors() == 2)
                        tile_nv<2>(g, ph, j, m, count, wp, bj);
                    else
                        tile_nv<1>(g, ph, j, m, count, wp, bj);
                }
            }
        }
    }
    std::free(packed);
}
#endif

}  // namespace

extern "C" {

// Whether rq_grouped_vnni runs here (built with AVX-512 VNNI): 1 or 0
int rq_grouped_vnni_usable() {
#ifdef RQ_GROUPED
    return 1;
#else
    return 0;
#endif
}

// C of a grouped product in `nphases` phases, each 7 int64 of `phases`: x, the padded input as x + 128 (bytes XOR
// 0x80, border 0x80); rows (M of them) and taps (T) byte offsets (im2col.implicit_columns); wt, the weight's
// element offset of each tap; c_rows, where each row of C lies in elements (0: row m at m * ldc). Groups of a input
// and b output channels, in `nblocks` blocks of `blk` groups from starts[j] (blk * a a multiple of 4, blk * b at
// most 32; an overlapping last block writes only its new groups), their outputs from starts[j] * b; the weight
// element (group g, tap t, input i, output o) at w[g * wg + i * wi + o * wo + wt[t]]. With `scale` (nullable; axis
// -1 one value, 1 one per output channel) C is float32 (float)acc * scale, with bf16 that rounded to bfloat16,
// else int32. Returns 0, or 1 where this library has no VNNI (nothing written).
int rq_grouped_vnni(const int64_t* phases, int64_t nphases, int64_t a, int64_t b, int64_t blk, const int64_t* starts,
                    int64_t nblocks, const int8_t* w, int64_t wg, int64_t wi, int64_t wo, void* c, int64_t ldc,
                    const float* scale, int scale_axis, int bf16) {
#ifdef RQ_GROUPED
    if (nphases <= 0 || nblocks <= 0) return 0;
    std::vector<Phase> ph((size_t)nphases);
    for (int64_t p = 0; p < nphases; ++p) {
        const int64_t* f = phases + 7 * p;
        ph[p] = Phase{reinterpret_cast<const uint8_t*>(f[0]), reinterpret_cast<const int64_t*>(f[1]), f[2],
                      reinterpret_cast<const int64_t*>(f[3]), f[4], reinterpret_cast<const int64_t*>(f[5]),
                      reinterpret_cast<const int64_t*>(f[6])};
    }
    run(Grouped{a, b, blk, nblocks, starts, w, wg, wi, wo, c, ldc, rq::OutScale{scale, scale_axis}, bf16 != 0},
        ph.data(), nphases);
    return 0;
#else
    (void)phases, (void)nphases, (void)a, (void)b, (void)blk, (void)starts, (void)nblocks, (void)w, (void)wg;
    (void)wi, (void)wo, (void)c, (void)ldc, (void)scale, (void)scale_axis, (void)bf16;
    return 1;
#endif
}

}  // extern "C"
