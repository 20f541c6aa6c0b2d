// Rounding float32 values to a narrower floating-point format (sign, `man_bits` mantissa bits, smallest
// normal exponent `emin`), in one pass: the simulated FP8 / FP16 training of repro.methods.fp8. The same
// integer and float operations as its torch expression (repro/methods/fp8/formats.py, `_round`), element
// by element, so the same bits (tests/test_fp8.py compares them):
//   nearest:     bits + ((bits >> drop) & 1) + 2^(drop-1) - 1, the low `drop` bits cleared (half to even);
//                below 2^emin, nearbyint(x / ulp) * ulp (the subnormal grid); then clamped to +-max.
//   stochastic:  bits + noise[i], the low `drop` bits cleared, clamped; `small` (nullable) marks the
//                elements below 2^emin, which the caller rounds on the subnormal grid.
// Integer sums wrap as torch's int32 do (unsigned arithmetic here). OpenMP over elements (torch's runtime).
#include <cmath>
#include <cstdint>
#include <cstring>

#include <omp.h>

namespace {

constexpr int64_t PARALLEL_MIN = 1 << 15;  // below this a pass stays on one thread (as quantize.cpp)

inline float clamp_to(float v, float max_value) {
    // torch.clamp_(-max, max): NaN stays NaN (the caller has checked for non-finite input anyway)
    return v < -max_value ? -max_value : (v > max_value ? max_value : v);
}

}  // namespace

extern "C" {

// Returns the number of elements below 2^emin in magnitude when `small` is given, else 0.
int64_t rq_round_float_format(const float* x, float* out, int64_t n, int man_bits, int emin, float max_value,
                              const int32_t* noise, uint8_t* small) {
    const int drop = 23 - man_bits;
    const uint32_t low_mask = (1u << drop) - 1u, half_minus_one = (1u << (drop - 1)) - 1u;
    const float normal_min = std::ldexp(1.0f, emin), ulp = std::ldexp(1.0f, emin - man_bits);
    int64_t count = 0;
#pragma omp parallel for schedule(static) reduction(+ : count) if (n >= PARALLEL_MIN)
    for (int64_t i = 0; i < n; ++i) {
        const float v = x[i];
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        const bool below = std::fabs(v) < normal_min;
        uint32_t rounded;
        if (noise == nullptr) {
            rounded = (((bits >> drop) & 1u) + half_minus_one + bits) & ~low_mask;
        } else {
            rounded = (bits + (uint32_t)noise[i]) & ~low_mask;
        }
        float r;
        std::memcpy(&r, &rounded, 4);
        if (noise == nullptr && below) {
            r = std::nearbyint(v / ulp) * ulp;  // float32 division, rounding and product, as torch's
        }
        out[i] = clamp_to(r, max_value);
        if (small != nullptr) {
            small[i] = below;
            count += below;
        }
    }
    return count;
}

}  // extern "C"
