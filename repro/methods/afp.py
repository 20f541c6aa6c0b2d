"""afp: Adaptive Precision Fixed-point training (Zhang et al., CVPR 2020, "Fixed-Point Back-Propagation
Training"; arXiv 1911.00361 "Adaptive Precision Training"). Simulated.

Each quantized layer keeps one fixed-point quantizer for W, one for A (its input) and one for G (the
error at its output; one quantized G feeds GX and GW), each with its own bit width n and shift s:
    x_hat = clamp(round(x / 2^s), -(2^(n-1) - 1), 2^(n-1) - 1) * 2^s
    s     = ceil(log2(max|x| / (2^(n-1) - 1)))                    set when the quantizer is updated
Layer-wise precision adaptation (the paper's quantization-error rule), at each update:
    diff_bit = log2(|mean|x| - mean|x_hat|| / mean|x| + 1)
    while diff_bit > T and n < max_bits: n += 8, re-quantize
Adaptive update interval (the paper's rule from the drift of the shift): with M a moving average of s,
    M <- alpha s + (1 - alpha) M,   delta = max(alpha |s - M|, delta2 diff_bit^2),
    I = clamp(round(beta / delta - gamma), 1, max_interval)
and (n, s) are kept for the next I uses. W and A start at 8 bits, G at 8 bits; rounding to nearest.
What the paper leaves for us, stated: the constants T = 0.03, alpha = 0.04, beta = 0.1, gamma = 2,
delta2 = 100 and the +8-bit step come from a public third-party re-implementation, not from the authors'
code (which is not public); M starts at the first s (our choice); the interval is capped at
`max_interval` (100, our choice); bit widths only grow; max_bits 16 because AFP targets int8/int16 units
(DAIQ: 77.5% of AFP's products are INT16).
Simulated: the products run in float on the dequantized fixed-point values (int16 operands have no int8
product), so accumulation is float32, not exact integer; first and last layers stay float.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from repro.methods import register
from repro.methods.base import LayerQuantizer, Method
from repro.quant import check_finite
from repro.ste import grad_quant, ste


def fixed_point(x: torch.Tensor, bits: int, shift: int) -> torch.Tensor:
    """x on the signed `bits`-bit grid with step 2^shift (symmetric, saturating)."""
    top = 2 ** (bits - 1) - 1
    step = 2.0**shift
    return torch.round(x.detach().float() / step).clamp_(-top, top) * step


def best_shift(x: torch.Tensor, bits: int) -> int:
    """The smallest s with max|x| <= (2^(bits-1) - 1) 2^s."""
    top = float(x.detach().abs().max())
    if top == 0.0:
        return -126
    return math.ceil(math.log2(top / (2 ** (bits - 1) - 1)))


def diff_bit(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """log2(|mean|x| - mean|x_hat|| / mean|x| + 1), the quantization-error metric."""
    mean = float(x.detach().abs().float().mean())
    if mean == 0.0:
        return 0.0
    return math.log2(abs(mean - float(x_hat.abs().mean())) / mean + 1.0)


class AdaptiveFixedPoint:
    """One tensor's quantizer: bit width, shift, moving average of the shift and the update schedule."""

    def __init__(self, opts: dict[str, Any], bits: int):
        self.opts = opts
        self.bits = bits
        self.shift: int | None = None
        self.mean_shift: float | None = None
        self.uses = 0
        self.next_update = 0
        self.last_diff = 0.0
        self.updates = 0

    def adapt(self, x: torch.Tensor) -> None:
        o = self.opts
        while True:
            self.shift = best_shift(x, self.bits)
            d = diff_bit(x, fixed_point(x, self.bits, self.shift))
            if d > o["threshold"] and self.bits < o["max_bits"]:
                self.bits = min(self.bits + 8, o["max_bits"])
                if self.mean_shift is not None:
                    self.mean_shift -= 8  # 8 more bits move the shift down by 8: keep M comparable
                continue
            break
        a = o["alpha"]
        self.mean_shift = (
            self.shift if self.mean_shift is None else a * self.shift + (1 - a) * self.mean_shift
        )
        delta = max(a * abs(self.shift - self.mean_shift), o["delta2"] * d * d)
        interval = o["max_interval"] if delta == 0 else round(o["beta"] / delta - o["gamma"])
        self.next_update = self.uses + max(1, min(int(interval), o["max_interval"]))
        self.last_diff = d
        self.updates += 1

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        check_finite(x, "the fixed-point quantizer's input")
        if self.shift is None or self.uses >= self.next_update:
            self.adapt(x)
        self.uses += 1
        return fixed_point(x, self.bits, self.shift).to(x.dtype)

    def state_dict(self) -> dict[str, Any]:
        keys = ("bits", "shift", "mean_shift", "uses", "next_update", "last_diff", "updates")
        return {k: getattr(self, k) for k in keys}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            setattr(self, k, v)


class AfpQuantizer(LayerQuantizer):
    simulated = True

    def __init__(self, method: Method):
        super().__init__(method)
        self.w = AdaptiveFixedPoint(self.opts, 8)
        self.a = AdaptiveFixedPoint(self.opts, 8)
        self.g = AdaptiveFixedPoint(self.opts, 8)

    def simulate(self, x: torch.Tensor, weight: torch.Tensor, op) -> torch.Tensor:
        y = op(ste(x, self.a), ste(weight, self.w))
        self.count_step()
        return grad_quant(y, self.g).clone()  # not a view: ReLU(inplace=True) modifies layer outputs

    def bits(self) -> dict[str, int]:
        return {"W": self.w.bits, "A": self.a.bits, "G": self.g.bits}

    def state_dict(self) -> dict[str, Any]:
        return {
            **super().state_dict(),
            "W": self.w.state_dict(),
            "A": self.a.state_dict(),
            "G": self.g.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.w.load_state_dict(state["W"])
        self.a.load_state_dict(state["A"])
        self.g.load_state_dict(state["G"])


@register
class Afp(Method):
    name = "afp"
    description = (
        "AFP: per-layer fixed point with adaptive bit width (8 -> 16) and update interval; simulated"
    )
    layer_quantizer = AfpQuantizer
    simulated = True
    defaults = {
        "threshold": 0.03,
        "max_bits": 16,
        "alpha": 0.04,
        "beta": 0.1,
        "gamma": 2.0,
        "delta2": 100.0,
        "max_interval": 100,
    }

    def validate(self) -> None:
        o = self.opts
        if o["max_bits"] not in (8, 16, 24):
            raise ValueError(f"max_bits must be 8, 16 or 24 (8-bit steps from 8), got {o['max_bits']!r}")
        if o["threshold"] < 0:
            raise ValueError(f"threshold must be >= 0, got {o['threshold']}")
        if not 0 < o["alpha"] <= 1:
            raise ValueError(f"alpha is a moving-average weight in (0, 1], got {o['alpha']}")
        if o["max_interval"] < 1:  # an int already (repro.methods.options)
            raise ValueError(f"max_interval must be a positive number of uses, got {o['max_interval']}")
