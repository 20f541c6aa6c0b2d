"""fp8: FP8 training (Wang et al., NeurIPS 2018, "Training Deep Neural Networks with 8-bit Floating Point
Numbers"). Simulated: float32 tensors holding FP8 / FP16 values (formats.py).

What is simulated, at the points the paper puts it (its Fig. 2 data flow):
- W, A (the operands of the forward product) rounded to FP8 (1-5-2), round to nearest.
- E, the error at the layer's output, rounded to FP8 after loss scaling; one E feeds GX and GW.
- The three products (Y, GX, GW) have FP16 (1-6-9) results: each is rounded to FP16, and GW, the
  weight gradient G, is then stored in FP8.
- Weight update in FP16 with stochastic rounding (sec. 4): after every optimizer step the quantized
  layers' parameters are stochastically rounded to FP16 (make_optimizer attaches this to the run's own
  optimizer, which computes the update; the paper's AXPY rounds its result once, as here).
Gaps, stated: the products accumulate in float32 and are rounded once to FP16, so the chunk-based
accumulation (chunk 64, sec. 3) is represented by its limit, not simulated add by add (the paper shows it
brings FP16 accumulation to float32 accuracy); the momentum buffer stays float32; first and last layers
stay float32 (the paper keeps them in FP16); BN, ReLU and pooling run in float32.
Loss scaling: errors below FP8's smallest subnormal (2^-16) vanish, so E and G are scaled by `loss_scale`
(a power of two, so the scaling itself is exact) before rounding, as in mixed-precision training
(Micikevicius et al. 2018); the value 2^10 is our choice.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from repro.methods import register
from repro.methods.base import LayerQuantizer, Method
from repro.methods.fp8.formats import FP8, FP16, round_to
from repro.ste import grad_quant, ste


class Fp8Quantizer(LayerQuantizer):
    simulated = True

    def _scaled(self, t: torch.Tensor, *formats) -> torch.Tensor:
        s = self.opts["loss_scale"]
        out = t * s
        for fmt in formats:
            out = round_to(out, fmt)
        return out.div_(s).to(t.dtype)  # out is round_to's own tensor

    def simulate(self, x: torch.Tensor, weight: torch.Tensor, op) -> torch.Tensor:
        # GX is an FP16 accumulator result; GW too, then stored as FP8 (the "G" of W/A/E/G).
        x = grad_quant(x, lambda g: self._scaled(g, FP16))
        w = grad_quant(weight, lambda g: self._scaled(g, FP16, FP8))
        a = ste(x, lambda t: round_to(t, FP8).to(t.dtype))
        w = ste(w, lambda t: round_to(t, FP8).to(t.dtype))
        y = ste(op(a, w), lambda t: round_to(t, FP16).to(t.dtype))  # the forward accumulator, FP16
        self.count_step()
        # E in FP8 (loss-scaled); clone: grad_quant returns a view, and ReLU(inplace=True) modifies it
        return grad_quant(y, lambda g: self._scaled(g, FP8)).clone()


class Fp16StochasticUpdate:
    """After each optimizer step, the given parameters are stochastically rounded to FP16 (1-6-9)."""

    def __init__(self, optimizer: torch.optim.Optimizer, params: list[torch.Tensor]):
        self.params = params
        with torch.no_grad():  # the master weights live on the FP16 grid from the start
            for p in params:
                p.copy_(round_to(p, FP16))
        self.handle = optimizer.register_step_post_hook(lambda *_: self.after_step())

    @torch.no_grad()
    def after_step(self) -> None:
        for p in self.params:
            p.copy_(round_to(p, FP16, rounding="stochastic"))


@register
class Fp8Training(Method):
    name = "fp8"
    description = "FP8 training (Wang et al. 2018): 1-5-2 W/A/E/G, FP16 products and SR updates; simulated"
    layer_quantizer = Fp8Quantizer
    simulated = True
    defaults = {"loss_scale": 1024.0}

    def validate(self) -> None:
        s = self.opts["loss_scale"]
        if not (isinstance(s, (int, float)) and s > 0 and math.log2(s).is_integer()):
            raise ValueError(f"loss_scale must be a positive power of two, got {s!r}")

    def make_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Keeps `optimizer` and attaches the FP16 stochastic-rounding update of the FP8 layers to it."""
        params = [
            p
            for m in model.modules()
            if isinstance(getattr(m, "int8", None), Fp8Quantizer)
            for p in m.parameters(recurse=False)
        ]
        Fp16StochasticUpdate(optimizer, params)
        return None
