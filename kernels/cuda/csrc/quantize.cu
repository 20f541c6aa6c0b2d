// The CUDA backend's quantizer (repro.quant's semantics), fused, with no host synchronisation:
//     q = round(127 * clamp(x, -s, s) / s),  s = max|x| per tensor or per channel, s = 0 -> q = 0
// computed as the reference does it, so nearest codes are bit-identical:
//     inv = s > 0 ? (1 / s) * 127 : 0   (torch evaluates 127 / s as s.reciprocal() * 127)
//     v   = clamp(x * inv, -127, 127)
//     q   = rint(v) (half to even)                       nearest
//     q   = clamp(floor(v + u), -127, 127), u ~ U[0,1)    stochastic
// with u from the Philox stream of kernels/cpu/csrc/philox.h (the CPU backend's): a tensor read as rows x L,
// L its last dimension, element (r, j) takes word j % 4 of philox((r lo, r hi, j / 4, 0), key). The
// __fmul_rn / __fadd_rn intrinsics keep x*inv + u from fusing into one FMA. A non-finite input sets *flag
// (read once per iteration by kernels.errors.raise_if_nonfinite).
//
// Inputs are float32 (dt 0), bfloat16 (1) or float16 (2) in any dense layout; codes keep the layout. A
// per-channel quantity along a dimension of stride `inner` and size C sees memory as (outer, C, inner).

#define QMAX 127.0f
#define THREADS_1D 256

__device__ __forceinline__ float f16_bits_to_float(unsigned int h) {
    const unsigned int sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1Fu;
    unsigned int mant = h & 0x3FFu, u;
    if (exp == 0u) {
        if (mant == 0u) {
            u = sign;
        } else {  // subnormal: normalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while (!(mant & 0x400u));
            u = sign | ((unsigned int)(127 - 15 - e) << 23) | ((mant & 0x3FFu) << 13);
        }
    } else if (exp == 31u) {
        u = sign | 0x7F800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127u - 15u) << 23) | (mant << 13);
    }
    return __uint_as_float(u);
}

__device__ __forceinline__ float load_elem(const void* x, long long i, int dt) {
    if (dt == 0) return ((const float*)x)[i];
    const unsigned int h = ((const unsigned short*)x)[i];
    return dt == 1 ? __uint_as_float(h << 16) : f16_bits_to_float(h);
}

__device__ __forceinline__ bool nonfinite(float v) { return !(fabsf(v) <= 3.402823466e+38f); }

__device__ __forceinline__ float inv_scale(float s) {
    return s > 0.0f ? __fmul_rn(1.0f / fmaxf(s, 1.17549435e-38f), QMAX) : 0.0f;
}

__device__ __forceinline__ signed char code_nearest(float x, float inv) {
    return (signed char)(int)rintf(fminf(fmaxf(__fmul_rn(x, inv), -QMAX), QMAX));
}

__device__ __forceinline__ signed char code_stochastic(float x, float inv, float u) {
    float v = fminf(fmaxf(__fmul_rn(x, inv), -QMAX), QMAX);
    v = floorf(__fadd_rn(v, u));
    return (signed char)(int)fminf(fmaxf(v, -QMAX), QMAX);
}

// Block-wide max of a non-negative float (all threads get the result). blockDim.x == THREADS_1D.
__device__ float block_max(float v) {
    __shared__ float red[THREADS_1D];
    red[threadIdx.x] = v;
    __syncthreads();
    for (int half = THREADS_1D / 2; half > 0; half >>= 1) {
        if ((int)threadIdx.x < half) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + half]);
        __syncthreads();
    }
    const float r = red[0];
    __syncthreads();  // red is reused by the next call
    return r;
}

