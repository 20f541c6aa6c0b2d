// The GEMM's operands (gemm.cpp, gemm_amx.cpp): an element (i, k) of a matrix read in place, through strides or
// tables of run starts.
#pragma once

#include <cstdint>

namespace rq {

// An operand's element (i, k) lies at p + off(i) + off(k), i its panel index (m of A, n of B). An axis is
// either strided (v * stride) or read through a table of run starts (t[v / run] + v % run: the implicit
// im2col of a channels-last convolution, where a row (n, o...) or a tap (k...) is a table entry and the run
// its channels, contiguous), so the packing reads the convolution's input itself instead of a copy of it
// 9 times its size (docs/measurements.md).
struct Axis {
    int64_t stride;
    const int64_t* t = nullptr;
    int64_t run = 1;
    int64_t off(int64_t v) const { return t ? (run == 1 ? t[v] : t[v / run] + v % run) : v * stride; }
    // whether [v, v + count) is one unit-stride run
    bool unit(int64_t v, int64_t count) const { return t ? v % run + count <= run : stride == 1 || count == 1; }
};

struct Operand {
    const int8_t* p;
    Axis idx, k;
    const int8_t* at(int64_t i, int64_t kk) const { return p + idx.off(i) + k.off(kk); }
};

// Where the rows of C lie, in elements from C's start: row m at m * ld, or at rows[m] where a table is given (an
// input gradient's phase written straight into its strided positions of dx, kernels/cpu/products.py)
struct OutRows {
    int64_t ld;
    const int64_t* rows = nullptr;
    int64_t off(int64_t m) const { return rows ? rows[m] : m * ld; }
};

// The dequantizing scale of a float output C: one value, or one per row (m) or per column (n) of C (a weight
// gradient's per-output-channel scales, DAIQ's GVQ). Null: C is int32.
struct OutScale {
    const float* v = nullptr;
    int axis = -1;  // -1 one value, 0 one per row, 1 one per column
    // float32 C only: C = C + (float)acc * scale, the sum with the float32 values C holds (a gradient that
    // autograd would add to this product's, added where the product is written: rq_gemm_s8's OUT_ADD)
    bool add = false;
    // float32 C without `add`: whole 64-byte aligned vectors by non-temporal stores (a C larger than the
    // caches, gemm_amx.cpp); the caller fences
    bool stream = false;
    explicit operator bool() const { return v != nullptr; }
    float at(int64_t m, int64_t n) const { return v[axis < 0 ? 0 : axis == 0 ? m : n]; }
    // the scale of the block of C from (m, n): its at(0, 0) is this one's at(m, n)
    OutScale from(int64_t m, int64_t n) const {
        return {axis < 0 || !v ? v : v + (axis == 0 ? m : n), axis, add, stream};
    }
};

}  // namespace rq
