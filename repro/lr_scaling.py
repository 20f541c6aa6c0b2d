"""UI8's Deviation Counteractive Learning Rate Scaling applied per quantized layer (UI8 eq. 8).

Each quantized layer's parameters step with lr(t) * phi(d_c), where lr(t) is the rate the scheduler
put in the parameter's optimizer group and phi comes from the layer's quantizer (`lr_scale()`).
Param groups usually hold many layers, and splitting them for good would break the schedulers'
per-group state and the optimizer's checkpoint layout; so only the step sees them split: before it,
the optimizer's groups are replaced by copies holding the layers of one phi each, with lr * phi (every
other hyperparameter as the group has it); after it, the optimizer's own groups are back. Optimizer
state is kept per parameter, so momentum and Adam's moments carry on unchanged. The weights move by
lr(t) * phi * update in one rounding, as eq. 8 writes it. (Until NUMERICS 3 the step was made at lr(t)
and then scaled by a lerp from a copy of every weight: two more passes over the weights, 17 ms of a
ResNet-50 b16 step on an Intel AMX CPU, and two more roundings; docs/measurements.md.)

On an accelerator phi stays on the device, where reading it would make the step wait for the device
(repro.step_audit): there the step is made at lr(t) and each weight set to its copy from before the step
plus phi times the step's change (a lerp: the same rate up to rounding, no host read).
"""

from __future__ import annotations

import torch
from torch import nn

from kernels.errors import raise_if_nonfinite
from repro.layers import layer_quantizers, quantized_layers

_STEP_ONLY = ("params", "lr")  # what a step's copy of a group holds of its own


def layer_lr_factors(model: nn.Module) -> dict[str, float]:
    """phi for every quantized layer, by name (1.0 for methods without scaling)."""
    return {
        name: sum(q.lr_scale() for q in layer_quantizers(m)) / len(layer_quantizers(m))
        for name, m in quantized_layers(model).items()
    }


def layer_lr_scales(model: nn.Module) -> list[tuple[list[torch.Tensor], torch.Tensor]]:
    """(trainable parameters, phi as a 0-d tensor on its device) of each scaling quantized layer."""
    scales = []
    for layer in quantized_layers(model).values():
        # one learning rate per parameter: a layer with one state per call takes its calls' mean phi
        phis = [p for p in (q.lr_scale_tensor() for q in layer_quantizers(layer)) if p is not None]
        if phis:
            params = [p for p in layer.parameters(recurse=False) if p.requires_grad]
            # (a layer's own tensor where it has one: no stack and mean for each layer every step)
            scales.append((params, phis[0] if len(phis) == 1 else torch.stack(phis).mean()))
    return scales


class LayerLrScaling:
    """Gives each quantized layer lr * phi for the optimizer's step; attach once, works every step."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer
        # while a step runs: the optimizer's own groups, and each step group with the group it copies
        self._own: list[dict] | None = None
        self._copies: list[tuple[dict, dict]] = []
        self._saved: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []  # the lerp's (accelerators)
        self._handles = [
            optimizer.register_step_pre_hook(lambda *_: self.before_step()),
            optimizer.register_step_post_hook(lambda *_: self.after_step()),
            # a checkpoint taken inside a step (a signal's handler) saves the optimizer's own layout
            optimizer.register_state_dict_pre_hook(lambda *_: self._restore_groups()),
        ]

    def before_step(self) -> None:
        # once per iteration, before the weights change: a NaN or Inf a GPU quantizer met in this
        # iteration's backward pass ends the run as diverged (kernels.errors)
        raise_if_nonfinite()
        self._restore_groups()  # those of a step that raised
        scales = layer_lr_scales(self.model)
        if all(phi.device.type == "cpu" for _, phi in scales):
            self._saved = []
            self._split_groups({id(p): float(phi) for params, phi in scales for p in params})
        else:
            self._saved = [(p, p.detach().clone(), phi) for params, phi in scales for p in params]

    def _split_groups(self, factors: dict[int, float]) -> None:
        if not factors:
            return
        own, step_groups, copies = self.optimizer.param_groups, [], []
        for group in own:
            by_factor: dict[float | None, list[torch.Tensor]] = {}
            for p in group["params"]:
                by_factor.setdefault(factors.get(id(p)), []).append(p)
            if list(by_factor) == [None]:
                step_groups.append(group)
                continue
            for phi, params in by_factor.items():
                lr = group["lr"] if phi is None else group["lr"] * phi
                copy = {**group, "params": params, "lr": lr}
                step_groups.append(copy)
                copies.append((copy, group))
        self._own, self._copies = own, copies
        self.optimizer.param_groups = step_groups

    @torch.no_grad()
    def after_step(self) -> None:
        self._restore_groups()
        for p, before, phi in self._saved:  # p <- before + phi * (p - before), written into p by the op
            torch.lerp(before, p, phi.to(device=p.device, dtype=p.dtype), out=p)
        self._saved = []

    def _restore_groups(self) -> None:
        if self._own is None:
            return
        self.optimizer.param_groups = self._own
        for copy, group in self._copies:  # what an optimizer wrote into its group during the step
            for key, value in copy.items():
                if key not in _STEP_ONLY and group.get(key) is not value:
                    group[key] = value
        self._own, self._copies = None, []

    def remove(self) -> None:
        self._restore_groups()
        for handle in self._handles:
            handle.remove()
        self._handles = []
