"""Exact INT8 reference kernels: the oracle the fast backends are tested against.

Every function takes int8 operands (values in [-127, 127]), computes in int64 with an explicit im2col
(zero padding + ``Tensor.unfold`` per spatial dimension, N-D generic) and returns int32. No float
convolution is used anywhere: the forward pass and the weight gradient are int64 matmuls over the
im2col columns, the input gradient is the exact adjoint (int64 columns scattered back with
``index_add_``, i.e. col2im).

Semantics follow ``torch.nn.functional.conv{1,2,3}d`` (zero padding, stride, dilation, groups) and
``torch.nn.grad.conv{1,2,3}d_input`` / ``conv{1,2,3}d_weight``; the rank of ``x`` (N, Cin, *spatial)
selects 1-, 2- or 3-D.

int32 contract: the sums are exact in int64 and are returned as int32. The cast is exact whenever the
exact sum fits in int32, which is guaranteed when the reduction length K (Cin/groups * prod(kernel)
for the forward pass, Cout/groups * prod(kernel) for the input gradient, N * prod(output spatial)
for the weight gradient, K of a linear layer) satisfies K < 2^31 / 127^2 = 133,144. Results that do
not fit raise ``OverflowError`` here rather than wrapping silently.

Clear code over speed; meant for tests and small shapes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.geometry import check_grad_output, conv_geometry

__all__ = [
    "conv_forward",
    "conv_input_grad",
    "conv_weight_grad",
    "linear_forward",
    "linear_input_grad",
    "linear_weight_grad",
]

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def _check_int8(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.int8:
            raise TypeError(f"expected an int8 tensor, got {t.dtype}")


def _to_int32(t: torch.Tensor) -> torch.Tensor:
    if t.numel() and (int(t.min()) < _I32_MIN or int(t.max()) > _I32_MAX):
        raise OverflowError("exact result does not fit in int32 (reduction too long for the int32 contract)")
    return t.to(torch.int32)


def _im2col(x: torch.Tensor, k, s, p, d) -> torch.Tensor:
    """x (N, C, *L) int64 -> a view (N, C, *out, *k) with v[n, c, o.., j..] = xpad[n, c, o*s + j*d]."""
    nd = len(k)
    pads = []
    for i in reversed(range(nd)):  # F.pad lists the last dimension first
        pads += [p[i], p[i]]
    cols = F.pad(x, pads)
    for i in range(nd):
        extent = d[i] * (k[i] - 1) + 1
        # unfold appends the window as the last dimension; keep every d-th element of it
        cols = cols.unfold(2 + i, extent, s[i])
        cols = cols[..., :: d[i]]
    return cols


def conv_forward(xq, wq, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """y = conv(x, w) exactly (torch.nn.functional.conv{1,2,3}d semantics), int32 (N, Cout, *out)."""
    _check_int8(xq, wq)
    nd, s, p, d, k, out = conv_geometry(xq.shape, wq.shape, stride, padding, dilation, groups)
    n, cin = xq.shape[:2]
    cout = wq.shape[0]
    g = groups
    cols = _im2col(xq.to(torch.int64), k, s, p, d)  # (N, Cin, *out, *k)
    # (N, G, Cin/G, *out, *k) -> (N, G, P, Cin/G * prod(k))
    cols = cols.reshape(n, g, cin // g, math.prod(out), math.prod(k))
    cols = cols.permute(0, 1, 3, 2, 4).reshape(n, g, math.prod(out), -1)
    w = wq.to(torch.int64).reshape(g, cout // g, -1)  # (G, Cout/G, Cin/G * prod(k))
    y = torch.matmul(cols, w.transpose(1, 2))  # (N, G, P, Cout/G)
    y = y.permute(0, 1, 3, 2).reshape(n, cout, *out)
    return _to_int32(y)


def conv_input_grad(gq, wq, input_shape, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """dL/dx for dL/dy = g (torch.nn.grad.conv{N}d_input), int32 of shape input_shape.

    The adjoint of conv_forward: the column gradient (g times w) is scattered back onto the padded
    input positions each column element was read from (col2im), in int64.
    """
    _check_int8(gq, wq)
    input_shape = tuple(int(a) for a in input_shape)
    nd, s, p, d, k, out = conv_geometry(input_shape, wq.shape, stride, padding, dilation, groups)
    n, cin = input_shape[:2]
    cout = wq.shape[0]
    g = groups
    check_grad_output(gq.shape, (n, cout, *out))
    npos, nk = math.prod(out), math.prod(k)
    gg = gq.to(torch.int64).reshape(n, g, cout // g, npos).transpose(2, 3)  # (N, G, P, Cout/G)
    w = wq.to(torch.int64).reshape(g, cout // g, -1)  # (G, Cout/G, Cin/G * prod(k))
    dcols = torch.matmul(gg, w)  # (N, G, P, Cin/G * prod(k))
    dcols = dcols.reshape(n, g, npos, cin // g, nk).permute(0, 1, 3, 2, 4).reshape(n, cin, npos * nk)

    # flat index into the padded input of every (output position, kernel offset) pair
    padded = [input_shape[2 + i] + 2 * p[i] for i in range(nd)]
    index = torch.zeros((npos, nk), dtype=torch.int64)
    o_grids = torch.meshgrid(*[torch.arange(o) for o in out], indexing="ij")
    k_grids = torch.meshgrid(*[torch.arange(a) for a in k], indexing="ij")
    for i in range(nd):
        pos = o_grids[i].reshape(-1, 1) * s[i] + k_grids[i].reshape(1, -1) * d[i]  # (P, prod(k))
        index = index * padded[i] + pos
    dx = torch.zeros((n, cin, math.prod(padded)), dtype=torch.int64)
    dx.index_add_(2, index.reshape(-1), dcols)
    dx = dx.reshape(n, cin, *padded)
    crop = (slice(None), slice(None)) + tuple(slice(p[i], p[i] + input_shape[2 + i]) for i in range(nd))
    return _to_int32(dx[crop])


def conv_weight_grad(xq, gq, weight_shape, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """dL/dw for dL/dy = g (torch.nn.grad.conv{N}d_weight), int32 of shape weight_shape."""
    _check_int8(xq, gq)
    weight_shape = tuple(int(a) for a in weight_shape)
    nd, s, p, d, k, out = conv_geometry(xq.shape, weight_shape, stride, padding, dilation, groups)
    n, cin = xq.shape[:2]
    cout = weight_shape[0]
    g = groups
    check_grad_output(gq.shape, (n, cout, *out))
    npos = math.prod(out)
    cols = _im2col(xq.to(torch.int64), k, s, p, d)
    cols = cols.reshape(n, g, cin // g, npos, math.prod(k)).permute(0, 1, 3, 2, 4).reshape(n, g, npos, -1)
    gg = gq.to(torch.int64).reshape(n, g, cout // g, npos)
    dw = torch.einsum("ngop,ngpr->gor", gg, cols)  # sum over batch and output positions
    return _to_int32(dw.reshape(weight_shape))


def _check_linear(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    _check_int8(a, b)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{what}: expected 2-D operands, got {tuple(a.shape)} and {tuple(b.shape)}")


def linear_forward(xq, wq) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T -> (M, N) int32."""
    _check_linear(xq, wq, "linear_forward")
    return _to_int32(xq.to(torch.int64) @ wq.to(torch.int64).t())


def linear_input_grad(gq, wq) -> torch.Tensor:
    """g (M, N) @ w (N, K) -> (M, K) int32."""
    _check_linear(gq, wq, "linear_input_grad")
    return _to_int32(gq.to(torch.int64) @ wq.to(torch.int64))


def linear_weight_grad(xq, gq) -> torch.Tensor:
    """g^T (N, M) @ x (M, K) -> (N, K) int32."""
    _check_linear(xq, gq, "linear_weight_grad")
    return _to_int32(gq.to(torch.int64).t() @ xq.to(torch.int64))
