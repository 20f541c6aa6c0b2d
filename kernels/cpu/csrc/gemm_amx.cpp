// Exact int8 GEMM on Intel AMX tiles, or on AVX-512 VNNI (below): C = A . B, int8 x int8 -> int32 sums, as
// int32, as float32 (float)acc * scale, or as that value rounded to bfloat16.
//
// Why our own: torch's CPU _int_mm calls oneDNN's gemm API (s8s8s32), which does not use AMX; it ran ResNet's
// 1x1 products at 0.6-1.4x bf16's speed, and 2-3x slower inside a training step than alone (ONEDNN_VERBOSE,
// docs/measurements.md). oneDNN's AMX kernels are reached through torch only by its quantized ops, which take
// uint8 input and prepack their weight on every call. TDPBSSD adds exact int32 products of signed bytes, so C
// is the exact sum as kernels.reference defines it (wrapping as int32 does), whatever the blocking.
//
// The operands come as 16 x 64-byte tiles, zero-padded to whole tiles (zeros add nothing): A tiles hold 16 rows
// of 64 k; B tiles hold AMX's VNNI layout, row q = for each of 16 columns its four k (4q .. 4q + 3) in one dword.
// An A tile whose 16 rows are equally spaced with 64 contiguous k each (a 1x1 convolution's rows, 16 pixels of
// one image row in an implicit im2col) is loaded where it lies; other tiles are packed, reading the operand in
// place (rq::Operand: strides or im2col tables) from whichever axis is contiguous, one layout turned into the
// other by a 16 x 16 dword transpose. Each 32 x 32 block of C is 2 x 2 accumulator tiles over K blocks of up to
// KC_TILES tiles (int32 sums between blocks); its epilogue writes the output once. Every thread works alone on
// its rows or columns, or, for a long reduction into a small output (weight gradients), on a range of K whose
// int32 partial sums are added at the end.
//
// Without AMX, with AVX-512 VNNI (AMD Zen 4/5, Intel Ice Lake), the same tiles feed kernel_vnni: B's tiles are
// already VNNI's layout, and VPDPBUSD multiplies unsigned by signed bytes, so B is packed as b + 128 (its bytes
// XOR 0x80) and 128 times each row's sum of A is taken off, modulo 2^32 like every int32 sum here: the same
// exact C. A's tiles are read where AMX reads them (in place where they lie whole, else packed), one 32-row
// strip at a time, which stays in L1 while every column block of B passes over it. The first version flipped
// A instead (B's column sums taken off), so that it packed every A tile, and forward products' A is the large
// operand; docs/measurements.md has that version against torch._int_mm (oneDNN's gemm) and the two against
// each other (this one 1.05-1.19x on forward shapes alone, AMD Zen 5).
#include "gemm_amx.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__linux__)
#if defined(__AMX_INT8__) && defined(__AMX_TILE__)
#define RQ_AMX 1
#endif
#ifdef __AVX512VNNI__
#define RQ_VNNI 1
#endif
#endif
#if defined(RQ_AMX) || defined(RQ_VNNI)
#define RQ_TILES 1
#include <immintrin.h>

