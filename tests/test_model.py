"""quantize_model on real torchvision models: what is swapped, what is kept, and that training works."""

import copy

import pytest
import torch
import torch.nn.functional as F
import torchvision
from torch import nn

from repro import LayerLrScaling, NonFiniteError, build_method, list_methods, quantize_model, quantized_layers
from repro.layers import Int8Layer, quantizable_layers

MODELS = {
    "resnet18": lambda: torchvision.models.resnet18(num_classes=10),
    "mobilenet_v2": lambda: torchvision.models.mobilenet_v2(num_classes=10),
}


@pytest.mark.parametrize("name", MODELS)
def test_swaps_all_but_first_and_last_keeping_parameters_and_keys(name):
    torch.manual_seed(0)
    model = MODELS[name]()
    layers = quantizable_layers(model)
    keys = list(model.state_dict())
    classes = {n: type(m) for n, m in layers}
    params = {n: p for n, p in model.named_parameters()}
    quantize_model(model, "daiq")
    swapped = quantized_layers(model)
    assert len(swapped) == len(layers) - 2
    assert layers[0][0] not in swapped and layers[-1][0] not in swapped
    assert list(model.state_dict()) == keys
    assert all(p is params[n] for n, p in model.named_parameters())
    # the swapped layers are still instances of their float classes (Conv2d, Linear)
    assert all(isinstance(m, classes[n]) and type(m) is not classes[n] for n, m in swapped.items())


def test_unknown_method_and_skip_are_clear_errors():
    model = MODELS["resnet18"]()
    with pytest.raises(ValueError, match="known methods"):
        quantize_model(model, "int3")
    with pytest.raises(ValueError, match="names no Conv/Linear layer"):
        quantize_model(model, "daiq", skip=("layer9",))
    quantize_model(model, "daiq", skip=("first", "last", "layer4"))
    assert not any(n.startswith("layer4") for n in quantized_layers(model))


def test_optimizer_made_before_the_swap_still_updates_the_weights():
    torch.manual_seed(0)
    model = MODELS["resnet18"]()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    quantize_model(model, "daiq")
    before = model.layer1[0].conv1.weight.detach().clone()
    F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    assert not torch.equal(before, model.layer1[0].conv1.weight)


def train_losses(model, method, steps=6, lr=0.05):
    torch.manual_seed(0)
    x = torch.randn(16, 3, 32, 32)
    y = torch.arange(16) % 10
    m = build_method(method)
    quantize_model(model, m)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt = (
        m.make_optimizer(model, opt) or opt
    )  # the method's own update (WAGEUBN, WAGE, FP8), as the hook does
    if method == "ui8":
        LayerLrScaling(model, opt)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("method", sorted(set(list_methods())))
def test_a_few_steps_on_a_fixed_batch_reduce_the_loss(method):
    torch.manual_seed(0)
    # DoReFa (clipped [0, 1] activations) and WAGE (2-bit weights, its own update) jump around at lr 0.05
    # and need a smaller rate and more steps to fit the batch (measured: 2.73 -> 0.19 and 2.26 -> 1.36)
    slow = method in ("dorefa", "wage")
    losses = train_losses(MODELS["resnet18"](), method, steps=15 if slow else 6, lr=0.01 if slow else 0.05)
    assert losses[-1] < 0.7 * losses[0], losses


def test_mobilenet_v2_trains_in_int8():
    torch.manual_seed(0)
    losses = train_losses(MODELS["mobilenet_v2"](), "daiq", steps=8)
    assert losses[-1] < losses[0], losses


def test_non_finite_gradient_raises_the_divergence_error():
    model = quantize_model(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)), "daiq")
    out = model(torch.randn(3, 4))
    with pytest.raises(NonFiniteError):
        (out * float("inf")).sum().backward()


def _scaled_sgd_net(phis):
    """A small ui8 model whose quantized layers report the given phis, and SGD on it, scaled."""
    torch.manual_seed(0)
    base = nn.Sequential(
        nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8), nn.Linear(8, 3)
    )
    scaled = quantize_model(base, "ui8", skip=())
    for layer, phi in zip(quantized_layers(scaled).values(), phis, strict=True):
        layer.int8.lr_scale_tensor = lambda phi=phi: torch.tensor(phi)
    opt = torch.optim.SGD(scaled.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    return scaled, opt, LayerLrScaling(scaled, opt)


def test_layer_lr_scaling_on_an_accelerator_writes_the_lerp_of_the_step_bit_for_bit():
    """Where phi stays on a device (no host read inside the step), after_step writes before + phi (p -
    before) into p as before.lerp_(p, phi) computes it."""
    p = torch.nn.Parameter(torch.randn(64, 33))
    before = p.detach().clone()
    with torch.no_grad():
        p.add_(torch.randn(64, 33) * 1e-2)
    phi = torch.tensor(0.37)
    want = before.clone().lerp_(p.detach(), phi)
    scaling = LayerLrScaling(nn.Linear(1, 1), torch.optim.SGD([p], lr=0.1))
    scaling._saved = [(p, before, phi)]
    scaling.after_step()
    assert torch.equal(p.detach(), want) and not torch.equal(want, before)


def test_layer_lr_scaling_leaves_the_optimizers_groups_as_they_were():
    """The step runs on groups split by phi; before and after it, and in a checkpoint taken after a step
    that raised, the optimizer has its own groups, with their learning rates."""
    model, opt, scaling = _scaled_sgd_net([1.0, 0.5, 0.25, 0.5])
    groups, layout = opt.param_groups, [list(g["params"]) for g in opt.param_groups]
    seen = []
    opt.register_step_pre_hook(lambda o, *_: seen.append(sorted(g["lr"] for g in o.param_groups)))
    F.cross_entropy(model(torch.randn(4, 6)), torch.arange(4) % 3).backward()
    opt.step()
    # the hooks run in order: the scaling's first; the two layers of phi 0.5 share a group
    assert seen == [[0.025, 0.05, 0.1]]
    assert opt.param_groups is groups and [list(g["params"]) for g in groups] == layout
    assert [g["lr"] for g in groups] == [0.1]

    scaling.before_step()  # a step that raised: the post hook never ran
    assert len(opt.param_groups) == 3
    state = opt.state_dict()
    assert opt.param_groups is groups and len(state["param_groups"]) == 1


def test_layer_lr_scaling_equals_per_layer_learning_rates():
    """phi(d_c) on the step == SGD (momentum, weight decay) with lr * phi in a group of that layer, bit for
    bit (phis exact in float32, so lr * phi is the same float both ways)."""
    phis = [1.0, 0.5, 0.25, 0.75]
    scaled, opt, _ = _scaled_sgd_net(phis)
    layers = list(quantized_layers(scaled).values())

    reference = copy.deepcopy(scaled)  # same quantized layers; per-layer groups instead
    ref_layers = list(quantized_layers(reference).values())
    groups = [
        {"params": list(m.parameters()), "lr": 0.1 * phi} for m, phi in zip(ref_layers, phis, strict=True)
    ]
    ref_opt = torch.optim.SGD(groups, lr=0.1, momentum=0.9, weight_decay=1e-3)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    for _ in range(4):
        for m, o in ((scaled, opt), (reference, ref_opt)):
            torch.manual_seed(1)  # same stochastic rounding in both
            o.zero_grad()
            F.cross_entropy(m(x), y).backward()
            o.step()
    for a, b in zip(scaled.parameters(), reference.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(isinstance(m, Int8Layer) for m in layers)
