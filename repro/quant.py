"""Symmetric INT8 quantizer shared by every method (UI8 eq. 1-3, DAIQ eq. 1-2; METHODS.md).

    q(x; s) = round(127 * clamp(x, -s, s) / s)    int8 in [-127, 127]
    x_hat   = q * s / 127

`scale` is the clipping value s itself (not s / 127). Per-channel scales are 1-D tensors laid along
`axis`. A scale of 0 (an all-zero channel) quantizes to 0 instead of dividing by zero.
"""

from __future__ import annotations

import torch

QMAX = 127
ROUNDINGS = ("nearest", "stochastic")


class NonFiniteError(FloatingPointError):
    """A NaN or Inf reached a quantizer: the run has diverged (UI8 Table 3 reports such a NaN)."""


def check_finite(x: torch.Tensor, what: str = "tensor") -> None:
    # One reduction instead of isfinite(x).all() (5x cheaper, measured): NaN and +-Inf propagate
    # through a sum. A finite tensor whose sum overflows fp32 (elements ~1e34) also counts as diverged.
    if not bool(torch.isfinite(x.detach().sum())):
        raise NonFiniteError(f"non-finite values in {what} of shape {tuple(x.shape)}")


def _broadcast(scale: torch.Tensor | float, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    scale = torch.as_tensor(scale, dtype=torch.float32, device=x.device)
    if axis is None:
        if scale.numel() != 1:
            raise ValueError(f"per-tensor quantization needs one scale, got shape {tuple(scale.shape)}")
        return scale.reshape(())
    axis = axis % x.dim()
    if scale.shape != (x.shape[axis],):
        raise ValueError(f"per-channel scale must have shape ({x.shape[axis]},), got {tuple(scale.shape)}")
    shape = [1] * x.dim()
    shape[axis] = -1
    return scale.reshape(shape)


def absmax(x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """max|x| over the whole tensor (a 0-d tensor) or per slice along `axis` (a 1-D tensor)."""
    if axis is None:
        lo, hi = torch.aminmax(x.detach())  # one pass, no |x| temporary (2x faster than abs().amax())
        return torch.maximum(-lo, hi).float()
    axis = axis % x.dim()
    dims = [d for d in range(x.dim()) if d != axis]
    return x.detach().abs().amax(dim=dims).float() if dims else x.detach().abs().float()


def quantize(
    x: torch.Tensor,
    scale: torch.Tensor | float,
    axis: int | None = None,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """int8 codes of x clipped to [-scale, scale]; raises NonFiniteError on NaN/Inf input."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; choose one of {', '.join(ROUNDINGS)}")
    check_finite(x, "the quantizer's input")
    s = _broadcast(scale, x, axis)
    check_finite(s, "the quantizer's scale")
    inv = torch.where(s > 0, QMAX / s.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(s))
    v = (x.detach().float() * inv).clamp_(-QMAX, QMAX)
    if rounding == "nearest":
        v = v.round_()
    else:
        # floor(v + u), u ~ U[0, 1): equals floor(v) + Bernoulli(v - floor(v)), so E[q] = v.
        noise = torch.rand(v.shape, generator=generator, device=v.device, dtype=v.dtype)
        v = v.add_(noise).floor_().clamp_(-QMAX, QMAX)
    return v.to(torch.int8)


def dequantize(q: torch.Tensor, scale: torch.Tensor | float, axis: int | None = None) -> torch.Tensor:
    s = _broadcast(scale, q, axis)
    return q.float() * (s / QMAX)
