"""The CPU quantizer's contract at its edges, for the native code and the torch fallback alike: clipping on
both sides, zero and sub-one scales, DAIQ's counts at a tie with the threshold, float64 inputs, scales and
thresholds, empty and one-element-per-channel tensors, seeded noise, dequantize leaving its input alone,
and errors that say what is wrong."""

from __future__ import annotations

import re

import pytest
import torch

from kernels.cpu import quantizer, runtime
from kernels.errors import NonFiniteError


@pytest.fixture(params=["native", "fallback"])
def impl(request, monkeypatch):
    if request.param == "native":
        if runtime.library() is None:
            pytest.skip("no C++ compiler: the native library is not built (tests/test_cpu_native.py)")
    else:
        monkeypatch.setattr(runtime, "library", lambda: None)
    return request.param


def _x(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def _nearest(x, s, axis=None):
    """q(x; s) = round(127 clamp(x, -s, s) / s), written out in float64; 0 where s = 0."""
    x = x.double()
    s = torch.as_tensor(s, dtype=torch.float64).reshape(-1)
    if axis is not None:
        s = s.reshape([-1 if d == axis % x.dim() else 1 for d in range(x.dim())])
    safe = torch.where(s > 0, s, torch.ones_like(s))
    q = torch.round(127 * torch.maximum(torch.minimum(x, safe), -safe) / safe)
    return torch.where(s > 0, q, torch.zeros_like(q)).to(torch.int8)


def test_codes_clip_both_tails_at_a_scale_below_the_max(impl):
    x = _x(4, 6, 5, 5, scale=3.0)
    s = float(x.abs().max()) / 4
    q = quantizer.quantize(x, s)
    assert q.dtype == torch.int8 and torch.equal(q, _nearest(x, s))
    assert int((q == 127).sum()) > 0 and int((q == -127).sum()) > 0
    per_channel = torch.tensor([0.5, 0.0, 2.0, 0.25, 1.0, 0.01])  # one zero scale: its channel's codes are 0
    q = quantizer.quantize(x, per_channel, 1)
    assert torch.equal(q, _nearest(x, per_channel, 1)) and int(q[:, 1].abs().sum()) == 0


@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_a_zero_scale_gives_zero_codes(impl, rounding):
    assert int(quantizer.quantize(_x(3, 7), 0.0, rounding=rounding).abs().sum()) == 0


def test_stochastic_codes_stay_in_range_and_within_one_step_after_clipping(impl):
    x = _x(8, 4, 6, 6, scale=3.0)
    s = torch.tensor([0.5, 1.0, 2.0, 8.0])
    q = quantizer.quantize(x, s, 1, "stochastic", generator=torch.Generator().manual_seed(3))
    v = 127 * torch.maximum(torch.minimum(x, s.view(1, -1, 1, 1)), -s.view(1, -1, 1, 1)) / s.view(1, -1, 1, 1)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    assert bool(((q.float() - v.floor()) >= 0).all()) and bool(((q.float() - v.floor()) <= 1).all())


def test_stochastic_codes_of_the_clip_value_itself_never_wrap(impl):
    # 127 + u rounds to 128 in float32 for u within 2^-17 of 1 (about 15 of these 4 million draws): the
    # code must stay 127, not wrap to -128; -127 + u rounds to -126 as often, a step inside the range
    x = torch.full((2**22,), 0.75)
    q = quantizer.quantize(
        torch.cat([x, -x]), 0.75, rounding="stochastic", generator=torch.Generator().manual_seed(0)
    )
    assert int(q[: 2**22].min()) == 127 and -127 <= int(q[2**22 :].min()) <= int(q[2**22 :].max()) <= -126


def test_seeded_noise_repeats_and_nearest_rounding_draws_none(impl):
    x = _x(5, 9)

    def draws(gen, nearest_between):
        a = quantizer.quantize(x, 1.0, None, "stochastic", generator=gen)
        if nearest_between:
            quantizer.quantize(x, 1.0, None, "nearest", generator=gen)
        return a, quantizer.quantize(x, 1.0, None, "stochastic", generator=gen)

    a, b = draws(torch.Generator().manual_seed(11), False)
    a2, b2 = draws(torch.Generator().manual_seed(11), True)
    assert torch.equal(a, a2) and torch.equal(b, b2) and not torch.equal(a, b)
    codes, s = quantizer.absmax_quantize(x, 0, "stochastic", torch.Generator().manual_seed(11))
    again, _ = quantizer.absmax_quantize(x, 0, "stochastic", torch.Generator().manual_seed(11))
    assert torch.equal(codes, again) and s.shape == (5,)


def test_absmax_quantize_per_channel_reaches_127_in_every_channel(impl):
    x = _x(6, 5, 4) * torch.tensor([1e-3, 1.0, 30.0, 0.2, 5.0]).view(1, -1, 1)
    codes, s = quantizer.absmax_quantize(x, 1)
    assert torch.equal(s, x.abs().amax(dim=(0, 2)))
    assert codes.abs().amax(dim=(0, 2)).tolist() == [127] * 5


def test_a_scale_below_one_is_a_scale(impl):
    x = _x(64, scale=0.01)
    s = float(x.abs().max()) / 2
    assert torch.equal(quantizer.quantize(x, s), _nearest(x, s))


def test_float64_inputs_scales_and_thresholds_are_read_as_float32(impl):
    x = _x(4, 8, 3, 3)
    s = x.abs().amax(dim=(0, 2, 3)) / 2
    want, counts = quantizer.quantize(x, s, 1, above=(1, s / 2))
    got, got_counts = quantizer.quantize(x.double(), s.double(), 1, above=(1, (s / 2).double()))
    assert torch.equal(got, want) and torch.equal(got_counts.reshape(-1), counts.reshape(-1))
    acc = torch.randint(-(2**20), 2**20, (4, 8, 3, 3), dtype=torch.int32)
    assert torch.equal(quantizer.dequantize(acc, s.double(), 1), quantizer.dequantize(acc, s, 1))


@pytest.mark.parametrize("axis", [None, 0])
def test_counts_above_the_threshold_are_strict_at_a_tie(impl, axis):
    x = torch.tensor([[-2.0, -1.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 3.0, -1.5]])  # integers: exact ties
    thresholds = torch.tensor(1.0) if axis is None else torch.tensor([1.0, 1.5])  # per row
    _, counts = quantizer.quantize(
        x, 3.0 if axis is None else torch.tensor([3.0, 3.0]), axis, above=(axis, thresholds)
    )
    assert counts.reshape(-1).tolist() == ([3] if axis is None else [1, 1])


def test_one_element_per_channel_has_zero_spread(impl):
    x = torch.tensor([[3.0, -2.0, 0.5]])
    amax, sigma = quantizer.channel_stats(x, 1)
    assert amax.tolist() == [3.0, 2.0, 0.5] and sigma.tolist() == [0.0, 0.0, 0.0]
    row = torch.tensor([0.5, -4.0, 2.0])
    assert quantizer.absmax(row, -1).tolist() == [0.5, 4.0, 2.0]
    assert quantizer.quantize(row, quantizer.absmax(row, -1), -1).tolist() == [127, -127, 127]


def test_empty_tensors_have_zero_max_and_no_codes(impl):
    empty = torch.empty(0, 3)
    assert float(quantizer.absmax(empty)) == 0.0 and quantizer.absmax(empty).shape == ()
    assert quantizer.quantize(empty, 1.0).shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequantize_per_channel_or_not_leaves_its_input_alone(impl, dtype):
    acc = torch.randint(-(2**20), 2**20, (3, 2, 4), dtype=torch.int32)
    kept = acc.clone()
    s = torch.tensor([0.5, 3.0])
    for scale, axis, want in [
        (s, 1, acc.double() * s.double().view(1, -1, 1)),
        (torch.tensor(0.25), 1, acc.double() * 0.25),  # one scale for every channel
        (torch.tensor(0.25), None, acc.double() * 0.25),
    ]:
        out = quantizer.dequantize(acc, scale, axis, dtype)
        assert out.dtype == dtype and torch.equal(out, want.float().to(dtype)), (scale, axis)
        assert torch.equal(acc, kept)
    wide = quantizer.dequantize(acc.long(), s, 1, dtype)  # int64 accumulators take the torch path
    assert torch.equal(wide, (acc.double() * s.double().view(1, -1, 1)).float().to(dtype))


def _message(text: str) -> str:
    return "^" + re.escape(text) + "$"


def test_errors_say_what_is_wrong(impl):
    bad = torch.ones(2, 3)
    bad[1, 2] = float("nan")
    with pytest.raises(NonFiniteError, match=_message("non-finite values in max|x|'s input of shape (2, 3)")):
        quantizer.absmax(bad)
    with pytest.raises(
        NonFiniteError, match=_message("non-finite values in the quantizer's input of shape (2, 3)")
    ):
        quantizer.quantize(bad, 1.0)
    with pytest.raises(
        NonFiniteError, match=_message("non-finite values in the quantizer's input of shape (2, 3)")
    ):
        quantizer.channel_stats(bad, 1)
    with pytest.raises(NonFiniteError, match=_message("non-finite values in the quantizer's scale")):
        quantizer.quantize(torch.ones(3), float("inf"))
    with pytest.raises(
        ValueError, match=_message("unknown rounding 'up'; choose one of nearest, stochastic")
    ):
        quantizer.quantize(torch.ones(3), 1.0, rounding="up")
    with pytest.raises(ValueError, match=_message("per-tensor quantization needs one scale, got shape (2,)")):
        quantizer.quantize(torch.ones(3), torch.ones(2))
    with pytest.raises(ValueError, match=_message("per-channel scale must have shape (3,), got (2,)")):
        quantizer.quantize(torch.ones(2, 3), torch.ones(2), 1)
    with pytest.raises(ValueError, match=_message("the scale's axis and the counted axis must be the same")):
        quantizer.quantize(torch.ones(2, 3), torch.ones(3), 1, above=(0, torch.ones(2)))
