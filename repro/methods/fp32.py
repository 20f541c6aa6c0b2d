"""fp32: the baseline. Layers are swapped like every other method and run their float op."""

from __future__ import annotations

from repro.methods import register
from repro.methods.base import LayerQuantizer, Method


class Float32Quantizer(LayerQuantizer):
    quantizes = False


@register
class Float32(Method):
    name = "fp32"
    description = "no quantization (the FP32 baseline), through the same layers and hooks"
    layer_quantizer = Float32Quantizer