#include "bf16.h"
#include "store16.h"
#include "vnni_rows.h"
#endif
#ifdef RQ_AMX
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace rq {

#ifdef RQ_AMX
bool amx_usable() {
    // Linux hands out the tiles' 8 KB of state per process on request (arch_prctl ARCH_REQ_XCOMP_PERM for
    // XFEATURE_XTILEDATA); without it the first tile instruction faults
    static const bool ok = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return ok;
}
#else
bool amx_usable() { return false; }
#endif

#ifdef RQ_TILES
namespace {

constexpr int64_t TK = 64;                 // k bytes in a tile row
constexpr int64_t TILE = 16 * TK;          // bytes of one packed tile
// packed bytes of an A block and of a B block (both stay in L2), and most k tiles per K block: beyond it the
// 32 x 32 sums wait in memory (a long reduction's blocks would not fit in L2)
constexpr int64_t A_BLOCK_BYTES = 256 << 10, B_BLOCK_BYTES = 1 << 20;
constexpr int64_t KC_TILES = 16;
// VNNI: a float32 C of this many bytes and more goes out by non-temporal stores (no read of each line before
// it is overwritten): whole steps 1.02-1.05x faster on AMD Zen 4 (ResNet-18/50, MobileNetV2 at 112 px), whose
// 1x1 products with 64 or 128 input channels were bound by writing their outputs; 1.007x on Zen 5
// (docs/measurements.md). AMX not measured: off there
constexpr int64_t STREAM_BYTES = 4 << 20;

struct alignas(64) TileConfig {
    uint8_t palette_id = 1;
    uint8_t start_row = 0;
    uint8_t reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

// every tile 16 rows of 64 bytes (tiles 0-3 C, 4-5 A, 6-7 B); per thread, before its first tile instruction
void configure_tiles([[maybe_unused]] bool amx) {
#ifdef RQ_AMX
    if (!amx) return;
    TileConfig cfg;
    for (int t = 0; t < 8; ++t) {
        cfg.colsb[t] = 64;
        cfg.rows[t] = 16;
    }
    _tile_loadconfig(&cfg);
#endif
}

void release_tiles([[maybe_unused]] bool amx) {
#ifdef RQ_AMX
    if (amx) _tile_release();
#endif
}

// 16 x 16 dword transpose: rows r[i] -> r[j] holds the former column j
void transpose16(__m512i r[16]) {
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    // each 128-bit lane L of r[4a + b] then holds column 4L + b of rows 4a .. 4a + 3
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    // a 4 x 4 transpose of 128-bit lanes among r[b], r[4 + b], r[8 + b], r[12 + b]
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
        r[i + 4] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0x88);
        r[i + 12] = _mm512_shuffle_i32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

// One tile of x: indices [i0, i0 + ni), k [k0, k0 + nk) (ni <= 16, nk <= 64), zeros elsewhere; an A tile (row i:
// index i's 64 k) or, `as_b`, a B tile (VNNI rows). `flip`: every byte stored XOR 0x80, a signed code c as the
// unsigned c + 128 that VPDPBUSD multiplies (the VNNI kernel's B, pack_b)
void pack_tile(const Operand& x, int64_t i0, int ni, int64_t k0, int nk, bool as_b, int8_t* dst, bool flip = false) {
    __m512i r[16];
    bool vnni = false;  // r holds VNNI rows, else index rows
    if (ni <= 0 || nk <= 0) {
        for (int i = 0; i < 16; ++i) r[i] = _mm512_setzero_si512();
    } else if (x.k.unit(k0, nk)) {  // each index's k contiguous: one masked load per index
        const __mmask64 m = nk == 64 ? ~0ULL : (1ULL << nk) - 1;
        const int64_t koff = x.k.off(k0);  // (a table's run offset divides: once a tile, not once a row)
        for (int i = 0; i < 16; ++i)
            r[i] = i < ni ? _mm512_maskz_loadu_epi8(m, x.p + x.idx.off(i0 + i) + koff) : _mm512_setzero_si512();
    } else if (x.idx.unit(i0, ni)) {  // the indices contiguous at each k: one masked load per k
        const __mmask16 m = ni == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << ni) - 1);
        const int64_t base = x.idx.off(i0);
        for (int q = 0; q < 16; ++q) {
            __m128i c[4];
            for (int j = 0; j < 4; ++j) {
                const int kk = 4 * q + j;
                c[j] = kk < nk ? _mm_maskz_loadu_epi8(m, x.p + base + x.k.off(k0 + kk)) : _mm_setzero_si128();
            }
            r[q] = interleave4(c[0], c[1], c[2], c[3]);
        }
        vnni = true;
    } else if (x.k.t && x.k.run >= 16) {  // k through a table of runs (taps) that a tile straddles: a load per run
        // the runs are the same in every row of the tile: found once (at most 5 of 16 or more in 64 k), each
        // as its offset from the row's start less its place in the tile, and its mask there
        int64_t off[5];
        __mmask64 mask[5];
        int runs = 0;
        for (int kk = 0; kk < nk; ++runs) {
            const int64_t k = k0 + kk;
            const int len = (int)std::min<int64_t>(nk - kk, x.k.run - k % x.k.run);
            mask[runs] = (len == 64 ? ~0ULL : (1ULL << len) - 1) << kk;
            off[runs] = x.k.off(k) - kk;  // (the bytes below kk of this address are masked off: never read)
            kk += len;
        }
        for (int i = 0; i < 16; ++i) {
            __m512i v = _mm512_setzero_si512();
            if (i < ni) {
                const int8_t* row = x.p + x.idx.off(i0 + i);
                for (int j = 0; j < runs; ++j) v = _mm512_mask_loadu_epi8(v, mask[j], row + off[j]);
            }
            r[i] = v;
        }
    } else {  // neither (a strided operand, runs shorter than a tile): byte by byte
        alignas(64) int8_t t[16][64] = {};
        for (int i = 0; i < ni; ++i)
            for (int kk = 0; kk < nk; ++kk) t[i][kk] = *x.at(i0 + i, k0 + kk);
        for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(t[i]);
    }
    if (vnni != as_b) transpose16(r);
    if (flip)
        for (int i = 0; i < 16; ++i) r[i] = _mm512_xor_si512(r[i], _mm512_set1_epi8((char)0x80));
    for (int i = 0; i < 16; ++i) _mm512_store_si512(dst + TK * i, r[i]);
}

// B's indices [i0, i0 + n), k [k0, k1) -> VNNI tiles [group of 16][k tile], n rounded up to 32 (pairs of groups).
// `flip` (the VNNI kernel's B): bytes XOR 0x80, b + 128 as VPDPBUSD's unsigned operand. A padding byte then
// holds 128, against A's zeros (a packed A tile's padding) or in columns of C that are never written
void pack_b(const Operand& x, int64_t i0, int64_t n, int64_t k0, int64_t k1, int8_t* dst, bool flip) {
    const int64_t kt = (k1 - k0 + TK - 1) / TK, groups = (n + 31) / 32 * 2;
    for (int64_t g = 0; g < groups; ++g)
        for (int64_t t = 0; t < kt; ++t) {
            const int ni = (int)std::min<int64_t>(16, n - 16 * g);
            const int nk = (int)std::min<int64_t>(TK, k1 - k0 - TK * t);
            pack_tile(x, i0 + 16 * g, ni, k0 + TK * t, nk, true, dst + (g * kt + t) * TILE, flip);
        }
}

// An A tile where the kernel loads it: rows at p + i * stride (its packed copy: stride 64)
struct TileRef {
    const int8_t* p;
    int64_t stride;
};

// the distance between consecutive indices of the 16 from i0 where it is one (a strided axis, or table rows
// at equal distances: consecutive pixels of one image row), else 0
int64_t equal_spacing(const Axis& ax, int64_t i0) {
    if (!ax.t) return ax.stride;
    if (ax.run != 1) return 0;
    const int64_t d = ax.t[i0 + 1] - ax.t[i0];
    for (int j = 2; j < 16; ++j)
        if (ax.t[i0 + j] - ax.t[i0] != j * d) return 0;
    return d;
}

// A's indices [i0, i0 + n), k [k0, k1) as tile references [group of 16][k tile] (groups rounded up to pairs):
// a whole tile whose rows are equally spaced and whose 64 k are one contiguous run is read in place (by the
// tile load itself, or the VNNI kernel's broadcasts): the rows of a 1x1 convolution, an implicit im2col's
// pixels along an image row where the channels fill whole tiles; any other packed into `buf` (its slot of the
// same index), zeros where it has no index or k
void prepare_a(const Operand& x, int64_t i0, int64_t n, int64_t k0, int64_t k1, int8_t* buf, TileRef* refs) {
    const int64_t kt = (k1 - k0 + TK - 1) / TK, groups = (n + 31) / 32 * 2;
    for (int64_t g = 0; g < groups; ++g) {
        const int ni = (int)std::min<int64_t>(16, n - 16 * g);
        const int64_t d = ni == 16 ? equal_spacing(x.idx, i0 + 16 * g) : 0;
        for (int64_t t = 0; t < kt; ++t) {
            const int nk = (int)std::min<int64_t>(TK, k1 - k0 - TK * t);
            TileRef& r = refs[g * kt + t];
            if (d != 0 && nk == TK && x.k.unit(k0 + TK * t, TK)) {
                r = {x.at(i0 + 16 * g, k0 + TK * t), d};
            } else {
                r = {buf + (g * kt + t) * TILE, TK};
                pack_tile(x, i0 + 16 * g, ni, k0 + TK * t, nk, false, buf + (g * kt + t) * TILE);
            }
        }
    }
}

#ifdef RQ_AMX
// acc (32 x 32 int32) = A's two groups (tile references a, a + kt) . B's two groups over kt k tiles, added to
// acc's values with `add`
void kernel_2x2(const TileRef* a, const int8_t* b, int64_t kt, int32_t* acc, bool add) {
    const TileRef* a1 = a + kt;
    const int8_t* b1 = b + kt * TILE;
    if (add) {
        _tile_loadd(0, acc, 128);
        _tile_loadd(1, acc + 16, 128);
        _tile_loadd(2, acc + 16 * 32, 128);
        _tile_loadd(3, acc + 16 * 32 + 16, 128);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    for (int64_t t = 0; t < kt; ++t) {
        _tile_loadd(4, a[t].p, a[t].stride);
        _tile_loadd(5, a1[t].p, a1[t].stride);
        _tile_loadd(6, b + t * TILE, TK);
        _tile_loadd(7, b1 + t * TILE, TK);
        _tile_dpbssd(0, 4, 6);
        _tile_dpbssd(1, 4, 7);
        _tile_dpbssd(2, 5, 6);
        _tile_dpbssd(3, 5, 7);
    }
    _tile_stored(0, acc, 128);
    _tile_stored(1, acc + 16, 128);
    _tile_stored(2, acc + 16 * 32, 128);
    _tile_stored(3, acc + 16 * 32 + 16, 128);
}
#endif

#ifdef RQ_VNNI
// kernel_2x2 on AVX-512 VNNI: VPDPBUSD multiplies unsigned bytes by signed ones, so B is packed as b + 128 (its
// bytes XOR 0x80, pack_b) and A's tiles are read as they are, in place or packed, by 4-byte broadcasts; `comp`
// (32 values, one a row of the block: 128 times the row's sum of a over these k tiles, row_comp) is taken off.
// All int32 arithmetic wraps, so the result is the exact sum of a b modulo 2^32, as TDPBSSD's. 8 rows x 32
// columns of C in registers at a time: 16 accumulators, the two B vectors of a k quad loaded once for 8
// broadcasts of A. Only the groups of 8 rows that hold some of the block's `rows`, and with NV 1 only its first
// 16 columns (a block of 16 or fewer): the others' sums are never written out (a weight gradient of 16 output
// channels, a grouped product's 16-channel blocks, a strip's last rows); and only the last k tile's first
// `quads` k quads, where the rest is padding (zeros in A: a 1x1 product of 24 input channels, or 8 positions).
// AMX's tiles cost the same whole.
template <int NV>
void kernel_vnni(const TileRef* a, const int8_t* b, int64_t kt, int32_t* acc, bool add, const int32_t* comp,
                 int rows, int quads) {
    const int8_t* b1 = b + kt * TILE;
    for (int h = 0; h < 4 && 8 * h < rows; ++h) {
        const TileRef* ag = a + (h / 2) * kt;
        const int64_t r0 = (h % 2) * 8;
        int32_t* out = acc + 32 * 8 * h;
        __m512i c[8][NV];
        for (int r = 0; r < 8; ++r) {
            // (acc may be a partial sum of a std::vector: not 64-byte aligned)
            const __m512i k = _mm512_set1_epi32(comp[8 * h + r]);
            for (int v = 0; v < NV; ++v)
                c[r][v] = _mm512_sub_epi32(add ? _mm512_loadu_si512(out + 32 * r + 16 * v) : _mm512_setzero_si512(), k);
        }
        // k quads [0, nq) of tile t (a constant 16 for whole tiles, so that the loop unrolls)
        const auto tile = [&](int64_t t, auto nq) {
            const int64_t stride = ag[t].stride;
            const int8_t* ap = ag[t].p + r0 * stride;
            const int8_t *bp0 = b + t * TILE, *bp1 = b1 + t * TILE;
            for (int q = 0; q < nq; ++q) {
                const __m512i v0 = _mm512_load_si512(bp0 + TK * q);
                const __m512i v1 = NV > 1 ? _mm512_load_si512(bp1 + TK * q) : v0;
                for (int r = 0; r < 8; ++r) {
                    int32_t quad;
                    std::memcpy(&quad, ap + stride * r + 4 * q, 4);
                    const __m512i u = _mm512_set1_epi32(quad);
                    c[r][0] = _mm512_dpbusd_epi32(c[r][0], v0, u);
                    if constexpr (NV > 1) c[r][NV - 1] = _mm512_dpbusd_epi32(c[r][NV - 1], v1, u);
                }
            }
        };
        for (int64_t t = 0; t + 1 < kt; ++t) tile(t, std::integral_constant<int, 16>{});
        if (quads == 16)
            tile(kt - 1, std::integral_constant<int, 16>{});
        else
            tile(kt - 1, quads);
        for (int r = 0; r < 8; ++r)
            for (int v = 0; v < NV; ++v) _mm512_storeu_si512(out + 32 * r + 16 * v, c[r][v]);
    }
}

// comp[i] = 128 times the sum over the kt tiles of row i of A's tile references (two groups of 16 rows), modulo
// 2^32: what B's + 128 adds to row i of C (a packed tile's padding is zero, adding nothing)
void row_comp(const TileRef* a, int64_t kt, int32_t* comp) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (int g = 0; g < 2; ++g)
        for (int i = 0; i < 16; ++i) {
            __m512i sum = _mm512_setzero_si512();
            for (int64_t t = 0; t < kt; ++t) {
                const TileRef& r = a[g * kt + t];
                sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512(r.p + r.stride * i));
            }
            comp[16 * g + i] = (int32_t)((uint32_t)_mm512_reduce_add_epi32(sum) << 7);
        }
}
#endif

