"""WAGEUBN: each fixed-point function on hand-computed cases, the layers, the optimizer, the hook.

The expected values are worked out by hand from the paper's equations (numbers in the comments).
"""

import uuid

import pytest
import torch
import torch.nn.functional as F
import torchvision
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

import repro
import repro.hooks  # noqa: F401  (registers Int8TrainingHook)
from kernels.errors import NonFiniteError
from repro.methods import build_method
from repro.methods.wageubn.fixed_point import CQ, QW, SQ, Q, R, Sd, dr_for, flag_qe2, norm, quantized_lr
from repro.methods.wageubn.norm_layers import QBatchNorm2d, QReLU
from repro.methods.wageubn.optim import FixedPointMomentum

T = torch.tensor


def on_grid(x: torch.Tensor, step: float) -> bool:
    v = x / step
    return bool(torch.equal(v, v.round()))


# ------------------------------------------------------------------------------------------ functions
def test_q_direct():
    assert torch.equal(Q(T([0.3]), 3), T([0.25]))  # round(1.2) / 4
    assert torch.equal(Q(T([0.05]), 10), T([26 / 512]))  # the paper's lr 26 x 2^-9
    assert torch.equal(Q(T([-0.126, 3.0]), 8), T([-16 / 128, 3.0]))  # no clip: 3.0 stays
    assert torch.equal(QW(T([3.0, -1.0, 0.5]), 8), T([127 / 128, -127 / 128, 0.5]))  # eq. 10 clips


def test_r_and_norm():
    assert R(T([0.3, -0.7])).item() == 0.5  # log2 0.7 = -0.51 -> -1
    assert R(T([3.0])).item() == 4.0  # log2 3 = 1.58 -> 2
    assert R(torch.zeros(3)).item() == 1.0
    assert torch.equal(norm(T([0.3, -0.7])), T([0.6, -1.4]))
    with pytest.raises(repro.NonFiniteError):  # a diverged run is recorded, not quantized
        R(T([1.0, float("nan")]))


def test_sd_stochastic_rounding_is_unbiased_and_clipped():
    gen = torch.Generator().manual_seed(0)
    x = T([1.0] + [0.3] * 20000)  # R = 1, dr * Norm = 128 and 38.4
    s = Sd(x, 128.0, gen)
    assert s[0].item() == 127  # clip to dr - 1
    rest = s[1:]
    assert set(rest.unique().tolist()) == {38.0, 39.0}
    assert rest.mean().item() == pytest.approx(38.4, abs=0.02)  # E[Sr(v)] = v (0.4 -> 39 w.p. 0.4)
    s64 = Sd(x, 64.0, gen)
    assert s64[0].item() == 63 and set(s64[1:].unique().tolist()) == {19.0, 20.0}


def test_cq_constant_scale():
    gen = torch.Generator().manual_seed(1)
    g = T([0.5, -0.25, 0.125]) * 1e-3  # R = 2^-11 (log2 5e-4 = -10.97)
    out = CQ(g, 128.0, k_gc=15, generator=gen)
    # Norm = [1.024, -0.512, 0.256] -> x128 = [131 -> 127, -65.5, 32.8] -> / 2^14
    assert out[0].item() == 127 / 2**14
    assert out[1].item() in (-66 / 2**14, -65 / 2**14)
    assert out[2].item() in (32 / 2**14, 33 / 2**14)
    assert on_grid(out, 2.0**-14) and out.abs().max() <= 127 / 2**14


def test_sq_shift():
    # R = 1; Q(., 8): 0.75 -> 96/128, 0.001 -> 0, -0.2 -> -26/128; 1.4 clips to 1 - 2^-7
    assert torch.equal(SQ(T([0.75, 0.001, -0.2]), 8), T([0.75, 0.0, -26 / 128]))
    assert SQ(T([1.4, 0.1]), 8)[0].item() == 127 / 128
    # the magnitude is kept: the same numbers times 2^-20
    assert torch.equal(SQ(T([0.75, -0.2]) * 2**-20, 8), T([0.75, -26 / 128]) * 2**-20)
    assert torch.equal(SQ(T([0.75, 0.001]), 16), T([0.75, round(0.001 * 2**15) / 2**15]))