// Per-tensor max|x| over the dense memory: block maxima combined with atomicMax on the bit pattern (for
// floats >= 0 the unsigned order of the bits is the numeric order). *amax_bits must be 0 before the
// launch; it is then read as a float scale by the quantizer, on the device.
extern "C" __global__ void absmax_tensor(const void* __restrict__ x, int dt, long long n,
                                         unsigned int* amax_bits, int* flag) {
    float m = 0.0f;
    int bad = 0;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float a = load_elem(x, i, dt);
        if (nonfinite(a)) bad = 1;
        else m = fmaxf(m, fabsf(a));
    }
    if (bad) atomicOr(flag, 1);
    m = block_max(m);
    if (threadIdx.x == 0) atomicMax(amax_bits, __float_as_uint(m));
}

// Per-channel max|x| (as float bits, atomicMax) and, if sum != 0, the sums of x and x^2 (double), over
// memory (outer, C, inner). Thread (ty, tx) of block (bx, by) takes channel c = bx * 32 + tx (inner == 1:
// consecutive threads, consecutive addresses) or, for inner > 1, the run of channel c = bx in row by.
extern "C" __global__ void channel_stats(const void* __restrict__ x, int dt, long long outer, int C,
                                         long long inner, unsigned int* amax_bits, double* sum, double* sumsq,
                                         int* flag) {
    float m = 0.0f;
    double s1 = 0.0, s2 = 0.0;
    int bad = 0;
    long long c;
    if (inner == 1) {  // blockDim (32, 8): 32 channels, rows strided by 8 * gridDim.y
        c = (long long)blockIdx.x * 32 + threadIdx.x;
        if (c < C) {
            for (long long o = (long long)blockIdx.y * blockDim.y + threadIdx.y; o < outer;
                 o += (long long)gridDim.y * blockDim.y) {
                const float a = load_elem(x, o * C + c, dt);
                if (nonfinite(a)) bad = 1;
                m = fmaxf(m, fabsf(a));
                s1 += a;
                s2 += (double)a * a;
            }
        }
    } else {  // blockDim (256): the run of `inner` elements of channel bx in outer row by (grid-strided)
        c = blockIdx.x;
        const long long tid = (long long)threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
        for (long long o = blockIdx.y; o < outer; o += gridDim.y) {
            const long long base = (o * C + c) * inner;
            for (long long i = tid; i < inner; i += nthreads) {
                const float a = load_elem(x, base + i, dt);
                if (nonfinite(a)) bad = 1;
                m = fmaxf(m, fabsf(a));
                s1 += a;
                s2 += (double)a * a;
            }
        }
    }
    if (bad) atomicOr(flag, 1);
    if (c < C) {
        if (m > 0.0f || bad) atomicMax(amax_bits + c, __float_as_uint(bad ? __int_as_float(0x7F800000) : m));
        if (sum != 0 && (s1 != 0.0 || s2 != 0.0)) {
            atomicAdd(sum + c, s1);
            atomicAdd(sumsq + c, s2);
        }
    }
}

