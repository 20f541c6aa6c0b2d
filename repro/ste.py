"""Autograd helpers for simulated quantization: quantize one direction, pass the other straight through.

Functions:
    ste(x, f)         forward f(x), backward identity (the straight-through estimator, WAGEUBN eq. 1)
    grad_quant(x, f)  forward identity, backward f(grad): quantizes the gradient flowing into x
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Fn = Callable[[torch.Tensor], torch.Tensor]


class _Ste(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, f):
        return f(x.detach())

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GradQuant(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, f):
        ctx.f = f
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return ctx.f(g), None


def ste(x: torch.Tensor, f: Fn) -> torch.Tensor:
    return _Ste.apply(x, f)


def grad_quant(x: torch.Tensor, f: Fn) -> torch.Tensor:
    return _GradQuant.apply(x, f)
