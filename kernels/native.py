"""The CPU backend's native code (kernels/native/*.cpp), built on first use and loaded with ctypes.

g++ compiles the sources once per machine into one shared library, ``-O3 -march=native -fopenmp`` (AVX2
paths where the CPU has them, scalar code elsewhere; OpenMP binds to the runtime torch already loaded, so
``torch.set_num_threads`` governs it too). The library is cached under ``$REPRO_NATIVE_CACHE`` (default
``~/.cache/int8-repro/native``), named by a hash of the sources, the flags, the compiler and the CPU, and
written aside then renamed, so concurrent first uses and killed builds are harmless. ``available()`` says
whether it could be built; the callers keep a torch fallback for a machine without a compiler.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

SOURCE_DIR = Path(__file__).with_name("native")
SOURCES = ("quantize.cpp", "gemm.cpp", "depthwise.cpp")
HEADERS = ("philox.h",)
FLAGS = ("-O3", "-march=native", "-fopenmp", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off")


class NativeBuildError(RuntimeError):
    """g++ could not build the native library (the message carries its output)."""


def _cache_dir() -> Path:
    return Path(os.environ.get("REPRO_NATIVE_CACHE", Path.home() / ".cache" / "int8-repro" / "native"))


def compiler() -> str | None:
    """$CXX or g++ on the PATH, or None: where one exists the library must build (tests fail if not)."""
    return os.environ.get("CXX") or shutil.which("g++")


def _fingerprint(cxx: str) -> str:
    h = hashlib.sha256()
    for name in SOURCES + HEADERS:
        h.update(name.encode())
        h.update((SOURCE_DIR / name).read_bytes())
    h.update(repr(FLAGS).encode())
    h.update(subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.encode())
    try:  # -march=native: the library belongs to this CPU
        with open("/proc/cpuinfo") as f:
            h.update("".join(line for line in f if line.startswith(("flags", "model name"))).encode())
    except OSError:
        pass
    return h.hexdigest()[:20]


def build() -> Path:
    """The library's path, compiled now if no cached build exists. Raises NativeBuildError."""
    cxx = compiler()
    if cxx is None:
        raise NativeBuildError("no C++ compiler (g++) found: the CPU backend's native code cannot be built")
    path = _cache_dir() / f"repro_native-{_fingerprint(cxx)}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".so.part")
    os.close(fd)
    cmd = [cxx, *FLAGS, "-I", str(SOURCE_DIR), *(str(SOURCE_DIR / s) for s in SOURCES), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise NativeBuildError(f"{' '.join(cmd)} failed:\n{proc.stderr[-4000:]}")
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded library, or None (with one warning) where it cannot be built."""
    try:
        lib = ctypes.CDLL(str(build()))
    except (NativeBuildError, OSError) as err:
        warnings.warn(f"the CPU backend runs its slower torch fallback: {err}", stacklevel=2)
        return None
    i64, i32, u32, ptr = ctypes.c_int64, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p
    lib.rq_absmax.argtypes = (ptr, i32, i64, ptr)
    lib.rq_channel_stats.argtypes = (ptr, i32, i64, i64, i64, ptr, ptr, ptr)
    lib.rq_quantize.argtypes = (ptr, i32, ptr, i32, ptr, ptr, ptr, i32, i32, i32, u32, u32, ptr, ptr)
    for fn in (lib.rq_absmax, lib.rq_channel_stats, lib.rq_quantize):
        fn.restype = i32
    lib.rq_dequantize.argtypes = (ptr, ptr, i32, i64, i64, i64, ptr, i32)
    lib.rq_dequantize.restype = None
    lib.rq_gemm_s8.argtypes = (i64, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64)
    lib.rq_gemm_s8.restype = None
    for fn in (lib.rq_dw_forward, lib.rq_dw_input_grad, lib.rq_dw_weight_grad):
        fn.argtypes = (ptr, ptr, ptr, ptr)
        fn.restype = i32
    return lib


def available() -> bool:
    return library() is not None


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
    return t if is_dense(t) else t.contiguous()


def _ptr(t: torch.Tensor | None):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def _i64(values) -> ctypes.Array:
    return (ctypes.c_int64 * max(1, len(values)))(*values)


def channel_split(x: torch.Tensor, axis: int | None) -> tuple[int, int, int]:
    """(outer, C, inner) of a dense x's memory around dimension `axis` (None: one channel)."""
    c = 1 if axis is None else x.shape[axis]
    if c <= 1:
        return 1, 1, x.numel()
    inner = x.stride(axis)
    return x.numel() // (c * inner), c, inner


def gemm(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Exact int8 (M, K) @ int8 (K, N) -> int32 (M, N), any strides; into `out` (int32, unit column
    stride) if given."""
    lib = library()
    m, k = a.shape
    n = b.shape[1]
    if out is None:
        out = torch.empty((m, n), dtype=torch.int32)
    if out.stride(1) != 1 and n > 1:
        raise ValueError("gemm: out needs unit column stride")
    lib.rq_gemm_s8(m, n, k, _ptr(a), a.stride(0), a.stride(1), _ptr(b), b.stride(0), b.stride(1), _ptr(out),
                   out.stride(0))  # fmt: skip
    return out


def _channels_last_2d(t: torch.Tensor) -> torch.Tensor:
    return (
        t
        if t.is_contiguous(memory_format=torch.channels_last)
        else t.contiguous(memory_format=torch.channels_last)
    )


def _dw(fn, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, x_shape, out_hw, kernel, s, p, d) -> None:
    n, c, h, w = x_shape
    geometry = _i64([n, c, h, w, *out_hw, *kernel, *s, *p, *d])
    if getattr(library(), fn)(_ptr(a), _ptr(b), _ptr(out), geometry):
        raise ValueError(f"depthwise kernel {tuple(kernel)} has more taps than the native kernels take")


def depthwise_forward(x, w, s, p, d, out_hw) -> torch.Tensor:
    """Depthwise 2-D convolution of int8 x (N, C, H, W) with w (C, 1, KH, KW), zero padding p: int32
    (N, C, OH, OW), channels-last."""
    x = _channels_last_2d(x)
    n, c = x.shape[:2]
    y = torch.empty((n, *out_hw, c), dtype=torch.int32)
    _dw("rq_dw_forward", x, w.contiguous(), y, x.shape, out_hw, w.shape[2:], s, p, d)
    return y.permute(0, 3, 1, 2)


def depthwise_input_grad(g, w, x_shape, s, p, d) -> torch.Tensor:
    """dL/dx (N, C, H, W) int32, channels-last, of a depthwise 2-D convolution, from the int8 output
    gradient g (N, C, OH, OW)."""
    g = _channels_last_2d(g)
    n, c, h, wd = x_shape
    dx = torch.empty((n, h, wd, c), dtype=torch.int32)
    _dw("rq_dw_input_grad", g, w.contiguous(), dx, x_shape, g.shape[2:], w.shape[2:], s, p, d)
    return dx.permute(0, 3, 1, 2)


def depthwise_weight_grad(x, g, kernel, s, p, d) -> torch.Tensor:
    """dL/dw (C, 1, KH, KW) int32 of a depthwise 2-D convolution, from int8 x and output gradient g."""
    x, g = _channels_last_2d(x), _channels_last_2d(g)
    dw = torch.empty((x.shape[1], 1, *kernel), dtype=torch.int32)
    _dw("rq_dw_weight_grad", x, g, dw, x.shape, g.shape[2:], kernel, s, p, d)
    return dw
