"""DoReFa-Net (repro/methods/dorefa.py) beyond tests/test_comparison_methods.py: a zero weight, per-sample
gradient scales, the layer's backward through the gradient quantizer, seeded noise and the bit-width range.
Expected values are worked out by hand from the paper's equations (5, 9, 12)."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import repro
from repro.methods import build_method
from repro.methods.dorefa import quantize_activation, quantize_grad, quantize_weight


def test_a_zero_weight_maps_to_quantize_k_of_one_half():
    # tanh(0) / 0 is replaced by r = 1/2: 2 round(3 / 2) / 3 - 1 = 1/3 (half to even rounds 1.5 to 2)
    assert torch.allclose(quantize_weight(torch.zeros(4), 2), torch.full((4,), 1 / 3))


def test_a_one_dimensional_gradient_is_one_sample_per_entry_and_exact():
    # m is the max over all but the first axis: per entry here, so r is 0 or 1 and the codes give g back
    g = torch.tensor([0.3, -2.0, 0.7, 0.0])
    assert torch.allclose(quantize_grad(g, 4, torch.Generator().manual_seed(0)), g)


def test_gradient_noise_repeats_for_a_seed():
    g = torch.randn(8, 16)
    a = quantize_grad(g, 4, torch.Generator().manual_seed(1))
    assert torch.equal(a, quantize_grad(g, 4, torch.Generator().manual_seed(1)))
    assert not torch.equal(a, quantize_grad(g, 4, torch.Generator().manual_seed(2)))


def test_the_layers_input_gradient_goes_through_the_gradient_quantizer():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 6), nn.Linear(6, 3, bias=False), nn.Linear(3, 2))
    repro.quantize_model(model, "dorefa")
    layer, opts = model[1], build_method("dorefa").opts
    h = torch.rand(4, 6, requires_grad=True)
    gy = torch.randn(4, 3)
    torch.manual_seed(7)
    layer(h).backward(gy)
    torch.manual_seed(7)
    e = quantize_grad(gy, opts["bits_g"])
    w = quantize_weight(layer.weight.detach(), opts["bits_w"])
    assert torch.allclose(h.grad, (e @ w) * ((h > 0) & (h < 1)), atol=1e-6)
    a = quantize_activation(h.detach(), opts["bits_a"])
    t = torch.tanh(layer.weight.detach())  # eq. 9's derivative, the round straight through
    assert torch.allclose(layer.weight.grad, (e.t() @ a) * (1 - t * t) / t.abs().max(), atol=1e-5)


@pytest.mark.parametrize("key", ["bits_w", "bits_a", "bits_g"])
@pytest.mark.parametrize("bits", [1, 17])
def test_bit_widths_outside_2_to_16_are_refused(key, bits):
    with pytest.raises(ValueError, match=re.escape(f"{key}") + ".*" + re.escape(str(bits))):
        build_method("dorefa", **{key: bits})


@pytest.mark.parametrize("bits", [2, 16])
def test_bit_widths_at_the_ends_are_accepted(bits):
    assert build_method("dorefa", bits_w=bits, bits_a=bits, bits_g=bits).opts["bits_g"] == bits


def test_gradients_on_the_grid_come_back_unchanged_but_for_float_rounding():
    # r = g / 2m + 1/2 = j / n: noise of one step's width (+-1/2n) keeps the code at j, but for float32's
    # rounding at the very ends of the noise (39 of these 5.1 million draws); a noise one 254th wider moves
    # about 1 in 250
    n, draws = 2**8 - 1, 20_000
    j = torch.arange(n + 1, dtype=torch.float32)
    g = (2 * j / n - 1).repeat(draws, 1)  # every sample's max|g| is 1
    q = quantize_grad(g, 8, torch.Generator().manual_seed(0))
    assert ((q - g).abs() > 1e-6).sum().item() < g.numel() / 10_000


def test_the_largest_gradient_never_leaves_its_range():
    # r = 1 + noise can round to n + 1/2 and then up to n + 1 (about 1 in 50,000 draws): the clip to [0, 1]
    g = torch.ones(4_000_000, 1)
    assert quantize_grad(g, 8, torch.Generator().manual_seed(0)).max().item() <= 1.0


@pytest.mark.parametrize("bits", [2, 8])
def test_the_weight_quantizer_gives_the_bits_and_gradient_of_its_autograd_expression(bits):
    """quantize_weight is one autograd Function working in place; eq. 9 written as an autograd graph
    (tanh, / 2m with m constant, + 1/2, a straight-through round, x 2, - 1) gives the same bits, forward and
    backward."""
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(64, 96, generator=g) * 0.05
    w0[0, :8] = 0.0
    upstream = torch.randn(64, 96, generator=g)
    w = w0.clone().requires_grad_()
    quantize_weight(w, bits).backward(upstream)
    ref = w0.clone().requires_grad_()
    t = torch.tanh(ref)
    m = t.detach().abs().max()
    n = float(2**bits - 1)
    r = t / (2 * m) + 0.5
    q = r + (torch.round(r.detach() * n) / n - r.detach())  # the round, straight-through
    (2 * q - 1).backward(upstream)
    want = 2 * (torch.round((torch.tanh(w0) / (2 * m) + 0.5) * n) / n) - 1
    assert torch.equal(quantize_weight(w0, bits).view(torch.int32), want.view(torch.int32))
    assert torch.equal(w.grad.view(torch.int32), ref.grad.view(torch.int32))