// The codes. One thread per group of 4 consecutive j of a row (one Philox call), threads in the memory
// order of the groups so that a warp reads consecutive addresses: the host passes the dimensions sorted
// innermost first (perm), each with its size (the last dimension counted in groups of 4), stride and row
// coefficient (r = sum of index_d * rowc_d over d but the last). scale: one value, or one per channel
// along `axis` (per_channel); a non-finite scale sets *flag as a non-finite x does. thresh (nullable):
// counts[c] += |x| > thresh[c] along `axis` (-1: one count).
extern "C" __global__ void quantize_groups(const void* __restrict__ x, int dt, signed char* __restrict__ q,
                                           int ndim, long long groups, long long L, long long stride_last,
                                           int last_pos, long long size0, long long size1, long long size2,
                                           long long size3, long long size4, long long stride0, long long stride1,
                                           long long stride2, long long stride3, long long stride4,
                                           long long rowc0, long long rowc1, long long rowc2, long long rowc3,
                                           long long rowc4, int axis_pos, const float* __restrict__ scale,
                                           int per_channel, int stochastic, unsigned int k0, unsigned int k1,
                                           const float* __restrict__ thresh, unsigned long long* counts,
                                           int* flag) {
    // dimensions in memory order (innermost first); last_pos / axis_pos: where the last logical dimension
    // and the channel dimension sit in that order (-1: none)
    const long long size[5] = {size0, size1, size2, size3, size4};
    const long long stride[5] = {stride0, stride1, stride2, stride3, stride4};
    const long long rowc[5] = {rowc0, rowc1, rowc2, rowc3, rowc4};
    int bad = 0;
    for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < groups;
         t += (long long)gridDim.x * blockDim.x) {
        long long rem = t, base = 0, r = 0, j4 = 0, chan = 0;
        for (int i = 0; i < ndim; ++i) {
            const long long idx = rem % size[i];
            rem /= size[i];
            if (i == last_pos) {
                j4 = idx;
            } else {
                base += idx * stride[i];
                r += idx * rowc[i];
            }
            if (i == axis_pos) chan = idx;
        }
        unsigned int words[4] = {(unsigned int)r, (unsigned int)((unsigned long long)r >> 32), (unsigned int)j4, 0u};
        if (stochastic) {
            const philox4 w = philox4x32_10(words[0], words[1], words[2], words[3], k0, k1);
            for (int i = 0; i < 4; ++i) words[i] = w.v[i];
        }
        unsigned long long above = 0;  // this group's count (one channel unless the channel is j)
        for (int w = 0; w < 4; ++w) {
            const long long j = 4 * j4 + w;
            if (j >= L) break;
            const long long off = base + j * stride_last;
            const long long c = axis_pos == last_pos ? j : chan;
            const float a = load_elem(x, off, dt);
            const float sc = per_channel ? scale[c] : scale[0];
            if (nonfinite(a) || nonfinite(sc)) bad = 1;  // every scale is read when x is not empty
            const float inv = inv_scale(sc);
            q[off] = stochastic ? code_stochastic(a, inv, (float)(words[w] >> 8) * 5.9604644775390625e-08f)
                                : code_nearest(a, inv);
            if (thresh != 0 && fabsf(a) > thresh[c]) {
                if (axis_pos == last_pos) atomicAdd(counts + c, 1ull);
                else ++above;
            }
        }
        if (above) atomicAdd(counts + chan, above);
    }
    if (bad) atomicOr(flag, 1);
}

// The dequantizing epilogue: out = acc * scale (per tensor, or per channel over memory (outer, C, inner)),
// as float32 (0), bfloat16 (1) or float16 (2), round to nearest even as torch's conversions; out may be acc
// itself for float32.
__device__ __forceinline__ unsigned short float_to_bf16_bits(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ unsigned short float_to_f16_bits(float f) {
    const unsigned int u = __float_as_uint(f), sign = (u >> 16) & 0x8000u, a = u & 0x7FFFFFFFu;
    if (a > 0x7F800000u) return (unsigned short)(sign | 0x7E00u);  // NaN
    if (a >= 0x477FF000u) return (unsigned short)(sign | 0x7C00u);  // rounds to >= 65520: Inf
    if (a < 0x38800000u) {  // below the smallest normal half: a subnormal (or zero), round to nearest even
        if (a < 0x33000000u) return (unsigned short)sign;  // < 2^-25: rounds to 0
        const unsigned int e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u, shift = 126u - e;  // 14..24
        const unsigned int half_bits = m >> shift, rest = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        const unsigned int r = half_bits + (rest > halfway || (rest == halfway && (half_bits & 1u)));
        return (unsigned short)(sign | r);
    }
    const unsigned int r = a + 0xFFFu + ((a >> 13) & 1u) - 0x38000000u;  // rebias 127 -> 15, round
    return (unsigned short)(sign | (r >> 13));
}

extern "C" __global__ void dequantize(const int* __restrict__ acc, void* out, int out_dt, long long n, int C,
                                      long long inner, const float* __restrict__ scale, int per_channel) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float s = per_channel ? scale[(i / inner) % C] : scale[0];
        const float v = __fmul_rn((float)acc[i], s);
        if (out_dt == 0) ((float*)out)[i] = v;
        else if (out_dt == 1) ((unsigned short*)out)[i] = float_to_bf16_bits(v);
        else ((unsigned short*)out)[i] = float_to_f16_bits(v);
    }
}
