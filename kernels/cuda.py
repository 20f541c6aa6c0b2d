"""INT8 CUDA backend: CUDA C++ kernels (kernels/cuda/*.cu) compiled with NVRTC and loaded with CuPy.

Implements the backend interface (kernels.backend): the quantizer (kernels.cuda_quantize: absmax, channel
statistics, nearest and stochastic codes with the CPU backend's Philox stream, the dequantizing epilogue;
no host synchronisation, a NaN or Inf sets the device flag of kernels.errors) and exact int8 products
(int8 operands on a CUDA device in, int32 out).
torch tensors reach the kernels as device pointers and the kernels run on torch's current stream.

Every kernel is compiled in CI for sm_75/sm_80/sm_90 (``tests/test_cuda_compile.py``, no GPU needed), and
the kernel sources are executed on the CPU by a small C++ harness that stands in for the CUDA runtime
(``tests/test_cuda_backend.py``): bit-exact against ``kernels.reference`` and, for the quantizer, against
the CPU backend (the same codes, stochastic ones included). The GPU tests in the same file run unchanged
where a GPU exists.

The kernels (one idea per file in kernels/cuda/):

* ``quantize.cu``: per-tensor absmax (block max + atomicMax), per-channel max and moments, the codes of
  any dense layout (one thread per group of 4 elements of a row, one Philox call each, threads in memory
  order), the above-sigma counts of DAIQ in the same pass, the dequantizing epilogue (float32 / bfloat16
  / float16).
* ``gemm_imma.cu``: mma.sync m16n8k32 s8 x s8 -> s32 on tensor cores (sm_80+).
* ``gemm_dp4a.cu``: __dp4a (sm_61+; NVRTC 13 targets sm_75 and newer, so Turing), used below sm_80.
* ``im2col.cu``, ``col2im.cu``: 1/2/3-D convolutions as im2col + GEMM (forward, weight gradient) and
  GEMM + col2im gather (input gradient), groups as a GEMM batch dimension.

Kernels are compiled lazily, once per (module, architecture), to a cubin (PTX for an architecture
NVRTC does not know, JIT-compiled by the driver), cached on disk under ``$REPRO_CUDA_CACHE`` (default
``~/.cache/int8-repro/cuda``) and loaded with ``cupy.RawModule``. NVRTC comes from the
``nvidia-cuda-nvrtc`` wheel that cupy-cuda13x and torch install; NVRTC 13 no longer targets sm_61/sm_70,
so GPUs older than Turing get a clear error.

int32 contract: as ``kernels.reference`` (exact while the reduction length K < 133,144).
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from kernels.atomic import write_file
from kernels.cuda_quantize import absmax, absmax_quantize, channel_stats, dequantize, quantize
from kernels.geometry import check_grad_output, conv_geometry

__all__ = [
    "absmax",
    "absmax_quantize",
    "channel_stats",
    "dequantize",
    "conv_forward",
    "conv_input_grad",
    "conv_weight_grad",
    "gemm",
    "linear_forward",
    "linear_input_grad",
    "linear_weight_grad",
    "quantize",
]

SOURCE_DIR = Path(__file__).with_name("cuda")
# the architectures CI compiles every kernel for (a kernel is skipped below its own minimum)
CI_ARCHS = (75, 80, 90)
# strict IEEE float arithmetic: the quantizer must round exactly as torch does (no FMA contraction,
# no flush-to-zero, correctly rounded division)
COMMON_OPTIONS = ("-std=c++17", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false")
THREADS = 256  # threads per block of the elementwise and reduction kernels
MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y and gridDim.z
MAX_GRID_BLOCKS = 65535 * 16  # grid-stride kernels: enough blocks to fill any GPU
GEMM_TILE = 64  # GEMM block tile (GEMM_BM = GEMM_BN in gemm_common.cuh)
_CHUNK_BYTES = 256 << 20  # conv: batch chunk such that a chunk's columns take about this much memory


class CudaCompileError(RuntimeError):
    """NVRTC rejected a kernel source (the message carries NVRTC's log)."""


@dataclass(frozen=True)
class KernelModule:
    """One NVRTC program: its source files (concatenated in order), kernels and lowest architecture."""

    name: str
    files: tuple[str, ...]
    kernels: tuple[str, ...]
    min_arch: int  # the lowest sm the code needs (dp4a: 61, mma.m16n8k32 s8: 80)


MODULES = {
    m.name: m
    for m in (
        KernelModule(
            "quantize",
            ("philox.cuh", "quantize.cu"),
            ("absmax_tensor", "channel_stats", "quantize_groups", "dequantize"),
            60,
        ),
        KernelModule("gemm_dp4a", ("gemm_common.cuh", "gemm_dp4a.cu"), ("gemm_dp4a",), 61),
        KernelModule("gemm_imma", ("gemm_common.cuh", "gemm_imma.cu"), ("gemm_imma",), 80),
        KernelModule("im2col", ("im2col.cu",), ("im2col",), 60),
        KernelModule("col2im", ("col2im.cu",), ("col2im",), 60),
    )
}


# ----------------------------------------------------------------------------------------------------
# compiling (no GPU needed) and loading


def source(module: str) -> str:
    """The program text of a module: its files concatenated, with #line markers for NVRTC's messages."""
    parts = []
    for name in MODULES[module].files:
        parts.append(f'#line 1 "{name}"\n')
        parts.append((SOURCE_DIR / name).read_text())
    return "\n".join(parts)


def nvrtc_version() -> tuple[int, int]:
    from cupy.cuda import nvrtc

    return tuple(nvrtc.getVersion())


@functools.cache
def nvrtc_archs() -> tuple[int, ...]:
    """The sm_XY targets the installed NVRTC accepts (NVRTC 13.0: 75 ... 121)."""
    from cupy.cuda import nvrtc

    return tuple(int(a) for a in nvrtc.getSupportedArchs())


def ci_archs(module: str, supported: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """The architectures a module is compiled for in CI: CI_ARCHS at or above its minimum that NVRTC
    supports (dp4a needs sm_61, but NVRTC 13's lowest target is sm_75)."""
    supported = nvrtc_archs() if supported is None else supported
    return tuple(a for a in CI_ARCHS if a >= MODULES[module].min_arch and a in supported)


def compile_source(src: str, name: str, arch: int, ptx: bool = False) -> bytes:
    """Compile CUDA C++ with NVRTC for sm_<arch> (cubin, which runs ptxas: inline PTX is checked too)
    or compute_<arch> (PTX). Needs no GPU. Raises CudaCompileError with NVRTC's log."""
    from cupy.cuda import nvrtc

    target = f"compute_{arch}" if ptx else f"sm_{arch}"
    options = (f"-arch={target}", *COMMON_OPTIONS)
    prog = nvrtc.createProgram(src, name, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, options)
        except nvrtc.NVRTCError as e:
            log = nvrtc.getProgramLog(prog)
            raise CudaCompileError(f"NVRTC could not compile {name} for {target}: {e}\n{log}") from None
        return nvrtc.getPTX(prog) if ptx else nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


def compile_module(module: str, arch: int, ptx: bool = False) -> bytes:
    return compile_source(source(module), f"{module}.cu", arch, ptx)


def target_for(cc: int, supported: tuple[int, ...]) -> tuple[int, bool]:
    """(arch, ptx) to build for a device of compute capability ``cc`` (e.g. 86): its own cubin when
    NVRTC knows it, else PTX of the newest known lower architecture (the driver JIT-compiles it)."""
    if cc in supported:
        return cc, False
    lower = [a for a in supported if a <= cc]
    if not lower:
        raise RuntimeError(
            f"this NVRTC (architectures sm_{min(supported)}+) cannot build for compute capability "
            f"{cc // 10}.{cc % 10}; the CUDA backend needs a Turing (sm_75) or newer GPU"
        )
    return max(lower), True


def gemm_module_for(cc: int) -> str:
    """Tensor-core IMMA on sm_80+, dp4a below."""
    if cc >= MODULES["gemm_imma"].min_arch:
        return "gemm_imma"
    if cc >= MODULES["gemm_dp4a"].min_arch:
        return "gemm_dp4a"
    raise RuntimeError(f"int8 GEMM needs compute capability 6.1+ (dp4a), got {cc // 10}.{cc % 10}")


def _cache_dir() -> Path:
    return Path(os.environ.get("REPRO_CUDA_CACHE", Path.home() / ".cache" / "int8-repro" / "cuda"))


def _device_cc(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return 10 * major + minor


@functools.cache
def _function(module: str, kernel: str, device_index: int):
    """The loaded kernel (compiled once per module and architecture, cached on disk)."""
    import cupy

    arch, ptx = target_for(_device_cc(device_index), nvrtc_archs())
    src = source(module)
    key = hashlib.sha256(
        repr((src, arch, ptx, COMMON_OPTIONS, nvrtc_version(), cupy.__version__)).encode()
    ).hexdigest()[:24]
    path = _cache_dir() / f"{module}-{'compute' if ptx else 'sm'}_{arch}-{key}.{'ptx' if ptx else 'cubin'}"
    if not path.exists():
        binary = compile_source(src, f"{module}.cu", arch, ptx)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_file(path, binary if isinstance(binary, bytes) else binary.encode())
    with cupy.cuda.Device(device_index):
        return cupy.RawModule(path=str(path)).get_function(kernel)


def _launch(module: str, kernel: str, grid, block, args) -> None:
    """Run a kernel on torch's current stream of the device of the tensors in ``args``.

    ``args``: torch tensors (passed as their device pointers), None (a null pointer) and numpy scalars
    (passed by value with their exact C type). The one seam the CPU harness replaces.
    """
    import cupy

    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    fn = _function(module, kernel, device.index)
    # A pointer is 8 bytes by value, as np.uint64: no DLPack exchange and no CuPy array per tensor (a
    # step launches hundreds of kernels, and the host must keep ahead of the GPU). Tensors stay alive
    # through the call; torch's caching allocator reuses their memory only in the order of this stream.
    converted = tuple(
        np.uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else np.uint64(0) if a is None else a
        for a in args
    )
    with cupy.cuda.Device(device.index), _cupy_stream(torch.cuda.current_stream(device)):
        fn(tuple(int(v) for v in grid), tuple(int(v) for v in block), converted)


_STREAMS: dict[tuple[int, int], object] = {}


def _cupy_stream(stream: torch.cuda.Stream):
    """CuPy's handle of torch's stream, made once per stream."""
    import cupy

    key = (stream.device_index, stream.cuda_stream)
    if key not in _STREAMS:  # through the CUDA stream protocol; the handle keeps torch's stream alive
        _STREAMS[key] = cupy.cuda.Stream.from_external(stream)
    return _STREAMS[key]


def _gemm_module(device: torch.device) -> str:
    return gemm_module_for(_device_cc(device.index if device.index is not None else 0))


def grid_1d(total: int, threads: int = THREADS) -> int:
    """Blocks for a grid-stride kernel over ``total`` elements (at least 1)."""
    return max(1, min(MAX_GRID_BLOCKS, -(-total // threads)))


# ----------------------------------------------------------------------------------------------------
# argument checks


def _check_device(*tensors: torch.Tensor) -> None:
    dev = tensors[0].device
    for t in tensors:
        if t.device.type != "cuda":
            raise ValueError(f"kernels.cuda got a tensor on {t.device}; move it to a CUDA device")
        if t.device != dev:
            raise ValueError(f"kernels.cuda got tensors on {dev} and {t.device}")


def _check(*tensors: torch.Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.int8:
            raise TypeError(f"expected an int8 tensor, got {t.dtype}")
    _check_device(*tensors)


def _check_linear(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    _check(a, b)
    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"{what}: expected 2-D operands, got {tuple(a.shape)} and {tuple(b.shape)}")


# ----------------------------------------------------------------------------------------------------
# GEMM


@dataclass(frozen=True)
class GemmPlan:
    """One batched GEMM C[b1, b2][m, n] = sum_k A[b1, b2][m, k] B[b1, b2][n, k] (gemm_common.cuh):
    sizes and the element strides of each operand (k has unit stride in A and B)."""

    M: int
    N: int
    K: int
    nb1: int
    nb2: int
    sA: tuple[int, int, int]  # (b1, b2, m)
    sB: tuple[int, int, int]  # (b1, b2, n)
    sC: tuple[int, int, int, int]  # (b1, b2, m, n)

    def grid(self) -> tuple[int, int, int]:
        gx = -(-self.N // GEMM_TILE)
        gy = -(-self.M // GEMM_TILE)
        gz = self.nb1 * self.nb2
        if gy > MAX_GRID_YZ or gz > MAX_GRID_YZ:
            raise ValueError(f"GEMM too large for one launch: M={self.M}, batch={gz} (limit {MAX_GRID_YZ})")
        return gx, gy, gz


def _run_gemm(plan: GemmPlan, a, b, c) -> None:
    if plan.M == 0 or plan.N == 0 or plan.nb1 * plan.nb2 == 0:
        return
    module = _gemm_module(a.device)
    threads = 128 if module == "gemm_imma" else 256
    i64 = np.int64
    args = (
        a, b, c, np.int32(plan.M), np.int32(plan.N), np.int32(plan.K), np.int32(plan.nb2),
        *(i64(v) for v in plan.sA), *(i64(v) for v in plan.sB), *(i64(v) for v in plan.sC),
    )  # fmt: skip
    _launch(module, module, plan.grid(), (threads, 1, 1), args)


def _check_int32_size(*sizes: int) -> None:
    for v in sizes:
        if v >= 2**31:
            raise ValueError(f"dimension {v} exceeds the kernels' 32-bit sizes")


def gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a (M, K) @ b (N, K)^T -> int32 (M, N) on this project's GEMM kernel."""
    _check_linear(a, b, "gemm")
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"gemm: K differs, {tuple(a.shape)} and {tuple(b.shape)}")
    m, k = a.shape
    n = b.shape[0]
    _check_int32_size(m, n, k)
    plan = GemmPlan(m, n, k, 1, 1, (0, 0, k), (0, 0, k), (0, 0, n, 1))
    c = torch.zeros((m, n), dtype=torch.int32, device=a.device)
    _run_gemm(plan, a.contiguous(), b.contiguous(), c)
    return c


def library_gemm() -> bool:
    """Ungrouped products on cuBLASLt (kernels.cuda_blas), the fastest measured; REPRO_CUDA_GEMM=kernels
    keeps them on this project's own GEMM kernels (tests, comparisons)."""
    return os.environ.get("REPRO_CUDA_GEMM", "library") != "kernels"


def _blas():
    from kernels import cuda_blas  # imports this module: loaded on first use

    return cuda_blas


def linear_forward(xq, wq) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T -> (M, N) int32."""
    _check_linear(xq, wq, "linear_forward")
    if xq.shape[1] != wq.shape[1]:
        raise ValueError(f"linear_forward: K differs, {tuple(xq.shape)} and {tuple(wq.shape)}")
    return _blas().linear_forward(xq, wq) if library_gemm() else gemm(xq, wq)


def linear_input_grad(gq, wq) -> torch.Tensor:
    """g (M, N) @ w (N, K) -> (M, K) int32."""
    _check_linear(gq, wq, "linear_input_grad")
    if gq.shape[1] != wq.shape[0]:
        raise ValueError(f"linear_input_grad: N differs, {tuple(gq.shape)} and {tuple(wq.shape)}")
    return _blas().linear_input_grad(gq, wq) if library_gemm() else gemm(gq, wq.t())


def linear_weight_grad(xq, gq) -> torch.Tensor:
    """g^T (N, M) @ x (M, K) -> (N, K) int32."""
    _check_linear(xq, gq, "linear_weight_grad")
    if gq.shape[0] != xq.shape[0]:
        raise ValueError(f"linear_weight_grad: M differs, {tuple(xq.shape)} and {tuple(gq.shape)}")
    return _blas().linear_weight_grad(xq, gq) if library_gemm() else gemm(gq.t(), xq.t())


# ----------------------------------------------------------------------------------------------------
# convolutions: im2col + GEMM, GEMM + col2im


@dataclass(frozen=True)
class ConvGeometry:
    """A 1/2/3-D convolution as the 3-D one the kernels run (unit leading dims for 1-D and 2-D)."""

    n: int
    cin: int
    cout: int
    groups: int
    spatial: tuple[int, int, int]
    out: tuple[int, int, int]
    k: tuple[int, int, int]
    s: tuple[int, int, int]
    p: tuple[int, int, int]
    d: tuple[int, int, int]

    @classmethod
    def of(cls, x_shape, w_shape, stride, padding, dilation, groups) -> ConvGeometry:
        nd, s, p, d, k, out = conv_geometry(x_shape, w_shape, stride, padding, dilation, groups)
        lead = 3 - nd

        def pad3(v, fill):
            return (fill,) * lead + tuple(int(a) for a in v)

        return cls(
            int(x_shape[0]), int(x_shape[1]), int(w_shape[0]), int(groups),
            pad3(x_shape[2:], 1), pad3(out, 1), pad3(k, 1), pad3(s, 1), pad3(p, 0), pad3(d, 1),
        )  # fmt: skip

    @property
    def positions(self) -> int:  # P, output positions per image
        return math.prod(self.out)

    @property
    def kg(self) -> int:  # the reduction length of the forward pass: Cin/groups * prod(kernel)
        return self.cin // self.groups * math.prod(self.k)

    @property
    def cout_g(self) -> int:
        return self.cout // self.groups

    def chunk(self, bytes_per_image: int, budget: int | None = None) -> int:
        """Images per chunk: the chunk's buffer about ``budget`` bytes, and the GEMM batch of
        images x groups within one launch."""
        budget = _CHUNK_BYTES if budget is None else budget
        by_memory = max(1, budget // max(1, bytes_per_image))
        by_grid = max(1, MAX_GRID_YZ // self.groups)
        if self.groups > MAX_GRID_YZ:
            raise ValueError(f"groups={self.groups} exceeds one launch's {MAX_GRID_YZ}")
        return max(1, min(self.n, by_memory, by_grid))

    def kernel_args(self, nimg: int) -> tuple:
        i32 = np.int32
        return (
            i32(nimg), i32(self.cin), i32(self.groups),
            *(i32(v) for v in (*self.spatial, *self.out, *self.k, *self.s, *self.p, *self.d)),
        )  # fmt: skip


def _im2col(x: torch.Tensor, cols: torch.Tensor, geo: ConvGeometry, strides: tuple[int, int, int, int]):
    """cols[n, g, p, kidx] at the element strides (sN, sG, sP, sK) from contiguous x (im2col.cu)."""
    nimg = x.shape[0]
    total = nimg * geo.groups * geo.positions * geo.kg
    args = (x, cols, *geo.kernel_args(nimg), *(np.int64(v) for v in strides))
    _launch("im2col", "im2col", (grid_1d(total), 1, 1), (THREADS, 1, 1), args)


def _col2im(dcols: torch.Tensor, dx: torch.Tensor, geo: ConvGeometry, strides: tuple[int, int, int, int]):
    """dx (contiguous) = the gather-sum of dcols[n, g, p, kidx] at strides (sN, sG, sP, sK) (col2im.cu)."""
    nimg = dx.shape[0]
    total = dx.numel()
    args = (dcols, dx, *geo.kernel_args(nimg), *(np.int64(v) for v in strides))
    _launch("col2im", "col2im", (grid_1d(total), 1, 1), (THREADS, 1, 1), args)


def conv_forward(xq, wq, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """y = conv(x, w) exactly (torch.nn.functional.conv{1,2,3}d semantics), int32 (N, Cout, *out)."""
    _check(xq, wq)
    geo = ConvGeometry.of(xq.shape, wq.shape, stride, padding, dilation, groups)
    _check_int32_size(geo.kg, geo.positions, geo.cin * math.prod(geo.spatial))
    if groups == 1 and library_gemm():
        return _blas().conv_forward(xq, wq, geo)
    return _kernel_conv_forward(xq, wq, geo)


def _kernel_conv_forward(xq, wq, geo: ConvGeometry) -> torch.Tensor:
    """The forward convolution on this project's kernels: im2col + GEMM, groups as a batch dimension."""
    nd = xq.dim() - 2
    x, w = xq.contiguous(), wq.contiguous()
    g_, P, kg, cg = geo.groups, geo.positions, geo.kg, geo.cout_g
    y = torch.zeros((geo.n, geo.cout, *geo.out[3 - nd :]), dtype=torch.int32, device=xq.device)
    chunk = geo.chunk(g_ * P * kg)
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        cols = torch.empty(nn * g_ * P * kg, dtype=torch.int8, device=xq.device)
        _im2col(x[n0 : n0 + nn], cols, geo, (g_ * P * kg, P * kg, kg, 1))
        # per (image, group): C (Cout/G, P) = W_g (Cout/G, kg) . cols (P, kg)^T, written into y directly
        plan = GemmPlan(
            cg, P, kg, nn, g_, (0, cg * kg, kg), (g_ * P * kg, P * kg, kg), (geo.cout * P, cg * P, P, 1)
        )
        _run_gemm(plan, w, cols, y[n0 : n0 + nn])
    return y


def conv_input_grad(gq, wq, input_shape, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """dL/dx for dL/dy = g (torch.nn.grad.conv{N}d_input), int32 of shape input_shape."""
    _check(gq, wq)
    input_shape = tuple(int(a) for a in input_shape)
    geo = ConvGeometry.of(input_shape, wq.shape, stride, padding, dilation, groups)
    nd = len(input_shape) - 2
    check_grad_output(gq.shape, (geo.n, geo.cout, *geo.out[3 - nd :]))
    _check_int32_size(geo.kg, geo.positions, geo.cin * math.prod(geo.spatial))
    if groups == 1 and library_gemm():
        return _blas().conv_input_grad(gq, wq, input_shape, geo)
    return _kernel_conv_input_grad(gq, wq, input_shape, geo)


def _kernel_conv_input_grad(gq, wq, input_shape, geo: ConvGeometry) -> torch.Tensor:
    g_, P, kg, cg = geo.groups, geo.positions, geo.kg, geo.cout_g
    # A = W_g^T (kg, Cout/G) and B = g as (P, Cout) rows: both k(= output channel)-contiguous
    wt = wq.reshape(g_, cg, kg).transpose(1, 2).contiguous()
    gt = gq.reshape(geo.n, geo.cout, P).transpose(1, 2).contiguous()
    dx = torch.zeros(input_shape, dtype=torch.int32, device=gq.device)
    chunk = geo.chunk(4 * g_ * kg * P)
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        dcols = torch.empty(nn * g_ * kg * P, dtype=torch.int32, device=gq.device)
        # per (image, group): dcols (kg, P) = W_g^T (kg, Cout/G) . g (P, Cout/G)^T
        plan = GemmPlan(
            kg, P, cg, nn, g_, (0, kg * cg, cg), (P * geo.cout, cg, geo.cout), (g_ * kg * P, kg * P, P, 1)
        )
        _run_gemm(plan, wt, gt[n0 : n0 + nn], dcols)
        _col2im(dcols, dx[n0 : n0 + nn], geo, (g_ * kg * P, kg * P, 1, P))
    return dx


def conv_weight_grad(xq, gq, weight_shape, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """dL/dw for dL/dy = g (torch.nn.grad.conv{N}d_weight), int32 of shape weight_shape."""
    _check(xq, gq)
    weight_shape = tuple(int(a) for a in weight_shape)
    geo = ConvGeometry.of(xq.shape, weight_shape, stride, padding, dilation, groups)
    nd = xq.dim() - 2
    check_grad_output(gq.shape, (geo.n, geo.cout, *geo.out[3 - nd :]))
    _check_int32_size(geo.kg, geo.positions, geo.cin * math.prod(geo.spatial))
    if groups == 1 and library_gemm():
        return _blas().conv_weight_grad(xq, gq, weight_shape, geo)
    return _kernel_conv_weight_grad(xq, gq, weight_shape, geo)


def _kernel_conv_weight_grad(xq, gq, weight_shape, geo: ConvGeometry) -> torch.Tensor:
    g_, P, kg, cg = geo.groups, geo.positions, geo.kg, geo.cout_g
    x = xq.contiguous()
    dw = torch.zeros((geo.cout, kg), dtype=torch.int32, device=xq.device)
    chunk = geo.chunk(g_ * P * kg)
    _check_int32_size(chunk * P)
    for n0 in range(0, geo.n, chunk):
        nn = min(chunk, geo.n - n0)
        r = nn * P  # the reduction over this chunk's images and output positions
        a = gq[n0 : n0 + nn].reshape(nn, geo.cout, P).transpose(0, 1).contiguous()  # (Cout, nn*P)
        cols = torch.empty(g_ * kg * r, dtype=torch.int8, device=xq.device)
        _im2col(x[n0 : n0 + nn], cols, geo, (P, kg * r, 1, r))  # cols[g][kidx][(n, p)]
        part = torch.empty((geo.cout, kg), dtype=torch.int32, device=xq.device)
        # per group: dw_g (Cout/G, kg) = g_g (Cout/G, nn*P) . cols_g (kg, nn*P)^T
        plan = GemmPlan(cg, kg, r, 1, g_, (0, cg * r, r), (0, kg * r, r), (0, cg * kg, kg, 1))
        _run_gemm(plan, a, cols, part)
        dw += part  # int32 partial sums over batch chunks: exact within the contract
    return dw.reshape(weight_shape)
