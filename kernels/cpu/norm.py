"""BatchNorm in training with its activation folded in, fused with what the int8 layers around it read
(kernels/cpu/csrc/norm.cpp): the forward pass writes y and y's nearest int8 codes, with s = max|y| found
from the per-channel min and max of x before y exists; the backward pass writes gx with its per-channel
max|gx| and moments. Both are kept in kernels.cpu.known for the quantizer that reads the tensor next.

    y  = clamp((x - mean) * invstd * w + b, lo, hi)       lo, hi: ReLU (0, inf), ReLU6 (0, 6), none
    gx = invstd w (g' - mean(g') - xhat mean(g' xhat)),   g' = g where lo < y < hi (strictly)

With a residual r (a ResNet block's last BatchNorm, the sum with its shortcut and the ReLU after it), y =
clamp(BatchNorm(x) + r, lo, hi), rounded as torch rounds the BatchNorm's output and the sum; then only y's
scale is kept (y is not monotone in x, so max|y| comes with y and the quantizer writes the codes), with the
activation's mask lo < y < hi of the stored y as bits (Saved.mask), and the backward pass masks g by them
and returns g' as r's gradient too. The bits, not y, are what the backward pass keeps: 1/32 of a float32
y's bytes to read, and y is freed once the layers after it are done with it.

mean and the biased variance are the batch's, per channel, summed in double. Float32 or bfloat16 tensors
(under bf16 autocast the int8 convolutions return bfloat16) with channels innermost in memory only
(channels-last: what the int8 convolutions return); `supported` says which. The arithmetic is float32's; a
bfloat16 y or gx holds its values rounded to nearest even, and its codes, scale, statistics and the
activation's mask are those of the rounded values, as torch's bfloat16 BatchNorm and ReLU would give them
to the next layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import NonFiniteError
from . import known, runtime
from .memory import cl_row_stride
from .runtime import pointer

DTYPES = (torch.float32, torch.bfloat16)


def supported(x: torch.Tensor) -> bool:
    """Whether the fused kernels take x: float32 or bfloat16 on the CPU, channels innermost and dense, more
    than one value per channel, and the native library built."""
    if x.device.type != "cpu" or x.dtype not in DTYPES or x.dim() < 2:
        return False
    if x.numel() <= x.shape[1] or x.stride(1) != 1:
        return False
    # read from the strides: movedim + view would cost two of the tens of dispatches that make a fused
    # BatchNorm's fixed cost (docs/measurements.md)
    return cl_row_stride(x) == x.shape[1] and runtime.library() is not None


def _channel_vector(t: torch.Tensor | None) -> torch.Tensor | None:
    """t as the contiguous float32 vector the native code reads (t itself where it is one)."""
    if t is None or (t.dtype == torch.float32 and t.is_contiguous()):
        return t
    return t.detach().to(torch.float32).contiguous()


@dataclass
class Saved:
    """What the backward pass needs of the forward pass, per channel: float32 mean and the coefficients
    of y = clamp(x a + b, lo, hi), float64 invstd; with a residual, y's activation mask (uint8, a bit an
    element, each row of C channels in (C + 7) // 8 bytes)."""

    mean: torch.Tensor
    invstd: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    lo: float
    hi: float
    mask: torch.Tensor | None = None


def forward(
    x, weight, bias, eps: float, lo: float, hi: float, running=None, momentum: float = 0.0, residual=None
):
    """(y, biased variance per channel (float64), Saved). y is laid out as x; its codes and scale are kept
    (kernels.cpu.known), or its scale alone with a `residual` (of x's dtype and strides:
    `residual_supported`). `running`: (running_mean, running_var), contiguous float32, moved towards the
    batch's statistics with `momentum` as torch's BatchNorm moves them. Raises NonFiniteError on a NaN or
    an Inf in x, the residual or y's scale (the running statistics unchanged then)."""
    c = x.shape[1]
    n = x.numel() // c
    y = torch.empty_like(x)  # x's strides: its (rows, C) layout
    q = None if residual is not None else torch.empty_like(x, dtype=torch.int8)
    mask = None if residual is None else torch.empty((n, (c + 7) // 8), dtype=torch.uint8)
    mean, a, b, scale = torch.empty(c), torch.empty(c), torch.empty(c), torch.empty(())
    invstd, var = torch.empty(c, dtype=torch.float64), torch.empty(c, dtype=torch.float64)
    w, bb = _channel_vector(weight), _channel_vector(bias)  # held while the native call reads them
    rm, rv = running if running is not None else (None, None)
    bad = runtime.library().rq_norm_forward(
        pointer(x), pointer(residual), pointer(y), pointer(q), pointer(mask), n, c, pointer(w), pointer(bb),
        eps, lo, hi, pointer(mean), pointer(invstd), pointer(var), pointer(a), pointer(b), pointer(scale),
        pointer(rm), pointer(rv), momentum, int(x.dtype == torch.bfloat16),
    )  # fmt: skip
    if bad:
        raise NonFiniteError(f"non-finite values in BatchNorm's input or output of shape {tuple(x.shape)}")
    known.remember(y, known.Facts(scale=scale, codes=q))
    return y, var, Saved(mean, invstd, a, b, lo, hi, mask)


def residual_supported(x: torch.Tensor, residual: torch.Tensor) -> bool:
    """Whether forward takes this residual with x (already `supported`): laid out and typed as x."""
    return residual.dtype == x.dtype and residual.shape == x.shape and residual.stride() == x.stride()


def backward(g: torch.Tensor, x: torch.Tensor, weight, saved: Saved):
    """(gx, grad of the weight, grad of the bias); gx of x's dtype and layout, its per-channel max|gx|,
    moments and standard deviation kept (kernels.cpu.known) unless gx has a NaN or an Inf (the quantizer
    then raises on it)."""
    return _backward(g, x, weight, saved, None)[:3]


def residual_backward(g: torch.Tensor, x: torch.Tensor, weight, saved: Saved):
    """backward's (gx, grad of the weight, grad of the bias) and the residual's gradient, where forward took
    a residual (its Saved holds the output's mask)."""
    if saved.mask is None:
        raise ValueError("residual_backward needs the Saved of a forward pass with a residual")
    return _backward(g, x, weight, saved, saved.mask)


def _backward(g, x, weight, saved, mask):
    c = x.shape[1]
    n = x.numel() // c
    if g.dtype != x.dtype or g.stride() != x.stride():
        g = torch.empty_like(x).copy_(g)  # x's layout (an upstream op may hand a gradient in another)
    gx, gw, gb = torch.empty_like(x), torch.empty(c), torch.empty(c)  # of their own: autograd keeps gw, gb
    gr = None if mask is None else torch.empty_like(x)
    gmax, sd = torch.empty(c), torch.empty(c)
    m1, m2 = torch.empty(c, dtype=torch.float64), torch.empty(c, dtype=torch.float64)
    s, w = saved, _channel_vector(weight)  # held while the native call reads it
    bad = runtime.library().rq_norm_backward(
        pointer(g), pointer(mask), pointer(x), pointer(gr), pointer(gx), n, c, pointer(w),
        pointer(s.a), pointer(s.b), s.lo, s.hi, pointer(s.mean), pointer(s.invstd),
        pointer(gw), pointer(gb), pointer(gmax), pointer(m1), pointer(m2), pointer(sd),
        int(x.dtype == torch.bfloat16),
    )  # fmt: skip
    if not bad:
        known.remember(gx, known.Facts(channel_max=gmax, channel_sums=(m1, m2), channel_std=sd))
    return gx, gw, gb, gr
