// int8 GEMM on tensor cores: mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 (sm_80+), exact int32
// accumulation (no .satfinite). Operands and the int32 store: gemm_common.cuh.
//
// Block tile 64 x 64, K tile 32, 4 warps as 2 x 2, each warp a 32 x 32 tile = 2 (m16) x 4 (n8) mmas.
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k32" with .s8; g = lane / 4, t = lane % 4;
// each .b32 register packs 4 consecutive k, lowest k in the lowest byte):
//   A 16 x 32 row-major, 4 regs: a0 = A[g][4t..4t+3], a1 = A[g+8][4t..], a2 = A[g][16+4t..], a3 = A[g+8][16+4t..]
//   B 32 x 8 "col" (i.e. stored n-major with k contiguous), 2 regs: b0 = B[4t..4t+3][g], b1 = B[16+4t..][g]
//   C/D 16 x 8 s32, 4 regs: c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// Shared tiles keep rows of 32 int8 (8 words) k-contiguous, so a register is one aligned word load; the
// row stride of 12 words puts the 32 lanes' words (rows g, words t) in 32 different banks.

#define IMMA_THREADS 128
#define IMMA_STRIDE 12

__device__ __forceinline__ void mma_s8_16x8x32(int (&d)[4], const int (&a)[4], const int (&b)[2]) {
#ifdef REPRO_CPU_SHIM
    shim_mma_s8_16x8x32(d, a, b);  // the CPU test harness's emulation of the warp-wide instruction
#else
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

extern "C" __global__ void __launch_bounds__(IMMA_THREADS) gemm_imma(GEMM_PARAMS) {
    GEMM_ARGS_STRUCT;
    __shared__ int As[GEMM_BM * IMMA_STRIDE];
    __shared__ int Bs[GEMM_BN * IMMA_STRIDE];
    const int b1 = blockIdx.z / nb2, b2 = blockIdx.z % nb2;
    const signed char* a = A + b1 * sA1 + b2 * sA2;
    const signed char* b = B + b1 * sB1 + b2 * sB2;
    const int m0 = blockIdx.y * GEMM_BM, n0 = blockIdx.x * GEMM_BN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = (warp / 2) * 32, wn = (warp % 2) * 32;  // the warp's tile inside the block tile
    const int gq = lane / 4, tq = lane % 4;
    int acc[2][4][4];
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int r = 0; r < 4; ++r) acc[i][j][r] = 0;

    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {  // every thread runs the same trip count: mma.sync needs the whole warp
        load_tile(a, sAm, M, K, m0, k0, As, IMMA_STRIDE);
        load_tile(b, sBn, N, K, n0, k0, Bs, IMMA_STRIDE);
        __syncthreads();
        int af[2][4], bf[4][2];
        for (int i = 0; i < 2; ++i) {
            const int row = wm + 16 * i + gq;
            af[i][0] = As[row * IMMA_STRIDE + tq];
            af[i][1] = As[(row + 8) * IMMA_STRIDE + tq];
            af[i][2] = As[row * IMMA_STRIDE + tq + 4];
            af[i][3] = As[(row + 8) * IMMA_STRIDE + tq + 4];
        }
        for (int j = 0; j < 4; ++j) {
            const int col = wn + 8 * j + gq;
            bf[j][0] = Bs[col * IMMA_STRIDE + tq];
            bf[j][1] = Bs[col * IMMA_STRIDE + tq + 4];
        }
        for (int i = 0; i < 2; ++i)
            for (int j = 0; j < 4; ++j) mma_s8_16x8x32(acc[i][j], af[i], bf[j]);
        __syncthreads();
    }
    const long long c_off = b1 * sC1 + b2 * sC2;
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
            for (int r = 0; r < 4; ++r) {
                const int m = m0 + wm + 16 * i + gq + 8 * (r / 2);
                const int n = n0 + wn + 8 * j + 2 * tq + (r % 2);
                store_result(g, c_off, m, n, acc[i][j][r]);
            }
}
