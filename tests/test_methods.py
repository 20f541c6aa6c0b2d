"""Method logic on crafted gradients: DAIQ's discriminator and MCS recurrence, GVQ, UI8's clip search."""

import math

import pytest
import torch
from torch import nn

import repro
from repro.methods import build_method, list_methods
from repro.methods.daiq import mcs_update
from repro.methods.ui8 import cosine_distance, lr_factor, search_clip


def crafted_gradient(n=64, hw=8, seed=0):
    """Channel 0 Gaussian; channel 1 Inverted-T (95% near zero, 5% large)."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.empty(n, 2, hw, hw)
    g[:, 0] = torch.randn(n, hw, hw, generator=gen)
    tiny = torch.randn(n, hw, hw, generator=gen) * 1e-3
    spikes = torch.rand(n, hw, hw, generator=gen) < 0.05
    g[:, 1] = torch.where(spikes, torch.randn(n, hw, hw, generator=gen).sign() * 2.0, tiny)
    return g


def test_registry_lists_the_methods_and_rejects_unknowns():
    assert {"fp32", "gq", "ui8", "daiq", "daiq-gvq", "daiq-mcs"} <= set(list_methods())
    with pytest.raises(ValueError, match="known methods: .*daiq.*gq"):
        build_method("int4")
    with pytest.raises(ValueError, match="its options: A, k, lam"):
        build_method("daiq", alpha=3)
    with pytest.raises(ValueError, match="period"):
        build_method("ui8", period=0)


def test_registering_a_method_makes_it_buildable_and_a_second_registration_is_refused():
    from repro.methods import METHODS, Method, register

    class _Probe(Method):
        name = "probe-for-the-registry-test"

    try:
        assert register(_Probe) is _Probe and isinstance(build_method(_Probe.name), _Probe)
        with pytest.raises(ValueError, match="^method 'probe-for-the-registry-test' is registered twice$"):
            register(_Probe)
    finally:
        METHODS.pop(_Probe.name, None)


def test_a_method_instance_with_options_is_one_clear_error_and_unknowns_list_every_method():
    with pytest.raises(
        ValueError, match="^pass options by name together with a method name, not with a Method instance$"
    ):
        build_method(build_method("gq"), k=1)
    with pytest.raises(ValueError) as refused:
        build_method("int4")
    assert str(refused.value) == f"unknown method 'int4'; known methods: {', '.join(list_methods())}"


def test_an_option_whose_default_has_no_converter_is_passed_through_for_validate():
    from repro.methods.options import typed_option

    assert typed_option("m", "shape", (1, 2), [3, 4]) == [3, 4]


def test_daiq_discriminator_tells_gaussian_from_inverted_t():
    q = build_method("daiq").make_layer_quantizer()
    q.grad(crafted_gradient(), channel_axis=1)
    assert q.last_gaussian.tolist() == [True, False]


@pytest.mark.parametrize("k,A", [(1.0, 0.8), (1.2, 0.5), (1.5, 0.8)])
def test_daiq_mcs_recurrence_across_iterations(k, A):
    q = build_method("daiq", k=k, A=A).make_layer_quantizer()
    g1, g2, g3 = crafted_gradient(seed=1), crafted_gradient(seed=2) * 0.5, crafted_gradient(seed=3) * 3
    s1 = q.grad(g1, 1).gw_scale
    max1 = g1.abs().amax(dim=(0, 2, 3))
    assert torch.allclose(s1, max1)  # first iteration: s = max|g_c|
    prev = s1
    for g in (g2, g3):
        s = q.grad(g, 1).gw_scale
        gmax = g.abs().amax(dim=(0, 2, 3))
        assert math.isclose(s[0], gmax[0], rel_tol=1e-6)  # Gaussian channel: s = max|g|
        expected = (1 - k * A) * prev[1] + A * gmax[1]  # Inverted-T channel: eq. 14
        expected = expected if expected > 0 else gmax[1]
        assert math.isclose(s[1], expected, rel_tol=1e-6)
        prev = s


def test_daiq_state_round_trips_exactly():
    a = build_method("daiq").make_layer_quantizer()
    a.grad(crafted_gradient(seed=1), 1)
    b = build_method("daiq").make_layer_quantizer()
    b.load_state_dict(a.state_dict())
    # a different max than the first step's: a lost s_{c,t-1} restarts at max|g_c| and shows
    g = crafted_gradient(seed=2) * 0.5
    fresh = build_method("daiq").make_layer_quantizer().grad(g, 1).gw_scale
    s_a, s_b = a.grad(g, 1).gw_scale, b.grad(g, 1).gw_scale
    assert torch.equal(s_a, s_b)
    assert not torch.equal(s_b, fresh), "the restored state did not carry s_{c,t-1}"
    assert a.step == b.step == 2


def test_mcs_takes_the_gaussian_rule_only_above_lambda():
    """Algorithm 1: max|g_c| when P(|g| > sigma) > lambda, the Inverted-T recurrence otherwise (at
    equality too)."""
    gmax, prev = torch.tensor([2.0, 2.0]), torch.tensor([1.0, 1.0])
    above = torch.tensor([0.5, 0.75])
    s = mcs_update(gmax, above, prev, k=1.0, A=0.8, lam=0.5)
    assert s.tolist() == pytest.approx([0.2 * 1.0 + 0.8 * 2.0, 2.0])


def test_mcs_falls_back_to_max_when_the_recurrence_reaches_zero():
    """k*A > 1 can drive s to 0 exactly (here -0.5 * 3 + 0.75 * 2): a clip value of 0 would zero the
    channel's codes; it falls back to max|g_c|."""
    s = mcs_update(torch.tensor([2.0]), torch.tensor([0.0]), torch.tensor([3.0]), k=2.0, A=0.75, lam=0.5)
    assert s.tolist() == [2.0]


