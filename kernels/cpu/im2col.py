"""The CPU backend's exact route: im2col + ``torch._int_mm`` (int8 x int8 -> int32), or the native GEMM
where torch's int8 kernels are not the fast route, or a float64 matmul where ``_int_mm`` is not exact.

CPU ``torch._int_mm`` misreads operands with a size-1 dimension whose strides are ambiguous (torch 2.13);
such operands are copied to a fresh row-major layout first (``mm_operand``).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math

import torch
import torch.nn.functional as F

from . import known, native, routes, runtime
from .memory import as_cl, cl_row_stride, empty_cl, huge_pages, is_cl
from .quantizer import dequantize

# weight grad: batch chunk such that the im2col of a chunk has about this many bytes (measured: 8 MB
# beat 2 and 16 MB and an unchunked im2col, whose fresh >32 MB buffers cost page faults)
IM2COL_CHUNK_BYTES = 8 << 20
# pad_zero: padded tensors up to this size are made by one torch op (a fill of the whole buffer and a copy):
# there the 2 * nd + 1 margin fills and copy, each a dispatch, cost more than the bytes (a small layer's
# fixed cost, docs/measurements.md); above it only the border is zeroed
PAD_ONE_OP_BYTES = 1 << 20
# grouped convolutions on the implicit route: most channels (input or output) of one block of groups, whose
# product multiplies the zeros between its groups too (group_block)
GROUP_BLOCK_CHANNELS = 128


def mm_operand(t: torch.Tensor) -> torch.Tensor:
    """A layout torch._int_mm reads correctly: row- or column-major with no size-1 dimension.

    With a size-1 dimension the strides are ambiguous (e.g. (1, 1)) and CPU _int_mm then returns
    wrong results (torch 2.13); such operands, and other non-BLAS layouts, get a fresh row-major copy.
    """
    r, c = t.shape
    if r > 1 and c > 1:
        if (t.stride(1) == 1 and t.stride(0) >= c) or (t.stride(0) == 1 and t.stride(1) >= r):
            return t
    return torch.empty_strided((r, c), (c, 1), dtype=t.dtype).copy_(t)


def mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, scale=None) -> torch.Tensor:
    """Exact int8 (M, K) @ int8 (K, N) -> int32 (M, N) (into ``out``, a contiguous int32, if given).

    ``scale``: float32 acc * scale instead, bit for bit the dequantizing epilogue's result; the native GEMM
    writes it in its last pass over the output, the other routes run the epilogue after."""
    if routes.native_gemm():
        if out is None:
            out = huge_pages(torch.empty((a.shape[0], b.shape[1]), dtype=torch.int32))
            out = out if scale is None else native.as_float_view(out)
        return native.gemm(a, b, out, scale)
    if scale is not None:  # the product into out's own storage, then the epilogue in place there
        acc = mm(a, b, out=None if out is None else out.view(torch.int32))
        return dequantize(acc, scale, inplace=True)
    if routes.int_mm_exact():
        a, b = mm_operand(a), mm_operand(b)
        if out is None:
            out = huge_pages(torch.empty((a.shape[0], b.shape[1]), dtype=torch.int32))
        return torch._int_mm(a, b, out=out)
    # float64 sums of int8 products are exact (|sum| < 2^53)
    r = torch.mm(a.to(torch.float64), b.to(torch.float64)).to(torch.int32)
    return r if out is None else out.copy_(r)


def pad_zero(xq: torch.Tensor, p) -> torch.Tensor:
    """Zero-pad the spatial dims (int8), keeping the memory layout family. The result is kept with xq
    (kernels.cpu.known) and returned again for the same xq: the weight gradient pads the input the forward
    pass padded (5 ms of a ResNet-50 step at 112 px, Intel AMX)."""
    if not any(p):
        return xq
    facts = known.recall(xq)
    if facts is not None and facts.padded is not None and facts.padded[1] == tuple(p):
        return facts.padded[0]
    xp = _padded(xq, p)
    if not xq.is_inference():  # (an inference tensor has no version counter to key the facts by)
        known.remember(xq, dataclasses.replace(facts or known.Facts(), padded=(xp, tuple(p))))
    return xp


def _padded(xq: torch.Tensor, p) -> torch.Tensor:
    lib = runtime.library()
    if lib is not None and xq.dim() == 4 and xq.dtype == torch.int8 and is_cl(xq):
        n, c, h, w = xq.shape
        if cl_row_stride(xq) == c and xq.stride(0) == h * w * c:  # dense (N, H, W, C)
            xp = empty_cl((n, c, h + 2 * p[0], w + 2 * p[1]), torch.int8)
            lib.rq_pad_cl(xq.data_ptr(), xp.data_ptr(), n, h, w, c, p[0], p[1])
            return xp
    # F.pad keeps torch's memory formats (channels-last 2-D and 3-D), not a 1-D channels-last layout
    if xq.numel() * xq.element_size() <= PAD_ONE_OP_BYTES and (xq.dim() in (4, 5) or not is_cl(xq)):
        xp = F.pad(xq, [v for b in reversed(p) for v in (b, b)])
        # a 1x1 map's strides fit both layouts, and F.pad then pads it into NCHW: the channels-last im2col
        # tables (implicit_columns) would read it as channels-last (DenseNet's 3x3 layers at 1x1, 32 px)
        return as_cl(xp) if is_cl(xq) else xp
    n, c, *sp = xq.shape
    shape = (n, c, *(a + 2 * b for a, b in zip(sp, p, strict=True)))
    xp = empty_cl(shape, xq.dtype) if is_cl(xq) else torch.empty(shape, dtype=xq.dtype)
    inner = tuple(slice(b, b + a) for a, b in zip(sp, p, strict=True))
    # only the border is zeroed (a whole-buffer fill was 1% of a ResNet-50 step): per spatial dim, its two
    # margins, across the dims before it already cut to their interior
    for i, (a, b) in enumerate(zip(sp, p, strict=True)):
        if b:
            head = (slice(None), slice(None)) + inner[:i]
            xp[head + (slice(0, b),)] = 0
            xp[head + (slice(a + b, None),)] = 0
    xp[(slice(None), slice(None)) + inner] = xq
    return xp


def im2col(xp: torch.Tensor, k, s, d, out, channels_last: bool) -> torch.Tensor:
    """Columns of an already padded int8 x (N, C, *Lp), one strided copy.

    channels_last: (N*P, prod(k)*C), rows (n, o...), columns (k..., c)
    otherwise:     (C*prod(k), N*P), rows (c, k...), columns (n, o...)
    """
    nd = len(k)
    n, c = xp.shape[:2]
    sn, sc, *sl = xp.stride()
    o_stride = [sl[i] * s[i] for i in range(nd)]
    k_stride = [sl[i] * d[i] for i in range(nd)]
    off = xp.storage_offset()
    if channels_last:
        v = xp.as_strided((n, *out, *k, c), (sn, *o_stride, *k_stride, sc), off)
        return v.reshape(n * math.prod(out), math.prod(k) * c)
    v = xp.as_strided((c, *k, n, *out), (sc, *k_stride, sn, *o_stride), off)
    return v.reshape(c * math.prod(k), n * math.prod(out))


def implicit_ok(channels: int) -> bool:
    """Whether the native GEMM reads the columns of an input with `channels` channels itself, from its
    padded channels-last copy (``implicit_columns``): on the native route, with a multiple of 16 channels
    (its 16-byte loads then stay inside one tap). Elsewhere the columns are copied out (``im2col``). Decided
    before any padding, so the other routes do not pay for a padded copy they would not read."""
    return routes.native_gemm() and channels % 16 == 0


def table_run_ok(run: int) -> bool:
    """Whether the native GEMM reads an operand's k in runs of this many channels through a table: a
    multiple of 16 (the vector GEMM's 16-byte loads stay inside one run), or on the tile GEMM (AMX or AVX-512
    VNNI) any 16 or more (a masked load per run, gemm_amx.cpp)."""
    return run % 16 == 0 or (run >= 16 and routes.native_tiles())


@functools.cache  # (asked several times a pass; routes.clear_route_caches clears it with the routes)
def group_block(groups: int, a: int, b: int, kernel: tuple = (3, 3), stride: tuple = (1, 1)) -> int | None:
    """Groups per native GEMM call for a grouped convolution of `a` input and `b` output channels per group,
    on the implicit route (``implicit_ok``): blocks whose input channels the packing reads as runs
    (``table_run_ok``), with at most GROUP_BLOCK_CHANNELS channels either side. A block is one ungrouped
    product with a block-diagonal weight, which multiplies the zeros between its groups too. On AMX tiles a
    divisor of `groups`: the smallest with 64 input channels or more (a whole tile's k from one tap), else the
    largest; the tiles multiply zeros faster than more calls would run. On AVX-512 VNNI the block of least
    modelled work for the forward pass and the input gradient (``_vnni_work``) among those whose input
    channels fill whole 16-byte runs where any does, a divisor or not (a last block overlapping the one before
    it, block_starts). Both measured (docs/measurements.md). None where no block fits, or the convolution is
    ungrouped. `kernel` and `stride`: the convolution's (the VNNI model's)."""
    if groups == 1 or not implicit_ok(16):
        return None
    fits = _block_fits(groups, a, b)
    if fits and _vnni_tiles():
        any_size = _block_fits(groups, a, b, divisors=False)
        whole = [n for n in any_size if n * a % 16 == 0] or any_size
        return min(whole, key=lambda n: (_vnni_work(groups, a, b, n, kernel, stride), -n))
    return _widest_rule(fits, a)


@functools.cache  # (cleared with group_block)
def weight_grad_block(groups: int, a: int, b: int, kernel: tuple = (3, 3)) -> int | None:
    """Groups per block of a grouped weight gradient, which computes every product of a block's channels and
    keeps the diagonal: `blk` times the groups' work, so smaller blocks than group_block's where the tiles
    stay whole. On AMX, the smallest divisor of `groups` whose input channels fill whole 16-byte runs, 32 or
    more of them (a single group of 16n: one); None where none does (group_block's then). Measured on
    ResNeXt-50's and RegNetX-400MF's layers, where group_block's were 1.2-1.7x slower. On AVX-512 VNNI the
    whole-run block of least modelled work (``_vnni_work``'s weight gradient): a divisor where one has whole
    runs, else any (an overlapping last block: RegNetY's 104 channels in 13 groups took 1.77 ms in one block,
    0.75 in blocks of 2 or 4; a run that a tile straddles is packed byte by byte); docs/measurements.md."""
    if group_block(groups, a, b) is None:
        return None
    whole = _block_fits(groups, a, b, whole_runs=True)
    if _vnni_tiles():
        whole = whole or _block_fits(groups, a, b, whole_runs=True, divisors=False)
        if not whole:
            return _widest_rule(_block_fits(groups, a, b), a)
        return min(whole, key=lambda n: (_vnni_work(groups, a, b, n, kernel, None), -n))
    return min((n for n in whole if n * a >= 32 or n == 1), default=None)


def _block_fits(groups: int, a: int, b: int, whole_runs: bool = False, divisors: bool = True) -> list[int]:
    """Blocks of groups the native GEMM takes (divisors of `groups`, or with `divisors` False any number up
    to it): input channels it reads as runs (or, with `whole_runs`, in whole 16-byte runs), at most
    GROUP_BLOCK_CHANNELS channels either side."""
    return [
        n
        for n in range(1, groups + 1)
        if (groups % n == 0 or not divisors)
        and n * max(a, b) <= GROUP_BLOCK_CHANNELS
        and (n * a % 16 == 0 if whole_runs else table_run_ok(n * a))
    ]


def _widest_rule(fits: list[int], a: int) -> int | None:
    """The AMX tiles' block: the smallest with 64 input channels or more, else the largest."""
    wide = [n for n in fits if n * a >= 64]
    return min(wide) if wide else max(fits, default=None)


def _vnni_tiles() -> bool:
    return routes.native_tiles() and not routes.tiles_are_amx()


# the VNNI block model's costs, in units of one int8 multiply-add: the kernel multiplies a block's k in
# 64-byte tiles (packed a tile at a time), its columns in 16s and its rows in 8s (gemm_amx.cpp); each row of
# a block's result costs RESULT_ROW more (its stores, scales and share of the call), PHASE_ROW in a strided
# input gradient's phases (written to their positions of dx), and each column of a weight gradient's block
# PACK_COLUMN more (its packing). Fitted to RegNetX/Y-400MF's and ResNeXt-50's grouped layers on AMD Zen 5
# after cb2c563: the forward pass and input gradient within 1.07x of the fastest measured block on 20 of 21
# layers (1.18x on ResNeXt's 128-28), the weight gradient the fastest on all 13 measured
# (docs/measurements.md)
RESULT_ROW, PHASE_ROW, PACK_COLUMN = 2048, 4096, 32


def _vnni_work(groups: int, a: int, b: int, n: int, kernel: tuple, stride: tuple | None) -> float:
    """Modelled work of a grouped convolution in blocks of `n` groups (block_starts: ceil(groups / n) of them)
    on the VNNI kernel. `stride` given: the forward pass and the input gradient, per output position: each
    block's k rounded up to 64-byte tiles times its columns rounded up to 16, plus RESULT_ROW a row; the input
    gradient as the stride's phases, each with its own taps over as many rows as the output has (PHASE_ROW a
    row where there are several). `stride` None: the weight gradient, per position reduced: each block's rows
    (output channels) rounded up to 8 times (its columns, taps and input channels, rounded up to 16, plus
    PACK_COLUMN)."""
    up = lambda v, m: -(-v // m) * m  # noqa: E731
    taps, blocks = math.prod(kernel), -(-groups // n)
    if stride is None:
        return blocks * up(n * b, 8) * (up(taps * n * a, 16) + PACK_COLUMN)
    phases = [math.prod(t) for t in itertools.product(*(
        [len(range(r, k, s)) for r in range(s)] for k, s in zip(kernel, stride, strict=True)
    ))]  # fmt: skip
    row = RESULT_ROW if len(phases) == 1 else PHASE_ROW
    work = up(taps * n * a, 64) * up(n * b, 16) + RESULT_ROW
    work += sum(up(t * n * b, 64) * up(n * a, 16) + row for t in phases if t)
    return blocks * work


def block_starts(groups: int, blk: int) -> list[int]:
    """The first group of each block of `blk` groups: every blk-th from 0, and where blk does not divide the
    groups a last block of the last blk groups, overlapping the one before it. The overlapped groups are
    computed twice, to the same values (the same int8 sums), so writing them twice changes nothing."""
    starts = list(range(0, groups - blk + 1, blk))
    return starts if groups % blk == 0 else [*starts, groups - blk]


def block_diagonal(wq: torch.Tensor, groups: int, blk: int) -> torch.Tensor:
    """A grouped weight (Cout, a, *k) as one operand (prod(k) * blk * a, blk * b) of the implicit GEMM per
    block (block_starts), rows (k..., group in block, c) as the channels-last columns of the block's input
    channels, columns (group in block, output channel): each group's weight on the diagonal, zeros
    elsewhere. Kept with wq (kernels.cpu.known) for its input gradient, which reads it transposed."""
    facts = known.recall(wq)
    if facts is not None and facts.block_diagonal is not None and facts.block_diagonal[:2] == (groups, blk):
        return facts.block_diagonal[2]
    cout, a, *k = wq.shape
    b, ntap, starts = cout // groups, math.prod(k), block_starts(groups, blk)
    nblocks = len(starts)
    if groups % blk == 0:
        wm = wq.movedim(1, -1).reshape(nblocks, blk, b, ntap, a)
    else:  # the last block's groups from groups - blk (a copy: the blocks overlap)
        pick = torch.tensor(starts)[:, None] + torch.arange(blk)
        wm = wq.movedim(1, -1).reshape(groups, b, ntap, a)[pick]
    wbd = torch.zeros((nblocks, ntap, blk, a, blk, b), dtype=wq.dtype)
    wbd.diagonal(dim1=2, dim2=4).copy_(wm.permute(0, 3, 4, 2, 1))
    wbd = wbd.view(nblocks, ntap * blk * a, blk * b)
    if not wq.is_inference():  # kept for the input gradient (an inference tensor has no version counter)
        known.remember(wq, dataclasses.replace(facts or known.Facts(), block_diagonal=(groups, blk, wbd)))
    return wbd


@functools.lru_cache(maxsize=32)  # (a detector's varying image sizes: a bounded few MB)
def _column_tables(shape, strides, k, s, d, out) -> tuple[torch.Tensor, torch.Tensor]:
    n, c, *_ = shape
    sn, _, *sl = strides
    rows = torch.arange(n, dtype=torch.int64) * sn
    for i, o in enumerate(out):
        rows = (rows[..., None] + torch.arange(o, dtype=torch.int64) * (s[i] * sl[i])).flatten()
    taps = torch.zeros(1, dtype=torch.int64)
    for i, kk in enumerate(k):
        taps = (taps[..., None] + torch.arange(kk, dtype=torch.int64) * (d[i] * sl[i])).flatten()
    return rows, taps


def implicit_columns(xp: torch.Tensor, k, s, d, out) -> tuple[torch.Tensor, torch.Tensor]:
    """The channels-last im2col of padded ``xp`` as two int64 tables of byte offsets from its data pointer:
    ``rows`` (N * prod(out)), a column row's (n, o...), and ``taps`` (prod(k)), a tap's (k...); column
    (r, t * C + c) is at rows[r] + taps[t] + c, the layout of ``im2col(..., channels_last=True)`` without
    the copy (native.gemm_tables). Cached per geometry."""
    return _column_tables(tuple(xp.shape), tuple(xp.stride()), tuple(k), tuple(s), tuple(d), tuple(out))


def padded_from(xq: torch.Tensor, p, pad_to) -> torch.Tensor:
    """xq zero-padded by p: pad_zero's copy, or the corner of its copy padded by pad_to (>= p) that starts p
    before x (a view: the tables read it through its strides and data pointer)."""
    if pad_to is None or tuple(pad_to) == tuple(p):
        return pad_zero(xq, p)
    xp = pad_zero(xq, pad_to)
    return xp[(slice(None), slice(None), *(slice(b - a, None) for a, b in zip(p, pad_to, strict=True)))]


@functools.lru_cache(maxsize=64)
def _window_table_cache(shape, strides, k, s, d, out, crop, dst_shape, dst_strides):
    rows, taps = _column_tables(shape, strides, k, s, d, out)
    window = (slice(None), *(slice(a, b) for a, b in crop))
    # contiguous: the native code reads the table as an array (a window of one position per image would
    # flatten to a strided view)
    rows = rows.view(shape[0], *out)[window].flatten().contiguous()
    c_rows = torch.zeros(1, dtype=torch.int64)
    for size, stride in zip((dst_shape[0], *dst_shape[2:]), (dst_strides[0], *dst_strides[2:]), strict=True):
        c_rows = (c_rows[..., None] + torch.arange(size, dtype=torch.int64) * stride).flatten()
    return rows, taps, c_rows


def window_tables(xp, k, s, d, out, crop, dst) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """implicit_columns' tables for the output positions in the window ``crop`` only, and the element offsets
    of those positions' rows in ``dst`` (channels innermost): the GEMM's A and C row tables. Cached."""
    return _window_table_cache(tuple(xp.shape), tuple(xp.stride()), tuple(k), tuple(s), tuple(d), tuple(out),
                               tuple(crop), tuple(dst.shape), tuple(dst.stride()))  # fmt: skip


def conv_exact(
    xq: torch.Tensor,
    wq: torch.Tensor,
    s,
    p,
    d,
    groups: int,
    scale=None,
    out_dtype=torch.float32,
    dst=None,
    crop=None,
    pad_to=None,
) -> torch.Tensor:
    """Exact convolution by im2col + _int_mm over batch chunks (ungrouped, on the native route with a multiple
    of 16 channels: one GEMM reading the padded input, ``implicit_columns``), channels-last int32 output (with
    ``scale``: float32 acc * scale, as ``mm``; ``out_dtype`` bfloat16: that value rounded to it).

    Groups are done blk at a time with a block-diagonal weight (zeros between the groups), so that
    depthwise convolutions are batched matmuls too; on the native route, blocks of 16n input channels
    (group_block) as one batched GEMM call reading the padded input in place (_implicit_grouped).

    ``dst``, ``crop`` (one (start, stop) per spatial dimension): the window ``crop`` of the result written
    into the view ``dst`` (of the result's dtype, channels innermost) and returned: an input gradient's phase
    into its strided positions of dx. The implicit route computes only the window's rows and writes them in
    place (the GEMM's row table); the others copy the window out of the whole result. ``pad_to``: pad x by
    this much (at least p) and read it from the corner that padding by p would give, so that phases of
    different padding share one padded copy.
    """
    if dst is not None and not (groups == 1 and implicit_ok(xq.shape[1]) and dst.stride(1) == 1):
        y = conv_exact(xq, wq, s, p, d, groups, scale, out_dtype)
        return dst.copy_(y[(slice(None), slice(None), *(slice(a, b) for a, b in crop))])
    if scale is not None and out_dtype != torch.float32 and not routes.native_gemm():
        # bfloat16 from _int_mm's int32 in one pass, not the float32 epilogue's pass and a conversion after it
        return dequantize(conv_exact(xq, wq, s, p, d, groups), scale, dtype=out_dtype)
    nd = len(s)
    n, cin = xq.shape[:2]
    cout = wq.shape[0]
    k = tuple(wq.shape[2:])
    ntap = math.prod(k)
    out = tuple((xq.shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(nd))
    if routes.native_depthwise(nd, groups, cin, cout):
        return native.depthwise_forward(xq, wq, s, p, d, out, scale)
    implicit = groups == 1 and implicit_ok(cin)
    if routes.native_grouped_conv(cin, cout, groups):
        direct = direct_block(groups, cin // groups, cout // groups) if nd == 2 else None
        if direct is not None:
            return _direct_grouped(xq, wq, p, s, d, out, groups, direct, scale, out_dtype)
        blk = group_block(groups, cin // groups, cout // groups, k, tuple(s))
        return _implicit_grouped(xq, wq, p, s, d, out, groups, blk, scale, out_dtype)
    # the input gradient's TapMajor weight: its operand read through a table of rows where the implicit
    # route reads it, else the weight made (kernels.cpu.products)
    lazy = hasattr(wq, "operand_rows")
    b_rows = wq.operand_rows() if implicit and lazy else None
    wq = wq.tensor() if lazy and b_rows is None else wq
    npos = math.prod(out)
    a, b = cin // groups, cout // groups
    blk = min(groups, max(1, 64 // max(a, b)))
    if b_rows is not None:
        wb = wq.wq  # read through the table
    elif groups == 1:
        # the (prod(k) * Cin, Cout) operand, rows (k..., c) as the channels-last im2col's columns: a view of a
        # channels-last weight, and of the input gradient's tap-major transposed weight (tap_major_transposed)
        wb = wq.permute(*range(2, 2 + nd), 1, 0).reshape(ntap * cin, cout)
    else:
        # weights as (Cout, prod(k) * a) with columns (k..., c), the order of the channels-last im2col
        wm = wq.movedim(1, -1).reshape(cout, ntap, a).contiguous()
    fused = scale is not None and groups == 1  # the grouped products below are assembled in int32
    if dst is not None:
        y = ymat = None  # (written into dst)
    elif fused and out_dtype == torch.bfloat16:  # the native GEMM rounds its scaled result itself
        y = empty_cl((n, cout, *out), out_dtype)
    else:
        y = empty_cl((n, cout, *out), torch.int32)
        y = native.as_float_view(y) if fused else y
    if y is not None:
        ymat = y.movedim(1, -1).view(n * npos, cout)  # rows (n, o...), contiguous
    if implicit:  # one GEMM over the whole batch, its packing reading xp itself
        xp = padded_from(as_cl(xq), p, pad_to)  # channels-last: the channels contiguous, as the tables need
        if b_rows is not None:
            table, stride = b_rows
            b_k, b_n = (0, table, 1), (stride, None, 1)
        else:
            b_k, b_n = (wb.stride(0), None, 1), (wb.stride(1), None, 1)
        if dst is not None:  # the window's rows alone, each written to its place in dst
            rows, taps, c_rows = window_tables(xp, k, s, d, out, tuple(crop), dst)
            native.gemm_tables(rows.numel(), cout, ntap * cin, xp, (0, rows, 1), (0, taps, cin), wb, b_k, b_n,
                               dst, cout, scale, c_rows=c_rows)  # fmt: skip
            return dst
        rows, taps = implicit_columns(xp, k, s, d, out)
        native.gemm_tables(
            n * npos, cout, ntap * cin, xp, (0, rows, 1), (0, taps, cin), wb, b_k, b_n, ymat, cout, scale
        )
        return y
    chunk = routes.batch_chunk(n, npos * ntap * cin, IM2COL_CHUNK_BYTES)
    for n0 in range(0, n, chunk):
        n1 = min(n, n0 + chunk)
        xp = pad_zero(as_cl(xq[n0:n1]), p)
        rows = slice(n0 * npos, n1 * npos)
        for g0 in range(0, groups, blk):
            g1 = min(groups, g0 + blk)
            cols = im2col(xp[:, g0 * a : g1 * a], k, s, d, out, True)  # (rows, prod(k) * B*a)
            if groups == 1:
                # (scale passed only when there is one: mm's three-argument form is a seam tests stand in at)
                mm(cols, wb, out=ymat[rows]) if scale is None else mm(cols, wb, out=ymat[rows], scale=scale)
                continue
            # block-diagonal weight (B*b, prod(k), B*a): group i of the block at [i*b.., :, i*a..]
            nb = g1 - g0
            wb = torch.zeros((nb, b, ntap, nb, a), dtype=wq.dtype)
            wb.diagonal(dim1=0, dim2=3).copy_(wm[g0 * b : g1 * b].view(nb, b, ntap, a).permute(1, 2, 3, 0))
            ymat[rows, g0 * b : g1 * b] = mm(cols, wb.view(nb * b, -1).t())
    return dequantize(y, scale, inplace=True) if scale is not None and not fused else y


def _implicit_grouped(xq, wq, p, s, d, out, groups: int, blk: int, scale, out_dtype) -> torch.Tensor:
    """conv_exact of a grouped convolution: one native GEMM call for every block of `blk` groups, each reading
    the padded input's channels of the block through the implicit tables, with the block-diagonal weight,
    into the block's output channels (scaled in the GEMM's stores)."""
    n, cin = xq.shape[:2]
    cout, k = wq.shape[0], tuple(wq.shape[2:])
    a, b, ntap, rows = cin // groups, cout // groups, math.prod(k), n * math.prod(out)
    xp = pad_zero(as_cl(xq), p)
    table_rows, taps = implicit_columns(xp, k, s, d, out)
    wbd = block_diagonal(wq, groups, blk)
    dtype = torch.int32 if scale is None or out_dtype != torch.bfloat16 else out_dtype
    y = empty_cl((n, cout, *out), dtype)
    y = native.as_float_view(y) if scale is not None and dtype == torch.int32 else y
    ymat = y.movedim(1, -1).view(rows, cout)
    ca, cb = blk * a, blk * b
    # block j: the input's channels from j * ca, its weight wbd[j], the output's channels from j * cb; an
    # overlapping last block (block_starts) by a call of its own from its first group
    for j, g0, count in block_calls(groups, blk):
        native.gemm_tables(rows, cb, ntap * ca, xp[:, g0 * a :], (0, table_rows, 1), (0, taps, ca), wbd[j:],
                           (cb, None, 1), (1, None, 1), ymat[:, g0 * b :], cout, scale,
                           batch=(count, ca, wbd[0].numel(), cb))  # fmt: skip
    return y


def direct_block(groups: int, a: int, b: int) -> int | None:
    """Groups per block of the direct VNNI kernel (routes.grouped_vnni): the fewest whose outputs fill a
    vector of 16 (16 // b of them; one group of 16 to 32 outputs), where their input channels are whole
    4-byte quads (VPDPBUSD's k step) and their outputs at most two vectors; None where it does not run or no
    block fits."""
    if not routes.grouped_vnni():
        return None
    blk = min(groups, max(1, 16 // b))
    return blk if blk * a % 4 == 0 and blk * b <= 32 else None


def flipped_padded(xq: torch.Tensor, p) -> torch.Tensor:
    """The 2-D map xq zero-padded by p, channels-last, every code stored as the unsigned byte code + 128 (its
    bits XOR 0x80) and the border as 128 (the code 0): the direct VNNI kernel's unsigned operand. One native
    pass, as pad_zero's."""
    xq = as_cl(xq)
    n, c, h, w = xq.shape
    if not (cl_row_stride(xq) == c and xq.stride(0) == h * w * c):
        xq = xq.contiguous(memory_format=torch.channels_last)
    xf = empty_cl((n, c, h + 2 * p[0], w + 2 * p[1]), torch.int8)
    runtime.library().rq_pad_cl_flipped(xq.data_ptr(), xf.data_ptr(), n, h, w, c, p[0], p[1])
    return xf


@functools.lru_cache(maxsize=64)
def _weight_taps(strides, taps) -> torch.Tensor:
    flat = torch.zeros(1, dtype=torch.int64)
    for stride, t in zip(strides, taps, strict=True):
        flat = (flat[..., None] + torch.tensor(t, dtype=torch.int64) * stride).flatten()
    return flat


def weight_tap_table(w: torch.Tensor, taps=None) -> torch.Tensor:
    """Offsets (elements) of a weight's taps (its dimensions from the third) in its own strides: every tap in
    order, or `taps[i]` along spatial dimension i in that order (an input gradient's phase, reversed).
    Cached."""
    taps = tuple(tuple(range(kk)) for kk in w.shape[2:]) if taps is None else tuple(map(tuple, taps))
    return _weight_taps(tuple(w.stride()[2:]), taps)


def direct_weight(wq: torch.Tensor, groups: int, transposed: bool) -> tuple[torch.Tensor, tuple]:
    """The direct kernel's weight: a view (groups, out, in, *k) of the pass's product (the forward pass: the
    weight's output and input channels; the input gradient, `transposed`: the forward pass's input channels
    out, its output channels in), and its steps (group, input, output) for native.grouped_vnni. No copy: the
    kernel packs a channels-last weight (the layers' codes) a quad or 16 outputs a load, any other layout
    byte by byte."""
    cout, a, *k = wq.shape
    w = wq.view(groups, cout // groups, a, *k)
    w = w.transpose(1, 2) if transposed else w
    return w, (w.stride(0), w.stride(2), w.stride(1))


@functools.lru_cache(maxsize=64)
def block_starts_tensor(groups: int, blk: int) -> torch.Tensor:
    """block_starts as the int64 tensor the direct kernel reads."""
    return torch.tensor(block_starts(groups, blk), dtype=torch.int64)


def _direct_grouped(xq, wq, p, s, d, out, groups: int, blk: int, scale, out_dtype) -> torch.Tensor:
    """conv_exact of a grouped 2-D convolution on the direct VNNI kernel (native.grouped_vnni): blocks of
    `blk` groups (direct_block), each pixel's codes read from the flipped padded input, the weight read where
    it lies."""
    n, cin = xq.shape[:2]
    cout, k = wq.shape[0], tuple(wq.shape[2:])
    a, b = cin // groups, cout // groups
    xf = flipped_padded(xq, p)
    rows, taps = implicit_columns(xf, k, s, d, out)
    dtype = torch.int32 if scale is None or out_dtype != torch.bfloat16 else out_dtype
    y = empty_cl((n, cout, *out), dtype)
    y = native.as_float_view(y) if scale is not None and dtype == torch.int32 else y
    ymat = y.movedim(1, -1).view(-1, cout)
    w, steps = direct_weight(wq, groups, transposed=False)
    phase = (xf, rows, taps, weight_tap_table(w[0]), None)
    native.grouped_vnni([phase], a, b, blk, block_starts_tensor(groups, blk), w, steps, ymat, cout, scale)
    return y


def block_calls(groups: int, blk: int) -> list[tuple[int, int, int]]:
    """The native GEMM calls of a grouped product's blocks (block_starts): (first block, its first group,
    blocks), one batched call for the equally spaced blocks and one for an overlapping last block."""
    full = groups // blk
    return [(0, 0, full)] + ([(full, groups - blk, 1)] if groups % blk else [])
