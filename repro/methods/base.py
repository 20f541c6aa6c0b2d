"""What every method shares: option validation, per-layer state, and the forward quantizers.

A `Method` is built once per model (name + options). For each quantized layer it makes a
`LayerQuantizer`, which holds that layer's state (DAIQ's s_{c,t-1}, UI8's clip value and d_c) and
decides how X, W and the output gradient G are quantized. The layer classes in repro.layers ask it
for int8 operands and ask the backend for the integer products.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

import kernels
from repro.methods.options import typed_options


@dataclass
class GradCodes:
    """The quantized output gradient G for the two backward products.

    `gx` feeds GX = q(G) (*)^T q(W) with one scale `gx_scale`; `gw` feeds GW = q(X)^T (*) q(G) with
    `gw_scale`, per tensor (0-d) or per output channel (1-D, one value per channel of G). Methods that
    use one q(G) for both return the same tensor twice.
    """

    gx: torch.Tensor
    gx_scale: torch.Tensor
    gw: torch.Tensor
    gw_scale: torch.Tensor

    @property
    def gw_per_channel(self) -> bool:
        return self.gw_scale.dim() == 1


class LayerQuantizer:
    """Per-layer quantizers and state of one method. Subclasses override `grad` (and state)."""

    quantizes = True
    # A method whose arithmetic is not int8 x int8 sets `simulated` and runs the whole layer in
    # `simulate` (quantize-dequantize in float) instead of the int8 autograd Functions.
    simulated = False

    def __init__(self, method: Method):
        self.method = method
        self.opts = method.opts
        # backward passes seen by this layer: a tensor counted in place, so that a compiled backward
        # (torch.compile) updates it without a graph break; `step` reads it as an int
        self._steps = torch.zeros((), dtype=torch.int64)

    @property
    def step(self) -> int:
        return int(self._steps)

    @step.setter
    def step(self, value: int) -> None:
        self._steps.fill_(int(value))

    def count_step(self) -> None:
        self._steps.add_(1)

    # Forward (UI8 and DAIQ alike): per-tensor s = max|x|, nearest rounding.
    def weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return kernels.get_backend(w.device).absmax_quantize(w)

    def activation(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return kernels.get_backend(x.device).absmax_quantize(x)

    def grad(self, g: torch.Tensor, channel_axis: int) -> GradCodes:
        raise NotImplementedError

    def simulate(self, x: torch.Tensor, weight: torch.Tensor, op) -> torch.Tensor:
        """The layer's output from input x and weight, `op(x, w)` being the layer's float op."""
        raise NotImplementedError

    def lr_scale(self) -> float:
        """Factor on this layer's learning rate (UI8's phi(d_c)); 1 for methods without one."""
        return 1.0

    def lr_scale_tensor(self) -> torch.Tensor | None:
        """The same factor as a 0-d tensor on the layer's device (no host synchronisation), or None for
        methods that scale no learning rate (repro.lr_scaling applies it at every optimizer step)."""
        return None

    # Method state travels with checkpoints; tensors are stored on the CPU.
    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class Method:
    name: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    layer_quantizer: ClassVar[type[LayerQuantizer]] = LayerQuantizer
    description: ClassVar[str] = ""
    simulated: ClassVar[bool] = False  # True: quantize-dequantize in float, not int8 arithmetic

    def __init__(self, **options: Any):
        unknown = sorted(set(options) - set(self.defaults))
        if unknown:
            known = ", ".join(sorted(self.defaults)) or "none"
            raise ValueError(f"method {self.name!r} has no option {', '.join(unknown)}; its options: {known}")
        # each option takes the type of its default (repro.methods.options): "1.5" from a command line
        # is 1.5, "abc" for a number is one clear ValueError before validate() compares it
        self.opts = {**self.defaults, **typed_options(self.name, self.defaults, options)}
        for key, value in self.opts.items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"method {self.name!r}: option {key} must be a finite number, got {value}")
        self.validate()

    def validate(self) -> None:
        """Check option values (already of their defaults' types); raise ValueError naming the bad one."""

    def make_layer_quantizer(self) -> LayerQuantizer:
        return self.layer_quantizer(self)

    # Capabilities: what a method does besides quantizing layers, declared here and asked by the hook
    # and quantize_model (never a method's name). The defaults do nothing.
    @property
    def scales_learning_rates(self) -> bool:
        """Whether its layers scale their own learning rates (a LayerQuantizer overriding lr_scale:
        UI8's phi(d_c))."""
        return self.layer_quantizer.lr_scale is not LayerQuantizer.lr_scale

    def module_swaps(self) -> dict[type, type]:
        """Other module classes this method replaces (float class -> quantized subclass, e.g. BatchNorm2d);
        quantize_model swaps them everywhere, keeping Parameters and state_dict keys, and sets
        `module.int8_method`."""
        return {}

    def make_optimizer(self, model, optimizer):
        """A replacement for `optimizer` over its param groups (Int8TrainingHook installs it), or None."""
        return None

    @classmethod
    def recipe_overrides(cls, profile: str) -> dict[str, Any]:
        """Training-recipe entries (lr, batch_size, ...) a method's own paper prescribes at a profile, for
        any options (a class method: a task's config is built without building the method)."""
        return {}

    def set_progress(self, iteration: int, max_iters: int) -> None:
        """Called before every training iteration (Int8TrainingHook) for schedules tied to progress."""

    def __repr__(self) -> str:
        opts = ", ".join(f"{k}={v!r}" for k, v in self.opts.items())
        return f"{type(self).__name__}({opts})"