def test_daiq_state_of_a_quantizer_that_never_ran_round_trips():
    """A checkpoint before the first backward pass: no s_{c,t-1} yet."""
    b = build_method("daiq").make_layer_quantizer()
    b.load_state_dict(build_method("daiq").make_layer_quantizer().state_dict())
    assert b.scale is None and b.step == 0


@pytest.mark.parametrize("options", [{"lam": 0.0}, {"lam": 1.0}, {"A": 1e-3}])
def test_daiq_option_bounds_are_inclusive_where_the_paper_allows(options):
    assert build_method("daiq", **options).opts[next(iter(options))] == next(iter(options.values()))


def test_daiq_a_of_zero_is_refused_naming_it():
    with pytest.raises(ValueError, match="A must be positive, got 0.0"):
        build_method("daiq", A=0)


def test_gq_counts_its_backward_passes():
    q = build_method("gq").make_layer_quantizer()
    for _ in range(3):
        q.grad(crafted_gradient(), 1)
    assert q.step == 3 and q.state_dict()["step"] == 3


def test_gvq_scales_per_channel_for_gw_and_per_tensor_for_gx():
    g = crafted_gradient()
    codes = build_method("daiq-gvq").make_layer_quantizer().grad(g, 1)
    assert codes.gw_per_channel and codes.gw_scale.shape == (2,)
    assert torch.equal(codes.gw_scale, g.abs().amax(dim=(0, 2, 3)))
    assert codes.gx_scale.shape == () and float(codes.gx_scale) == float(g.abs().max())


def test_daiq_mcs_ablation_uses_one_scale():
    q = build_method("daiq-mcs").make_layer_quantizer()
    g = crafted_gradient()
    codes = q.grad(g, 1)
    assert codes.gw_scale.shape == () and float(codes.gw_scale) == float(g.abs().max())
    for g2, gaussian in ((g * 0.5, False), (torch.randn(64, 2, 8, 8), True)):
        prev = float(codes.gw_scale)
        # the discriminator on the whole tensor, computed here independently
        assert bool((g2.abs() > g2.std(correction=0)).float().mean() > 0.3) is gaussian
        codes = q.grad(g2, 1)
        top = float(g2.abs().max())
        expected = top if gaussian else (1 - 0.8) * prev + 0.8 * top
        assert math.isclose(float(codes.gw_scale), expected, rel_tol=1e-6)
        assert bool(q.last_gaussian) is gaussian


def test_daiq_updates_its_state_in_place():
    q = build_method("daiq").make_layer_quantizer()
    q.grad(crafted_gradient(), channel_axis=1)
    scale, flags = q.scale, q.last_gaussian
    q.grad(crafted_gradient(seed=1), channel_axis=1)
    assert q.scale is scale and q.last_gaussian is flags  # a compiled backward updates them in place


def test_daiq_fraction_above_sigma_at_a_tie_and_at_degenerate_sizes():
    from repro.methods.daiq import _fraction

    # 3 of 10 entries beyond sigma = 1.37: a fraction of exactly lambda = 0.3 is not Gaussian (strictly above)
    g = torch.tensor([3.0, 3.0, 3.0] + [0.0] * 7).reshape(1, 1, 10)
    q = build_method("daiq").make_layer_quantizer()
    q.grad(g, channel_axis=1)
    assert q.last_gaussian.tolist() == [False]
    assert _fraction(torch.tensor([3]), torch.zeros(2, 1, 2, 2), 1).tolist() == [0.375]  # one channel
    assert _fraction(torch.tensor([1, 0]), torch.zeros(1, 2), 1).tolist() == [1.0, 0.0]  # one entry each
    assert _fraction(torch.tensor([2]), torch.zeros(2, 4), None).shape == ()


