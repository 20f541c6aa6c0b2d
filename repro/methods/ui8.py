"""ui8: Unified INT8 training (Zhu et al., CVPR 2020), sections 3.4-3.6.

- Direction Sensitive Gradient Clipping: G is quantized per tensor with a clip value c in (0, max|G|]
  chosen to minimise d_c = 1 - cos(G, G_hat(c)) (eq. 7). The paper learns c by gradient descent; we
  run a bounded 1-D search on log c (coarse grid, then golden section), the equivalent METHODS.md
  accepts. d_c is evaluated with nearest rounding: the stochastic quantizer's expectation is the
  clipped G, which would hide the rounding error the clip value trades against.
- Periodic Update: c and d_c are re-optimised every `period` backward passes (Table 2, Table 5) and
  reused in between as absolute values.
- Deviation Counteractive Learning Rate Scaling: phi(d_c) = max(exp(-alpha d_c), beta) (eq. 8) scales
  the layer's learning rate (applied by repro.lr_scaling).
- The same q(G) feeds GX and GW. Options `clip` and `lr_scaling` switch the two techniques off for the
  ablations of UI8 Tables 3 and 4 (with clip off, c = max|G| every iteration).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from repro.methods import register
from repro.methods.base import GradCodes, LayerQuantizer, Method, stochastic
from repro.quant import QMAX, absmax

GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def cosine_distance(g: torch.Tensor, c: float) -> float:
    """d_c = 1 - cos(g, q(g; c) c / 127) with nearest rounding (UI8 eq. 7), in [0, 2]."""
    top = float(g.abs().max()) if g.numel() else 0.0
    if c <= 0 or top == 0.0:
        return 1.0
    return _unit_cosine_distance(g / top, c / top)


def _unit_cosine_distance(u: torch.Tensor, c: float) -> float:
    """cosine_distance of u = g / max|g|. The cosine does not depend on the scale of g, and unit-max
    entries keep u.norm() exact: float32 squares of a tiny gradient's entries (|g| < 1e-19) underflow,
    the norm came out too small and d_c hugely negative (measured on RetinaNet's head: phi overflowed)."""
    g_hat = (u * (QMAX / c)).clamp_(-QMAX, QMAX).round_()  # the 1/127 scale does not change the cosine
    denom = u.norm() * g_hat.norm()
    if float(denom) == 0.0:
        return 1.0
    return min(max(float(1.0 - (u * g_hat).sum() / denom), 0.0), 2.0)


def search_clip(
    g: torch.Tensor, low_ratio: float = 2.0**-10, grid: int = 16, refine: int = 14
) -> tuple[float, float]:
    """The clip value c in [low_ratio max|g|, max|g|] minimising d_c, and that d_c."""
    g = g.detach().float().reshape(-1)
    top = float(g.abs().max())
    if top == 0.0:
        return 0.0, 0.0
    u = g / top  # once, not per candidate (see _unit_cosine_distance)

    def distance(log_c: float) -> float:
        return _unit_cosine_distance(u, math.exp(log_c) / top)

    lo_log, hi_log = math.log(top * low_ratio), math.log(top)
    logs = [lo_log + (hi_log - lo_log) * i / (grid - 1) for i in range(grid)]
    dists = [distance(v) for v in logs]
    best = min(range(grid), key=dists.__getitem__)
    # Golden-section refinement inside the bracket around the best grid point.
    a, b = logs[max(best - 1, 0)], logs[min(best + 1, grid - 1)]
    x1, x2 = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    f1, f2 = distance(x1), distance(x2)
    for _ in range(refine):
        if f1 <= f2:
            b, x2, f2 = x2, x1, f1
            x1 = b - GOLDEN * (b - a)
            f1 = distance(x1)
        else:
            a, x1, f1 = x1, x2, f2
            x2 = a + GOLDEN * (b - a)
            f2 = distance(x2)
    candidates = [(dists[best], logs[best]), (f1, x1), (f2, x2)]
    d, log_c = min(candidates)
    return math.exp(log_c), d


def lr_factor(d_c: float, alpha: float, beta: float) -> float:
    """phi(d_c) = max(exp(-alpha d_c), beta), UI8 eq. 8; d_c >= 0, so phi <= 1."""
    return max(math.exp(-alpha * max(d_c, 0.0)), beta)


class Ui8Quantizer(LayerQuantizer):
    def __init__(self, method: Method):
        super().__init__(method)
        self.clip: float | None = None
        self.d_c: float = 0.0
        self.updates = 0  # how many times c was re-optimised

    def due(self) -> bool:
        return self.step % self.opts["period"] == 0

    def grad(self, g: torch.Tensor, channel_axis: int) -> GradCodes:
        if self.opts["clip"]:
            if self.clip is None or self.due():
                self.clip, self.d_c = search_clip(g)
                self.updates += 1
            s = torch.tensor(self.clip, device=g.device)
        else:
            s = absmax(g)
            if self.due():
                self.d_c = cosine_distance(g.detach().float(), float(s))
                self.updates += 1
        self.step += 1
        q = stochastic(g, s)
        return GradCodes(q, s, q, s)

    def lr_scale(self) -> float:
        if not self.opts["lr_scaling"]:
            return 1.0
        return lr_factor(self.d_c, self.opts["alpha"], self.opts["beta"])

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "clip": self.clip, "d_c": self.d_c, "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.clip, self.d_c, self.updates = state["clip"], float(state["d_c"]), int(state["updates"])


@register
class Ui8(Method):
    name = "ui8"
    description = "UI8: direction-sensitive clipping, periodic update, deviation-counteractive LR scaling"
    layer_quantizer = Ui8Quantizer
    # alpha = 20, beta = 0.1, period 100 (UI8 section 4.1; Table 4 sweeps alpha, beta; Table 5 the period)
    defaults = {"alpha": 20.0, "beta": 0.1, "period": 100, "clip": True, "lr_scaling": True}

    def validate(self) -> None:
        if int(self.opts["period"]) < 1:
            raise ValueError(f"period must be a positive number of iterations, got {self.opts['period']}")
        if not 0.0 <= self.opts["beta"] <= 1.0:
            raise ValueError(f"beta is the lower bound of phi in [0, 1], got {self.opts['beta']}")
        self.opts["period"] = int(self.opts["period"])
