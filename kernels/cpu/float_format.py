"""Rounding float32 tensors to a narrower floating-point format in one native pass (csrc/float_format.cpp),
for the simulated FP8 / FP16 training of repro.methods.fp8, whose torch expression it reproduces bit for
bit. Why native: that expression is a dozen passes over memory with five temporaries (bit arithmetic, the
subnormal grid, the clamp), the largest share of an FP8 step after the products (docs/methods.md)."""

from __future__ import annotations

import torch

from .runtime import library, pointer


def available() -> bool:
    return library() is not None


def round_float_format(
    x: torch.Tensor,
    man_bits: int,
    emin: int,
    max_value: float,
    noise: torch.Tensor | None = None,
    small: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """x (contiguous float32 on the CPU) on the grid of the format: nearest (noise None), or stochastic with
    `noise` (int32, x's shape: added to the bits below the kept mantissa); saturated at +-max_value. With
    `small`, also the mask of |x| < 2^emin and its count (the subnormal range, which stochastic rounding
    leaves to the caller)."""
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError("round_float_format takes a contiguous float32 CPU tensor")
    if noise is not None and (
        noise.dtype != torch.int32 or noise.shape != x.shape or not noise.is_contiguous()
    ):
        raise ValueError("round_float_format: noise must be a contiguous int32 tensor of x's shape")
    out = torch.empty_like(x)
    mask = torch.empty(x.shape, dtype=torch.bool) if small else None
    count = library().rq_round_float_format(
        pointer(x), pointer(out), x.numel(), man_bits, emin, max_value, pointer(noise), pointer(mask)
    )
    return out, mask, int(count)
