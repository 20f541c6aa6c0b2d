// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a counter-based
// generator, so every element draws its own random word from (element index, seed) with no state and
// the result does not depend on the launch geometry. tests/philox_mirror.py has the same function on the host
// (checked against the Random123 known-answer vectors) for the tests.

struct philox4 {
    unsigned int v[4];
};

__device__ __forceinline__ philox4 philox4x32_10(unsigned int c0, unsigned int c1, unsigned int c2,
                                                 unsigned int c3, unsigned int k0, unsigned int k1) {
    const unsigned int M0 = 0xD2511F53u, M1 = 0xCD9E8D57u;
    const unsigned int W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
    for (int round = 0; round < 10; ++round) {
        if (round > 0) {  // the key is bumped between rounds
            k0 += W0;
            k1 += W1;
        }
        const unsigned int hi0 = __umulhi(M0, c0), lo0 = M0 * c0;
        const unsigned int hi1 = __umulhi(M1, c2), lo1 = M1 * c2;
        const unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
        c0 = n0;
        c1 = lo1;
        c2 = n2;
        c3 = lo0;
    }
    philox4 r;
    r.v[0] = c0;
    r.v[1] = c1;
    r.v[2] = c2;
    r.v[3] = c3;
    return r;
}

// u in [0, 1) with 24 random bits (exact in fp32): element `index` of the stream `seed`.
__device__ __forceinline__ float philox_uniform(unsigned long long index, unsigned int seed_lo,
                                                unsigned int seed_hi) {
    const philox4 r = philox4x32_10((unsigned int)index, (unsigned int)(index >> 32), 0u, 0u, seed_lo, seed_hi);
    return (float)(r.v[0] >> 8) * 5.9604644775390625e-08f;  // 2^-24
}
