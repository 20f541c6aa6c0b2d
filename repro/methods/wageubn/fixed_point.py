"""WAGEUBN's fixed-point quantization functions (Yang et al., Neural Networks 2020, sec. III-C/D).

    Q(x, k)    = round(x * 2^(k-1)) / 2^(k-1)                      direct (eq. 6)
    R(x)       = 2^round(log2 max|x|)                              layer-wise power-of-two scale (eq. 7)
    Norm(x)    = x / R(x)
    Sd(x, dr)  = clip(Sr(dr * Norm(x)), -dr + 1, dr - 1)           Sr: stochastic rounding (eq. 7)
    CQ(x)      = Sd(x, dr) / 2^(kGC - 1)                           constant quantization, for G (eq. 7)
    SQ(x, k)   = R(x) * clip(Q(Norm(x), k), -1 + d(k), 1 - d(k))   shift quantization, for E (eq. 8)
    FlagQE2(x) = Sc * clip(round(x / Sc), -(2^(k-1) - 1), 2^(k-1) - 1)   if |x / Sc| >= 1   (eq. 17)
                 Sc * Q(x / Sc, k)                                       otherwise
                 with Sc = R(x) / 2^(k-1): the 9-bit flag format, covering about [2^-15 R, R] at k = 8
    QW(x, k)   = clip(Q(x, k), -1 + d(k), 1 - d(k))               weights (eq. 10), d(k) = 2^-(k-1)

Every function returns float tensors on the fixed-point grid (quantize-dequantize): WAGEUBN's operands
are fixed-point numbers whose integer part is not bounded to int8 (Q has no clip: activations after
ReLU exceed 127 * 2^-7), so its arithmetic is simulated, not run as int8 x int8 products.
Rounding: torch.round (half to even), as the authors' tf.round.
Each function works in place on the temporaries it makes (one allocation, not one per step): the same
operations in the same order, so the same values bit for bit (tests/test_wageubn.py compares them with
the plain expressions).
"""

from __future__ import annotations

import torch

from repro.quant import absmax, check_finite


def d(k: int) -> float:
    """The smallest step of a k-bit fixed-point number in (-1, 1): 2^-(k-1) (eq. 8)."""
    return 2.0 ** -(k - 1)


def Q(x: torch.Tensor, k: int) -> torch.Tensor:
    """Direct quantization to k bits (eq. 6): the nearest multiple of 2^-(k-1), range not clipped."""
    n = 2.0 ** (k - 1)
    return (x * n).round_().div_(n)


def R(x: torch.Tensor) -> torch.Tensor:
    """2^round(log2 max|x|) as a 0-d tensor; 1 for an all-zero tensor (whose Norm is 0 anyway)."""
    m = absmax(x)  # one pass; a NaN or Inf anywhere in x shows up in max|x|
    check_finite(m, "a fixed-point quantizer's input (its max|x|)")
    return torch.where(m > 0, torch.exp2(torch.round(torch.log2(m.clamp_min(1e-38)))), torch.ones_like(m))


def norm(x: torch.Tensor) -> torch.Tensor:
    return x / R(x)


def stochastic_round(v: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Sr (eq. 7): floor(v) + Bernoulli(v - floor(v)), so E[Sr(v)] = v."""
    noise = torch.rand(v.shape, generator=generator, device=v.device, dtype=v.dtype)
    return noise.add_(v).floor_()  # noise + v is v + noise: the same sum


def Sd(x: torch.Tensor, dr: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Integers in [-dr + 1, dr - 1] (eq. 7); dr in {2^(k-1), ..., 1} follows the d_r schedule."""
    return stochastic_round(norm(x).mul_(dr), generator).clamp_(-dr + 1, dr - 1)


def CQ(x: torch.Tensor, dr: float, k_gc: int = 15, generator: torch.Generator | None = None) -> torch.Tensor:
    """Constant quantization of weight gradients (eq. 7, 18): Sd(x) / 2^(kGC - 1)."""
    return Sd(x, dr, generator).div_(2.0 ** (k_gc - 1))


def SQ(x: torch.Tensor, k: int) -> torch.Tensor:
    """Shift quantization of errors (eq. 8): keeps the magnitude R(x), k-bit resolution below it."""
    r = R(x)
    n = 2.0 ** (k - 1)
    return (x / r).mul_(n).round_().div_(n).clamp_(-1 + d(k), 1 - d(k)).mul_(r)  # r * Q(x / r, k), clipped


def flag_qe2(x: torch.Tensor, k: int = 8) -> torch.Tensor:
    """The 8-bit Flag QE2 (eq. 17, Fig. 4): a flag bit picks the integer or the fractional branch."""
    sc = R(x) / 2.0 ** (k - 1)
    v = x / sc
    big = v.abs() >= 1
    top = 2.0 ** (k - 1) - 1
    # The authors' Quantize.py (fe2) clips the fractional branch to [-1, 1]; Q(|v| < 1) cannot leave it.
    return torch.where(big, torch.round(v).clamp_(-top, top), Q(v, k)).mul_(sc)


def QW(x: torch.Tensor, k: int) -> torch.Tensor:
    """Weights for the convolution (eq. 10): k-bit, clipped to [-1 + d(k), 1 - d(k)]."""
    return Q(x, k).clamp_(-1 + d(k), 1 - d(k))


def dr_for(stage: int, k_start: int = 8) -> float:
    """d_r = 2^(k-1) with k = k_start - stage, never below 1 (sec. III-C: 128, 64, ..., 1)."""
    return 2.0 ** max(k_start - 1 - stage, 0)


def quantized_lr(lr: float, k_lr: int = 10) -> float:
    """The fixed-point learning rate (sec. III-D 7): Q(lr, klr), clipped to 1 - d(klr) as the authors'
    flr does, and never below one step 2^-(klr-1) while lr > 0: WAGEUBN's smallest learning rate is
    2^-9 (sec. IV-A), and a scheduler's decayed rate must not round to a frozen network."""
    if lr <= 0:
        return 0.0
    n = 2.0 ** (k_lr - 1)
    return min(max(round(lr * n), 1) / n, 1 - d(k_lr))
