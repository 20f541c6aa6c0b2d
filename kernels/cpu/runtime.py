"""The CPU backend's runtime: its C++ sources (kernels/cpu/csrc/), built on first use and loaded with ctypes.

g++ compiles the sources once per machine into one shared library, ``-O3 -march=native -fopenmp`` (AVX2
paths where the CPU has them, scalar code elsewhere; OpenMP binds to the runtime torch already loaded, so
``torch.set_num_threads`` governs it too). The library is cached under ``$REPRO_NATIVE_CACHE`` (default
``~/.cache/int8-repro/native``), named by a hash of the sources, the flags, the compiler and the CPU, and
written aside then renamed, so concurrent first uses and killed builds are harmless. ``available()`` says
whether it could be built; the callers keep a torch fallback for a machine without a compiler.
Imports no sibling: the quantizer and the products sit above it.
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

SOURCE_DIR = Path(__file__).with_name("csrc")
SOURCES = (
    "quantize.cpp",
    "gemm.cpp",
    "gemm_amx.cpp",
    "depthwise.cpp",
    "float_format.cpp",
    "norm.cpp",
    "pad.cpp",
    "grouped.cpp",
)
HEADERS = (
    "philox.h",
    "codes.h",
    "moments.h",
    "bf16.h",
    "gemm_operand.h",
    "gemm_amx.h",
    "store16.h",
    "vnni_rows.h",
)
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
    lib.rq_channel_stats.argtypes = (ptr, i32, i64, i64, i64, ptr, ptr, ptr, ptr)
    lib.rq_quantize.argtypes = (ptr, i32, ptr, i32, ptr, ptr, ptr, i32, i32, i32, u32, u32, ptr, ptr)
    f32 = ctypes.c_float
    lib.rq_daiq_codes.argtypes = (ptr, i32, ptr, ptr, i32, ptr, ptr, i32, ptr, ptr, ptr, f32, f32, f32,
                                  u32, u32, u32, u32, ptr, ptr, ptr)  # fmt: skip
    for fn in (lib.rq_absmax, lib.rq_channel_stats, lib.rq_quantize, lib.rq_daiq_codes):
        fn.restype = i32
    lib.rq_dequantize.argtypes = (ptr, ptr, i32, i64, i64, i64, ptr, i32)
    lib.rq_dequantize.restype = None
    # ..., scale, whether the output is bfloat16
    lib.rq_gemm_s8.argtypes = (i64, i64, i64, ptr, i64, i64, ptr, i64, i64, ptr, i64, ptr, i32, i32)
    lib.rq_gemm_s8.restype = None
    axes = (i64, ptr, i64) * 2  # an operand's two axes: stride, table, run
    # ..., scale, scale_axis, whether C is bfloat16, the batch (count, A's, B's and C's steps), C's row table
    batch = (i64,) * 4
    mnk = (i64,) * 3
    lib.rq_gemm_s8_tables.argtypes = (*mnk, ptr, *axes, ptr, *axes, ptr, i64, ptr, i32, i32, *batch, ptr)
    lib.rq_gemm_s8_tables.restype = None
    lib.rq_pad_cl.argtypes = (ptr, ptr) + (i64,) * 6
    lib.rq_pad_cl.restype = None
    lib.rq_pad_cl_flipped.argtypes = (ptr, ptr) + (i64,) * 6
    lib.rq_pad_cl_flipped.restype = None
    # phases (7 int64 each), their count, a, b, blk, starts, blocks, w, its 3 steps, C, ldc, scale, axis, bf16
    lib.rq_grouped_vnni.argtypes = (ptr, *(i64,) * 4, ptr, i64, ptr, *(i64,) * 3, ptr, i64, ptr, i32, i32)
    lib.rq_grouped_vnni.restype = i32
    lib.rq_grouped_vnni_usable.argtypes = ()
    lib.rq_grouped_vnni_usable.restype = i32
    lib.rq_allow_amx.argtypes = (i32,)
    lib.rq_allow_amx.restype = i32
    lib.rq_tiles_amx.argtypes = ()
    lib.rq_tiles_amx.restype = i32
    for fn in (lib.rq_dw_forward, lib.rq_dw_input_grad):  # ..., scale, whether the output is bfloat16
        fn.argtypes = (ptr, ptr, ptr, ptr, ptr, i32)
        fn.restype = i32
    lib.rq_dw_weight_grad.argtypes = (ptr, ptr, ptr, ptr)
    lib.rq_dw_weight_grad.restype = i32
    lib.rq_round_float_format.argtypes = (ptr, ptr, i64, i32, i32, ctypes.c_float, ptr, ptr)
    lib.rq_round_float_format.restype = i64
    f64 = ctypes.c_double
    # (x, residual, y, codes, mask bits, rows, C) or (g, mask bits, x, residual's gradient, gx, rows, C) ...
    # (lo, hi, then six per-channel arrays) ... and last, whether the tensors are bfloat16 (else float32)
    bounds_and_channels = (f32, f32) + (ptr,) * 6
    fwd_args, bwd_args = (ptr,) * 5 + (i64, i64, ptr, ptr, f64), (ptr,) * 5 + (i64, i64, ptr, ptr, ptr)
    lib.rq_norm_forward.argtypes = (*fwd_args, *bounds_and_channels, ptr, ptr, f64, i32)
    lib.rq_norm_backward.argtypes = (*bwd_args, *bounds_and_channels, ptr, ptr, i32)
    for fn in (lib.rq_norm_forward, lib.rq_norm_backward):
        fn.restype = i32
    return lib


def available() -> bool:
    return library() is not None


def pointer(t: torch.Tensor | None):
    return None if t is None else ctypes.c_void_p(t.data_ptr())


def int64_array(values) -> ctypes.Array:
    return (ctypes.c_int64 * max(1, len(values)))(*values)
