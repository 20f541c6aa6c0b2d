"""The CPU backend's quantizer: repro.quant's semantics, fused in native code (kernels/cpu/csrc/quantize.cpp).

    q(x; s) = round(127 * clamp(x, -s, s) / s)   int8 in [-127, 127]; s = 0 gives q = 0

Nearest rounding is half to even; stochastic rounding is floor(v + u) with u from the Philox stream
keyed per call (kernels.rng), the noise the CUDA kernels draw for the same key and element. Inputs are
float32, bfloat16 or float16 in any dense layout; codes keep the input's layout. A NaN or Inf in the
input or the scale raises NonFiniteError at once (on the CPU that costs nothing). Where the native
library cannot be built, torch operations do the same arithmetic (their noise is torch.rand's).
"""

from __future__ import annotations

import ctypes
import math

import torch

from ..backend import DTYPES, QMAX
from ..errors import NonFiniteError
from ..geometry import channel_split, dense
from ..rng import next_key
from . import known, runtime
from .runtime import int64_array, pointer

ROUNDINGS = ("nearest", "stochastic")


def _check_rounding(rounding: str) -> None:
    if rounding not in ROUNDINGS:
        raise ValueError(f"unknown rounding {rounding!r}; choose one of {', '.join(ROUNDINGS)}")


def _raise(what: str, x: torch.Tensor) -> None:
    raise NonFiniteError(f"non-finite values in {what} of shape {tuple(x.shape)}")