def test_gq_uses_one_code_tensor_for_both_paths():
    g = crafted_gradient()
    codes = build_method("gq").make_layer_quantizer().grad(g, 1)
    assert codes.gx is codes.gw and float(codes.gx_scale) == float(g.abs().max())


def test_ui8_clip_search_finds_the_grid_optimum():
    gen = torch.Generator().manual_seed(0)
    # sharp and wide (UI8 C1): Student-t like tails
    g = torch.randn(20_000, generator=gen) / torch.rand(20_000, generator=gen).clamp_min(0.02)
    c, d = search_clip(g)
    top = float(g.abs().max())
    grid = [top * 2 ** (-10 * i / 2000) for i in range(2001)]
    best = min(cosine_distance(g, x) for x in grid)
    assert c < top  # clipping does help on such a gradient
    assert d <= best + 1e-4
    assert math.isclose(d, cosine_distance(g, c), rel_tol=1e-6)


@pytest.mark.parametrize("scale", [1e-24, 1e20])
def test_ui8_distance_does_not_depend_on_the_gradients_scale(scale):
    # float32 norms of tiny gradients underflow and of huge ones overflow: d_c came out negative (-0.10
    # at 1e-24; a RetinaNet head layer's went far enough below 0 for phi = exp(-alpha d_c) to overflow
    # the optimizer step) or 1.0 (at 1e20)
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(50_000, generator=gen) / torch.rand(50_000, generator=gen).clamp_min(0.02)
    scaled = g * scale
    for c in (float(g.abs().max()), float(g.abs().max()) / 50):
        d, d_scaled = cosine_distance(g, c), cosine_distance(scaled, c * scale)
        assert 0.0 <= d_scaled <= 2.0 and math.isclose(d, d_scaled, rel_tol=1e-3)
    (c, d), (c_scaled, d_scaled) = search_clip(g), search_clip(scaled)
    # d_c is flat near its minimum: the clip found may move by a fraction of a percent, its distance may not
    assert math.isclose(c_scaled, c * scale, rel_tol=1e-2) and math.isclose(d_scaled, d, rel_tol=1e-3)
    assert lr_factor(-10.0, 20, 0.1) == 1.0  # never above 1, whatever d_c


def test_ui8_phi_matches_eq8():
    assert math.isclose(lr_factor(0.05, 20, 0.1), math.exp(-1.0))
    assert lr_factor(0.2, 20, 0.1) == 0.1  # exp(-4) = 0.018 is below beta
    assert lr_factor(0.0, 10, 0.2) == 1.0
    q = build_method("ui8", alpha=10.0, beta=0.2).make_layer_quantizer()
    q.d_c = 0.03
    assert math.isclose(q.lr_scale(), math.exp(-0.3))
    assert build_method("ui8", lr_scaling=False).make_layer_quantizer().lr_scale() == 1.0


@pytest.mark.parametrize("method", ["fp32", "gq", "daiq"])
def test_methods_without_lr_scaling_leave_every_layer_at_factor_one(method):
    """Only UI8 scales learning rates: every other method's layers step at the scheduler's rate."""
    from repro.layers import quantize_model
    from repro.lr_scaling import layer_lr_factors

    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3), torch.nn.Conv2d(4, 4, 3), torch.nn.Conv2d(4, 4, 1), torch.nn.Conv2d(4, 2, 1)
    )
    factors = layer_lr_factors(quantize_model(net, method))
    assert factors and set(factors.values()) == {1.0}
    assert build_method(method).make_layer_quantizer().lr_scale_tensor() is None


def test_ui8_periodic_update_reoptimises_only_every_period():
    q = build_method("ui8", period=3).make_layer_quantizer()
    gen = torch.Generator().manual_seed(1)
    clips = []
    for i in range(7):
        g = torch.randn(4, 8, 5, 5, generator=gen) * (1 + i)  # a different scale every step
        codes = q.grad(g, 1)
        clips.append(float(codes.gx_scale))
        assert codes.gx is codes.gw
    assert q.updates == 3  # steps 0, 3 and 6
    assert clips[0] == clips[1] == clips[2] != clips[3]
    assert clips[3] == clips[4] == clips[5] != clips[6]


