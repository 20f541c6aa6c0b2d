"""Low-precision floating-point formats, simulated in float32: FP8 (1-5-2) and FP16 (1-6-9) of Wang et al.

Wang et al., "Training Deep Neural Networks with 8-bit Floating Point Numbers", NeurIPS 2018: data
(weights, activations, errors, weight gradients) in FP8 with 1 sign, 5 exponent and 2 mantissa bits;
accumulations and weight updates in FP16 with 1 sign, 6 exponent and 9 mantissa bits.

`round_to(x, fmt)` returns the float32 tensor of the values of `fmt` nearest to x (round half to even),
or with stochastic rounding an unbiased choice between the two neighbours. Both keep subnormals (the
grid below 2^emin has the spacing of the lowest binade) and saturate at +-max instead of producing Inf.
The exponent bias is 2^(e-1) - 1 and the top exponent code is kept for Inf/NaN as in IEEE 754 (so 1-5-2
is the E5M2 grid: max 57344, smallest subnormal 2^-16); the paper does not spell out its special values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import kernels
from kernels.cpu import float_format
from repro.quant import ROUNDINGS, check_finite


@dataclass(frozen=True)
class FloatFormat:
    name: str
    exp_bits: int
    man_bits: int

    @property
    def bias(self) -> int:
        return 2 ** (self.exp_bits - 1) - 1

    @property
    def emax(self) -> int:
        return 2**self.exp_bits - 2 - self.bias  # the all-ones exponent is Inf/NaN (IEEE 754)

    @property
    def emin(self) -> int:
        return 1 - self.bias

    @property
    def max(self) -> float:
        return (2.0 - 2.0**-self.man_bits) * 2.0**self.emax

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.emin - self.man_bits)


FP8 = FloatFormat("FP8 (1-5-2)", 5, 2)  # Wang et al. sec. 3: W, A, E, G
FP16 = FloatFormat("FP16 (1-6-9)", 6, 9)  # Wang et al. sec. 3: accumulation and weight update


# Elements rounded at a time: each step below is a pass over memory, and a chunk's temporaries stay in the
# cache where a whole weight gradient's (AlexNet's 4096x9216) would go out to DRAM in every one of them.
CHUNK = 1 << 20


def round_to(
    x: torch.Tensor, fmt: FloatFormat, rounding: str = "nearest", generator: torch.Generator | None = None
) -> torch.Tensor:
    """x rounded to the grid of `fmt` (float32); raises NonFiniteError on NaN/Inf input."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; choose one of {', '.join(ROUNDINGS)}")
    check_finite(x, f"the {fmt.name} rounding's input")
    x = x.detach().float().contiguous()
    drop = 23 - fmt.man_bits
    # stochastic: U{0 .. 2^drop - 1} added to the bits, then truncated (the upper neighbour with probability
    # = the fraction); the noise drawn for the whole tensor in one call, so the stream is one per tensor
    noise = None
    if rounding == "stochastic":
        noise = torch.randint(0, 1 << drop, x.shape, generator=generator, dtype=torch.int32)
    small = None  # stochastic: the elements below 2^emin, rounded after the rest
    # the same bits in one native pass; under torch.compile the torch expression, which inductor fuses
    if x.device.type == "cpu" and not kernels.compiling() and float_format.available():
        out, small, count = float_format.round_float_format(
            x, fmt.man_bits, fmt.emin, fmt.max, noise, small=noise is not None
        )
        if not count:
            return out
    elif x.numel() <= 4 * CHUNK or (fmt == FP8 and noise is None):  # the float8 cast: one pass, no chunks
        out = _round(x, fmt, noise)
        if noise is not None:
            small = x.abs() < 2.0**fmt.emin
    else:
        out = torch.empty_like(x)
        flat, flat_out = x.view(-1), out.view(-1)
        flat_noise = None if noise is None else noise.view(-1)
        small = None if noise is None else torch.empty(x.shape, dtype=torch.bool)
        for start in range(0, flat.numel(), CHUNK):
            part = slice(start, start + CHUNK)
            flat_out[part] = _round(flat[part], fmt, None if flat_noise is None else flat_noise[part])
            if small is not None:
                torch.lt(flat[part].abs(), 2.0**fmt.emin, out=small.view(-1)[part])
    if small is not None and bool(small.any()):
        # Below 2^emin the spacing stays that of the lowest binade (subnormals): round on that fixed grid;
        # the noise drawn for the small elements only, after the bits' noise, as it always was
        ulp = fmt.min_subnormal
        where = small.view(-1).nonzero().squeeze(1)  # found once for the read and the write
        v = x.view(-1)[where] / ulp
        v = v.add_(torch.rand(v.shape, generator=generator)).floor_()  # float32, as x
        out.view(-1)[where] = v * ulp
    return out


def _round(x: torch.Tensor, fmt: FloatFormat, noise: torch.Tensor | None) -> torch.Tensor:
    """x (contiguous float32) on the grid of `fmt`, saturated at +-max: nearest (noise None), or the
    normal range's stochastic rounding with `noise` (the subnormal range is round_to's)."""
    if fmt == FP8 and noise is None:
        # torch's float8_e5m2 is this grid (subnormals, nearest even; beyond max it gives Inf, clamped below):
        # the arithmetic below gives the same bits for every finite float32 (docs/methods.md), in 3 passes
        return x.to(torch.float8_e5m2).float().clamp_(-fmt.max, fmt.max)
    # Normal range: round the float32 bit pattern to `man_bits` mantissa bits (sign-magnitude, so the
    # same integer arithmetic serves both signs; a carry moves into the exponent, the next binade).
    drop = 23 - fmt.man_bits
    bits = x.view(torch.int32)
    if noise is None:  # half to even, as IEEE 754's default
        rounded = (bits >> drop).bitwise_and_(1).add_((1 << (drop - 1)) - 1).add_(bits)
    else:
        rounded = noise.add_(bits)  # noise is round_to's own: its buffer takes the sum
    out = rounded.bitwise_and_(-(1 << drop)).view(torch.float32)
    if noise is None:
        # Below 2^emin the spacing stays that of the lowest binade (subnormals): round on that fixed grid,
        # over the whole chunk and selected: indexing the small elements out and back (every zero a ReLU
        # leaves is one) cost more than the rest of the rounding on activations (docs/methods.md)
        ulp = fmt.min_subnormal
        out = torch.where(x.abs() < 2.0**fmt.emin, (x / ulp).round_().mul_(ulp), out)  # x / ulp: exact
    return out.clamp_(-fmt.max, fmt.max)