def _operand(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    x = x.detach()
    if x.dtype not in DTYPES:
        x = x.float()
    return dense(x), DTYPES[x.dtype]


def _scale_vector(scale) -> torch.Tensor:
    """scale as a float32 CPU tensor the native code reads: a 0-d or contiguous 1-D float32 CPU tensor (what
    the methods pass) as it is, in one dispatch instead of five; anything else as a contiguous 1-D copy."""
    if isinstance(scale, torch.Tensor) and scale.dtype == torch.float32 and scale.device.type == "cpu":
        if scale.dim() == 0 or (scale.dim() == 1 and scale.is_contiguous()):
            return scale.detach()
    return torch.as_tensor(scale, dtype=torch.float32).detach().to("cpu").reshape(-1).contiguous()


def _scales(scale, x: torch.Tensor, axis: int | None) -> torch.Tensor:
    s = _scale_vector(scale)
    if axis is None:
        if s.numel() != 1:
            raise ValueError(f"per-tensor quantization needs one scale, got shape {tuple(s.shape)}")
    elif s.numel() != x.shape[axis]:
        raise ValueError(f"per-channel scale must have shape ({x.shape[axis]},), got {tuple(s.shape)}")
    # one value (every per-tensor scale): one host read, where torch.isfinite(...).all() dispatches six ops
    finite = math.isfinite(s.item()) if s.numel() == 1 else bool(torch.isfinite(s).all())
    if not finite:
        raise NonFiniteError("non-finite values in the quantizer's scale")
    return s


def absmax(x: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """max|x| (float32): a 0-d tensor, or one value per slice along `axis`. Raises NonFiniteError."""
    facts = known.recall(x)
    if facts is not None:  # found by the kernel that made x
        if axis is None and facts.scale is not None:
            return facts.scale.clone()
        if facts.channel_max is not None and (axis is None or axis % x.dim() == 1):
            return facts.channel_max.max() if axis is None else facts.channel_max.clone()
    lib = runtime.library()
    if lib is None:
        return _torch_absmax(x, axis)
    xd, dt = _operand(x)
    if axis is None:
        return _native_absmax(lib, x, xd, dt)
    amax, _ = _stats(lib, xd, dt, axis % max(1, x.dim()), moments=False)
    return amax


def _native_absmax(lib, x, xd, dt) -> torch.Tensor:
    """max|x| of the dense operand xd as a float32 0-d tensor; raises on a non-finite x."""
    out = torch.zeros((), dtype=torch.float32)  # an empty x's max
    if xd.numel() and lib.rq_absmax(pointer(xd), dt, xd.numel(), pointer(out)):
        _raise("max|x|'s input", x)
    return out


def channel_stats(x: torch.Tensor, axis: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """max|x| and the population standard deviation per slice along `axis` (None: of the whole tensor,
    as 0-d tensors), in one pass."""
    facts = known.recall(x)
    if facts is not None and facts.channel_sums is not None and (axis is None or axis % x.dim() == 1):
        return _known_stats(facts, x, axis)
    lib = runtime.library()
    if lib is None:
        return _torch_channel_stats(x, axis)
    xd, dt = _operand(x)
    amax, sigma = _stats(lib, xd, dt, None if axis is None else axis % x.dim(), moments=True)
    return (amax.reshape(()), sigma.reshape(())) if axis is None else (amax, sigma)


def _known_stats(facts, x, axis):
    """channel_stats from the maxima and sums (or deviations) that the kernel that made x kept
    (kernels.cpu.known)."""
    if axis is not None and facts.channel_std is not None:
        return facts.channel_max.clone(), facts.channel_std.clone()
    amax, (s1, s2) = facts.channel_max.clone(), facts.channel_sums
    n = x.numel() // x.shape[1]
    if axis is None:
        amax, s1, s2, n = amax.max(), s1.sum().reshape(1), s2.sum().reshape(1), x.numel()
    return amax, _sigma(s1, s2, max(1, n)).reshape(amax.shape)


def _sigma(s1, s2, n):
    """The population standard deviation from the sum and the sum of squares of n values (float64); the native
    code computes the same (csrc/moments.h)."""
    mean = s1 / n
    return (s2 / n - mean * mean).clamp_min_(0.0).sqrt_().float()


def _stats(lib, xd, dt, axis, moments):
    outer, c, inner = channel_split(xd, axis)
    channels = 1 if axis is None else xd.shape[axis]
    amax = torch.zeros(channels, dtype=torch.float32)
    if not moments:
        s1 = s2 = sd = None
    else:
        s1, s2 = torch.empty(channels, dtype=torch.float64), torch.empty(channels, dtype=torch.float64)
        sd = torch.zeros(channels, dtype=torch.float32)  # an empty x's
    if xd.numel():
        bad = lib.rq_channel_stats(
            pointer(xd), dt, outer, c, inner, pointer(amax), pointer(s1), pointer(s2), pointer(sd)
        )
        if bad:
            _raise("the quantizer's input", xd)
    return amax, sd


def quantize(
    x: torch.Tensor,
    scale,
    axis: int | None = None,
    rounding: str = "nearest",
    generator: torch.Generator | None = None,
    above: tuple[int, torch.Tensor] | None = None,
):
    """int8 codes of x clipped to [-scale, scale] (per tensor, or per slice along `axis`).

    above=(dim, thresholds): also count, per slice along `dim` (None: the whole tensor), the elements with
    |x| > thresholds[c] (DAIQ's fraction above sigma, in the same pass); then returns (codes, counts as
    int64).
    """
    _check_rounding(rounding)
    ndim = x.dim()
    axis = None if axis is None else axis % max(1, ndim)
    s = _scales(scale, x, axis)
    count_axis = None if above is None or above[0] is None else above[0] % ndim
    if above is not None and axis is not None and axis != count_axis:
        raise ValueError("the scale's axis and the counted axis must be the same")
    lib = runtime.library()
    if lib is None:
        return _torch_quantize(x, s, axis, rounding, generator, above)
    xd, dt = _operand(x)
    return _native_quantize(lib, x, xd, dt, s, axis, rounding, generator, above, count_axis)


def _native_quantize(lib, x, xd, dt, s, axis, rounding, generator, above, count_axis):
    """quantize's native call: xd dense, s the checked float32 scales (contiguous, on the CPU)."""
    ndim = xd.dim()
    q = torch.empty_like(xd, dtype=torch.int8)
    thresh, counts = None, None
    if above is not None:
        thresh = above[1].detach().to("cpu", torch.float32).reshape(-1).contiguous()
        counts = torch.zeros(1 if count_axis is None else xd.shape[count_axis], dtype=torch.int64)
    chan = axis if axis is not None else count_axis
    stochastic = rounding == "stochastic"
    k0, k1 = next_key(generator) if stochastic else (0, 0)
    if xd.numel():
        bad = lib.rq_quantize(
            pointer(xd), dt, pointer(q), ndim, int64_array(xd.shape), int64_array(xd.stride()),
            pointer(s), -1 if chan is None else chan, int(axis is not None), int(stochastic),
            ctypes.c_uint32(k0), ctypes.c_uint32(k1), pointer(thresh), pointer(counts),
        )  # fmt: skip
        if bad:
            _raise("the quantizer's input", x)
    return q if above is None else (q, counts)


def daiq_grad_codes(g, axis, gmax, sigma, prev, k, A, lam, generator=None):
    """DAIQ's backward quantization of G in one native call (the rule: repro.methods.daiq, Algorithm 1):
    the GX codes per tensor with s = max(gmax) and the counts of |g| > sigma[c] per slice along `axis`
    (None: the whole tensor), MCS's clip values s[c] from the fractions above sigma, and the GW codes with
    s per slice. The same streams, in the same order, and the same float32 arithmetic as the method's
    quantize calls and torch ops, so the same codes and scales bit for bit; the method's own composition
    cost about 0.2 ms of dispatch a layer (docs/measurements.md). Returns (gx, gx_scale, gw, s, gaussian),
    or None without the native library (the method composes quantize calls then)."""
    lib = runtime.library()
    if lib is None:
        return None
    ndim = g.dim()
    axis = None if axis is None else axis % max(1, ndim)
    xd, dt = _operand(g)
    channels = 1 if axis is None else xd.shape[axis]
    gm, sd = _scale_vector(gmax), _scale_vector(sigma)
    pv = None if prev is None else _scale_vector(prev)
    if not gm.numel() == sd.numel() == channels or (pv is not None and pv.numel() != channels):
        raise ValueError(f"daiq_grad_codes needs {channels} values per statistic")
    gx, gw = torch.empty_like(xd, dtype=torch.int8), torch.empty_like(xd, dtype=torch.int8)
    gx_scale = torch.empty((), dtype=torch.float32)
    s, gaussian = torch.empty(channels, dtype=torch.float32), torch.empty(channels, dtype=torch.bool)
    (kx0, kx1), (kw0, kw1) = next_key(generator), next_key(generator)  # GX's stream, then GW's, as before
    bad = lib.rq_daiq_codes(
        pointer(xd), dt, pointer(gx), pointer(gw), ndim, int64_array(xd.shape), int64_array(xd.stride()),
        -1 if axis is None else axis, pointer(gm), pointer(sd), pointer(pv), 1.0 - k * A, A, lam,
        kx0, kx1, kw0, kw1, pointer(gx_scale), pointer(s), pointer(gaussian),
    )  # fmt: skip
    if bad == 1:
        _raise("the quantizer's input", g)
    if bad:
        raise NonFiniteError("non-finite values in the quantizer's scale")
    if axis is None:
        s, gaussian = s.reshape(()), gaussian.reshape(())
    return gx, gx_scale, gw, s, gaussian


def absmax_quantize(x, axis=None, rounding="nearest", generator=None):
    """(codes, s) with s = max|x| per tensor or per slice along `axis`."""
    facts = known.recall(x)
    if facts is not None and axis is None and rounding == "nearest" and facts.codes is not None:
        return facts.codes, facts.scale  # written with x by the kernel that made it
    lib = runtime.library()
    if lib is None or axis is not None:
        s = absmax(x, axis)
        return quantize(x, s, axis, rounding, generator), s
    # per tensor (every forward operand, and gq's gradient): absmax's and quantize's native calls on one
    # dense operand, without quantize's checks of a scale absmax has just made (a float32 0-d tensor on
    # the CPU, finite: rq_absmax raises on a non-finite input, and a kernel keeps no facts of one).
    # Tens of microseconds of dispatch a call, three calls a layer and step (docs/measurements.md, issue
    # 64's fixed costs)
    _check_rounding(rounding)
    xd, dt = _operand(x)
    if facts is not None and facts.channel_max is not None:
        s = facts.channel_max.max()  # found by the kernel that made x
    elif facts is not None and facts.scale is not None:
        s = facts.scale.clone()  # found by the kernel that made x, which left the codes to this pass
    else:
        s = _native_absmax(lib, x, xd, dt)
    q = _native_quantize(lib, x, xd, dt, s, None, rounding, generator, None, None)
    if facts is not None and facts.scale is not None and rounding == "nearest" and xd.stride() == x.stride():
        # for a second reader of x (a ResNet block's output feeds the next block's first and shortcut
        # convolutions): nearest codes are the same codes every time
        known.remember(x, known.Facts(scale=facts.scale, codes=q))
    return q, s


def dequantize(
    acc: torch.Tensor,
    scale,
    axis: int | None = None,
    dtype: torch.dtype = torch.float32,
    inplace: bool = False,
) -> torch.Tensor:
    """acc (int32) * scale in one pass: per tensor, or per slice along `axis`; float32 or bfloat16 in acc's
    layout. inplace: a float32 result takes acc's own storage (acc is not used afterwards)."""
    lib = runtime.library()
    if lib is None or dtype not in (torch.float32, torch.bfloat16) or acc.dtype != torch.int32:
        return _torch_dequantize(acc, scale, axis, dtype)
    acc = dense(acc)
    s = _scale_vector(scale)
    axis = None if axis is None else axis % acc.dim()
    out = (
        acc.view(torch.float32) if inplace and dtype == torch.float32 else torch.empty_like(acc, dtype=dtype)
    )
    outer, c, inner = channel_split(acc, axis)
    if acc.numel():
        lib.rq_dequantize(pointer(acc), pointer(out), int(dtype == torch.bfloat16), outer, c, inner,
                          pointer(s), int(axis is not None and s.numel() > 1))  # fmt: skip
    return out


# ----------------------------------------------------------------------------------------------------
# torch fallback (no compiler on this machine): the same arithmetic, one torch op per step


def _torch_absmax(x: torch.Tensor, axis: int | None) -> torch.Tensor:
    x = x.detach().float()
    if not bool(torch.isfinite(x.sum())):
        _raise("max|x|'s input", x)
    if axis is None:
        return x.abs().amax() if x.numel() else torch.zeros(())
    dims = [d for d in range(x.dim()) if d != axis % x.dim()]
    return x.abs().amax(dim=dims) if dims else x.abs()


def _torch_channel_stats(x: torch.Tensor, axis: int | None):
    x = x.detach().float()
    flat = x.reshape(1, -1) if axis is None else x.movedim(axis, 0).reshape(x.shape[axis], -1)
    if not bool(torch.isfinite(flat.sum())):
        _raise("the quantizer's input", x)
    amax, sigma = flat.abs().amax(dim=1), flat.std(dim=1, correction=0)
    return (amax.reshape(()), sigma.reshape(())) if axis is None else (amax, sigma)


def _torch_dequantize(acc, scale, axis, dtype):
    s = torch.as_tensor(scale, dtype=torch.float32, device=acc.device)
    if axis is not None and s.numel() > 1:
        shape = [1] * acc.dim()
        shape[axis] = -1
        s = s.reshape(shape)
    return (acc.float() * s).to(dtype)


def _torch_quantize(x, s, axis, rounding, generator, above):
    xf = x.detach().float()
    if not bool(torch.isfinite(xf.sum())):
        _raise("the quantizer's input", x)
    shape = [1] * x.dim()
    if axis is not None:
        shape[axis] = -1
    inv = torch.where(s > 0, QMAX / s.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(s))
    v = (xf * inv.reshape(shape if axis is not None else [])).clamp_(-QMAX, QMAX)
    if rounding == "nearest":
        v.round_()
    else:
        # v + u >= -127, but 127 + u rounds to 128 in float32 for u within 2^-17 of 1
        v.add_(torch.rand(v.shape, generator=generator)).floor_().clamp_max_(QMAX)
    q = torch.empty_like(xf, dtype=torch.int8).copy_(v)
    if above is None:
        return q
    dim, thresh = above
    if dim is None:
        return q, (xf.abs() > thresh.float().reshape(())).sum().reshape(1)
    dim %= x.dim()
    tshape = [1] * x.dim()
    tshape[dim] = -1
    dims = [d for d in range(x.dim()) if d != dim]
    counts = (xf.abs() > thresh.float().reshape(tshape)).sum(dim=dims)
    return q, counts
