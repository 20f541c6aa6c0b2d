// The exact int8 GEMM on Intel AMX tiles (gemm_amx.cpp), which rq_gemm_s8 and rq_gemm_s8_tables try first.
#pragma once

#include <cstdint>

#include "gemm_operand.h"

namespace rq {

// Whether this library was built with AMX-INT8 and Linux lets the process use the tiles.
bool amx_usable();

// Whether gemm_amx runs here: on AMX tiles (amx_usable), or else on AVX-512 VNNI from the same packed tiles
bool tile_gemm_usable();

// C (M x N, its rows where `out` puts them) = A . B with exact int32 sums; with `scale` C is float32 (float)acc *
// scale, with `bf16` too that value rounded to bfloat16 (C then uint16_t). False, and nothing written, where the
// tile GEMM is not usable (tile_gemm_usable): the caller's GEMM runs instead.
bool gemm_amx(int64_t M, int64_t N, int64_t K, const Operand& a, const Operand& b, void* c, OutRows out,
              OutScale scale, bool bf16);

// `count` products of one shape whose item j reads A at a.p + j * a, B at b.p + j * b (bytes) and writes C at c
// + j * c elements (a grouped convolution's blocks of groups, products.py); a scale per row or column of C
// continues item by item (item j's rows at scale + j * M)
struct Batch {
    int64_t count = 1, a = 0, b = 0, c = 0;
};

// Item j of a batch: its operands, its output (elements of `bytes`) and its scale
struct BatchItem {
    Operand a, b;
    void* c;
    OutScale scale;
    BatchItem(const Batch& batch, int64_t j, int64_t M, int64_t N, const Operand& a0, const Operand& b0, void* c0,
              int64_t bytes, OutScale s)
        : a(a0), b(b0), c(static_cast<int8_t*>(c0) + j * batch.c * bytes), scale(s) {
        a.p += j * batch.a;
        b.p += j * batch.b;
        if (s && s.axis >= 0) scale.v += j * (s.axis == 0 ? M : N);
    }
};

// gemm_amx for every item of `batch` in one parallel region, the threads sharing out items and row ranges
bool gemm_amx_batch(const Batch& batch, int64_t M, int64_t N, int64_t K, const Operand& a, const Operand& b, void* c,
                    OutRows out, OutScale scale, bool bf16);

}  // namespace rq
