"""The CUDA backend (kernels.cuda): GPU tests, and the same kernels run on the CPU without a GPU.

* GPU tests (skipped here, no CUDA device): kernels.cuda equals kernels.reference bit for bit over the
  shape grid of the CPU tests (tests/test_backend.py), through both GEMMs the device can run; the
  fused quantizer equals repro.quant (nearest: bit for bit; stochastic: codes are floor or ceil of the
  scaled value, the host Philox mirror gives the same codes, and the mean is unbiased).
* CPU-harness tests (run everywhere g++ exists): the kernel sources in kernels/cuda/csrc/ compiled by g++
  with tests/cuda_shim.h, which stands in for the CUDA runtime (threads, barriers, shared memory,
  an emulated warp-wide mma.sync from the PTX fragment tables). kernels.cuda's host code launches
  them through its one seam (runtime.launching_with, HarnessLauncher) on CPU tensors, so the host
  planning (strides, batch chunks, groups), the kernels' indexing, tiling and K padding, and the
  quantizer's arithmetic are checked bit for bit against kernels.reference and repro.quant.
  This is not a GPU run.
* Host logic without any kernel: architecture choice, launch geometry, argument checks, and the
  host Philox mirror against the Random123 known-answer vectors.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import philox_mirror
import pytest
import torch
from test_backend import (
    ADVERSARIAL,
    CIN,
    CPU_GRID,
    adversarial_case,
    assert_passes_exact,
    assert_same,
    both,
    conv_case,
    rand_i8,
)

import kernels
from kernels import cuda, errors, reference
from kernels.cuda import blas, columns, own_kernels, runtime
from kernels.cuda import quantizer as cuda_quantize
from repro import quant

NO_GPU = (
    "no CUDA device here: the GPU tests run unchanged on a machine with one (kernels.cuda is compiled "
    "in CI and its kernels run on the CPU harness)"
)
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)


# ------------------------------------------------------------------------------------------------
# host logic, no kernel


def test_get_backend_cuda():
    assert kernels.get_backend("cuda") is cuda
    assert kernels.get_backend(torch.device("cuda", 1)) is cuda
    for name in reference.__all__:
        assert callable(getattr(cuda, name))


def test_philox_known_answers():
    """Random123's kat_vectors for philox4x32-10 (counter, key -> output)."""
    cases = [
        ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
        ([0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
        (
            [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344],
            [0xA4093822, 0x299F31D0],
            [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1],
        ),
    ]
    for ctr, key, want in cases:
        assert philox_mirror.philox4x32_10(ctr, key).tolist() == want
    u = philox_mirror.uniforms((10, 10_000), 123, 456)
    assert u.dtype == np.float32 and u.min() >= 0 and u.max() < 1
    assert abs(float(u.mean()) - 0.5) < 0.005


def test_target_architecture_choice():
    supported = (75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121)
    assert runtime.target_for(80, supported) == (80, False)
    assert runtime.target_for(89, supported) == (89, False)
    assert runtime.target_for(91, supported) == (90, True)  # unknown to NVRTC: PTX of the newest lower one
    for cc in (61, 70):
        with pytest.raises(RuntimeError, match="Turing"):
            runtime.target_for(cc, supported)
    assert runtime.gemm_module_for(75) == "gemm_dp4a"
    assert runtime.gemm_module_for(86) == "gemm_imma"
    assert runtime.gemm_module_for(90) == "gemm_imma"
    with pytest.raises(RuntimeError, match="6.1"):
        runtime.gemm_module_for(60)
    assert runtime.ci_archs("gemm_imma", supported) == (80, 90)
    assert runtime.ci_archs("gemm_dp4a", supported) == (75, 80, 90)


def test_lazy_compile_and_disk_cache(monkeypatch, tmp_path):
    """load_kernel compiles for the device's architecture once, writes the cubin (or PTX) to the cache
    directory and loads that file with cupy.RawModule (replaced here: loading needs a GPU)."""
    import contextlib

    import cupy

    loaded = []

    class FakeModule:
        def __init__(self, path):
            loaded.append(path)

        def get_function(self, name):
            return name

    monkeypatch.setenv("REPRO_CUDA_CACHE", str(tmp_path))
    monkeypatch.setattr(cupy, "RawModule", FakeModule)
    monkeypatch.setattr(cupy.cuda, "Device", lambda index: contextlib.nullcontext())
    runtime.load_kernel.cache_clear()
    try:
        for cc, suffix in ((86, "sm_86"), (91, "compute_90")):
            assert runtime.load_kernel("im2col", "im2col", 0, cc) == "im2col"
            (path,) = [p for p in tmp_path.iterdir() if suffix in p.name]
            assert loaded[-1] == str(path)
            head = path.read_bytes()[:200]
            assert head[:4] == b"\x7fELF" if suffix.startswith("sm") else b".target sm_90" in head
        mtime = path.stat().st_mtime_ns
        runtime.load_kernel.cache_clear()
        runtime.load_kernel("im2col", "im2col", 0, 91)  # a new process: the file is reused, not rebuilt
        assert path.stat().st_mtime_ns == mtime and len(list(tmp_path.iterdir())) == 2
        assert not list(tmp_path.glob("*.part"))
    finally:
        runtime.load_kernel.cache_clear()


def test_launch_geometry():
    assert (
        runtime.grid_1d(0) == 1
        and runtime.grid_1d(1) == 1
        and runtime.grid_1d(256) == 1
        and runtime.grid_1d(257) == 2
    )
    assert runtime.grid_1d(10**12) == runtime.MAX_GRID_BLOCKS
    plan = own_kernels.GemmPlan(65, 128, 3, 2, 3, (0, 0, 3), (0, 0, 3), (0, 0, 128, 1))
    assert plan.grid() == (2, 2, 6)
    with pytest.raises(ValueError, match="too large"):
        own_kernels.GemmPlan(64 * 65536, 1, 1, 1, 1, (0, 0, 1), (0, 0, 1), (0, 0, 1, 1)).grid()
    geo = columns.ConvGeometry.of((5, 4, 9), (8, 2, 3), 2, 1, 1, 2)
    assert geo.spatial == (1, 1, 9) and geo.out == (1, 1, 5) and geo.k == (1, 1, 3) and geo.p == (0, 0, 1)
    assert geo.kg == 6 and geo.positions == 5 and geo.cout_g == 4
    assert geo.chunk(100, budget=250) == 2 and geo.chunk(1, budget=10**9) == 5
    dw = columns.ConvGeometry.of((4, 40000, 3, 3), (40000, 1, 3, 3), 1, 1, 1, 40000)
    assert dw.chunk(1) == 1  # images x groups stay within one launch's gridDim.z


def _refusing_int_mm(above_rows: int):
    """torch._int_mm as cuBLASLt answers a shape it has no int8 algorithm for (above some row count)."""
    real = torch._int_mm

    def int_mm(a, b):
        if a.shape[0] > above_rows:
            raise RuntimeError("CUDA error: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasLtMatmul")
        return real(a, b)

    return int_mm


@pytest.mark.parametrize("above_rows", [20_000, 6_000])
def test_a_refused_int8_gemm_is_split_by_rows_into_the_same_sums(monkeypatch, above_rows):
    gen = torch.Generator().manual_seed(0)
    a, b = rand_i8((40_000, 16), gen), rand_i8((24, 16), gen).t()
    monkeypatch.setattr(torch, "_int_mm", _refusing_int_mm(above_rows))
    got = runtime.GpuLauncher().int_mm(a, b)
    assert torch.equal(got, (a.long() @ b.long()).to(torch.int32))


def test_a_refusal_that_splitting_cannot_cure_is_raised(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    a, b = rand_i8((40_000, 16), gen), rand_i8((24, 16), gen).t()
    monkeypatch.setattr(torch, "_int_mm", _refusing_int_mm(16))  # refused at every size
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_NOT_SUPPORTED"):
        runtime.GpuLauncher().int_mm(a, b)


def test_launch_passes_pointers_on_torch_stream(monkeypatch):
    """GpuLauncher.launch (the harness stands in for it, so never run here otherwise): tensors go as their
    device pointers, None as a null pointer, scalars as they are, on CuPy's handle of torch's current stream,
    made once per stream (CuPy's launch and device are stood in for)."""
    import contextlib

    import cupy

    calls, made = [], []

    class Stream:
        def __init__(self, s):
            made.append(s.cuda_stream)

        __enter__ = lambda self: self  # noqa: E731
        __exit__ = lambda self, *a: None  # noqa: E731

    class TorchStream:
        device_index, cuda_stream = 0, 1234

    monkeypatch.setattr(runtime, "load_kernel", lambda module, kernel, index, cc: lambda *a: calls.append(a))
    monkeypatch.setattr(cupy.cuda, "Device", lambda index: contextlib.nullcontext())
    monkeypatch.setattr(cupy.cuda.Stream, "from_external", Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: TorchStream())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    launcher = runtime.GpuLauncher()
    x = torch.arange(6, dtype=torch.float32)
    for _ in range(2):
        launcher.launch("quantize", "dequantize", (3, 1, 1), (256, 1, 1), (x, None, np.int32(7), x[2:]))
    grid, block, args = calls[-1]
    assert grid == (3, 1, 1) and block == (256, 1, 1) and len(calls) == 2 and made == [1234]
    assert [type(a) for a in args] == [np.uint64, np.uint64, np.int32, np.uint64]
    assert args[0] == x.data_ptr() and args[1] == 0 and args[2] == 7 and args[3] == x.data_ptr() + 8


def test_rejects_bad_arguments_without_gpu():
    x = torch.zeros((1, 4, 5, 5), dtype=torch.int8)
    w = torch.zeros((8, 4, 3, 3), dtype=torch.int8)
    with pytest.raises(ValueError, match="CUDA device"):
        cuda.conv_forward(x, w)
    with pytest.raises(TypeError):
        cuda.conv_forward(x.float(), w)
    with pytest.raises(ValueError, match="CUDA device"):
        cuda.quantize(torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="rounding"):
        cuda.quantize(torch.zeros(3), 1.0, rounding="up")


# ------------------------------------------------------------------------------------------------
# the kernels on the CPU harness

_CTYPES = {
    np.int32: ctypes.c_int32,
    np.int64: ctypes.c_int64,
    np.uint32: ctypes.c_uint32,
    np.uint64: ctypes.c_uint64,
    np.float32: ctypes.c_float,
}


class CpuHarness:
    """kernels/cuda/csrc/*.cu compiled by g++ against tests/cuda_shim.h; HarnessLauncher sends launches
    here."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.libs = {}
        self.launches = []

    def lib(self, module: str):
        if module not in self.libs:
            mod = runtime.MODULES[module]
            src = runtime.source(module) + "\n" + "".join(f"SHIM_EXPORT({k})\n" for k in mod.kernels)
            cpp = self.workdir / f"{module}.cpp"
            so = self.workdir / f"{module}.so"
            cpp.write_text(src)
            cmd = ["g++", "-std=c++20", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-pthread", "-w"]
            cmd += [
                "-include",
                str(Path(__file__).with_name("cuda_shim.h")),
                "-x",
                "c++",
                str(cpp),
                "-o",
                str(so),
            ]
            res = subprocess.run(cmd, capture_output=True, text=True)
            assert res.returncode == 0, f"g++ could not build {module} for the CPU harness:\n{res.stderr}"
            self.libs[module] = ctypes.CDLL(str(so))
        return self.libs[module]

    def launch(self, module, kernel, grid, block, args):
        objs = []
        for a in args:
            if isinstance(a, torch.Tensor):
                assert a.device.type == "cpu"
                objs.append(ctypes.c_void_p(a.data_ptr()))
            elif a is None:
                objs.append(ctypes.c_void_p(0))
            else:
                objs.append(_CTYPES[type(a)](a.item()))
        ptrs = (ctypes.c_void_p * len(objs))(*[ctypes.cast(ctypes.pointer(o), ctypes.c_void_p) for o in objs])
        fn = getattr(self.lib(module), f"shim_launch_{kernel}")
        fn.restype = None
        fn(*(ctypes.c_uint(int(v)) for v in (*grid, *block)), ptrs)
        self.launches.append((module, kernel, tuple(grid), tuple(block)))


@pytest.fixture(scope="session")
def harness(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is needed to run the CUDA kernel sources on the CPU harness")
    return CpuHarness(tmp_path_factory.mktemp("cuda_cpu_harness"))


class HarnessLauncher(runtime.GpuLauncher):
    """kernels.cuda on the CPU harness: launches go to the g++-built kernels, CPU tensors are accepted,
    the GEMM kernel is the one asked for, and cuBLASLt's products are exact int64 ones with its shape
    rules checked."""

    def __init__(self, harness: CpuHarness, gemm: str) -> None:
        super().__init__()
        self.harness, self.gemm = harness, gemm

    def launch(self, module, kernel, grid, block, args) -> None:
        self.harness.launch(module, kernel, grid, block, args)

    def gemm_module(self, device_index) -> str:
        return self.gemm

    def check_device(self, tensors) -> None:
        pass

    def int_mm(self, a, b):
        return checked_int_mm(a, b)


def checked_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch._int_mm as cuBLASLt runs it on an sm_90 GPU: the shapes it accepts (M > 16, K and N multiples
    of 8) and the int8 layout it runs at every shape, "TN" (a row-major, b column-major: both K-major,
    16-byte aligned; on an H200 other layouts raised CUBLAS_STATUS_NOT_SUPPORTED at some shapes); exact."""
    assert a.dtype == b.dtype == torch.int8 and a.dim() == b.dim() == 2 and a.shape[1] == b.shape[0]
    assert a.shape[0] > 16 and a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0, (tuple(a.shape), tuple(b.shape))
    assert blas.k_major(a) and blas.k_major(b.t()), ("not TN", a.stride(), b.stride())
    return (a.long() @ b.long()).to(torch.int32)


@pytest.fixture(params=["library", "gemm_imma", "gemm_dp4a"])
def on_cpu(request, harness, monkeypatch):
    """kernels.cuda with its launches going to the CPU harness, CPU tensors accepted, and the products of
    the library route (cuBLASLt's torch._int_mm, its shape rules checked; grouped convolutions on the
    IMMA kernel) or of this project's GEMM of an sm_80+ (IMMA) or an sm_75 (dp4a) device."""
    harness.route = request.param
    harness.launches.clear()
    if request.param == "library":
        monkeypatch.delenv("REPRO_CUDA_GEMM", raising=False)
    else:
        monkeypatch.setenv("REPRO_CUDA_GEMM", "kernels")
    gemm = "gemm_imma" if request.param == "library" else request.param
    with runtime.launching_with(HarnessLauncher(harness, gemm)):
        yield harness


@pytest.fixture
def on_cpu_quant(harness):
    """The same for the quantizer, which uses no GEMM."""
    harness.launches.clear()
    with runtime.launching_with(HarnessLauncher(harness, "none")):
        yield harness


# a spread of the CPU tests' grid that still has every dimension, kernel size, stride, padding,
# dilation and grouping (the whole grid runs on the GPU; the CPU harness is slow)
HARNESS_GRID = [case for i, case in enumerate(CPU_GRID) if i % 11 == 0] + [
    (2, 3, 2, 1, 2, "dw", 3),
    (2, 3, 2, 1, 1, 2, 1),
    (3, 3, 2, 0, 1, 1, 2),
    (1, 5, 2, 1, 2, 1, 2),
]


@pytest.mark.parametrize("nd,k,s,p,d,groups,n", HARNESS_GRID)
def test_harness_conv_matches_reference(on_cpu, nd, k, s, p, d, groups, n):
    gen = torch.Generator().manual_seed(CPU_GRID.index((nd, k, s, p, d, groups, n)))
    case = conv_case(nd, k, s, p, d, groups, n, gen)
    if case is None:
        pytest.skip("empty output")
    x, w, g = case
    want = both(nd, k, s, p, d, groups, x, w, g, reference)
    got = both(nd, k, s, p, d, groups, x, w, g, cuda)
    for what, a, b in zip(("forward", "input grad", "weight grad"), got, want, strict=True):
        assert_same(a, b, what)
    gemm = {launch[1] for launch in on_cpu.launches if launch[0].startswith("gemm")}
    library = on_cpu.route == "library" and groups == 1  # cuBLASLt's GEMM, no kernel of ours
    assert gemm == (set() if library else {runtime.gemm_module(torch.device("cpu"))})


def test_harness_conv_batch_chunks_and_wide_channels(on_cpu, monkeypatch):
    """Several batch chunks (weight-grad partial sums, offsets into y/dx), K over several 32-wide
    tiles and not a multiple of 32, M and N over several 64-wide tiles with ragged edges."""
    monkeypatch.setattr(columns, "CHUNK_BYTES", 1)  # one image per chunk
    gen = torch.Generator().manual_seed(21)
    x, w = rand_i8((3, 70, 5, 6), gen), rand_i8((66, 35, 3, 3), gen)  # Kg = 35*9 = 315
    args = (1, 1, 1, 2)
    g = rand_i8(reference.conv_forward(x, w, *args).shape, gen)
    assert_same(cuda.conv_forward(x, w, *args), reference.conv_forward(x, w, *args), "forward")
    assert_same(cuda.conv_input_grad(g, w, x.shape, *args), reference.conv_input_grad(g, w, x.shape, *args))
    assert_same(cuda.conv_weight_grad(x, g, w.shape, *args), reference.conv_weight_grad(x, g, w.shape, *args))


def test_harness_conv_non_contiguous_operands(on_cpu):
    gen = torch.Generator().manual_seed(8)
    x, w, g = conv_case(2, 3, 2, 1, 1, 2, 2, gen)
    xs, ws, gs = (t.transpose(0, 1).contiguous().transpose(0, 1) for t in (x, w, g))
    want = both(2, 3, 2, 1, 1, 2, x, w, g, reference)
    got = both(2, 3, 2, 1, 1, 2, xs, ws, gs, cuda)
    for what, a, b in zip(("forward", "input grad", "weight grad"), got, want, strict=True):
        assert_same(a, b, what)


@pytest.mark.parametrize(
    "m,k,n", [(1, 1, 1), (5, 1, 3), (2, 3, 1), (3, 0, 2), (64, 48, 40), (33, 130, 17), (70, 31, 129)]
)
def test_harness_linear_matches_reference(on_cpu, m, k, n):
    gen = torch.Generator().manual_seed(m * 10_000 + k * 100 + n)
    x, w, g = rand_i8((m, k), gen), rand_i8((n, k), gen), rand_i8((m, n), gen)
    assert_same(cuda.linear_forward(x, w), reference.linear_forward(x, w), "forward")
    assert_same(cuda.linear_input_grad(g, w), reference.linear_input_grad(g, w), "input grad")
    assert_same(cuda.linear_weight_grad(x, g), reference.linear_weight_grad(x, g), "weight grad")


def test_harness_unaligned_operands(on_cpu):
    """Operands at odd byte offsets and with odd row strides take the bytewise loads; same results."""
    gen = torch.Generator().manual_seed(12)
    for m, k, n in [(5, 37, 3), (66, 64, 9), (3, 4, 2)]:
        buf = rand_i8((m * k + n * k + 3,), gen)
        x = buf[1 : 1 + m * k].view(m, k)  # starts at an odd address
        w = buf[2 + m * k : 2 + m * k + n * k].view(n, k)
        assert x.data_ptr() % 4 and w.data_ptr() % 4
        assert_same(own_kernels.gemm(x, w), reference.linear_forward(x, w), f"{m}x{k}x{n}")


def test_harness_extreme_values(on_cpu):
    """All +-127 (the largest products) and -128 bytes, which the GEMMs must treat as signed."""
    x = torch.full((3, 200), 127, dtype=torch.int8)
    x[1] = -127
    x[2, ::3] = -128
    w = torch.full((4, 200), -127, dtype=torch.int8)
    w[1, 1::2] = 127
    assert_same(cuda.linear_forward(x, w), reference.linear_forward(x, w))


@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_harness_every_pass_exact_at_adversarial_operands(on_cpu, name):
    """The CUDA kernels' three passes on +-127 with one sign per output channel: grouped, depthwise and
    dilated, the largest sums each pass forms."""
    cin, cout, groups, k, s, p, d = ADVERSARIAL[name]
    x, w, g = adversarial_case(cin, cout, groups, k, s, p, d)
    assert_passes_exact(cuda, x, w, g, (s, p, d, groups))


def test_harness_linear_backward_passes_at_extreme_values(on_cpu):
    g = torch.full((70, 130), 127, dtype=torch.int8)
    g[:, 1::2] = -127
    w = torch.full((130, 33), -127, dtype=torch.int8)
    w[::3] = 127
    x = torch.full((70, 33), 127, dtype=torch.int8)
    x[1::2] = -127
    assert_same(cuda.linear_input_grad(g, w), reference.linear_input_grad(g, w), "input grad")
    assert_same(cuda.linear_weight_grad(x, g), reference.linear_weight_grad(x, g), "weight grad")


@pytest.mark.parametrize("k,s,p", [(1, 1, 0), (1, 2, 0), (3, 1, 1), (3, 2, 1)])
def test_harness_library_route_splits_long_reductions(on_cpu, monkeypatch, k, s, p):
    """The weight gradient's reduction over N * positions in chunks of SPLIT_K (here 64): int32 partial
    sums added; 1x1 convolutions as plain GEMMs of the channels-last rows, strided ones subsampled."""
    if on_cpu.route != "library":
        pytest.skip("the library route's planning")
    monkeypatch.setattr(blas, "SPLIT_K", 64)
    gen = torch.Generator().manual_seed(k * 10 + s)
    x = rand_i8((3, 16, 9, 10), gen).contiguous(memory_format=torch.channels_last)
    w = rand_i8((24, 16, k, k), gen)
    g = rand_i8(reference.conv_forward(x, w, s, p).shape, gen).contiguous(memory_format=torch.channels_last)
    assert_same(cuda.conv_forward(x, w, s, p), reference.conv_forward(x, w, s, p), "forward")
    assert_same(
        cuda.conv_input_grad(g, w, x.shape, s, p), reference.conv_input_grad(g, w, x.shape, s, p), "dx"
    )
    assert_same(
        cuda.conv_weight_grad(x, g, w.shape, s, p), reference.conv_weight_grad(x, g, w.shape, s, p), "dw"
    )
    xl, gl = rand_i8((200, 24), gen), rand_i8((200, 8), gen)
    assert_same(cuda.linear_weight_grad(xl, gl), reference.linear_weight_grad(xl, gl), "linear dw")


QUANT_CASES = [
    ((37,), None),
    ((3, 5, 7), None),
    ((6, 4, 3, 3), 0),  # weights, per output channel
    ((2, 5, 4, 3), 1),  # activations / gradients, per channel
    ((4, 9), -1),
    ((300, 2), 1),
    ((2, 16, 5, 6), 1),
]
LAYOUTS = ["contiguous", "channels-last"]


def _laid_out(x: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "channels-last" and x.dim() == 4:
        return x.contiguous(memory_format=torch.channels_last)
    return x


def _scaled(x: torch.Tensor, s: torch.Tensor, axis) -> torch.Tensor:
    """The value before rounding, exactly as the reference computes it (torch: 127 / s)."""
    sb = torch.as_tensor(s, dtype=torch.float32)
    if axis is not None:
        sb = sb.reshape([-1 if d == axis % x.dim() else 1 for d in range(x.dim())])
    inv = torch.where(
        sb > 0, quant.QMAX / sb.clamp_min(torch.finfo(torch.float32).tiny), torch.zeros_like(sb)
    )
    return (x.float() * inv).clamp_(-quant.QMAX, quant.QMAX)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape,axis", QUANT_CASES)
def test_harness_quantize_nearest_matches_the_cpu_backend(on_cpu_quant, shape, axis, layout):
    gen = torch.Generator().manual_seed(len(shape) * 10 + (axis or 0))
    x = torch.randn(shape, generator=gen) * 3
    x.view(-1)[0] = 0.5  # ties (half to even) and exact zeros
    x.view(-1)[-1] = 0.0
    if axis is not None:
        x.select(axis, 0).zero_()  # an all-zero channel: scale 0, codes 0
    x = _laid_out(x, layout)
    s_want = kernels.cpu.absmax(x, axis)
    q, s = cuda.absmax_quantize(x, axis)
    assert torch.equal(s, s_want) and s.dtype == torch.float32 and s.shape == s_want.shape
    assert torch.equal(q, kernels.cpu.quantize(x, s_want, axis)) and q.dtype == torch.int8
    assert q.stride() == x.stride()
    assert torch.equal(q, _scaled(x, s_want, axis).round().to(torch.int8))
    s_other = s_want * 0.5  # clipping
    assert torch.equal(cuda.quantize(x, s_other, axis), kernels.cpu.quantize(x, s_other, axis))
    x2 = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 126.5, -126.5, 200.0, -200.0])
    assert torch.equal(cuda.quantize(x2, 127.0), kernels.cpu.quantize(x2, 127.0))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape,axis", QUANT_CASES)
def test_harness_stochastic_codes_equal_the_cpu_backend_and_the_mirror(on_cpu_quant, shape, axis, layout):
    """The CPU and the GPU draw the same noise for the same key and element (issue 16's shared stream)."""
    gen = torch.Generator().manual_seed(99)
    x = _laid_out(torch.randn(shape, generator=gen), layout)
    s = kernels.cpu.absmax(x, axis)
    q = cuda.quantize(x, s, axis, "stochastic", generator=torch.Generator().manual_seed(5))
    q_cpu = kernels.cpu.quantize(x, s, axis, "stochastic", generator=torch.Generator().manual_seed(5))
    assert torch.equal(q, q_cpu)
    k0, k1 = kernels.rng.next_key(torch.Generator().manual_seed(5))
    u = torch.from_numpy(philox_mirror.uniforms(shape, k0, k1))
    assert torch.equal(q, (_scaled(x, s, axis) + u).floor().clamp(-127, 127).to(torch.int8))


def test_harness_statistics_counts_and_epilogue(on_cpu_quant):
    gen = torch.Generator().manual_seed(3)
    for layout in LAYOUTS:
        x = _laid_out(torch.randn((4, 24, 5, 7), generator=gen) * 2 + 0.3, layout)
        for axis in (1, None):
            amax, sigma = cuda.channel_stats(x, axis)
            want_amax, want_sigma = kernels.cpu.channel_stats(x, axis)
            assert torch.equal(amax, want_amax)
            torch.testing.assert_close(sigma, want_sigma, rtol=1e-5, atol=0)
            q, counts = cuda.quantize(x, amax.max(), None, "stochastic", above=(axis, want_sigma))
            _, want = kernels.cpu.quantize(x, amax.max(), None, "stochastic", above=(axis, want_sigma))
            assert torch.equal(counts, want)
    acc = torch.randint(-(2**24), 2**24, (3, 16, 4, 5), generator=gen, dtype=torch.int32)
    acc = acc.contiguous(memory_format=torch.channels_last)
    scale = torch.rand(16, generator=gen) + 0.01
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for axis, s in ((None, scale[0]), (1, scale)):
            want = (acc.float() * (s if axis is None else s.reshape(1, -1, 1, 1))).to(dtype)
            got = cuda.dequantize(acc.clone(), s, axis, dtype)
            assert got.dtype == dtype and torch.equal(got, want), (dtype, axis)
    tiny = torch.tensor([1, 3, 7, 2**20, -5], dtype=torch.int32)  # float16 subnormals and overflow
    for s in (2.0**-26, 2.0**-20, 1.0e-3, 1.0):
        assert torch.equal(cuda.dequantize(tiny, s, dtype=torch.float16), (tiny.float() * s).half())


def test_harness_stochastic_rounding_unbiased(on_cpu_quant):
    """E[q] = v: the mean code of many copies of each value is within 5 standard errors of v."""
    values = torch.tensor([0.1, 0.25, 0.5, 0.9, -0.3, -0.77, 3.5, 126.6, 0.0])
    copies = 2000
    x = values.repeat(copies, 1)  # (copies, 9)
    q = cuda.quantize(x, 127.0, None, "stochastic", generator=torch.Generator().manual_seed(1)).double()
    mean = q.mean(0)
    frac = values.double() - values.double().floor()
    stderr = (frac * (1 - frac) / copies).sqrt().clamp_min(1e-3)
    assert bool(((mean - values.double()).abs() < 5 * stderr).all()), (mean, values)


def test_harness_nonfinite_sets_the_device_flag(on_cpu_quant):
    """No host synchronisation: a NaN or Inf sets the flag, read once by raise_if_nonfinite."""
    errors.clear_nonfinite()
    for bad in (float("nan"), float("inf")):
        x = torch.ones(50)
        x[17] = bad
        for call in (
            lambda x=x: cuda.absmax_quantize(x),
            lambda x=x: cuda.absmax(x.reshape(5, 10), axis=1),
            lambda x=x: cuda.quantize(x, 1.0),
            lambda x=x: cuda.channel_stats(x.reshape(5, 10), 1),
        ):
            call()  # no exception here
            with pytest.raises(quant.NonFiniteError):
                errors.raise_if_nonfinite()
            errors.raise_if_nonfinite()  # read and cleared
    # a non-finite scale, per tensor or in one channel, and on an empty tensor (no kernel runs)
    for x, s, axis in (
        (torch.ones(3), float("nan"), None),
        (torch.ones(4, 3), torch.tensor([1.0, float("inf"), 2.0]), 1),
        (torch.ones(0, 3), torch.tensor([1.0, 1.0, float("nan")]), 1),
    ):
        cuda.quantize(x, s, axis)
        with pytest.raises(quant.NonFiniteError):
            errors.raise_if_nonfinite()
    cuda.quantize(torch.ones(4, 3), torch.tensor([1.0, 0.0, 2.0]), 1)
    errors.raise_if_nonfinite()  # a zero scale is finite


def test_group_plan_walks_memory_order():
    """The quantize kernel's walk: innermost dimension first, the last one in groups of 4."""
    cl = torch.empty((2, 16, 5, 6)).contiguous(memory_format=torch.channels_last)
    dims, last_pos, axis_pos, groups = cuda_quantize.group_plan(cl.shape, cl.stride(), 1)
    assert dims == [(16, 1, 5), (2, 16, 1), (5, 96, 1), (2, 480, 80)]  # C, W/4, H, N
    assert (last_pos, axis_pos, groups) == (1, 0, 16 * 2 * 5 * 2)
    dims, last_pos, axis_pos, groups = cuda_quantize.group_plan((7, 9), (9, 1), None)
    assert dims == [(3, 1, 1), (7, 9, 1)] and (last_pos, axis_pos, groups) == (0, -1, 21)


# ------------------------------------------------------------------------------------------------
# GPU: bit-exact to the reference over the CPU tests' grid, both GEMM kernels where the device has both


def _gpu_gemms():
    if not torch.cuda.is_available():
        return ["library", "gemm_imma", "gemm_dp4a"]
    cc = runtime.GpuLauncher().compute_capability(0)
    return ["library"] + [m for m in ("gemm_imma", "gemm_dp4a") if cc >= runtime.MODULES[m].min_arch]


@pytest.fixture(params=_gpu_gemms())
def gpu_gemm(request, monkeypatch):
    """The library route (cuBLASLt's torch._int_mm; grouped convolutions on our kernels), or every
    product on one of our GEMM kernels."""
    if request.param == "library":
        monkeypatch.delenv("REPRO_CUDA_GEMM", raising=False)
        yield request.param
        return
    monkeypatch.setenv("REPRO_CUDA_GEMM", "kernels")
    with runtime.launching_with(GemmOf(request.param)):
        yield request.param


class GemmOf(runtime.GpuLauncher):
    """The GPU, every product on the GEMM kernel named (dp4a runs on an sm_80+ GPU too)."""

    def __init__(self, gemm: str) -> None:
        super().__init__()
        self.gemm = gemm

    def gemm_module(self, device_index) -> str:
        return self.gemm


def _cuda(*ts):
    return tuple(t.cuda() for t in ts)


@gpu
@pytest.mark.parametrize("nd,k,s,p,d,groups,n", CPU_GRID)
def test_gpu_conv_matches_reference(gpu_gemm, nd, k, s, p, d, groups, n):
    gen = torch.Generator().manual_seed(CPU_GRID.index((nd, k, s, p, d, groups, n)))
    case = conv_case(nd, k, s, p, d, groups, n, gen)
    if case is None:
        pytest.skip("empty output")
    x, w, g = case
    want = both(nd, k, s, p, d, groups, x, w, g, reference)
    got = both(nd, k, s, p, d, groups, *_cuda(x, w, g), cuda)
    for what, a, b in zip(("forward", "input grad", "weight grad"), got, want, strict=True):
        assert a.device.type == "cuda"
        assert_same(a.cpu(), b, what)


@gpu
def test_gpu_conv_large_and_chunked(gpu_gemm, monkeypatch):
    gen = torch.Generator().manual_seed(4)
    x, w = rand_i8((3, 64, 9, 10), gen), rand_i8((96, 32, 3, 3), gen)
    args = (2, 1, 1, 2)
    g = rand_i8(reference.conv_forward(x, w, *args).shape, gen)
    for budget in (1, 1 << 28):
        monkeypatch.setattr(columns, "CHUNK_BYTES", budget)
        got = (
            cuda.conv_forward(*_cuda(x, w), *args),
            cuda.conv_input_grad(*_cuda(g, w), x.shape, *args),
            cuda.conv_weight_grad(*_cuda(x, g), w.shape, *args),
        )
        want = (
            reference.conv_forward(x, w, *args),
            reference.conv_input_grad(g, w, x.shape, *args),
            reference.conv_weight_grad(x, g, w.shape, *args),
        )
        for a, b in zip(got, want, strict=True):
            assert_same(a.cpu(), b)


@gpu
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 7, 1), (5, 1, 3), (2, 3, 1), (64, 48, 40), (33, 130, 17)])
def test_gpu_linear_matches_reference(gpu_gemm, m, k, n):
    gen = torch.Generator().manual_seed(m * 10_000 + k * 100 + n)
    x, w, g = rand_i8((m, k), gen), rand_i8((n, k), gen), rand_i8((m, n), gen)
    xc, wc, gc = _cuda(x, w, g)
    assert_same(cuda.linear_forward(xc, wc).cpu(), reference.linear_forward(x, w))
    assert_same(cuda.linear_input_grad(gc, wc).cpu(), reference.linear_input_grad(g, w))
    assert_same(cuda.linear_weight_grad(xc, gc).cpu(), reference.linear_weight_grad(x, g))


