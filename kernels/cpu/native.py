"""The CPU backend's own C++ products (kernels/cpu/csrc/gemm.cpp, depthwise.cpp) called through ctypes: an
exact int8 GEMM for CPUs whose torch._int_mm is not exact, and the depthwise convolutions.

``scale`` (a float32 one-element tensor, or None): the GEMM and the depthwise forward and input gradient write
float32 ``acc * scale`` instead of int32 ``acc``, with the dequantizing epilogue's arithmetic (the exact sum
converted to fp32, one fp32 multiply), so bit for bit ``kernels.cpu.dequantize(acc, scale, inplace=True)``
without that pass over the output (gemm_rows and gemm_tables also take one scale per row or column of C:
``scale_axis`` 0 or 1, as a weight gradient's per-output-channel scales); like that epilogue's result, a
float32 view of an int32 buffer (autograd adds a gradient into a view out of place, into a plain tensor in
place, and which one it does decides the layout BatchNorm's backward then sees: tests/test_zoo.py)."""

from __future__ import annotations

import torch

from .runtime import int64_array, library, pointer


def _scale_values(scale, axis: int, m: int, n: int) -> torch.Tensor | None:
    """`scale` as the float32 vector rq_gemm_s8 reads: one value (axis -1), or m (axis 0) or n (axis 1)."""
    if scale is None:
        return None
    want = 1 if axis < 0 else (m if axis == 0 else n)
    if not (scale.dtype == torch.float32 and scale.device.type == "cpu" and scale.is_contiguous()):
        scale = scale.detach().to("cpu", torch.float32).contiguous()
    if scale.numel() != want:
        raise ValueError(f"gemm: {want} scale value(s) for scale_axis {axis}, got {scale.numel()}")
    return scale


def _scale_arg(scale: torch.Tensor | None) -> torch.Tensor | None:
    """One scale value as the float32 tensor the native code reads."""
    return _scale_values(scale, -1, 1, 1)


def as_float_view(t: torch.Tensor) -> torch.Tensor:
    """A new int32 buffer as the float32 view the scaled products write (see the module docstring)."""
    return t.view(torch.float32)


def _out(out: torch.Tensor | None, shape, scale, out_dtype=torch.float32) -> torch.Tensor:
    """`out`, checked: int32 without a scale, float32 or bfloat16 with one; or a new one (of out_dtype)."""
    if out is None:
        if scale is not None and out_dtype == torch.bfloat16:
            return torch.empty(shape, dtype=out_dtype)
        t = torch.empty(shape, dtype=torch.int32)
        return t if scale is None else as_float_view(t)
    allowed = (torch.int32,) if scale is None else (torch.float32, torch.bfloat16)
    if out.dtype not in allowed:
        raise TypeError(f"expected a {' or '.join(map(str, allowed))} output, got {out.dtype}")
    return out


def _bf16_flag(out: torch.Tensor) -> int:
    return int(out.dtype == torch.bfloat16)


def allow_amx(allowed: bool) -> bool:
    """Let the GEMM run on its tile kernel where it can (the default: AMX tiles, or AVX-512 VNNI on the same
    packed tiles), or not (tests of the vector GEMM, comparisons); returns whether it now does. Clear the
    route caches after (cpu.clear_route_caches)."""
    return bool(library().rq_allow_amx(int(allowed)))


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None, scale=None,
         out_dtype=torch.float32) -> torch.Tensor:  # fmt: skip
    """Exact int8 (M, K) @ int8 (K, N) -> int32 (M, N), any strides; into `out` (unit column stride) if
    given. With `scale`: float32 acc * scale (module docstring), or that rounded to `out_dtype` bfloat16."""
    lib = library()
    m, k = a.shape
    n = b.shape[1]
    scale = _scale_arg(scale)
    out = _out(out, (m, n), scale, out_dtype)
    if out.stride(1) != 1 and n > 1:
        raise ValueError("gemm: out needs unit column stride")
    lib.rq_gemm_s8(m, n, k, pointer(a), a.stride(0), a.stride(1), pointer(b), b.stride(0), b.stride(1),
                   pointer(out), out.stride(0), pointer(scale), -1, _bf16_flag(out))  # fmt: skip
    return out


