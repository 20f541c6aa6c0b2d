"""daiq: Distribution Adaptive INT8 Quantization (Zhao et al., AAAI 2021), and its two ablations.

Backward pass per Algorithm 1:
- GX path: G per tensor, s = max|G|, stochastic (line 12).
- GW path: Gradient Vectorized Quantization, one s_c per output channel c of G (line 11), and GW[c]
  dequantized with (s_x/127)(s_c/127) (eq. 7).
- Magnitude-aware Clipping Strategy (lines 1-10, eq. 14-15), per channel c at iteration t:
      sigma_c = std of G[:, c]; P = fraction of |g| > sigma_c
      P > lambda  (Gaussian):    s_{c,t} = max|G[:, c]|
      otherwise   (Inverted-T):  s_{c,t} = (1 - k*A) s_{c,t-1} + A max|G[:, c]|
  with s_{c,t-1} = max|G[:, c]| at the first iteration.
Ablations (Table 2): `daiq-gvq` is per-channel s_c = max|G[:, c]| without MCS; `daiq-mcs` applies MCS
(and its discriminator) to the whole tensor, one s, without GVQ; both keep the GX path above.
"""

from __future__ import annotations

from typing import Any

import torch

import kernels
from repro.methods import register
from repro.methods.base import GradCodes, LayerQuantizer, Method


def _fraction(counts: torch.Tensor, g: torch.Tensor, channel_axis: int | None) -> torch.Tensor:
    n = g.numel() // (1 if channel_axis is None else max(1, g.shape[channel_axis]))
    above = counts.to(torch.float64).div_(max(1, n)).float()
    return above.reshape(()) if channel_axis is None else above


def mcs_update(
    gmax: torch.Tensor, above: torch.Tensor, prev: torch.Tensor | None, k: float, A: float, lam: float
) -> torch.Tensor:
    """One MCS step (Algorithm 1, lines 5-8) for every channel at once."""
    if prev is None:  # first iteration: s_{c,0} = max|g_c|
        return gmax.clone()
    inverted_t = (1.0 - k * A) * prev + A * gmax
    s = torch.where(above > lam, gmax, inverted_t)
    # With k*A > 1 the recurrence can go non-positive (docs/methods.md notes 1 - kA can be negative);
    # a clip value <= 0 has no meaning, so such a channel falls back to max|g_c|, the Gaussian rule.
    return torch.where(s > 0, s, gmax)


class DaiqQuantizer(LayerQuantizer):
    per_channel = True  # GVQ
    clipping = True  # MCS

    def __init__(self, method: Method):
        super().__init__(method)
        self.scale: torch.Tensor | None = None  # s_{c,t-1}, on G's device
        self.last_gaussian: torch.Tensor | None = None  # discriminator decision, kept for statistics

    def grad(self, g: torch.Tensor, channel_axis: int) -> GradCodes:
        # Three passes over G: the per-channel statistics; the GX codes (per tensor, s = max|G|) together
        # with the counts of |g| > sigma_c; the GW codes with the clip values MCS chose from those counts.
        self.count_step()
        backend = kernels.get_backend(g.device)
        axis = channel_axis if self.per_channel else None
        gmax, sigma = backend.channel_stats(g, axis)
        o = self.opts
        fused = getattr(backend, "daiq_grad_codes", None) if self.clipping else None
        if fused is not None:  # the passes and the rule below in one native call (kernels.cpu)
            prev = None if self.scale is None else self.scale.to(gmax.device)
            codes = fused(g, axis, gmax, sigma, prev, o["k"], o["A"], o["lam"])
            if codes is not None:
                gx, gx_scale, gw, s, gaussian = codes
                self._keep(s, gaussian)
                return GradCodes(gx, gx_scale, gw, s)
        gx_scale = gmax.max()  # max|G|, the maximum of the channels' maxima
        if self.clipping:
            gx, counts = backend.quantize(g, gx_scale, None, "stochastic", above=(axis, sigma))
            above = _fraction(counts, g, axis).to(gmax.device)
            prev = None if self.scale is None else self.scale.to(gmax.device)
            s = mcs_update(gmax, above, prev, o["k"], o["A"], o["lam"])
            self._keep(s.detach(), (above > o["lam"]).detach())
        else:
            gx = backend.quantize(g, gx_scale, None, "stochastic")
            s = gmax
        gw = backend.quantize(g, s, axis, "stochastic")
        return GradCodes(gx, gx_scale, gw, s)

    def _keep(self, scale: torch.Tensor, gaussian: torch.Tensor) -> None:
        """s_{c,t} and the decisions, into the tensors of the last iteration (in place: a compiled backward
        updates them without a graph break); the first iteration, or another device, allocates them (a
        layer's channels do not change: the MCS step needs s_{c,t-1} of the same shape)."""
        kept = self.scale, self.last_gaussian
        if any(t is None or t.device != scale.device for t in kept):
            self.scale, self.last_gaussian = scale.clone(), gaussian.clone()
        else:
            self.scale.copy_(scale)
            self.last_gaussian.copy_(gaussian)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["scale"] = None if self.scale is None else self.scale.detach().cpu().clone()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.scale = None if state["scale"] is None else state["scale"].clone()


class GvqQuantizer(DaiqQuantizer):
    clipping = False


class McsQuantizer(DaiqQuantizer):
    per_channel = False


class _DaiqOptions(Method):
    # lambda = 0.3, k = 1, A = 0.8 (DAIQ eq. 15 and Table 1, which sweeps k in {1, 1.2, 1.5}, A in {0.5, 0.8})
    defaults = {"k": 1.0, "A": 0.8, "lam": 0.3}

    def validate(self) -> None:
        if not 0.0 <= self.opts["lam"] <= 1.0:
            raise ValueError(f"lam is a probability threshold in [0, 1], got {self.opts['lam']}")
        if self.opts["A"] <= 0:
            raise ValueError(f"A must be positive, got {self.opts['A']}")
        if self.opts["k"] <= 0:
            raise ValueError(f"k scales the Inverted-T step and must be positive, got {self.opts['k']}")


@register
class Daiq(_DaiqOptions):
    name = "daiq"
    description = "DAIQ: per-channel GW scales (GVQ) with magnitude-aware clipping (MCS)"
    layer_quantizer = DaiqQuantizer


@register
class DaiqGvq(Method):
    name = "daiq-gvq"
    description = "DAIQ ablation OursGVQ: per-channel s_c = max|G_c|, no MCS (Table 2)"
    layer_quantizer = GvqQuantizer


@register
class DaiqMcs(_DaiqOptions):
    name = "daiq-mcs"
    description = "DAIQ ablation OursMCS: MCS on the whole tensor, no GVQ (Table 2)"
    layer_quantizer = McsQuantizer