@gpu
def test_gpu_linear_at_the_int32_limit(gpu_gemm):
    k = 133_143
    x = torch.full((3, k), 127, dtype=torch.int8)
    x[1] = -127
    w = torch.full((2, k), 127, dtype=torch.int8)
    y = cuda.linear_forward(*_cuda(x, w)).cpu()
    assert_same(y, reference.linear_forward(x, w))
    assert int(y[0, 0]) == k * 127**2


@gpu
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape,axis", QUANT_CASES)
def test_gpu_quantize_equals_the_cpu_backend(shape, axis, layout):
    gen = torch.Generator().manual_seed(7)
    x = _laid_out(torch.randn(shape, generator=gen) * 3, layout)
    q, s = cuda.absmax_quantize(x.cuda(), axis)
    assert torch.equal(s.cpu(), kernels.cpu.absmax(x, axis))
    assert torch.equal(q.cpu(), kernels.cpu.quantize(x, s.cpu(), axis))
    qs = cuda.quantize(x.cuda(), s, axis, "stochastic", generator=torch.Generator().manual_seed(5))
    want = kernels.cpu.quantize(x, s.cpu(), axis, "stochastic", generator=torch.Generator().manual_seed(5))
    assert torch.equal(qs.cpu(), want)


@gpu
def test_gpu_stochastic_rounding_unbiased():
    values = torch.tensor([0.1, 0.25, 0.5, 0.9, -0.3, -0.77, 3.5, 126.6, 0.0])
    copies = 200_000
    x = values.repeat(copies, 1).cuda()
    torch.manual_seed(0)
    q = cuda.quantize(x, 127.0, None, "stochastic").double()
    torch.manual_seed(0)
    assert torch.equal(cuda.quantize(x, 127.0, None, "stochastic").double(), q)  # runs repeat
    mean = q.mean(0).cpu()
    frac = values.double() - values.double().floor()
    stderr = (frac * (1 - frac) / copies).sqrt().clamp_min(1e-4)
    assert bool(((mean - values.double()).abs() < 5 * stderr).all()), (mean, values)


