"""BatchNorm in training with its activation folded in, fused with what the int8 layers around it read
(kernels/cpu/csrc/norm.cpp): the forward pass writes y and y's nearest int8 codes, with s = max|y| found
from the per-channel min and max of x before y exists; the backward pass writes gx with its per-channel
max|gx| and moments. Both are kept in kernels.cpu.known for the quantizer that reads the tensor next.

    y  = clamp((x - mean) * invstd * w + b, lo, hi)       lo, hi: ReLU (0, inf), ReLU6 (0, 6), none
    gx = invstd w (g' - mean(g') - xhat mean(g' xhat)),   g' = g where lo < y < hi (strictly)

mean and the biased variance are the batch's, per channel, summed in double. Float32 tensors with channels
innermost in memory only (channels-last: what the int8 convolutions return); `supported` says which.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import NonFiniteError
from . import known, runtime
from .runtime import pointer


def supported(x: torch.Tensor) -> bool:
    """Whether the fused kernels take x: float32 on the CPU, channels innermost and dense, more than one
    value per channel, and the native library built."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() < 2:
        return False
    if x.numel() <= x.shape[1] or x.stride(1) != 1:
        return False
    return _rows(x) is not None and runtime.library() is not None


def _rows(x: torch.Tensor) -> torch.Tensor | None:
    """x as a (rows, C) view whose rows are contiguous, or None where its memory is not laid out so."""
    t = x.movedim(1, -1)
    return t.view(-1, x.shape[1]) if t.is_contiguous() else None


@dataclass
class Saved:
    """What the backward pass needs of the forward pass, per channel: float32 mean and the coefficients
    of y = clamp(x a + b), float64 invstd."""

    mean: torch.Tensor
    invstd: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    lo: float
    hi: float


def forward(x, weight, bias, eps: float, lo: float, hi: float):
    """(y, biased variance per channel (float64), Saved). y is laid out as x; its codes and scale are kept
    (kernels.cpu.known). Raises NonFiniteError on a NaN or an Inf in x or in y's scale."""
    lib = runtime.library()
    x = x.detach()
    rows = _rows(x)
    n, c = rows.shape
    shift = rows[0].clone()  # sums of x - shift: no cancellation in E[d^2] - E[d]^2 where |mean| >> std
    s1, s2 = torch.empty(c, dtype=torch.float64), torch.empty(c, dtype=torch.float64)
    mn, mx = torch.empty(c), torch.empty(c)
    if lib.rq_norm_stats(
        pointer(rows), n, c, pointer(shift), pointer(s1), pointer(s2), pointer(mn), pointer(mx)
    ):
        raise NonFiniteError(f"non-finite values in BatchNorm's input of shape {tuple(x.shape)}")
    d = s1 / n
    var = (s2 / n - d * d).clamp_min_(0.0)
    mean = shift.double() + d
    invstd = (var + eps).rsqrt_()
    a = invstd if weight is None else invstd * weight.detach().double()
    b = -mean * a if bias is None else bias.detach().double() - mean * a
    a, b = a.float(), b.float()
    s = lib.rq_norm_output_absmax(pointer(mn), pointer(mx), c, pointer(a), pointer(b), lo, hi)
    if not math.isfinite(s):
        raise NonFiniteError(f"non-finite values in BatchNorm's output of shape {tuple(x.shape)}")
    y = torch.empty_like(x)
    q = torch.empty_like(x, dtype=torch.int8)
    lib.rq_norm_apply(
        pointer(rows), pointer(_rows(y)), pointer(_rows(q)), n, c, pointer(a), pointer(b), lo, hi, s
    )
    known.remember(y, known.Facts(scale=torch.tensor(s), codes=q))
    return y, var, Saved(mean.float(), invstd, a, b, lo, hi)


def backward(g: torch.Tensor, x: torch.Tensor, weight, saved: Saved):
    """(gx, grad of the weight, grad of the bias), float32; gx laid out as x, its per-channel max|gx| and
    moments kept (kernels.cpu.known) unless gx has a NaN or an Inf (the quantizer then raises on it)."""
    lib = runtime.library()
    x = x.detach()
    rows = _rows(x)
    n, c = rows.shape
    g = g.detach()
    if g.dtype != torch.float32 or g.stride() != x.stride():
        g = torch.empty_like(x).copy_(g)  # x's layout (an upstream op may hand a gradient in another)
    sg, sgx = torch.empty(c, dtype=torch.float64), torch.empty(c, dtype=torch.float64)
    lo, hi = saved.lo, saved.hi
    args = (pointer(saved.a), pointer(saved.b), lo, hi, pointer(saved.mean))
    lib.rq_norm_grad_sums(pointer(_rows(g)), pointer(rows), n, c, *args, pointer(sg), pointer(sgx))
    k = saved.invstd if weight is None else saved.invstd * weight.detach().double()
    c1 = k.float()
    c2 = (-k * saved.invstd * saved.invstd * sgx / n).float()
    c3 = (-k * sg / n).float()
    gx = torch.empty_like(x)
    gmax = torch.empty(c)
    m1, m2 = torch.empty(c, dtype=torch.float64), torch.empty(c, dtype=torch.float64)
    coefficients = (pointer(c1), pointer(c2), pointer(c3))
    out = (pointer(_rows(gx)), n, c)
    bad = lib.rq_norm_grad_apply(pointer(_rows(g)), pointer(rows), *out, *args, *coefficients, pointer(gmax),
                                 pointer(m1), pointer(m2))  # fmt: skip
    if not bad:
        known.remember(gx, known.Facts(channel_max=gmax, channel_sums=(m1, m2)))
    return gx, (sgx * saved.invstd).float(), sg.float()
