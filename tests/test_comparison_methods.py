"""The comparison methods of the tables: dorefa, fp8, afp, wage (quantizers on hand-computed cases, and
each one training a small model through quantize_model and through the mmengine hook)."""

import math
import uuid

import pytest
import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

import repro
import repro.hooks  # noqa: F401  (registers Int8TrainingHook)
from repro.methods import afp, build_method, dorefa, wage
from repro.methods.fp8.formats import FP8, FP16, round_to

METHODS = ["dorefa", "fp8", "afp", "wage"]


# FP8 / FP16 formats (Wang et al. 2018)


def test_format_constants():
    assert (FP8.bias, FP8.emin, FP8.emax, FP8.max, FP8.min_subnormal) == (15, -14, 15, 57344.0, 2.0**-16)
    assert (FP16.bias, FP16.emin, FP16.emax) == (31, -30, 31)
    assert FP16.max == (2 - 2**-9) * 2.0**31


def test_round_to_nearest_hand_cases():
    x = torch.tensor([1.0, 1.1, 1.125, 1.375, 3.3, -3.3, 1e6, -1e6, 2.0**-17, 1.5 * 2.0**-17, 0.0])
    want = [1.0, 1.0, 1.0, 1.5, 3.5, -3.5, 57344.0, -57344.0, 0.0, 2.0**-16, 0.0]
    # 1.125 and 2^-17 are ties: half to even (1.0 = 4 quarter-steps, 0 subnormal steps)
    assert round_to(x, FP8).tolist() == want
    y = torch.tensor([1 + 2.0**-10, 1 + 3 * 2.0**-10, 2.0**-39, 2.0**-41])
    assert round_to(y, FP16).tolist() == [1.0, 1 + 2.0**-8, 2.0**-39, 0.0]


def _grid_nearest(x, fmt):
    """Nearest even on fmt's grid by float32 bit arithmetic: the mantissa rounded at man_bits, subnormals on
    the fixed grid of the lowest binade, saturated at +-max."""
    drop = 23 - fmt.man_bits
    bits = x.view(torch.int32)
    normal = ((bits + ((1 << (drop - 1)) - 1) + ((bits >> drop) & 1)) & -(1 << drop)).view(torch.float32)
    ulp = fmt.min_subnormal
    return torch.where(x.abs() < 2.0**fmt.emin, (x / ulp).round() * ulp, normal).clamp(-fmt.max, fmt.max)