def test_ui8_a_clip_searched_on_a_zero_gradient_does_not_zero_the_period():
    # a layer behind a zero-initialised BatchNorm, or an FPN level without positives, sees G = 0 at the
    # search; the later gradients of that period are quantized unclipped, not to zero
    q = build_method("ui8", period=100).make_layer_quantizer()
    assert float(q.grad(torch.zeros(4, 8, 5, 5), 1).gx.abs().sum()) == 0
    g = torch.randn(4, 8, 5, 5, generator=torch.Generator().manual_seed(2))
    codes = q.grad(g, 1)
    assert q.updates == 1 and q.clip == 0.0
    assert math.isclose(float(codes.gx_scale), float(g.abs().max()), rel_tol=1e-6)
    assert int(codes.gx.abs().max()) == 127


def test_unknown_options_are_all_named_with_the_known_ones_and_a_method_prints_its_options():
    with pytest.raises(ValueError, match=r"method 'fp32' has no option a, b; its options: none$"):
        build_method("fp32", b=1, a=2)
    with pytest.raises(ValueError, match=r"method 'gq' has no option x; its options: none$"):
        build_method("gq", x=1)
    assert repr(build_method("daiq", k=1.5)) == "Daiq(k=1.5, A=0.8, lam=0.3)"
    q = build_method("gq").make_layer_quantizer()
    q.step = 2**24 + 1  # the step counter stays an exact integer past float32's
    q.count_step()
    assert q.step == 2**24 + 2 and q.state_dict() == {"step": 2**24 + 2}


def test_fp32_does_not_quantize():
    assert build_method("fp32").make_layer_quantizer().quantizes is False


# ------------------------------------------------------------------------------------ typed options
@pytest.mark.parametrize(
    "method, options, message",
    [
        ("daiq", {"k": "abc"}, "option k of method daiq takes a number, got 'abc'"),
        ("daiq", {"A": True}, "option A of method daiq takes a number, got True"),
        ("ui8", {"period": 1.5}, "option period of method ui8 takes an integer, got 1.5"),
        ("ui8", {"period": [10]}, "option period of method ui8 takes an integer, got [10]"),
        ("ui8", {"period": "inf"}, "option period of method ui8 takes an integer, got 'inf'"),
        ("ui8", {"clip": "maybe"}, "option clip of method ui8 takes true or false, got 'maybe'"),
        ("ui8", {"clip": 1}, "option clip of method ui8 takes true or false, got 1"),
        ("wageubn", {"quantize_only": 3}, "option quantize_only of method wageubn takes a string or none"),
    ],
)
def test_an_option_of_the_wrong_type_is_one_line_naming_it(method, options, message):
    with pytest.raises(ValueError) as err:
        build_method(method, **options)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_options_take_the_types_of_the_defaults():
    assert build_method("daiq", k="1.5", A=1).opts == {"k": 1.5, "A": 1.0, "lam": 0.3}
    ui8 = build_method("ui8", period="10", clip="false", lr_scaling="True").opts
    assert (ui8["period"], ui8["clip"], ui8["lr_scaling"]) == (10, False, True)
    assert build_method("ui8", period=20.0).opts["period"] == 20
    assert build_method("wageubn", quantize_only="none").opts["quantize_only"] is None
    assert build_method("wageubn", quantize_only="BN").parts == {"BN"}
    with pytest.raises(ValueError, match="lam is a probability"):  # a value of the right type, checked
        build_method("daiq", lam="2")


def test_a_wrong_option_fails_when_the_hook_is_built():
    from mmengine.registry import HOOKS

    import repro.hooks  # noqa: F401  (registers Int8TrainingHook)

    with pytest.raises(ValueError, match="option k of method daiq takes a number, got 'abc'"):
        HOOKS.build(dict(type="Int8TrainingHook", method="daiq", k="abc"))


# ------------------------------------------------------------------------------- registry, capabilities
def test_every_module_and_folder_of_repro_methods_registers_a_method():
    import pkgutil

    import repro.methods as package
    from repro.methods import METHODS, NOT_METHODS

    found = {m.name for m in pkgutil.iter_modules(package.__path__)} - set(NOT_METHODS)
    registered_from = {cls.__module__.split(".")[2] for cls in METHODS.values()}
    assert found == registered_from and {"wageubn", "fp8"} <= found


def test_only_methods_whose_layers_scale_learning_rates_say_so():
    scaling = [name for name in list_methods() if build_method(name).scales_learning_rates]
    assert scaling == ["ui8"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
@pytest.mark.parametrize("method", list_methods())
def test_a_quantized_layer_keeps_its_models_dtype_forward_and_backward(method, dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 5), nn.Linear(5, 3), nn.Linear(3, 2)).to(dtype)
    repro.quantize_model(model, method)
    h = torch.randn(6, 5, dtype=dtype, requires_grad=True)
    y = model[1](h)
    y.sum().backward()
    assert (y.dtype, h.grad.dtype, model[1].weight.grad.dtype) == (dtype, dtype, dtype)
