// Zero padding of a channels-last int8 map (N, H, W, C dense) into (N, H + 2 ph, W + 2 pw, C), in one pass that
// writes every output byte once: the implicit im2col's input (kernels/cpu/im2col.py, pad_zero). Done with torch
// ops it took five dispatches (an empty buffer, four border fills, the interior copy), which cost more than the
// bytes at ResNet's sizes (docs/measurements.md).
#include <cstdint>
#include <cstring>

#include <omp.h>

namespace {
constexpr int64_t PAD_PARALLEL_MIN = 1 << 16;  // output bytes below which one thread works
}

extern "C" {

void rq_pad_cl(const int8_t* x, int8_t* out, int64_t N, int64_t H, int64_t W, int64_t C, int64_t ph, int64_t pw) {
    const int64_t Hp = H + 2 * ph, Wp = W + 2 * pw, row = Wp * C, rows = N * Hp;
#pragma omp parallel for schedule(static) if (rows * row >= PAD_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = r / Hp, h = r % Hp - ph;
        int8_t* dst = out + r * row;
        if (h < 0 || h >= H) {
            std::memset(dst, 0, (size_t)row);
            continue;
        }
        std::memset(dst, 0, (size_t)(pw * C));
        std::memcpy(dst + pw * C, x + (n * H + h) * W * C, (size_t)(W * C));
        std::memset(dst + (pw + W) * C, 0, (size_t)(pw * C));
    }
}

}  // extern "C"
