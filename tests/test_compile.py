"""torch.compile of INT8 training: the products as registered ops (opcheck), the traceable backend's
quantizer against the eager one, and a quantized model traced whole (no graph break, no recompilation
after warm-up, the compiled forward bit-identical to eager under nearest rounding).

Small on purpose: a six-layer network (convolution, BatchNorm, ReLU, strided, depthwise, linear) at 16 px.
"""

import json
from pathlib import Path

import pytest
import torch
import torch._dynamo
from torch import nn

import kernels
from kernels import ops, traceable
from repro import quantize_model

GEOMETRIES = [  # x shape, w shape, stride, padding, dilation, groups
    ((2, 8, 9, 9), (16, 8, 3, 3), [1, 1], [1, 1], [1, 1], 1),
    ((2, 8, 9, 9), (8, 1, 3, 3), [2, 2], [1, 1], [1, 1], 8),
    ((2, 4, 11), (6, 2, 3), [2], [0], [2], 2),
    ((1, 4, 5, 6, 6), (4, 4, 1, 3, 3), [1, 1, 1], [0, 1, 1], [1, 1, 1], 1),
]


def _codes(*shape, seed=0):
    return torch.randint(-127, 128, shape, dtype=torch.int8, generator=torch.Generator().manual_seed(seed))


def _fake_strides(op, *args):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        return op(*fake).stride()


def _significant(t: torch.Tensor, strides) -> tuple:
    return tuple(s for n, s in zip(t.shape, strides, strict=True) if n > 1)


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=["2d", "depthwise-strided", "1d-dilated-grouped", "3d"])
def test_conv_ops_pass_opcheck_equal_the_backend_and_state_their_layout(geometry):
    xs, ws, s, p, d, g = geometry
    x, w = _codes(*xs), _codes(*ws, seed=1)
    y = ops.conv_forward(x, w, s, p, d, g)
    assert torch.equal(y, kernels.cpu.conv_forward(x, w, s, p, d, g))
    gy = _codes(*y.shape, seed=2)
    calls = [
        (ops.conv_forward, (x, w, s, p, d, g)),
        (ops.conv_input_grad, (gy, w, list(xs), s, p, d, g)),
        (ops.conv_weight_grad, (x, gy, list(ws), s, p, d, g)),
    ]
    for op, args in calls:
        torch.library.opcheck(op, args)
        real = op(*args)
        # compiled code reads the real result by the fake one's strides: they must agree
        assert _significant(real, real.stride()) == _significant(real, _fake_strides(op, *args))
    reference = kernels.reference
    assert torch.equal(
        ops.conv_input_grad(gy, w, list(xs), s, p, d, g), reference.conv_input_grad(gy, w, xs, s, p, d, g)
    )
    assert torch.equal(
        ops.conv_weight_grad(x, gy, list(ws), s, p, d, g), reference.conv_weight_grad(x, gy, ws, s, p, d, g)
    )


