"""AFP's adaptive fixed point (repro/methods/afp.py) on hand cases: the grid and its clipping, the shift,
the error metric, the bit-width growth, the moving average of the shift and the update interval, the state a
checkpoint carries, and the options' ranges. Expected values are worked out here from the module's equations
in float64 numpy, not read back from the code."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from kernels.errors import NonFiniteError
from repro.methods import build_method
from repro.methods.afp import AdaptiveFixedPoint, best_shift, diff_bit, fixed_point

OPTS = dict(build_method("afp").opts)


def test_the_grid_rounds_and_clips_both_tails():
    x = torch.tensor([-10.0, -0.3, 0.26, 10.0])
    # 4 bits: codes in [-7, 7] on steps of 2^-2
    assert fixed_point(x, 4, -2).tolist() == [-1.75, -0.25, 0.25, 1.75]


def test_the_shift_is_the_smallest_that_holds_the_max():
    assert best_shift(torch.tensor([15.875]), 8) == -3  # 15.875 = 127 * 2^-3 exactly
    assert best_shift(torch.tensor([-16.0, 1.0]), 8) == -2
    assert best_shift(torch.tensor([1.0]), 16) == -14  # 32767 * 2^-15 < 1 <= 32767 * 2^-14
    gen = torch.Generator().manual_seed(0)
    for bits in (8, 16):
        for scale in (1e-6, 1.0, 3e4):
            x = torch.randn(100, generator=gen) * scale
            s, top, m = best_shift(x, bits), 2 ** (bits - 1) - 1, float(x.abs().max())
            assert top * 2.0 ** (s - 1) < m <= top * 2.0**s
    # a zero tensor: float32's smallest normal exponent, the finest grid
    assert best_shift(torch.zeros(3), 8) == -126


def test_the_error_metric():
    x, x_hat = torch.tensor([2.0, -2.0]), torch.tensor([1.0, -1.0])
    assert diff_bit(x, x_hat) == pytest.approx(math.log2(1.5))  # |2 - 1| / 2 + 1
    assert diff_bit(torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5])) == pytest.approx(math.log2(1.5))
    assert diff_bit(torch.zeros(4), torch.zeros(4)) == 0.0


def _expected(x: torch.Tensor, bits: int):
    """(shift, diff_bit) of x on the `bits`-bit grid, in float64 numpy."""
    v = x.double().numpy()
    top = 2 ** (bits - 1) - 1
    shift = math.ceil(math.log2(np.abs(v).max() / top))
    hat = np.clip(np.round(v / 2.0**shift), -top, top) * 2.0**shift
    mean = np.abs(v).mean()
    return shift, math.log2(abs(mean - np.abs(hat).mean()) / mean + 1)


def _interval(opts, shift, mean_shift, d):
    delta = max(opts["alpha"] * abs(shift - mean_shift), opts["delta2"] * d * d)
    if delta == 0:
        return opts["max_interval"]
    return max(1, min(round(opts["beta"] / delta - opts["gamma"]), opts["max_interval"]))


HEAVY = torch.cat([torch.tensor([100.0]), torch.full((999,), 0.3)])  # 8 bits lose the 0.3s, 16 do not


def test_a_representable_tensor_stays_at_8_bits_for_the_longest_interval():
    q = AdaptiveFixedPoint(OPTS, 8)
    fresh = {"bits": 8, "shift": None, "mean_shift": None, "uses": 0, "next_update": 0, "last_diff": 0.0}
    assert q.state_dict() == {**fresh, "updates": 0}
    x = torch.tensor([1.0, -0.5, 0.25, 0.125])
    for _ in range(5):
        assert torch.equal(q(x), x)
    after = {"bits": 8, "shift": -6, "mean_shift": -6, "uses": 5, "next_update": 100, "last_diff": 0.0}
    assert q.state_dict() == {**after, "updates": 1}
    assert q(x.to(torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize("max_bits", [16, 24])
def test_a_tensor_that_8_bits_cannot_hold_grows_to_16(max_bits):
    opts = {**OPTS, "max_bits": max_bits}
    q = AdaptiveFixedPoint(opts, 8)
    q(HEAVY)
    shift, d = _expected(HEAVY, 16)
    assert (q.bits, q.shift, q.mean_shift) == (16, shift, shift)
    assert q.last_diff == pytest.approx(d, rel=1e-4) and 0 < d < opts["threshold"] < _expected(HEAVY, 8)[1]
    assert q.next_update == _interval(opts, shift, shift, q.last_diff) == 100  # capped


def test_growth_stops_at_max_bits_even_above_the_threshold():
    x = torch.cat([torch.tensor([1e6]), torch.ones(100_000)])  # at 16 bits the ones still round to 0
    q = AdaptiveFixedPoint(OPTS, 8)
    q(x)
    assert q.bits == 16 and q.last_diff > OPTS["threshold"]


def test_a_zero_threshold_does_not_grow_an_exact_tensor():
    q = AdaptiveFixedPoint({**OPTS, "threshold": 0.0}, 8)
    q(torch.tensor([1.0, -0.5]))
    assert q.bits == 8 and q.last_diff == 0.0


def test_the_moving_average_of_the_shift_moves_down_by_8_with_8_more_bits_and_sets_the_interval():
    opts = {**OPTS, "max_interval": 1}  # every use updates
    q = AdaptiveFixedPoint(opts, 8)
    q(torch.tensor([1.0, -0.5]))  # shift -6 at 8 bits
    assert (q.bits, q.mean_shift, q.next_update) == (8, -6, 1)
    q(HEAVY)
    shift, d = _expected(HEAVY, 16)
    a = opts["alpha"]
    mean = a * shift + (1 - a) * (-6 - 8)
    assert q.bits == 16 and q.mean_shift == pytest.approx(mean)
    # the interval: beta / delta - gamma, delta from the drift of the shift or the error (here the error)
    wide = {**OPTS, "max_interval": 10_000}
    w = AdaptiveFixedPoint(wide, 8)
    w(HEAVY)
    assert w.next_update == _interval(wide, shift, shift, w.last_diff) == round(0.1 / (100 * d * d) - 2)
    assert 1 < w.next_update < 10_000 and w.last_diff == pytest.approx(d, rel=1e-4)


def test_non_finite_input_is_named():
    with pytest.raises(
        NonFiniteError, match=r"^non-finite values in the fixed-point quantizer's input of shape \(2,\)$"
    ):
        AdaptiveFixedPoint(OPTS, 8)(torch.tensor([1.0, float("nan")]))


def test_a_layer_starts_at_8_bits_and_a_restored_one_continues_identically():
    a = build_method("afp", max_interval=2).make_layer_quantizer()
    assert a.bits() == {"W": 8, "A": 8, "G": 8}
    conv = torch.nn.Conv2d(2, 3, 3)
    x = torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(0)).requires_grad_()

    def step(q):
        y = q.simulate(x, conv.weight, lambda xx, ww: torch.nn.functional.conv2d(xx, ww))
        y.backward(HEAVY[: y.numel()].reshape(y.shape))
        return y.detach()

    for _ in range(3):
        step(a)
    state = a.state_dict()
    assert state["step"] == 3 and state["G"]["bits"] == 16 and state["W"]["uses"] == 3
    b = build_method("afp", max_interval=2).make_layer_quantizer()
    b.load_state_dict(state)
    assert b.state_dict() == state and b.bits() == {"W": 8, "A": 8, "G": 16}
    assert torch.equal(step(a), step(b)) and a.state_dict() == b.state_dict()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"max_bits": 12}, "max_bits must be 8, 16 or 24 (8-bit steps from 8), got 12"),
        ({"threshold": -0.1}, "threshold must be >= 0, got -0.1"),
        ({"alpha": 0.0}, "alpha is a moving-average weight in (0, 1], got 0.0"),
        ({"alpha": 1.5}, "alpha is a moving-average weight in (0, 1], got 1.5"),
        ({"max_interval": 0}, "max_interval must be a positive number of uses, got 0"),
    ],
)
def test_options_outside_their_range_are_refused(options, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build_method("afp", **options)


@pytest.mark.parametrize(
    "options", [{"max_bits": 8}, {"max_bits": 24}, {"threshold": 0.0}, {"alpha": 1.0}, {"max_interval": 1}]
)
def test_options_at_the_ends_of_their_range_are_accepted(options):
    assert build_method("afp", **options).opts.items() >= options.items()
