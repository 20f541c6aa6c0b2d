"""The backends' exact int8 products and their stochastic quantizer as torch custom ops
(``torch.ops.repro_int8.*``), for torch.compile.

A backend call is opaque to Dynamo (ctypes, CPU probes, CuPy launches): called directly inside a compiled
model it breaks the graph. Registered with ``torch.library.custom_op`` and a fake (meta) implementation,
it is one node of the graph instead, as torchao registers its int8 matmuls, and the compiler is free to
fuse the quantization around it. kernels.traceable (what get_backend returns under Dynamo) calls them;
eager code calls the backends directly and pays no dispatch.

Each op runs ``kernels.eager_backend(device)``'s function of the same name and returns its int32 result in
one fixed layout per device, which the fake implementation states (compiled code reads the real tensor by
the fake's strides): on the CPU, convolution outputs and input gradients channels-last (C innermost, any
rank: what the CPU backend already returns), on CUDA contiguous; weight gradients and linear products
contiguous everywhere.

Stochastic rounding is an op too: inductor's CPU code draws its random numbers one element at a time
(docs/measurements.md: 7x the backend's vectorised Philox pass), and as an op the compiled step draws the
eager backends' noise, one key per call from torch's default generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .geometry import conv_geometry

NAMESPACE = "repro_int8"


def _channels_last_strides(shape: Sequence[int]) -> tuple[int, ...]:
    """Strides of an (N, C, *spatial) tensor with C innermost, for any rank."""
    _, c, *spatial = shape
    spatial_strides, step = [], max(c, 1)
    for size in reversed(spatial):
        spatial_strides.insert(0, step)
        step *= max(size, 1)
    return (step, 1, *spatial_strides)


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.insert(0, step)
        step *= max(size, 1)
    return tuple(strides)


def _activation_strides(shape: Sequence[int], device: torch.device) -> tuple[int, ...]:
    return _channels_last_strides(shape) if device.type == "cpu" else _contiguous_strides(shape)


def _same_layout(t: torch.Tensor, strides: Sequence[int]) -> bool:
    """Equal strides wherever a dimension has more than one element (others do not address memory)."""
    return all(size < 2 or a == b for size, a, b in zip(t.shape, t.stride(), strides, strict=True))


def _laid_out(t: torch.Tensor, strides: tuple[int, ...]) -> torch.Tensor:
    if _same_layout(t, strides):
        return t
    return torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device).copy_(t)


def _empty(shape, strides, like: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tuple(shape), strides, dtype=torch.int32, device=like.device)


def _backend(t: torch.Tensor):
    from . import eager_backend  # kernels/__init__ imports this module

    return eager_backend(t.device)


# ------------------------------------------------------------------------------------------ convolution
@torch.library.custom_op(f"{NAMESPACE}::conv_forward", mutates_args=())
def conv_forward(
    xq: torch.Tensor,
    wq: torch.Tensor,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    y = _backend(xq).conv_forward(xq, wq, stride, padding, dilation, groups)
    return _laid_out(y, _activation_strides(y.shape, y.device))


@conv_forward.register_fake
def _(xq, wq, stride, padding, dilation, groups):
    *_, out = conv_geometry(xq.shape, wq.shape, stride, padding, dilation, groups)
    shape = (xq.shape[0], wq.shape[0], *out)
    return _empty(shape, _activation_strides(shape, xq.device), xq)


@torch.library.custom_op(f"{NAMESPACE}::conv_input_grad", mutates_args=())
def conv_input_grad(
    gq: torch.Tensor,
    wq: torch.Tensor,
    input_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    dx = _backend(gq).conv_input_grad(gq, wq, input_shape, stride, padding, dilation, groups)
    return _laid_out(dx, _activation_strides(dx.shape, dx.device))


@conv_input_grad.register_fake
def _(gq, wq, input_shape, stride, padding, dilation, groups):
    return _empty(input_shape, _activation_strides(input_shape, gq.device), gq)


@torch.library.custom_op(f"{NAMESPACE}::conv_weight_grad", mutates_args=())
def conv_weight_grad(
    xq: torch.Tensor,
    gq: torch.Tensor,
    weight_shape: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    groups: int,
) -> torch.Tensor:
    dw = _backend(xq).conv_weight_grad(xq, gq, weight_shape, stride, padding, dilation, groups)
    return _laid_out(dw, _contiguous_strides(dw.shape))


@conv_weight_grad.register_fake
def _(xq, gq, weight_shape, stride, padding, dilation, groups):
    return _empty(weight_shape, _contiguous_strides(weight_shape), xq)


# ----------------------------------------------------------------------------------------------- linear
@torch.library.custom_op(f"{NAMESPACE}::linear_forward", mutates_args=())
def linear_forward(xq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    return _backend(xq).linear_forward(xq, wq).contiguous()


@linear_forward.register_fake
def _(xq, wq):
    return _empty((xq.shape[0], wq.shape[0]), _contiguous_strides((xq.shape[0], wq.shape[0])), xq)


@torch.library.custom_op(f"{NAMESPACE}::linear_input_grad", mutates_args=())
def linear_input_grad(gq: torch.Tensor, wq: torch.Tensor) -> torch.Tensor:
    return _backend(gq).linear_input_grad(gq, wq).contiguous()


@linear_input_grad.register_fake
def _(gq, wq):
    return _empty((gq.shape[0], wq.shape[1]), _contiguous_strides((gq.shape[0], wq.shape[1])), gq)


@torch.library.custom_op(f"{NAMESPACE}::linear_weight_grad", mutates_args=())
def linear_weight_grad(xq: torch.Tensor, gq: torch.Tensor) -> torch.Tensor:
    return _backend(xq).linear_weight_grad(xq, gq).contiguous()


@linear_weight_grad.register_fake
def _(xq, gq):
    return _empty((gq.shape[1], xq.shape[1]), _contiguous_strides((gq.shape[1], xq.shape[1])), xq)


# ---------------------------------------------------------------------------------- stochastic rounding
@torch.library.custom_op(f"{NAMESPACE}::quantize_stochastic", mutates_args=())
def quantize_stochastic(
    x: torch.Tensor,
    scale: torch.Tensor,
    axis: int | None,
    count_axis: int | None,
    thresholds: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes of x (x's layout) and, with thresholds, the counts of |x| > thresholds per slice along
    count_axis (None: the whole tensor; no thresholds: an empty count)."""
    above = None if thresholds is None else (count_axis, thresholds)
    out = _backend(x).quantize(x, scale, axis, "stochastic", None, above)
    q, counts = (out, x.new_empty(0, dtype=torch.int64)) if above is None else out
    return _laid_out(q, _code_strides(x)), counts


def _code_strides(x: torch.Tensor) -> tuple[int, ...]:
    return torch.empty_like(x, dtype=torch.int8, device="meta").stride()


@quantize_stochastic.register_fake
def _(x, scale, axis, count_axis, thresholds):
    q = torch.empty_strided(x.shape, _code_strides(x), dtype=torch.int8, device=x.device)
    n = 0 if thresholds is None else (1 if count_axis is None else x.shape[count_axis])
    return q, x.new_empty(n, dtype=torch.int64)


PRODUCTS = (
    conv_forward,
    conv_input_grad,
    conv_weight_grad,
    linear_forward,
    linear_input_grad,
    linear_weight_grad,
)
