"""Kernel timing: every distinct layer shape of ResNet-50 (224x224), int8 against fp32 and half precision.

The device is ``$REPRO_BENCH_DEVICE`` (``make bench DEVICE=cuda|cpu``; default: cuda when present). On a
GPU the batch is the paper's 64 (DAIQ Figure 4) and half precision is fp16; on the CPU batch 32 and bf16
(a CPU has no fast fp16). For each layer and each op (forward, input grad, weight grad) four
implementations are timed:

* ``int8``    the whole int8 step on fp32 operands: quantize (repro.quant: per-tensor absmax, nearest for
              x and w, stochastic for the gradient, per-output-channel stochastic for the weight
              gradient's g as DAIQ's GVQ), the exact int8 op (the device's backend), dequantize to fp32.
              Codes the real layer saves from its forward pass (x and w codes) are made outside the timer.
* ``int8-op`` the int8 op alone on int8 operands (int32 out).
* ``fp32``    torch's own fp32 op (cuDNN / oneDNN), channels-last; on CUDA without TF32.
* ``fp16`` / ``bf16``  the same under ``torch.autocast``, channels-last: the forward pass casts fp32 x and
              w inside the timer, the backward ops take half tensors as autograd has them.

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
import torch.nn.functional as F

import kernels
from kernels import reference
from kernels.bench import devices
from repro.quant import QMAX, absmax, quantize

DEVICE = devices.resolve(os.environ.get("REPRO_BENCH_DEVICE") or None)
CUDA = DEVICE.type == "cuda"
BATCH = 64 if CUDA else 32  # DAIQ Figure 4's batch on a GPU; 32 keeps the CPU run to a few minutes
HALF = torch.float16 if CUDA else torch.bfloat16
HALF_NAME = "fp16" if CUDA else "bf16"
BACKEND = kernels.get_backend(DEVICE)
# (name, count in the network, cin, input size, cout, kernel, stride, padding); read off torchvision's
# resnet50() with forward hooks (test_resnet50_table_matches_torchvision checks it). Names follow the
# x-axis of DAIQ Figure 4: C-feature size-K-kernel-stride.
RESNET50 = [
    ("conv", 1, 3, 224, 64, 7, 2, 3),
    ("conv", 1, 64, 56, 64, 1, 1, 0),
    ("conv", 3, 64, 56, 64, 3, 1, 1),
    ("conv", 4, 64, 56, 256, 1, 1, 0),
    ("conv", 2, 256, 56, 64, 1, 1, 0),
    ("conv", 1, 256, 56, 128, 1, 1, 0),
    ("conv", 1, 128, 56, 128, 3, 2, 1),
    ("conv", 4, 128, 28, 512, 1, 1, 0),
    ("conv", 1, 256, 56, 512, 1, 2, 0),
    ("conv", 3, 512, 28, 128, 1, 1, 0),
    ("conv", 3, 128, 28, 128, 3, 1, 1),
    ("conv", 1, 512, 28, 256, 1, 1, 0),
    ("conv", 1, 256, 28, 256, 3, 2, 1),
    ("conv", 6, 256, 14, 1024, 1, 1, 0),
    ("conv", 1, 512, 28, 1024, 1, 2, 0),
    ("conv", 5, 1024, 14, 256, 1, 1, 0),
    ("conv", 5, 256, 14, 256, 3, 1, 1),
    ("conv", 1, 1024, 14, 512, 1, 1, 0),
    ("conv", 1, 512, 14, 512, 3, 2, 1),
    ("conv", 3, 512, 7, 2048, 1, 1, 0),
    ("conv", 1, 1024, 14, 2048, 1, 2, 0),
    ("conv", 2, 2048, 7, 512, 1, 1, 0),
    ("conv", 2, 512, 7, 512, 3, 1, 1),
    ("linear", 1, 2048, 1, 1000, 1, 1, 0),
]
OPS = ("fwd", "dx", "dw")
IMPLS = ("int8", "int8-op", "fp32", HALF_NAME)
CL = torch.channels_last


def layer_name(layer) -> str:
    kind, _, cin, hw, cout, k, s, _ = layer
    return f"fc {cin}-{cout}" if kind == "linear" else f"{cin}-{hw}-{cout}-{k}-{s}"


def shrink(layer):
    """The shape checked under plain pytest: batch 2, channels / 16, spatial size / 8 (kept >= kernel)."""
    kind, count, cin, hw, cout, k, s, p = layer
    c = lambda v: v if v < 16 else v // 16  # noqa: E731
    return kind, count, c(cin), (1 if kind == "linear" else max(hw // 8, k)), c(cout), k, s, p


class Case:
    """fp32 operands of one layer and the int8 codes a real layer would have saved from its forward."""

    def __init__(self, layer, batch: int, seed: int, device: torch.device = DEVICE):
        kind, _, cin, hw, cout, k, s, p = layer
        gen = torch.Generator().manual_seed(seed)
        self.conv = kind == "conv"
        self.geometry = (s, p, 1, 1)
        self.device = device
        if self.conv:
            x = torch.randn((batch, cin, hw, hw), generator=gen)
            w = torch.randn((cout, cin, k, k), generator=gen).mul_((cin * k * k) ** -0.5)
            y_shape = F.conv2d(x[:1], w, stride=s, padding=p).shape[1:]
            self.x = x.to(device).contiguous(memory_format=CL)
            self.w = w.to(device)
            g = torch.randn((batch, *y_shape), generator=gen)
            self.g = g.to(device).contiguous(memory_format=CL)
        else:
            self.x = torch.randn((batch, cin), generator=gen).to(device)
            self.w = torch.randn((cout, cin), generator=gen).mul_(cin**-0.5).to(device)
            self.g = torch.randn((batch, cout), generator=gen).to(device)
        self.sx, self.sw = absmax(self.x), absmax(self.w)
        self.xq, self.wq = quantize(self.x, self.sx), quantize(self.w, self.sw)
        self.gq = quantize(self.g, absmax(self.g))
        self.xh, self.wh, self.gh = (t.to(HALF) for t in (self.x, self.w, self.g))
        self.backend = kernels.get_backend(device)
        self.gen = torch.Generator().manual_seed(seed)  # the noise keys are drawn on the host

    # ---- int8, quantization included

    def int8(self, op: str):
        """As repro.layers' autograd Functions run it: the backend's fused quantizer, the exact product,
        the backend's dequantizing epilogue (GW with per-output-channel scales, DAIQ's GVQ)."""
        b = self.backend
        if op == "fwd":
            xq, sx = b.absmax_quantize(self.x)
            wq, sw = b.absmax_quantize(self.w)
            acc = b.conv_forward(xq, wq, *self.geometry) if self.conv else b.linear_forward(xq, wq)
            return b.dequantize(acc, sx * sw / QMAX**2, inplace=True)
        if op == "dx":
            gq, sg = b.absmax_quantize(self.g, rounding="stochastic", generator=self.gen)
            if self.conv:
                acc = b.conv_input_grad(gq, self.wq, self.x.shape, *self.geometry)
            else:
                acc = b.linear_input_grad(gq, self.wq)
            return b.dequantize(acc, sg * self.sw / QMAX**2, inplace=True)
        gq, sc = b.absmax_quantize(self.g, axis=1, rounding="stochastic", generator=self.gen)
        if self.conv:
            acc = b.conv_weight_grad(self.xq, gq, self.w.shape, *self.geometry)
        else:
            acc = b.linear_weight_grad(self.xq, gq)
        return b.dequantize(acc, sc * (self.sx / QMAX**2), axis=0, inplace=True)

    def int8_op(self, op: str, backend=None):
        backend = backend or self.backend
        xq, wq, gq = self.xq, self.wq, self.gq
        if self.conv and op == "fwd":
            return backend.conv_forward(xq, wq, *self.geometry)
        if self.conv and op == "dx":
            return backend.conv_input_grad(gq, wq, xq.shape, *self.geometry)
        if self.conv:
            return backend.conv_weight_grad(xq, gq, wq.shape, *self.geometry)
        if op == "fwd":
            return backend.linear_forward(xq, wq)
        if op == "dx":
            return backend.linear_input_grad(gq, wq)
        return backend.linear_weight_grad(xq, gq)

    # ---- float: one aten op each, as autograd runs them

    def float_op(self, op: str, x, w, g):
        if not self.conv:
            return {"fwd": lambda: F.linear(x, w), "dx": lambda: g @ w, "dw": lambda: g.t() @ x}[op]()
        s, p = self.geometry[:2]
        if op == "fwd":
            return F.conv2d(x, w, stride=s, padding=p)
        mask = [op == "dx", op == "dw", False]
        dx, dw, _ = torch.ops.aten.convolution_backward(
            g, x, w, None, [s, s], [p, p], [1, 1], False, [0, 0], 1, mask
        )
        return dx if op == "dx" else dw

    def fp32(self, op: str):
        return self.float_op(op, self.x, self.w, self.g)

    def half(self, op: str):
        if op == "fwd":
            with torch.autocast(self.device.type, dtype=HALF):
                return self.float_op(op, self.x, self.w, self.g)
        return self.float_op(op, self.xh, self.wh, self.gh)

    def run(self, impl: str, op: str):
        fn = {"int8": self.int8, "int8-op": self.int8_op, "fp32": self.fp32, HALF_NAME: self.half}[impl]
        out = fn(op)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the clock must see the kernels, not their launch
        return out


_CASES: dict = {}


def get_case(layer, benchmarking: bool) -> Case:
    """One Case per layer (built once: the fp32 reference data for a 56x56 layer takes a while)."""
    key = (layer, benchmarking)
    if key not in _CASES:
        _CASES.clear()  # parametrization is layer-major: keep one layer's tensors alive at a time
        shape = layer if benchmarking else shrink(layer)
        device = DEVICE if benchmarking else torch.device("cpu")  # the correctness run: CPU (CI)
        _CASES[key] = Case(shape, BATCH if benchmarking else 2, seed=RESNET50.index(layer), device=device)
    return _CASES[key]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("layer", RESNET50, ids=layer_name)
def test_kernel_speed(benchmark, layer, op, impl):
    benchmarking = not benchmark.disabled
    case = get_case(layer, benchmarking)
    benchmark.group = f"{layer_name(layer)} {op}"
    benchmark.extra_info.update(
        layer=layer_name(layer), kind=layer[0], count=layer[1], op=op, impl=impl,
        threads=torch.get_num_threads(), batch=BATCH if benchmarking else 2, load=os.getloadavg()[0],
        device=devices.label(devices.describe(case.device)), device_kind=case.device.type, half=HALF_NAME,
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
