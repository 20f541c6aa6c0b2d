"""wage: WAGE (Wu et al., ICLR 2018, "Training and Inference with Integers in Deep Neural Networks"),
W/A/G/E = 2/8/8/8 by default. Simulated.

With sigma(k) = 2^(1-k), Q(x, k) = sigma(k) round(x / sigma(k)), C(x, k) = clip(x, -1 + sigma(k),
1 - sigma(k)) and Shift(x) = 2^round(log2 x) (sec. 3.1):
- Initialisation (sec. 3.3.1): W ~ U(-L, L), L = max(L_min, sqrt(6 / fan_in)), L_min = beta sigma(k_W),
  beta = 1.5; the layer-wise scale alpha = max(Shift(L_min / sqrt(6 / fan_in)), 1) divides the layer's
  output, applied to the quantized weight (as the authors' code does): W_q = Q(C(W, k_W), k_W) / alpha,
  straight-through to W (clip and round both skipped in the backward pass, as the authors' code does).
- A (sec. 3.3.2): a_q = Q(C(x, k_A), k_A) on the layer's input; the clip's gradient mask is kept.
- E (sec. 3.3.3): e_q = Q(C(e / Shift(max|e|), k_E), k_E) at the layer's output, one e_q for GX and GW.
  We multiply e_q back by the power of two Shift(max|e|): WAGE's own updates are unchanged by it (G
  below renormalises by Shift(max|g|)), and the float first/last layers and the biases then get
  gradients of the right size.
- G and the update (sec. 3.3.4): g_s = lr g / Shift(max|g|), dW = sigma(k_G) sgn(g_s) (floor|g_s| +
  Bernoulli(|g_s| - floor|g_s|)), W <- C(W - dW, k_G): WAGE's weights live on the k_G-bit grid and its
  update replaces the optimizer's for them (plain SGD, no momentum or weight decay). `lr` is WAGE's
  integer learning rate (8 in the authors' CIFAR-10 schedule); it follows the run's scheduler as
  lr * (group lr now / group lr at the first step), our mapping of WAGE's step schedule.
Not reproduced: WAGE's networks (no batch norm, no biases; here biases and any BN stay float with the
run's optimizer), the 16-bit intermediate of the authors' G code, and quantized first/last layers (they
stay float here). Simulated: quantize-dequantize in float, float products.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from repro.methods import register
from repro.methods.base import LayerQuantizer, Method
from repro.quant import check_finite
from repro.ste import grad_quant, ste

BETA = 1.5  # sec. 3.3.1


def sigma(k: int) -> float:
    return 2.0 ** (1 - k)


def q(x: torch.Tensor, k: int) -> torch.Tensor:
    return torch.round(x / sigma(k)) * sigma(k)


def c(x: torch.Tensor, k: int) -> torch.Tensor:
    return x.clamp(-1 + sigma(k), 1 - sigma(k))


def shift(x: float) -> float:
    return 2.0 ** round(math.log2(x))


def layer_scale(fan_in: int, k_w: int) -> tuple[float, float]:
    """(L, alpha) of sec. 3.3.1 for a layer with `fan_in` inputs per output."""
    l_std = math.sqrt(6.0 / fan_in)
    l_min = BETA * sigma(k_w)
    return max(l_min, l_std), max(shift(l_min / l_std), 1.0)


def quantize_error(e: torch.Tensor, k: int) -> torch.Tensor:
    check_finite(e, "WAGE's error quantizer input")
    top = float(e.detach().abs().max())
    if top == 0.0:
        return torch.zeros_like(e)
    s = shift(top)
    return (q(c(e.detach().float() / s, k), k) * s).to(e.dtype)


def weight_update(
    g: torch.Tensor, lr: float, k_g: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """dW = sigma(k_G) sgn(g_s) stochastic_round(|g_s|), g_s = lr g / Shift(max|g|) (eq. 12-13)."""
    top = float(g.abs().max())
    if top == 0.0:
        return torch.zeros_like(g)
    gs = lr * g.float() / shift(top)
    mag = gs.abs()
    frac = mag - mag.floor()
    bern = (torch.rand(g.shape, generator=generator, device=g.device) < frac).float()
    return sigma(k_g) * torch.sign(gs) * (mag.floor() + bern)


class WageQuantizer(LayerQuantizer):
    simulated = True

    def __init__(self, method: Method):
        super().__init__(method)
        self.alpha: float | None = None  # None until the weight has WAGE's initialisation
        self.lr0: float | None = None  # the group's learning rate at the first update

    @torch.no_grad()
    def initialize(self, weight: torch.Tensor) -> None:
        fan_in = weight[0].numel()
        limit, self.alpha = layer_scale(fan_in, self.opts["bits_w"])
        k_g = self.opts["bits_g"]
        weight.copy_(q(c(torch.empty_like(weight).uniform_(-limit, limit), k_g), k_g))

    def simulate(self, x: torch.Tensor, weight: torch.Tensor, op) -> torch.Tensor:
        o = self.opts
        if self.alpha is None:  # WAGE's own initialisation, once (kept in checkpoints: not on resume)
            self.initialize(weight)
        w = ste(weight, lambda t: q(c(t, o["bits_w"]), o["bits_w"]) / self.alpha)
        a = ste(c(x, o["bits_a"]), lambda t: q(t, o["bits_a"]))
        y = op(a, w)
        self.count_step()
        # clone: grad_quant returns a view, and models modify layer outputs in place (ReLU(inplace=True))
        return grad_quant(y, lambda e: quantize_error(e, o["bits_e"])).clone()

    @torch.no_grad()
    def update(self, weight: torch.Tensor, before: torch.Tensor, grad: torch.Tensor, group_lr: float) -> None:
        """Replace the optimizer's step on `weight` by WAGE's: W <- C(W_before - dW, k_G)."""
        if self.lr0 is None:
            self.lr0 = group_lr
        lr = self.opts["lr"] * (group_lr / self.lr0 if self.lr0 else 1.0)
        k_g = self.opts["bits_g"]
        weight.copy_(c(before - weight_update(grad, lr, k_g), k_g))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "alpha": self.alpha, "lr0": self.lr0}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.alpha, self.lr0 = state["alpha"], state["lr0"]


class WageUpdate:
    """Around each optimizer step: WAGE layers' weights take WAGE's update instead of the optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer, layers: list[tuple[torch.Tensor, WageQuantizer]]):
        self.optimizer = optimizer
        self.layers = layers
        self._saved: list[tuple[torch.Tensor, WageQuantizer, torch.Tensor, torch.Tensor, float]] = []
        optimizer.register_step_pre_hook(lambda *_: self.before_step())
        optimizer.register_step_post_hook(lambda *_: self.after_step())

    def before_step(self) -> None:
        lrs = {id(p): group["lr"] for group in self.optimizer.param_groups for p in group["params"]}
        self._saved = [
            (w, quantizer, w.detach().clone(), w.grad.detach().clone(), lrs[id(w)])
            for w, quantizer in self.layers
            if w.grad is not None and id(w) in lrs
        ]

    def after_step(self) -> None:
        for w, quantizer, before, grad, lr in self._saved:
            quantizer.update(w, before, grad, lr)
        self._saved = []


@register
class Wage(Method):
    name = "wage"
    description = "WAGE: 2-bit W, 8-bit A/G/E, shift scaling, own integer weight update (2/8/8); simulated"
    layer_quantizer = WageQuantizer
    simulated = True
    # W/A/G/E = 2/8/8/8 as UI8 Table 7 cites WAGE (AlexNet 2/8/8); lr 8 as the authors' CIFAR schedule.
    defaults = {"bits_w": 2, "bits_a": 8, "bits_g": 8, "bits_e": 8, "lr": 8.0}

    def validate(self) -> None:
        for key in ("bits_w", "bits_a", "bits_g", "bits_e"):
            bits = self.opts[key]
            if not isinstance(bits, int) or not 2 <= bits <= 16:
                raise ValueError(f"{key} must be an integer bit width in 2..16, got {bits!r}")
        if self.opts["lr"] <= 0:
            raise ValueError(f"lr must be positive, got {self.opts['lr']}")

    def make_optimizer(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Keeps `optimizer` for every other parameter and puts WAGE's update on the quantized weights."""
        layers = [
            (m.weight, m.int8) for m in model.modules() if isinstance(getattr(m, "int8", None), WageQuantizer)
        ]
        WageUpdate(optimizer, layers)
        return None
