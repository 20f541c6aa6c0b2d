"""The INT8 CPU backend (the interface of kernels.backend), bit-exact to ``kernels.reference``.

From the ground up: ``runtime`` builds and loads the C++ of ``csrc/``; ``native`` (its GEMM and
depthwise products) and ``quantizer`` (the fused quantizer) call it; ``memory`` lays out outputs,
``onednn`` calls oneDNN's int8 convolution, ``routes`` probes which exact route this CPU takes,
``im2col`` is the exact im2col + ``torch._int_mm`` route, and ``products`` the convolutions and linear
products that choose among them. ``norm`` is BatchNorm with its activation fused with the int8 codes
around it, and ``known`` keeps what such a kernel found of a tensor for the quantizer that reads it.
"""

from __future__ import annotations

from . import native, routes
from .norm import backward as norm_act_backward
from .norm import forward as norm_act_forward
from .norm import residual_backward as norm_act_residual_backward
from .norm import residual_supported as norm_act_residual_supported
from .norm import supported as norm_act_supported
from .products import (
    accumulating_input_grad,
    conv_forward,
    conv_input_grad,
    conv_weight_grad,
    epilogue_dtypes,
    epilogue_in_products,
    linear_forward,
    linear_input_grad,
    linear_weight_grad,
)
from .quantizer import absmax, absmax_quantize, channel_stats, daiq_grad_codes, dequantize, quantize
from .routes import clear_route_caches, conv_route, torch_int8_fast

__all__ = [
    "absmax",
    "absmax_quantize",
    "accumulating_input_grad",
    "channel_stats",
    "clear_route_caches",
    "conv_forward",
    "conv_input_grad",
    "conv_route",
    "conv_weight_grad",
    "daiq_grad_codes",
    "dequantize",
    "epilogue_dtypes",
    "epilogue_in_products",
    "linear_forward",
    "linear_input_grad",
    "linear_weight_grad",
    "native",
    "norm_act_backward",
    "norm_act_forward",
    "norm_act_residual_backward",
    "norm_act_residual_supported",
    "norm_act_supported",
    "quantize",
    "routes",
    "torch_int8_fast",
]
