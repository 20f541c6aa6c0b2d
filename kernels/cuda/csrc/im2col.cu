// im2col for 1-, 2- and 3-D convolutions (the host passes 1-D and 2-D as 3-D with unit leading dims):
//     cols[n, g, p, kidx] = xpad[n, g*Cg + ci, o*s - pad + k*dil]     (0 outside the input: zero padding)
// with p = (od, oh, ow) row-major over the output, kidx = (ci, kd, kh, kw) row-major: the order of the
// weight's (Cg, *kernel) dims, so a (Cout, Cg * prod(k)) weight multiplies the columns directly.
// x is contiguous (N, C, D, H, W) int8; cols is written at n*sN + g*sG + p*sP + kidx*sK, so the host
// chooses the layout its GEMM needs (k-contiguous for the forward pass, p-contiguous for the weight grad).
// One thread per column element, grid-stride; consecutive threads take consecutive kidx, or consecutive p
// where the columns are p-contiguous (sP == 1), so that a warp's stores are contiguous either way.

extern "C" __global__ void im2col(const signed char* __restrict__ x, signed char* __restrict__ cols,
                                  int nimg, int C, int G, int D, int H, int W, int OD, int OH, int OW,
                                  int KD, int KH, int KW, int sd, int sh, int sw, int pd, int ph, int pw,
                                  int dd, int dh, int dw, long long sN, long long sG, long long sP,
                                  long long sK) {
    const int Cg = C / G;
    const long long ntap = (long long)KD * KH * KW;
    const long long Kg = Cg * ntap;
    const long long P = (long long)OD * OH * OW;
    const long long total = (long long)nimg * G * P * Kg;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (long long)gridDim.x * blockDim.x) {
        long long kidx, p, t;
        if (sP == 1) {  // p fastest: the weight gradient's position-major columns
            p = e % P;
            t = e / P;
            kidx = t % Kg;
            t /= Kg;
        } else {
            kidx = e % Kg;
            t = e / Kg;
            p = t % P;
            t /= P;
        }
        const int g = (int)(t % G);
        const long long n = t / G;
        const int ci = (int)(kidx / ntap);
        const int tap = (int)(kidx % ntap);
        const int kw = tap % KW, kh = (tap / KW) % KH, kd = tap / (KW * KH);
        const int ow = (int)(p % OW), oh = (int)((p / OW) % OH), od = (int)(p / ((long long)OW * OH));
        const int id = od * sd - pd + kd * dd, ih = oh * sh - ph + kh * dh, iw = ow * sw - pw + kw * dw;
        signed char v = 0;
        if (id >= 0 && id < D && ih >= 0 && ih < H && iw >= 0 && iw < W) {
            const long long c = (long long)g * Cg + ci;
            v = x[(((n * C + c) * D + id) * H + ih) * W + iw];
        }
        cols[n * sN + g * sG + p * sP + kidx * sK] = v;
    }
}