OUT_ADD = 2  # rq_gemm_s8's flag (gemm.cpp): C = C + acc * scale, float32


def gemm_rows(m, n, k, a, sam, sak, b, sbk, sbn, out, ldc, scale=None, scale_axis=-1, add=False) -> None:
    """rq_gemm_s8 on tensors whose strides the caller has checked (out: int32, or float32 or bfloat16 with
    `scale`, one value or one per row (scale_axis 0) or column (1) of C): the 1x1 convolutions' products
    (kernels.cpu.products), one call without gemm's checks and copies. ``add`` (float32 out with a scale):
    each element of C becomes C + acc * scale, float32's sum of the value it held and the scaled product."""
    scale = _scale_values(scale, scale_axis, m, n)
    scale_ptr = None if scale is None else scale.data_ptr()
    flags = _bf16_flag(out) | (OUT_ADD if add else 0)
    library().rq_gemm_s8(m, n, k, a.data_ptr(), sam, sak, b.data_ptr(), sbk, sbn, out.data_ptr(), ldc,
                         scale_ptr, scale_axis, flags)  # fmt: skip


def gemm_tables(m, n, k, a, a_m, a_k, b, b_k, b_n, out, ldc, scale=None, scale_axis=-1, batch=None,
                c_rows=None) -> None:  # fmt: skip
    """rq_gemm_s8 with axes read through tables: C (m, n) = A . B, element (i, j) of an operand at
    data_ptr + off_row(i) + off_col(j), each axis given as ``(stride, None, 1)`` (off(v) = v * stride) or
    ``(0, table, run)`` (off(v) = table[v // run] + v % run, table an int64 tensor): the implicit im2col
    (``im2col.implicit_columns``). ``out`` int32, or float32 or bfloat16 with ``scale`` (as gemm_rows).
    ``batch``: (count, a_step, b_step, c_step), `count` such products in one call, item j's A and B at
    data_ptr + j * step (bytes) and C at j * c_step elements on; a per-row or per-column scale then holds
    count * m or count * n values (a grouped convolution's blocks of groups). ``c_rows``: an int64 tensor of
    m element offsets, C's row i at out's data_ptr + c_rows[i] (each item's) instead of i * ldc: an input
    gradient's phase written into its strided positions of dx (kernels.cpu.products)."""
    count, *steps = batch if batch is not None else (1, 0, 0, 0)
    scale = _scale_values(scale, scale_axis, m * count, n * count)

    def axis(spec):
        stride, table, run = spec
        return stride, None if table is None else table.data_ptr(), run

    scale_ptr = None if scale is None else scale.data_ptr()
    rows_ptr = None if c_rows is None else c_rows.data_ptr()
    library().rq_gemm_s8_tables(m, n, k, a.data_ptr(), *axis(a_m), *axis(a_k), b.data_ptr(), *axis(b_k),
                                *axis(b_n), out.data_ptr(), ldc, scale_ptr, scale_axis,
                                _bf16_flag(out), count, *steps, rows_ptr)  # fmt: skip


def grouped_vnni(phases, a, b, blk, starts, w, w_steps, out, ldc, scale=None) -> None:
    """rq_grouped_vnni (kernels/cpu/csrc/grouped.cpp): a grouped product on AVX-512 VNNI in blocks of `blk`
    groups of `a` input and `b` output channels from the groups `starts` (int64), into ``out`` (int32, or
    float32 or bfloat16 with one `scale`, as ``gemm_tables`` writes it), in one or more phases (an input
    gradient's), each ``(xf, rows, taps, w_taps, c_rows)``: the padded input as codes + 128 (`xf`, im2col.
    flipped_padded) read through the implicit tables `rows` and `taps`, the weight element (group g, tap t,
    input i, output o) at w's data + g * w_steps[0] + i * w_steps[1] + o * w_steps[2] + w_taps[t], and C's
    rows at ``c_rows`` elements (None: ``ldc`` apart)."""
    scale = _scale_arg(scale)
    fields = [
        (xf.data_ptr(), rows.data_ptr(), rows.numel(), taps.data_ptr(), taps.numel(), w_taps.data_ptr(),
         0 if c_rows is None else c_rows.data_ptr())
        for xf, rows, taps, w_taps, c_rows in phases
    ]  # fmt: skip
    table = int64_array([v for phase in fields for v in phase])
    err = library().rq_grouped_vnni(
        table, len(phases), a, b, blk, starts.data_ptr(), starts.numel(), w.data_ptr(), *w_steps,
        out.data_ptr(), ldc, None if scale is None else scale.data_ptr(), -1, _bf16_flag(out),
    )  # fmt: skip
    if err:
        raise RuntimeError("rq_grouped_vnni: this native library has no AVX-512 VNNI")


