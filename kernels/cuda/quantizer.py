"""The CUDA backend's quantizer: repro.quant's semantics in the fused kernels of csrc/quantize.cu,
with no host synchronisation.

Codes keep the input's layout; nearest rounding is bit-identical to the CPU backend's, and stochastic
rounding draws the same Philox noise as the CPU backend for the same key (kernels.rng, drawn on the host)
and element. A NaN or Inf sets the device's flag (kernels.errors.device_flag), read once per iteration.
Scales stay on the device: the per-tensor max|x| is written by one kernel and read by the next.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..backend import DTYPES
from ..errors import device_flag
from ..geometry import channel_split, dense
from ..rng import next_key
from . import runtime

MAX_DIMS = 5  # the group kernel's dimensions (beyond: the tensor is made contiguous and flattened)


def _operand(x: torch.Tensor) -> tuple[torch.Tensor, np.int32]:
    x = x.detach()
    if x.dtype not in DTYPES:
        x = x.float()
    return dense(x), np.int32(DTYPES[x.dtype])


def _scales(scale, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    s = torch.as_tensor(scale, dtype=torch.float32).detach()
    s = s.to(x.device, non_blocking=True).reshape(-1).contiguous()
    if axis is None and s.numel() != 1:
        raise ValueError(f"per-tensor quantization needs one scale, got shape {tuple(s.shape)}")
    if axis is not None and s.numel() != x.shape[axis]:
        raise ValueError(f"per-channel scale must have shape ({x.shape[axis]},), got {tuple(s.shape)}")
    if not x.numel():  # else the quantize kernel checks the scales it reads (no extra launches)
        device_flag(x.device).bitwise_or_((~torch.isfinite(s)).any().to(torch.int32).reshape(1))
    return s


def _stats(x: torch.Tensor, axis: int | None, moments: bool):
    runtime.check_device(x)
    xd, dt = _operand(x)
    outer, c, inner = channel_split(xd, axis)
    channels = 1 if axis is None else xd.shape[axis]
    if moments:  # one zeroed buffer for the two sums and the max bits (one launch instead of three)
        sums = torch.zeros(5 * channels, dtype=torch.int32, device=x.device)
        s1, s2 = sums[: 4 * channels].view(torch.float64).view(2, channels).unbind()
        bits = sums[4 * channels :]
    else:
        bits, s1, s2 = torch.zeros(channels, dtype=torch.int32, device=x.device), None, None
    flag = device_flag(x.device)
    if xd.numel() and c == 1 and not moments:
        grid = (min(runtime.grid_1d(xd.numel()), 1024), 1, 1)
        args = (xd, dt, np.int64(xd.numel()), bits, flag)
        runtime.launch("quantize", "absmax_tensor", grid, (runtime.THREADS, 1, 1), args)
    elif xd.numel():
        args = (xd, dt, np.int64(outer), np.int32(c), np.int64(inner), bits, s1, s2, flag)
        if inner == 1:
            grid = (-(-c // 32), max(1, min(runtime.MAX_GRID_YZ, -(-outer // 64))), 1)
            runtime.launch("quantize", "channel_stats", grid, (32, 8, 1), args)
        else:
            grid = (c, max(1, min(runtime.MAX_GRID_YZ, outer, 65535 // max(1, c) + 1)), 1)
            runtime.launch("quantize", "channel_stats", grid, (runtime.THREADS, 1, 1), args)
    amax = bits.view(torch.float32)
    if not moments:
        return amax, None
    n = max(1, xd.numel() // channels)
    mean = s1 / n
    return amax, (s2 / n - mean * mean).clamp_min_(0.0).sqrt_().float()


def absmax(x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    amax, _ = _stats(x, None if axis is None else axis % x.dim(), moments=False)
    return amax.reshape(()) if axis is None else amax


def channel_stats(x: torch.Tensor, axis: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    amax, sigma = _stats(x, None if axis is None else axis % x.dim(), moments=True)
    return (amax.reshape(()), sigma.reshape(())) if axis is None else (amax, sigma)


def group_plan(shape, strides, axis: int | None):
    """The quantize kernel's walk: dimensions innermost first as (size, stride, row coefficient), the
    last one counted in groups of 4; the positions of the last and of the channel dimension."""
    nd = max(1, len(shape))
    shape, strides = (list(shape) or [1]), (list(strides) or [1])
    last = nd - 1
    rowc = [math.prod(shape[d + 1 : last]) for d in range(nd)]
    keep = [d for d in range(nd) if shape[d] > 1 or d in (last, axis)]
    order = sorted(keep, key=lambda d: (strides[d] if shape[d] > 1 else 0, d != last))
    sizes = [-(-shape[d] // 4) if d == last else shape[d] for d in order]
    return (
        [(s, strides[d], rowc[d]) for s, d in zip(sizes, order, strict=True)],
        order.index(last),
        order.index(axis) if axis is not None else -1,
        math.prod(sizes),
    )


def quantize(x, scale, axis=None, rounding="nearest", generator=None, above=None):
    if rounding not in ("nearest", "stochastic"):
        raise ValueError(f"unknown rounding {rounding!r}; choose one of nearest, stochastic")
    runtime.check_device(x)
    axis = None if axis is None else axis % max(1, x.dim())
    s = _scales(scale, x, axis)
    xd, dt = _operand(x)
    q = torch.empty_like(xd, dtype=torch.int8)
    count_axis, thresh, counts = None, None, None
    if above is not None:
        count_axis = None if above[0] is None else above[0] % x.dim()
        if axis is not None and axis != count_axis:
            raise ValueError("the scale's axis and the counted axis must be the same")
        thresh = above[1].detach().to(x.device, torch.float32).reshape(-1).contiguous()
        channels = 1 if count_axis is None else x.shape[count_axis]
        counts = torch.zeros(channels, dtype=torch.int64, device=x.device)
    chan = axis if axis is not None else count_axis
    if xd.dim() > MAX_DIMS:
        return _flat(x, s, axis, rounding, generator, above)
    dims, last_pos, axis_pos, groups = group_plan(xd.shape, xd.stride(), chan)
    ndim = len(dims)
    dims += [(1, 0, 0)] * (MAX_DIMS - ndim)
    k0, k1 = next_key(generator) if rounding == "stochastic" else (0, 0)
    if xd.numel():
        last = max(0, xd.dim() - 1)
        args = (
            xd, dt, q, np.int32(ndim), np.int64(groups),
            np.int64(xd.shape[last] if xd.dim() else 1), np.int64(xd.stride(last) if xd.dim() else 1),
            np.int32(last_pos), *(np.int64(d[0]) for d in dims), *(np.int64(d[1]) for d in dims),
            *(np.int64(d[2]) for d in dims), np.int32(axis_pos), s, np.int32(axis is not None),
            np.int32(rounding == "stochastic"), np.uint32(k0), np.uint32(k1), thresh, counts,
            device_flag(x.device),
        )  # fmt: skip
        grid = (runtime.grid_1d(groups), 1, 1)
        runtime.launch("quantize", "quantize_groups", grid, (runtime.THREADS, 1, 1), args)
    return q if above is None else (q, counts)


def _flat(x, s, axis, rounding, generator, above):
    """More dimensions than the kernel walks: as a contiguous tensor of at most MAX_DIMS dimensions."""
    lead = x.shape[: -(MAX_DIMS - 1)]
    shape = (math.prod(lead), *x.shape[-(MAX_DIMS - 1) :])
    if axis is not None and axis < len(lead) or above is not None and above[0] is not None:
        raise ValueError(f"a per-channel quantity along dimension {axis} of a {x.dim()}-D tensor")
    out = quantize(x.contiguous().view(shape), s, None if axis is None else axis - len(lead) + 1, rounding,
                   generator, above)  # fmt: skip
    return out.view(x.shape) if above is None else (out[0].view(x.shape), out[1])


def absmax_quantize(x, axis=None, rounding="nearest", generator=None):
    s = absmax(x, axis)
    return quantize(x, s, axis, rounding, generator), s


def dequantize(acc, scale, axis=None, dtype=torch.float32, inplace=False):
    if acc.dtype != torch.int32 or dtype not in DTYPES:
        s = torch.as_tensor(scale, dtype=torch.float32, device=acc.device)
        return (acc.float() * s).to(dtype)
    runtime.check_device(acc)
    acc = dense(acc)
    axis = None if axis is None else axis % acc.dim()
    s = torch.as_tensor(scale, dtype=torch.float32).detach().to(acc.device, non_blocking=True).reshape(-1)
    s = s.contiguous()
    same = inplace and dtype == torch.float32
    out = acc.view(torch.float32) if same else torch.empty_like(acc, dtype=dtype)
    outer, c, inner = channel_split(acc, axis)
    if acc.numel():
        args = (acc, out, np.int32(DTYPES[dtype]), np.int64(acc.numel()), np.int32(c), np.int64(inner), s,
                np.int32(axis is not None and s.numel() > 1))  # fmt: skip
        grid = (runtime.grid_1d(acc.numel()), 1, 1)
        runtime.launch("quantize", "dequantize", grid, (runtime.THREADS, 1, 1), args)
    return out
