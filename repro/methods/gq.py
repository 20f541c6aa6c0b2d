"""gq: global gradient quantization, DAIQ's ablation baseline (DAIQ Table 2, 'GQ').

G is quantized once per tensor with s = max|G| and stochastic rounding; the same q(G) feeds GX and GW.
"""

from __future__ import annotations

import torch

import kernels
from repro.methods import register
from repro.methods.base import GradCodes, LayerQuantizer, Method


class GlobalQuantizer(LayerQuantizer):
    def grad(self, g: torch.Tensor, channel_axis: int) -> GradCodes:
        self.count_step()
        q, s = kernels.get_backend(g.device).absmax_quantize(g, rounding="stochastic")
        return GradCodes(q, s, q, s)


@register
class GlobalQuantization(Method):
    name = "gq"
    description = "per-tensor max|G| gradient quantization, stochastic rounding (DAIQ Table 2 baseline)"
    layer_quantizer = GlobalQuantizer
