"""Time one training step (forward, backward, SGD step) per method, side by side in one run.

Timings on a shared machine are noisy, so the methods are interleaved round by round and the
median per method is reported together with its ratio to fp32 measured in the same run.
"""

from __future__ import annotations

import copy
import statistics
import time

import torch
import torch.nn.functional as F
import torchvision

from repro.layers import quantize_model
from repro.lr_scaling import LayerLrScaling
from repro.methods import build_method

MODELS = {
    "resnet18": torchvision.models.resnet18,
    "resnet50": torchvision.models.resnet50,
    "mobilenet_v2": torchvision.models.mobilenet_v2,
}


def time_steps(
    model_name: str, methods: list[str], batch: int, size: int, rounds: int, warmup: int = 2
) -> dict[str, list[float]]:
    torch.manual_seed(0)
    if model_name not in MODELS:
        raise ValueError(f"unknown model {model_name!r}; choose one of {', '.join(MODELS)}")
    base = MODELS[model_name](num_classes=10)
    x, y = torch.randn(batch, 3, size, size), torch.arange(batch) % 10
    runs = {}
    for method in methods:
        m = build_method(method)
        model = quantize_model(copy.deepcopy(base), m, channels_last_out=True)  # as the tasks run
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        opt = m.make_optimizer(model, opt) or opt  # a method's own optimizer (WAGEUBN's) is timed too
        LayerLrScaling(model, opt)
        runs[method] = (model, opt)

    def step(model, opt):
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    times: dict[str, list[float]] = {m: [] for m in methods}
    for i in range(warmup + rounds):
        for method, (model, opt) in runs.items():
            t0 = time.perf_counter()
            step(model, opt)
            if i >= warmup:
                times[method].append(time.perf_counter() - t0)
    return times


def report(times: dict[str, list[float]]) -> str:
    base = statistics.median(times["fp32"]) if "fp32" in times else None
    lines = ["method      median ms/step   vs fp32"]
    for method, ts in times.items():
        med = statistics.median(ts)
        ratio = f"{med / base:8.2f}x" if base else "       -"
        lines.append(f"{method:<11} {1000 * med:14.1f}   {ratio}")
    return "\n".join(lines)
