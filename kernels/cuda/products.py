"""The CUDA backend's exact int8 products (int8 operands on a CUDA device in, int32 out): ungrouped ones
on cuBLASLt (kernels.cuda.blas), grouped ones, and all of them under REPRO_CUDA_GEMM=kernels, on this
project's kernels (kernels.cuda.own_kernels).

Every kernel is compiled in CI for sm_75/sm_80/sm_90 (``tests/test_cuda_compile.py``, no GPU needed), and
the kernel sources are executed on the CPU by a small C++ harness that stands in for the CUDA runtime
(``tests/test_cuda_backend.py``): bit-exact against ``kernels.reference`` and, for the quantizer, against
the CPU backend (the same codes, stochastic ones included). The GPU tests in the same file run unchanged
where a GPU exists.

The kernels (one idea per file in kernels/cuda/csrc/):

* ``quantize.cu``: per-tensor absmax (block max + atomicMax), per-channel max and moments, the codes of
  any dense layout (one thread per group of 4 elements of a row, one Philox call each, threads in memory
  order), the above-sigma counts of DAIQ in the same pass, the dequantizing epilogue (float32 / bfloat16
  / float16).
* ``gemm_imma.cu``: mma.sync m16n8k32 s8 x s8 -> s32 on tensor cores (sm_80+).
* ``gemm_dp4a.cu``: __dp4a (sm_61+; NVRTC 13 targets sm_75 and newer, so Turing), used below sm_80.
* ``im2col.cu``, ``col2im.cu``: 1/2/3-D convolutions as im2col + GEMM (forward, weight gradient) and
  GEMM + col2im gather (input gradient), groups as a GEMM batch dimension.

int32 contract: as ``kernels.reference`` (exact while the reduction length K < 133,144).
"""

from __future__ import annotations

import math
import os

import torch

from ..geometry import check_grad_output
from . import blas, own_kernels
from .columns import ConvGeometry, check_int32_size, check_linear, check_operands


def library_gemm() -> bool:
    """Ungrouped products on cuBLASLt (kernels.cuda.blas), the fastest measured; REPRO_CUDA_GEMM=kernels
    keeps them on this project's own GEMM kernels (tests, comparisons)."""
    return os.environ.get("REPRO_CUDA_GEMM", "library") != "kernels"


def linear_forward(xq, wq) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T -> (M, N) int32."""
    check_linear(xq, wq, "linear_forward")
    if xq.shape[1] != wq.shape[1]:
        raise ValueError(f"linear_forward: K differs, {tuple(xq.shape)} and {tuple(wq.shape)}")
    return blas.linear_forward(xq, wq) if library_gemm() else own_kernels.gemm(xq, wq)


def linear_input_grad(gq, wq) -> torch.Tensor:
    """g (M, N) @ w (N, K) -> (M, K) int32."""
    check_linear(gq, wq, "linear_input_grad")
    if gq.shape[1] != wq.shape[0]:
        raise ValueError(f"linear_input_grad: N differs, {tuple(gq.shape)} and {tuple(wq.shape)}")
    return blas.linear_input_grad(gq, wq) if library_gemm() else own_kernels.gemm(gq, wq.t())


def linear_weight_grad(xq, gq) -> torch.Tensor:
    """g^T (N, M) @ x (M, K) -> (N, K) int32."""
    check_linear(xq, gq, "linear_weight_grad")
    if gq.shape[0] != xq.shape[0]:
        raise ValueError(f"linear_weight_grad: M differs, {tuple(xq.shape)} and {tuple(gq.shape)}")
    return blas.linear_weight_grad(xq, gq) if library_gemm() else own_kernels.gemm(gq.t(), xq.t())


def conv_forward(xq, wq, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """y = conv(x, w) exactly (torch.nn.functional.conv{1,2,3}d semantics), int32 (N, Cout, *out)."""
    check_operands(xq, wq)
    geo = ConvGeometry.of(xq.shape, wq.shape, stride, padding, dilation, groups)
    check_int32_size(geo.kg, geo.positions, geo.cin * math.prod(geo.spatial))
    if groups == 1 and library_gemm():
        return blas.conv_forward(xq, wq, geo)
    return own_kernels.conv_forward(xq, wq, geo)


def conv_input_grad(gq, wq, input_shape, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """dL/dx for dL/dy = g (torch.nn.grad.conv{N}d_input), int32 of shape input_shape."""
    check_operands(gq, wq)
    input_shape = tuple(int(a) for a in input_shape)
    geo = ConvGeometry.of(input_shape, wq.shape, stride, padding, dilation, groups)
    nd = len(input_shape) - 2
    check_grad_output(gq.shape, (geo.n, geo.cout, *geo.out[3 - nd :]))
    check_int32_size(geo.kg, geo.positions, geo.cin * math.prod(geo.spatial))
    if groups == 1 and library_gemm():
        return blas.conv_input_grad(gq, wq, input_shape, geo)
    return own_kernels.conv_input_grad(gq, wq, input_shape, geo)


def conv_weight_grad(xq, gq, weight_shape, stride=1, padding=0, dilation=1, groups=1) -> torch.Tensor:
    """dL/dw for dL/dy = g (torch.nn.grad.conv{N}d_weight), int32 of shape weight_shape."""
    check_operands(xq, gq)
    weight_shape = tuple(int(a) for a in weight_shape)
    geo = ConvGeometry.of(xq.shape, weight_shape, stride, padding, dilation, groups)
    nd = xq.dim() - 2
    check_grad_output(gq.shape, (geo.n, geo.cout, *geo.out[3 - nd :]))
    check_int32_size(geo.kg, geo.positions, geo.cin * math.prod(geo.spatial))
    if groups == 1 and library_gemm():
        return blas.conv_weight_grad(xq, gq, weight_shape, geo)
    return own_kernels.conv_weight_grad(xq, gq, weight_shape, geo)
