"""The CPU backend's products: exact int8 convolutions and linear products, the route chosen per call.

Same API as ``kernels.reference``: int8 operands (values in [-127, 127], any strides or memory
format) in, exact int32 out (convolution results channels-last). Convolutions are 1-, 2- or 3-D by
the rank of ``x`` (N, C, *spatial).

Which torch ops run (timings: ``python -m kernels.bench.layers``):

* Convolutions go to oneDNN's int8 convolution, ``torch.ops.onednn.qconv_pointwise`` with the weight
  prepacked by ``torch.ops.onednn.qconv_prepack``: the input shifted to uint8 with zero point 128
  (v + 128, a sign-bit flip), the int8 weight, unit scales, fp32 output. oneDNN accumulates in int32
  (zero-point compensation included, padded borders too) and converts to fp32, exact while every sum
  it converts is below 2^24 (``kernels.cpu.onednn``). Two guards make that hold, chosen per CPU
  (``kernels.cpu.routes.conv_route``):
  - scan (VNNI without AMX): oneDNN converts the compensated int32 sum at the end. The a-priori bound
    128 * max_oc ||w_oc||_1 usually proves |acc| < 2^24; when it does not, the output is scanned
    (``torch.aminmax``) and a batch chunk with any |value| >= 2^24 is recomputed exactly by im2col +
    ``torch._int_mm``.
  - bounded (AMX, or wherever the probe ``routes.compensation_rounds`` fails): oneDNN's AMX kernels round the
    uncompensated sum of (x + 128) * w to fp32 before subtracting 128 * sum(w) (the reading that fits
    the failures measured on an AMX Xeon, docs/measurements.md), so a small output can be wrong and the
    scan cannot see it. The weights alone must prove it: the input channels are split
    into at most 8 blocks in each of which (255 + 128) * ||w_oc||_1 < 2^24 (every sum either order can
    form), each block's fp32 output is exact, and the blocks' int32 outputs are added. Beyond 8 blocks
    (or a grouped weight over the bound) the convolution goes to im2col + ``torch._int_mm``.
  A shape oneDNN refuses (it does, on AMX, for some grouped convolutions) goes to im2col + _int_mm too.
  oneDNN runs on batch chunks of <= 8 MB of fp32 output (cache-sized, and below glibc's mmap
  threshold, where fresh pages cost page faults) where that output is converted to int32; an output
  oneDNN scales itself is final, and one call writes it.
* Ungrouped convolutions with a 1x1 kernel and no padding, or with at most 64 output positions per
  image, go to im2col + ``torch._int_mm`` (int8 x int8 -> int32) instead: faster there (measured),
  and exact by construction. The im2col is one strided copy per batch chunk (<= 8 MB), a view for 1x1.
  Except, on the bounded route, a 1x1 whose bfloat16 output oneDNN scales itself in one proven block
  and whose output is large (``routes.pointwise_on_onednn``): oneDNN's there, up to 2x faster.
* ``conv_input_grad``: the transposed convolution as such convolutions of g with the weight flipped
  and its in/out channels swapped per group (ungrouped: built tap-major from rows of the weight,
  ``tap_major_transposed``, never a byte-wise transpose). Stride s > 1 is done polyphase: one stride-1
  convolution per input phase (s^d of them) with the sub-kernel of the taps that reach it, so no
  multiplications by inserted zeros; each phase's oneDNN output is written straight into its
  positions of dx.
* ``conv_weight_grad``: im2col over batch chunks + ``torch._int_mm`` (exact int32 whatever the
  reduction length N*P), int32 partial sums added. Grouped convolutions put blocks of groups into one
  matmul and keep its diagonal blocks (batched matmuls, not a loop over channels).
* On the native route (no VNNI), ungrouped 1x1 convolutions with stride 1 and no padding on channels-last
  operands: one native GEMM call per pass over the (N * positions, C) rows (``_pointwise_gemm``,
  ``_pointwise_weight_grad``), none of the general path's per-call Python (docs/measurements.md, issue 64).
* Depthwise 2-D convolutions, all three passes: the native kernels wherever they are built (``routes.
  native_depthwise``; as block-diagonal matmuls 63 of every 64 products were zeros).
* Other grouped convolutions whose blocks of groups have a multiple of 16 input channels (``im2col.
  group_block``), on the native GEMM's route: all three passes as one batched native GEMM call, each block
  of groups an ungrouped product with a block-diagonal weight, its input read in place through the implicit
  tables (``routes.native_grouped_conv``; oneDNN's grouped int8 convolutions ran at 0.2-0.7x bf16's speed on
  an Intel AMX Xeon, docs/measurements.md). Where the tile GEMM runs on AVX-512 VNNI (not AMX), 2-D ones'
  forward passes and input gradients take a direct kernel instead (``routes.grouped_vnni``, kernels/cpu/
  csrc/grouped.cpp: no block-diagonal zeros, no packed A; ``_direct_grouped_input_grad``).
* ``linear_*``: ``torch._int_mm``.

Outputs of 32 MB and more (fresh mmap-ed memory on every call) are madvise-d for 2 MB transparent
huge pages before they are written: faulting them in 4 KB pages cost more than the int8 work itself
(``kernels.cpu.memory``).

CPU ``torch._int_mm`` misreads operands with a size-1 dimension whose strides are ambiguous (torch
2.13); such operands are copied to a fresh row-major layout first (``im2col.mm_operand``).

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

import functools
import itertools
import math

import torch

from ..geometry import check_grad_output, conv_geometry
from . import im2col, native, onednn, routes
from .memory import as_cl, cl_row_stride, empty_cl, huge_pages
from .quantizer import _scale_vector, dequantize

# oneDNN convolutions: batch chunk such that a chunk's fp32 output has about this many bytes
OUT_CHUNK_BYTES = 8 << 20


@functools.lru_cache(maxsize=1024)
def _known_geometry(x_shape, w_shape, stride, padding, dilation, groups):
    return conv_geometry(x_shape, w_shape, stride, padding, dilation, groups)


def _geometry(x_shape, w_shape, stride, padding, dilation, groups):
    """conv_geometry, kept per set of arguments: a layer asks three times a step with the same ones (forward,
    input and weight gradients), and its checks and tuples cost about 40,000 instructions a call (callgrind,
    docs/measurements.md)."""

    def key(v):
        return v if isinstance(v, int) else tuple(v)

    return _known_geometry(tuple(x_shape), tuple(w_shape), key(stride), key(padding), key(dilation), groups)


def _check(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.int8:
            raise TypeError(f"expected an int8 tensor, got {t.dtype}")
        if t.device.type != "cpu":
            raise ValueError(f"kernels.cpu got a tensor on {t.device}")


def _as_dtype(y: torch.Tensor, scale, out_dtype) -> torch.Tensor:
    """A scaled float32 result as ``out_dtype``: rounded to nearest even for bfloat16, as the epilogue rounds
    the same float32 value (``dequantize``), channels-last kept."""
    return y if scale is None or y.dtype == out_dtype else y.to(out_dtype)


def _new_output(shape, scale, out_dtype) -> torch.Tensor:
    """A channels-last buffer for a product's result: int32, with ``scale`` the float32 view of an int32
    buffer (native.as_float_view), or ``out_dtype`` (bfloat16) itself."""
    if scale is not None and out_dtype != torch.float32:
        return empty_cl(shape, out_dtype)
    y = empty_cl(shape, torch.int32)
    return y if scale is None else native.as_float_view(y)


def _check_out_dtype(out_scale, out_dtype) -> None:
    if out_dtype not in EPILOGUE_DTYPES:
        raise ValueError(f"out_dtype must be one of {EPILOGUE_DTYPES}, got {out_dtype}")
    if out_dtype != torch.float32 and out_scale is None:
        raise ValueError("out_dtype other than float32 needs out_scale (an int32 result has no other dtype)")


def _conv_int(
    xq: torch.Tensor,
    wq: torch.Tensor,
    s,
    p,
    d,
    groups: int,
    u8_cache=None,
    dst=None,
    crop=None,
    scale=None,
    out_dtype=torch.float32,
    pad_to=None,
) -> torch.Tensor:
    """Exact int32 convolution of int8 x with int8 w, channels-last.

    ``u8_cache``: a dict to keep x as uint8 + 128 in, for several convolutions of the same x.
    ``dst``, ``crop``: write the spatial window ``crop`` (slices) of the result into the int32 view
    ``dst`` instead (returned), straight from each batch chunk's output: the input gradient's phases
    land in dx without an intermediate int32 tensor per phase (half its copies, measured); on the native
    GEMM's implicit route, each row straight from the GEMM (im2col.conv_exact), and x padded by ``pad_to``
    once for all phases.
    ``scale``: the result as float32 acc * scale (``dst`` float32 then), bit for bit the epilogue's;
    ``out_dtype`` bfloat16: that value rounded to bfloat16 (``dst`` bfloat16), as ``dequantize(...,
    bfloat16)`` rounds it. ``wq``: a tensor, or the input gradient's TapMajor.
    """
    k = wq.shape[2:]
    out = [(xq.shape[2 + i] + 2 * p[i] - d[i] * (k[i] - 1) - 1) // s[i] + 1 for i in range(len(s))]
    window = (slice(None), slice(None)) + tuple(crop if crop is not None else ())
    depthwise = routes.native_depthwise(len(s), groups, xq.shape[1], wq.shape[0])
    to_im2col = depthwise or not routes.onednn_exact()
    to_im2col = to_im2col or routes.native_conv_on_tiles(xq.shape[1], groups)
    # grouped: the AMX GEMM's blocks of groups (im2col.group_block), where oneDNN's grouped int8 convolutions
    # ran at 0.2-0.7x bf16's speed (docs/measurements.md)
    to_im2col = to_im2col or routes.native_grouped_conv(xq.shape[1], wq.shape[0], groups)
    pointwise_blocks = None  # a 1x1 oneDNN takes from im2col_route: its weight's one proven block
    if not to_im2col and routes.im2col_route(k, p, out, groups):
        wq = _weight(wq)
        pointwise_blocks = _pointwise_onednn_blocks(xq, wq, p, out, groups, scale, out_dtype)
        to_im2col = pointwise_blocks is None
    if to_im2col and dst is not None:
        crop = tuple((c.start, c.stop) for c in crop)
        return im2col.conv_exact(xq, wq, s, p, d, groups, scale, out_dtype, dst=dst, crop=crop, pad_to=pad_to)
    if to_im2col:
        return _as_dtype(im2col.conv_exact(xq, wq, s, p, d, groups, scale, out_dtype), scale, out_dtype)
    wq = _weight(wq)  # oneDNN's routes take the weight as a tensor
    if routes.onednn_bounded():
        # AMX: the output scan cannot see a rounded uncompensated sum; the weights must prove every block
        blocks, checked = pointwise_blocks or onednn.channel_blocks(wq, groups), False
    else:
        # |x| <= 128, so |acc| <= 128 * max_oc ||w_oc||_1: if that is < 2^24 the fp32 output is exact
        blocks = [(0, wq.shape[1])]
        checked = onednn.ZP * int(onednn.abs_sums(wq, 1).max()) >= onednn.F32_EXACT
    if scale is not None:
        scale = _scale_vector(scale).reshape(-1)
        if checked or blocks is None or len(blocks) > 1 or scale.numel() != 1:
            # no proof that one fp32 output is exact (it is scanned, or the blocks' int32 sums are added):
            # the exact int32 result, then the epilogue. With the proof oneDNN scales its output itself,
            # which saves two passes over it (fp32 -> int32, then the epilogue's)
            y = dequantize(_conv_int(xq, wq, s, p, d, groups, u8_cache), scale, dtype=out_dtype, inplace=True)
            return y if dst is None else dst.copy_(y[window])
    n = xq.shape[0]
    # batch chunks keep the fp32 intermediate cache-sized (and reused rather than freshly mapped) where it
    # is converted to int32; a scaled output is final, and one call writes it without the chunks' copies
    per_image = 4 * wq.shape[0] * math.prod(out)
    budget = n * per_image if scale is not None and dst is None else OUT_CHUNK_BYTES
    chunk = routes.batch_chunk(n, per_image, budget)
    key = (tuple(wq.shape), tuple(xq.shape[1:]), min(n, chunk), tuple(s), tuple(p), tuple(d), groups)
    packed = None
    if blocks is not None and key not in onednn.REFUSED:
        packed = onednn.prepack_blocks(wq, blocks, s, p, d, groups, xq, chunk)
        if packed is None:
            onednn.REFUSED.add(key)
    if packed is None:
        y = im2col.conv_exact(xq, wq, s, p, d, groups, scale, out_dtype)
        return _as_dtype(y, scale, out_dtype) if dst is None else dst.copy_(y[window])
    u8_cache = {} if u8_cache is None else u8_cache
    if "u8" not in u8_cache:
        u8_cache["u8"] = onednn.to_u8(xq)
    xu = u8_cache["u8"]
    y = None
    for n0 in range(0, n, chunk):
        part = onednn.qconv_blocks(xu[n0 : n0 + chunk], wq, blocks, packed, s, p, d, groups, scale, out_dtype)
        if part is None:  # oneDNN refused this chunk's shape
            part = im2col.conv_exact(xq[n0 : n0 + chunk], wq, s, p, d, groups, scale)
        elif checked:
            lo, hi = torch.aminmax(part)
            # fp32 rounding is monotonic and 2^24 is representable: |out| < 2^24 implies |acc| < 2^24
            if not (-onednn.F32_EXACT < float(lo) and float(hi) < onednn.F32_EXACT):
                part = im2col.conv_exact(xq[n0 : n0 + chunk], wq, s, p, d, groups)
        if dst is not None:
            dst[n0 : n0 + chunk] = part[window]
            continue
        if chunk >= n:
            # oneDNN's bfloat16 (or a refused chunk's float32, rounded)
            if scale is not None and out_dtype != torch.float32:
                return _as_dtype(part, scale, out_dtype)
            if scale is not None:  # already the epilogue's float32, as its view of an int32 buffer
                return native.as_float_view(part.view(torch.int32))  # (autograd: native.py's docstring)
            # fp32 -> int32 in place (same 4-byte slots, a full overlap copy_ allows): no second
            # output-sized buffer, whose fresh pages cost more than the conversion (measured 8x)
            return part if part.dtype == torch.int32 else part.view(torch.int32).copy_(part)
        if y is None:
            y = _new_output((n, wq.shape[0], *out), scale, out_dtype)
        y[n0 : n0 + chunk] = part
    return dst if dst is not None else y


def _pointwise_onednn_blocks(xq, wq, p, out, groups: int, scale, out_dtype) -> list[tuple[int, int]] | None:
    """The weight's one proven block where a 1x1 convolution (no padding) goes to oneDNN although
    im2col_route would send it to _int_mm: its bfloat16 output is large (routes.pointwise_on_onednn) and
    oneDNN scales and writes it itself (the bounded route, one block, one scale); else None. With a float32
    output oneDNN was not faster in a step (MobileNetV2 gq 3-4% slower, Intel AMX), so float32 keeps
    _int_mm."""
    k = wq.shape[2:]
    if scale is None or out_dtype != torch.bfloat16 or groups != 1 or any(a != 1 for a in k) or any(p):
        return None
    if not routes.onednn_bounded() or _scale_vector(scale).numel() != 1 or routes.native_gemm():
        return None  # (on AMX the native GEMM writes bfloat16 itself and beats oneDNN: it takes these)
    if not routes.pointwise_on_onednn(xq.shape[0] * math.prod(out), xq.shape[1], wq.shape[0]):
        return None
    blocks = onednn.channel_blocks(wq, groups)
    return blocks if blocks is not None and len(blocks) == 1 else None


# ----------------------------------------------------------------------------------------------------
# 1x1 convolutions on the native GEMM: one call each, no im2col, no phases, no batch chunks


def _pointwise(k, s, p, groups) -> bool:
    """An ungrouped 1x1 convolution with stride 1 and no padding on the native GEMM's route: each pass is
    one GEMM over the channels-last rows. The general path costs 60-150 us of Python and torch dispatch a
    call (im2col views, chunks, the input gradient's phases), more than MobileNetV2's small layers compute
    (docs/measurements.md, issue 64); the products are the same exact int32 sums."""
    return (
        groups == 1
        and all(v == 1 for v in k)
        and all(v == 1 for v in s)
        and not any(p)
        and routes.native_gemm()
    )


def _rows_out(n, spatial, c, scale, out_dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A channels-last (N, C, *spatial) output, and the (rows, C) buffer its GEMM writes. int32; with a scale
    float32, made as conv_exact makes it (movedim, then native.as_float_view: a tensor autograd does not count
    as a view, which decides how it adds gradients, native's docstring), or bfloat16 (``out_dtype``)."""
    if scale is not None and out_dtype == torch.bfloat16:
        buf = huge_pages(torch.empty((n, *spatial, c), dtype=out_dtype))
        return buf.movedim(-1, 1), buf
    buf = huge_pages(torch.empty((n, *spatial, c), dtype=torch.int32))
    y = buf.movedim(-1, 1)
    return (y if scale is None else native.as_float_view(y)), buf


def _pointwise_gemm(aq, wq, scale, *, transposed: bool, out_dtype=torch.float32, add_to=None):
    """A 1x1 stride-1 product as one GEMM over the rows of channels-last `aq`: the forward pass
    y[r, o] = sum_c x[r, c] w[o, c]; `transposed`, the input gradient dx[r, c] = sum_o g[r, o] w[o, c].
    ``add_to``: a float32 tensor whose channels-last rows are the product's (its row stride m): the scaled
    product added into it, which is returned. None where the rows are not laid out so."""
    ld = cl_row_stride(aq)
    if ld is None:
        return None
    n, k, *sp = aq.shape
    m = wq.shape[1] if transposed else wq.shape[0]
    if add_to is not None:
        if cl_row_stride(add_to) != m:
            return None
        out, buf = add_to, add_to
    else:
        out, buf = _rows_out(n, sp, m, scale, out_dtype)
    w_strides = (wq.stride(0), wq.stride(1)) if transposed else (wq.stride(1), wq.stride(0))
    rows = n * math.prod(sp)
    native.gemm_rows(rows, m, k, aq, ld, 1, wq, *w_strides, buf, m, scale, add=add_to is not None)
    return out


def accumulating_input_grad(acc: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether conv_input_grad takes ``accumulate=acc`` for a `dtype` result (repro.layers): float32 both."""
    return dtype == torch.float32 and acc.dtype == torch.float32 and acc.device.type == "cpu"


def _accumulated_input_grad(gq, wq, input_shape, stride, padding, dilation, groups, scale, out_dtype, acc):
    """conv_input_grad with `accumulate`: acc + dx in acc's storage (conv_input_grad's docstring)."""
    if scale is None or out_dtype != torch.float32 or acc.dtype != torch.float32:
        raise ValueError("conv_input_grad accumulates a float32 result (out_scale) in a float32 tensor only")
    if tuple(acc.shape) != tuple(int(a) for a in input_shape) or acc.device.type != "cpu":
        raise ValueError(f"conv_input_grad: accumulate is {tuple(acc.shape)}, the input {tuple(input_shape)}")
    _check(gq, wq)
    _, s, p, _, k, out = _geometry(tuple(acc.shape), wq.shape, stride, padding, dilation, groups)
    # in the product on the tile GEMM only, where it was measured: the vector GEMM (AVX2) keeps its int32 sums
    # in C, so it would add from a buffer of its own, one thread, where torch's add below runs on all
    if routes.native_tiles() and _pointwise(k, s, p, groups):
        check_grad_output(gq.shape, (acc.shape[0], wq.shape[0], *out))
        if _pointwise_gemm(gq, wq, scale, transposed=True, add_to=acc) is not None:
            return acc
    dx = conv_input_grad(gq, wq, input_shape, stride, padding, dilation, groups, scale, out_dtype)
    return acc.add_(dx)  # float32's sum, as autograd's add of the two gradients


def _weight_grad_out(rows: int, cols: int, scale) -> torch.Tensor:
    """A weight gradient's product: int32, or with `scale` its float32 values (a float32 view of an int32
    buffer, as the epilogue in place leaves them)."""
    dw = torch.empty((rows, cols), dtype=torch.int32)
    return dw if scale is None else native.as_float_view(dw)


def _scale_axis(scale, wide: bool) -> int:
    """rq_gemm_s8's scale_axis for a weight gradient's scale: one value (-1), or one per output channel, the
    rows of a wide product (Cout, ...), the columns of the other ((...), Cout)."""
    if scale is None or scale.numel() == 1:
        return -1
    return 0 if wide else 1


def _pointwise_weight_grad(xq, gq, weight_shape, scale=None) -> torch.Tensor | None:
    lx, lg = cl_row_stride(xq), cl_row_stride(gq)
    if lx is None or lg is None:
        return None
    cout, cin, *k = weight_shape
    rows = gq.shape[0] * math.prod(gq.shape[2:])
    # the general path's layouts (conv_weight_grad): a wide weight as the channels-last view of (Cout, Cin),
    # else the (Cin, Cout) product made contiguous (Cout, Cin, *k)
    wide = cout * cin > rows
    axis = _scale_axis(scale, wide)
    if wide:
        dw = _weight_grad_out(cout, cin, scale)
        native.gemm_rows(cout, cin, rows, gq, 1, lg, xq, lx, 1, dw, cin, scale, axis)  # g^T x
        return dw.view(cout, *k, cin).movedim(-1, 1)
    dw = _weight_grad_out(cin, cout, scale)
    native.gemm_rows(cin, cout, rows, xq, 1, lx, gq, lg, 1, dw, cout, scale, axis)  # x^T g
    return dw.view(1, 1, cin, cout).permute(1, 3, 2, 0).reshape(cout, cin, *k).contiguous()  # as there


# ----------------------------------------------------------------------------------------------------
# public API


def conv_forward(
    xq, wq, stride=1, padding=0, dilation=1, groups=1, out_scale=None, out_dtype=torch.float32
) -> torch.Tensor:
    """y = conv(x, w) exactly (torch.nn.functional.conv{1,2,3}d semantics), int32 (N, Cout, *out).
    ``out_scale`` (a one-element tensor): float32 y * out_scale instead, bit for bit ``dequantize(y,
    out_scale)``; on the native route, and on oneDNN's with one proven block, without a pass of its own.
    ``out_dtype`` bfloat16 (with out_scale): bit for bit ``dequantize(y, out_scale, dtype=bfloat16)``,
    written by oneDNN itself where it scales its output."""
    _check(xq, wq)
    _check_out_dtype(out_scale, out_dtype)
    nd, s, p, d, k, out = _geometry(xq.shape, wq.shape, stride, padding, dilation, groups)
    if routes.native_depthwise(nd, groups, xq.shape[1], wq.shape[0]):  # where _conv_int would send it
        return native.depthwise_forward(xq, wq, s, p, d, out, out_scale, out_dtype)
    if _pointwise(k, s, p, groups):
        y = _pointwise_gemm(xq, wq, out_scale, transposed=False, out_dtype=out_dtype)
        if y is not None:
            return _as_dtype(y, out_scale, out_dtype)
    return _conv_int(xq, wq, s, p, d, groups, scale=out_scale, out_dtype=out_dtype)


def epilogue_in_products() -> bool:
    """Whether repro.layers passes conv_forward, conv_input_grad and (float32) conv_weight_grad the
    ``out_scale``, so that the products apply the dequantizing epilogue themselves. On every CPU route: the
    native GEMM and depthwise kernels write the scaled float32 result (the epilogue took 4-6% of a ResNet-50
    or MobileNetV2 step on a Zen 3), oneDNN scales its own output where one fp32 output is proven exact (its
    int32 conversion and the epilogue's pass saved, on VNNI and AMX CPUs), and the other routes run the same
    epilogue in place on their int32 result (docs/measurements.md)."""
    return True


# the dtypes conv_forward and conv_input_grad write the scaled result in (out_dtype)
EPILOGUE_DTYPES = (torch.float32, torch.bfloat16)


def epilogue_dtypes() -> tuple[torch.dtype, ...]:
    """The output dtypes in which the products apply the dequantizing epilogue themselves (out_dtype):
    float32, and bfloat16 for layers under CPU autocast (repro step-time's ``<method>+bf16``), where oneDNN
    writes the rounded bfloat16 value directly instead of float32 and a second pass."""
    return EPILOGUE_DTYPES


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


def _reached_phases(plans):
    """The input phases of _phases' per-dimension plans that some tap reaches: (combo, taps, dilation,
    padding, sub-kernel size), each per dimension, for a grouped input gradient's calls."""
    for combo in itertools.product(*plans):
        if any(plan is None for _, _, plan in combo):
            continue
        taps = tuple(tuple(plan[0]) for _, _, plan in combo)
        dil = tuple(plan[1] for _, _, plan in combo)
        pad = tuple(plan[2] for _, _, plan in combo)
        yield combo, taps, dil, pad, tuple(len(t) for t in taps)


def _largest_padding(plans) -> tuple[int, ...]:
    """Per dimension, the largest padding of g any phase of _phases' plans needs: the phases pad g once, by
    this much, and read their corners of it (im2col.padded_from)."""
    return tuple(max((plan[2] for _, _, plan in dim if plan is not None), default=0) for dim in plans)


# tap_major_transposed: weights of up to this many codes with every tap are built by a flip and one copy (two
# passes over the weight, three dispatches); larger ones copy once, tap by tap
TAP_MAJOR_ONE_OP = 1 << 16


def tap_major_transposed(wq: torch.Tensor, taps) -> torch.Tensor:
    """The ungrouped transposed convolution's weight (Cin, Cout, *len(taps)) with wq's taps[i] along
    spatial dimension i, in that order, laid out tap-major, (*taps, Cout, Cin) in memory.

    Built one (Cout, Cin) slice per tap, which for a channels-last wq copies rows of Cin contiguous codes;
    transposing the weight itself (or index_select on its transposed view) moves single bytes, several
    times slower (docs/measurements.md). conv_exact reads the result as a view."""
    nd = len(taps)
    k = wq.shape[2:]
    whole = all(list(t) in (list(range(k[i])), list(range(k[i]))[::-1]) for i, t in enumerate(taps))
    if whole and wq.numel() <= TAP_MAJOR_ONE_OP:
        # every tap, in order or reversed: a flip and one copy, not one copy (and two selects) per tap
        flipped = [2 + i for i, t in enumerate(taps) if len(t) > 1 and t[0] > t[-1]]
        w = wq.flip(flipped) if flipped else wq
        return w.permute(*range(2, 2 + nd), 0, 1).contiguous().permute(nd + 1, nd, *range(nd))
    out = torch.empty((*(len(t) for t in taps), *wq.shape[:2]), dtype=wq.dtype)
    for idx in itertools.product(*(range(len(t)) for t in taps)):
        out[idx].copy_(wq[(slice(None), slice(None), *(t[i] for t, i in zip(taps, idx, strict=True)))])
    return out.permute(nd + 1, nd, *range(nd))


class TapMajor:
    """tap_major_transposed(wq, taps), made only where a route needs it as a tensor (``tensor``): the AMX
    GEMM's implicit im2col reads its operand from wq itself, through a table of the rows of Cin codes
    (``im2col.conv_exact``), which spares a copy of the weight per phase and step (10 ms of a ResNet-50
    step at 112 px, Intel AMX, docs/measurements.md)."""

    def __init__(self, wq: torch.Tensor, taps):
        self.wq, self.taps = wq, [list(t) for t in taps]
        self.shape = torch.Size((wq.shape[1], wq.shape[0], *(len(t) for t in self.taps)))

    def tensor(self) -> torch.Tensor:
        return tap_major_transposed(self.wq, self.taps)

    def operand_rows(self) -> tuple[torch.Tensor, int] | None:
        """(table, stride) of the GEMM operand (prod(taps) * Cout, Cin), rows (taps..., cout) as the
        tensor's: row v at table[v], its Cin codes `stride` apart (1 for a channels-last wq), or None where
        wq's codes of one row are not contiguous."""
        if self.wq.stride(1) != 1:
            return None
        return _tap_major_rows(tuple(self.wq.shape), tuple(self.wq.stride()), tuple(map(tuple, self.taps))), 1


@functools.lru_cache(maxsize=256)
def _tap_major_rows(shape, strides, taps) -> torch.Tensor:
    offsets = torch.zeros(1, dtype=torch.int64)
    for i, t in enumerate(taps):  # tap (t0, t1, ...) at sum of t_i * stride of spatial dim i
        offsets = (offsets[..., None] + torch.tensor(t, dtype=torch.int64) * strides[2 + i]).flatten()
    return (offsets[:, None] + torch.arange(shape[0], dtype=torch.int64) * strides[0]).flatten()


def _weight(wq) -> torch.Tensor:
    return wq.tensor() if isinstance(wq, TapMajor) else wq


def conv_input_grad(
    gq,
    wq,
    input_shape,
    stride=1,
    padding=0,
    dilation=1,
    groups=1,
    out_scale=None,
    out_dtype=torch.float32,
    accumulate=None,
) -> torch.Tensor:
    """dL/dx for dL/dy = g (torch.nn.grad.conv{N}d_input), int32 of shape input_shape (``out_scale`` and
    ``out_dtype``: as conv_forward's). ``accumulate`` (with a float32 ``out_scale`` result): a float32 tensor
    of input_shape that is returned holding accumulate + dx, float32's sum, as autograd adds two gradients
    of one tensor: on the 1x1 route, where its channels-last rows are the product's, added as the product
    is written (one pass over it, not the product's and then the sum's); elsewhere by an add after it."""
    if accumulate is not None:
        return _accumulated_input_grad(gq, wq, input_shape, stride, padding, dilation, groups, out_scale,
                                       out_dtype, accumulate)  # fmt: skip
    _check(gq, wq)
    _check_out_dtype(out_scale, out_dtype)
    input_shape = tuple(int(a) for a in input_shape)
    nd, s, p, d, k, out = _geometry(input_shape, wq.shape, stride, padding, dilation, groups)
    n, cin = input_shape[:2]
    cout = wq.shape[0]
    check_grad_output(gq.shape, (n, cout, *out))
    if routes.native_depthwise(nd, groups, cin, cout):
        return native.depthwise_input_grad(gq, wq, input_shape, s, p, d, out_scale, out_dtype)
    if _pointwise(k, s, p, groups):
        dx = _pointwise_gemm(gq, wq, out_scale, transposed=True, out_dtype=out_dtype)
        if dx is not None:
            return _as_dtype(dx, out_scale, out_dtype)
    a, b = cin // groups, cout // groups
    grouped = routes.native_grouped_conv(cin, cout, groups)
    direct = im2col.direct_block(groups, b, a) if grouped and nd == 2 else None  # (g's b channels a group in)
    if direct is not None:
        return _direct_grouped_input_grad(gq, wq, input_shape, s, p, d, k, out, groups, direct, out_scale,
                                          out_dtype)  # fmt: skip
    blk = im2col.group_block(groups, a, b, tuple(k), tuple(s)) if grouped else None  # (the forward pass's)
    if blk is not None and im2col.table_run_ok(blk * b):
        return _grouped_input_grad(gq, wq, input_shape, s, p, d, k, out, groups, blk, out_scale, out_dtype)
    # grouped: the transposed weight, per group (b, a, *k) -> (a, b, *k), flipped by the tap order below
    # (ungrouped weights are built per phase by tap_major_transposed)
    wt = None if groups == 1 else wq.reshape(groups, b, a, *k).transpose(1, 2).reshape(cin, b, *k)
    plans = [list(_phases(input_shape[2 + i], out[i], k[i], s[i], p[i], d[i])) for i in range(nd)]
    u8_cache: dict = {}  # g as uint8, converted once for all phases (if oneDNN runs)
    pad_to = _largest_padding(plans)  # (the native route's one padded g, im2col.padded_from)
    dx = None
    if any(plan is None for dim in plans for _, _, plan in dim):
        # some positions get no tap: they stay 0 (0 and 0.0 have the same bits)
        dx = _new_output(input_shape, out_scale, out_dtype).zero_()
    for combo in itertools.product(*plans):
        if any(plan is None for _, _, plan in combo):
            continue
        if groups == 1:
            w_sub = TapMajor(wq, [plan[0] for _, _, plan in combo])
        else:
            w_sub, flipped = wt, []
            for i, (_, _, (taps, _, _, _)) in enumerate(combo):
                if list(taps) == list(range(k[i]))[::-1]:
                    flipped.append(2 + i)  # all taps reversed: one flip for every such dimension
                elif list(taps) != list(range(k[i])):
                    w_sub = w_sub.index_select(2 + i, torch.tensor(taps, dtype=torch.long))
            if flipped:  # one pass, not an index_select per dimension (docs/measurements.md)
                w_sub = w_sub.flip(flipped)
        dil = tuple(plan[1] for _, _, plan in combo)
        pad = tuple(plan[2] for _, _, plan in combo)
        crop = tuple(slice(plan[3], plan[3] + n_phi) for _, n_phi, plan in combo)
        phase = tuple(slice(phi, None, s[i]) for i, (phi, _, _) in enumerate(combo))
        dst = (slice(None), slice(None)) + phase
        if all(si == 1 for si in s):
            y = _conv_int(
                gq, w_sub, (1,) * nd, pad, dil, groups, u8_cache, scale=out_scale, out_dtype=out_dtype
            )
            if tuple(y.shape[2:]) == input_shape[2:]:
                return y  # stride 1: a single phase covering everything
            dx = _new_output(input_shape, out_scale, out_dtype) if dx is None else dx
            dx[dst] = y[(slice(None), slice(None)) + crop]
            continue
        dx = _new_output(input_shape, out_scale, out_dtype) if dx is None else dx
        # the phase's output goes straight into its positions of dx
        _conv_int(gq, w_sub, (1,) * nd, pad, dil, groups, u8_cache, dst=dx[dst], crop=crop, scale=out_scale,
                  out_dtype=out_dtype, pad_to=pad_to)  # fmt: skip
    return dx


@functools.lru_cache(maxsize=256)
def _transposed_tap_table(k, taps, row_bytes: int) -> torch.Tensor:
    """Byte offsets of the block-diagonal operand's rows for a phase's taps (taps[i] along dimension i, in
    that order): sub-tap j's original tap t, flattened, at t * row_bytes."""
    flat = torch.zeros(1, dtype=torch.int64)
    for i, t in enumerate(taps):
        flat = (flat[..., None] * k[i] + torch.tensor(t, dtype=torch.int64)).flatten()
    return flat * row_bytes


def _grouped_input_grad(gq, wq, input_shape, s, p, d, k, out, groups, blk, scale, out_dtype) -> torch.Tensor:
    """conv_input_grad of a grouped convolution on the native GEMM's blocks of groups: each input phase one
    batched GEMM call over g's blocks, reading the forward pass's block-diagonal operands (im2col.
    block_diagonal) transposed, through a table of the phase's taps, with no transposed, flipped or
    selected weight made. A strided one's phases read one padded g and write their rows straight into
    their positions of dx (im2col.window_tables)."""
    nd, n, cin, cout = len(s), input_shape[0], input_shape[1], wq.shape[0]
    a, b = cin // groups, cout // groups
    ca, cb = blk * a, blk * b
    wbd = im2col.block_diagonal(wq, groups, blk)  # (blocks, taps * ca, cb): row (t, i, c), column (i, o)
    plans = [list(_phases(input_shape[2 + i], out[i], k[i], s[i], p[i], d[i])) for i in range(nd)]
    single = all(si == 1 for si in s)  # one phase, computed whole
    pad_to = None if single else _largest_padding(plans)
    dx = None
    if any(plan is None for dim in plans for _, _, plan in dim):
        dx = _new_output(input_shape, scale, out_dtype).zero_()  # positions no tap reaches stay 0
    for combo, taps, dil, pad, sub in _reached_phases(plans):
        gp = im2col.padded_from(as_cl(gq), pad, pad_to)
        phase_out = tuple(gq.shape[2 + i] + 2 * pad[i] - dil[i] * (sub[i] - 1) for i in range(nd))
        # B (taps * cb, ca): element ((j, i, o), (i', c)) at wbd's row (t_j, i', c), column (i, o)
        b_k = (0, _transposed_tap_table(tuple(k), taps, ca * cb), cb)
        ksize = math.prod(sub) * cb
        # block j: g's channels from j * cb, the operand wbd[j], dx's channels from j * ca (an overlapping
        # last block by a call of its own: im2col.block_calls)
        calls = [(j, g0, (count, cb, wbd[0].numel(), ca)) for j, g0, count in im2col.block_calls(groups, blk)]
        if single:
            rows, g_taps = im2col.implicit_columns(gp, sub, (1,) * nd, dil, phase_out)
            y = _new_output((n, cin, *phase_out), scale, out_dtype)
            ymat = y.movedim(1, -1).view(-1, cin)
            for j, g0, batch in calls:
                native.gemm_tables(rows.numel(), ca, ksize, gp[:, g0 * b :], (0, rows, 1), (0, g_taps, cb),
                                   wbd[j:], b_k, (cb, None, 1), ymat[:, g0 * a :], cin, scale,
                                   batch=batch)  # fmt: skip
            if phase_out == input_shape[2:]:
                return y
            crop = tuple(slice(plan[3], plan[3] + n_phi) for _, n_phi, plan in combo)
            dx = _new_output(input_shape, scale, out_dtype) if dx is None else dx
            dx[(slice(None), slice(None)) + crop] = y[(slice(None), slice(None)) + crop]
            continue
        # the phase's window of rows alone, each written to its positions of dx (the GEMM's row table)
        dx = _new_output(input_shape, scale, out_dtype) if dx is None else dx
        dst = dx[
            (slice(None), slice(None)) + tuple(slice(phi, None, s[i]) for i, (phi, _, _) in enumerate(combo))
        ]
        crop = tuple((plan[3], plan[3] + n_phi) for _, n_phi, plan in combo)
        rows, g_taps, c_rows = im2col.window_tables(gp, sub, (1,) * nd, dil, phase_out, crop, dst)
        for j, g0, batch in calls:
            native.gemm_tables(rows.numel(), ca, ksize, gp[:, g0 * b :], (0, rows, 1), (0, g_taps, cb),
                               wbd[j:], b_k, (cb, None, 1), dst[:, g0 * a :], cin, scale, batch=batch,
                               c_rows=c_rows)  # fmt: skip
    return dx


def _direct_grouped_input_grad(gq, wq, input_shape, s, p, d, k, out, groups, blk, scale, out_dtype):
    """conv_input_grad of a grouped 2-D convolution on the direct VNNI kernel (im2col.direct_block: blocks of
    `blk` groups of g's channels), all input phases (_phases) in one call: each reads the flipped padded g
    (im2col.flipped_padded, padded once by the largest padding, each phase from its corner) and the weight
    where it lies, transposed and its taps reversed through the phase's tap table; a phase that is not the
    whole of dx is written straight into its positions (im2col.window_tables)."""
    nd, cin, cout = len(s), input_shape[1], wq.shape[0]
    a, b = cin // groups, cout // groups
    plans = [list(_phases(input_shape[2 + i], out[i], k[i], s[i], p[i], d[i])) for i in range(nd)]
    pad_to = _largest_padding(plans)
    gf = im2col.flipped_padded(as_cl(gq), pad_to)
    w, steps = im2col.direct_weight(wq, groups, transposed=True)
    dx = _new_output(input_shape, scale, out_dtype)
    if any(plan is None for dim in plans for _, _, plan in dim):
        dx.zero_()  # positions no tap reaches stay 0
    phases = []
    for combo, taps, dil, pad, sub in _reached_phases(plans):
        gp = gf[(slice(None), slice(None), *(slice(m - q, None) for q, m in zip(pad, pad_to, strict=True)))]
        phase_out = tuple(gq.shape[2 + i] + 2 * pad[i] - dil[i] * (sub[i] - 1) for i in range(nd))
        w_taps = im2col.weight_tap_table(w[0], taps)
        if all(si == 1 for si in s) and phase_out == input_shape[2:]:  # one phase, the whole of dx, in order
            rows, g_taps = im2col.implicit_columns(gp, sub, (1,) * nd, dil, phase_out)
            phases.append((gp, rows, g_taps, w_taps, None))
            continue
        dst = dx[
            (slice(None), slice(None)) + tuple(slice(phi, None, s[i]) for i, (phi, _, _) in enumerate(combo))
        ]
        crop = tuple((plan[3], plan[3] + n_phi) for _, n_phi, plan in combo)
        rows, g_taps, c_rows = im2col.window_tables(gp, sub, (1,) * nd, dil, phase_out, crop, dst)
        # (c_rows are offsets from dst's first element: made offsets from dx's, the kernel's C)
        c_rows = c_rows + (dst.data_ptr() - dx.data_ptr()) // dx.element_size()
        phases.append((gp, rows, g_taps, w_taps, c_rows))
    native.grouped_vnni(phases, b, a, blk, im2col.block_starts_tensor(groups, blk), w, steps,
                        dx.movedim(1, -1).view(-1, cin), cin, scale)  # fmt: skip
    return dx


def _implicit_weight_grad(xq, gq, weight_shape, p, s, d, out, scale=None) -> torch.Tensor | None:
    """An ungrouped weight gradient as one native GEMM whose packing reads the padded x itself (im2col.
    implicit_columns), no column copies and no batch chunks; None where that route does not apply. The
    orientation and the returned layouts are conv_weight_grad's (below)."""
    cout, cin, *k = weight_shape
    if not im2col.implicit_ok(cin):
        return None
    xp = im2col.pad_zero(as_cl(xq), p)
    ntap, rows = math.prod(k), gq.shape[0] * math.prod(out)
    table_rows, taps = im2col.implicit_columns(xp, k, s, d, out)
    gt = as_cl(gq).movedim(1, -1).reshape(-1, cout)  # (rows, Cout), a view
    x_rows, x_cols = (0, table_rows, 1), (0, taps, cin)
    g_rows, g_cols = (gt.stride(0), None, 1), (gt.stride(1), None, 1)
    wide = cout * cin * ntap > rows
    axis = _scale_axis(scale, wide)
    if wide:
        dw = _weight_grad_out(cout, ntap * cin, scale)
        native.gemm_tables(cout, ntap * cin, rows, gt, g_cols, g_rows, xp, x_rows, x_cols, dw, ntap * cin,
                           scale, axis)  # fmt: skip
        return dw.view(cout, *k, cin).movedim(-1, 1)
    dw = _weight_grad_out(ntap * cin, cout, scale)
    native.gemm_tables(ntap * cin, cout, rows, xp, x_cols, x_rows, gt, g_rows, g_cols, dw, cout, scale, axis)
    return dw.view(ntap, cin, cout).permute(2, 1, 0).reshape(cout, cin, *k).contiguous()


def _implicit_grouped_weight_grad(xq, gq, weight_shape, p, s, d, out, groups, blk, scale) -> torch.Tensor:
    """A grouped weight gradient as one native GEMM call for all blocks of `blk` groups (im2col.
    weight_grad_block):
    each block's g channels against the padded x's channels of the block, read through the implicit tables,
    (blk * b, taps * blk * a), scaled in the GEMM's stores; its diagonal blocks are the groups' gradients.
    Returned as (Cout, a, *k) with channels innermost, the layout of a channels-last model's weight."""
    cout, a, *k = weight_shape
    b, ntap = cout // groups, math.prod(k)
    ca, cb = blk * a, blk * b
    xp = im2col.pad_zero(as_cl(xq), p)
    table_rows, taps = im2col.implicit_columns(xp, k, s, d, out)
    gt = as_cl(gq).movedim(1, -1).reshape(-1, cout)  # (rows, Cout), a view
    axis = _scale_axis(scale, True)
    calls = im2col.block_calls(groups, blk)
    nblocks = sum(count for _, _, count in calls)
    full = _weight_grad_out(nblocks * cb, ntap * ca, scale)
    # block j: g's channels from j * cb, x's from j * ca, the rows of `full` from j * cb (an overlapping last
    # block from its first group, by a call of its own: im2col.block_calls)
    for j, g0, count in calls:
        sc = scale if axis < 0 else scale.reshape(-1)[g0 * b : g0 * b + count * cb]
        native.gemm_tables(cb, ntap * ca, gt.shape[0], gt[:, g0 * b :], (1, None, 1), (gt.stride(0), None, 1),
                           xp[:, g0 * a :], (0, table_rows, 1), (0, taps, ca), full[j * cb :], ntap * ca, sc,
                           axis, batch=(count, cb, ca, cb * ntap * ca))  # fmt: skip
    # (block, group in block, b, tap, group in block, a): the diagonal over the two group indices
    diag = full.view(nblocks, blk, b, ntap, blk, a).diagonal(dim1=1, dim2=4)  # (block, b, tap, a, group)
    per_group = diag.permute(0, 4, 1, 2, 3).reshape(nblocks * blk, b, ntap, a)
    if groups % blk:  # the overlapping last block: its groups that the blocks before it do not hold
        per_group = torch.cat((per_group[: groups // blk * blk], per_group[-(groups % blk) :]))
    return per_group.reshape(cout, *k, a).movedim(-1, 1)


def conv_weight_grad(
    xq, gq, weight_shape, stride=1, padding=0, dilation=1, groups=1, out_scale=None
) -> torch.Tensor:
    """dL/dw for dL/dy = g (torch.nn.grad.conv{N}d_weight), int32 of shape weight_shape. ``out_scale`` (one
    value, or one per output channel): float32 dw * out_scale instead, bit for bit ``dequantize(dw,
    out_scale, axis=0 where one per channel)``; on the native GEMM's routes without a pass of its own."""
    _check(xq, gq)
    weight_shape = tuple(int(a) for a in weight_shape)
    nd, s, p, d, k, out = _geometry(xq.shape, weight_shape, stride, padding, dilation, groups)
    n, cin = xq.shape[:2]
    cout = weight_shape[0]
    check_grad_output(gq.shape, (n, cout, *out))
    scale = None if out_scale is None else _scale_vector(out_scale).reshape(-1)
    if scale is not None and scale.numel() not in (1, cout):
        raise ValueError(f"conv_weight_grad: out_scale needs 1 or {cout} values, got {scale.numel()}")
    a, b = cin // groups, cout // groups
    ntap = math.prod(k)
    if routes.native_depthwise(nd, groups, cin, cout):
        return _scaled(native.depthwise_weight_grad(xq, gq, k, s, p, d), scale)
    # the native GEMM's routes scale in their stores; the others below run the epilogue on their int32 sums
    if _pointwise(k, s, p, groups):
        dw = _pointwise_weight_grad(xq, gq, weight_shape, scale)
        if dw is not None:
            return dw
    if groups == 1:
        dw = _implicit_weight_grad(xq, gq, weight_shape, p, s, d, out, scale)
        if dw is not None:
            return dw
    if routes.native_grouped_conv(cin, cout, groups):
        k, s = tuple(k), tuple(s)
        blk = im2col.weight_grad_block(groups, a, b, k) or im2col.group_block(groups, a, b, k, s)
        return _implicit_grouped_weight_grad(xq, gq, weight_shape, p, s, d, out, groups, blk, scale)
    # groups per matmul: blk groups together give a (blk*a, blk*b) product whose diagonal blocks are
    # the per-group results (the batched exact formulation for depthwise and other many-group convs)
    blk = min(groups, max(1, 64 // max(a, b)))
    # im2col over chunks of the batch, so that the columns stay cache-sized (and below the size at
    # which every allocation is fresh mmap-ed memory); the int32 partial sums are added exactly
    chunk = routes.batch_chunk(n, math.prod(out) * ntap * cin, im2col.IM2COL_CHUNK_BYTES)
    # matmul orientation (measured): (prod(k)*Cin, Cout) = cols^T g runs faster, but its transpose to
    # (Cout, Cin, *k) costs more than the matmul saves once the weight outgrows N * positions
    wide = cout * cin * ntap > n * math.prod(out)
    dw = None
    for n0 in range(0, n, chunk):
        xc = as_cl(xq[n0 : n0 + chunk])
        cols = im2col.im2col(
            im2col.pad_zero(xc, p), k, s, d, out, True
        )  # (n*P, prod(k)*Cin), columns (k..., c)
        gt = as_cl(gq[n0 : n0 + chunk]).movedim(1, -1).reshape(-1, cout)  # (n*P, Cout), a view
        if groups == 1 and wide:
            part = im2col.mm(gt.t(), cols)  # (Cout, prod(k)*Cin)
        elif groups == 1:
            part = im2col.mm(cols.t(), gt)  # (prod(k)*Cin, Cout)
        else:
            part = torch.empty((ntap, groups, a, b), dtype=torch.int32)
            for j in range(ntap):
                for g0 in range(0, groups, blk):
                    g1 = min(groups, g0 + blk)
                    r = im2col.mm(cols[:, j * cin + g0 * a : j * cin + g1 * a].t(), gt[:, g0 * b : g1 * b])
                    # (B*a, B*b) -> (B, a, B, b) -> diagonal blocks (a, b, B)
                    part[j, g0:g1] = r.view(g1 - g0, a, g1 - g0, b).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        dw = part if dw is None else dw.add_(part)
    if groups == 1 and wide:
        # (Cout, prod(k), Cin) is (Cout, Cin, *k) channels-last, the layout of a channels-last model's weight:
        # returned as that view, the gradient reaches .grad without a copy (docs/measurements.md)
        return _scaled(dw.view(cout, *k, cin).movedim(-1, 1), scale)
    # (prod(k), groups, a, b) -> (groups, b, a, prod(k)) -> (Cout, a, *k)
    dw = dw.view(ntap, groups, a, b).permute(1, 3, 2, 0)
    return _scaled(dw.reshape(cout, a, *k).contiguous(), scale)


def _scaled(acc: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """A weight gradient's int32 sums, or with `scale` (one value, or one per output channel) the epilogue's
    float32 values in their place."""
    if scale is None:
        return acc
    return dequantize(acc, scale, axis=0 if scale.numel() > 1 else None, inplace=True)


def linear_forward(xq, wq) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T -> (M, N) int32."""
    _check(xq, wq)
    return im2col.mm(xq, wq.t())


def linear_input_grad(gq, wq) -> torch.Tensor:
    """g (M, N) @ w (N, K) -> (M, K) int32."""
    _check(gq, wq)
    return im2col.mm(gq, wq)


def linear_weight_grad(xq, gq) -> torch.Tensor:
    """g^T (N, M) @ x (M, K) -> (N, K) int32."""
    _check(xq, gq)
    return im2col.mm(gq.t(), xq)
