"""ui8: Unified INT8 training (Zhu et al., CVPR 2020), sections 3.4-3.6.

- Direction Sensitive Gradient Clipping: G is quantized per tensor with a clip value c in (0, max|G|]
  chosen to minimise d_c = 1 - cos(G, G_hat(c)) (eq. 7). The paper learns c by gradient descent; we
  run a bounded 1-D search on log c (a coarse grid, then finer grids around the best point, on the
  gradient's device without waiting for it), the equivalent docs/methods.md accepts. d_c is evaluated with
  nearest rounding: the stochastic quantizer's expectation is the clipped G, which would hide the
  rounding error the clip value trades against.
- Periodic Update: c and d_c are re-optimised every `period` backward passes (Table 2, Table 5) and
  reused in between as absolute values.
- Deviation Counteractive Learning Rate Scaling: phi(d_c) = max(exp(-alpha d_c), beta) (eq. 8) scales
  the layer's learning rate (applied by repro.lr_scaling).
- The same q(G) feeds GX and GW. Options `clip` and `lr_scaling` switch the two techniques off for the
  ablations of UI8 Tables 3 and 4 (with clip off, c = max|G| every iteration).
- `lr_form`: the scaling function of UI8 Figure 6(b), which compares a linear, a quadratic and the
  exponential form but prints only the exponential one (eq. 8). Our reading, x = alpha d_c: the linear and
  quadratic forms are the first- and second-order truncations of e^x in the denominator,
      linear 1 / (1 + x),   quadratic 1 / (1 + x + x^2 / 2),   exponential e^-x,
  each floored at beta: the same alpha, beta and slope at d_c = 0, ordered from weakest to strongest.
- `bits_w`: weights on a k-bit grid (UI8 Table 7's "Ours 2/8/8" has 2-bit weights; the paper does not say
  how it quantizes them). Our reading: UI8's symmetric quantizer (eq. 1) with 2^(k-1) - 1 levels a side,
  its clip value chosen, as for the gradients, to minimise the cosine distance between W and its
  quantized version (a log-spaced search), and the least-squares scale for those codes. The codes are
  int8, so the products stay int8 x int8. bits_w = 8 is the per-tensor max|W| quantizer as before.
"""

from __future__ import annotations

import math
from typing import Any

import torch

import kernels
from repro.methods import register
from repro.methods.base import GradCodes, LayerQuantizer, Method
from repro.quant import QMAX

# the clip search: log-spaced grids over c / max|g| in [2^-10, 1], each next grid spanning the best
# point's neighbours of the last (final spacing 10 / 15 / 3.5^3 = 1/64 in log2 c, 1.1% in c)
LOW_RATIO = 2.0**-10
GRIDS = (16, 8, 8, 8)


def _unit_distances(u: torch.Tensor, ratios: torch.Tensor) -> torch.Tensor:
    """d_c of u = g / max|g| for every clip ratio c / max|g| in `ratios`, as a tensor on u's device. The
    cosine does not depend on the scale of g, and unit-max entries keep the norms exact: float32 squares
    of a tiny gradient's entries (|g| < 1e-19) underflow, the norm came out too small and d_c hugely
    negative (measured on RetinaNet's head: phi overflowed). No host synchronisation."""
    u_norm = u.norm()
    out = []
    for r in ratios:
        g_hat = (u * (QMAX / r)).clamp_(-QMAX, QMAX).round_()  # the 1/127 scale does not change the cosine
        # 0 / tiny = 0 where u = 0; g_hat has u's signs, so cos >= 0 up to rounding
        cos = (u * g_hat).sum() / (u_norm * g_hat.norm()).clamp_min(torch.finfo(torch.float32).tiny)
        out.append((1.0 - cos).clamp_min(0.0))
    return torch.stack(out)


