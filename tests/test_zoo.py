"""The torchvision classification zoo in INT8: every family quantized with gq, daiq and ui8 trains a step,
and its output, loss and every gradient are bit-identical to the same step with kernels.reference's
products (the CPU backend's quantizers in both, so only the int8 products differ between the two runs).

A CI-sized selection, one small member per family, runs always; the rest of the zoo (every torchvision
classification model of at most 40M parameters) is marked slow.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.nn.functional as F
import torchvision

import kernels
from kernels import backend, cpu, reference
from repro import quantize_model

METHODS = ("gq", "daiq", "ui8")
PRODUCTS = ("conv_forward", "conv_input_grad", "conv_weight_grad", "linear_forward", "linear_input_grad")
PRODUCTS += ("linear_weight_grad",)
# the smallest input each model takes (inception_v3: its stem and pools; maxvit_t: 7x7 windows at 1/32)
INPUT_SIZE = {"inception_v3": 75, "maxvit_t": 224}
FAMILIES = (
    "resnet18",
    "resnext50_32x4d",
    "regnet_x_400mf",
    "regnet_y_400mf",
    "mobilenet_v2",
    "mobilenet_v3_small",
    "efficientnet_b0",
    "shufflenet_v2_x0_5",
    "densenet121",
    "convnext_tiny",
    "swin_t",
    "squeezenet1_1",
    "googlenet",
    "inception_v3",
)
MAX_PARAMS = 40_000_000


def channels_last(product):
    """`product`'s result laid out as kernels.cpu lays out a convolution's: channels-last, strides of
    size-1 dimensions included (a 1x1 map's strides decide which BatchNorm kernel sums the gradient, and
    in which order: the float sums would differ in their last bits, not the int8 products)."""

    def laid_out(*args, **kwargs):
        y = product(*args, **kwargs)
        n, c, *sp = y.shape
        return torch.empty((n, *sp, c), dtype=y.dtype).movedim(-1, 1).copy_(y)

    return laid_out


# kernels.cpu's quantizers and fused BatchNorm with kernels.reference's int8 products
FUSED_NORM = (
    "norm_act_supported",
    "norm_act_forward",
    "norm_act_backward",
    "norm_act_residual_supported",
    "norm_act_residual_backward",
)
REFERENCE = types.SimpleNamespace(
    **{name: getattr(cpu, name) for name in backend.REQUIRED + FUSED_NORM if name not in PRODUCTS},
    **{name: getattr(reference, name) for name in PRODUCTS},
)
REFERENCE.conv_forward = channels_last(reference.conv_forward)
REFERENCE.conv_input_grad = channels_last(reference.conv_input_grad)


def build(name: str) -> torch.nn.Module:
    kwargs = {"num_classes": 10}
    if name in ("googlenet", "inception_v3"):
        kwargs.update(aux_logits=False, init_weights=True)
    torch.manual_seed(0)
    return torchvision.models.get_model(name, **kwargs)


def rest_of_zoo() -> list[str]:
    names = []
    for name in torchvision.models.list_models(module=torchvision.models):
        if name in FAMILIES:
            continue
        weights = torchvision.models.get_model_weights(name)
        params = max(w.meta.get("num_params", 0) for w in weights)
        if params <= MAX_PARAMS:
            names.append(name)
    return sorted(names)


def one_step(model, size, products, monkeypatch) -> list[torch.Tensor]:
    """A training step's output, loss, input gradient and parameter gradients, with `products`."""
    monkeypatch.setattr(kernels, "get_backend", lambda device: products)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, size, size, generator=gen).requires_grad_()
    torch.manual_seed(2)  # the stochastic-rounding stream and dropout start alike in both runs
    out = model(x)
    loss = F.cross_entropy(out, torch.tensor([3, 7]))
    loss.backward()
    return [out.detach(), loss.detach(), x.grad] + [p.grad for p in model.parameters()]


def check(name: str, method: str, monkeypatch) -> None:
    model = build(name)
    size = INPUT_SIZE.get(name, 32)
    quantize_model(model, method)
    model.train()
    names = ["output", "loss", "input grad"] + [n for n, _ in model.named_parameters()]
    a = one_step(copy.deepcopy(model), size, cpu, monkeypatch)
    b = one_step(copy.deepcopy(model), size, REFERENCE, monkeypatch)
    assert torch.isfinite(a[1]), f"{name} {method}: loss {a[1]}"
    for what, x, y in zip(names, a, b, strict=True):
        assert (x is None) == (y is None), f"{name} {method}: {what} has a gradient in one run only"
        if x is not None:
            assert torch.equal(x, y), f"{name} {method}: {what} differs from the reference backend's"


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", FAMILIES)
def test_zoo_family_trains_a_step_as_the_reference(monkeypatch, name, method):
    check(name, method, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("name", rest_of_zoo())
def test_rest_of_zoo_trains_a_step_as_the_reference(monkeypatch, name, method):
    check(name, method, monkeypatch)
