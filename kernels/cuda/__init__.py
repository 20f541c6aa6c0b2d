"""The INT8 CUDA backend (the interface of kernels.backend): CUDA C++ kernels (csrc/) compiled with NVRTC
and loaded with CuPy, and cuBLASLt through ``torch._int_mm``.

From the ground up: ``runtime`` compiles, caches, loads and launches (through the current launcher, the
one seam the CPU harness and the dry run swap); ``columns`` holds a convolution's geometry and the
im2col / col2im kernels; ``own_kernels`` the products on this project's GEMM kernels, ``blas`` those on
cuBLASLt, ``products`` the choice between them; ``quantizer`` the fused quantizer; ``dry_run`` the host
side of a step on meta tensors. Imported on demand (kernels.get_backend): CuPy loads only when a CUDA
tensor shows up.
"""

from __future__ import annotations

from .products import (
    conv_forward,
    conv_input_grad,
    conv_weight_grad,
    library_gemm,
    linear_forward,
    linear_input_grad,
    linear_weight_grad,
)
from .quantizer import absmax, absmax_quantize, channel_stats, dequantize, quantize

__all__ = [
    "absmax",
    "absmax_quantize",
    "channel_stats",
    "conv_forward",
    "conv_input_grad",
    "conv_weight_grad",
    "dequantize",
    "library_gemm",
    "linear_forward",
    "linear_input_grad",
    "linear_weight_grad",
    "quantize",
]
