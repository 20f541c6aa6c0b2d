// Fused absmax + symmetric int8 quantization (repro/quant.py):
//     q = round(127 * clamp(x, -s, s) / s),  s = max|x| per tensor or per channel, s = 0 -> q = 0
// computed exactly as the torch code does it, so the codes are bit-identical:
//     inv = s > 0 ? 127 / s : 0   (IEEE division)
//     v   = clamp(x * inv, -127, 127)
//     q   = rint(v) (half to even, torch.round)        nearest
//     q   = clamp(floor(v + u), -127, 127), u ~ U[0,1)  stochastic (Philox, seeded per call)
// The __fmul_rn / __fadd_rn intrinsics keep the compiler from fusing x*inv + u into one FMA (a different
// rounding than torch's two operations). A non-finite input sets *nonfinite; the host then raises.
//
// x is a contiguous float32 tensor seen as (outer, C, inner): C = 1, inner = 1 for per-tensor scales.

#define QMAX 127.0f
#define REDUCE_THREADS 256

__device__ __forceinline__ float inv_scale(float s) {
    // torch: where(s > 0, 127 / s.clamp_min(FLT_MIN), 0)
    return s > 0.0f ? QMAX / fmaxf(s, 1.17549435e-38f) : 0.0f;
}

__device__ __forceinline__ signed char quantize_one(float x, float inv, int stochastic, unsigned long long index,
                                                    unsigned int seed_lo, unsigned int seed_hi) {
    float v = fminf(fmaxf(__fmul_rn(x, inv), -QMAX), QMAX);
    if (stochastic) {
        v = floorf(__fadd_rn(v, philox_uniform(index, seed_lo, seed_hi)));
        v = fminf(fmaxf(v, -QMAX), QMAX);
    } else {
        v = rintf(v);
    }
    return (signed char)(int)v;
}

// Block-wide max of a non-negative float (all threads get the result). blockDim.x == REDUCE_THREADS.
__device__ float block_max(float v) {
    __shared__ float red[REDUCE_THREADS];
    red[threadIdx.x] = v;
    __syncthreads();
    for (int half = REDUCE_THREADS / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + half]);
        __syncthreads();
    }
    const float r = red[0];
    __syncthreads();  // red is reused by the next call
    return r;
}

// Per-tensor max|x|: block maxima combined with atomicMax on the bit pattern (for floats >= 0 the
// unsigned order of the bits is the numeric order). *amax_bits must be 0 before the launch; it can then
// be read as a float scale by quantize_kernel without a round trip through the host.
extern "C" __global__ void absmax_tensor(const float* __restrict__ x, long long n, unsigned int* amax_bits,
                                         int* nonfinite) {
    float m = 0.0f;
    int bad = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float a = fabsf(x[i]);
        if (!(a <= 3.402823466e+38f)) bad = 1;  // NaN or Inf
        else m = fmaxf(m, a);
    }
    if (bad) atomicOr(nonfinite, 1);
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// q = quantize(x, scale[c]) elementwise; c = (i / inner) % C.
extern "C" __global__ void quantize_kernel(const float* __restrict__ x, signed char* __restrict__ q,
                                           const float* __restrict__ scale, long long n, int C, long long inner,
                                           int stochastic, unsigned int seed_lo, unsigned int seed_hi,
                                           int* nonfinite) {
    int bad = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float xi = x[i];
        if (!(fabsf(xi) <= 3.402823466e+38f)) bad = 1;
        const int c = (int)((i / inner) % C);
        q[i] = quantize_one(xi, inv_scale(scale[c]), stochastic, (unsigned long long)i, seed_lo, seed_hi);
    }
    if (bad) atomicOr(nonfinite, 1);
}

// Per-channel, fused: block c finds max|x| over its channel, writes it to amax[c], and quantizes the
// channel with it. Launch with gridDim.x = C, blockDim.x = REDUCE_THREADS.
extern "C" __global__ void absmax_quantize_channel(const float* __restrict__ x, signed char* __restrict__ q,
                                                   float* __restrict__ amax, long long outer, int C,
                                                   long long inner, int stochastic, unsigned int seed_lo,
                                                   unsigned int seed_hi, int* nonfinite) {
    const int c = blockIdx.x;
    const long long count = outer * inner;
    float m = 0.0f;
    int bad = 0;
    for (long long j = threadIdx.x; j < count; j += blockDim.x) {
        const long long i = (j / inner) * C * inner + (long long)c * inner + j % inner;
        const float a = fabsf(x[i]);
        if (!(a <= 3.402823466e+38f)) bad = 1;
        else m = fmaxf(m, a);
    }
    if (bad) atomicOr(nonfinite, 1);
    const float s = block_max(m);
    if (threadIdx.x == 0) amax[c] = s;
    const float inv = inv_scale(s);
    for (long long j = threadIdx.x; j < count; j += blockDim.x) {
        const long long i = (j / inner) * C * inner + (long long)c * inner + j % inner;
        q[i] = quantize_one(x[i], inv, stochastic, (unsigned long long)i, seed_lo, seed_hi);
    }
}
