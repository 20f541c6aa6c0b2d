"""UI8's gradient quantizer against independent references: d_c in float64 numpy, the clip search on a
distance whose minimum is known, the low-bit weight grid against a dense search, phi's three forms, the
unclipped ablation, the state a checkpoint carries, and the compiled branch run eagerly."""

import math
import os

import numpy as np
import pytest
import torch

import kernels
from repro.methods import build_method
from repro.methods.ui8 import (
    GRIDS,
    LOW_RATIO,
    _log_grid_search,
    cosine_distance,
    low_bit_weight,
    lr_factor,
    lr_factor_tensor,
    search_clip,
)


def heavy_tailed(n=20_000, seed=0, skew=1.0):
    """Student-t-like tails on both sides; `skew` scales the negative side."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(n, generator=gen) / torch.rand(n, generator=gen).clamp_min(0.02)
    return torch.where(g < 0, g * skew, g)


def reference_distance(g: torch.Tensor, c: float) -> float:
    """UI8 eq. 7 in float64: 1 - cos(g, round(g 127 / c) clamped to +-127)."""
    x = g.double().numpy().reshape(-1)
    q = np.clip(np.rint(x * 127.0 / c), -127, 127)
    return 1.0 - float(x @ q) / (np.linalg.norm(x) * np.linalg.norm(q))


@pytest.mark.parametrize("skew", [1.0, 0.2, 5.0])
@pytest.mark.parametrize("fraction", [1.0, 0.3, 1 / 50, 1 / 700])
def test_distance_equals_the_float64_reference_with_both_tails_clipped(skew, fraction):
    g = heavy_tailed(skew=skew)
    c = float(g.abs().max()) * fraction
    assert cosine_distance(g, c) == pytest.approx(reference_distance(g, c), rel=1e-4, abs=1e-6)


def test_distance_of_degenerate_inputs_is_one_and_on_the_grid_zero():
    g = heavy_tailed(n=100)
    assert cosine_distance(g, 0.0) == 1.0  # no clip value: nothing survives
    assert cosine_distance(torch.zeros(7), 1.0) == 1.0
    assert cosine_distance(torch.empty(0), 1.0) == 1.0
    on_grid = torch.arange(-127, 128, dtype=torch.float32) * 0.01
    assert 0.0 <= cosine_distance(on_grid, 1.27) <= 1e-7


def test_search_of_a_zero_or_empty_gradient_is_zero_and_of_a_unit_one_is_not():
    assert search_clip(torch.zeros(3, 4)) == (0.0, 0.0)
    assert search_clip(torch.empty(0)) == (0.0, 0.0)
    unit = heavy_tailed(n=2000)
    unit = unit / unit.abs().max()
    c, d = search_clip(unit)
    assert 0.0 < c < 1.0 and d == pytest.approx(cosine_distance(unit, c), rel=1e-6)


def final_half_spacing(low_ratio, grids):
    """Half the last grid's spacing in log c: each grid after the first spans two spacings of the last."""
    spacing = -math.log(low_ratio) / (grids[0] - 1)
    for k in grids[1:]:
        spacing = 2 * spacing / (k - 1)
    return spacing / 2


def test_grid_search_finds_a_known_minimum_to_half_its_final_spacing():
    low = math.log(LOW_RATIO)
    targets = [low, 0.0, *np.linspace(low, 0.0, 157)[1:-1].tolist()]
    bound = final_half_spacing(LOW_RATIO, GRIDS) * (1 + 1e-4)
    for t in targets:
        best_log, best_d = _log_grid_search(lambda r, t=t: (r.log() - t) ** 2, LOW_RATIO, GRIDS, "cpu")
        assert abs(float(best_log) - t) <= bound, t
        assert float(best_d) == pytest.approx((float(best_log) - t) ** 2, rel=1e-3, abs=1e-9)


