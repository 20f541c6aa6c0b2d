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
    x = x.detach()
    if axis is None:
        lo, hi = torch.aminmax(_memory_order(x)[0])  # one pass, no |x| temporary (2x vs abs().amax())
        return torch.maximum(-lo, hi).float()
    axis = axis % x.dim()
    if x.dim() == 1:
        return x.abs().float()
    x, order = _memory_order(x)
    dims = [d for d in range(x.dim()) if order[d] != axis]
    if x.dtype != torch.float32:
        return x.abs().amax(dim=dims).float()
    # max(amax, -amin): two passes but no |x| temporary of x's size (fresh pages: 13x slower on a
    # 32x256x56x56 gradient, measured); "+ 0.0" turns the -0.0 of an all-zero slice into abs()'s +0.0
    return torch.maximum(x.amax(dim=dims), x.amin(dim=dims).neg_()).add_(0.0)


def _memory_order(x: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """x permuted into memory order (a view, contiguous if x is dense, e.g. channels-last), and the order.

    The same maxima, but torch reduces a contiguous tensor far faster: aminmax of a channels-last
    32x64x56x56 tensor took 26 ms, of its memory-order view 0.8 ms (measured).
    """
    order = sorted(range(x.dim()), key=lambda d: (-x.stride(d), -x.shape[d]))
    return x.permute(order), order


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
    x = x.detach().float()
    out = torch.empty_like(x, dtype=torch.int8)  # x's memory layout, as the old x * inv would have
    if x.dim() == 0 or x.numel() == 0:
        _quantize_block(x, inv, rounding, generator, out)
        return out
    # Blocks of whole slices along dim 0, each about _BLOCK elements: the 4-6 elementwise passes below
    # then run on cache-resident data instead of streaming the tensor through memory each time
    # (measured 2-4x on 56x56 activations). Dim 0 is outermost in torch.rand's order, so block i gets
    # exactly the i-th stretch of the noise torch.rand(x.shape) would give: same codes, same stream.
    rows = max(1, _BLOCK // max(1, x[0].numel()))
    per_row = axis is not None and axis % x.dim() == 0 and inv.dim() > 0
    for r0 in range(0, x.shape[0], rows):
        r1 = min(x.shape[0], r0 + rows)
        _quantize_block(x[r0:r1], inv[r0:r1] if per_row else inv, rounding, generator, out[r0:r1])
    return out


# elements per block of quantize(): 2 x 512 KB of fp32 values and noise fit in a 1-2 MB L2 cache
_BLOCK = 1 << 17


def _quantize_block(x, inv, rounding: str, generator, out) -> None:
    v = (x * inv).clamp_(-QMAX, QMAX)
    if rounding == "nearest":
        v = v.round_()
    else:
        # floor(v + u), u ~ U[0, 1): equals floor(v) + Bernoulli(v - floor(v)), so E[q] = v.
        noise = torch.rand(v.shape, generator=generator, device=v.device, dtype=v.dtype)
        v = v.add_(noise).floor_().clamp_(-QMAX, QMAX)
    out.copy_(v)


def float_inplace(acc: torch.Tensor) -> torch.Tensor:
    """acc.float() for an int32 accumulator the caller owns, converted in its own storage (int32 and fp32
    slots are both 4 bytes): no second buffer of the output's size, whose fresh pages cost more than the
    conversion itself (8x, measured on a 32x256x56x56 output). acc must not be used afterwards."""
    if acc.dtype != torch.int32 or not _memory_order(acc)[0].is_contiguous():
        return acc.float()
    return acc.view(torch.float32).copy_(acc)


def dequantize(q: torch.Tensor, scale: torch.Tensor | float, axis: int | None = None) -> torch.Tensor:
    s = _broadcast(scale, q, axis)
    return q.float() * (s / QMAX)
