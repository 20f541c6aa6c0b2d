"""The backend interface as torch.compile traces it: what ``kernels.get_backend`` returns under Dynamo.

The eager backends (kernels.cpu, kernels.cuda) are opaque to Dynamo: ctypes and CuPy calls, host checks of
every input. Here the same interface is written so that a compiled training step is one graph:

- the products and stochastic rounding are registered ops of kernels.ops (one graph node each, the eager
  backend inside);
- absmax, the per-channel statistics, nearest-rounding quantization and the dequantizing epilogue are plain
  torch ops, which inductor fuses with the op that produces their input (BatchNorm, ReLU) or consumes their
  output;
- a NaN or Inf met by those torch ops is neither raised (that would read the tensor on the host inside the
  graph) nor flagged in a global tensor (AOTAutograd cannot partition a graph input mutated in both the
  forward and the backward pass): it propagates instead. max|x| of such an input is NaN or Inf, so the
  scale, and with it the layer's output or gradient, is NaN; the loss or the next step's loss is NaN, which
  the run recorder checks every iteration (tasks.run_recorder.check_loss): a diverged compiled run is
  recorded as diverged, at most one iteration later than eager. The stochastic quantizer (the eager
  backend's) raises NonFiniteError as in eager.

Nearest rounding is repro.quant's arithmetic step for step (inv = reciprocal(s) * 127 in fp32, clamp,
round half to even): bit-identical to the eager backends. Stochastic rounding is the eager backends' own
(one Philox key per call from torch's default generator): inductor's CPU code draws random numbers one
element at a time, 7x slower. A compiled step draws the keys in its graph's order, which matched eager's in
the tests (tests/test_compile.py); the gradients still differ from eager's by float rounding, since
inductor sums BatchNorm in another order (NOISE_STREAM is in a compiled table cell's key). The per-channel
standard deviation comes from float64 first and second moments as in the eager backends (the summation
order may differ). Importing this module applies kernels.inductor_bool_store.
"""

from __future__ import annotations

import torch

from . import inductor_bool_store
from .backend import QMAX
from .ops import (
    conv_forward,
    conv_input_grad,
    conv_weight_grad,
    linear_forward,
    linear_input_grad,
    linear_weight_grad,
    quantize_stochastic,
)

__all__ = [
    "NOISE_STREAM",
    "absmax",
    "absmax_quantize",
    "channel_stats",
    "conv_forward",
    "conv_input_grad",
    "conv_weight_grad",
    "dequantize",
    "linear_forward",
    "linear_input_grad",
    "linear_weight_grad",
    "quantize",
]

NOISE_STREAM = "per-call-philox"

inductor_bool_store.apply()  # before inductor writes the code of the graph being traced


def _along(t: torch.Tensor, axis: int | None, ndim: int) -> torch.Tensor:
    """A per-slice vector shaped to broadcast along `axis` of an ndim-tensor (a scalar stays one)."""
    if axis is None:
        return t.reshape(())
    shape = [1] * ndim
    shape[axis] = -1
    return t.reshape(shape)


def _other_dims(ndim: int, axis: int) -> list[int]:
    return [d for d in range(ndim) if d != axis]


def absmax(x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    xf = x.detach().float()
    if axis is None:
        return xf.abs().amax() if xf.numel() else xf.new_zeros(())
    dims = _other_dims(x.dim(), axis % x.dim())
    return xf.abs().amax(dim=dims) if dims else xf.abs()


def channel_stats(x: torch.Tensor, axis: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """max|x| and sigma from float64 first and second moments, as the eager backends (one fused pass)."""
    xd = x.detach().double()
    dims = list(range(x.dim())) if axis is None else _other_dims(x.dim(), axis % x.dim())
    n = max(1, x.numel() // (1 if axis is None else max(1, x.shape[axis])))
    mean = xd.sum(dim=dims) / n
    sigma = ((xd * xd).sum(dim=dims) / n - mean * mean).clamp_min(0.0).sqrt()
    return xd.abs().amax(dim=dims).float(), sigma.float()


def quantize(x, scale, axis=None, rounding="nearest", generator=None, above=None):
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"unknown rounding {rounding!r}; choose one of nearest, stochastic")
    if generator is not None:
        raise ValueError("a compiled quantizer draws its noise from torch's default generator")
    ndim = x.dim()
    axis = None if axis is None else axis % max(1, ndim)
    s = torch.as_tensor(scale, dtype=torch.float32, device=x.device).detach()
    if rounding == "stochastic":
        count_axis = None if above is None or above[0] is None else above[0] % ndim
        thresholds = None if above is None else above[1].detach().float()
        q, counts = quantize_stochastic(x.detach(), s, axis, count_axis, thresholds)
        return q if above is None else (q, counts)
    xf = x.detach().float()
    inv = torch.where(s > 0, s.clamp_min(torch.finfo(torch.float32).tiny).reciprocal() * QMAX, 0.0)
    v = (xf * _along(inv, axis, ndim)).clamp(-QMAX, QMAX)
    q = v.round().to(torch.int8)
    if above is None:
        return q
    dim, thresholds = above
    t = thresholds.detach().float()
    if dim is None:
        return q, (xf.abs() > t.reshape(())).sum().reshape(1)
    dim %= ndim
    return q, (xf.abs() > _along(t, dim, ndim)).sum(dim=_other_dims(ndim, dim))


def absmax_quantize(x, axis=None, rounding="nearest", generator=None):
    s = absmax(x, axis)
    return quantize(x, s, axis, rounding, generator), s


def dequantize(acc, scale, axis=None, dtype=torch.float32, inplace=False):
    """acc * scale as `dtype`: inplace is the eager backends' saving; the compiler fuses this instead."""
    s = torch.as_tensor(scale, dtype=torch.float32, device=acc.device)
    if axis is not None and s.numel() > 1:
        s = _along(s, axis % acc.dim(), acc.dim())
    return (acc.float() * s).to(dtype)
