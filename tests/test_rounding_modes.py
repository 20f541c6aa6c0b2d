"""Rounding modes as the papers promise them: gradient codes stochastically rounded (unbiased: the mean
code over many draws is the unrounded value), activations and weights rounded to nearest.

A layer check that accepts any code within one step, or a method test that checks scales only, passes a
nearest-rounding gradient quantizer; these tests do not (each also shows that nearest rounding fails
the same statistic).
"""

from __future__ import annotations

import math

import pytest
import torch

from repro import build_method
from repro.quant import QMAX

DRAWS = 400
# the mean of DRAWS codes, each floor or ceil of v, lies within 6 standard errors (<= 0.5 / sqrt(DRAWS))
# of v; the draws are seeded, so the test is deterministic, and nearest rounding misses by up to 0.5
BOUND = 6 * 0.5 / math.sqrt(DRAWS)
CHANNEL_AXIS = 1


def unrounded(g: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """g * 127 / s, clipped to [-127, 127]: s per tensor (0-d) or per channel of CHANNEL_AXIS."""
    s = scale.float()
    if s.dim() == 1:
        s = s.view([-1 if d == CHANNEL_AXIS else 1 for d in range(g.dim())])
    return (g * (QMAX / s)).clamp(-QMAX, QMAX)


def gradient() -> torch.Tensor:
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(4, 16, 5, 5, generator=gen)
    return g * torch.linspace(0.1, 3.0, 16).view(1, -1, 1, 1)  # channels of different ranges (DAIQ's GVQ)


def bias_of(method: str, codes_of) -> tuple[float, float]:
    """Largest |mean(code - v)| over the elements, for the GX and the GW codes, over DRAWS calls."""
    quantizer = build_method(method).make_layer_quantizer()
    g = gradient()
    torch.manual_seed(0)
    err_x, err_w = torch.zeros_like(g, dtype=torch.float64), torch.zeros_like(g, dtype=torch.float64)
    for _ in range(DRAWS):
        c = quantizer.grad(g, CHANNEL_AXIS)
        gx, gw = codes_of(c, g)
        vx, vw = unrounded(g, c.gx_scale), unrounded(g, c.gw_scale)
        for codes, v in ((gx, vx), (gw, vw)):
            step = codes.float() - v
            assert step.abs().max() < 1, f"{method}: a code is not floor or ceil of its value"
        err_x += gx.double() - vx.double()
        err_w += gw.double() - vw.double()
    return float((err_x / DRAWS).abs().max()), float((err_w / DRAWS).abs().max())


def as_returned(codes, g):
    return codes.gx, codes.gw


def rounded_to_nearest(codes, g):
    """The same scales with nearest rounding: what a wrong implementation would return."""
    return (
        unrounded(g, codes.gx_scale).round().to(torch.int8),
        unrounded(g, codes.gw_scale).round().to(torch.int8),
    )


@pytest.mark.parametrize("method", ["gq", "daiq", "daiq-gvq", "daiq-mcs", "ui8"])
def test_gradient_codes_are_unbiased_stochastic_rounding(method):
    bx, bw = bias_of(method, as_returned)
    assert bx < BOUND, f"{method}: GX codes biased by {bx:.3f} (stochastic rounding promised)"
    assert bw < BOUND, f"{method}: GW codes biased by {bw:.3f} (stochastic rounding promised)"


def test_the_statistic_catches_nearest_rounding():
    bx, bw = bias_of("daiq", rounded_to_nearest)
    assert bx > 0.4 and bw > 0.4


@pytest.mark.parametrize("method", ["gq", "daiq", "ui8"])
def test_activations_and_weights_round_to_nearest(method):
    quantizer = build_method(method).make_layer_quantizer()
    gen = torch.Generator().manual_seed(4)
    for what in ("activation", "weight"):
        x = torch.randn(3, 8, 4, 4, generator=gen)
        codes, s = getattr(quantizer, what)(x)
        want = unrounded(x, s).round()
        assert torch.equal(codes.float(), want), f"{method} {what}: not nearest rounding"
        again, _ = getattr(quantizer, what)(x)
        assert torch.equal(codes, again), f"{method} {what}: nearest rounding drew noise"
