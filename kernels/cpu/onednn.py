"""oneDNN's int8 convolution as the CPU backend calls it, and the bound that makes its fp32 output exact.

``run`` is ``torch.ops.onednn.qconv_pointwise`` on the input shifted to uint8 with zero point 128 (v + 128,
a sign-bit flip), the int8 weight prepacked by ``prepack``, unit scales, fp32 output; oneDNN accumulates in
int32 and converts to fp32, exact while every sum it converts is below 2^24. ``channel_blocks`` splits the
input channels so that the weights alone prove that (the bounded guard, kernels.cpu.routes). ``run`` and
``prepack`` are the seam tests stand in for oneDNN at (an AMX-like rounding, a refusal).
"""

from __future__ import annotations

import torch

from .memory import empty_cl

F32_EXACT = 1 << 24  # every integer with |v| < 2^24 is exact in fp32
ZP = 128  # uint8 zero point: int8 v is stored as v + 128
# every sum an AMX convolution may hold in fp32 (the uncompensated sum of (x + 128) * w, up to 255 per
# code, and the compensation 128 * sum(w), in either order) is at most this many times ||w_oc||_1
AMX_SUM = 255 + ZP
MAX_BLOCKS = 8  # input-channel blocks per convolution on the bounded route; more go to im2col + _int_mm
# The weights' unit scale and zero point as one-element tensors, which oneDNN applies per tensor: with one
# entry per output channel its prepack read them one at a time on the host (a select and an item() each)
# and the convolution scaled every channel, both slower (docs/measurements.md)
W_SCALE = torch.ones(1, dtype=torch.float32)
W_ZERO_POINT = torch.zeros(1, dtype=torch.int64)


def to_u8(t: torch.Tensor) -> torch.Tensor:
    """int8 v -> uint8 v + 128 (the sign bit flipped), channels-last, in one pass."""
    out = empty_cl(t.shape, torch.uint8)
    torch.bitwise_xor(t.view(torch.uint8), ZP, out=out)
    return out


def prepack(wq: torch.Tensor, s, p, d, groups: int, x_shape):
    """oneDNN's prepacked int8 weight for inputs of ``x_shape`` (unit scales, u8 input at zero point 128)."""
    return torch.ops.onednn.qconv_prepack(
        wq.contiguous(), W_SCALE, 1.0, ZP, list(s), list(p), list(d), groups, list(x_shape)
    )


def run(
    xu: torch.Tensor, wq: torch.Tensor, packed, s, p, d, groups: int, scale=None, out_dtype=torch.float32
) -> torch.Tensor:
    """oneDNN u8 (zero point 128) x s8 convolution of ``xu`` with the prepacked ``wq``, fp32 output
    (channels-last). ``wq`` itself is passed so that tests can stand in for oneDNN. ``scale`` (a
    one-element float32 tensor): the output is fp32(acc) * scale, oneDNN's weight scale doing the
    dequantizing epilogue (bit for bit ``dequantize``'s one rounding wherever fp32(acc) is exact); with
    ``out_dtype`` bfloat16 that float32 value rounded to nearest even, as ``dequantize(..., bfloat16)``
    rounds it, written in half the bytes."""
    w_scale = W_SCALE if scale is None else scale
    return torch.ops.onednn.qconv_pointwise(
        xu, 1.0, ZP, packed, w_scale, W_ZERO_POINT, None, list(s), list(p), list(d), groups,
        1.0, 0, out_dtype, "none", [], "",
    )  # fmt: skip


def qconv(xu: torch.Tensor, wq: torch.Tensor, s, p, d, groups: int) -> torch.Tensor:
    """One oneDNN int8 convolution, fp32 output (channels-last)."""
    return run(xu, wq, prepack(wq, s, p, d, groups, xu.shape), s, p, d, groups)


def abs_sums(wq: torch.Tensor, start_dim: int) -> torch.Tensor:
    """sum |w| over the dimensions from start_dim on, int32, exact for every int8 (|-128| read as uint8)
    and in one int8 pass whatever wq's layout (widening to int32 and flattening first made three
    weight-sized copies: 8 ms against 0.2 for a 512x512x3x3 weight, docs/measurements.md)."""
    return wq.abs().view(torch.uint8).sum(dim=tuple(range(start_dim, wq.dim())), dtype=torch.int32)


def channel_blocks(wq: torch.Tensor, groups: int) -> list[tuple[int, int]] | None:
    """Input-channel blocks [c0, c1) of ``wq`` in each of which AMX_SUM * ||w_oc||_1 < 2^24 for every
    output channel: oneDNN's fp32 output of each block is then exact by construction, and the blocks'
    int32 sums add exactly. None when that takes more than MAX_BLOCKS blocks, when one channel alone
    exceeds the bound, or when a grouped weight would need splitting."""
    limit = (F32_EXACT - 1) // AMX_SUM  # ||w_oc||_1 <= limit  <=>  AMX_SUM * ||w_oc||_1 < 2^24
    l1 = abs_sums(wq, 2)  # (Cout, Cin / groups): per input channel
    if int(l1.sum(1).max()) <= limit:
        return [(0, wq.shape[1])]
    if groups != 1:
        return None
    cum = l1.cumsum(1)
    blocks, c0 = [], 0
    while c0 < wq.shape[1]:
        reach = cum[:, c0:] - (cum[:, c0 - 1 : c0] if c0 else 0)
        fit = int(torch.searchsorted(reach.amax(0).contiguous(), limit, right=True))
        if fit == 0 or len(blocks) == MAX_BLOCKS:
            return None
        blocks.append((c0, c0 + fit))
        c0 += fit
    return blocks


# geometries oneDNN refused to prepack here (it does on some ISAs: AMX and a grouped 3x3 convolution of
# 120-channel groups, regnet_x_8gf's); they go to im2col + _int_mm without asking again
REFUSED: set = set()


def prepack_blocks(wq, blocks, s, p, d, groups: int, xq, chunk: int) -> list | None:
    """One prepacked weight per input-channel block, or None if oneDNN refuses the shape. Blocks split
    ungrouped weights only, so a block's input has (c1 - c0) * groups channels either way."""
    n = min(xq.shape[0], chunk)
    try:
        return [
            prepack(wq[:, c0:c1], s, p, d, groups, (n, (c1 - c0) * groups, *xq.shape[2:]))
            for c0, c1 in blocks
        ]
    except RuntimeError:
        return None


def qconv_blocks(
    xu, wq, blocks, packed, s, p, d, groups: int, scale=None, out_dtype=torch.float32
) -> torch.Tensor | None:
    """oneDNN's convolution of one batch chunk: fp32 for one block (times ``scale`` as ``out_dtype``, one
    block only), the int32 sum of the blocks' exact outputs for several; None if oneDNN refuses the chunk."""
    try:
        if len(blocks) == 1:
            if scale is not None:  # only given where the caller has proved fp32(acc) exact
                # (out_dtype passed only where it is not float32: tests stand in for run with 8 arguments)
                if out_dtype != torch.float32:
                    return run(xu, wq, packed[0], s, p, d, groups, scale, out_dtype)
                return run(xu, wq, packed[0], s, p, d, groups, scale)
            return run(xu, wq, packed[0], s, p, d, groups)
        acc = None
        for (c0, c1), pk in zip(blocks, packed, strict=True):
            part = run(xu[:, c0:c1], wq[:, c0:c1], pk, s, p, d, groups)
            part = part.view(torch.int32).copy_(part)  # exact: the block's bound holds
            acc = part if acc is None else acc.add_(part)
        return acc
    except RuntimeError:
        return None