// acc = the block's product on the kernel this CPU has (amx: the tiles, else VNNI)
// (rows, cols: of the block's 32 x 32 that C holds; quads: the k quads of its last k tile that hold k)
inline void kernel([[maybe_unused]] bool amx, const TileRef* a, const int8_t* b, int64_t kt, int32_t* acc, bool add,
                   [[maybe_unused]] const int32_t* comp, [[maybe_unused]] int rows, [[maybe_unused]] int cols,
                   [[maybe_unused]] int quads) {
#ifdef RQ_AMX
    if (amx) return kernel_2x2(a, b, kt, acc, add);
#endif
#ifdef RQ_VNNI
    if (cols > 16)
        kernel_vnni<2>(a, b, kt, acc, add, comp, rows, quads);
    else
        kernel_vnni<1>(a, b, kt, acc, add, comp, rows, quads);
#endif
}

void write_block(const int32_t* acc, int rows, int cols, void* c, OutRows out, int64_t m0, int64_t n0,
                 OutScale scale, bool bf16) {
    for (int r = 0; r < rows; ++r)
        for (int h = 0; h < 2 && 16 * h < cols; ++h) {
            const int n = std::min(16, cols - 16 * h);
            const __mmask16 m = n == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
            store16(_mm512_load_si512(acc + 32 * r + 16 * h), m, c, out.off(m0 + r) + n0 + 16 * h,
                    scale.from(m0 + r, n0 + 16 * h), bf16);
        }
}

