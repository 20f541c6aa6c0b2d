"""The CUDA backend's ungrouped products on cuBLASLt through ``torch._int_mm`` (int8 x int8 -> int32).

cuBLASLt's int8 GEMM measured 937 TOPS on an H100 at 8192^3 where this project's own IMMA kernel reached 90
(issue 15). ``torch._int_mm`` asks for M > 16 and K, N multiples of 8: operands are zero-padded to that
(zeros add nothing to the sums). cuBLASLt's int8 kernels want both operands K-major, the "TN" layout (a
row-major, b column-major, 16-byte aligned): on an H200 (CUDA 13.0, 2026-11-29) other layouts raised
CUBLAS_STATUS_NOT_SUPPORTED at some shapes, TN ran every ResNet-50 shape, so ``int_mm`` lays them out so.
Convolutions around it:

* forward: 1x1 stride-1 convolutions of channels-last activations are the GEMM itself (no im2col);
  others im2col (csrc/im2col.cu) into K-padded rows, batch chunks bounding the columns' memory;
* input gradient: stride 1 is the forward convolution of g with the flipped, transposed weight; a
  strided 1x1 is a GEMM scattered onto every s-th position; other strides a GEMM and the col2im gather;
* weight gradient: g^T . columns with the reduction over N * positions split into chunks of at most
  SPLIT_K rows, whose int32 sums are exact by the int32 contract and are added (wrapping, as int32
  does: exact whenever the total fits).

Grouped and depthwise convolutions stay on the project's kernels (kernels.cuda.own_kernels), which batch
the groups.
Results are int32 in channels-last (convolutions) or row-major (linear) layout.
"""

from __future__ import annotations

import torch

from . import runtime
from .columns import ConvGeometry, col2im, im2col

SPLIT_K = 131_072  # a multiple of 8 below the int32 contract's 133,144 terms of 127 * 127
MIN_M = 17


