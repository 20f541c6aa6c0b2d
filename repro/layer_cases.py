"""ResNet-50's convolutions as timing cases: every distinct Conv2d/Linear shape of torchvision's resnet50 at
224x224, and one layer's operands with the four ways of computing its forward pass, input gradient and
weight gradient. Timed by `make bench` (tests/bench) and by the GPU report's network totals
(tables.gpu_report).

Implementations of an op:

* ``int8``    the whole int8 step on fp32 operands: quantize (the backend's fused quantizer: per-tensor
              absmax, nearest for x and w, stochastic for the gradient, per-output-channel stochastic for
              the weight gradient's g as DAIQ's GVQ), the exact int8 op, dequantize to fp32. The codes a
              real layer saves from its forward pass (x and w) are made outside the timer.
* ``int8-op`` the int8 op alone on int8 operands (int32 out).
* ``fp32``    torch's own fp32 op (cuDNN / oneDNN), channels-last.
* ``fp16`` / ``bf16``  the same under ``torch.autocast``, channels-last: the forward pass casts fp32 x and
              w inside the timer, the backward ops take half tensors as autograd has them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels
from repro.layers import conv_epilogue, weight_grad_epilogue
from repro.quant import QMAX, absmax, quantize

# (kind, count in the network, cin, input size, cout, kernel, stride, padding); read off torchvision's
# resnet50() with forward hooks (tests/bench checks it). Names follow the x-axis of DAIQ Figure 4:
# C-feature size-K-kernel-stride.
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
CL = torch.channels_last


def half_name(half: torch.dtype) -> str:
    return {torch.float16: "fp16", torch.bfloat16: "bf16"}[half]


def layer_name(layer) -> str:
    kind, _, cin, hw, cout, k, s, _ = layer
    return f"fc {cin}-{cout}" if kind == "linear" else f"{cin}-{hw}-{cout}-{k}-{s}"


def shrink(layer):
    """A small stand-in of a layer: channels / 16, spatial size / 8 (kept >= kernel)."""
    kind, count, cin, hw, cout, k, s, p = layer
    c = lambda v: v if v < 16 else v // 16  # noqa: E731
    return kind, count, c(cin), (1 if kind == "linear" else max(hw // 8, k)), c(cout), k, s, p


class Case:
    """fp32 operands of one layer and the int8 codes a real layer would have saved from its forward."""

    def __init__(self, layer, batch: int, seed: int, device: torch.device, half: torch.dtype):
        kind, _, cin, hw, cout, k, s, p = layer
        gen = torch.Generator().manual_seed(seed)
        self.conv = kind == "conv"
        self.geometry = (s, p, 1, 1)
        self.device, self.half_dtype, self.half_name = device, half, half_name(half)
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
        self.xh, self.wh, self.gh = (t.to(half) for t in (self.x, self.w, self.g))
        self.backend = kernels.get_backend(device)
        self.gen = torch.Generator().manual_seed(seed)  # the noise keys are drawn on the host

    # ---- int8, quantization included

    def int8(self, op: str):
        """As repro.layers' autograd Functions run it: the backend's fused quantizer, the exact product,
        the backend's dequantizing epilogue (inside the convolution products where the backend does that;
        GW with per-output-channel scales, DAIQ's GVQ)."""
        b = self.backend
        if op == "fwd":
            xq, sx = b.absmax_quantize(self.x)
            wq, sw = b.absmax_quantize(self.w)
            if self.conv:  # the epilogue inside the product where the backend has that (repro.layers)
                args = (xq, wq, *self.geometry)
                return conv_epilogue(b, "conv_forward", args, sx * sw / QMAX**2, torch.float32, None)
            return b.dequantize(b.linear_forward(xq, wq), sx * sw / QMAX**2, inplace=True)
        if op == "dx":
            gq, sg = b.absmax_quantize(self.g, rounding="stochastic", generator=self.gen)
            if self.conv:
                args = (gq, self.wq, list(self.x.shape), *self.geometry)
                return conv_epilogue(b, "conv_input_grad", args, sg * self.sw / QMAX**2, torch.float32, None)
            return b.dequantize(b.linear_input_grad(gq, self.wq), sg * self.sw / QMAX**2, inplace=True)
        gq, sc = b.absmax_quantize(self.g, axis=1, rounding="stochastic", generator=self.gen)
        if self.conv:  # the epilogue inside the product where the backend has that (repro.layers)
            args = (self.xq, gq, self.w.shape, *self.geometry)
            return weight_grad_epilogue(b, args, sc * (self.sx / QMAX**2), torch.float32, 0)
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
            with torch.autocast(self.device.type, dtype=self.half_dtype):
                return self.float_op(op, self.x, self.w, self.g)
        return self.float_op(op, self.xh, self.wh, self.gh)

    def run(self, impl: str, op: str):
        fn = {"int8": self.int8, "int8-op": self.int8_op, "fp32": self.fp32, self.half_name: self.half}[impl]
        out = fn(op)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the clock must see the kernels, not their launch
        return out
