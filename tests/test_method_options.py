"""The method options the papers' figures and UI8 Table 7 need: UI8's linear / quadratic / exponential
learning-rate scaling (Figure 6b) and 2-bit weights ("Ours 2/8/8"), WAGEUBN's plain 8-bit QE2 (Figure 9)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import repro
from repro.methods import build_method
from repro.methods.ui8 import low_bit_weight, lr_factor, lr_factor_tensor
from repro.methods.wageubn.fixed_point import QW, SQ, Q, flag_qe2


@pytest.mark.parametrize(
    ("form", "want"),
    [
        ("exponential", math.exp(-0.4)),
        ("linear", 1 / 1.4),
        ("quadratic", 1 / (1 + 0.4 + 0.08)),
    ],
)
def test_lr_forms_by_hand(form, want):
    # alpha = 20, d_c = 0.02: x = 0.4
    assert lr_factor(0.02, 20.0, 0.1, form) == pytest.approx(want)
    assert float(lr_factor_tensor(torch.tensor(0.02, dtype=torch.float64), 20.0, 0.1, form)) == pytest.approx(
        want
    )
    assert lr_factor(0.5, 20.0, 0.1, form) == 0.1  # floored at beta
    assert lr_factor(0.0, 20.0, 0.1, form) == 1.0


def test_lr_forms_are_ordered_weakest_to_strongest():
    for d in (0.005, 0.02, 0.05):
        assert lr_factor(d, 20, 0.0, "linear") > lr_factor(d, 20, 0.0, "quadratic") > lr_factor(d, 20, 0.0)


def test_low_bit_weight_codes_and_least_squares_scale():
    w = torch.randn(16, 8, 3, 3, generator=torch.Generator().manual_seed(0))
    codes, scale = low_bit_weight(w, 2)
    assert codes.dtype == torch.int8 and set(codes.unique().tolist()) <= {-1, 0, 1}
    w_hat = repro.dequantize(codes, scale)
    # least squares: the residual is orthogonal to the codes
    assert float((w - w_hat).flatten() @ codes.float().flatten()) == pytest.approx(0.0, abs=1e-3)
    # the chosen clip beats clipping at max|w| (which sends almost every weight to 0)
    naive = (w / w.abs().max()).round()
    cos = F.cosine_similarity(w.flatten(), naive.flatten(), dim=0)
    assert F.cosine_similarity(w.flatten(), w_hat.flatten(), dim=0) > cos + 0.3
    four, _ = low_bit_weight(w, 4)
    assert four.abs().max() == 7


def test_ui8_bits_w_quantizes_a_layer_to_2_bits_and_8_stays_as_before():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 3))
    repro.quantize_model(model, "ui8", bits_w=2)
    codes, _ = model[1].int8.weight(model[1].weight)
    assert set(codes.unique().tolist()) <= {-1, 0, 1}
    repro.quantize_model(
        eight := nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 3)), "ui8"
    )
    codes8, _ = eight[1].int8.weight(eight[1].weight)
    assert codes8.abs().max() == 127


def test_ui8_low_bit_codes_are_searched_again_only_when_the_weight_changes():
    from repro.methods.ui8 import low_bit_weight

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 3))
    repro.quantize_model(model, "ui8", bits_w=2)
    q, w = model[1].int8, model[1].weight
    first = q.weight(w)
    assert q.weight(w)[0] is first[0]  # unchanged: the codes found before
    other = w.detach().clone()
    while other._version < w._version:  # another tensor at the same version: still searched
        other.add_(0.0)
    assert q.weight(other)[0] is not first[0]
    assert q.weight(w)[0] is not first[0]  # and w's codes found again after it
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    model(torch.randn(2, 3, 9, 9)).square().sum().backward()
    opt.step()  # an in-place update
    after = q.weight(w)
    assert after[0] is not first[0]
    fresh = low_bit_weight(w, 2)
    assert torch.equal(after[0], fresh[0]) and torch.equal(after[1], fresh[1])
    model.load_state_dict({k: v * 2 for k, v in model.state_dict().items()})
    loaded = q.weight(w)
    assert torch.equal(loaded[1], low_bit_weight(w, 2)[1]) and not torch.equal(loaded[1], after[1])
    with torch.inference_mode():  # a weight made there has no version counter: searched every call
        built = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Conv2d(8, 8, 3), nn.Conv2d(8, 8, 3))
        repro.quantize_model(built, "ui8", bits_w=2)
        assert built(torch.randn(1, 3, 9, 9)).shape == (1, 8, 3, 3)


def test_bad_ui8_and_wageubn_options_are_one_line_errors():
    with pytest.raises(ValueError, match="lr_form must be one of"):
        build_method("ui8", lr_form="cubic")
    with pytest.raises(ValueError, match="bits_w must be"):
        build_method("ui8", bits_w=1)
    with pytest.raises(ValueError, match="e2 must be one of"):
        build_method("wageubn", e2="flag16")


@pytest.mark.parametrize(
    "method,options,message",
    [
        ("daiq", {"k": -1}, "k scales the Inverted-T step"),
        ("daiq", {"k": 0}, "k scales the Inverted-T step"),
        ("daiq", {"k": float("nan")}, "option k must be a finite number"),
        ("daiq-mcs", {"A": float("inf")}, "option A must be a finite number"),
        ("daiq", {"lam": float("nan")}, "option lam must be a finite number"),
        ("ui8", {"alpha": -5}, "alpha is phi's decay rate"),
        ("ui8", {"beta": float("nan")}, "option beta must be a finite number"),
        ("daiq", {"k": "nan"}, "option k must be a finite number"),
    ],
)
def test_option_values_outside_their_domain_are_refused(method, options, message):
    """quantize_model(m, "daiq", k=-1) or k=nan used to train silently; the error names the range."""
    with pytest.raises(ValueError, match=message):
        build_method(method, **options)


@pytest.mark.parametrize(("e2", "qe2"), [("shift8", lambda e: SQ(e, 8)), ("flag8", lambda e: flag_qe2(e, 8))])
def test_wageubn_e2_option_picks_the_error_quantizer(e2, qe2):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 2, 1))
    repro.quantize_model(model, "wageubn", e2=e2)
    conv = model[1]
    x = Q(torch.rand(2, 4, 4, 4), 8).requires_grad_()
    y = conv(x)
    gy = torch.randn_like(y) * 1e-3
    y.backward(gy)
    want = torch.nn.grad.conv2d_input(x.shape, QW(conv.weight.detach(), 8), qe2(gy), padding=1)
    torch.testing.assert_close(x.grad, want)
    assert build_method("wageubn-e2-16").opts["e2"] == "shift16"