@gpu
def test_gpu_quantize_nonfinite_sets_the_flag():
    errors.clear_nonfinite()
    x = torch.ones(1000, device="cuda")
    x[500] = float("nan")
    cuda.absmax_quantize(x)
    with pytest.raises(quant.NonFiniteError):
        errors.raise_if_nonfinite()
    cuda.quantize(x, 1.0)
    with pytest.raises(quant.NonFiniteError):
        errors.raise_if_nonfinite()


@gpu
def test_gpu_rejects_cpu_tensors():
    w = torch.zeros((8, 4, 3, 3), dtype=torch.int8, device="cuda")
    with pytest.raises(ValueError, match="CUDA device"):
        cuda.conv_forward(torch.zeros((1, 4, 5, 5), dtype=torch.int8), w)
    assert CIN == 4


def test_harness_drives_repro_layers(on_cpu, monkeypatch):
    """repro.layers through kernels.cuda (on the CPU harness) gives the same outputs and gradients as
    through kernels.cpu: the interface is mirrored, conv (grouped, strided) and linear, fwd and bwd."""
    import copy

    from repro import quantize_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 3 * 3, 5),
    )
    quantize_model(model, "daiq", skip=())  # per-channel weight-gradient scales
    x = torch.randn(2, 3, 6, 6)
    results = []
    for backend in (kernels.cpu, cuda):
        monkeypatch.setattr(kernels, "get_backend", lambda device, b=backend: b)
        m = copy.deepcopy(model)
        torch.manual_seed(1)
        xi = x.clone().requires_grad_()
        y = m(xi)
        y.square().sum().backward()
        results.append((y.detach(), xi.grad, *(p.grad for p in m.parameters())))
    launched = {launch[1] for launch in on_cpu.launches}
    assert {"im2col", "col2im", runtime.gemm_module(torch.device("cpu"))} <= launched
    names = ["output", "input grad", *(n for n, _ in model.named_parameters())]
    for name, a, b in zip(names, *results, strict=True):
        if name.endswith("bias"):
            # float sums of gy, whose memory layout differs (kernels.cpu returns channels-last int32,
            # kernels.cuda contiguous): the same values summed in another order
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        else:
            assert torch.equal(a, b), name