@pytest.mark.parametrize("skew", [0.5, 2.0])
@pytest.mark.parametrize("bits", [2, 4])
def test_low_bit_weight_is_near_the_dense_optimum_and_least_squares(bits, skew):
    w = heavy_tailed(n=4096, seed=3, skew=skew).reshape(64, 64)
    codes, scale = low_bit_weight(w, bits)
    levels = 2 ** (bits - 1) - 1
    x = w.double().numpy().reshape(-1)
    top = np.abs(x).max()

    def cos(t):
        return float(x @ t) / (np.linalg.norm(x) * np.linalg.norm(t))

    dense = max(
        cos(np.clip(np.rint(x * levels / (top * r)), -levels, levels)) for r in np.geomspace(2**-6, 1, 600)
    )
    got = codes.double().numpy().reshape(-1)
    assert np.abs(got).max() <= levels and cos(got) >= dense - 2e-3
    alpha = float(scale) / 127
    assert alpha == pytest.approx(float(x @ got) / float(got @ got), rel=1e-5)


def test_low_bit_weight_of_one_weight_reproduces_it_and_of_zero_is_zero():
    w = torch.zeros(3, 5)
    w[1, 2] = -0.5
    codes, scale = low_bit_weight(w, 2)
    assert codes.tolist()[1][2] == -1 and int(codes.abs().sum()) == 1
    assert float(codes[1, 2]) * float(scale) / 127 == pytest.approx(-0.5)
    codes, scale = low_bit_weight(torch.zeros(4), 2)
    assert int(codes.abs().sum()) == 0 and float(scale) == 0.0


@pytest.mark.parametrize(
    "form, phi",
    [
        ("exponential", lambda x: math.exp(-x)),
        ("linear", lambda x: 1 / (1 + x)),
        ("quadratic", lambda x: 1 / (1 + x + x * x / 2)),
    ],
)
def test_phi_forms_and_the_quantizers_factor(form, phi):
    alpha, beta = 7.0, 0.05
    for d in (0.0, 0.01, 0.1, 0.9):
        assert lr_factor(d, alpha, beta, form) == pytest.approx(max(phi(alpha * d), beta), rel=1e-12)
    q = build_method("ui8", alpha=alpha, beta=beta, lr_form=form).make_layer_quantizer()
    assert q.lr_scale_tensor() is None and q.lr_scale() == 1.0  # before its first backward pass
    q.grad(heavy_tailed(n=512).reshape(2, 4, 8, 8), 1)
    assert 0.0 < q.d_c < 1.0
    assert q.lr_scale() == pytest.approx(max(phi(alpha * q.d_c), beta), rel=1e-6)
    assert float(q.lr_scale_tensor()) == pytest.approx(q.lr_scale(), rel=1e-6)
    off = build_method("ui8", lr_scaling=False, lr_form=form).make_layer_quantizer()
    off.grad(heavy_tailed(n=512).reshape(2, 4, 8, 8), 1)
    assert off.lr_scale() == 1.0 and off.lr_scale_tensor() is None