def test_flag_qe2_paper_examples_and_range():
    # R = 1 (max = 127/128), Sc = R / 128
    x = T([-127 / 128, 2.0**-14, 1.2 * 2.0**-15, 0.8 * 2.0**-15, 0.3, 5 / 128])
    out = flag_qe2(x, 8)
    assert out[0].item() == -127 / 128  # -127 x Sc (Fig. 4b): integer branch, flag 1
    assert out[1].item() == 2.0**-14  # +Sc/128 (Fig. 4a): fractional branch, flag 0
    assert out[2].item() == 2.0**-14  # 1.2 x 2^-15 R rounds up to the smallest step
    assert out[3].item() == 0.0  # below 2^-15 R (half a step): zero
    assert out[4].item() == 38 / 128  # 0.3 / Sc = 38.4 -> 38 (integer branch)
    assert out[5].item() == 5 / 128
    # 8-bit SQ zeroes everything below 2^-8 R; the flag format covers down to about 2^-15 R (sec. IV-E)
    sq = SQ(x, 8)
    assert sq[1].item() == 0.0 and sq[2].item() == 0.0
    small = T([1.0, 0.003, 2.0**-10])
    assert torch.count_nonzero(flag_qe2(small, 8)) == 3 and torch.count_nonzero(SQ(small, 8)) == 1


def test_fixed_point_edges_clip_both_sides_and_take_the_papers_widths():
    # SQ clips the negative side at -1 + 2^-7 too
    assert torch.equal(SQ(T([-1.0, 0.5]), 8), T([-1 + 2.0**-7, 0.5]))
    # the integer branch clips at -127 Sc: R(-1) = 1, Sc = 1/128, -1 / Sc = -128 -> -127
    assert flag_qe2(T([-1.0, 0.25]), 8)[0].item() == -127 / 128
    # and at +127 Sc: R(1.2) = 2^round(0.26) = 1, 1.2 / Sc = 153.6 -> 154 -> 127
    assert flag_qe2(T([1.2, 0.25]), 8)[0].item() == 127 / 128
    # k = 8 by default; 1.5 Sc is in the integer branch and rounds to 2 Sc (half to even)
    x = T([1.0, 1.5 / 128])
    assert torch.equal(flag_qe2(x), flag_qe2(x, 8)) and flag_qe2(x)[1].item() == 2 / 128
    # CQ's k_GC is 15 by default: Sd(1, d_r = 128) = 127 -> 127 / 2^14
    assert CQ(T([1.0]), 128.0).item() == 127 / 2**14


def test_fixed_point_noise_repeats_for_a_seed_and_a_non_finite_input_raises():
    x = torch.randn(1000)
    a = CQ(x, 128.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, CQ(x, 128.0, generator=torch.Generator().manual_seed(3)))
    assert not torch.equal(a, CQ(x, 128.0, generator=torch.Generator().manual_seed(4)))
    with pytest.raises(NonFiniteError):  # the CPU's absmax names it; R's own check is for a GPU's
        R(T([1.0, float("inf")]))


def test_dr_schedule_follows_progress():
    m = build_method("wageubn")
    seen = []
    for it in (0, 29, 30, 59, 60, 89):  # a 90-"epoch" run of 90 iterations: the paper's stages
        m.set_progress(it, 90)
        seen.append(m.dr)
    assert seen == [128, 128, 64, 64, 32, 32]
    m.set_progress(2, 6)  # a short run changes d_r at 1/3 and 2/3
    assert m.dr == 64
    assert [dr_for(s) for s in (0, 1, 7, 9)] == [128, 64, 1, 1]


def test_quantized_lr():
    assert quantized_lr(0.05) == 26 / 512  # the paper's 0.05078125
    assert quantized_lr(0.0125) == 6 / 512
    assert quantized_lr(1.25e-4) == 1 / 512  # never below 2^-9 while lr > 0
    assert quantized_lr(0.0) == 0.0
    assert quantized_lr(5.0) == 511 / 512


