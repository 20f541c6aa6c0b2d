"""DAIQ's backward quantization in one native call (kernels.cpu.daiq_grad_codes) gives what the method's own
composition of quantize calls and torch ops gives: the same codes, clip values and decisions, bit for bit,
iteration after iteration."""

from __future__ import annotations

import pytest
import torch

from kernels import cpu
from kernels.cpu import runtime
from repro.methods import build_method

pytestmark = pytest.mark.skipif(not runtime.available(), reason="no native library: the method composes")


def mixed_gradient(seed: int, shape, channels_last: bool, dtype) -> torch.Tensor:
    """Gaussian channels (about 32% of |g| above sigma: the Gaussian rule) beside Laplacian ones (24%:
    Inverted-T), with scales that change between iterations so the recurrence moves."""
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(shape, generator=gen)
    # Laplacian from the same generator (torch.distributions draws from the global one): |e| signed at random
    sign = torch.randint(0, 2, shape, generator=gen) * 2 - 1
    laplace = torch.empty(shape).exponential_(generator=gen) * sign
    per_channel = (1, shape[1], *[1] * (len(shape) - 2))
    heavy = (torch.arange(shape[1]) % 2).bool().reshape(per_channel)
    g = torch.where(heavy, laplace, g) * torch.rand(per_channel, generator=gen).add(0.5)
    g = g.to(dtype)
    return g.contiguous(memory_format=torch.channels_last) if channels_last else g


def run(method: str, options: dict, grads, fused: bool, monkeypatch):
    calls = []
    if fused:
        original = cpu.daiq_grad_codes
        monkeypatch.setattr(cpu, "daiq_grad_codes", lambda *a, **k: calls.append(1) or original(*a, **k))
    else:
        monkeypatch.delattr(cpu, "daiq_grad_codes")
    torch.manual_seed(7)  # the stochastic streams' keys
    q = build_method(method, **options).make_layer_quantizer()
    out = []
    for g in grads:
        c = q.grad(g, channel_axis=1)
        out.append((c.gx, c.gx_scale, c.gw, c.gw_scale, q.scale.clone(), q.last_gaussian.clone()))
    monkeypatch.undo()
    return out, len(calls)


@pytest.mark.parametrize(
    "method, options, shape, channels_last, dtype",
    [
        ("daiq", {}, (4, 24, 6, 6), True, torch.float32),
        ("daiq", {}, (4, 24, 6, 6), False, torch.float32),
        ("daiq", {"k": 1.5, "A": 0.8}, (4, 24, 6, 6), True, torch.bfloat16),  # kA > 1: scales fall to max|g|
        ("daiq", {}, (64, 40), False, torch.float32),  # a linear layer's gradient
        ("daiq-mcs", {}, (4, 24, 6, 6), True, torch.float32),  # one clip value for the whole tensor
    ],
)
def test_native_daiq_codes_are_the_composed_ones(method, options, shape, channels_last, dtype, monkeypatch):
    grads = [mixed_gradient(seed, shape, channels_last, dtype) for seed in range(4)]
    fused, n_fused = run(method, options, grads, True, monkeypatch)
    composed, _ = run(method, options, grads, False, monkeypatch)
    assert n_fused == len(grads)  # the native call ran, every iteration
    decisions = torch.cat([f[5].reshape(-1) for f in fused])
    if method == "daiq":
        assert decisions.any() and not decisions.all()  # both rules met
    for got, want in zip(fused, composed, strict=True):
        for a, b in zip(got, want, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            assert torch.equal(a, b)


def test_native_daiq_codes_raise_on_a_non_finite_gradient():
    g = torch.randn(2, 8, 3, 3)
    gmax, sigma = cpu.channel_stats(g, 1)
    g[1, 3, 2, 1] = float("nan")
    with pytest.raises(cpu.quantizer.NonFiniteError, match="quantizer's input"):
        cpu.daiq_grad_codes(g, 1, gmax, sigma, None, 1.0, 0.8, 0.3)
    gmax[2] = float("inf")
    with pytest.raises(cpu.quantizer.NonFiniteError, match="quantizer's scale"):
        cpu.daiq_grad_codes(torch.randn(2, 8, 3, 3), 1, gmax, sigma, None, 1.0, 0.8, 0.3)