def _channels_last_2d(t: torch.Tensor) -> torch.Tensor:
    return (
        t
        if t.is_contiguous(memory_format=torch.channels_last)
        else t.contiguous(memory_format=torch.channels_last)
    )


def _dw(fn, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, x_shape, out_hw, kernel, s, p, d, *scaled):
    """scaled: (scale or None, whether out is bfloat16) for the forward pass and the input gradient."""
    n, c, h, w = x_shape
    geometry = int64_array([n, c, h, w, *out_hw, *kernel, *s, *p, *d])
    extra = (pointer(scaled[0]), int(scaled[1])) if scaled else ()
    if getattr(library(), fn)(pointer(a), pointer(b), pointer(out), geometry, *extra):
        raise ValueError(f"depthwise kernel {tuple(kernel)} has more taps than the native kernels take")


def _dw_out(shape, scale, out_dtype) -> torch.Tensor:
    if scale is not None and out_dtype == torch.bfloat16:
        return torch.empty(shape, dtype=torch.bfloat16)
    return _out(None, shape, scale)


def depthwise_forward(x, w, s, p, d, out_hw, scale=None, out_dtype=torch.float32) -> torch.Tensor:
    """Depthwise 2-D convolution of int8 x (N, C, H, W) with w (C, 1, KH, KW), zero padding p: int32
    (N, C, OH, OW), channels-last (with `scale`: float32 acc * scale, or with out_dtype bfloat16 that value
    rounded to nearest even, as the epilogue rounds it)."""
    x = _channels_last_2d(x)
    n, c = x.shape[:2]
    scale = _scale_arg(scale)
    y = _dw_out((n, *out_hw, c), scale, out_dtype)
    bf16 = y.dtype == torch.bfloat16
    _dw("rq_dw_forward", x, w.contiguous(), y, x.shape, out_hw, w.shape[2:], s, p, d, scale, bf16)
    return y.permute(0, 3, 1, 2)


def depthwise_input_grad(g, w, x_shape, s, p, d, scale=None, out_dtype=torch.float32) -> torch.Tensor:
    """dL/dx (N, C, H, W) int32, channels-last, of a depthwise 2-D convolution, from the int8 output
    gradient g (N, C, OH, OW) (`scale` and `out_dtype`: as depthwise_forward's)."""
    g = _channels_last_2d(g)
    n, c, h, wd = x_shape
    scale = _scale_arg(scale)
    dx = _dw_out((n, h, wd, c), scale, out_dtype)
    bf16 = dx.dtype == torch.bfloat16
    _dw("rq_dw_input_grad", g, w.contiguous(), dx, x_shape, g.shape[2:], w.shape[2:], s, p, d, scale, bf16)
    return dx.permute(0, 3, 1, 2)


def depthwise_weight_grad(x, g, kernel, s, p, d) -> torch.Tensor:
    """dL/dw (C, 1, KH, KW) int32 of a depthwise 2-D convolution, from int8 x and output gradient g."""
    x, g = _channels_last_2d(x), _channels_last_2d(g)
    dw = torch.empty((x.shape[1], 1, *kernel), dtype=torch.int32)
    _dw("rq_dw_weight_grad", x, g, dw, x.shape, g.shape[2:], kernel, s, p, d)
    return dw