# ------------------------------------------------------------------------------------------ optimizer
def test_fixed_point_momentum_by_hand():
    w = nn.Parameter(T([0.5]))
    f = nn.Parameter(T([1.0]))
    opt = FixedPointMomentum([{"params": [w, f], "lr": 0.05, "weight_decay": 0.1}], fixed_point=[w])
    lr = 26 / 512
    w.grad, f.grad = T([3 * 2.0**-14]), T([0.5])
    opt.step()
    # Acc_1 = g = 3 x 2^-14; update with the unquantized Acc_1; stored Acc = Q(Acc_1, 13) = 1/4096
    assert w.item() == 0.5 - lr * 3 * 2.0**-14
    assert opt.state[w]["momentum_buffer"].item() == 2.0**-12
    assert f.item() == pytest.approx(1.0 - lr * (0.5 + 0.1 * 1.0))  # float layer: SGD-momentum + decay
    w.grad, f.grad = T([2.0**-14]), T([0.0])
    opt.step()
    # Acc_2 = 0.75 x 4 x 2^-14 + 2^-14 = 4 x 2^-14; W = 0.5 - lr (3 + 4) 2^-14 = 0.5 - 182 x 2^-23, exact
    assert w.item() == 0.5 - 182 * 2.0**-23
    assert on_grid(w.detach(), 2.0**-23)


def test_fixed_point_momentum_takes_the_papers_rate_by_default_zero_momentum_and_refuses_a_negative():
    w = nn.Parameter(T([0.5]))
    opt = FixedPointMomentum([w], fixed_point=[w])  # lr 26 x 2^-9, the paper's 0.05078125
    w.grad = T([2.0**-10])
    opt.step()
    assert w.item() == 0.5 - 26 * 2.0**-19
    plain = FixedPointMomentum([w], fixed_point=[w], lr=2.0**-9, momentum=0)  # plain SGD on the grid
    for _ in range(2):
        plain.step()
    assert w.item() == 0.5 - 26 * 2.0**-19 - 2 * 2.0**-19
    with pytest.raises(ValueError, match=r"^momentum must be >= 0, got -0\.5$"):
        FixedPointMomentum([w], fixed_point=[w], momentum=-0.5)


def test_fixed_point_momentum_defaults_are_the_papers_bit_widths():
    # kAcc = 13: 2^-13 is half a step of the 2^-12 grid and rounds to 0 (half to even); kWU = 24: a weight
    # moved by 2^-24 is half a step of the 2^-23 grid and rounds back; a group without weight decay takes none
    a, b, f = nn.Parameter(T([0.5])), nn.Parameter(T([0.5])), nn.Parameter(T([1.0]))
    opt = FixedPointMomentum([{"params": [a, b, f], "lr": 2.0**-9}], fixed_point=[a, b])
    a.grad, b.grad, f.grad = T([2.0**-13]), T([2.0**-15]), T([0.5])
    opt.step()
    assert opt.state[a]["momentum_buffer"].item() == 0.0 and a.item() == 0.5 - 2.0**-22
    assert b.item() == 0.5 and f.item() == 1.0 - 2.0**-9 * 0.5
    assert opt.param_groups[0]["momentum"] == 0.75 and opt.param_groups[0]["weight_decay"] == 0.0


def test_the_paper_profile_takes_wageubns_recipe_and_dr_follows_progress():
    method = build_method("wageubn")
    assert method.recipe_overrides("paper") == {"lr": 0.05, "batch_size": 128}
    assert method.recipe_overrides("embedded") == {} and method.recipe_overrides("smoke") == {}
    stages = []
    for iteration, max_iters in [(0, 90), (29, 90), (30, 90), (60, 90), (90, 90), (1, 1), (5, 0)]:
        method.set_progress(iteration, max_iters)
        stages.append(method.dr)
    assert stages == [128.0, 128.0, 64.0, 32.0, 32.0, 32.0, 32.0]


