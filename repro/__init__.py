"""INT8 training of CNNs: quantizers, one quantized-layer registry, and the methods of UI8, DAIQ, WAGEUBN."""

from repro.compat import register_mmengine_safe_globals
from repro.layers import (
    load_method_state_dict,
    method_state_dict,
    quantize_model,
    quantized_layers,
)
from repro.lr_scaling import LayerLrScaling, layer_lr_factors
from repro.methods import build_method, list_methods
from repro.quant import NonFiniteError, dequantize, quantize

# mmengine checkpoints must load under torch's weights_only default (resume, load_from).
register_mmengine_safe_globals()

__all__ = [
    "LayerLrScaling",
    "NonFiniteError",
    "build_method",
    "dequantize",
    "layer_lr_factors",
    "list_methods",
    "load_method_state_dict",
    "method_state_dict",
    "quantize",
    "quantize_model",
    "quantized_layers",
]
