"""What the kernel that made a tensor already knows of it, kept for the quantizer that reads it next.

A fused BatchNorm (kernels.cpu.norm) finds max|y| of its output, and writes y's nearest int8 codes, in the
passes that make y; its backward finds the per-channel max|gx| and moments of the gradient it returns. A
convolution's zero-padded int8 input is kept for its weight gradient.
The quantizer (kernels.cpu.quantizer) asks here first and skips its own pass over the tensor when the
answer is there. An entry holds for the very tensor object it was made for, while its data is unchanged
(same storage and version counter: an in-place change drops it), and goes when the tensor does.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Facts:
    scale: torch.Tensor | None = None  # max|t|, float32 0-d
    codes: torch.Tensor | None = None  # the nearest codes of t with that scale (int8, t's layout)
    channel_max: torch.Tensor | None = None  # max|t| per slice along dim 1, float32
    channel_sums: tuple[torch.Tensor, torch.Tensor] | None = (
        None  # sum and sum of squares along dim 1, float64
    )
    channel_std: torch.Tensor | None = None  # the population standard deviation along dim 1, float32
    # (t zero-padded by `padding` on each side of its spatial dims, padding): an int8 convolution's padded
    # input, made in the forward pass and read again by its weight gradient (kernels.cpu.im2col.pad_zero)
    padded: tuple[torch.Tensor, tuple[int, ...]] | None = None
    # (groups, blk, operands): a grouped weight's block-diagonal GEMM operands (kernels.cpu.im2col.
    # block_diagonal), made by the forward pass and read again, transposed through tables, by the input
    # gradient
    block_diagonal: tuple[int, int, torch.Tensor] | None = None


_ENTRIES: dict[int, tuple[weakref.ref, int, int, Facts]] = {}


def remember(t: torch.Tensor, facts: Facts) -> None:
    key = id(t)

    def gone(ref, key=key):  # only this tensor's entry: a later tensor may reuse the id
        entry = _ENTRIES.get(key)
        if entry is not None and entry[0] is ref:
            del _ENTRIES[key]

    _ENTRIES[key] = (weakref.ref(t, gone), t._version, t.data_ptr(), facts)


def recall(t: torch.Tensor) -> Facts | None:
    """The facts kept for t, or None (none kept, or t changed since)."""
    entry = _ENTRIES.get(id(t))
    if entry is None:
        return None
    ref, version, ptr, facts = entry
    if ref() is not t or t._version != version or t.data_ptr() != ptr:
        return None
    return facts


def forget(t: torch.Tensor) -> None:
    entry = _ENTRIES.get(id(t))
    if entry is not None and entry[0]() is t:
        del _ENTRIES[id(t)]