# ------------------------------------------------------------------------------------------ layers
def _model(method="wageubn", **opts):
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1),
        nn.BatchNorm2d(4),
        nn.ReLU(inplace=True),
        nn.Conv2d(4, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        nn.Conv2d(6, 5, 1, bias=False),
        nn.Flatten(),
        nn.Linear(5 * 16, 3),
    )
    keys = list(model.state_dict())
    repro.quantize_model(model, method, **opts)
    assert list(model.state_dict()) == keys
    return model


def test_relu_quantizes_activation_and_e1():
    model = _model()
    relu = model[2]
    assert isinstance(relu, QReLU)
    x = T([-1.0, 0.3, 2.5001], requires_grad=True)
    y = relu(x)
    assert torch.equal(y, T([0.0, 38 / 128, 2.5]))  # Q(relu(x), 8), no clip at 127/128
    y.backward(T([0.5, 0.25, 0.001]))
    # SQ(e, 8): R = 0.5, Norm = [1, 0.5, 0.002] -> [127/128, 0.5, 0] x 0.5, then x relu'
    assert torch.equal(x.grad, T([0.0, 0.25, 0.0]))


def test_relu_passes_no_error_at_zero_as_torchs_relu():
    x = T([0.0, -0.0, 0.5], requires_grad=True)
    _model()[2](x).backward(T([1.0, 1.0, 0.25]))  # SQ: R = 1, 0.25 on its grid
    assert x.grad.tolist() == [0.0, 0.0, 0.25]


def test_batchnorm_matches_eq12_and_keeps_state():
    torch.manual_seed(0)
    model = _model()
    bn = model[4]
    assert isinstance(bn, QBatchNorm2d)
    with torch.no_grad():
        bn.weight.copy_(T([1.3, 0.7, 1.0, 0.9, 1.1, 0.2]))
        bn.bias.copy_(T([0.1, -0.2, 0.0, 0.3, 0.05, -0.01]))
    x = torch.randn(4, 6, 3, 3, requires_grad=True) * 2 + 1
    y = bn(x)
    mu = Q(x.mean((0, 2, 3)), 16)
    sigma = Q(x.var((0, 2, 3), correction=0).sqrt(), 16) + 2.0**-15
    x_hat = Q((x - mu.view(1, -1, 1, 1)) / sigma.view(1, -1, 1, 1), 16)
    want = Q(bn.weight, 8).view(1, -1, 1, 1) * x_hat + Q(bn.bias, 8).view(1, -1, 1, 1)
    torch.testing.assert_close(y, want, rtol=0, atol=1e-6)
    (y * torch.randn_like(y)).sum().backward()
    assert on_grid(bn.weight.grad, 2.0**-14) and on_grid(bn.bias.grad, 2.0**-14)  # Q(., 15)
    assert bn.num_batches_tracked.item() == 1 and not torch.equal(bn.running_mean, torch.zeros(6))
    bn.eval()
    y_eval = bn(x)
    sigma_e = Q(bn.running_var.sqrt(), 16) + 2.0**-15
    x_hat_e = Q((x - Q(bn.running_mean, 16).view(1, -1, 1, 1)) / sigma_e.view(1, -1, 1, 1), 16)
    want_e = Q(bn.weight, 8).view(1, -1, 1, 1) * x_hat_e + Q(bn.bias, 8).view(1, -1, 1, 1)
    torch.testing.assert_close(y_eval, want_e, rtol=0, atol=1e-6)
    bn.track_running_stats = False  # switched off with the buffers kept: torch's rule still uses them
    torch.testing.assert_close(bn(x), want_e, rtol=0, atol=1e-6)
    torch.testing.assert_close(bn.observe_forward((x,), y_eval)["BN"][1], x_hat_e, rtol=0, atol=1e-6)


