"""Fast INT8 CPU backend, bit-exact to ``kernels.reference``.

Same API as ``kernels.reference``: int8 operands (values in [-127, 127], any strides or memory
format) in, exact int32 out (convolution results channels-last). Convolutions are 1-, 2- or 3-D by
the rank of ``x`` (N, C, *spatial).

Which torch ops run (timings: ``python -m kernels.bench``):

* Convolutions go to oneDNN's int8 convolution, ``torch.ops.onednn.qconv_pointwise`` with the weight
  prepacked by ``torch.ops.onednn.qconv_prepack``: the input shifted to uint8 with zero point 128
  (v + 128, a sign-bit flip), the int8 weight, unit scales, fp32 output. oneDNN accumulates in int32
  (zero-point compensation included, padded borders too) and converts to fp32, exact while every sum
  it converts is below 2^24. Two guards make that hold, chosen per CPU (``conv_route``):
  - scan (VNNI without AMX): oneDNN converts the compensated int32 sum at the end. The a-priori bound
    128 * max_oc ||w_oc||_1 usually proves |acc| < 2^24; when it does not, the output is scanned
    (``torch.aminmax``) and a batch chunk with any |value| >= 2^24 is recomputed exactly by im2col +
    ``torch._int_mm``.
  - bounded (AMX, or wherever the probe ``_compensation_rounds`` fails): oneDNN's AMX kernels round the
    uncompensated sum of (x + 128) * w to fp32 before subtracting 128 * sum(w) (the reading that fits
    the failures measured on an AMX Xeon, docs/measurements.md), so a small output can be wrong and the
    scan cannot see it. The weights alone must prove it: the input channels are split
    into at most 8 blocks in each of which (255 + 128) * ||w_oc||_1 < 2^24 (every sum either order can
    form), each block's fp32 output is exact, and the blocks' int32 outputs are added. Beyond 8 blocks
    (or a grouped weight over the bound) the convolution goes to im2col + ``torch._int_mm``.
  A shape oneDNN refuses (it does, on AMX, for some grouped convolutions) goes to im2col + _int_mm too.
  oneDNN runs on batch chunks of <= 8 MB of fp32 output (cache-sized, and below glibc's mmap
  threshold, where fresh pages cost page faults).
* Ungrouped convolutions with a 1x1 kernel and no padding, or with at most 64 output positions per
  image, go to im2col + ``torch._int_mm`` (int8 x int8 -> int32) instead: faster there (measured),
  and exact by construction. The im2col is one strided copy per batch chunk (<= 8 MB), a view for 1x1.
* ``conv_input_grad``: the transposed convolution as such convolutions of g with the weight flipped
  and its in/out channels swapped per group. Stride s > 1 is done polyphase: one stride-1
  convolution per input phase (s^d of them) with the sub-kernel of the taps that reach it, so no
  multiplications by inserted zeros; each phase's oneDNN output is written straight into its
  positions of dx.
* ``conv_weight_grad``: im2col over batch chunks + ``torch._int_mm`` (exact int32 whatever the
  reduction length N*P), int32 partial sums added. Grouped convolutions put blocks of groups into one
  matmul and keep its diagonal blocks, so depthwise is batched matmuls, not a loop over channels.
* ``linear_*``: ``torch._int_mm``.

Outputs of 32 MB and more (fresh mmap-ed memory on every call) are madvise-d for 2 MB transparent
huge pages before they are written: faulting them in 4 KB pages cost more than the int8 work itself
(``_huge_pages``).

CPU ``torch._int_mm`` misreads operands with a size-1 dimension whose strides are ambiguous (torch
2.13); such operands are copied to a fresh row-major layout first (``_mm_operand``).

Exactness of the oneDNN and ``_int_mm`` paths depends on the CPU: with VNNI (vpdpbusd, as here) they
are exact; without it oneDNN may use the saturating vpmaddubsw. Each path is therefore probed once on
saturation-prone operands, and a path that fails its probe is not used: convolutions then all go to
im2col + ``_int_mm``, and ``_int_mm`` itself to a float64 matmul (exact: integer sums < 2^53).

int32 contract: results are exact as long as the exact sum fits in int32, guaranteed when the
reduction length K < 2^31 / 127^2 = 133,144 (K = Cin/groups * prod(kernel) for the forward pass,
Cout/groups * prod(kernel) for the input gradient, N * prod(output spatial) for the weight gradient,
K for a linear layer).
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import math
import os
import sys
from collections.abc import Sequence

import torch

from kernels import native
from kernels.cpu_quantize import absmax, absmax_quantize, channel_stats, dequantize, quantize
from kernels.geometry import check_grad_output, conv_geometry

__all__ = [
    "absmax",
    "absmax_quantize",
    "channel_stats",
    "dequantize",
    "quantize",
    "conv_forward",
    "conv_input_grad",
    "conv_weight_grad",
    "linear_forward",
    "linear_input_grad",
    "linear_weight_grad",
]

_HUGE_PAGE = 2 << 20  # x86-64 transparent huge page
_MADV_HUGEPAGE = 14
_OWN_MAPPING_BYTES = 32 << 20  # glibc's largest mmap threshold (64-bit): bigger blocks are always mmap-ed
_F32_EXACT = 1 << 24  # every integer with |v| < 2^24 is exact in fp32
_ZP = 128  # uint8 zero point: int8 v is stored as v + 128
# weight grad: batch chunk such that the im2col of a chunk has about this many bytes (measured: 8 MB
# beat 2 and 16 MB and an unchunked im2col, whose fresh >32 MB buffers cost page faults)
_IM2COL_CHUNK_BYTES = 8 << 20
# oneDNN convolutions: batch chunk such that a chunk's fp32 output has about this many bytes
_OUT_CHUNK_BYTES = 8 << 20
_CHUNK_IMAGES = None  # tests: force this many images per batch chunk
# convolutions with at most this many output positions per image go to im2col + _int_mm
_SMALL_OUT = 64


# ----------------------------------------------------------------------------------------------------
# helpers


def _check(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.int8:
            raise TypeError(f"expected an int8 tensor, got {t.dtype}")
        if t.device.type != "cpu":
            raise ValueError(f"kernels.cpu got a tensor on {t.device}")


@functools.cache
def _madvise():
    """libc's madvise (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


