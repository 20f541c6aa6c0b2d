"""The CUDA backend's runtime: compile (NVRTC), cache, load (CuPy) and launch the kernels of csrc/.

Kernels are compiled lazily, once per (module, architecture), to a cubin (PTX for an architecture
NVRTC does not know, JIT-compiled by the driver), cached on disk under ``$REPRO_CUDA_CACHE`` (default
``~/.cache/int8-repro/cuda``) and loaded with ``cupy.RawModule``. NVRTC comes from the
``nvidia-cuda-nvrtc`` wheel that cupy-cuda13x and torch install; NVRTC 13 no longer targets sm_61/sm_70,
so GPUs older than Turing get a clear error. Compiling needs no GPU (CI compiles every kernel).

Every launch, device check, choice of GEMM kernel and cuBLASLt product of the backend goes through the
current ``Launcher``: ``GpuLauncher`` by default; ``launching_with`` swaps it for a block, which is how the
CPU harness (tests/test_cuda_backend.py) runs the kernels on CPU tensors and the dry run
(kernels.cuda.dry_run) counts them on meta tensors. Imports no sibling: everything else sits above it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from atomic_files import write_file

SOURCE_DIR = Path(__file__).with_name("csrc")
# the architectures CI compiles every kernel for (a kernel is skipped below its own minimum)
CI_ARCHS = (75, 80, 90)
# strict IEEE float arithmetic: the quantizer must round exactly as torch does (no FMA contraction,
# no flush-to-zero, correctly rounded division)
COMMON_OPTIONS = ("-std=c++17", "--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false")
THREADS = 256  # threads per block of the elementwise and reduction kernels
MAX_GRID_YZ = 65535  # CUDA's limit on gridDim.y and gridDim.z
MAX_GRID_BLOCKS = 65535 * 16  # grid-stride kernels: enough blocks to fill any GPU


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


def grid_1d(total: int, threads: int = THREADS) -> int:
    """Blocks for a grid-stride kernel over ``total`` elements (at least 1)."""
    return max(1, min(MAX_GRID_BLOCKS, -(-total // threads)))


@functools.cache
def load_kernel(module: str, kernel: str, device_index: int, cc: int):
    """The loaded kernel for a device of compute capability ``cc`` (compiled once per module and
    architecture, cached on disk)."""
    import cupy

    arch, ptx = target_for(cc, nvrtc_archs())
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


SPLIT_ROWS_MIN = 4096  # below this a refused int8 GEMM is not split further: the refusal is not its size


class GpuLauncher:
    """The kernels on an NVIDIA GPU, on torch's current stream (the default launcher)."""

    def __init__(self) -> None:
        self.streams: dict[tuple[int, int], object] = {}

    def launch(self, module: str, kernel: str, grid, block, args) -> None:
        """Run a kernel on torch's current stream of the device of the tensors in ``args``.

        ``args``: torch tensors (passed as their device pointers), None (a null pointer) and numpy
        scalars (passed by value with their exact C type).
        """
        import cupy

        device = next(a.device for a in args if isinstance(a, torch.Tensor))
        fn = load_kernel(module, kernel, device.index, self.compute_capability(device.index))
        # A pointer is 8 bytes by value, as np.uint64: no DLPack exchange and no CuPy array per tensor (a
        # step launches hundreds of kernels, and the host must keep ahead of the GPU). Tensors stay alive
        # through the call; torch's caching allocator reuses their memory only in the order of this stream.
        converted = tuple(
            np.uint64(a.data_ptr()) if isinstance(a, torch.Tensor) else np.uint64(0) if a is None else a
            for a in args
        )
        with cupy.cuda.Device(device.index), self._cupy_stream(torch.cuda.current_stream(device)):
            fn(tuple(int(v) for v in grid), tuple(int(v) for v in block), converted)

    def _cupy_stream(self, stream: torch.cuda.Stream):
        """CuPy's handle of torch's stream, made once per stream."""
        import cupy

        key = (stream.device_index, stream.cuda_stream)
        if key not in self.streams:  # through the CUDA stream protocol; the handle keeps torch's stream alive
            self.streams[key] = cupy.cuda.Stream.from_external(stream)
        return self.streams[key]

    def compute_capability(self, device_index: int | None) -> int:
        major, minor = torch.cuda.get_device_capability(device_index or 0)
        return 10 * major + minor

    def gemm_module(self, device_index: int | None) -> str:
        """This project's GEMM kernel for the device: IMMA on sm_80+, dp4a below."""
        return gemm_module_for(self.compute_capability(device_index))

    def check_device(self, tensors) -> None:
        dev = tensors[0].device
        for t in tensors:
            if t.device.type != "cuda":
                raise ValueError(f"kernels.cuda got a tensor on {t.device}; move it to a CUDA device")
            if t.device != dev:
                raise ValueError(f"kernels.cuda got tensors on {dev} and {t.device}")

    def int_mm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """cuBLASLt's int8 GEMM (M > 16, K and N multiples of 8, both operands K-major). Where cuBLASLt has
        no algorithm for the whole shape (an H200 had none for M = 451,584, K = 64, N = 152, ResNet-50's
        first convolution's input gradient in 36-image chunks), the rows are split in two until it has:
        the same sums."""
        try:
            return torch._int_mm(a, b)
        except RuntimeError as e:
            m = a.shape[0]
            if "CUBLAS_STATUS_NOT_SUPPORTED" not in str(e) or m < 2 * SPLIT_ROWS_MIN:
                raise
        half = m // 2 // 16 * 16  # a row offset that keeps the operand 16-byte aligned
        out = torch.empty((m, b.shape[1]), dtype=torch.int32, device=a.device)
        out[:half] = self.int_mm(a[:half], b)
        out[half:] = self.int_mm(a[half:], b)
        return out


_ACTIVE: list = [GpuLauncher()]


def current():
    """The launcher the backend uses now."""
    return _ACTIVE[-1]


@contextlib.contextmanager
def launching_with(launcher) -> Iterator:
    """Route the backend's launches, device checks, compute capability and cuBLASLt products through
    ``launcher`` (a GpuLauncher, its methods overridden) inside the block."""
    _ACTIVE.append(launcher)
    try:
        yield launcher
    finally:
        _ACTIVE.pop()  # blocks nest, so the innermost launcher is the last


def launch(module: str, kernel: str, grid, block, args) -> None:
    current().launch(module, kernel, grid, block, args)


def check_device(*tensors: torch.Tensor) -> None:
    current().check_device(tensors)


def gemm_module(device: torch.device) -> str:
    return current().gemm_module(device.index)


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return current().int_mm(a, b)
