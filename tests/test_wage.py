"""WAGE (repro/methods/wage.py) beyond tests/test_comparison_methods.py's hand cases: the scales away from 1,
the update following the scheduler, a weight with no gradient, the layer scale dividing the output, and the
options' ranges. Expected values are worked out by hand from the module's equations."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import repro
from kernels.errors import NonFiniteError
from repro.methods import build_method, wage


def test_layer_scale_of_a_wide_layer_is_sqrt_6_over_fan_in_and_one():
    # fan_in 6: sqrt(6 / 6) = 1 > L_min = 1.5 * 2^-7; alpha = max(Shift(L_min), 1) = 1
    assert wage.layer_scale(6, 8) == (1.0, 1.0)


def test_error_quantizer_at_a_max_of_one_zero_and_another_dtype():
    e = torch.tensor([1.0, 0.5, -0.25])  # Shift(1) = 1: on the 2^-7 grid already, inside the clip
    assert wage.quantize_error(e, 8).tolist() == [1.0 - 2.0**-7, 0.5, -0.25]
    assert wage.quantize_error(torch.zeros(3), 8).tolist() == [0.0, 0.0, 0.0]
    assert wage.quantize_error(e.to(torch.bfloat16), 8).dtype == torch.bfloat16
    with pytest.raises(
        NonFiniteError, match=r"^non-finite values in WAGE's error quantizer input of shape \(1,\)$"
    ):
        wage.quantize_error(torch.tensor([float("inf")]), 8)


def test_weight_update_divides_by_the_shift_of_the_max_and_repeats_for_a_seed():
    # max|g| = 4, Shift(4) = 4: g_s = 2 g / 4 = [2, -1, 0.5]
    g = torch.tensor([4.0, -2.0, 1.0])
    dw = torch.stack([wage.weight_update(g, 2.0, 8, torch.Generator().manual_seed(i)) for i in range(400)])
    assert (dw[:, 0] == 2 * 2.0**-7).all() and (dw[:, 1] == -(2.0**-7)).all()
    assert set(dw[:, 2].unique().tolist()) == {0.0, 2.0**-7}
    again = wage.weight_update(g.repeat(50), 2.0, 8, torch.Generator().manual_seed(3))
    assert torch.equal(again, wage.weight_update(g.repeat(50), 2.0, 8, torch.Generator().manual_seed(3)))
    assert wage.weight_update(torch.zeros(2), 2.0, 8).tolist() == [0.0, 0.0]


def test_the_update_follows_the_schedule_and_starts_from_the_first_group_rate():
    quantizer = build_method("wage").make_layer_quantizer()
    assert quantizer.state_dict() == {"step": 0, "alpha": None, "lr0": None}
    w = torch.zeros(1)
    # lr 8, g = 1: g_s = 8, dW = 8 * 2^-7
    quantizer.update(w, torch.zeros(1), torch.ones(1), 0.1)
    assert w.tolist() == [-8 * 2.0**-7] and quantizer.state_dict()["lr0"] == 0.1
    quantizer.update(w, torch.zeros(1), torch.ones(1), 0.05)  # the scheduler halved the rate
    assert w.tolist() == [-4 * 2.0**-7]


def test_the_layer_scale_divides_the_quantized_weight():
    layer = nn.Linear(1600, 1, bias=False)
    repro.quantize_model(nn.Sequential(nn.Linear(3, 1600), layer, nn.Linear(1, 2)), "wage")
    x = torch.full((1, 1600), 0.5)
    y = layer(x)
    quantizer = layer.int8
    assert quantizer.alpha == 16.0  # L_min / sqrt(6 / 1600) = 12.2: Shift 16
    w = wage.q(wage.c(layer.weight.detach(), 2), 2) / 16.0
    assert torch.allclose(y, x @ w.t())


def test_a_weight_without_a_gradient_keeps_its_value():
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 2))
    method = build_method("wage")
    repro.quantize_model(model, method)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    method.make_optimizer(model, opt)
    model(torch.randn(3, 4))  # WAGE's initialisation
    model[2].weight.requires_grad_(False)
    frozen = model[2].weight.detach().clone()
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    assert torch.equal(model[2].weight.detach(), frozen) and model[1].weight.grad is not None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"bits_w": 17}, "bits_w must be an integer bit width in 2..16, got 17"),
        ({"bits_e": 1}, "bits_e must be an integer bit width in 2..16, got 1"),
        ({"lr": 0.0}, "lr must be positive, got 0.0"),
        ({"lr": -1.0}, "lr must be positive, got -1.0"),
    ],
)
def test_options_outside_their_range_are_refused(options, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build_method("wage", **options)


@pytest.mark.parametrize("options", [{"bits_w": 16}, {"bits_a": 2}, {"lr": 0.5}])
def test_options_at_the_ends_of_their_range_are_accepted(options):
    assert build_method("wage", **options).opts.items() >= options.items()


def test_the_optimizers_group_rate_reaches_the_update_through_its_step_hooks():
    model = nn.Sequential(nn.Linear(4, 6), nn.Linear(6, 6), nn.Linear(6, 2))
    method = build_method("wage")
    repro.quantize_model(model, method)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    method.make_optimizer(model, opt)
    for lr in (0.1, 0.05):  # the scheduler halves the rate; lr0 stays the first step's
        opt.param_groups[0]["lr"] = lr
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        assert model[1].int8.state_dict()["lr0"] == 0.1