struct Buffer {  // 64-byte aligned scratch
    int8_t* p;
    explicit Buffer(int64_t bytes) : p(static_cast<int8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64))) {}
    ~Buffer() { std::free(p); }
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
};

// rows (mc) or columns (nc) a block holds, a multiple of 32, so that its packed kt tiles take about `bytes`
int64_t block_span(int64_t kt, int64_t bytes) { return std::max<int64_t>(32, bytes / (kt * TK) / 32 * 32); }

// C[m0:m1, n0:n1] = A[m0:m1, k0:k1] . B[k0:k1, n0:n1], by one thread. K in blocks of KC_TILES tiles; the 32 x 32
// accumulators of all but the last block wait in `sums` (int32, one per 32 x 32 block of this part's C)
void part(bool amx, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t k0, int64_t k1, const Operand& a,
          const Operand& b, void* c, OutRows out, OutScale scale, bool bf16) {
    const int64_t kt_all = (k1 - k0 + TK - 1) / TK;
    const int64_t kblocks = (kt_all + KC_TILES - 1) / KC_TILES;
    const int64_t kt_max = (kt_all + kblocks - 1) / kblocks;  // equal blocks
    // VNNI: one 32-row strip of A at a time (its rows' sums found once, row_comp), read by all of the block's
    // columns while in L1
    const int64_t mc_max = amx ? block_span(kt_max, A_BLOCK_BYTES) : 32, nc_max = block_span(kt_max, B_BLOCK_BYTES);
    const int64_t mr = (m1 - m0 + 31) / 32, nr = (n1 - n0 + 31) / 32;
    Buffer ap(std::min(mc_max / 32, mr) * 2 * kt_max * TILE), bp(std::min(nc_max / 32, nr) * 2 * kt_max * TILE);
    std::vector<int32_t> sums(kblocks > 1 ? (size_t)(mr * nr * 32 * 32) : 0);
    std::vector<TileRef> arefs((size_t)(std::min(mc_max / 32, mr) * 2 * kt_max));
    alignas(64) int32_t acc[32 * 32], comp[32];  // comp: VNNI's row_comp of the strip
    for (int64_t kb = 0; kb < kblocks; ++kb) {
        const int64_t pc = k0 + kb * kt_max * TK, pe = std::min(k1, pc + kt_max * TK), kt = (pe - pc + TK - 1) / TK;
        const bool first = kb == 0, last = kb + 1 == kblocks;
        const int quads = (int)((pe - pc - (kt - 1) * TK + 3) / 4);  // of the last k tile
        for (int64_t jc = n0; jc < n1; jc += nc_max) {
            const int64_t nc = std::min(nc_max, n1 - jc);
            pack_b(b, jc, nc, pc, pe, bp.p, !amx);
            for (int64_t ic = m0; ic < m1; ic += mc_max) {
                const int64_t mc = std::min(mc_max, m1 - ic);
                prepare_a(a, ic, mc, pc, pe, ap.p, arefs.data());
#ifdef RQ_VNNI
                if (!amx) row_comp(arefs.data(), kt, comp);  // mc_max 32: the strip is one block of rows
#endif
                for (int64_t ir = 0; ir < mc; ir += 32)
                    for (int64_t jr = 0; jr < nc; jr += 32) {
                        int32_t* s = last && first ? acc
                                                   : sums.data() + (((ic + ir - m0) / 32) * nr + (jc + jr - n0) / 32) * 1024;
                        if (!first && last) std::memcpy(acc, s, sizeof(acc)), s = acc;
                        const int rows = (int)std::min<int64_t>(32, mc - ir);
                        const int cols = (int)std::min<int64_t>(32, nc - jr);
                        kernel(amx, arefs.data() + ir / 16 * kt, bp.p + jr / 16 * kt * TILE, kt, s, !first, comp, rows,
                               cols, quads);
                        if (last) write_block(s, rows, cols, c, out, ic + ir, jc + jr, scale, bf16);
                    }
            }
        }
    }
}

}  // namespace

