// int8 GEMM with int32 accumulation by __dp4a (sm_61+; NVRTC 13 targets sm_75 and newer): the fallback
// for GPUs without int8 tensor cores' mma.m16n8k32 (Turing). Operands and the int32 store: gemm_common.cuh.
//
// Block tile 64 x 64, K tile 32, 256 threads as 16 x 16; thread (tx, ty) owns rows ty + 16i and
// columns tx + 16j (i, j < 4). Shared rows hold 32 int8 = 8 words, padded to 9 against bank conflicts.

#define DP4A_THREADS 256
#define DP4A_STRIDE 9

extern "C" __global__ void __launch_bounds__(DP4A_THREADS) gemm_dp4a(GEMM_PARAMS) {
    GEMM_ARGS_STRUCT;
    __shared__ int As[GEMM_BM * DP4A_STRIDE];
    __shared__ int Bs[GEMM_BN * DP4A_STRIDE];
    const int b1 = blockIdx.z / nb2, b2 = blockIdx.z % nb2;
    const signed char* a = A + b1 * sA1 + b2 * sA2;
    const signed char* b = B + b1 * sB1 + b2 * sB2;
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    int acc[4][4];
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] = 0;

    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {
        load_tile(a, sAm, M, K, m0, k0, As, DP4A_STRIDE);
        load_tile(b, sBn, N, K, n0, k0, Bs, DP4A_STRIDE);
        __syncthreads();
        for (int kw = 0; kw < GEMM_BK / 4; ++kw) {
            int av[4], bv[4];
            for (int i = 0; i < 4; ++i) av[i] = As[(ty + 16 * i) * DP4A_STRIDE + kw];
            for (int j = 0; j < 4; ++j) bv[j] = Bs[(tx + 16 * j) * DP4A_STRIDE + kw];
            for (int i = 0; i < 4; ++i)
                for (int j = 0; j < 4; ++j) acc[i][j] = __dp4a(av[i], bv[j], acc[i][j]);
        }
        __syncthreads();
    }
    const long long c_off = b1 * sC1 + b2 * sC2;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) store_result(g, c_off, m0 + ty + 16 * i, n0 + tx + 16 * j, acc[i][j]);
}
