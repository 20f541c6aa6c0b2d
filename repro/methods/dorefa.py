"""dorefa: DoReFa-Net (Zhou et al. 2016, arXiv:1606.06160), W/A/G = 8/8/8 by default. Simulated.

Quantizers (section 2 of the paper), with quantize_k(r) = round((2^k - 1) r) / (2^k - 1) on r in [0, 1]
and the straight-through estimator for its round:
- W (eq. 9):  w_q = 2 quantize_k(tanh(w) / (2 max|tanh(w)|) + 1/2) - 1, in [-1, 1]; the gradient flows
  through tanh and the max normalisation (only the round is straight-through).
- A (sec. 2.4): a_q = quantize_k(clip(x, 0, 1)) on the layer's input; the clip's gradient mask is kept.
  The paper bounds activations with its own nonlinearity before quantize_k; here the clip is applied at
  the quantized layer's input, so a negative or >1 input is clipped like DoReFa's bounded activation.
- G (eq. 12): g_q = 2 m [quantize_k(g / (2 m) + 1/2 + N(k)) - 1/2], m = max|g| over all axes but the
  batch axis (per sample), N(k) = sigma / (2^k - 1), sigma ~ U(-1/2, 1/2). g/(2m) + 1/2 + N(k) can leave
  [0, 1] by the noise; it is clipped to [0, 1] first, the domain of quantize_k. G is the gradient at the
  layer's output (the paper quantizes the gradient of each layer's output), and one g_q feeds GX and GW.

Simulated: the [0, 1] offset grids and the per-sample gradient scale are not symmetric int8 codes with
one scale, so the layer runs its float op on the quantize-dequantized W and A (repro.ste) and quantizes
G in the backward pass. Not reproduced: DoReFa's networks (batch norm after every layer, its own
bounded activation); the quantizers act on whatever model is given, first and last layers float.
"""

from __future__ import annotations

import torch

from repro.methods import register
from repro.methods.base import LayerQuantizer, Method
from repro.ste import grad_quant, ste


def quantize_k(r: torch.Tensor, k: int) -> torch.Tensor:
    """round((2^k - 1) r) / (2^k - 1) (eq. 5)."""
    n = float(2**k - 1)
    return (r * n).round_().div_(n)


def quantize_weight(w: torch.Tensor, k: int) -> torch.Tensor:
    """eq. 9, differentiable except for the round (straight-through)."""
    return _WeightQuant.apply(w, k)


class _WeightQuant(torch.autograd.Function):
    """2 quantize_k(tanh(w) / (2 m) + 1/2) - 1 and its gradient, m = max|tanh(w)| taken as a constant.

    The operations of the autograd graph of that expression (tanh, / 2m, + 1/2, a straight-through round,
    x 2, - 1), in the same order, so the same values bit for bit, but on one temporary in place: AlexNet's
    fully connected weights (54M values) made a new tensor at every step of it (docs/methods.md)."""

    @staticmethod
    def forward(ctx, w, k):
        t = torch.tanh(w)
        low, high = torch.aminmax(t)  # max|t| in one pass: the larger magnitude of the two, exactly
        m = torch.maximum(high, low.neg())
        if float(m) == 0.0:  # all-zero weight: tanh(0)/0; DoReFa maps it to quantize_k(1/2)
            m = torch.ones_like(m)
        two_m = 2 * m
        ctx.save_for_backward(t, two_m)
        n = float(2**k - 1)
        return t.div(two_m).add_(0.5).mul_(n).round_().div_(n).mul_(2).sub_(1)

    @staticmethod
    def backward(ctx, grad):
        t, two_m = ctx.saved_tensors
        # x 2, then / 2m (through the round and + 1/2 unchanged), then tanh's derivative
        return torch.ops.aten.tanh_backward((grad * 2).div_(two_m), t), None


def quantize_activation(x: torch.Tensor, k: int) -> torch.Tensor:
    return ste(x.clamp(0, 1), lambda u: quantize_k(u, k))


def quantize_grad(g: torch.Tensor, k: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """eq. 12 with m per sample (max over all but the first axis)."""
    g = g.detach().float()
    dims = tuple(range(1, g.dim()))
    m = g.abs().amax(dim=dims, keepdim=True) if dims else g.abs()
    safe = torch.where(m > 0, m, torch.ones_like(m))
    n = float(2**k - 1)
    noise = torch.rand(g.shape, generator=generator, device=g.device).sub_(0.5).div_(n)
    r = (g / (2 * safe)).add_(0.5).add_(noise).clamp_(0, 1)
    return torch.where(m > 0, quantize_k(r, k).sub_(0.5).mul_(2 * safe), torch.zeros_like(g))


class DorefaQuantizer(LayerQuantizer):
    simulated = True

    def simulate(self, x: torch.Tensor, weight: torch.Tensor, op) -> torch.Tensor:
        o = self.opts
        y = op(quantize_activation(x, o["bits_a"]), quantize_weight(weight, o["bits_w"]))
        self.count_step()
        # clone: grad_quant returns a view, and models modify layer outputs in place (ReLU(inplace=True))
        return grad_quant(y, lambda g: quantize_grad(g, o["bits_g"]).to(g.dtype)).clone()


@register
class Dorefa(Method):
    name = "dorefa"
    description = "DoReFa-Net: tanh-normalised W, [0,1] A, noisy per-sample G (8/8/8); simulated"
    layer_quantizer = DorefaQuantizer
    simulated = True
    # W/A/G = 8/8/8 as UI8 Table 7 and DAIQ Table 4 cite DoReFa-Net.
    defaults = {"bits_w": 8, "bits_a": 8, "bits_g": 8}

    def validate(self) -> None:
        for key in ("bits_w", "bits_a", "bits_g"):
            bits = self.opts[key]
            if not isinstance(bits, int) or not 2 <= bits <= 16:
                raise ValueError(f"{key} must be an integer bit width in 2..16, got {bits!r}")