def test_fp8_nearest_through_torchs_float8_is_the_grid_arithmetic():
    """round_to(x, FP8) goes through torch.float8_e5m2 (every finite float32 checked once, docs/methods.md);
    here 2^22 random bit patterns over the exponents from 0 to 2^73, and the edges: ties at and above max,
    subnormal ties, signed zeros."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 1 << 23, (1 << 22,), generator=gen, dtype=torch.int32)
    bits |= torch.randint(0, 201, bits.shape, generator=gen, dtype=torch.int32) << 23
    bits |= torch.randint(0, 2, bits.shape, generator=gen, dtype=torch.int32) << 31
    edges = [0.0, -0.0, 57344.0, 59392.0, 61440.0, 61441.0, 65536.0, 1e30, 2.0**-17, 3 * 2.0**-17, 2.0**-14]
    for x in (bits.view(torch.float32), torch.tensor(edges + [-e for e in edges])):
        for fmt in (FP8, FP16):
            assert torch.equal(round_to(x, fmt).view(torch.int32), _grid_nearest(x, fmt).view(torch.int32))


def test_stochastic_rounding_is_unbiased_and_lands_on_neighbours():
    gen = torch.Generator().manual_seed(0)
    x = torch.full((40000,), 1.1)
    r = round_to(x, FP8, rounding="stochastic", generator=gen)
    assert set(r.unique().tolist()) == {1.0, 1.25}
    # P(1.25) = 0.4: sd of the mean = 0.25 sqrt(0.24 / n) = 6e-4
    assert abs(r.mean().item() - 1.1) < 3e-3
    small = torch.full((40000,), -0.3 * 2.0**-16)  # in the subnormal range
    assert abs(round_to(small, FP8, "stochastic", gen).mean().item() / (-0.3 * 2.0**-16) - 1) < 0.05


def test_round_to_rejects_non_finite():
    with pytest.raises(repro.NonFiniteError):
        round_to(torch.tensor([1.0, float("nan")]), FP8)


# DoReFa-Net (Zhou et al. 2016)


def test_dorefa_weight_hand_case():
    # tanh(w)/(2 max|tanh w|) + 1/2 = [0, 1/2, 1]; 2-bit: round(1.5) = 2 (half to even) -> 2*(2/3) - 1
    w = torch.tensor([-0.7, 0.0, 0.7])
    assert torch.allclose(dorefa.quantize_weight(w, 2), torch.tensor([-1.0, 1 / 3, 1.0]))
    w = torch.tensor([-0.3, 0.1, 0.7], requires_grad=True)
    dorefa.quantize_weight(w, 8).sum().backward()  # the gradient flows through tanh and max (eq. 9)
    assert w.grad is not None and w.grad[1] > 0


def test_dorefa_activation_hand_case():
    x = torch.tensor([-1.0, 0.2, 0.5, 0.9, 2.0], requires_grad=True)
    a = dorefa.quantize_activation(x, 2)
    assert torch.allclose(a, torch.tensor([0.0, 1 / 3, 2 / 3, 1.0, 1.0]))
    a.sum().backward()
    assert x.grad.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0]  # clip mask, straight through inside


def test_dorefa_grad_grid_and_unbiased():
    gen = torch.Generator().manual_seed(0)
    g = torch.tensor([[0.5, -0.25, 0.1, 1.0], [0.0, 0.0, 0.0, 0.0], [2.0, -1.0, 0.3, 0.0]])
    k = 3
    outs = torch.stack([dorefa.quantize_grad(g, k, gen) for _ in range(4000)])
    m = g.abs().amax(dim=1, keepdim=True)
    codes = (outs / (2 * m.clamp_min(1e-12)) + 0.5) * (2**k - 1)  # on the grid: integers in [0, 7]
    assert torch.allclose(codes[:, [0, 2]], codes[:, [0, 2]].round(), atol=1e-4)
    assert codes[:, [0, 2]].min() >= -1e-4 and codes[:, [0, 2]].max() <= 7 + 1e-4
    assert (outs[:, 1] == 0).all()  # an all-zero sample stays zero
    mean = outs.mean(dim=0)
    inner = (g.abs() < m) & (m > 0)  # the noise is clipped only at +-max, so elsewhere E[g_q] = g
    assert torch.allclose(mean[inner], g[inner], atol=0.03)


# FP8 training layer data flow


def test_fp8_layer_rounds_operands_and_the_product():
    torch.manual_seed(0)
    lin = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 3), nn.Linear(3, 2))
    repro.quantize_model(lin, "fp8")
    layer = lin[1]
    x = torch.randn(4, 5)
    h = lin[0](x)
    want = round_to(F.linear(round_to(h, FP8), round_to(layer.weight, FP8), layer.bias), FP16)
    assert torch.equal(layer(h), want)


def test_fp8_update_is_stochastically_rounded_to_fp16():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2))
    method = build_method("fp8")
    repro.quantize_model(model, method)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    method.make_optimizer(model, opt)
    F.cross_entropy(model(torch.randn(8, 4)), torch.arange(8) % 2).backward()
    opt.step()
    w = model[1].weight.detach()
    assert torch.equal(w, round_to(w, FP16))  # on the FP16 grid after the step
    assert not torch.equal(model[0].weight.detach(), round_to(model[0].weight.detach(), FP16))  # float layer


# AFP (Zhang et al. 2020)


def test_afp_fixed_point_hand_case():
    x = torch.tensor([1.0, -0.3, 0.26, 100.0])
    s = afp.best_shift(x, 8)  # 100 / 127 -> 2^0
    assert s == 0
    assert afp.fixed_point(x, 8, s).tolist() == [1.0, -0.0, 0.0, 100.0]
    assert afp.fixed_point(torch.tensor([300.0]), 8, 0).tolist() == [127.0]  # saturates between updates


def test_afp_precision_grows_when_the_error_is_large():
    opts = dict(build_method("afp").opts)
    x = torch.cat([torch.tensor([1000.0]), torch.full((999,), 0.1)])  # 8 bits: step 8, the 0.1s vanish
    quantizer = afp.AdaptiveFixedPoint(opts, 8)
    quantizer(x)
    assert quantizer.bits == 16 and quantizer.shift == math.ceil(math.log2(1000 / 32767))
    assert quantizer.last_diff <= opts["threshold"]
    well_spread = afp.AdaptiveFixedPoint(opts, 8)
    well_spread(torch.linspace(-1, 1, 1001))
    assert well_spread.bits == 8


def test_afp_interval_rule():
    opts = dict(build_method("afp").opts)
    quantizer = afp.AdaptiveFixedPoint(opts, 8)
    x = torch.randn(1000, generator=torch.Generator().manual_seed(0)) ** 3
    quantizer(x)  # first update: M = s, delta = delta2 diff^2
    d = quantizer.last_diff
    assert 0 < d <= opts["threshold"]
    want = max(1, min(round(opts["beta"] / (opts["delta2"] * d * d) - opts["gamma"]), opts["max_interval"]))
    assert quantizer.next_update == want
    for _ in range(want - 1):
        quantizer(x)
    assert quantizer.updates == 1  # (n, s) reused until the interval is over
    quantizer(x)
    assert quantizer.updates == 2


# WAGE (Wu et al. 2018)


def test_wage_functions_hand_cases():
    assert wage.sigma(2) == 0.5 and wage.sigma(8) == 2.0**-7
    x = torch.tensor([-0.9, -0.3, 0.2, 0.26, 0.9])
    assert wage.q(wage.c(x, 2), 2).tolist() == [-0.5, -0.5, 0.0, 0.5, 0.5]
    assert wage.shift(3.0) == 4.0 and wage.shift(0.3) == 0.25
    # fan_in 1600: sqrt(6/1600) = 0.061; L_min = 1.5 * 0.5 = 0.75; alpha = Shift(12.2) = 16
    limit, alpha = wage.layer_scale(1600, 2)
    assert limit == 0.75 and alpha == 16.0
    # Shift(3) = 4: e/4 = [0.75, -0.005, -0.0025, 0.25] -> the 2^-7 grid: -0.64 -> -1, -0.32 -> 0
    e = torch.tensor([3.0, -0.02, -0.01, 1.0])
    assert wage.quantize_error(e, 8).tolist() == [3.0, -(2.0**-7) * 4, -0.0, 1.0]
    # g_s = lr g / Shift(max|g|) = 2 * [1, -0.5, 0.25] / 1: integers except 0.5 -> 0 or 1
    gen = torch.Generator().manual_seed(0)
    dw = torch.stack([wage.weight_update(torch.tensor([1.0, -0.5, 0.25]), 2.0, 8, gen) for _ in range(4000)])
    assert (dw[:, 0] == 2 * 2.0**-7).all() and (dw[:, 1] == -(2.0**-7)).all()
    assert set(dw[:, 2].unique().tolist()) == {0.0, 2.0**-7}
    assert abs(dw[:, 2].mean().item() / 2.0**-7 - 0.5) < 0.05


def test_wage_initialises_and_updates_on_its_grid():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    method = build_method("wage")
    repro.quantize_model(model, method)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    method.make_optimizer(model, opt)
    x, y = torch.randn(16, 6), torch.arange(16) % 2
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    w = model[1].weight.detach()
    grid = 2.0**-7
    assert torch.equal(w, (w / grid).round() * grid) and w.abs().max() <= 1 - grid
    assert model[1].int8.alpha == wage.layer_scale(8, 2)[1]
    state = repro.method_state_dict(model)
    fresh = nn.Sequential(nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 2))
    repro.quantize_model(fresh, "wage")
    repro.load_method_state_dict(fresh, state)
    before = fresh[1].weight.detach().clone()
    fresh(x)  # restored state: no re-initialisation over loaded weights
    assert torch.equal(fresh[1].weight.detach(), before)


def test_bad_options_are_one_line_errors():
    with pytest.raises(ValueError, match="power of two"):
        build_method("fp8", loss_scale=1000)
    with pytest.raises(ValueError, match="bits_w"):
        build_method("wage", bits_w=1)
    with pytest.raises(ValueError, match="max_bits"):
        build_method("afp", max_bits=12)
    with pytest.raises(ValueError, match="bits_g"):
        build_method("dorefa", bits_g=0)


# Each method trains: through quantize_model and through the mmengine hook


def _data(n=64):
    gen = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 4
    x = 0.5 * torch.randn(n, 3, 8, 8, generator=gen)
    x[torch.arange(n), y % 3] += 1.0
    x[y == 3, :, :4] -= 1.0
    return x, y


def _net():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 16, 3, stride=2, padding=1),
        nn.ReLU(inplace=True),  # on a quantized layer's output (AlexNet does this)
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, 16),
        nn.ReLU(),
        nn.Linear(16, 4),
    )


@pytest.mark.parametrize("name", METHODS)
def test_trains_through_quantize_model(name):
    torch.manual_seed(0)
    x, y = _data()
    model = _net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    method = build_method(name)
    repro.quantize_model(model, method)
    method.make_optimizer(model, opt)
    losses = []
    for _ in range(25):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(math.isfinite(v) for v in losses)
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5, losses


class _HookNet(BaseModel):
    def __init__(self):
        super().__init__()
        self.net = _net()

    def forward(self, inputs, labels, mode="tensor"):
        logits = self.net(inputs)
        return {"loss": F.cross_entropy(logits, labels)} if mode == "loss" else logits


class _Data(Dataset):
    def __init__(self):
        self.x, self.y = _data()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "labels": self.y[i]}


class _Losses(Hook):
    def __init__(self):
        self.losses = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses.append(float(outputs["loss"].detach()))


@pytest.mark.parametrize("name", METHODS)
def test_trains_through_the_mmengine_hook(name, tmp_path):
    record = _Losses()
    torch.manual_seed(0)  # the model is built before the Runner seeds: else its start is the suite order's
    runner = Runner(
        model=_HookNet(),
        work_dir=str(tmp_path),
        train_dataloader=dict(
            dataset=_Data(),
            sampler=dict(type="InfiniteSampler", shuffle=True),  # DefaultSampler sleeps 2 s per restart
            batch_size=16,
            num_workers=0,
            collate_fn=dict(type="default_collate"),
        ),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        train_cfg=dict(by_epoch=False, max_iters=40),
        default_hooks=dict(logger=dict(type="LoggerHook", interval=100), checkpoint=None),
        custom_hooks=[dict(type="Int8TrainingHook", method=name), record],
        randomness=dict(seed=0),
        default_scope="mmengine",
        experiment_name=f"cmp-{name}-{uuid.uuid4().hex[:8]}",
    )
    runner.train()
    layers = repro.quantized_layers(runner.model)
    modules = {type(m.int8).__module__ for m in layers.values()}
    assert layers and modules <= {f"repro.methods.{name}", f"repro.methods.{name}.method"}, modules
    losses = record.losses
    assert len(losses) == 40 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-8:]) / 8 < 0.8 * sum(losses[:8]) / 8, losses


def _ulp(x, fmt):
    _, e = torch.frexp(x)
    return torch.ldexp(torch.ones_like(x), (e - 1).clamp(min=fmt.emin) - fmt.man_bits)


@pytest.mark.parametrize("fmt", [FP8, FP16], ids=["fp8", "fp16"])
def test_fast_rounding_matches_the_definition(fmt):
    """round_to's bit arithmetic against the plain definition: ulp from frexp, x / ulp rounded."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(20000, generator=gen) * torch.exp2(
        torch.randint(-45, 35, (20000,), generator=gen).float()
    )
    ties = torch.tensor([1.125, -1.375, 2.0**-17, 3 * 2.0**-17, 1 + 2.0**-10, -(1 + 3 * 2.0**-10)])
    x = torch.cat([x, ties])
    ulp = _ulp(x, fmt)
    nearest = ((x / ulp).round() * ulp).clamp(-fmt.max, fmt.max)
    assert torch.equal(round_to(x, fmt), nearest)
    lo = ((x / ulp).floor() * ulp).clamp(-fmt.max, fmt.max)
    hi = ((x / ulp).ceil() * ulp).clamp(-fmt.max, fmt.max)
    r = round_to(x, fmt, "stochastic", gen)
    assert ((r == lo) | (r == hi)).all()