def test_conv_quantizes_w_forward_e2_and_gw_backward():
    torch.manual_seed(0)
    model = _model()
    conv = model[3]
    x = Q(torch.rand(2, 4, 4, 4) * 3, 8)  # an activation on its grid
    y = conv(x)
    wq = QW(conv.weight.detach(), 8)
    torch.testing.assert_close(y, F.conv2d(x, wq, padding=1), rtol=0, atol=1e-6)
    xg = x.clone().requires_grad_()
    gy = torch.randn_like(y) * 1e-3
    conv(xg).backward(gy)
    e3 = flag_qe2(gy, 8)
    torch.testing.assert_close(xg.grad, torch.nn.grad.conv2d_input(x.shape, wq, e3, padding=1))
    gw = conv.weight.grad
    assert on_grid(gw, 2.0**-14) and gw.abs().max().item() == 127 / 2**14  # CQ, d_r = 128
    # the float first and last layers stay float
    assert type(model[0]) is nn.Conv2d and type(model[8]) is nn.Linear


def test_e2_16_uses_shift_quantization():
    torch.manual_seed(0)
    conv = _model("wageubn-e2-16")[3]
    x = Q(torch.rand(2, 4, 4, 4), 8).requires_grad_()
    y = conv(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    wq = QW(conv.weight.detach(), 8)
    want = torch.nn.grad.conv2d_input(x.shape, wq, SQ(gy, 16), padding=1)
    torch.testing.assert_close(x.grad, want)


@pytest.mark.parametrize("part", ["W", "BN", "A", "GW", "E1", "E2"])
def test_quantize_only_turns_on_one_path(part):
    method = build_method("wageubn", quantize_only=part)
    swaps = set(method.module_swaps())
    assert (nn.BatchNorm2d in swaps) == (part == "BN")
    assert (nn.ReLU in swaps) == (part in ("A", "E1"))
    assert method.parts == {part}
    assert method.make_optimizer(nn.Linear(2, 2), torch.optim.SGD([nn.Parameter(torch.ones(1))])) is None
    if part == "BN":  # Table II's label kBN = 8; gamma's and beta's gradients stay float (GW is its own row)
        assert method.bn_quant.k_bn == 8 and method.bn_quant.k_grad is None


def test_bad_option_is_one_clear_error():
    with pytest.raises(ValueError, match="quantize_only must be one of W, BN, A, GW, E1, E2"):
        build_method("wageubn", quantize_only="G")
    with pytest.raises(ValueError, match="^e2 must be one of flag8, shift16, shift8, got 'flag9'$"):
        build_method("wageubn", e2="flag9")


def test_resnet18_training_step_all_paths():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    method = build_method("wageubn")
    repro.quantize_model(model, method)
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    assert all(isinstance(m, QBatchNorm2d) for m in bns) and isinstance(model.relu, QReLU)
    opt = method.make_optimizer(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    assert isinstance(opt, FixedPointMomentum) and opt.param_groups[0]["momentum"] == 0.75
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    w = model.layer2[0].conv1.weight
    assert on_grid(w.grad, 2.0**-14)  # CQ
    assert on_grid(model.layer2[0].bn1.weight.grad, 2.0**-14)  # Q(., 15)
    opt.step()
    assert torch.isfinite(loss)
    assert on_grid(w.detach(), 2.0**-23) and not torch.equal(w, before["layer2.0.conv1.weight"])
    assert on_grid(opt.state[w]["momentum_buffer"], 2.0**-12)  # Q(Acc, 13)
    assert not torch.equal(model.fc.weight, before["fc.weight"])


# ------------------------------------------------------------------------------------------ the hook
class BnNet(BaseModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4),
        )  # fmt: skip

    def forward(self, inputs, labels, mode="tensor"):
        logits = self.net(inputs)
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels)}
        return logits


class Blobs(Dataset):
    def __init__(self, n=32):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 6, 6, generator=gen)
        self.y = torch.arange(n) % 4

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "labels": self.y[i]}


def _runner(work_dir, max_iters, **kwargs):
    return Runner(
        model=BnNet(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=Blobs(),
            sampler=dict(type="DefaultSampler", shuffle=True),
            batch_size=8,
            num_workers=0,
            collate_fn=dict(type="default_collate"),
        ),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        param_scheduler=dict(type="MultiStepLR", milestones=[3], by_epoch=False),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False)),
        custom_hooks=[dict(type="Int8TrainingHook", method="wageubn")],
        randomness=dict(seed=0),
        default_scope="mmengine",
        experiment_name=f"wageubn-hook-{uuid.uuid4().hex[:8]}",
        **kwargs,
    )


