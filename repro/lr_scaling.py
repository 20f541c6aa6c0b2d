"""UI8's Deviation Counteractive Learning Rate Scaling applied per quantized layer (UI8 eq. 8).

Each quantized layer's parameters step with lr(t) * phi(d_c), where lr(t) is the rate the scheduler
put in the parameter's optimizer group and phi comes from the layer's quantizer (`lr_scale()`).
Param groups usually hold many layers, and splitting them would break the schedulers' per-group
state and the optimizer's checkpoint layout; so the factor is applied to the step itself: the update
the optimizer makes to a layer's parameters is scaled by phi. For every optimizer whose update is
proportional to its learning rate (SGD with momentum, Nesterov and weight decay; Adam; AdamW, whose
decoupled decay is lr-proportional too) this equals giving that layer the learning rate lr(t) * phi.
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.errors import raise_if_nonfinite
from repro.layers import layer_quantizers, quantized_layers


def layer_lr_factors(model: nn.Module) -> dict[str, float]:
    """phi for every quantized layer, by name (1.0 for methods without scaling)."""
    return {
        name: sum(q.lr_scale() for q in layer_quantizers(m)) / len(layer_quantizers(m))
        for name, m in quantized_layers(model).items()
    }


class LayerLrScaling:
    """Scales each quantized layer's optimizer step by its phi; attach once, works every step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model = model
        self._saved: list[tuple[torch.Tensor, torch.Tensor, float]] = []
        self._handles = [
            optimizer.register_step_pre_hook(lambda *_: self.before_step()),
            optimizer.register_step_post_hook(lambda *_: self.after_step()),
        ]

    def before_step(self) -> None:
        # once per iteration, before the weights change: a NaN or Inf a GPU quantizer met in this
        # iteration's backward pass ends the run as diverged (kernels.errors)
        raise_if_nonfinite()
        self._saved = []
        for layer in quantized_layers(self.model).values():
            # one learning rate per parameter: a layer with one state per call takes its calls' mean phi
            phis = [p for p in (q.lr_scale_tensor() for q in layer_quantizers(layer)) if p is not None]
            phi = None if not phis else phis[0] if len(phis) == 1 else torch.stack(phis).mean()
            if phi is not None:
                for p in layer.parameters(recurse=False):
                    if p.requires_grad:
                        self._saved.append((p, p.detach().clone(), phi))

    @torch.no_grad()
    def after_step(self) -> None:
        for p, before, phi in self._saved:  # p <- before + phi * (p - before)
            # written into p by the op itself (values bit for bit before.lerp_(p, phi)): a lerp into `before`
            # and a copy back took one pass more over every weight (the copy: 4.7 ms of a ResNet-18 b32 ui8
            # step in cProfile, Intel AMX, 2 threads)
            torch.lerp(before, p, phi.to(device=p.device, dtype=p.dtype), out=p)
        self._saved = []

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
