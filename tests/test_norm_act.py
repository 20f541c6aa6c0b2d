"""BatchNorm fused with its activation and the int8 codes around it (kernels.cpu.norm, repro.norm_act):
the same values as torch's BatchNorm and ReLU / ReLU6 (up to the order of float sums), codes and scales
bit-equal to the quantizer's own, and facts dropped when their tensor changes."""

import copy
import math
import types

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn
from torchvision.models.regnet import ResBottleneckBlock
from torchvision.models.resnet import BasicBlock, Bottleneck

import kernels.cpu as cpu
from kernels.cpu import known, quantizer, runtime
from kernels.errors import NonFiniteError
from repro.layers import quantize_model
from repro.norm_act import (
    FoldedReLU,
    FusedBasicBlock,
    FusedBatchNorm2d,
    FusedBottleneck,
    FusedResBottleneckBlock,
    ResidualBatchNorm2d,
    fuse_norm_activations,
)

pytestmark = pytest.mark.skipif(not runtime.available(), reason="the native library is not built here")

BOUNDS = {"relu6": (0.0, 6.0), "relu": (0.0, math.inf), "none": (-math.inf, math.inf)}


def _input(channels=20, shift=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    # channels not a multiple of 8 (the vector loops' tails), a mean far from 0 in one channel
    x = torch.randn(4, channels, 5, 7, generator=g) * 3 + shift
    x[:, 0] += 1000.0
    return x.contiguous(memory_format=torch.channels_last)


def _torch_norm_act(x, w, b, act):
    y = F.batch_norm(x, None, None, w, b, True, 0.1, 1e-5)
    lo, hi = BOUNDS[act]
    return y if act == "none" else (F.relu(y) if hi == math.inf else F.hardtanh(y, lo, hi))


@pytest.mark.parametrize("act", list(BOUNDS))
@pytest.mark.parametrize("affine", [True, False])
def test_forward_and_backward_match_torch(act, affine):
    x = _input()
    c = x.shape[1]
    # seeded: the float32 error in the channel of mean 1000 scales with its |w|, set to 1 there (the global
    # generator, in a random test order, once drew a w over the tolerance)
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(c, generator=gen) if affine else None
    b = torch.randn(c, generator=gen) if affine else None
    if affine:
        w[0] = 1.0
        w[1] = -w[1].abs()  # a negative scale: y falls as x rises
    y, var, saved = cpu.norm_act_forward(x, w, b, 1e-5, *BOUNDS[act])
    # against float64 (torch's float32 BatchNorm is off by 5e-5 in the channel of mean 1000, as ours)
    xr = x.double().requires_grad_()
    params = (
        [] if not affine else [w.detach().double().requires_grad_(), b.detach().double().requires_grad_()]
    )
    ref = _torch_norm_act(xr, *(params or [None, None]), act)
    assert y.stride() == x.stride()
    torch.testing.assert_close(y.double(), ref.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(var, x.double().var(dim=(0, 2, 3), unbiased=False), rtol=1e-5, atol=1e-6)

    # seeded too: the weight's gradient in that channel sums g against x's float32 rounding (the global
    # generator, in a random test order, once drew a g that put it 1.8e-4 off: make test seed 15869)
    g = torch.randn(x.shape, generator=gen).contiguous(memory_format=torch.channels_last)
    gx, gw, gb = cpu.norm_act_backward(g, x, w, saved)
    grads = torch.autograd.grad(ref, [xr, *params], g.double())
    torch.testing.assert_close(gx.double(), grads[0], rtol=1e-4, atol=1e-5)
    if affine:
        torch.testing.assert_close(gw.double(), grads[1], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(gb.double(), grads[2], rtol=1e-5, atol=1e-4)


def test_outputs_larger_than_the_caches_are_written_whole():
    """y and gx of 4 MB and more go out by non-temporal stores (csrc/norm.cpp): every value still lands,
    y bit for bit clamp(x a + b) from the kept coefficients, gx as float64's."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(66, 16, 32, 32, generator=gen).contiguous(memory_format=torch.channels_last)
    w, b = torch.rand(16, generator=gen) + 0.5, torch.randn(16, generator=gen)
    y, _, saved = cpu.norm_act_forward(x, w, b, 1e-5, 0.0, 6.0)
    per_channel = (1, -1, 1, 1)
    assert torch.equal(y, (x * saved.a.reshape(per_channel) + saved.b.reshape(per_channel)).clamp(0.0, 6.0))
    g = torch.randn(x.shape, generator=gen).contiguous(memory_format=torch.channels_last)
    gx, _, _ = cpu.norm_act_backward(g, x, w, saved)
    xr = x.double().requires_grad_()
    ref = _torch_norm_act(xr, w.double(), b.double(), "relu6")
    (want,) = torch.autograd.grad(ref, [xr], g.double())
    torch.testing.assert_close(gx.double(), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("act", list(BOUNDS))
def test_forward_codes_and_scale_are_the_quantizers(act):
    """The codes written with y, and s = max|y| found before y existed, bit for bit what the quantizer
    gives for y (a copy of y: the quantizer knows nothing of it)."""
    x = _input(channels=17, seed=1)
    w, b = torch.randn(17), torch.randn(17)
    w[3] = -2.0
    y, _, _ = cpu.norm_act_forward(x, w, b, 1e-5, *BOUNDS[act])
    q, s = cpu.absmax_quantize(y)  # from what was kept
    assert q is known.recall(y).codes  # taken as written, not quantized again
    q_fresh, s_fresh = cpu.absmax_quantize(y.clone())
    assert s.item() == s_fresh.item() == y.abs().max().item()
    assert torch.equal(q, q_fresh)
    assert cpu.absmax(y).item() == s_fresh.item()


def test_backward_facts_are_the_quantizers():
    x = _input(seed=2)
    w, b = torch.randn(20), torch.randn(20)
    _, _, saved = cpu.norm_act_forward(x, w, b, 1e-5, 0.0, 6.0)
    g = torch.randn(x.shape).contiguous(memory_format=torch.channels_last)
    gx, _, _ = cpu.norm_act_backward(g, x, w, saved)
    assert known.recall(gx) is not None  # the quantizer below reads these, not gx
    fresh = gx.clone()
    assert torch.equal(cpu.absmax(gx, 1), cpu.absmax(fresh, 1))
    assert cpu.absmax(gx).item() == cpu.absmax(fresh).item()
    for axis in (1, None):
        amax, sigma = cpu.channel_stats(gx, axis)
        amax_f, sigma_f = cpu.channel_stats(fresh, axis)
        assert torch.equal(amax, amax_f)
        torch.testing.assert_close(sigma, sigma_f, rtol=1e-5, atol=1e-7)
    # the kernel's own standard deviation is the quantizer's formula on the kernel's sums, bit for bit
    facts = known.recall(gx)
    n = gx.numel() // gx.shape[1]
    assert torch.equal(facts.channel_std, quantizer._sigma(*facts.channel_sums, n))
    gen = [torch.Generator().manual_seed(5) for _ in range(2)]
    q, s = cpu.absmax_quantize(gx, rounding="stochastic", generator=gen[0])
    q_f, s_f = cpu.absmax_quantize(fresh, rounding="stochastic", generator=gen[1])
    assert s.item() == s_f.item() and torch.equal(q, q_f)


PER_CHANNEL = (1, -1, 1, 1)


@pytest.mark.parametrize("act", list(BOUNDS))
def test_bfloat16_forward_stores_the_float32_values_rounded(act):
    """A bfloat16 x: the statistics the float32 kernel finds for the same values, y bit for bit
    bf16(clamp(x a + b)), and the codes and scale the quantizer gives for that bfloat16 y."""
    x = _input(seed=6).bfloat16()
    gen = torch.Generator().manual_seed(6)
    w, b = torch.randn(20, generator=gen), torch.randn(20, generator=gen) + 2.0
    y, var, saved = cpu.norm_act_forward(x, w, b, 1e-5, *BOUNDS[act])
    assert y.dtype == torch.bfloat16 and y.stride() == x.stride()
    _, var32, saved32 = cpu.norm_act_forward(x.float(), w, b, 1e-5, *BOUNDS[act])
    assert torch.equal(var, var32) and torch.equal(saved.a, saved32.a) and torch.equal(saved.b, saved32.b)
    z = x.float() * saved.a.reshape(PER_CHANNEL) + saved.b.reshape(PER_CHANNEL)
    assert torch.equal(y, z.clamp(*BOUNDS[act]).bfloat16())
    q, s = cpu.absmax_quantize(y)
    assert q is known.recall(y).codes
    q_fresh, s_fresh = cpu.absmax_quantize(y.clone())
    assert s.item() == s_fresh.item() and torch.equal(q, q_fresh)


def test_bfloat16_backward_masks_by_the_stored_output():
    """ReLU6 passes no gradient where the bfloat16 y holds 6, though x a + b is below 6 in float32 (torch's
    ReLU6 sees the rounded value); gx is float64 BatchNorm's gradient of g so masked, rounded to bfloat16,
    and its facts are the quantizer's for that bfloat16 gx."""
    x = _input(seed=7).bfloat16()
    w, b = torch.ones(20), torch.full((20,), 6.0)  # a third of the outputs within a few spacings of 6
    y, _, saved = cpu.norm_act_forward(x, w, b, 1e-5, 0.0, 6.0)
    z = x.float() * saved.a.reshape(PER_CHANNEL) + saved.b.reshape(PER_CHANNEL)
    assert ((z < 6.0) & (y == 6.0)).sum() >= 5  # the cases this test is about
    g = torch.randn(x.shape, generator=torch.Generator().manual_seed(7)).bfloat16()
    g = g.contiguous(memory_format=torch.channels_last)
    gx, gw, gb = cpu.norm_act_backward(g, x, w, saved)
    assert gx.dtype == torch.bfloat16 and gx.stride() == x.stride() and gw.dtype == torch.float32
    xr, wr, br = (t.double().requires_grad_() for t in (x, w, b))
    ref = F.batch_norm(xr, None, None, wr, br, True, 0.1, 1e-5)
    want = torch.autograd.grad(ref, [xr, wr, br], g.double() * ((y > 0) & (y < 6)))
    torch.testing.assert_close(gx.double(), want[0], rtol=1e-2, atol=2e-3)
    torch.testing.assert_close(gw.double(), want[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gb.double(), want[2], rtol=1e-5, atol=1e-4)
    fresh = gx.clone()
    for axis in (1, None):
        amax, sigma = cpu.channel_stats(gx, axis)
        amax_f, sigma_f = cpu.channel_stats(fresh, axis)
        assert torch.equal(amax, amax_f)
        torch.testing.assert_close(sigma, sigma_f, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels, kept", [(32, 24), (17, 16), (48, 40)])
def test_a_channels_values_do_not_depend_on_how_many_channels_share_a_vector(dtype, channels, kept):
    """Each channel's arithmetic is its own: the first `kept` channels of a wider tensor give bit for bit
    what they give alone, although the two widths take different loops (16 lanes where C is a multiple
    of 16 on AVX-512, else 8 lanes, and a scalar tail). Small enough for one thread: the threads' split of
    the rows, which depends on the size, sets the order of the float sums."""
    gen = torch.Generator().manual_seed(channels)
    x = (torch.randn(5, channels, 6, 7, generator=gen) * 2 + 1).to(dtype)
    g = torch.randn(x.shape, generator=gen).to(dtype)
    w, b = torch.randn(channels, generator=gen), torch.randn(channels, generator=gen) + 2
    results = []
    for c in (channels, kept):
        xc, gc = (t[:, :c].contiguous(memory_format=torch.channels_last) for t in (x, g))
        running = (torch.zeros(c), torch.ones(c))
        y, var, saved = cpu.norm_act_forward(xc, w[:c], b[:c], 1e-5, 0.0, 6.0, running, 0.1)
        gx, gw, gb = cpu.norm_act_backward(gc, xc, w[:c], saved)
        facts = known.recall(gx)
        stats = [var, saved.mean, saved.a, saved.b, gw, gb, *running]
        results.append(([y, gx], [*stats, facts.channel_max, facts.channel_std, *facts.channel_sums]))
    (maps, vectors), (maps_kept, vectors_kept) = results
    for t, t_kept in zip(maps, maps_kept, strict=True):
        assert torch.equal(t[:, :kept], t_kept)
    for t, t_kept in zip(vectors, vectors_kept, strict=True):
        assert torch.equal(t[:kept], t_kept)


@pytest.mark.parametrize("bias, weight", [(6.0, 1e-3), (0.0, 1e-41)])
def test_bfloat16_mask_bounds_at_6_and_at_0(bias, weight):
    """The bfloat16 mask at its two edges: outputs just below 6 that bfloat16 holds as 6, and subnormal
    outputs above 0 that bfloat16 holds as 0 (below 2^-134). ReLU6 passes no gradient there, so the bias's
    gradient is the sum of g where the stored y is strictly inside (0, 6)."""
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(4, 16, 5, 5, generator=gen).bfloat16().contiguous(memory_format=torch.channels_last)
    w, b = torch.full((16,), weight), torch.full((16,), bias)
    y, _, saved = cpu.norm_act_forward(x, w, b, 1e-5, 0.0, 6.0)
    z = x.float() * saved.a.reshape(PER_CHANNEL) + saved.b.reshape(PER_CHANNEL)
    inside = (y > 0) & (y < 6)
    assert (((z > 0) & (z < 6)) != inside).sum() > 50  # a float32 mask would differ here
    g = torch.randn(x.shape, generator=gen).bfloat16().contiguous(memory_format=torch.channels_last)
    _, _, gb = cpu.norm_act_backward(g, x, w, saved)
    want = (g.double() * inside).sum(dim=(0, 2, 3))
    torch.testing.assert_close(gb.double(), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels", [20, 32])
def test_residual_forward_and_backward(dtype, channels):
    """With a residual r: y = relu(round(round(x a + b) + r)) bit for bit from the kept coefficients (torch
    rounds the BatchNorm's output and the sum to the tensors' dtype), its scale the quantizer's (which
    then writes the codes once, for both convolutions that read y), r's gradient g where the stored y > 0,
    and gx float64 BatchNorm's gradient of that masked g. 20 channels: 8 lanes and a tail; 32: 16 lanes."""
    gen = torch.Generator().manual_seed(channels)
    x = _input(channels, seed=channels).to(dtype)
    r = (torch.randn(x.shape, generator=gen) * 2).to(dtype).contiguous(memory_format=torch.channels_last)
    w, b = torch.randn(channels, generator=gen), torch.randn(channels, generator=gen)
    assert cpu.norm_act_residual_supported(x, r) and not cpu.norm_act_residual_supported(
        x, r.float().bfloat16()[:, :, :, :1]
    )
    other = torch.float32 if dtype == torch.bfloat16 else torch.bfloat16
    assert not cpu.norm_act_residual_supported(x, r.to(other))  # another dtype
    assert not cpu.norm_act_residual_supported(x, r.contiguous())  # NCHW: the strides differ
    y, var, saved = cpu.norm_act_forward(x, w, b, 1e-5, 0.0, math.inf, None, 0.0, r)
    _, var_plain, saved_plain = cpu.norm_act_forward(x, w, b, 1e-5, 0.0, math.inf)
    assert torch.equal(var, var_plain) and torch.equal(saved.a, saved_plain.a)  # the same statistics
    t = (x.float() * saved.a.reshape(PER_CHANNEL) + saved.b.reshape(PER_CHANNEL)).to(dtype)
    assert y.dtype == dtype and y.stride() == x.stride()
    assert torch.equal(y, (t.float() + r.float()).to(dtype).clamp_min(0.0))
    facts = known.recall(y)
    assert facts.codes is None and facts.scale.item() == y.abs().max().item()
    q, s = cpu.absmax_quantize(y)
    q_fresh, s_fresh = cpu.absmax_quantize(y.clone())
    assert s.item() == s_fresh.item() and torch.equal(q, q_fresh)
    assert cpu.absmax_quantize(y)[0] is q  # the second reader takes the codes the first one wrote

    rows = y.permute(0, 2, 3, 1).reshape(-1, channels)  # the backward pass reads y's mask as bits, not y
    bits = np.unpackbits(saved.mask.numpy(), axis=1, bitorder="little")[:, :channels]
    assert saved.mask.shape == (rows.shape[0], (channels + 7) // 8)
    assert np.array_equal(bits, (rows > 0).numpy().astype(np.uint8))

    g = torch.randn(x.shape, generator=gen).to(dtype).contiguous(memory_format=torch.channels_last)
    gx, gw, gb, gr = cpu.norm_act_residual_backward(g, x, w, saved)
    assert gr.dtype == gx.dtype == dtype and gr.stride() == gx.stride() == x.stride()
    assert torch.equal(gr, g * (y > 0))
    xr, wr, br = (v.double().requires_grad_() for v in (x, w, b))
    ref = F.batch_norm(xr, None, None, wr, br, True, 0.1, 1e-5)
    want = torch.autograd.grad(ref, [xr, wr, br], gr.double())
    loose = dtype == torch.bfloat16
    torch.testing.assert_close(
        gx.double(), want[0], rtol=1e-2 if loose else 1e-4, atol=2e-3 if loose else 1e-5
    )
    torch.testing.assert_close(gw.double(), want[1], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(gb.double(), want[2], rtol=1e-5, atol=1e-4)
    fresh = gx.clone()
    assert torch.equal(cpu.absmax(gx, 1), cpu.absmax(fresh, 1))


def test_a_non_finite_residual_raises():
    """A NaN in r: the ReLU's clamp would turn it into 0; the sums of the sum before it find it."""
    x = _input(seed=8)
    r = torch.zeros_like(x)
    r[2, 5, 1, 3] = math.nan
    running = (torch.zeros(x.shape[1]), torch.ones(x.shape[1]))
    with pytest.raises(NonFiniteError):
        cpu.norm_act_forward(x, None, None, 1e-5, 0.0, math.inf, running, 0.1, r)
    assert torch.equal(running[0], torch.zeros(x.shape[1])) and torch.equal(
        running[1], torch.ones(x.shape[1])
    )


def test_a_changed_tensor_loses_its_facts():
    x = _input(seed=3)
    y, _, _ = cpu.norm_act_forward(x, None, None, 1e-5, -math.inf, math.inf)
    assert known.recall(y) is not None
    y.mul_(2.0)
    assert known.recall(y) is None
    q, s = cpu.absmax_quantize(y)
    assert s.item() == y.abs().max().item()
    assert known.recall(y.view_as(y)) is None  # another tensor object over the same memory


def test_non_finite_input_raises():
    x = _input(seed=4)
    x[1, 2, 3, 4] = math.nan
    with pytest.raises(NonFiniteError):
        cpu.norm_act_forward(x, None, None, 1e-5, 0.0, 6.0)


def _block():
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU6(inplace=True),
        nn.Conv2d(16, 16, 3, padding=1, groups=16, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
        nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8),
        nn.Conv2d(8, 8, 1), nn.Flatten(), nn.Linear(8 * 36, 4),
    )  # fmt: skip


def test_quantize_model_fuses_sequential_norm_activations_and_keeps_state_dict():
    model = _block()
    keys = list(model.state_dict())
    quantize_model(model, "gq")
    kinds = [type(m).__name__ for m in model]
    assert kinds[1:3] == ["FusedBatchNorm2d", "FoldedReLU6"]
    assert kinds[4:6] == ["FusedBatchNorm2d", "FoldedReLU"]
    assert kinds[7] == "BatchNorm2d"  # no activation after it
    assert list(model.state_dict()) == keys
    quantize_model(model, "gq", fuse_norm=False)
    assert [type(m).__name__ for m in model][1:3] == ["BatchNorm2d", "ReLU6"]
    quantize_model(model, "wageubn")  # swaps BatchNorm itself
    assert not any(isinstance(m, FusedBatchNorm2d) for m in model.modules())


@pytest.mark.parametrize(
    "channels_last, momentum, strided_stats",
    [(True, 0.1, False), (False, 0.1, False), (True, None, False), (True, 0.3, True)],
)
def test_a_fused_module_trains_and_evaluates_as_torchs(channels_last, momentum, strided_stats):
    """Training (fused on channels-last input, torch's own path on NCHW) and evaluation: the values,
    gradients and running statistics of BatchNorm2d + ReLU6. The fused kernel moves the running statistics
    itself (momentum None: the cumulative average), or leaves them to update_running_stats where they are
    not contiguous float32 vectors."""
    torch.manual_seed(0)
    ref = nn.Sequential(nn.BatchNorm2d(12, momentum=momentum), nn.ReLU6())
    if strided_stats:
        ref[0].running_mean = torch.zeros(24)[::2]
        ref[0].running_var = torch.ones(24)[::2]
    fused = copy.deepcopy(ref)
    quantize_model(fused, "gq")
    assert isinstance(fused[0], FusedBatchNorm2d)
    with torch.no_grad():
        for m in (ref, fused):
            m[0].weight.copy_(torch.linspace(-1, 2, 12))
            m[0].bias.copy_(torch.linspace(-0.5, 3, 12))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    for _ in range(3):
        x = (torch.randn(6, 12, 4, 5) * 2 + 0.5).contiguous(memory_format=fmt)
        outs = []
        for m in (ref, fused):
            xi = x.clone().requires_grad_()
            y = m(xi)
            y.backward(torch.ones_like(y))
            outs.append((y.detach(), xi.grad))
        torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(outs[1][1], outs[0][1], rtol=1e-3, atol=1e-5)
    assert (fused[0].running_stats_for_kernel()[0] is None) == strided_stats
    for name, buf in ref[0].named_buffers():
        torch.testing.assert_close(getattr(fused[0], name), buf, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused[0].weight.grad, ref[0].weight.grad, rtol=1e-3, atol=1e-4)
    ref.eval(), fused.eval()
    x = torch.randn(2, 12, 4, 5).contiguous(memory_format=fmt)
    torch.testing.assert_close(fused(x), ref(x), rtol=1e-5, atol=1e-6)


def test_a_fused_module_under_bf16_autocast_trains_as_torchs():
    """Under bf16 autocast the int8 convolutions hand BatchNorm bfloat16: the fused kernel takes it and gives
    torch's bfloat16 values, gradients and running statistics, to bfloat16's precision."""
    torch.manual_seed(1)
    ref = nn.Sequential(nn.BatchNorm2d(12), nn.ReLU6())
    fused = quantize_model(copy.deepcopy(ref), "gq")
    for m in (ref, fused):
        with torch.no_grad():
            m[0].weight.copy_(torch.linspace(-1, 2, 12))
            m[0].bias.copy_(torch.linspace(-0.5, 3, 12))
    for _ in range(2):
        x = (torch.randn(6, 12, 4, 5) * 2 + 0.5).bfloat16().contiguous(memory_format=torch.channels_last)
        outs = []
        for m in (ref, fused):
            xi = x.clone().requires_grad_()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = m(xi)
            assert (known.recall(y) is not None) == (m is fused)  # the kernel kept y's codes: it ran
            y.float().backward(torch.ones(y.shape))
            outs.append((y.detach(), xi.grad))
        assert outs[1][0].dtype == outs[1][1].dtype == torch.bfloat16
        torch.testing.assert_close(outs[1][0], outs[0][0], rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(outs[1][1], outs[0][1], rtol=2e-2, atol=2e-2)
    for name, buf in ref[0].named_buffers():
        torch.testing.assert_close(getattr(fused[0], name), buf, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(fused[0].weight.grad, ref[0].weight.grad, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name, fused, blocks", [("resnet18", 9, 8), ("resnet50", 33, 16)])
def test_quantize_model_fuses_resnet_blocks_and_keeps_state_dict(name, fused, blocks):
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, num_classes=4)
    keys = list(model.state_dict())
    quantize_model(model, "gq")
    assert sum(isinstance(m, FusedBatchNorm2d) for m in model.modules()) == fused
    assert sum(isinstance(m, ResidualBatchNorm2d) for m in model.modules()) == blocks
    block = model.layer1[0]
    assert type(block) in (FusedBasicBlock, FusedBottleneck) and type(block.relu) is nn.ReLU
    assert type(block.bn1) is FusedBatchNorm2d
    assert type(model.bn1) is FusedBatchNorm2d and type(model.relu) is FoldedReLU  # the stem's
    assert list(model.state_dict()) == keys
    quantize_model(model, "gq", fuse_norm=False)
    assert type(model.layer1[0]) in (BasicBlock, Bottleneck) and type(model.relu) is nn.ReLU
    assert not any(isinstance(m, (FusedBatchNorm2d, ResidualBatchNorm2d)) for m in model.modules())


def test_quantize_model_fuses_regnet_blocks_and_keeps_state_dict():
    """RegNet's blocks: the transform's inner BatchNorms apply their ReLUs (Conv2dNormActivation), its last
    takes the sum with the shortcut and the ReLU after it; fuse_norm=False gives every class back."""
    torch.manual_seed(0)
    model = torchvision.models.regnet_y_400mf(num_classes=4)
    keys = list(model.state_dict())
    quantize_model(model, "gq")
    blocks = [m for m in model.modules() if isinstance(m, ResBottleneckBlock)]
    assert blocks and all(type(b) is FusedResBottleneckBlock for b in blocks)
    assert all(type(b.f.c[1]) is ResidualBatchNorm2d and type(b.f.b[1]) is FusedBatchNorm2d for b in blocks)
    assert all(type(b.activation) is nn.ReLU for b in blocks)
    assert list(model.state_dict()) == keys
    quantize_model(model, "gq", fuse_norm=False)
    assert all(type(m) is ResBottleneckBlock for m in model.modules() if isinstance(m, ResBottleneckBlock))
    assert not any(isinstance(m, (FusedBatchNorm2d, ResidualBatchNorm2d)) for m in model.modules())


def _regnet_block(shortcut: str, se: bool) -> nn.Module:
    """A RegNet block of 16 channels in groups of 8: a projection (stride 2, 32 out) or the identity."""
    out, stride = (32, 2) if shortcut == "downsample" else (16, 1)
    return ResBottleneckBlock(16, out, stride, nn.BatchNorm2d, nn.ReLU, 8, 1.0, 0.25 if se else None)


@pytest.mark.parametrize("block", ["basic", "bottleneck", "regnet", "regnet-se"])
@pytest.mark.parametrize("shortcut", ["downsample", "identity"])
def test_a_fused_resnet_block_trains_as_torchs(block, shortcut, monkeypatch):
    """The fused block's forward is torchvision's with the inner ReLUs inside the BatchNorms and the last
    BatchNorm, the sum and the ReLU in one op: the same values, gradients and running statistics, with a
    downsampling shortcut or none, through the kernels; ResNet's blocks and RegNet's, with and without
    squeeze-excitation. The float sums run in another order than torch's:
    each tensor is as close to the float64 block's as torch's float32 one is (within 3x)."""
    torch.manual_seed(0)
    if block.startswith("regnet"):
        ref = _regnet_block(shortcut, block == "regnet-se")
    elif shortcut == "downsample":
        downsample = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2, bias=False), nn.BatchNorm2d(32))
        ref = BasicBlock(16, 32, 2, downsample) if block == "basic" else Bottleneck(16, 8, 2, downsample)
    else:
        ref = BasicBlock(16, 16) if block == "basic" else Bottleneck(16, 4)
    fused = copy.deepcopy(ref)
    assert fuse_norm_activations(fused) == (2 if block == "basic" else 3)
    calls = []
    forward = cpu.norm_act_forward
    monkeypatch.setattr(cpu, "norm_act_forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    x = torch.randn(4, 16, 8, 8).contiguous(memory_format=torch.channels_last)
    outs = []
    for m, dtype in (
        (ref, torch.float32),
        (fused, torch.float32),
        (copy.deepcopy(ref).double(), torch.float64),
    ):
        xi = x.to(dtype, copy=True).requires_grad_()
        y = m(xi)
        y.backward(torch.linspace(-1, 1, y.numel(), dtype=dtype).reshape(y.shape))
        outs.append([y.detach(), xi.grad, *(p.grad for p in m.parameters()), *m.buffers()])
    assert len(calls) == (2 if block == "basic" else 3)
    for ours, torchs, exact in zip(outs[1], outs[0], outs[2], strict=True):
        assert (ours.double() - exact).abs().max() <= 3 * (torchs.double() - exact).abs().max() + 1e-6


def test_a_fused_model_pickles_and_round_trips(tmp_path):
    model = quantize_model(_block(), "gq")
    path = tmp_path / "model.pt"
    torch.save(model, path)
    loaded = torch.load(path, weights_only=False)
    assert [type(m).__name__ for m in loaded][1:3] == ["FusedBatchNorm2d", "FoldedReLU6"]


def test_the_hook_leaves_batchnorm_unfused_unless_asked():
    """The kept table cells were trained with torch's BatchNorm: the training hook keeps it by default."""
    pytest.importorskip("mmengine")
    from repro.hooks import Int8TrainingHook

    runner = types.SimpleNamespace(model=_block(), logger=types.SimpleNamespace(info=lambda *_: None))
    Int8TrainingHook(method="gq").before_run(runner)
    assert not any(isinstance(m, FusedBatchNorm2d) for m in runner.model.modules())
    runner = types.SimpleNamespace(model=_block(), logger=types.SimpleNamespace(info=lambda *_: None))
    Int8TrainingHook(method="gq", fuse_norm=True).before_run(runner)
    assert isinstance(runner.model[1], FusedBatchNorm2d)


def test_a_training_step_hands_codes_and_gradient_facts_across_autograd(monkeypatch):
    """In a model, the conv after a fused BatchNorm takes its codes and the conv before it the facts of its
    gradient: the very tensor objects reach the next Function through autograd, both ways."""
    torch.manual_seed(0)
    model = quantize_model(_block(), "gq").to(memory_format=torch.channels_last)
    hits = []
    recall = known.recall
    monkeypatch.setattr(known, "recall", lambda t: hits.append(recall(t)) or hits[-1])
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    model(x).sum().backward()
    kept = [f for f in hits if f is not None]
    assert sum(f.codes is not None for f in kept) >= 1  # forward: y's codes into the next conv
    assert sum(f.channel_max is not None for f in kept) >= 1  # backward: gx's max into the conv before


@pytest.mark.parametrize("block", ["basic", "bottleneck", "regnet"])
def test_the_shortcuts_gradient_added_in_the_first_convolution_is_autograds_sum(block, monkeypatch):
    """An identity block hands the shortcut's gradient to its first int8 convolution, which adds it to its
    input gradient (repro.norm_act.ResidualGrad): every gradient bit-equal to autograd adding the two, in
    a quantized two-block model trained two steps; a hook on that convolution keeps autograd's add."""
    import repro.norm_act as norm_act

    torch.manual_seed(0)
    if block == "regnet":
        blocks = [ResBottleneckBlock(16, 16, 1, nn.BatchNorm2d, nn.ReLU, 8, 1.0, None) for _ in range(2)]
    else:
        blocks = [BasicBlock(16, 16) if block == "basic" else Bottleneck(16, 4) for _ in range(2)]
    base = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), *blocks)
    base = base.to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    handover = norm_act._shortcut_handover
    runs = {}
    for mode in ("autograd", "handover", "hooked"):
        model = quantize_model(copy.deepcopy(base), "gq", channels_last_out=True)
        if mode == "hooked":
            first = model[3].conv1 if block != "regnet" else model[3].f.a[0]
            first.register_forward_hook(lambda *_: None)
        taken = []
        monkeypatch.setattr(
            norm_act,
            "_shortcut_handover",
            lambda *a, mode=mode, taken=taken: (
                None if mode == "autograd" else taken.append(handover(*a)) or taken[-1]
            ),
        )
        torch.manual_seed(1)
        for _ in range(2):
            model.zero_grad()
            model(x).square().mean().backward()
        runs[mode] = [p.grad.clone() for p in model.parameters()]
        kept = sum(t is not None for t in taken)
        assert kept == {"autograd": 0, "handover": 4, "hooked": 2}[mode]  # blocks x steps that handed over
    for mode in ("handover", "hooked"):
        assert all(torch.equal(a, b) for a, b in zip(runs["autograd"], runs[mode], strict=True))