def _huge_pages(t: torch.Tensor) -> torch.Tensor:
    """Ask Linux to back a fresh, not yet written tensor with 2 MB pages (madvise MADV_HUGEPAGE).

    Outputs of tens of MB are fresh mmap-ed memory on every call, and faulting it in 4 KB pages cost
    more than the int8 matmul writing it (25088x128 @ 128x512: 34 ms fresh vs 8 ms into a reused
    buffer, 13 ms with 2 MB pages, measured). Only a hint: without transparent huge pages it does nothing.
    """
    nbytes = t.numel() * t.element_size()
    # from 32 MB, glibc always maps a block on its own (and unmaps it when freed): the hint then stays
    # with this buffer instead of splitting the heap's mapping
    madvise = _madvise() if nbytes >= _OWN_MAPPING_BYTES else None
    if madvise is not None:
        start = -(-t.data_ptr() // _HUGE_PAGE) * _HUGE_PAGE
        end = (t.data_ptr() + nbytes) // _HUGE_PAGE * _HUGE_PAGE
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)
    return t


def _empty_cl(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised (N, C, *spatial) tensor laid out channels-last (C innermost), for any rank."""
    n, c, *sp = shape
    return _huge_pages(torch.empty((n, *sp, c), dtype=dtype)).movedim(-1, 1)


def _is_cl(t: torch.Tensor) -> bool:
    return t.shape[1] == 1 or t.stride(1) == 1


def _as_cl(t: torch.Tensor) -> torch.Tensor:
    """t laid out channels-last (a copy unless it already is), for any rank."""
    return t if _is_cl(t) else t.movedim(1, -1).contiguous().movedim(-1, 1)


def _to_u8(t: torch.Tensor) -> torch.Tensor:
    """int8 v -> uint8 v + 128 (the sign bit flipped), channels-last, in one pass."""
    out = _empty_cl(t.shape, torch.uint8)
    torch.bitwise_xor(t.view(torch.uint8), _ZP, out=out)
    return out


def _mm_operand(t: torch.Tensor) -> torch.Tensor:
    """A layout torch._int_mm reads correctly: row- or column-major with no size-1 dimension.

    With a size-1 dimension the strides are ambiguous (e.g. (1, 1)) and CPU _int_mm then returns
    wrong results (torch 2.13); such operands, and other non-BLAS layouts, get a fresh row-major copy.
    """
    r, c = t.shape
    if r > 1 and c > 1:
        if (t.stride(1) == 1 and t.stride(0) >= c) or (t.stride(0) == 1 and t.stride(1) >= r):
            return t
    return torch.empty_strided((r, c), (c, 1), dtype=t.dtype).copy_(t)


@functools.cache
def _int_mm_exact() -> bool:
    """True if torch._int_mm is exact here (it is with VNNI; probe saturation-prone operands once)."""
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randint(-127, 128, (64, 96), generator=gen, dtype=torch.int8)
        b = torch.randint(-127, 128, (96, 48), generator=gen, dtype=torch.int8)
        a[:16] = 127
        a[16:32] = -127
        b[:, :8] = 127
        b[:, 8:16] = -127
        ok = torch.equal(torch._int_mm(a, b).to(torch.int64), a.to(torch.int64) @ b.to(torch.int64))
        ok &= torch.equal(torch._int_mm(a, b.t().contiguous().t()).to(torch.int64), a.long() @ b.long())
        return bool(ok)
    except Exception:
        return False


@functools.cache
def torch_int8_fast() -> bool:
    """Whether torch's own int8 CPU kernels (oneDNN, _int_mm) are the fast route here: with VNNI. Elsewhere
    they run scalar loops (2-6 GOPS against 180 GFLOPS of fp32 on a Zen 3, measured) and the native
    GEMM (kernels/native/gemm.cpp) takes over. REPRO_CPU_GEMM=torch|native forces a route."""
    forced = os.environ.get("REPRO_CPU_GEMM")
    if forced in ("torch", "native"):
        return forced == "torch" or not native.available()
    return bool(torch.cpu._is_vnni_supported()) or not native.available()


def _mm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Exact int8 (M, K) @ int8 (K, N) -> int32 (M, N) (into ``out``, a contiguous int32, if given)."""
    if not torch_int8_fast():
        if out is None:
            out = _huge_pages(torch.empty((a.shape[0], b.shape[1]), dtype=torch.int32))
        return native.gemm(a, b, out)
    if _int_mm_exact():
        a, b = _mm_operand(a), _mm_operand(b)
        if out is None:
            out = _huge_pages(torch.empty((a.shape[0], b.shape[1]), dtype=torch.int32))
        return torch._int_mm(a, b, out=out)
    # float64 sums of int8 products are exact (|sum| < 2^53)
    r = torch.mm(a.to(torch.float64), b.to(torch.float64)).to(torch.int32)
    return r if out is None else out.copy_(r)


def _batch_chunk(n: int, bytes_per_image: int, budget: int) -> int:
    """Images per chunk so that a chunk's temporary has about ``budget`` bytes (at least one image)."""
    if _CHUNK_IMAGES is not None:
        return max(1, min(n, _CHUNK_IMAGES))
    return max(1, min(n, budget // max(1, bytes_per_image)))


# ----------------------------------------------------------------------------------------------------
# oneDNN int8 convolution (fp32 output) and its exact im2col fallback


def _prepack(wq: torch.Tensor, s, p, d, groups: int, x_shape):
    """oneDNN's prepacked int8 weight for inputs of ``x_shape`` (unit scales, u8 input at zero point 128)."""
    w_scale = torch.ones(wq.shape[0], dtype=torch.float32)
    return torch.ops.onednn.qconv_prepack(
        wq.contiguous(), w_scale, 1.0, _ZP, list(s), list(p), list(d), groups, list(x_shape)
    )


def _qconv_run(xu: torch.Tensor, wq: torch.Tensor, packed, s, p, d, groups: int) -> torch.Tensor:
    """oneDNN u8 (zero point 128) x s8 convolution of ``xu`` with the prepacked ``wq``, fp32 output
    (channels-last). ``wq`` itself is passed so that tests can stand in for oneDNN."""
    cout = wq.shape[0]
    w_scale = torch.ones(cout, dtype=torch.float32)
    w_zp = torch.zeros(cout, dtype=torch.int64)
    return torch.ops.onednn.qconv_pointwise(
        xu, 1.0, _ZP, packed, w_scale, w_zp, None, list(s), list(p), list(d), groups,
        1.0, 0, torch.float32, "none", [], "",
    )  # fmt: skip


def _qconv(xu: torch.Tensor, wq: torch.Tensor, s, p, d, groups: int) -> torch.Tensor:
    """One oneDNN int8 convolution, fp32 output (channels-last)."""
    return _qconv_run(xu, wq, _prepack(wq, s, p, d, groups, xu.shape), s, p, d, groups)


@functools.cache
def _onednn_exact() -> bool:
    """True if the oneDNN int8 convolution is exact here (probe saturation-prone operands once) and is
    the fast route (torch_int8_fast)."""
    if not torch_int8_fast():
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randint(-127, 128, (2, 64, 7, 7), generator=gen, dtype=torch.int8)
        w = torch.randint(-127, 128, (32, 64, 3, 3), generator=gen, dtype=torch.int8)
        x[0] = 127
        w[:8] = 127
        w[8:16] = -127
        w[16:24, 1::2] = -127
        ok = True
        for groups, wt in ((1, w), (64, w[:, :1].repeat(2, 1, 1, 1))):
            want = torch.nn.functional.conv2d(x.double(), wt.double(), padding=1, groups=groups)
            got = _qconv(_to_u8(x), wt, (1, 1), (1, 1), (1, 1), groups)
            ok &= torch.equal(got.double(), want)
        return bool(ok)
    except Exception:
        return False


# ----------------------------------------------------------------------------------------------------
# which guard makes oneDNN's fp32 output exact: the output scan, or a bound on the weights alone

_AMX_ISAS = ("AMX", "DEFAULT", "ALL")  # ONEDNN_MAX_CPU_ISA values that leave oneDNN's AMX kernels on
# every sum an AMX convolution may hold in fp32 (the uncompensated sum of (x + 128) * w, up to 255 per
# code, and the compensation 128 * sum(w), in either order) is at most this many times ||w_oc||_1
_AMX_SUM = 255 + _ZP
_MAX_BLOCKS = 8  # input-channel blocks per convolution on the bounded route; more go to im2col + _int_mm


def _amx_in_use() -> bool:
    """Whether oneDNN may run its AMX kernels here: the CPU has AMX tiles and ONEDNN_MAX_CPU_ISA (or its
    older name DNNL_MAX_CPU_ISA) does not cap oneDNN below AMX."""
    if not torch.cpu._is_amx_tile_supported():
        return False
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return not cap or any(name in cap for name in _AMX_ISAS)


@functools.cache
def _compensation_rounds() -> bool:
    """Probe: does oneDNN round an uncompensated sum to fp32 before subtracting the zero-point
    compensation? Outputs near 0 whose uncompensated sums 127 * sum(x + 128) are odd and above 2^24
    (not representable in fp32) come out wrong if it does; the output scan cannot see that."""
    try:
        gen = torch.Generator().manual_seed(1)
        x = torch.randint(-2, 3, (2, 160, 5, 5), generator=gen, dtype=torch.int8)  # K = 1440 taps
        w = torch.full((16, 160, 3, 3), 127, dtype=torch.int8)
        w[8:] = -127
        want = torch.nn.functional.conv2d(x.double(), w.double())
        got = _qconv(_to_u8(x), w, (1, 1), (0, 0), (1, 1), 1)
        return not torch.equal(got.double(), want)
    except Exception:
        return True


@functools.cache
def _onednn_bounded() -> bool:
    """True where oneDNN's exactness must be proven from the weights alone (AMX, or a failed probe):
    the bounded route. Elsewhere (VNNI) the output scan guards it: the scan route.
    REPRO_ONEDNN_GUARD=bounded forces the bounded route (exact on every CPU: the suite's second run)."""
    if os.environ.get("REPRO_ONEDNN_GUARD") == "bounded":
        return True
    return _amx_in_use() or _compensation_rounds()


def conv_route() -> str:
    """The route convolutions take on this CPU: 'native' (no VNNI: kernels/native, integer arithmetic),
    'onednn-scan' (VNNI: oneDNN, an output scan sends chunks at or above 2^24 to im2col + _int_mm),
    'onednn-bounded' (AMX: oneDNN on input-channel blocks whose weights bound every sum below 2^24),
    'im2col' (oneDNN not exact here: im2col + _int_mm throughout)."""
    if not torch_int8_fast():
        return "native"
    if not _onednn_exact():
        return "im2col"
    return "onednn-bounded" if _onednn_bounded() else "onednn-scan"


def clear_route_caches() -> None:
    """Forget every route decision (probes, the forced route, oneDNN's refusals): they are made again
    under the environment at the next call. For tests that change REPRO_CPU_GEMM, REPRO_ONEDNN_GUARD
    or ONEDNN_MAX_CPU_ISA."""
    for probe in (torch_int8_fast, _int_mm_exact, _onednn_exact, _compensation_rounds, _onednn_bounded):
        probe.cache_clear()
    _REFUSED.clear()


def _channel_blocks(wq: torch.Tensor, groups: int) -> list[tuple[int, int]] | None:
    """Input-channel blocks [c0, c1) of ``wq`` in each of which _AMX_SUM * ||w_oc||_1 < 2^24 for every
    output channel: oneDNN's fp32 output of each block is then exact by construction, and the blocks'
    int32 sums add exactly. None when that takes more than _MAX_BLOCKS blocks, when one channel alone
    exceeds the bound, or when a grouped weight would need splitting."""
    limit = (_F32_EXACT - 1) // _AMX_SUM  # ||w_oc||_1 <= limit  <=>  _AMX_SUM * ||w_oc||_1 < 2^24
    l1 = wq.to(torch.int32).abs().flatten(2).sum(2)  # (Cout, Cin / groups): per input channel
    if int(l1.sum(1).max()) <= limit:
        return [(0, wq.shape[1])]
    if groups != 1:
        return None
    cum = l1.cumsum(1)
    blocks, c0 = [], 0
    while c0 < wq.shape[1]:
        reach = cum[:, c0:] - (cum[:, c0 - 1 : c0] if c0 else 0)
        fit = int(torch.searchsorted(reach.amax(0).contiguous(), limit, right=True))
        if fit == 0 or len(blocks) == _MAX_BLOCKS:
            return None
        blocks.append((c0, c0 + fit))
        c0 += fit
    return blocks


def _pad_zero(xq: torch.Tensor, p) -> torch.Tensor:
    """Zero-pad the spatial dims (int8), keeping the memory layout family."""
    if not any(p):
        return xq
    n, c, *sp = xq.shape
    shape = (n, c, *(a + 2 * b for a, b in zip(sp, p, strict=True)))
    xp = _empty_cl(shape, xq.dtype) if _is_cl(xq) else torch.empty(shape, dtype=xq.dtype)
    xp.zero_()
    xp[(slice(None), slice(None)) + tuple(slice(b, b + a) for a, b in zip(sp, p, strict=True))] = xq
    return xp


def _im2col(xp: torch.Tensor, k, s, d, out, channels_last: bool) -> torch.Tensor:
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


def _conv_exact(xq: torch.Tensor, wq: torch.Tensor, s, p, d, groups: int) -> torch.Tensor:
    """Exact convolution by im2col + _int_mm over batch chunks, channels-last int32 output.

    Groups are done blk at a time with a block-diagonal weight (zeros between the groups), so that
    depthwise convolutions are batched matmuls too.
    """
    nd = len(s)
    n, cin = xq.shape[:2]
    cout = wq.shape[0]
    k = tuple(wq.shape[2:])
    ntap = math.prod(k)
    out = tuple((xq.shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(nd))
    if _native_depthwise(nd, groups, cin, cout):
        return native.depthwise_forward(xq, wq, s, p, d, out)
    npos = math.prod(out)
    a, b = cin // groups, cout // groups
    blk = min(groups, max(1, 64 // max(a, b)))
    # weights as (Cout, prod(k) * a) with columns (k..., c), the order of the channels-last im2col
    wm = wq.movedim(1, -1).reshape(cout, ntap, a).contiguous()
    y = _empty_cl((n, cout, *out), torch.int32)
    ymat = y.movedim(1, -1).view(n * npos, cout)  # rows (n, o...), contiguous
    chunk = _batch_chunk(n, npos * ntap * cin, _IM2COL_CHUNK_BYTES)
    for n0 in range(0, n, chunk):
        n1 = min(n, n0 + chunk)
        xp = _pad_zero(_as_cl(xq[n0:n1]), p)
        rows = slice(n0 * npos, n1 * npos)
        for g0 in range(0, groups, blk):
            g1 = min(groups, g0 + blk)
            cols = _im2col(xp[:, g0 * a : g1 * a], k, s, d, out, True)  # (rows, prod(k) * B*a)
            if groups == 1:
                _mm(cols, wm.view(cout, -1).t(), out=ymat[rows])
                continue
            # block-diagonal weight (B*b, prod(k), B*a): group i of the block at [i*b.., :, i*a..]
            nb = g1 - g0
            wb = torch.zeros((nb, b, ntap, nb, a), dtype=wq.dtype)
            wb.diagonal(dim1=0, dim2=3).copy_(wm[g0 * b : g1 * b].view(nb, b, ntap, a).permute(1, 2, 3, 0))
            ymat[rows, g0 * b : g1 * b] = _mm(cols, wb.view(nb * b, -1).t())
    return y


def _native_depthwise(nd: int, groups: int, cin: int, cout: int) -> bool:
    """Depthwise 2-D convolutions go to the native kernels where the native GEMM is the route (as
    block-diagonal matmuls they multiplied 63 zeros for every useful product)."""
    return nd == 2 and groups == cin == cout and groups > 1 and not torch_int8_fast()


def _im2col_route(k, p, out, groups: int) -> bool:
    """Where im2col + _int_mm beats oneDNN (measured): 1x1 kernels without padding (the im2col is at
    most a strided copy; no uint8 conversion, prepack or fp32 round trip) and small outputs (<= 8x8
    positions per image, where oneDNN's int8 kernels are slow), both without groups."""
    if groups != 1:
        return False
    return (all(a == 1 for a in k) and not any(p)) or math.prod(out) <= _SMALL_OUT


# geometries oneDNN refused to prepack here (it does on some ISAs: AMX and a grouped 3x3 convolution of
# 120-channel groups, regnet_x_8gf's); they go to im2col + _int_mm without asking again
_REFUSED: set = set()


def _prepack_blocks(wq, blocks, s, p, d, groups: int, xq, chunk: int) -> list | None:
    """One prepacked weight per input-channel block, or None if oneDNN refuses the shape. Blocks split
    ungrouped weights only, so a block's input has (c1 - c0) * groups channels either way."""
    n = min(xq.shape[0], chunk)
    try:
        return [
            _prepack(wq[:, c0:c1], s, p, d, groups, (n, (c1 - c0) * groups, *xq.shape[2:]))
            for c0, c1 in blocks
        ]
    except RuntimeError:
        return None


def _qconv_blocks(xu, wq, blocks, packed, s, p, d, groups: int) -> torch.Tensor | None:
    """oneDNN's convolution of one batch chunk: fp32 for one block, the int32 sum of the blocks' exact
    outputs for several; None if oneDNN refuses the chunk."""
    try:
        if len(blocks) == 1:
            return _qconv_run(xu, wq, packed[0], s, p, d, groups)
        acc = None
        for (c0, c1), pk in zip(blocks, packed, strict=True):
            part = _qconv_run(xu[:, c0:c1], wq[:, c0:c1], pk, s, p, d, groups)
            part = part.view(torch.int32).copy_(part)  # exact: the block's bound holds
            acc = part if acc is None else acc.add_(part)
        return acc
    except RuntimeError:
        return None


def _conv_int(
    xq: torch.Tensor, wq: torch.Tensor, s, p, d, groups: int, u8_cache=None, dst=None, crop=None
) -> torch.Tensor:
    """Exact int32 convolution of int8 x with int8 w, channels-last.

    ``u8_cache``: a dict to keep x as uint8 + 128 in, for several convolutions of the same x.
    ``dst``, ``crop``: write the spatial window ``crop`` (slices) of the result into the int32 view
    ``dst`` instead (returned), straight from each batch chunk's output: the input gradient's phases
    land in dx without an intermediate int32 tensor per phase (half its copies, measured).
    """
    k = wq.shape[2:]
    out = [(xq.shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(len(s))]
    window = (slice(None), slice(None)) + tuple(crop if crop is not None else ())
    if not _onednn_exact() or _im2col_route(k, p, out, groups):
        y = _conv_exact(xq, wq, s, p, d, groups)
        return y if dst is None else dst.copy_(y[window])
    if _onednn_bounded():
        # AMX: the output scan cannot see a rounded uncompensated sum; the weights must prove every block
        blocks, checked = _channel_blocks(wq, groups), False
    else:
        # |x| <= 128, so |acc| <= 128 * max_oc ||w_oc||_1: if that is < 2^24 the fp32 output is exact
        blocks = [(0, wq.shape[1])]
        checked = _ZP * int(wq.to(torch.int32).abs().flatten(1).sum(1).max()) >= _F32_EXACT
    n = xq.shape[0]
    # batch chunks keep the fp32 intermediate cache-sized (and reused rather than freshly mapped)
    chunk = _batch_chunk(n, 4 * wq.shape[0] * math.prod(out), _OUT_CHUNK_BYTES)
    key = (tuple(wq.shape), tuple(xq.shape[1:]), min(n, chunk), tuple(s), tuple(p), tuple(d), groups)
    packed = None
    if blocks is not None and key not in _REFUSED:
        packed = _prepack_blocks(wq, blocks, s, p, d, groups, xq, chunk)
        if packed is None:
            _REFUSED.add(key)
    if packed is None:
        y = _conv_exact(xq, wq, s, p, d, groups)
        return y if dst is None else dst.copy_(y[window])
    u8_cache = {} if u8_cache is None else u8_cache
    if "u8" not in u8_cache:
        u8_cache["u8"] = _to_u8(xq)
    xu = u8_cache["u8"]
    y = None
    for n0 in range(0, n, chunk):
        part = _qconv_blocks(xu[n0 : n0 + chunk], wq, blocks, packed, s, p, d, groups)
        if part is None:  # oneDNN refused this chunk's shape
            part = _conv_exact(xq[n0 : n0 + chunk], wq, s, p, d, groups)
        elif checked:
            lo, hi = torch.aminmax(part)
            # fp32 rounding is monotonic and 2^24 is representable: |out| < 2^24 implies |acc| < 2^24
            if not (-_F32_EXACT < float(lo) and float(hi) < _F32_EXACT):
                part = _conv_exact(xq[n0 : n0 + chunk], wq, s, p, d, groups)
        if dst is not None:
            dst[n0 : n0 + chunk] = part[window]
            continue
        if chunk >= n:
            # fp32 -> int32 in place (same 4-byte slots, a full overlap copy_ allows): no second
            # output-sized buffer, whose fresh pages cost more than the conversion (measured 8x)
            return part if part.dtype == torch.int32 else part.view(torch.int32).copy_(part)
        if y is None:
            y = _empty_cl((n, wq.shape[0], *out), torch.int32)
        y[n0 : n0 + chunk] = part
    return dst if dst is not None else y


# ----------------------------------------------------------------------------------------------------
# public API


def conv_forward(xq, wq, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """y = conv(x, w) exactly (torch.nn.functional.conv{1,2,3}d semantics), int32 (N, Cout, *out)."""
    _check(xq, wq)
    nd, s, p, d, k, out = conv_geometry(xq.shape, wq.shape, stride, padding, dilation, groups)
    return _conv_int(xq, wq, s, p, d, groups)


def _phases(length: int, out: int, k: int, s: int, p: int, d: int):
    """Per-dimension polyphase plan of the transposed convolution.

    Input positions i = phi + s*j get dx[i] = sum_k g[o] w[k] over taps with o*s - p + k*d = i, i.e.
    (phi + p - k*d) % s == 0 and o = j + (phi + p - k*d) / s. Listing those taps in decreasing k
    makes o advance by dd = (tap step) * d / s per tap: a stride-1 correlation of g with the reversed
    sub-kernel, dilation dd, left padding -c_min. Yields (phi, n_phi, plan) with plan None when no
    tap reaches the phase, else (taps reversed, dd, symmetric padding P, crop start).
    """
    for phi in range(min(s, length)):
        n_phi = (length - phi + s - 1) // s
        taps = [t for t in range(k) if (phi + p - t * d) % s == 0]
        if not taps:
            yield phi, n_phi, None
            continue
        dd = (taps[1] - taps[0]) * d // s if len(taps) > 1 else 1
        pl = -((phi + p - taps[-1] * d) // s)  # left padding of g
        pr = n_phi + (len(taps) - 1) * dd - out - pl  # right padding that yields n_phi outputs
        pad = max(pl, pr, 0)
        yield phi, n_phi, (taps[::-1], dd, pad, pad - pl)


def conv_input_grad(gq, wq, input_shape, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """dL/dx for dL/dy = g (torch.nn.grad.conv{N}d_input), int32 of shape input_shape."""
    _check(gq, wq)
    input_shape = tuple(int(a) for a in input_shape)
    nd, s, p, d, k, out = conv_geometry(input_shape, wq.shape, stride, padding, dilation, groups)
    n, cin = input_shape[:2]
    cout = wq.shape[0]
    check_grad_output(gq.shape, (n, cout, *out))
    if _native_depthwise(nd, groups, cin, cout):
        return native.depthwise_input_grad(gq, wq, input_shape, s, p, d)
    a, b = cin // groups, cout // groups
    # transposed weight: per group (b, a, *k) -> (a, b, *k); flipping is done by the tap order below
    wt = wq.reshape(groups, b, a, *k).transpose(1, 2).reshape(cin, b, *k)
    plans = [list(_phases(input_shape[2 + i], out[i], k[i], s[i], p[i], d[i])) for i in range(nd)]
    u8_cache: dict = {}  # g as uint8, converted once for all phases (if oneDNN runs)
    dx = None
    if any(plan is None for dim in plans for _, _, plan in dim):
        dx = _empty_cl(input_shape, torch.int32).zero_()  # some positions get no tap: they stay 0
    for combo in itertools.product(*plans):
        if any(plan is None for _, _, plan in combo):
            continue
        w_sub = wt
        for i, (_, _, (taps, _, _, _)) in enumerate(combo):
            if list(taps) != list(range(k[i])):
                w_sub = w_sub.index_select(2 + i, torch.tensor(taps, dtype=torch.long))
        dil = tuple(plan[1] for _, _, plan in combo)
        pad = tuple(plan[2] for _, _, plan in combo)
        crop = tuple(slice(plan[3], plan[3] + n_phi) for _, n_phi, plan in combo)
        phase = tuple(slice(phi, None, s[i]) for i, (phi, _, _) in enumerate(combo))
        dst = (slice(None), slice(None)) + phase
        if all(si == 1 for si in s):
            y = _conv_int(gq, w_sub, (1,) * nd, pad, dil, groups, u8_cache)
            if tuple(y.shape[2:]) == input_shape[2:]:
                return y  # stride 1: a single phase covering everything
            dx = _empty_cl(input_shape, torch.int32) if dx is None else dx
            dx[dst] = y[(slice(None), slice(None)) + crop]
            continue
        dx = _empty_cl(input_shape, torch.int32) if dx is None else dx
        # the phase's output goes straight into its positions of dx
        _conv_int(gq, w_sub, (1,) * nd, pad, dil, groups, u8_cache, dst=dx[dst], crop=crop)
    return dx


def conv_weight_grad(xq, gq, weight_shape, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """dL/dw for dL/dy = g (torch.nn.grad.conv{N}d_weight), int32 of shape weight_shape."""
    _check(xq, gq)
    weight_shape = tuple(int(a) for a in weight_shape)
    nd, s, p, d, k, out = conv_geometry(xq.shape, weight_shape, stride, padding, dilation, groups)
    n, cin = xq.shape[:2]
    cout = weight_shape[0]
    check_grad_output(gq.shape, (n, cout, *out))
    a, b = cin // groups, cout // groups
    ntap = math.prod(k)
    if _native_depthwise(nd, groups, cin, cout):
        return native.depthwise_weight_grad(xq, gq, k, s, p, d)
    # groups per matmul: blk groups together give a (blk*a, blk*b) product whose diagonal blocks are
    # the per-group results (the batched exact formulation for depthwise and other many-group convs)
    blk = min(groups, max(1, 64 // max(a, b)))
    # im2col over chunks of the batch, so that the columns stay cache-sized (and below the size at
    # which every allocation is fresh mmap-ed memory); the int32 partial sums are added exactly
    chunk = _batch_chunk(n, math.prod(out) * ntap * cin, _IM2COL_CHUNK_BYTES)
    # matmul orientation (measured): (prod(k)*Cin, Cout) = cols^T g runs faster, but its transpose to
    # (Cout, Cin, *k) costs more than the matmul saves once the weight outgrows N * positions
    wide = cout * cin * ntap > n * math.prod(out)
    dw = None
    for n0 in range(0, n, chunk):
        xc = _as_cl(xq[n0 : n0 + chunk])
        cols = _im2col(_pad_zero(xc, p), k, s, d, out, True)  # (n*P, prod(k)*Cin), columns (k..., c)
        gt = _as_cl(gq[n0 : n0 + chunk]).movedim(1, -1).reshape(-1, cout)  # (n*P, Cout), a view
        if groups == 1 and wide:
            part = _mm(gt.t(), cols)  # (Cout, prod(k)*Cin)
        elif groups == 1:
            part = _mm(cols.t(), gt)  # (prod(k)*Cin, Cout)
        else:
            part = torch.empty((ntap, groups, a, b), dtype=torch.int32)
            for j in range(ntap):
                for g0 in range(0, groups, blk):
                    g1 = min(groups, g0 + blk)
                    r = _mm(cols[:, j * cin + g0 * a : j * cin + g1 * a].t(), gt[:, g0 * b : g1 * b])
                    # (B*a, B*b) -> (B, a, B, b) -> diagonal blocks (a, b, B)
                    part[j, g0:g1] = r.view(g1 - g0, a, g1 - g0, b).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        dw = part if dw is None else dw.add_(part)
    if groups == 1 and wide:  # (Cout, prod(k), Cin) -> (Cout, Cin, *k)
        return dw.view(cout, ntap, cin).transpose(1, 2).reshape(cout, cin, *k).contiguous()
    # (prod(k), groups, a, b) -> (groups, b, a, prod(k)) -> (Cout, a, *k)
    dw = dw.view(ntap, groups, a, b).permute(1, 3, 2, 0)
    return dw.reshape(cout, a, *k).contiguous()


def linear_forward(xq, wq) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T -> (M, N) int32."""
    _check(xq, wq)
    return _mm(xq, wq.t())


def linear_input_grad(gq, wq) -> torch.Tensor:
    """g (M, N) @ w (N, K) -> (M, K) int32."""
    _check(gq, wq)
    return _mm(gq, wq)


def linear_weight_grad(xq, gq) -> torch.Tensor:
    """g^T (N, M) @ x (M, K) -> (N, K) int32."""
    _check(xq, gq)
    return _mm(gq.t(), xq)
