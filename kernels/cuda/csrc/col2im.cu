// col2im for the input gradient, as a gather (no atomics, deterministic): each input position sums the
// int32 column gradients of every (output position, tap) that read it in the forward pass,
//     dx[n, c, i] = sum over taps k with (i + pad - k*dil) = o*s, 0 <= o < out:  dcols[n, g, p(o), kidx(ci, k)]
// per spatial dim, c = g*Cg + ci. dcols[n, g, p, kidx] is read at n*sN + g*sG + p*sP + kidx*sK (the
// layout of the GEMM that produced it); dx is contiguous (N, C, D, H, W) int32. Index conventions as
// im2col.cu. Sums wrap like int32 (unsigned arithmetic): exact whenever the true sum fits, the contract.

__device__ __forceinline__ bool tap_output(int i, int k, int s, int pad, int dil, int out, int* o) {
    const int t = i + pad - k * dil;
    if (t < 0 || t % s != 0) return false;
    *o = t / s;
    return *o < out;
}

extern "C" __global__ void col2im(const int* __restrict__ dcols, int* __restrict__ dx, int nimg, int C, int G,
                                  int D, int H, int W, int OD, int OH, int OW, int KD, int KH, int KW, int sd,
                                  int sh, int sw, int pd, int ph, int pw, int dd, int dh, int dw, long long sN,
                                  long long sG, long long sP, long long sK) {
    const int Cg = C / G;
    const long long total = (long long)nimg * C * D * H * W;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        const int iw = (int)(e % W), ih = (int)((e / W) % H), id = (int)((e / ((long long)W * H)) % D);
        const long long nc = e / ((long long)W * H * D);
        const int c = (int)(nc % C);
        const long long n = nc / C;
        const int g = c / Cg, ci = c % Cg;
        const int* base = dcols + n * sN + g * sG;
        unsigned int acc = 0u;
        for (int kd = 0; kd < KD; ++kd) {
            int od;
            if (!tap_output(id, kd, sd, pd, dd, OD, &od)) continue;
            for (int kh = 0; kh < KH; ++kh) {
                int oh;
                if (!tap_output(ih, kh, sh, ph, dh, OH, &oh)) continue;
                for (int kw = 0; kw < KW; ++kw) {
                    int ow;
                    if (!tap_output(iw, kw, sw, pw, dw, OW, &ow)) continue;
                    const long long p = ((long long)od * OH + oh) * OW + ow;
                    const long long kidx = (((long long)ci * KD + kd) * KH + kh) * KW + kw;
                    acc += (unsigned int)base[p * sP + kidx * sK];
                }
            }
        }
        dx[e] = (int)acc;
    }
}