def test_linear_ops_pass_opcheck_and_equal_the_reference():
    x, w, g = _codes(5, 7), _codes(3, 7, seed=1), _codes(5, 3, seed=2)
    for op, args, expected in [
        (ops.linear_forward, (x, w), kernels.reference.linear_forward(x, w)),
        (ops.linear_input_grad, (g, w), kernels.reference.linear_input_grad(g, w)),
        (ops.linear_weight_grad, (x, g), kernels.reference.linear_weight_grad(x, g)),
    ]:
        torch.library.opcheck(op, args)
        assert torch.equal(op(*args), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("axis", [None, 1])
def test_traceable_nearest_quantization_is_bit_identical_to_the_eager_backend(dtype, axis):
    x = (torch.randn(4, 6, 5, 5, generator=torch.Generator().manual_seed(3)) * 3).to(dtype)
    x[0, 0, 0, 0] = 0.0
    eager, compiled = kernels.cpu, traceable
    assert torch.equal(compiled.absmax(x, axis), eager.absmax(x, axis))
    s = eager.absmax(x, axis) * 0.7  # clipped values too
    if axis is not None:
        s[2] = 0.0  # an all-zero scale quantizes to 0
    assert torch.equal(compiled.quantize(x, s, axis), eager.quantize(x, s, axis))
    qc, sc = compiled.absmax_quantize(x, axis)
    qe, se = eager.absmax_quantize(x, axis)
    assert torch.equal(qc, qe) and torch.equal(sc, se)
    acc = torch.randint(-(2**20), 2**20, (4, 6, 5, 5), dtype=torch.int32)
    per = torch.rand(6) if axis is not None else torch.rand(())
    assert torch.equal(
        compiled.dequantize(acc, per, axis, dtype), eager.dequantize(acc.clone(), per, axis, dtype)
    )
    amax_c, sigma_c = compiled.channel_stats(x, axis)
    amax_e, sigma_e = eager.channel_stats(x, axis)
    assert torch.equal(amax_c, amax_e) and torch.allclose(sigma_c, sigma_e, rtol=1e-6)


def test_traceable_stochastic_rounding_is_unbiased_and_repeats_for_a_seed():
    v = torch.tensor([0.25, -0.5, 0.9, -126.2, 3.0])
    s = torch.tensor(127.0)  # codes = v itself
    torch.manual_seed(5)
    draws = torch.stack([traceable.quantize(v, s, rounding="stochastic").float() for _ in range(4000)])
    torch.manual_seed(5)
    again = torch.stack([traceable.quantize(v, s, rounding="stochastic").float() for _ in range(4000)])
    assert torch.equal(draws, again)
    assert set(draws[:, 0].tolist()) == {0.0, 1.0} and set(draws[:, 4].tolist()) == {3.0}
    # the mean within 5 standard errors of v: a nearest-rounding implementation (0, -0/-1, 1, -126) fails
    se = (draws.var(dim=0) / draws.shape[0]).sqrt().clamp_min(1e-6)
    assert ((draws.mean(dim=0) - v).abs() <= 5 * se).all()


@pytest.mark.parametrize("above", [None, (None, 0.5), (1, 0.5)], ids=["codes", "count-all", "per-channel"])
def test_the_stochastic_quantizer_op_passes_opcheck_and_draws_the_eager_noise(above):
    x = torch.randn(3, 5, 4, 4, generator=torch.Generator().manual_seed(2))
    x = x.to(memory_format=torch.channels_last)
    s = x.abs().amax()
    thresholds = None if above is None else torch.full((1 if above[0] is None else 5,), above[1])
    args = (x, s, None, None if above is None else above[0], thresholds)
    torch.library.opcheck(ops.quantize_stochastic, args, test_utils=("test_schema", "test_faketensor"))
    assert _fake_strides(lambda *a: ops.quantize_stochastic(*a)[0], *args) == x.stride()
    counted = None if above is None else (above[0], thresholds)
    torch.manual_seed(7)
    traced = traceable.quantize(x, s, rounding="stochastic", above=counted)
    torch.manual_seed(7)
    eager = kernels.cpu.quantize(x, s, rounding="stochastic", above=counted)
    traced, eager = ((t,) if above is None else t for t in (traced, eager))
    assert all(map(torch.equal, traced, eager)) and len(traced) == len(eager)
    assert traced[0].stride() == x.stride()  # codes in the input's layout, as the fake states


def test_the_traceable_stochastic_quantizer_raises_on_a_nan_as_eager_does():
    x = torch.tensor([[1.0, float("nan"), 2.0]])
    with pytest.raises(kernels.NonFiniteError):
        traceable.quantize(x, torch.tensor(2.0), rounding="stochastic")


def test_traceable_quantizer_propagates_a_nan_or_inf_into_the_scale_and_the_product():
    for bad in (float("nan"), float("inf")):
        x = torch.tensor([[1.0, bad, 2.0]])
        q, s = traceable.absmax_quantize(x)
        assert not torch.isfinite(s)
        out = traceable.dequantize(traceable.linear_forward(q, q), s * s / 127**2)
        assert torch.isnan(out).all()  # the loss downstream is NaN: the run recorder ends the run


def _net():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.Conv2d(32, 32, 3, padding=1, groups=32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 16),
        nn.ReLU(),
        nn.Linear(16, 10),
    )


def _train_step(model, x, y):
    model.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    return loss