def _round8(v: int) -> int:
    return -(-v // 8) * 8


def k_major(t: torch.Tensor) -> bool:
    """Rows of ``t`` (R, K) that cuBLASLt's int8 kernels read: stride 1 along K, a leading dimension that is a
    multiple of 8, and a 16-byte-aligned start."""
    r, k = t.shape
    ld = t.stride(0)
    return t.stride(1) == 1 and (r == 1 or (ld >= k and ld % 8 == 0)) and t.data_ptr() % 16 == 0


def _k_major_padded(t: torch.Tensor, rows: int, k: int) -> torch.Tensor:
    """``t`` (R, K) as K-major rows (rows, k), zero-padded; one copy only where the layout or shape asks (a
    fresh tensor is row-major and aligned)."""
    r, c = t.shape
    if (r, c) != (rows, k):
        return torch.nn.functional.pad(t, (0, k - c, 0, rows - r))
    return t if k_major(t) else t.clone(memory_format=torch.contiguous_format)


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int8 (M, K) @ int8 (K, N) -> int32 (M, N) through torch._int_mm: the shapes it rejects
    zero-padded, and the operands laid out K-major (a row-major, b column-major), the layout cuBLASLt's int8
    kernels want. K must stay within the int32 contract (callers split longer reductions:
    int_mm_long)."""
    m, k = a.shape
    n = b.shape[1]
    if 0 in (m, k, n):  # empty sums are zeros: no GEMM (torch._int_mm refuses K = 0)
        return torch.zeros((m, n), dtype=torch.int32, device=a.device)
    mp, kp, np_ = max(m, MIN_M), _round8(k), _round8(n)
    a = _k_major_padded(a, mp, kp)
    b = _k_major_padded(b.t(), np_, kp).t()
    out = runtime.int_mm(a, b)  # cuBLASLt, or what the current launcher stands in with
    return out if (mp, np_) == (m, n) else out[:m, :n]


def int_mm_long(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int_mm over a reduction of any length: chunks of SPLIT_K, their int32 sums added."""
    k = a.shape[1]
    if k <= SPLIT_K:
        return int_mm(a, b)
    out = None
    for k0 in range(0, k, SPLIT_K):
        part = int_mm(a[:, k0 : k0 + SPLIT_K], b[k0 : k0 + SPLIT_K])
        out = part.contiguous() if out is None else out.add_(part)
    return out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(N, C, *spatial) -> (N * positions, C) rows, a view of a channels-last tensor (a copy otherwise)."""
    c = t.shape[1]
    return t.movedim(1, -1).reshape(-1, c)


def _from_rows(rows: torch.Tensor, n: int, spatial) -> torch.Tensor:
    """(N * positions, C) rows -> (N, C, *spatial), channels-last."""
    return rows.reshape(n, *spatial, rows.shape[1]).movedim(-1, 1)


def _is_pointwise(geo) -> bool:
    return all(v == 1 for v in geo.k) and all(v == 0 for v in geo.p)


def _cols(x: torch.Tensor, geo, n0: int, nn: int) -> torch.Tensor:
    """im2col rows (nn * P, K padded to 8) of images n0..n0+nn, kidx = (ci, *kernel) as the weight's."""
    p, k = geo.positions, geo.kg
    kp = _round8(k)
    cols = torch.empty((nn * p, kp), dtype=torch.int8, device=x.device)
    if kp != k:
        cols[:, k:].zero_()
    im2col(x[n0 : n0 + nn], cols, geo, (p * kp, 0, kp, 1))
    return cols


def _cols_position_major(x: torch.Tensor, geo, n0: int, nn: int) -> torch.Tensor:
    """The same columns as ``_cols``, (nn * P, K padded to 8), written column-major: the reduction over
    positions of the weight gradient is then K-major for cuBLASLt without a transposing copy."""
    p, k = geo.positions, geo.kg
    kp = _round8(k)
    cols_t = torch.empty((kp, nn * p), dtype=torch.int8, device=x.device)
    if kp != k:
        cols_t[k:].zero_()
    im2col(x[n0 : n0 + nn], cols_t, geo, (p, 0, 1, nn * p))
    return cols_t.t()


def _weight_rows(wq: torch.Tensor, kp: int) -> torch.Tensor:
    """(Cout, K padded) int8 of a weight (Cout, Cin, *kernel)."""
    w2 = wq.reshape(wq.shape[0], -1)
    return w2 if w2.shape[1] == kp else torch.nn.functional.pad(w2, (0, kp - w2.shape[1]))


def conv_forward(xq, wq, geo) -> torch.Tensor:
    nd = xq.dim() - 2
    spatial_out = geo.out[3 - nd :]
    if _is_pointwise(geo) and all(v == 1 for v in geo.s):
        return _from_rows(int_mm(_rows(xq), wq.reshape(geo.cout, -1).t()), geo.n, spatial_out)
    if _is_pointwise(geo):  # strided 1x1: the subsampled input's rows
        x = xq[(slice(None), slice(None), *(slice(None, None, s) for s in geo.s[3 - nd :]))]
        return _from_rows(int_mm(_rows(x), wq.reshape(geo.cout, -1).t()), geo.n, spatial_out)
    x = xq.contiguous()
    w = _weight_rows(wq, _round8(geo.kg)).t()
    y = torch.empty((geo.n * geo.positions, geo.cout), dtype=torch.int32, device=xq.device)
    chunk = geo.chunk(geo.positions * _round8(geo.kg))
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        y[n0 * geo.positions : (n0 + nn) * geo.positions] = int_mm(_cols(x, geo, n0, nn), w)
    return _from_rows(y, geo.n, spatial_out)


def conv_input_grad(gq, wq, input_shape, geo) -> torch.Tensor:
    nd = len(input_shape) - 2
    sp = tuple(range(2, 2 + nd))
    if all(v == 1 for v in geo.s):
        # stride 1: the forward convolution of g with the flipped, transposed weight
        pad = tuple(geo.d[i] * (geo.k[i] - 1) - geo.p[i] for i in range(3 - nd, 3))
        if min(pad) >= 0:
            wt = wq.flip(sp).transpose(0, 1)
            sub = ConvGeometry.of(gq.shape, wt.shape, 1, pad, geo.d[3 - nd :], 1)
            return conv_forward(gq, wt, sub)
    spatial_out = geo.out[3 - nd :]
    if _is_pointwise(geo):  # strided 1x1: a GEMM scattered onto every s-th input position
        dx = torch.zeros(
            (input_shape[0], *input_shape[2:], input_shape[1]), dtype=torch.int32, device=gq.device
        )
        dx = dx.movedim(-1, 1)
        rows = int_mm(_rows(gq), wq.reshape(geo.cout, -1))
        window = (
            slice(None),
            slice(None),
            *(slice(0, o * s, s) for o, s in zip(spatial_out, geo.s[3 - nd :], strict=True)),
        )
        dx[window] = _from_rows(rows, geo.n, spatial_out)
        return dx
    # a GEMM into the columns' gradient, then the col2im gather
    k, p = geo.kg, geo.positions
    w = wq.reshape(geo.cout, k)
    g_rows = _rows(gq)
    dx = torch.empty(input_shape, dtype=torch.int32, device=gq.device)
    chunk = geo.chunk(4 * p * k)
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        dcols = int_mm(g_rows[n0 * p : (n0 + nn) * p], w).contiguous()  # (nn * P, K)
        col2im(dcols, dx[n0 : n0 + nn], geo, (p * k, 0, k, 1))
    return dx


def conv_weight_grad(xq, gq, weight_shape, geo) -> torch.Tensor:
    nd = xq.dim() - 2
    p = geo.positions
    g_rows = _rows(gq)  # (N * P, Cout)
    if _is_pointwise(geo):
        x = xq[(slice(None), slice(None), *(slice(None, None, s) for s in geo.s[3 - nd :]))]
        return int_mm_long(g_rows.t(), _rows(x)).reshape(weight_shape).contiguous()
    x = xq.contiguous()
    kp = _round8(geo.kg)
    # images per chunk: the columns' memory, and a reduction within SPLIT_K
    chunk = max(1, min(geo.chunk(p * kp), SPLIT_K // max(1, p)))
    dw = None
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        part = int_mm_long(g_rows[n0 * p : (n0 + nn) * p].t(), _cols_position_major(x, geo, n0, nn))
        dw = part.contiguous() if dw is None else dw.add_(part)
    return dw[:, : geo.kg].reshape(weight_shape).contiguous()


def linear_forward(xq, wq) -> torch.Tensor:
    return int_mm(xq, wq.t())


def linear_input_grad(gq, wq) -> torch.Tensor:
    return int_mm(gq, wq)


def linear_weight_grad(xq, gq) -> torch.Tensor:
    return int_mm_long(gq.t(), xq)
