"""Every CUDA kernel compiles with NVRTC (the nvidia-cuda-nvrtc wheel) for every architecture CI
targets, without a GPU. Cubins are built, so ptxas runs inside NVRTC and the inline PTX (mma.sync) is
assembled and checked for the target too; a compile error fails the test.

Measured with NVRTC 13.0: its targets are sm_75 ... sm_121 (sm_61 and sm_70 were dropped), so the
dp4a GEMM (which needs sm_61) is built for sm_75, sm_80 and sm_90, and the IMMA GEMM for sm_80 and sm_90.
"""

from __future__ import annotations

import pytest

from kernels.cuda import runtime as cuda

CASES = [(module, arch) for module in cuda.MODULES for arch in cuda.ci_archs(module)]


def test_nvrtc_targets_what_ci_needs():
    archs = cuda.nvrtc_archs()
    assert {80, 90} <= set(archs), f"NVRTC {cuda.nvrtc_version()} lacks sm_80/sm_90: {archs}"
    assert min(archs) <= 75, f"NVRTC {cuda.nvrtc_version()} no longer targets Turing (sm_75): {archs}"
    assert cuda.ci_archs("gemm_imma") == (80, 90)
    assert cuda.ci_archs("gemm_dp4a")[0] == 75


@pytest.mark.parametrize("module,arch", CASES)
def test_kernel_compiles(module, arch):
    cubin = cuda.compile_module(module, arch)
    assert cubin[:4] == b"\x7fELF" and len(cubin) > 1000
    ptx = cuda.compile_module(module, arch, ptx=True).decode()
    assert f".target sm_{arch}" in ptx
    for kernel in cuda.MODULES[module].kernels:
        assert f".entry {kernel}(" in ptx, f"{kernel} missing from {module}"


def test_gemms_use_the_integer_instructions():
    imma = cuda.compile_module("gemm_imma", 80, ptx=True).decode()
    assert imma.count("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32") == 8  # 2 x 4 per K tile
    assert "satfinite" not in imma  # wrapping int32 accumulation, exact within the contract
    dp4a = cuda.compile_module("gemm_dp4a", 75, ptx=True).decode()
    assert dp4a.count("dp4a.s32.s32") >= 16


def test_imma_needs_sm80():
    """ptxas really checks the inline mma: the same source is refused for Turing."""
    with pytest.raises(cuda.CudaCompileError, match="m16n8k32"):
        cuda.compile_module("gemm_imma", 75)


def test_broken_source_raises_with_the_log():
    broken = 'extern "C" __global__ void k(int* p) { p[0] = undeclared_name; }'
    with pytest.raises(cuda.CudaCompileError, match="undeclared_name"):
        cuda.compile_source(broken, "broken.cu", 80)
    bad_asm = 'extern "C" __global__ void k(int* p) { asm volatile("not.an.instruction;"); }'
    with pytest.raises(cuda.CudaCompileError):
        cuda.compile_source(bad_asm, "bad_asm.cu", 80)


def test_sources_are_package_data():
    """The .cu/.cuh files sit in kernels/cuda/csrc/, as pyproject's package-data ships them."""
    for module in cuda.MODULES.values():
        for name in module.files:
            assert (cuda.SOURCE_DIR / name).is_file()
            assert name.endswith((".cu", ".cuh"))
