// A stand-in for the CUDA runtime that lets the kernel sources in this folder run on the CPU, for the
// tests of a machine without a GPU (tests/test_cuda_backend.py). g++ compiles a kernel module with this
// header force-included: every GPU thread of a block becomes an std::thread, __syncthreads a barrier,
// __shared__ arrays statics (blocks run one after another), and the warp-wide int8 mma.sync an
// emulation built from the PTX ISA's fragment tables. It checks the kernels' indexing, tiling, bounds,
// zero padding and arithmetic; it is no substitute for running them on a GPU (memory model, warp
// scheduling, the real tensor-core instruction).
#pragma once

#include <barrier>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <mutex>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#define REPRO_CPU_SHIM 1

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
static thread_local dim3 threadIdx;
static thread_local dim3 blockIdx;
static dim3 blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static  // one block runs at a time, so a static is that block's shared memory

static std::barrier<>* shim_barrier = nullptr;
static std::mutex shim_atomic_mutex;

inline void __syncthreads() { shim_barrier->arrive_and_wait(); }

inline unsigned int atomicMax(unsigned int* p, unsigned int v) {
    std::lock_guard<std::mutex> lock(shim_atomic_mutex);
    const unsigned int old = *p;
    if (v > old) *p = v;
    return old;
}

inline int atomicOr(int* p, int v) {
    std::lock_guard<std::mutex> lock(shim_atomic_mutex);
    const int old = *p;
    *p = old | v;
    return old;
}

inline float atomicAdd(float* p, float v) {
    std::lock_guard<std::mutex> lock(shim_atomic_mutex);
    const float old = *p;
    *p = old + v;
    return old;
}

inline double atomicAdd(double* p, double v) {
    std::lock_guard<std::mutex> lock(shim_atomic_mutex);
    const double old = *p;
    *p = old + v;
    return old;
}

inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) {
    std::lock_guard<std::mutex> lock(shim_atomic_mutex);
    const unsigned long long old = *p;
    *p = old + v;
    return old;
}

inline float __uint_as_float(unsigned int u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

inline float __int_as_float(int i) { return __uint_as_float((unsigned int)i); }

inline unsigned int __umulhi(unsigned int a, unsigned int b) {
    return (unsigned int)(((unsigned long long)a * b) >> 32);
}

inline unsigned int __float_as_uint(float f) {
    unsigned int u;
    std::memcpy(&u, &f, 4);
    return u;
}

// compiled with -ffp-contract=off: one IEEE round-to-nearest operation each, as the intrinsics
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }

inline int __dp4a(int a, int b, int c) {
    unsigned int acc = (unsigned int)c;
    for (int i = 0; i < 4; ++i) {
        const int ai = (signed char)(a >> (8 * i)), bi = (signed char)(b >> (8 * i));
        acc += (unsigned int)(ai * bi);
    }
    return (int)acc;
}

// mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 with D = C in place. Each lane stages its fragments,
// the warp's 16x32 A, 32x8 B and 16x8 C are rebuilt from the PTX ISA's fragment tables (g = lane / 4,
// t = lane % 4, byte j of a register = element 4t + j along k), and each lane takes its own D fragment.
// The kernel calls it uniformly from every thread of the block, so a block barrier serves as the warp's.
struct ShimWarpFragments {
    int a[32][4], b[32][2], c[32][4];
};
static ShimWarpFragments shim_fragments[32];

inline void shim_mma_s8_16x8x32(int (&d)[4], const int (&a)[4], const int (&b)[2]) {
    const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const unsigned warp = tid / 32, lane = tid % 32;
    ShimWarpFragments& f = shim_fragments[warp];
    for (int r = 0; r < 4; ++r) f.a[lane][r] = a[r], f.c[lane][r] = d[r];
    for (int r = 0; r < 2; ++r) f.b[lane][r] = b[r];
    __syncthreads();
    int A[16][32], B[32][8], C[16][8];
    for (int L = 0; L < 32; ++L) {
        const int g = L / 4, t = L % 4;
        for (int r = 0; r < 4; ++r)
            for (int j = 0; j < 4; ++j)
                A[g + 8 * (r % 2)][4 * t + j + 16 * (r / 2)] = (signed char)(f.a[L][r] >> (8 * j));
        for (int r = 0; r < 2; ++r)
            for (int j = 0; j < 4; ++j) B[4 * t + j + 16 * r][g] = (signed char)(f.b[L][r] >> (8 * j));
        for (int r = 0; r < 4; ++r) C[g + 8 * (r / 2)][2 * t + (r % 2)] = f.c[L][r];
    }
    const int g = lane / 4, t = lane % 4;
    for (int r = 0; r < 4; ++r) {
        const int m = g + 8 * (r / 2), n = 2 * t + (r % 2);
        unsigned int acc = (unsigned int)C[m][n];
        for (int k = 0; k < 32; ++k) acc += (unsigned int)(A[m][k] * B[k][n]);
        d[r] = (int)acc;
    }
    __syncthreads();  // nobody restages before every lane has read
}

template <class F>
void shim_launch(dim3 grid, dim3 block, F&& body) {
    blockDim = block;
    gridDim = grid;
    const unsigned n = block.x * block.y * block.z;
    std::barrier<> barrier(n);
    shim_barrier = &barrier;
    // one std::thread per GPU thread of a block, walking the blocks in turn; the barrier at the end of
    // each block keeps the next block off the shared statics until every thread is done with them
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (unsigned i = 0; i < n; ++i)
        threads.emplace_back([&, i] {
            threadIdx = dim3{i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
            for (unsigned bz = 0; bz < grid.z; ++bz)
                for (unsigned by = 0; by < grid.y; ++by)
                    for (unsigned bx = 0; bx < grid.x; ++bx) {
                        blockIdx = dim3{bx, by, bz};
                        body();
                        barrier.arrive_and_wait();
                    }
        });
    for (auto& th : threads) th.join();
    shim_barrier = nullptr;
}

template <class F>
struct shim_arity;
template <class... A>
struct shim_arity<void(A...)> {
    static constexpr std::size_t value = sizeof...(A);
};

// calls fn with its i-th argument read from the object that args[i] points to (the kernel's own types)
template <class... A, std::size_t... I>
void shim_call(void (*fn)(A...), void** args, std::index_sequence<I...>) {
    fn(*static_cast<std::remove_reference_t<A>*>(args[I])...);
}

#define SHIM_EXPORT(name)                                                                                  \
    extern "C" void shim_launch_##name(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,     \
                                       unsigned bz, void** args) {                                         \
        shim_launch(dim3{gx, gy, gz}, dim3{bx, by, bz},                                                    \
                    [&] { shim_call(name, args, std::make_index_sequence<shim_arity<decltype(name)>::value>{}); }); \
    }