def _unit(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g = g.detach().float().reshape(-1)
    top = g.abs().amax() if g.numel() else torch.zeros((), device=g.device)
    return g / torch.where(top > 0, top, torch.ones_like(top)), top  # not clamp_min(tiny): subnormal tops


def cosine_distance_tensor(g: torch.Tensor, c: torch.Tensor | float) -> torch.Tensor:
    """d_c = 1 - cos(g, q(g; c) c / 127) with nearest rounding (UI8 eq. 7), in [0, 2], on g's device;
    1 for c <= 0 or g = 0."""
    u, top = _unit(g)
    c = torch.as_tensor(c, dtype=torch.float32, device=u.device)
    # g = 0: u = 0, whose distance is 1 at any ratio
    ratio = c / torch.where(top > 0, top, torch.ones_like(top))
    d = _unit_distances(u, ratio.clamp_min(torch.finfo(torch.float32).tiny).reshape(1))[0]
    return torch.where(c > 0, d, torch.ones_like(d))


def cosine_distance(g: torch.Tensor, c: float) -> float:
    return float(cosine_distance_tensor(g, c))


def _log_grid_search(distance, low_ratio: float, grids, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The log ratio in [log low_ratio, 0] minimising distance(ratios) (one value per ratio), and that
    distance: a grid, then each next grid spanning the best point's neighbours of the last."""
    # a fill on the device: torch.tensor(v, device=...) copies from the host, which synchronises
    lo = torch.full((), math.log(low_ratio), device=device)
    hi = torch.zeros((), device=device)
    best_log, best_d = hi, None
    for k in grids:
        logs = lo + (hi - lo) * torch.linspace(0.0, 1.0, k, device=device)
        d = distance(logs.exp())
        i = torch.argmin(d).reshape(1)
        # index_select, not logs[i]: indexing with a tensor reads it on the host (a synchronisation)
        best_log, best_d = logs.index_select(0, i)[0], d.index_select(0, i)[0]
        lo, hi = (
            logs.index_select(0, (i - 1).clamp_min(0))[0],
            logs.index_select(0, (i + 1).clamp_max(k - 1))[0],
        )
    return best_log, best_d


def search_clip_tensor(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The clip value c in [2^-10 max|g|, max|g|] minimising d_c, and that d_c, as tensors on g's device
    (a bounded 1-D search on log c, the equivalent docs/methods.md accepts; no host synchronisation)."""
    u, top = _unit(g)
    best_log, best_d = _log_grid_search(lambda ratios: _unit_distances(u, ratios), LOW_RATIO, GRIDS, u.device)
    c = top * best_log.exp()
    zero = top == 0
    return torch.where(zero, torch.zeros_like(c), c), torch.where(zero, torch.zeros_like(best_d), best_d)


def search_clip(g: torch.Tensor) -> tuple[float, float]:
    """search_clip_tensor as floats (tests, figures)."""
    c, d = search_clip_tensor(g)
    return float(c), float(d)


LR_FORMS = ("exponential", "linear", "quadratic")
# the weight grid's clip search (bits_w < 8): log-spaced ratios c / max|w| in [2^-6, 1], then a finer grid
WEIGHT_LOW_RATIO = 2.0**-6
WEIGHT_GRIDS = (12, 8)


def lr_factor(d_c: float, alpha: float, beta: float, form: str = "exponential") -> float:
    """phi(d_c) = max(exp(-alpha d_c), beta), UI8 eq. 8, or the linear / quadratic form of Figure 6(b)
    (module doc); d_c >= 0, so phi <= 1."""
    return float(lr_factor_tensor(torch.tensor(float(d_c), dtype=torch.float64), alpha, beta, form))


def lr_factor_tensor(d_c: torch.Tensor, alpha: float, beta: float, form: str) -> torch.Tensor:
    """lr_factor on a 0-d tensor, on its device."""
    x = alpha * d_c.clamp_min(0.0)
    if form == "linear":
        phi = 1.0 / (1.0 + x)
    elif form == "quadratic":
        phi = 1.0 / (1.0 + x + 0.5 * x * x)
    elif form == "exponential":
        phi = torch.exp(-x)
    else:
        raise ValueError(f"lr_form must be one of {', '.join(LR_FORMS)}, got {form!r}")
    return phi.clamp_min(beta)


def low_bit_weight(w: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 codes of w on the symmetric `bits`-bit grid and the scale s with w_hat = codes * s / 127
    (module doc: the clip value minimising the cosine distance, then the least-squares scale)."""
    levels = 2 ** (bits - 1) - 1
    u, _ = _unit(w)
    u_norm = u.norm()  # once, not once per candidate grid
    best, _ = _log_grid_search(
        lambda ratios: torch.stack([-_grid_cosine(u, u_norm, r, levels) for r in ratios]),
        WEIGHT_LOW_RATIO,
        WEIGHT_GRIDS,
        u.device,
    )
    codes = (u * (levels / best.exp())).clamp_(-levels, levels).round_()
    wf = w.detach().reshape(-1).float()
    # integer codes: energy is 0 (then so is the numerator) or at least 1
    alpha = (wf * codes).sum() / (codes * codes).sum().clamp_min(1.0)
    return codes.to(torch.int8).reshape(w.shape), alpha * QMAX


def _grid_cosine(u: torch.Tensor, u_norm: torch.Tensor, ratio: torch.Tensor, levels: int) -> torch.Tensor:
    t = (u * (levels / ratio)).clamp_(-levels, levels).round_()
    return (u * t).sum() / (u_norm * t.norm()).clamp_min(torch.finfo(torch.float32).tiny)


def _searched_or_unclipped(c: torch.Tensor, g: torch.Tensor, backend) -> torch.Tensor:
    """The clip value to quantize g with: c, or max|g| (no clipping) where c = 0. A search on an all-zero
    gradient (a layer no loss reached yet: behind a zero-initialised BatchNorm, an FPN level without
    positives) finds no c in (0, max|G|]; reused as 0 for a whole period it zeroed every later gradient."""
    if c.device.type == "cpu" and float(c) > 0:  # reading a CPU tensor costs no synchronisation
        return c  # and spares the absmax
    return torch.where(c > 0, c, backend.absmax(g))


class Ui8Quantizer(LayerQuantizer):
    # c and d_c live on the gradient's device between searches (reading them waits for the device)
    def __init__(self, method: Method):
        super().__init__(method)
        self._clip: torch.Tensor | None = None
        self._d_c: torch.Tensor | None = None
        self._updates = torch.zeros((), dtype=torch.int64)  # how many times c was re-optimised
        self._low_bit: tuple | None = None  # (the weight, its version, its codes and scale)

    @property
    def updates(self) -> int:
        return int(self._updates)

    @updates.setter
    def updates(self, value: int) -> None:
        self._updates.fill_(int(value))

    @property
    def clip(self) -> float | None:
        return None if self._clip is None else float(self._clip)

    # set from a checkpoint or by hand: kept exactly (float64) until the next search
    @clip.setter
    def clip(self, value: float | None) -> None:
        self._clip = None if value is None else torch.tensor(float(value), dtype=torch.float64)

    @property
    def d_c(self) -> float:
        return 0.0 if self._d_c is None else float(self._d_c)

    @d_c.setter
    def d_c(self, value: float) -> None:
        self._d_c = torch.tensor(float(value), dtype=torch.float64)

    def weight(self, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.opts["bits_w"] == 8:
            return super().weight(w)
        if kernels.compiling() or w.is_inference():  # an inference tensor has no version counter
            return low_bit_weight(w, self.opts["bits_w"])
        # The search is a function of w alone, and the same weight unchanged since the last call (every
        # batch of a validation) gets the codes found then (its cost: docs/methods.md). In-place updates
        # (the optimizer's, load_state_dict's) bump the tensor's version; holding w keeps another tensor
        # from taking its place.
        cached = self._low_bit
        if cached is None or cached[0] is not w or cached[1] != w._version:
            cached = self._low_bit = (w, w._version, low_bit_weight(w, self.opts["bits_w"]))
        return cached[2]

    def due(self) -> bool:
        return self.step % self.opts["period"] == 0

    def grad(self, g: torch.Tensor, channel_axis: int) -> GradCodes:
        backend = kernels.get_backend(g.device)
        if kernels.compiling() and self._traceable_state(g):
            s = self._traced_scale(g, backend)
        elif self.opts["clip"]:
            if self._clip is None or self.due():
                self._clip, self._d_c = search_clip_tensor(g)
                self.updates += 1
            self._clip = self._clip.to(device=g.device, dtype=torch.float32)
            s = _searched_or_unclipped(self._clip, g, backend)
        else:
            s = backend.absmax(g)
            if self.due():
                self._d_c = cosine_distance_tensor(g, s)
                self.updates += 1
        self.count_step()
        q = backend.quantize(g, s, None, "stochastic")
        return GradCodes(q, s, q, s)

    def _traceable_state(self, g: torch.Tensor) -> bool:
        """Whether c and d_c are float32 tensors on g's device, as the first eager-like step leaves them
        (a compiled step updates them in place; before that the eager branch allocates them)."""
        return all(
            t is not None and t.dtype == torch.float32 and t.device == g.device
            for t in (self._clip, self._d_c)
        ) or (not self.opts["clip"] and self._d_c is not None and self._d_c.dtype == torch.float32)

    def _traced_scale(self, g: torch.Tensor, backend) -> torch.Tensor:
        """grad's clip value under torch.compile: the periodic search is a torch.cond on the step counter
        (one compiled graph for both branches, no recompilation), its results copied into the state."""
        due = self._steps % self.opts["period"] == 0  # on the CPU, as the counters: no device wait
        if self.opts["clip"]:
            c, d = torch.cond(
                due,
                lambda g, c, d: search_clip_tensor(g),
                lambda g, c, d: (c.clone(), d.clone()),
                (g.detach(), self._clip, self._d_c),
            )
            self._clip.copy_(c)
            self._d_c.copy_(d)
            s = torch.where(c > 0, c, backend.absmax(g))
        else:
            s = backend.absmax(g)
            d = torch.cond(
                due,
                lambda g, s, d: cosine_distance_tensor(g, s).float(),
                lambda g, s, d: d.clone(),
                (g.detach(), s, self._d_c),
            )
            self._d_c.copy_(d)
        self._updates.add_(due.to(torch.int64))
        return s

    def lr_scale(self) -> float:
        if not self.opts["lr_scaling"]:
            return 1.0
        return lr_factor(self.d_c, self.opts["alpha"], self.opts["beta"], self.opts["lr_form"])

    def lr_scale_tensor(self) -> torch.Tensor | None:
        if not self.opts["lr_scaling"] or self._d_c is None:
            return None
        return lr_factor_tensor(self._d_c, self.opts["alpha"], self.opts["beta"], self.opts["lr_form"])

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
    # alpha = 20, beta = 0.1, period 100 (UI8 section 4.1; Table 4 sweeps alpha, beta; Table 5 the period);
    # lr_form: Figure 6(b); bits_w: Table 7's 2/8/8 row
    defaults = {
        "alpha": 20.0,
        "beta": 0.1,
        "period": 100,
        "clip": True,
        "lr_scaling": True,
        "lr_form": "exponential",
        "bits_w": 8,
    }

    def validate(self) -> None:
        if self.opts["lr_form"] not in LR_FORMS:
            raise ValueError(f"lr_form must be one of {', '.join(LR_FORMS)}, got {self.opts['lr_form']!r}")
        if not 2 <= self.opts["bits_w"] <= 8:
            raise ValueError(f"bits_w must be a weight bit width from 2 to 8, got {self.opts['bits_w']}")
        if self.opts["period"] < 1:  # an int already (repro.methods.options)
            raise ValueError(f"period must be a positive number of iterations, got {self.opts['period']}")
        if self.opts["alpha"] < 0:
            raise ValueError(f"alpha is phi's decay rate and must be >= 0, got {self.opts['alpha']}")
        if not 0.0 <= self.opts["beta"] <= 1.0:
            raise ValueError(f"beta is the lower bound of phi in [0, 1], got {self.opts['beta']}")