bool tile_gemm_usable() {
#ifdef RQ_VNNI
    return true;
#else
    return amx_usable();
#endif
}

bool gemm_amx(int64_t M, int64_t N, int64_t K, const Operand& a, const Operand& b, void* c, OutRows out,
              OutScale scale, bool bf16) {
    if (!tile_gemm_usable()) return false;
    const bool amx = amx_usable();
    // small products stay on one thread (gemm.cpp's reason)
    const int nt = (double)M * N * K < (double)(1 << 22) ? 1 : std::max(1, omp_get_max_threads());
    const bool split_k = nt > 1 && K >= 8 * std::max(M, N) && K >= 64 * TK;
    if (!split_k) {
        OutScale epilogue = scale;
        epilogue.stream = !amx && scale && !bf16 && !scale.add && (double)M * N * 4 >= (double)STREAM_BYTES;
        const bool by_cols = N > M && N >= 32 * nt;
        const int64_t span = by_cols ? N : M;
        // the threads' rows in whole AMX tile pairs, or on VNNI in the kernel's 8-row groups (columns: its
        // 16-lane vectors): 784 rows in 32s split 416 / 368, 5% slower than 392 each (docs/measurements.md)
        const int64_t grain = amx ? 32 : by_cols ? 16 : 8;
        const int64_t step = ((span + nt - 1) / nt + grain - 1) / grain * grain;
#pragma omp parallel num_threads(nt)
        {
            const int64_t t = omp_get_thread_num(), lo = std::min(span, t * step), hi = std::min(span, lo + step);
            if (lo < hi) {
                configure_tiles(amx);
                if (by_cols)
                    part(amx, 0, M, lo, hi, 0, K, a, b, c, out, epilogue, bf16);
                else
                    part(amx, lo, hi, 0, N, 0, K, a, b, c, out, epilogue, bf16);
                release_tiles(amx);
            }
            if (epilogue.stream) _mm_sfence();  // the non-temporal stores, seen by every thread after the region
        }
        return true;
    }
    // each thread a range of K (whole tiles) into its own int32 partial sums (zeros where its range is empty),
    // added (and scaled) at the end
    std::vector<std::vector<int32_t>> partial(nt, std::vector<int32_t>((size_t)(M * N)));
    const int64_t per = ((K + nt - 1) / nt + TK - 1) / TK * TK;
#pragma omp parallel num_threads(nt)
    {
        const int t = omp_get_thread_num();
        const int64_t k0 = std::min(K, t * per), k1 = std::min(K, k0 + per);
        if (k0 < k1) {
            configure_tiles(amx);
            part(amx, 0, M, 0, N, k0, k1, a, b, partial[t].data(), OutRows{N}, OutScale{}, false);
            release_tiles(amx);
        }
    }
#pragma omp parallel for num_threads(nt)
    for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; n += 16) {
            const int w = (int)std::min<int64_t>(16, N - n);
            const __mmask16 mk = w == 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << w) - 1);
            __m512i s = _mm512_maskz_loadu_epi32(mk, partial[0].data() + m * N + n);
            for (int t = 1; t < nt; ++t)
                s = _mm512_add_epi32(s, _mm512_maskz_loadu_epi32(mk, partial[t].data() + m * N + n));
            store16(s, mk, c, out.off(m) + n, scale.from(m, n), bf16);
        }
    return true;
}

