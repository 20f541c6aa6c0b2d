// Shared by the int8 GEMM kernels: the operand addressing and the int32 store.
//
// Every GEMM computes, for each batch entry (b1, b2) = (blockIdx.z / nb2, blockIdx.z % nb2),
//     C[m, n] = sum_k A[m, k] * B[n, k]        (int8 x int8 -> exact int32)
// with A and B "K-contiguous" (unit stride along k; the host lays operands out so) and arbitrary 64-bit
// strides elsewhere: A[m, k] = A + b1*sA1 + b2*sA2 + m*sAm + k, likewise B with sBn, and C[m, n] at
// b1*sC1 + b2*sC2 + m*sCm + n*sCn. This one form covers linear layers (A row-major, B = W row-major is
// mma's "col" operand) and every im2col convolution product (b1 = image, b2 = group). Dequantizing is
// the quantizer module's epilogue (quantize.cu), after any product.

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 32

struct GemmArgs {
    const signed char* A;
    const signed char* B;
    int* C;
    int M, N, K, nb2;
    long long sA1, sA2, sAm, sB1, sB2, sBn, sC1, sC2, sCm, sCn;
};

// Copies a GEMM_BM x GEMM_BK tile of a K-contiguous operand (rows r0.., columns k0..) into shared memory,
// one 32-bit word (4 consecutive k, the lowest k in the lowest byte) per step, zero outside
// [0, rows) x [0, K): the zero padding makes any K (not only multiples of 32) exact. A word that lies
// inside K at a 4-byte aligned address is one load; others (the ragged end of K, operands at odd
// offsets or row strides) are assembled from single bytes. `stride_words` is the shared row stride in
// words (padded against bank conflicts).
__device__ __forceinline__ void load_tile(const signed char* __restrict__ base, long long row_stride, int rows,
                                          int K, int r0, int k0, int* tile, int stride_words) {
    for (int e = threadIdx.x; e < GEMM_BM * (GEMM_BK / 4); e += blockDim.x) {
        const int r = e / (GEMM_BK / 4), kw = e % (GEMM_BK / 4);
        const int gr = r0 + r, gk = k0 + 4 * kw;
        int word = 0;
        if (gr < rows && gk < K) {
            const signed char* src = base + (long long)gr * row_stride + gk;
            if (gk + 3 < K && (reinterpret_cast<unsigned long long>(src) & 3ull) == 0) {
                word = *reinterpret_cast<const int*>(src);
            } else {
                for (int j = 0; j < 4 && gk + j < K; ++j) word |= (int)(unsigned char)src[j] << (8 * j);
            }
        }
        tile[r * stride_words + kw] = word;
    }
}

__device__ __forceinline__ void store_result(const GemmArgs& g, long long c_off, int m, int n, int acc) {
    if (m >= g.M || n >= g.N) return;
    g.C[c_off + (long long)m * g.sCm + (long long)n * g.sCn] = acc;
}

#define GEMM_PARAMS                                                                                        \
    const signed char *__restrict__ A, const signed char *__restrict__ B, int *C, int M, int N, int K,    \
        int nb2,                                                                                           \
        long long sA1, long long sA2, long long sAm, long long sB1, long long sB2, long long sBn,         \
        long long sC1, long long sC2, long long sCm, long long sCn

#define GEMM_ARGS_STRUCT                                                                                   \
    GemmArgs g = {A, B, C, M, N, K, nb2,                                                                   \
                  sA1, sA2, sAm, sB1, sB2, sBn, sC1, sC2, sCm, sCn}
