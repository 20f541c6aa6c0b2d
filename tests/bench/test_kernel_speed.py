"""Kernel timing: every distinct layer shape of ResNet-50 (224x224), int8 against fp32 and half precision.

The device is ``$REPRO_BENCH_DEVICE`` (``make bench DEVICE=cuda|cpu``; default: cuda when present). On a
GPU the batch is the paper's 64 (DAIQ Figure 4) and half precision is fp16; on the CPU batch 32 and bf16
(a CPU has no fast fp16). For each layer and each op (forward, input grad, weight grad) the four
implementations of repro.layer_cases are timed (int8 with its quantization, the int8 op alone, fp32, half).

On CUDA every timed call ends with a synchronisation, so the clock sees the kernels' time.
``make bench`` runs them with pytest-benchmark (results/kernel_bench.json) and kernels/bench/report.py
turns the JSON into results/kernel_speedup.md and .png (``make fig4``: DAIQ Figure 4 from the same JSON).
Under plain ``pytest`` (benchmarking disabled, as in pyproject's addopts) every case runs once on a
shrunk shape and is checked instead: int8-op equals kernels.reference bit for bit, int8 / half are
close to fp32, fp32 is close to float64.
"""

from __future__ import annotations

import os

import pytest
import torch

from kernels import reference
from kernels.bench import devices
from repro import heap
from repro.layer_cases import OPS, RESNET50, Case, half_name, layer_name, shrink

DEVICE = devices.resolve(os.environ.get("REPRO_BENCH_DEVICE") or None)
CUDA = DEVICE.type == "cuda"
BATCH = 64 if CUDA else 32  # DAIQ Figure 4's batch on a GPU; 32 keeps the CPU run to a few minutes
HALF = torch.float16 if CUDA else torch.bfloat16
HALF_NAME = half_name(HALF)
IMPLS = ("int8", "int8-op", "fp32", HALF_NAME)


_CASES: dict = {}


def get_case(layer, benchmarking: bool) -> Case:
    """One Case per layer (built once: the fp32 reference data for a 56x56 layer takes a while)."""
    key = (layer, benchmarking)
    if key not in _CASES:
        _CASES.clear()  # parametrization is layer-major: keep one layer's tensors alive at a time
        shape = layer if benchmarking else shrink(layer)
        device = DEVICE if benchmarking else torch.device("cpu")  # the correctness run: CPU (CI)
        _CASES[key] = Case(shape, BATCH if benchmarking else 2, RESNET50.index(layer), device, HALF)
    return _CASES[key]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layer", RESNET50, ids=layer_name)
def test_kernel_speed(benchmark, layer, op, impl):
    benchmarking = not benchmark.disabled
    if benchmarking:  # freed tensors reused, as every training step and step timing runs (repro.heap)
        heap.reuse_freed_memory()
    case = get_case(layer, benchmarking)
    benchmark.group = f"{layer_name(layer)} {op}"
    benchmark.extra_info.update(
        layer=layer_name(layer), kind=layer[0], count=layer[1], op=op, impl=impl,
        threads=torch.get_num_threads(), batch=BATCH if benchmarking else 2, load=os.getloadavg()[0],
        device=devices.label(devices.describe(case.device)), device_kind=case.device.type, half=HALF_NAME,
        heap_reused=heap.applied(),
    )  # fmt: skip
    if benchmarking:
        if CUDA:  # the paper's FP32 (a 2080 Ti has no TF32)
            torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
        # warm-up outside the timer: oneDNN primitive creation and weight prepacking happen once
        case.run(impl, op)
        benchmark(case.run, impl, op)
        return
    got = benchmark(case.run, impl, op)
    if impl == "int8-op":
        want = case.int8_op(op, backend=reference)
        assert got.dtype == torch.int32 and torch.equal(got, want), "int8 op differs from kernels.reference"
        return
    fp32 = case.fp32(op)
    assert got.shape == fp32.shape
    if impl == "fp32":
        xd, wd, gd = (t.double() for t in (case.x, case.w, case.g))
        assert rel_err(got, case.float_op(op, xd, wd, gd)) < 1e-5
    else:  # quantization / half rounding error of random normal data: a few percent at most
        assert rel_err(got, fp32) < (0.1 if impl == "int8" else 0.03), f"{impl} far from fp32"


def test_resnet50_table_matches_torchvision():
    """The layer table above is every distinct Conv2d/Linear shape of torchvision's resnet50."""
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet50().to("meta")
    seen: dict = {}

    def hook(mod, inputs, out):
        x = inputs[0]
        if isinstance(mod, torch.nn.Conv2d):
            key = ("conv", mod.in_channels, x.shape[-1], mod.out_channels, mod.kernel_size[0])
            key += (mod.stride[0], mod.padding[0])
        else:
            key = ("linear", mod.in_features, 1, mod.out_features, 1, 1, 0)
        seen[key] = seen.get(key, 0) + 1

    for mod in model.modules():
        if isinstance(mod, torch.nn.Conv2d | torch.nn.Linear):
            mod.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros((1, 3, 224, 224), device="meta"))
    table = {(kind, cin, hw, cout, k, s, p): count for kind, count, cin, hw, cout, k, s, p in RESNET50}
    assert seen == table