bool gemm_amx_batch(const Batch& batch, int64_t M, int64_t N, int64_t K, const Operand& a, const Operand& b, void* c,
                    OutRows out, OutScale scale, bool bf16) {
    if (batch.count == 1) return gemm_amx(M, N, K, a, b, c, out, scale, bf16);
    if (!tile_gemm_usable()) return false;
    const bool amx = amx_usable();
    const int nt = (double)M * N * K * batch.count < (double)(1 << 22) ? 1 : std::max(1, omp_get_max_threads());
    const int64_t bytes = bf16 ? 2 : 4;
    // a long reduction into a small C (a weight gradient): B is the large operand, and every row range would
    // pack all of it again; so whole items a thread, or with fewer items than 2 a thread, one item after
    // another with the threads splitting K (gemm_amx)
    const bool long_k = K >= 8 * std::max(M, N) && K >= 64 * TK;
    if (long_k && batch.count < 2 * nt) {
        for (int64_t j = 0; j < batch.count; ++j) {
            const BatchItem item(batch, j, M, N, a, b, c, bytes, scale);
            gemm_amx(M, N, K, item.a, item.b, item.c, out, item.scale, bf16);
        }
        return true;
    }
    // units of work: an item's rows, or its columns where B is the larger operand (a weight gradient's), in
    // parts of whole 32-row blocks, about 4 units a thread (a block's items are small: one call for them all,
    // and no thread idles while items remain); each part packs the other operand whole
    const bool by_cols = N > M;
    const int64_t span = by_cols ? N : M;
    const int64_t want = long_k ? 1 : std::max<int64_t>(1, (4 * nt + batch.count - 1) / batch.count);
    const int64_t step = ((span + want - 1) / want + 31) / 32 * 32, parts = (span + step - 1) / step;
#pragma omp parallel num_threads(nt)
    {
        bool configured = false;
#pragma omp for schedule(static)
        for (int64_t u = 0; u < batch.count * parts; ++u) {
            const int64_t j = u / parts, lo = u % parts * step, hi = std::min(span, lo + step);
            if (!configured) configure_tiles(amx), configured = true;
            const BatchItem item(batch, j, M, N, a, b, c, bytes, scale);
            if (by_cols)
                part(amx, 0, M, lo, hi, 0, K, item.a, item.b, item.c, out, item.scale, bf16);
            else
                part(amx, lo, hi, 0, N, 0, K, item.a, item.b, item.c, out, item.scale, bf16);
        }
        if (configured) release_tiles(amx);
    }
    return true;
}

#else  // built without AMX or AVX-512 VNNI

bool tile_gemm_usable() { return false; }

bool gemm_amx(int64_t, int64_t, int64_t, const Operand&, const Operand&, void*, OutRows, OutScale, bool) {
    return false;
}

bool gemm_amx_batch(const Batch&, int64_t, int64_t, int64_t, const Operand&, const Operand&, void*, OutRows, OutScale,
                    bool) {
    return false;
}

#endif

}  // namespace rq