@pytest.mark.parametrize("method", ["gq", "daiq"])
def test_a_quantized_training_step_traces_as_one_graph_after_warm_up(method):
    model = quantize_model(_net(), method)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    _train_step(model, x, y)  # warm-up: DAIQ's per-channel state exists after one backward pass
    explained = torch._dynamo.explain(lambda x, y: _train_step(model, x, y))(x, y)
    assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]


def test_no_test_patches_torchs_is_compiling():
    """Dynamo looks its rules for torch functions up by name once per process: a test that patched
    torch.compiler.is_compiling while torch.cond first ran Dynamo left the patch in those rules, and every
    later compiled step in the process called the eager backend (graph breaks, under one random test order).
    Tests patch kernels.compiling."""
    here = Path(__file__)
    offenders = [p.name for p in here.parent.rglob("*.py") if p != here and '"is_compiling"' in p.read_text()]
    assert offenders == []


def test_compiled_forward_is_bit_identical_and_training_does_not_recompile_after_warm_up():
    torch._dynamo.reset()
    model = quantize_model(_net(), "daiq")
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    compiled = torch.compile(model)
    model.eval()
    assert torch.equal(compiled(x), model(x))  # nearest rounding in the forward pass
    model.train()
    for _ in range(2):  # warm-up: compile, and DAIQ's state appearing after the first backward pass
        _train_step(compiled, x, y)
    counters = torch._dynamo.utils.counters
    graphs = counters["stats"]["unique_graphs"]
    losses = [float(_train_step(compiled, x, y)) for _ in range(3)]
    assert counters["stats"]["unique_graphs"] == graphs  # no recompilation
    assert all(map(torch.isfinite, torch.tensor(losses)))
    assert int(model[3].int8._steps) == 5 and model[3].int8.scale.shape == (32,)


def _grads(model):
    return [p.grad for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]


def test_a_compiled_training_step_draws_the_same_gradient_noise_as_eager():
    """gq rounds every gradient stochastically: compiled and eager gradients agree to float rounding
    (inductor sums BatchNorm in another order) for one seed, and differ at the noise's size for another."""
    torch._dynamo.reset()
    eager, other = (quantize_model(_net(), "gq") for _ in range(2))
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    compiled = torch.compile(other)
    for seed in (1, 2):
        torch.manual_seed(seed)
        _train_step(compiled, x, y)
    torch.manual_seed(2)
    _train_step(eager, x, y)
    same = [float((a - b).norm() / a.norm()) for a, b in zip(_grads(eager), _grads(other), strict=True)]
    assert max(same) < 1e-4, same
    torch.manual_seed(3)
    _train_step(eager, x, y)
    noise = [float((a - b).norm() / a.norm()) for a, b in zip(_grads(eager), _grads(other), strict=True)]
    assert max(noise) > 1e-3, noise


@pytest.mark.parametrize("clip", [True, False])
def test_ui8_periodic_search_runs_compiled_as_eager_does(clip):
    """UI8's clip search every `period` steps is a torch.cond under compile: same search steps and clip
    values as eager (nearest rounding in the search; the step's own rounding is stochastic)."""
    torch._dynamo.reset()
    eager, compiled = (quantize_model(_net(), "ui8", period=2, clip=clip) for _ in range(2))
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,))
    model = torch.compile(compiled)
    for i in range(5):
        torch.manual_seed(i)
        _train_step(eager, x, y)
        torch.manual_seed(i)
        _train_step(model, x, y)
    a, b = eager[3].int8, compiled[3].int8
    assert (a.step, a.updates) == (b.step, b.updates) == (5, 3)
    assert (a.clip is None) == (b.clip is None) and a.d_c > 0 and b.d_c > 0


@pytest.mark.slow
def test_repro_train_compile_trains_a_daiq_smoke_run_under_mmengine_compile(capsys):
    """`repro train --compile` is MMEngine's compile=True: the whole train_step compiled, INT8 layers in."""
    from tables.command import main

    argv = ["train", "--task", "classification", "--model", "resnet18", "--method", "daiq", "--compile"]
    argv += ["--profile", "smoke", "--json", "--cfg-options", "log_level=ERROR"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert not result["diverged"] and result["iters"] == 6 and 0 <= result["top1"] <= 100
