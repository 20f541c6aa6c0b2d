"""Argument checks and output geometry shared by every backend (bookkeeping, not arithmetic: the
reference stays an independent oracle for the products themselves)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def as_tuple(v: int | Sequence[int], nd: int, name: str) -> tuple[int, ...]:
    if isinstance(v, int):
        return (v,) * nd
    v = tuple(int(a) for a in v)
    if len(v) == 1:
        return v * nd
    if len(v) != nd:
        raise ValueError(f"{name} must be an int or a sequence of {nd} ints, got {v}")
    return v


def conv_geometry(x_shape, w_shape, stride, padding, dilation, groups):
    """(nd, stride, padding, dilation, kernel, output spatial size), validated, as tuples."""
    nd = len(x_shape) - 2
    if nd not in (1, 2, 3) or len(w_shape) != nd + 2:
        raise ValueError(
            f"need x (N, C, *spatial) with 1..3 spatial dims and a matching weight, got "
            f"{tuple(x_shape)} and {tuple(w_shape)}"
        )
    s = as_tuple(stride, nd, "stride")
    p = as_tuple(padding, nd, "padding")
    d = as_tuple(dilation, nd, "dilation")
    cin, cout = x_shape[1], w_shape[0]
    if groups < 1 or cin % groups or cout % groups or w_shape[1] != cin // groups:
        raise ValueError(f"channels do not match groups={groups}: x {tuple(x_shape)}, w {tuple(w_shape)}")
    k = tuple(int(a) for a in w_shape[2:])
    out = tuple((x_shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(nd))
    if min(out) < 1:
        raise ValueError(f"empty output for input {tuple(x_shape)}, kernel {k}")
    return nd, s, p, d, k, out


def check_grad_output(g_shape, expected) -> None:
    """A product's grad_output must have the forward output's shape (N, C_out, *out)."""
    if tuple(g_shape) != tuple(expected):
        raise ValueError(f"grad_output has shape {tuple(g_shape)}, expected {tuple(expected)}")


def is_dense(t: torch.Tensor) -> bool:
    """Every element once in one block of memory (any order of the dimensions)."""
    expected = 1
    dims = sorted(((st, s) for s, st in zip(t.shape, t.stride(), strict=True) if s > 1))
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def dense(t: torch.Tensor) -> torch.Tensor:
    # the common layouts answered by torch at once (is_dense sorts the strides: microseconds a call)
    if t.is_contiguous() or (t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)):
        return t
    return t if is_dense(t) else t.contiguous()


def channel_split(x: torch.Tensor, axis: int | None) -> tuple[int, int, int]:
    """(outer, C, inner) of a dense x's memory around dimension `axis` (None: one channel)."""
    c = 1 if axis is None else x.shape[axis]
    if c <= 1:
        return 1, 1, x.numel()
    inner = x.stride(axis)
    return x.numel() // (c * inner), c, inner