def test_hook_installs_optimizer_and_resumes(tmp_path):
    runner = _runner(tmp_path, 4)
    runner.train()
    opt = runner.optim_wrapper.optimizer
    assert isinstance(opt, FixedPointMomentum)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.005)  # the scheduler still drives the lr
    saved = torch.load(tmp_path / "iter_2.pth", weights_only=True)
    resumed = _runner(tmp_path, 2, resume=True, load_from=str(tmp_path / "iter_2.pth"))
    resumed.train()  # resumes at iteration 2 of 2: nothing to train, state as saved
    ropt = resumed.optim_wrapper.optimizer
    assert isinstance(ropt, FixedPointMomentum)
    want = saved["optimizer"]["state"]
    got = ropt.state_dict()["state"]
    assert sorted(got) == sorted(want)
    for k in want:
        torch.testing.assert_close(got[k]["momentum_buffer"], want[k]["momentum_buffer"])


# ------------------------------------------------------------------------- in place, the same bits
def _spread(seed: int) -> torch.Tensor:
    """Values over 60 binades with ties on the 2^-7 and 2^-15 grids and zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4096, generator=g) * torch.logspace(-50, 10, 4096, base=2)
    x[:64] = (torch.arange(64) + 0.5) * 2.0**-7
    x[64:128] = -(torch.arange(64) + 0.5) * 2.0**-15
    x[128:136] = 0.0
    return x


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_fixed_point_functions_give_the_bits_of_their_plain_expressions(seed):
    """fixed_point.py works in place on its own temporaries; the values are those of the equations written
    as plain torch expressions (a new tensor per step), bit for bit, and CQ draws the same noise."""
    x = _spread(seed)
    r = torch.exp2(torch.round(torch.log2(x.abs().max())))
    for k in (8, 15, 16):
        n = 2.0 ** (k - 1)
        assert torch.equal(_bits(Q(x, k)), _bits(torch.round(x * n) / n))
        plain_sq = r * (torch.round((x / r) * n) / n).clamp(-1 + 2.0 ** -(k - 1), 1 - 2.0 ** -(k - 1))
        assert torch.equal(_bits(SQ(x, k)), _bits(plain_sq))
    sc = r / 2.0**7
    v = x / sc
    plain_flag = sc * torch.where(v.abs() >= 1, torch.round(v).clamp(-127, 127), torch.round(v * 128) / 128)
    assert torch.equal(_bits(flag_qe2(x, 8)), _bits(plain_flag))
    dr = 64.0
    noise = torch.rand(x.shape, generator=torch.Generator().manual_seed(5))
    plain_cq = torch.floor(dr * (x / r) + noise).clamp(-dr + 1, dr - 1) / 2.0**14
    assert torch.equal(_bits(CQ(x, dr, generator=torch.Generator().manual_seed(5))), _bits(plain_cq))


def test_the_optimizer_in_place_gives_the_bits_of_its_plain_expressions():
    x = _spread(2)
    w = nn.Parameter(x.clone())
    opt = FixedPointMomentum([{"params": [w], "lr": 0.05}], fixed_point=[w])
    want, acc_q, lr = x.clone(), None, 26 / 512
    for step in range(3):
        g = _spread(10 + step) * 2.0**-10
        w.grad = g.clone()
        opt.step()
        acc = g.clone() if acc_q is None else acc_q * 0.75 + g  # eq. 20-23 as written
        acc_q = torch.round(acc * 2.0**12) / 2.0**12
        want = torch.round((want - lr * acc) * 2.0**23) / 2.0**23
        assert torch.equal(_bits(w.detach()), _bits(want))
        assert torch.equal(_bits(opt.state[w]["momentum_buffer"]), _bits(acc_q))
