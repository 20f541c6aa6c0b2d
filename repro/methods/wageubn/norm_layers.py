"""Quantized BatchNorm and ReLU for WAGEUBN (Yang et al. 2020, eq. 2-3 and 12-15), by class swap.

A swapped module keeps its class's Parameters, buffers and state_dict keys (it subclasses the float
class) and reads its quantizers from `self.int8_method`, the Method that swapped it (see
Method.module_swaps and repro.layers.quantize_model): `bn_quant` (a BnQuant) for batch norm,
`relu_quant` (a ReluQuant) for ReLU. Simulated: every value is quantize-dequantized in float.

BatchNorm, training (eq. 12, Algorithm 1):
    mu_q = Q(mu, k_mu), sigma_q = Q(sigma, k_sigma) + eps_q, x_hat = Q((x - mu_q) / sigma_q, k_bn)
    y = Q(gamma, k_gamma) * x_hat + Q(beta, k_beta)
Each Q passes its gradient straight through (eq. 1), so e2 = e1 * gamma_q and the error reaching the
convolution is the exact derivative of this graph (Algorithm 2); g_gamma and g_beta are Q(., k_grad)
(eq. 18). Evaluation uses the running statistics, quantized the same way (the authors' BatchNorm.py).
ReLU: forward Q(relu(x), k_a) (eq. 14); backward e0 = SQ(e, k_e1) then e1 = e0 * relu'(x) (Algorithm 2).

`observe_forward` / `observe_backward` give the statistics recorder (repro.recorder) each quantized value
before and after its quantizer (WAGEUBN Figure 7: BN's x_hat, A, E1), recomputed without gradients and
without touching the running statistics; these quantizers round to nearest, so recomputing them draws
no random number.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from repro.methods.wageubn.fixed_point import SQ, Q
from repro.ste import grad_quant, ste

Pair = tuple[torch.Tensor, torch.Tensor]  # a value before and after its quantizer


@dataclass(frozen=True)
class BnQuant:
    k_mu: int = 16
    k_sigma: int = 16
    k_bn: int = 16
    k_gamma: int = 8
    k_beta: int = 8
    k_grad: int | None = None  # bits of g_gamma, g_beta; None leaves them float
    # The authors' BatchNorm.py adds epsilon = 2^-15 to the quantized sigma (one 16-bit step); torch's
    # 1e-5 would round to 0 on that grid.
    eps: float = 2.0**-15


@dataclass(frozen=True)
class ReluQuant:
    k_a: int | None = 8  # None: activations stay float
    k_e1: int | None = 8  # None: the error entering the activation stays float


class QBatchNormMixin:
    int8_method: object

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        spec: BnQuant = self.int8_method.bn_quant
        dims = [0, *range(2, x.dim())]
        # torch's rule: running statistics in eval wherever they exist (even with tracking switched off later)
        if self.training or self.running_mean is None:
            mean = x.mean(dims)
            var = x.var(dims, correction=0)
            self._update_running_stats(x, mean, var)
        else:
            mean, var = self.running_mean, self.running_var
        mean = ste(mean, lambda t: Q(t, spec.k_mu))
        std = ste(var.sqrt(), lambda t: Q(t, spec.k_sigma)) + spec.eps
        shape = [1, -1, *([1] * (x.dim() - 2))]
        x_hat = ste((x - mean.reshape(shape)) / std.reshape(shape), lambda t: Q(t, spec.k_bn))
        if not self.affine:
            return x_hat
        gamma, beta = self.weight, self.bias
        if spec.k_grad is not None:
            gamma = grad_quant(gamma, lambda g: Q(g, spec.k_grad))
            beta = grad_quant(beta, lambda g: Q(g, spec.k_grad))
        gamma = ste(gamma, lambda t: Q(t, spec.k_gamma))
        beta = ste(beta, lambda t: Q(t, spec.k_beta))
        return x_hat * gamma.reshape(shape) + beta.reshape(shape)

    @torch.no_grad()
    def observe_forward(self, inputs: tuple, output: torch.Tensor) -> dict[str, Pair]:
        """{"BN": (x_hat of the float batch norm, x_hat as this layer computes it)}."""
        x = inputs[0]
        spec: BnQuant = self.int8_method.bn_quant
        dims = [0, *range(2, x.dim())]
        shape = [1, -1, *([1] * (x.dim() - 2))]
        if self.training or self.running_mean is None:
            mean, var = x.mean(dims), x.var(dims, correction=0)
        else:
            mean, var = self.running_mean, self.running_var
        exact = (x - mean.reshape(shape)) / (var + self.eps).sqrt().reshape(shape)
        std = Q(var.sqrt(), spec.k_sigma) + spec.eps
        return {"BN": (exact, Q((x - Q(mean, spec.k_mu).reshape(shape)) / std.reshape(shape), spec.k_bn))}

    @torch.no_grad()
    def _update_running_stats(self, x, mean, var) -> None:
        if not (self.training and self.track_running_stats and self.running_mean is not None):
            return
        self.num_batches_tracked += 1
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        n = x.numel() / x.shape[1]
        unbiased = var * (n / max(n - 1, 1))  # torch's running_var is the unbiased estimate
        self.running_mean.lerp_(mean.detach(), factor)
        self.running_var.lerp_(unbiased.detach(), factor)


class QBatchNorm1d(QBatchNormMixin, nn.BatchNorm1d):
    pass


class QBatchNorm2d(QBatchNormMixin, nn.BatchNorm2d):
    pass


class QBatchNorm3d(QBatchNormMixin, nn.BatchNorm3d):
    pass


class _QRelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, spec: ReluQuant):
        y = torch.relu(x)
        if spec.k_a is not None:
            y = Q(y, spec.k_a)
        ctx.save_for_backward(x > 0)
        ctx.spec = spec
        return y

    @staticmethod
    def backward(ctx, e):
        (positive,) = ctx.saved_tensors
        if ctx.spec.k_e1 is not None:
            e = SQ(e, ctx.spec.k_e1)
        return e * positive, None


class QReLU(nn.ReLU):
    """ReLU with WAGEUBN's QA forward and QE1 backward (never in place: the input is kept for relu')."""

    int8_method: object

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _QRelu.apply(x, self.int8_method.relu_quant)

    @torch.no_grad()
    def observe_forward(self, inputs: tuple, output: torch.Tensor) -> dict[str, Pair]:
        """{"A": (relu(x), the quantized activation)}."""
        return {"A": (torch.relu(inputs[0]), output)}

    @torch.no_grad()
    def observe_backward(self, e: torch.Tensor) -> dict[str, Pair]:
        """{"E1": (the error entering the activation, SQ(e, k_e1))}."""
        k = self.int8_method.relu_quant.k_e1
        return {"E1": (e, e if k is None else SQ(e, k))}


# float class -> quantized class, for Method.module_swaps
BN_SWAPS = {nn.BatchNorm1d: QBatchNorm1d, nn.BatchNorm2d: QBatchNorm2d, nn.BatchNorm3d: QBatchNorm3d}
RELU_SWAPS = {nn.ReLU: QReLU}
