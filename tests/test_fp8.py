"""FP8 training (repro/methods/fp8) beyond tests/test_comparison_methods.py: the backward data flow of a
layer (loss-scaled E in FP8, GX in FP16, GW in FP16 then FP8), seeded stochastic rounding, option ranges."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import repro
from kernels.errors import NonFiniteError
from repro.methods import build_method
from repro.methods.fp8.formats import FP8, FP16, round_to


def test_a_layers_gradients_are_loss_scaled_and_rounded_as_the_paper_says():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.Linear(6, 3), nn.Linear(3, 2))
    repro.quantize_model(model, "fp8")  # loss_scale 1024
    layer, s = model[1], 1024.0
    h = torch.randn(4, 6, requires_grad=True)
    gy = torch.randn(4, 3) * 1e-3
    layer(h).backward(gy)
    e = round_to(gy * s, FP8) / s  # E in FP8, loss-scaled
    a, w = round_to(h.detach(), FP8), round_to(layer.weight.detach(), FP8)
    assert torch.equal(h.grad, round_to((e @ w) * s, FP16) / s)
    assert torch.equal(layer.weight.grad, round_to(round_to((e.t() @ a) * s, FP16), FP8) / s)


def test_stochastic_rounding_repeats_for_a_seed():
    x = torch.randn(1000)
    for fmt in (FP8, FP16):
        a = round_to(x, fmt, "stochastic", torch.Generator().manual_seed(4))
        b = round_to(x, fmt, "stochastic", torch.Generator().manual_seed(4))
        assert torch.equal(a, b) and not torch.equal(
            a, round_to(x, fmt, "stochastic", torch.Generator().manual_seed(5))
        )
    tiny = torch.full((1000,), 2.0**-17)  # below FP8's smallest subnormal, 2^-16: 0 or 2^-16
    a = round_to(tiny, FP8, "stochastic", torch.Generator().manual_seed(4))
    assert torch.equal(a, round_to(tiny, FP8, "stochastic", torch.Generator().manual_seed(4)))
    assert set(a.unique().tolist()) == {0.0, 2.0**-16}


def test_rounding_errors_name_the_mode_and_the_format():
    with pytest.raises(ValueError, match=r"^unknown rounding 'up'; choose one of nearest, stochastic$"):
        round_to(torch.ones(2), FP8, "up")
    with pytest.raises(
        NonFiniteError, match=r"^non-finite values in the FP8 \(1-5-2\) rounding's input of shape \(1,\)$"
    ):
        round_to(torch.tensor([float("nan")]), FP8)


@pytest.mark.parametrize("scale", [0.0, -2.0, 1000.0])
def test_a_loss_scale_that_is_not_a_positive_power_of_two_is_refused(scale):
    with pytest.raises(
        ValueError, match=f"^{re.escape(f'loss_scale must be a positive power of two, got {scale!r}')}$"
    ):
        build_method("fp8", loss_scale=scale)


@pytest.mark.parametrize("scale", [1.0, 0.5, 2.0**20])
def test_powers_of_two_at_and_below_one_are_accepted(scale):
    assert build_method("fp8", loss_scale=scale).opts["loss_scale"] == scale


def test_an_fp8_layers_bias_is_on_the_fp16_grid_after_a_step():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    method = build_method("fp8")
    repro.quantize_model(model, method)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    method.make_optimizer(model, opt)
    F.cross_entropy(model(torch.randn(8, 4)), torch.arange(8) % 2).backward()
    opt.step()
    bias = model[1].bias.detach()
    assert torch.equal(bias, round_to(bias, FP16))  # the FP8 layer's own bias is on the FP16 grid too


def test_the_weight_gradient_is_rounded_twice_fp16_then_fp8_as_stored():
    # GW = 1.25 + 0.125 - 2^-12: FP16 (spacing 2^-10) rounds it to 1.375, the tie between E5M2's 1.25 and
    # 1.5, which goes to the even 1.5; rounded once to FP8 it would be 1.25
    model = nn.Sequential(nn.Linear(1, 1), nn.Linear(1, 1, bias=False), nn.Linear(1, 1))
    repro.quantize_model(model, "fp8")
    layer = model[1]
    layer(torch.ones(3, 1)).backward(torch.tensor([[1.25], [0.125], [-(2.0**-12)]]))
    assert layer.weight.grad.item() == 1.5


@pytest.mark.parametrize("fmt", [FP8, FP16], ids=["fp8", "fp16"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_rounding_in_chunks_gives_the_bits_and_the_noise_stream_of_one_pass(fmt, rounding, monkeypatch):
    """Large tensors are rounded a chunk at a time (formats.CHUNK): the same values, and a generator left
    where one pass leaves it (subnormals, ties and values beyond max among them)."""
    from repro.methods.fp8 import formats

    monkeypatch.setattr(formats.float_format, "available", lambda: False)  # the torch expression
    x = _adversarial()
    gens = [torch.Generator().manual_seed(3) for _ in range(2)]
    whole = round_to(x, fmt, rounding, gens[0])
    monkeypatch.setattr(formats, "CHUNK", 256)  # 20 chunks, the last one short
    chunked = round_to(x, fmt, rounding, gens[1])
    assert torch.equal(whole.view(torch.int32), chunked.view(torch.int32))
    assert torch.equal(gens[0].get_state(), gens[1].get_state())
    assert (chunked.abs() <= fmt.max).all() and (chunked[x.abs() < 2.0**fmt.emin] != 0).any()


def _adversarial() -> torch.Tensor:
    """Values over 45 binades, with subnormals, ties, signed zeros and values beyond max."""
    torch.manual_seed(0)
    x = torch.randn(5, 1003) * torch.logspace(-40, 5, 5015, base=2).reshape(5, 1003)
    x[0, :300] = torch.arange(300) * 2.0**-10 + 2.0**-11  # halfway between FP16 grid points
    x[1, :10] = 0.0
    x[1, 10:20] = -0.0
    x[2, :5] = 1e9
    ties = torch.arange(100) + 0.5  # halfway between subnormal grid points: half to even
    x[3, :100], x[3, 100:200] = ties * FP8.min_subnormal, -ties * FP16.min_subnormal
    return x


@pytest.mark.parametrize("fmt", [FP8, FP16], ids=["fp8", "fp16"])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_the_native_rounding_gives_the_bits_and_the_noise_stream_of_the_torch_expression(
    fmt, rounding, monkeypatch
):
    """kernels/cpu/csrc/float_format.cpp in one pass against formats.py's torch expression, on the values
    above and on 2^18 random float32 bit patterns of every finite exponent."""
    from kernels.cpu import float_format
    from repro.methods.fp8 import formats

    if not float_format.available():
        pytest.skip("no C++ compiler: the native library cannot be built")
    gen = torch.Generator().manual_seed(1)
    bits = torch.randint(0, 1 << 23, (1 << 18,), generator=gen, dtype=torch.int32)
    bits |= torch.randint(0, 255, bits.shape, generator=gen, dtype=torch.int32) << 23
    bits |= torch.randint(0, 2, bits.shape, generator=gen, dtype=torch.int32) << 31
    for x in (_adversarial(), bits.view(torch.float32) * 2.0**-100):  # scaled: below FP16's max, subnormals
        gens = [torch.Generator().manual_seed(3) for _ in range(2)]
        native = round_to(x, fmt, rounding, gens[0])
        with monkeypatch.context() as m:
            m.setattr(formats.float_format, "available", lambda: False)
            torch_expression = round_to(x, fmt, rounding, gens[1])
        assert torch.equal(native.view(torch.int32), torch_expression.view(torch.int32))
        assert torch.equal(gens[0].get_state(), gens[1].get_state())
