"""repro.steptime's optimizer: torch's fused SGD, which must give the foreach SGD's values bit for bit, so
that the kernel changes the time of a step and nothing it computes."""

from __future__ import annotations

import copy

import torch
from torch import nn

from repro.steptime import Runner, Variant, fused_sgd


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10),
    )  # fmt: skip


def test_fused_sgd_is_the_foreach_sgd_bit_for_bit():
    models = [_model(), _model()]
    opts = [
        torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4, **kw)
        for m, kw in zip(models, ({"foreach": True}, fused_sgd(torch.device("cpu"))), strict=True)
    ]
    gen = torch.Generator().manual_seed(1)
    for _ in range(4):  # momentum buffers made, then used
        grads = [torch.randn(p.shape, generator=gen) for p in models[0].parameters()]
        for m, opt in zip(models, opts, strict=True):
            for p, g in zip(m.parameters(), grads, strict=True):
                p.grad = g.clone()
            opt.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        assert torch.equal(a, b)


def test_runner_steps_with_the_fused_kernel_and_int8_methods_keep_their_update():
    x, y = torch.randn(2, 3, 8, 8), torch.tensor([1, 3])
    base = _model()
    fp32 = Runner(Variant("fp32", "FP32"), base, torch.device("cpu"), 10)
    assert fp32.optimizer.defaults["fused"] is True
    # UI8 scales each layer's update after the optimizer's step (repro.lr_scaling): the same weights as
    # the foreach SGD under the same scaling
    runners = [Runner(Variant("ui8", "INT8", method="ui8"), base, torch.device("cpu"), 10) for _ in range(2)]
    plain = runners[1].optimizer
    plain.defaults["fused"] = None
    for group in plain.param_groups:
        group["fused"], group["foreach"] = None, True
    for _ in range(3):
        for r in runners:
            r.step(x, y)
    for a, b in zip(runners[0].model.parameters(), runners[1].model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(next(copy.deepcopy(base).parameters()), next(runners[0].model.parameters()))
