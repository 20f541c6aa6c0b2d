"""Which exact route the CPU backend's products take on this CPU, probed once per process.

``torch_int8_fast``: torch's int8 kernels (oneDNN, ``_int_mm``) where the CPU has VNNI, the native GEMM
elsewhere. ``int_mm_exact`` / ``onednn_exact``: each fast path probed on saturation-prone operands (without
VNNI oneDNN may use the saturating vpmaddubsw). ``onednn_bounded``: which guard keeps oneDNN's fp32 output
exact, the output scan (VNNI) or the weight bound per input-channel block (AMX). ``conv_route`` names the
result. The products call these through this module at every call, so that tests (and comparisons) can
stand in for a probe, ``SMALL_OUT`` or ``CHUNK_IMAGES`` with monkeypatch on this public module.
"""

from __future__ import annotations

import functools
import math
import os

import torch

from . import onednn
from .runtime import available as native_available
from .runtime import library as native_library

CHUNK_IMAGES = None  # tests: force this many images per batch chunk
# convolutions with at most this many output positions per image go to im2col + _int_mm
SMALL_OUT = 64


@functools.cache
def int_mm_exact() -> bool:
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
    GEMM (kernels/cpu/csrc/gemm.cpp) takes over. REPRO_CPU_GEMM=torch|native forces a route."""
    forced = os.environ.get("REPRO_CPU_GEMM")
    if forced in ("torch", "native"):
        return forced == "torch" or not native_available()
    return bool(torch.cpu._is_vnni_supported()) or not native_available()


@functools.cache
def native_gemm() -> bool:
    """Whether the products' GEMMs (1x1 and small-map convolutions, weight gradients, linear layers) run on
    the native library: where torch's int8 kernels are slow (torch_int8_fast false), and wherever its tile
    GEMM runs (native_tiles: AMX, or AVX-512 VNNI). On AMX torch._int_mm does not use the tiles: oneDNN's gemm
    API ran ResNet-50's 1x1 products at 1.0-1.9x the AMX GEMM's time alone, and slower still inside a step.
    On AVX-512 VNNI (AMD Zen 5) the tile GEMM's kernel runs at about _int_mm's rate, and its implicit im2col,
    scaled stores and in-place phases made ResNet steps 4-12% faster than _int_mm and oneDNN (in-process A/B;
    MobileNetV2's the same within 5%; docs/measurements.md). REPRO_CPU_GEMM=torch keeps _int_mm; ungrouped
    convolutions with a multiple of 16 input channels leave oneDNN for it too (native_conv_on_tiles)."""
    if not torch_int8_fast():
        return True
    return os.environ.get("REPRO_CPU_GEMM") != "torch" and native_tiles()


def native_tiles() -> bool:
    """Whether the native library's tile GEMM (kernels/cpu/csrc/gemm_amx.cpp) runs here: on AMX tiles (built
    with AMX-INT8, allowed by Linux) or on AVX-512 VNNI from the same packed tiles, and ``native.allow_amx``
    allows it."""
    lib = native_library()
    return lib is not None and lib.rq_allow_amx(-1) == 1


def tiles_are_amx() -> bool:
    """Whether the tile GEMM (native_tiles) multiplies on AMX tiles; else on AVX-512 VNNI."""
    lib = native_library()
    return lib is not None and lib.rq_tiles_amx() == 1


def grouped_vnni() -> bool:
    """Whether grouped 2-D convolutions' forward passes and input gradients run on the direct VNNI kernel
    (kernels/cpu/csrc/grouped.cpp: no block-diagonal operand, no packed A): where the tile GEMM runs on
    AVX-512 VNNI (native_tiles, not AMX, whose tiles multiply a block's zeros for little) and
    ``GROUPED_VNNI`` allows it (tests and comparisons turn it off)."""
    lib = native_library()
    return GROUPED_VNNI and native_tiles() and not tiles_are_amx() and lib.rq_grouped_vnni_usable() == 1


# the direct grouped kernel where it runs (grouped_vnni); False: the tile GEMM's blocks everywhere
GROUPED_VNNI = True


def batch_chunk(n: int, bytes_per_image: int, budget: int) -> int:
    """Images per chunk so that a chunk's temporary has about ``budget`` bytes (at least one image)."""
    if CHUNK_IMAGES is not None:
        return max(1, min(n, CHUNK_IMAGES))
    return max(1, min(n, budget // max(1, bytes_per_image)))


@functools.cache
def onednn_exact() -> bool:
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
            got = onednn.qconv(onednn.to_u8(x), wt, (1, 1), (1, 1), (1, 1), groups)
            ok &= torch.equal(got.double(), want)
        return bool(ok)
    except Exception:
        return False


_AMX_ISAS = ("AMX", "DEFAULT", "ALL")  # ONEDNN_MAX_CPU_ISA values that leave oneDNN's AMX kernels on


def amx_in_use() -> bool:
    """Whether oneDNN may run its AMX kernels here: the CPU has AMX tiles and ONEDNN_MAX_CPU_ISA (or its
    older name DNNL_MAX_CPU_ISA) does not cap oneDNN below AMX."""
    if not torch.cpu._is_amx_tile_supported():
        return False
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "").upper()
    return not cap or any(name in cap for name in _AMX_ISAS)


@functools.cache
def compensation_rounds() -> bool:
    """Probe: does oneDNN round an uncompensated sum to fp32 before subtracting the zero-point
    compensation? Outputs near 0 whose uncompensated sums 127 * sum(x + 128) are odd and above 2^24
    (not representable in fp32) come out wrong if it does; the output scan cannot see that."""
    try:
        gen = torch.Generator().manual_seed(1)
        x = torch.randint(-2, 3, (2, 160, 5, 5), generator=gen, dtype=torch.int8)  # K = 1440 taps
        w = torch.full((16, 160, 3, 3), 127, dtype=torch.int8)
        w[8:] = -127
        want = torch.nn.functional.conv2d(x.double(), w.double())
        got = onednn.qconv(onednn.to_u8(x), w, (1, 1), (0, 0), (1, 1), 1)
        return not torch.equal(got.double(), want)
    except Exception:
        return True


@functools.cache
def onednn_bounded() -> bool:
    """True where oneDNN's exactness must be proven from the weights alone (AMX, or a failed probe):
    the bounded route. Elsewhere (VNNI) the output scan guards it: the scan route.
    REPRO_ONEDNN_GUARD=bounded forces the bounded route (exact on every CPU: the suite's second run)."""
    if os.environ.get("REPRO_ONEDNN_GUARD") == "bounded":
        return True
    return amx_in_use() or compensation_rounds()


def conv_route() -> str:
    """The route convolutions take on this CPU: 'native' (no VNNI: kernels/cpu/csrc, integer arithmetic),
    'onednn-scan' (VNNI: oneDNN, an output scan sends chunks at or above 2^24 to im2col + _int_mm),
    'onednn-bounded' (AMX: oneDNN on input-channel blocks whose weights bound every sum below 2^24),
    'im2col' (oneDNN not exact here: im2col + _int_mm throughout)."""
    if not torch_int8_fast():
        return "native"
    if not onednn_exact():
        return "im2col"
    return "onednn-bounded" if onednn_bounded() else "onednn-scan"


def clear_route_caches() -> None:
    """Forget every route decision (probes, the forced route, oneDNN's refusals): they are made again
    under the environment at the next call. For tests that change REPRO_CPU_GEMM, REPRO_ONEDNN_GUARD
    or ONEDNN_MAX_CPU_ISA."""
    for probe in (
        torch_int8_fast,
        native_gemm,
        int_mm_exact,
        onednn_exact,
        compensation_rounds,
        onednn_bounded,
    ):
        probe.cache_clear()
    from .im2col import group_block, weight_grad_block  # (im2col imports this module)

    group_block.cache_clear()  # it reads native_gemm and native_tiles
    weight_grad_block.cache_clear()
    onednn.REFUSED.clear()


def native_depthwise(nd: int, groups: int, cin: int, cout: int) -> bool:
    """Depthwise 2-D convolutions go to the native kernels wherever they are built, VNNI or not (as
    block-diagonal matmuls they multiply 63 zeros for every useful product); REPRO_CPU_GEMM=torch keeps
    them on torch's kernels."""
    if not (nd == 2 and groups == cin == cout and groups > 1):
        return False
    return os.environ.get("REPRO_CPU_GEMM") != "torch" and native_available()


# 1x1 convolutions with at least this many output rows (images x positions) go to oneDNN where it writes
# the scaled output itself (pointwise_on_onednn)
POINTWISE_ONEDNN_ROWS = 2048


def pointwise_on_onednn(rows: int, cin: int, cout: int) -> bool:
    """Whether a 1x1 convolution of `rows` output rows, cin -> cout channels, runs faster on oneDNN
    (scaling its own output) than on im2col + _int_mm + epilogue: where the output is large and at least as
    wide as the reduction, or the rows outnumber the reduction 16 times. _int_mm ran short reductions
    into wide outputs up to 2x slower (measured on an Intel AMX Xeon, docs/measurements.md)."""
    return (rows >= POINTWISE_ONEDNN_ROWS and cout >= cin) or rows >= 16 * cin


def native_conv_on_tiles(cin: int, groups: int) -> bool:
    """Whether an ungrouped convolution oneDNN would run goes to the native tile GEMM instead (its implicit
    im2col, kernels/cpu/im2col.py): oneDNN's int8 call through torch costs about 0.5 ms before it computes
    (the op, the weight's prepack, the uint8 shift). Since A tiles are read in place, the AMX GEMM won at
    every size measured on an Intel AMX Xeon, 100,352 rows included (32 x 64-56-64 3x3: forward 2.90
    against 3.12 ms, input gradient 2.72 against 3.09), docs/measurements.md; on AVX-512 VNNI (AMD Zen 5)
    whole steps were faster with it than with oneDNN."""
    return groups == 1 and cin % 16 == 0 and torch_int8_fast() and native_gemm()


def native_grouped_conv(cin: int, cout: int, groups: int) -> bool:
    """Whether a grouped (not depthwise) convolution runs on the native GEMM, all three passes: one call a
    pass for its blocks of groups, each an ungrouped product with a block-diagonal weight (im2col.
    group_block), where a block fits; on AMX instead of oneDNN, whose grouped int8 convolutions ran at
    0.2-0.7x bf16's speed on an Intel AMX Xeon (docs/measurements.md)."""
    from .im2col import group_block  # (im2col imports this module)

    return groups > 1 and native_gemm() and group_block(groups, cin // groups, cout // groups) is not None


def im2col_route(k, p, out, groups: int) -> bool:
    """Where im2col + _int_mm beats oneDNN (measured): 1x1 kernels without padding (the im2col is at
    most a strided copy; no uint8 conversion, prepack or fp32 round trip) and small outputs (<= 8x8
    positions per image, where oneDNN's int8 kernels are slow), both without groups."""
    if groups != 1:
        return False
    return (all(a == 1 for a in k) and not any(p)) or math.prod(out) <= SMALL_OUT
