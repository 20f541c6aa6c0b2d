"""The CUDA backend's products on this project's own kernels: a batched int8 GEMM (csrc/gemm_imma.cu,
mma.sync m16n8k32 on tensor cores, sm_80+; csrc/gemm_dp4a.cu below) around im2col and col2im. Grouped
and depthwise convolutions always run here (groups as the GEMM's batch dimension); REPRO_CUDA_GEMM=kernels
sends every product here (tests, comparisons)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from . import runtime
from .columns import ConvGeometry, check_int32_size, check_linear, col2im, im2col

GEMM_TILE = 64  # GEMM block tile (GEMM_BM = GEMM_BN in gemm_common.cuh)


@dataclass(frozen=True)
class GemmPlan:
    """One batched GEMM C[b1, b2][m, n] = sum_k A[b1, b2][m, k] B[b1, b2][n, k] (gemm_common.cuh):
    sizes and the element strides of each operand (k has unit stride in A and B)."""

    M: int
    N: int
    K: int
    nb1: int
    nb2: int
    sA: tuple[int, int, int]  # (b1, b2, m)
    sB: tuple[int, int, int]  # (b1, b2, n)
    sC: tuple[int, int, int, int]  # (b1, b2, m, n)

    def grid(self) -> tuple[int, int, int]:
        gx = -(-self.N // GEMM_TILE)
        gy = -(-self.M // GEMM_TILE)
        gz = self.nb1 * self.nb2
        if gy > runtime.MAX_GRID_YZ or gz > runtime.MAX_GRID_YZ:
            raise ValueError(
                f"GEMM too large for one launch: M={self.M}, batch={gz} (limit {runtime.MAX_GRID_YZ})"
            )
        return gx, gy, gz


def run_gemm(plan: GemmPlan, a, b, c) -> None:
    if plan.M == 0 or plan.N == 0 or plan.nb1 * plan.nb2 == 0:
        return
    module = runtime.gemm_module(a.device)
    threads = 128 if module == "gemm_imma" else 256
    i64 = np.int64
    args = (
        a, b, c, np.int32(plan.M), np.int32(plan.N), np.int32(plan.K), np.int32(plan.nb2),
        *(i64(v) for v in plan.sA), *(i64(v) for v in plan.sB), *(i64(v) for v in plan.sC),
    )  # fmt: skip
    runtime.launch(module, module, plan.grid(), (threads, 1, 1), args)


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (N, K)^T -> int32 (M, N) on this project's GEMM kernel."""
    check_linear(a, b, "gemm")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"gemm: K differs, {tuple(a.shape)} and {tuple(b.shape)}")
    m, k = a.shape
    n = b.shape[0]
    check_int32_size(m, n, k)
    plan = GemmPlan(m, n, k, 1, 1, (0, 0, k), (0, 0, k), (0, 0, n, 1))
    c = torch.zeros((m, n), dtype=torch.int32, device=a.device)
    run_gemm(plan, a.contiguous(), b.contiguous(), c)
    return c


def conv_forward(xq, wq, geo: ConvGeometry) -> torch.Tensor:
    """The forward convolution on this project's kernels: im2col + GEMM, groups as a batch dimension."""
    nd = xq.dim() - 2
    x, w = xq.contiguous(), wq.contiguous()
    g_, P, kg, cg = geo.groups, geo.positions, geo.kg, geo.cout_g
    y = torch.zeros((geo.n, geo.cout, *geo.out[3 - nd :]), dtype=torch.int32, device=xq.device)
    chunk = geo.chunk(g_ * P * kg)
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        cols = torch.empty(nn * g_ * P * kg, dtype=torch.int8, device=xq.device)
        im2col(x[n0 : n0 + nn], cols, geo, (g_ * P * kg, P * kg, kg, 1))
        # per (image, group): C (Cout/G, P) = W_g (Cout/G, kg) . cols (P, kg)^T, written into y directly
        plan = GemmPlan(
            cg, P, kg, nn, g_, (0, cg * kg, kg), (g_ * P * kg, P * kg, kg), (geo.cout * P, cg * P, P, 1)
        )
        run_gemm(plan, w, cols, y[n0 : n0 + nn])
    return y


def conv_input_grad(gq, wq, input_shape, geo: ConvGeometry) -> torch.Tensor:
    g_, P, kg, cg = geo.groups, geo.positions, geo.kg, geo.cout_g
    # A = W_g^T (kg, Cout/G) and B = g as (P, Cout) rows: both k(= output channel)-contiguous
    wt = wq.reshape(g_, cg, kg).transpose(1, 2).contiguous()
    gt = gq.reshape(geo.n, geo.cout, P).transpose(1, 2).contiguous()
    dx = torch.zeros(input_shape, dtype=torch.int32, device=gq.device)
    chunk = geo.chunk(4 * g_ * kg * P)
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        dcols = torch.empty(nn * g_ * kg * P, dtype=torch.int32, device=gq.device)
        # per (image, group): dcols (kg, P) = W_g^T (kg, Cout/G) . g (P, Cout/G)^T
        plan = GemmPlan(
            kg, P, cg, nn, g_, (0, kg * cg, cg), (P * geo.cout, cg, geo.cout), (g_ * kg * P, kg * P, P, 1)
        )
        run_gemm(plan, wt, gt[n0 : n0 + nn], dcols)
        col2im(dcols, dx[n0 : n0 + nn], geo, (g_ * kg * P, kg * P, 1, P))
    return dx


def conv_weight_grad(xq, gq, weight_shape, geo: ConvGeometry) -> torch.Tensor:
    g_, P, kg, cg = geo.groups, geo.positions, geo.kg, geo.cout_g
    x = xq.contiguous()
    dw = torch.zeros((geo.cout, kg), dtype=torch.int32, device=xq.device)
    chunk = geo.chunk(g_ * P * kg)
    check_int32_size(chunk * P)
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        r = nn * P  # the reduction over this chunk's images and output positions
        a = gq[n0 : n0 + nn].reshape(nn, geo.cout, P).transpose(0, 1).contiguous()  # (Cout, nn*P)
        cols = torch.empty(g_ * kg * r, dtype=torch.int8, device=xq.device)
        im2col(x[n0 : n0 + nn], cols, geo, (P, kg * r, 1, r))  # cols[g][kidx][(n, p)]
        part = torch.empty((geo.cout, kg), dtype=torch.int32, device=xq.device)
        # per group: dw_g (Cout/G, kg) = g_g (Cout/G, nn*P) . cols_g (kg, nn*P)^T
        plan = GemmPlan(cg, kg, r, 1, g_, (0, cg * r, r), (0, kg * r, r), (0, cg * kg, kg, 1))
        run_gemm(plan, a, cols, part)
        dw += part  # int32 partial sums over batch chunks: exact within the contract
    return dw.reshape(weight_shape)
