// Zero padding of a channels-last int8 map (N, H, W, C dense) into (N, H + 2 ph, W + 2 pw, C), in one pass that
// writes every output byte once: the implicit im2col's input (kernels/cpu/im2col.py, pad_zero). Done with torch
// ops it took five dispatches (an empty buffer, four border fills, the interior copy), which cost more than the
// bytes at ResNet's sizes (docs/measurements.md).
#include <cstdint>
#include <cstring>

#include <omp.h>

namespace {
constexpr int64_t PAD_PARALLEL_MIN = 1 << 16;  // output bytes below which one thread works

// the padded map with every byte XOR `flip` and a border of `flip`: 0 the zero padding, 0x80 the codes as c + 128
// with a border of 128 (an unsigned byte that reads as the code 0: rq_grouped_vnni's input)
void pad_cl(const int8_t* x, int8_t* out, int64_t N, int64_t H, int64_t W, int64_t C, int64_t ph, int64_t pw,
            uint8_t flip) {
    const int64_t Hp = H + 2 * ph, Wp = W + 2 * pw, row = Wp * C, rows = N * Hp;
#pragma omp parallel for schedule(static) if (rows * row >= PAD_PARALLEL_MIN)
    for (int64_t r = 0; r < rows; ++r) {
        const int64_t n = r / Hp, h = r % Hp - ph;
        int8_t* dst = out + r * row;
        if (h < 0 || h >= H) {
            std::memset(dst, flip, (size_t)row);
            continue;
        }
        std::memset(dst, flip, (size_t)(pw * C));
        const int8_t* src = x + (n * H + h) * W * C;
        if (flip == 0) {
            std::memcpy(dst + pw * C, src, (size_t)(W * C));
        } else {
            for (int64_t i = 0; i < W * C; ++i) dst[pw * C + i] = (int8_t)(src[i] ^ (int8_t)flip);
        }
        std::memset(dst + (pw + W) * C, flip, (size_t)(pw * C));
    }
}
}  // namespace

extern "C" {

void rq_pad_cl(const int8_t* x, int8_t* out, int64_t N, int64_t H, int64_t W, int64_t C, int64_t ph, int64_t pw) {
    pad_cl(x, out, N, H, W, C, ph, pw, 0);
}

// rq_pad_cl of the codes as unsigned c + 128: every byte XOR 0x80, the border 0x80
void rq_pad_cl_flipped(const int8_t* x, int8_t* out, int64_t N, int64_t H, int64_t W, int64_t C, int64_t ph,
                       int64_t pw) {
    pad_cl(x, out, N, H, W, C, ph, pw, 0x80);
}

}  // extern "C"
