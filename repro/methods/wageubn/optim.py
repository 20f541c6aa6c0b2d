"""WAGEUBN's quantized Momentum optimizer with a fixed-point learning rate (eq. 19-24, Algorithm 2).

For a fixed-point parameter W (quantized layers' weights, quantized BN's gamma and beta) with quantized
gradient g_q (CQ for W, Q(., 15) for gamma/beta, applied in the backward pass):

    Acc_i   = Mom * Acc_{i-1,q} + g_q        (eq. 20)
    Acc_i,q = Q(Acc_i, kAcc)                 (eq. 21), the stored accumulation
    W       = Q(W - lr_q * Acc_i, kWU)       (eq. 23; W is stored with kWU bits, eq. 9)

lr_q = Q(lr, klr) of the learning rate the scheduler put in the parameter's group
(fixed_point.quantized_lr). The update uses the unquantized Acc_i and the stored accumulation is
Acc_i,q, as eq. 23 and the authors' code (the momentum slot is quantized after the step) do; the
weights are re-stored with Q(W, kWU) unclipped, as the authors' code (fBits(w, 24)), so gamma can exceed 1.
No weight decay on fixed-point parameters: the paper's update has none (its authors' code adds 1e-4 L2
to the loss before CQ, where, next to max|g| normalization, it falls below CQ's resolution).
Every other parameter (the full-precision first and last layers) takes a float momentum step with the
same Mom and lr_q and its group's weight decay, as the authors' one MomentumOptimizer does.

The optimizer takes over an existing optimizer's param groups (the same dicts, so schedulers and
checkpoints keep working); its state per parameter is `momentum_buffer`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from repro.methods.wageubn.fixed_point import quantized_lr


class FixedPointMomentum(torch.optim.Optimizer):
    def __init__(
        self,
        params,
        fixed_point: Iterable[torch.Tensor],
        lr: float = 26 * 2.0**-9,
        momentum: float = 0.75,
        k_acc: int = 13,
        k_wu: int = 24,
        k_lr: int = 10,
        weight_decay: float = 0.0,
    ):
        if momentum < 0:
            raise ValueError(f"momentum must be >= 0, got {momentum}")
        defaults = dict(lr=lr, momentum=momentum, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.fixed_point_ids = {id(p) for p in fixed_point}
        self.k_acc, self.k_wu, self.k_lr = k_acc, k_wu, k_lr

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr_q = quantized_lr(group["lr"], self.k_lr)
            mom = group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                state = self.state[p]
                fixed = id(p) in self.fixed_point_ids
                if not fixed and group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                buf = state.get("momentum_buffer")
                acc = g.clone() if buf is None else buf.mul(mom).add_(g)
                p.sub_(acc, alpha=lr_q)
                if fixed:  # Q(acc, kAcc) and Q(p, kWU) in place: the values Q gives, no copies
                    _quantize_in_place(acc, self.k_acc)
                    _quantize_in_place(p, self.k_wu)
                state["momentum_buffer"] = acc
        return loss


def _quantize_in_place(t: torch.Tensor, k: int) -> None:
    """t = Q(t, k) (fixed_point.Q: round(t * 2^(k-1)) / 2^(k-1)), in t's own memory."""
    n = 2.0 ** (k - 1)
    t.mul_(n).round_().div_(n)
