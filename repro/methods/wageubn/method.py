"""wageubn, wageubn-e2-16: WAGEUBN (Yang et al., Neural Networks 2020), every data path quantized.

Where each quantizer acts (sec. III-D/E, Algorithms 1-2; functions in fixed_point.py):
- W: the quantized conv/linear layers compute with QW(W, kW = 8) (eq. 10).
- BN: swapped BatchNorm (norm_layers.py): mu, sigma with 16 bits, x_hat with kBN = 16, gamma, beta
  with 8 bits (eq. 12-13; sec. IV-A).
- A: swapped ReLU: Q(relu(x), kA = 8) (eq. 14).
- E1: swapped ReLU, backward: SQ(e, 8) on the error entering the activation (eq. 15).
- E2: the error at each quantized layer's output (between conv and BN): Flag QE2 with kE2 = 8 (eq. 17;
  `wageubn`) or SQ(e, 16) (eq. 16; `wageubn-e2-16`, Table I's "16-bit E2"). Option `e2` picks it:
  "flag8", "shift16", or "shift8", the plain 8-bit QE2 SQ(e, 8) that WAGEUBN Figure 9 compares
  Flag QE2 with (sec. IV-E: it "causes the non-convergence").
- G: weight gradients CQ(gW) with kGC = 15 and d_r = 2^(k-1) (eq. 7, 18); g_gamma, g_beta Q(., 15).
- U: optim.FixedPointMomentum: Mom = 0.75 (kMom = 3), kAcc = 13, klr = 10, kWU = 24 (eq. 20-24).
The first and last Conv/Linear layers stay full precision (quantize_model's skip rule); every BatchNorm
and ReLU is swapped, as in the authors' resnet_model.py, where the first block's BN-ReLU after the
float first convolution is quantized.

Simulated (quantize-dequantize in float32, exact on these grids): no product here is int8 x int8.
QA has no clip (sec. IV-C: "no limitation on the data range"), so activations after ReLU exceed
127 * 2^-7, and the errors are 16-bit (SQ) or 9-bit flag values; only W is an int8 code.

Choices the paper leaves open, settled with the authors' TensorFlow code (github.com/yang-yk/wageubn):
- SQ clips to +-(1 - d(k)) as eq. 8 says (Quantize.py's fe1 clips to +-1; the paper's text wins).
- Flag QE2's fractional branch clips to [-1, 1] and its integer branch to +-127 (Quantize.py fe2).
- sigma_q gets epsilon 2^-15 after quantization (BatchNorm.py); inference uses the running statistics
  quantized the same way (BatchNorm.py).
- Stored weights and BN parameters are Q(., kWU) without clipping (imagenet_main.py fBits(w, 24)).
- The learning rate is Q(lr, klr) clipped to 1 - d(klr) (Quantize.py flr).
- Momentum 0.75 (paper, sec. IV-B: 3 x 2^-2); the code's _MOMENTUM is 1/4, the paper's number is used.
- d_r schedule: the paper gives k = 8 (d_r = 128) for epochs 0-30, 7 for 30-60, "and so on"; the code
  uses 128/128/32/8/2 at epochs 30/60/80/90. The paper's is used: k drops by one every 30 of 90 epochs,
  stretched onto the run's length (stage = floor(3 * iteration / max_iters)), so a 90-epoch run gets
  exactly the paper's 0-30 / 30-60 / 60-90 stages and a 2-epoch run changes d_r at 1/3 and 2/3.
- Table II ("single data quantization", FP32 update): `quantize_only` = W, BN, A, GW, E1 or E2 turns on
  that path alone, keeps the run's own float optimizer, and uses kBN = 8 for the BN row (its label,
  and the authors' Quantize.py default bitsBN_x = 8).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from repro.methods import register
from repro.methods.base import LayerQuantizer, Method
from repro.methods.wageubn.fixed_point import CQ, QW, SQ, Q, dr_for, flag_qe2
from repro.methods.wageubn.norm_layers import BN_SWAPS, RELU_SWAPS, BnQuant, QBatchNormMixin, ReluQuant
from repro.methods.wageubn.optim import FixedPointMomentum
from repro.ste import grad_quant, ste

PARTS = ("W", "BN", "A", "GW", "E1", "E2")
E2_FORMATS = {"flag8": lambda e: flag_qe2(e, 8), "shift16": lambda e: SQ(e, 16), "shift8": lambda e: SQ(e, 8)}
K_W, K_A, K_E1, K_GW, K_GC, K_GBN = 8, 8, 8, 8, 15, 15
K_MOM, K_ACC, K_LR, K_WU = 3, 13, 10, 24
MOMENTUM = 0.75  # 3 x 2^-2 (sec. IV-B)
DR_STAGES = 3  # k = 8, 7, 6 over epochs 0-30, 30-60, 60-90 of the paper's run


class WageubnQuantizer(LayerQuantizer):
    """One conv/linear layer: QW on the weight, CQ on its gradient, QE2 on the error at its output."""

    simulated = True

    def simulate(self, x: torch.Tensor, weight: torch.Tensor, op) -> torch.Tensor:
        m: Wageubn = self.method
        w = weight
        if "GW" in m.parts:
            w = grad_quant(w, lambda g: CQ(g, m.dr, K_GC))
        if "W" in m.parts:
            w = ste(w, lambda t: QW(t, K_W))
        y = op(x, w)
        if "E2" in m.parts:
            y = grad_quant(y, m.qe2)
        self.count_step()
        return y


@register
class Wageubn(Method):
    name = "wageubn"
    description = (
        "WAGEUBN full 8-bit: W, A, GW, E1 8-bit, E2 9-bit Flag QE2, BN x_hat 16-bit (gamma, beta 8), "
        "quantized Momentum, fixed-point lr; quantize_only=W|BN|A|GW|E1|E2 for Table II; "
        "e2=flag8|shift8|shift16; simulated "
        "(quantize-dequantize in float: activations and errors are wider than int8)"
    )
    defaults = {"quantize_only": None, "e2": "flag8"}
    layer_quantizer = WageubnQuantizer
    simulated = True

    def validate(self) -> None:
        only = self.opts["quantize_only"]
        if only is not None and only not in PARTS:
            raise ValueError(f"quantize_only must be one of {', '.join(PARTS)} (or None), got {only!r}")
        if self.opts["e2"] not in E2_FORMATS:
            raise ValueError(f"e2 must be one of {', '.join(E2_FORMATS)}, got {self.opts['e2']!r}")
        self.full = only is None
        self.parts = set(PARTS) if self.full else {only}
        self.bn_quant = BnQuant(k_bn=16 if self.full else 8, k_grad=K_GBN if self.full else None)
        self.relu_quant = ReluQuant(
            k_a=K_A if "A" in self.parts else None, k_e1=K_E1 if "E1" in self.parts else None
        )
        self.dr = dr_for(0, K_GW)

    def qe2(self, e: torch.Tensor) -> torch.Tensor:
        return E2_FORMATS[self.opts["e2"]](e)

    def module_swaps(self) -> dict[type[nn.Module], type[nn.Module]]:
        swaps: dict[type[nn.Module], type[nn.Module]] = {}
        if "BN" in self.parts:  # the full method or BN alone: a swapped batch norm quantizes its forward
            swaps.update(BN_SWAPS)
        if self.relu_quant.k_a is not None or self.relu_quant.k_e1 is not None:
            swaps.update(RELU_SWAPS)
        return swaps

    @classmethod
    def recipe_overrides(cls, profile: str) -> dict:
        """The paper profile trains with WAGEUBN's recipe (sec. IV-B): batch 128, lr 0.05 -> Q = 26 x 2^-9
        (the authors' initial rate; the task's x0.1 milestones give 3 and 1 x 2^-9 after, their code
        3, 2, 1 x 2^-9). The short profiles keep the task's recipe (lr quantized to klr bits)."""
        return {"lr": 0.05, "batch_size": 128} if profile == "paper" else {}

    def set_progress(self, iteration: int, max_iters: int) -> None:
        """d_r by training progress: the paper's 30-epoch stages stretched onto the run (module doc)."""
        stage = min(math.floor(DR_STAGES * iteration / max(max_iters, 1)), DR_STAGES - 1)
        self.dr = dr_for(stage, K_GW)

    def make_optimizer(
        self, model: nn.Module, optimizer: torch.optim.Optimizer
    ) -> torch.optim.Optimizer | None:
        """The quantized Momentum over `optimizer`'s param groups (full WAGEUBN; Table II keeps FP32 U)."""
        if not self.full:
            return None
        fixed = [
            p
            for m in model.modules()
            if isinstance(getattr(m, "int8", None), WageubnQuantizer) or isinstance(m, QBatchNormMixin)
            for p in m.parameters(recurse=False)
        ]
        with torch.no_grad():  # weights are stored as kWU-bit fixed point from now on (eq. 9)
            for p in fixed:
                p.copy_(Q(p, K_WU))
        for group in optimizer.param_groups:
            group["momentum"] = MOMENTUM
        return FixedPointMomentum(
            optimizer.param_groups, fixed, momentum=MOMENTUM, k_acc=K_ACC, k_wu=K_WU, k_lr=K_LR
        )


@register
class WageubnE2x16(Wageubn):
    name = "wageubn-e2-16"
    description = (
        "WAGEUBN with 16-bit E2 (SQ(e, 16) between conv and BN), otherwise as wageubn; "
        "simulated (quantize-dequantize in float)"
    )
    defaults = {**Wageubn.defaults, "e2": "shift16"}
