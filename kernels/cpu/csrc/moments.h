// The population standard deviation of a channel from the sums a pass over it found, shared by the
// quantizer's statistics (quantize.cpp) and the fused BatchNorm's backward pass (norm.cpp), so that DAIQ's
// sigma reaches the method without the eight small torch operations (a threaded MKL square root among them)
// that computing it from the sums took per layer.
#pragma once

#include <cmath>
#include <cstdint>

namespace rq {

// sigma_c = sqrt(max(s2_c / n - (s1_c / n)^2, 0)) in double, rounded to float: the float64 operations of
// quantizer._sigma in the same order (built with -ffp-contract=off, so no fused multiply-add; a NaN stays NaN)
static inline void population_std(const double* s1, const double* s2, int64_t C, int64_t n, float* out) {
    for (int64_t c = 0; c < C; ++c) {
        const double mean = s1[c] / (double)n, var = s2[c] / (double)n - mean * mean;
        out[c] = (float)std::sqrt(var < 0.0 ? 0.0 : var);
    }
}

}  // namespace rq