@pytest.mark.parametrize(
    "options, message",
    [
        ({"lr_form": "cubic"}, "lr_form must be one of exponential, linear, quadratic, got 'cubic'"),
        ({"bits_w": 9}, "bits_w must be a weight bit width from 2 to 8, got 9"),
        ({"bits_w": 1}, "bits_w must be a weight bit width from 2 to 8, got 1"),
        ({"period": 0}, "period must be a positive number of iterations, got 0"),
        ({"alpha": -0.5}, "alpha is phi's decay rate and must be >= 0, got -0.5"),
        ({"beta": 1.5}, r"beta is the lower bound of phi in \[0, 1\], got 1.5"),
        ({"beta": -0.1}, r"beta is the lower bound of phi in \[0, 1\], got -0.1"),
    ],
)
def test_options_outside_their_range_are_refused_naming_the_value(options, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        build_method("ui8", **options)


@pytest.mark.parametrize(
    "options", [{"period": 1}, {"alpha": 0.0}, {"alpha": 0.5}, {"beta": 0.0}, {"beta": 1.0}, {"bits_w": 2}]
)
def test_options_at_the_ends_of_their_range_are_accepted(options):
    assert build_method("ui8", **options).opts.items() >= options.items()


def test_an_unknown_phi_form_is_refused():
    with pytest.raises(
        ValueError, match="lr_form must be one of exponential, linear, quadratic, got 'cubic'"
    ):
        lr_factor_tensor(torch.tensor(0.1), 20.0, 0.1, "cubic")


def test_unclipped_ablation_quantizes_at_max_and_measures_its_distance_each_period():
    q = build_method("ui8", clip=False, period=2).make_layer_quantizer()
    distances = []
    for i in range(5):
        g = heavy_tailed(n=1024, seed=i).reshape(4, 4, 8, 8) * (1 + i)
        codes = q.grad(g, 1)
        assert float(codes.gx_scale) == float(g.abs().max()) and codes.gw is codes.gx
        assert int(codes.gx.abs().max()) == 127
        if i % 2 == 0:
            distances.append(cosine_distance(g, float(g.abs().max())))
        assert q.d_c == pytest.approx(distances[-1], rel=1e-6)
    assert (q.clip, q.updates, q.step) == (None, 3, 5)


def test_a_searched_clip_below_one_is_the_scale():
    q = build_method("ui8", period=10).make_layer_quantizer()
    g = heavy_tailed(n=4096).reshape(4, 16, 8, 8) * 1e-3
    codes = q.grad(g, 1)
    assert 0.0 < q.clip < 1e-3 * float(heavy_tailed(n=4096).abs().max())
    assert float(codes.gx_scale) == pytest.approx(q.clip, rel=1e-6)


def test_state_starts_empty_and_a_restored_quantizer_continues_identically():
    fresh = build_method("ui8", period=2).make_layer_quantizer()
    assert fresh.state_dict() == {"step": 0, "clip": None, "d_c": 0.0, "updates": 0}
    a = build_method("ui8", period=2).make_layer_quantizer()
    for i in range(3):
        a.grad(heavy_tailed(n=1024, seed=i).reshape(4, 4, 8, 8), 1)
    state = a.state_dict()
    assert (state["step"], state["updates"]) == (3, 2) and state["clip"] > 0 and state["d_c"] > 0
    b = build_method("ui8", period=2).make_layer_quantizer()
    b.load_state_dict(state)
    assert b.state_dict() == state
    g = heavy_tailed(n=1024, seed=9).reshape(4, 4, 8, 8)
    torch.manual_seed(5)
    ca = a.grad(g, 1)
    torch.manual_seed(5)
    cb = b.grad(g, 1)
    assert torch.equal(ca.gx, cb.gx) and float(ca.gx_scale) == float(cb.gx_scale)
    assert a.state_dict() == b.state_dict()
    b.updates = 2**24 + 1  # counters stay exact integers past float32's
    assert b.updates == 2**24 + 1 and b.state_dict()["updates"] == 2**24 + 1


@pytest.mark.skipif(
    "MUTANT_UNDER_TEST" in os.environ,
    reason="mutmut's trampolines read a ContextVar, which torch.cond cannot trace",
)
@pytest.mark.parametrize("clip", [True, False])
def test_the_compiled_branch_run_eagerly_keeps_the_eager_state(clip, monkeypatch):
    """Under torch.compile the periodic search is a torch.cond over tensors updated in place; run eagerly
    (kernels.compiling patched true, the traceable backend) it gives the eager branch's scales and state, and
    a restored state turns traceable (float32 on the gradient's device) after one step."""
    eager = build_method("ui8", period=2, clip=clip).make_layer_quantizer()
    traced = build_method("ui8", period=2, clip=clip).make_layer_quantizer()
    for i in range(6):
        g = heavy_tailed(n=1024, seed=i).reshape(4, 4, 8, 8) * (1 + i)
        a = eager.grad(g, 1)
        with monkeypatch.context() as patch:
            patch.setattr(kernels, "compiling", lambda: True)
            b = traced.grad(g, 1)
            assert kernels.get_backend(g.device) is kernels.traceable
        assert float(a.gx_scale) == float(b.gx_scale), i
        assert eager.state_dict() == traced.state_dict(), i
        assert traced._traceable_state(g)
    assert eager.updates == 3
    traced.load_state_dict(eager.state_dict())
    assert not traced._traceable_state(g)  # a checkpoint's state is float64
    traced.grad(g, 1)
    assert traced._traceable_state(g)
