"""The classification models, by name: torchvision's where it has them, and the CIFAR ResNet-20.

    build_model("resnet18", num_classes=10, input_size=32)

Never with pretrained weights. What each name is:

- alexnet, vgg16, resnet18, resnet34, resnet50, mobilenet_v2, inception_v3: torchvision's models
  (``weights=None``), with ``num_classes`` set. ``vgg16`` is the plain VGG-16 (no batch norm), the
  network the papers name; ``vgg16_bn`` is torchvision's VGG-16 with batch norm. Plain VGG-16 does not
  train from scratch within the embedded profile's budget, so the embedded and smoke profiles train
  ``vgg16_bn`` for the table row "VGG-16" (docs/measurements.md); the paper profile trains ``vgg16``.
  InceptionV3 has ``aux_logits=False`` and ``transform_input=False`` and needs inputs >= 75 px.
- AlexNet and VGG-16 end in an adaptive average pool to 6x6 / 7x7 before a 4096-4096 classifier, sized
  for 224 px inputs. When their feature map is 1x1 (AlexNet below 95 px, VGG-16 below 64 px: the
  embedded and smoke profiles), that pool would copy the one feature vector 36 / 49 times into the
  classifier; there the pool is 1x1 and the first classifier layer takes 256 / 512 features, which
  computes the same function class with 36 / 49 times fewer weights (see ``small_input_head``). The
  convolutional layers and the 4096-4096 classifier are torchvision's; at larger inputs (the paper
  profile's 224 px) the models are torchvision's unchanged.
- resnet20: the CIFAR ResNet of He et al. 2016 (section 4.2): a 3x3 conv with 16 channels, three stages
  of three basic blocks with 16/32/64 channels (stride 2 at the start of stages 2 and 3), global
  average pooling and a linear classifier; 6n+2 = 20 layers, 0.27M parameters. Shortcuts are option A
  of the paper (identity; where the shape changes, a stride-2 subsample padded with zero channels, no
  parameters), as He et al. used for CIFAR-10.

Minimum input sizes: 63 px for AlexNet (its strided convolutions and three max pools), 75 px for
InceptionV3, 32 px for VGG-16 (five max pools); the ResNets and MobileNetV2 take any size >= 32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
import torchvision
from torch import nn


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[int, int], nn.Module]  # (num_classes, input_size) -> model
    min_input: int
    paper_name: str
    note: str = ""


# ------------------------------------------------------------------------------------- CIFAR ResNet-20
class _ShortcutA(nn.Module):
    """He et al. 2016 option A: identity, or stride-2 subsampling with the extra channels zero-padded."""

    def __init__(self, in_planes: int, planes: int, stride: int):
        super().__init__()
        self.stride, self.pad = stride, planes - in_planes

    def forward(self, x):
        if self.stride != 1:
            x = x[:, :, :: self.stride, :: self.stride]
        if self.pad:
            x = F.pad(x, (0, 0, 0, 0, self.pad // 2, self.pad - self.pad // 2))
        return x


class BasicBlockA(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = _ShortcutA(in_planes, planes, stride)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet-(6n+2) for 32x32 inputs (He et al. 2016, section 4.2); n=3 is ResNet-20."""

    def __init__(self, n: int = 3, num_classes: int = 10, widths=(16, 32, 64)):
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        stages, in_planes = [], widths[0]
        for i, planes in enumerate(widths):
            blocks = []
            for j in range(n):
                blocks.append(BasicBlockA(in_planes, planes, stride=2 if i > 0 and j == 0 else 1))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(widths[-1], num_classes)
        for m in self.modules():  # He et al. 2015 initialisation, as the paper's CIFAR models
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(m.weight, mode="fan_out" if isinstance(m, nn.Conv2d) else "fan_in")

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet20(num_classes: int = 10) -> CifarResNet:
    return CifarResNet(n=3, num_classes=num_classes)


# ------------------------------------------------------------------------------------------ torchvision
def small_input_head(model: nn.Module, features: int) -> nn.Module:
    """Pool AlexNet's / VGG's 1x1 feature map to 1x1 (not 6x6 / 7x7) and size the first FC to match.

    Keeps the classifier's layers (4096, ReLU, dropout, 4096, ReLU, dropout, num_classes; AlexNet's with
    the dropouts first) and their initialisation; only the first Linear's input width changes.
    """
    model.avgpool = nn.AdaptiveAvgPool2d(1)
    i = next(i for i, m in enumerate(model.classifier) if isinstance(m, nn.Linear))
    old = model.classifier[i]
    new = nn.Linear(features, old.out_features)
    if isinstance(model, torchvision.models.VGG):  # torchvision's VGG initialises its Linears so
        nn.init.normal_(new.weight, 0, 0.01)
        nn.init.zeros_(new.bias)
    model.classifier[i] = new
    return model


def _no_inplace_relu_after_linear(model: nn.Module) -> nn.Module:
    """Make the ReLUs that directly follow a Linear out-of-place.

    repro's INT8 Linear returns a view of its output buffer, and autograd forbids modifying such a view
    in place; the classifiers of AlexNet and VGG apply ReLU(inplace=True) right after a Linear. The
    result is the same function.
    """
    for seq in model.modules():
        if isinstance(seq, nn.Sequential):
            prev = None
            for m in seq:
                if isinstance(m, nn.ReLU) and isinstance(prev, nn.Linear):
                    m.inplace = False
                prev = m
    return model


def _feature_map_is_1x1(model: nn.Module, input_size: int) -> bool:
    with torch.no_grad():
        return model.features(torch.zeros(1, 3, input_size, input_size)).shape[-2:] == (1, 1)


def _alexnet(num_classes: int, input_size: int) -> nn.Module:
    model = torchvision.models.alexnet(weights=None, num_classes=num_classes)
    return small_input_head(model, 256) if _feature_map_is_1x1(model, input_size) else model


def _vgg(batch_norm: bool) -> Callable[[int, int], nn.Module]:
    def build(num_classes: int, input_size: int) -> nn.Module:
        make = torchvision.models.vgg16_bn if batch_norm else torchvision.models.vgg16
        model = make(weights=None, num_classes=num_classes)
        return small_input_head(model, 512) if _feature_map_is_1x1(model, input_size) else model

    return build


def _tv(name: str, **kwargs) -> Callable[[int, int], nn.Module]:
    def build(num_classes: int, input_size: int) -> nn.Module:
        return getattr(torchvision.models, name)(weights=None, num_classes=num_classes, **kwargs)

    return build


MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        ModelSpec("alexnet", _alexnet, 63, "AlexNet", "torchvision; 1x1 pool at 1x1 maps"),
        ModelSpec("vgg16", _vgg(False), 32, "VGG-16", "torchvision, plain (no BN); 1x1 pool at 1x1 maps"),
        ModelSpec(
            "vgg16_bn",
            _vgg(True),
            32,
            "VGG-16",
            "torchvision, with BN: what the embedded and smoke profiles train for vgg16 (see module doc)",
        ),
        ModelSpec("resnet18", _tv("resnet18"), 32, "ResNet-18"),
        ModelSpec("resnet34", _tv("resnet34"), 32, "ResNet-34"),
        ModelSpec("resnet50", _tv("resnet50"), 32, "ResNet-50"),
        ModelSpec("mobilenet_v2", _tv("mobilenet_v2"), 32, "MobileNetV2"),
        ModelSpec(
            "inception_v3",
            _tv("inception_v3", aux_logits=False, transform_input=False, init_weights=True),
            75,
            "InceptionV3",
            "torchvision, aux_logits off",
        ),
        ModelSpec("resnet20", lambda nc, size: resnet20(nc), 32, "ResNet-20", "CIFAR ResNet, option A"),
    ]
}


def list_models() -> list[str]:
    return list(MODELS)


INITS = (None, "he", "zero-residual")


def he_init(model: nn.Module) -> nn.Module:
    """Re-initialise as torchvision initialises its ResNets and VGGs: Kaiming-normal (fan_out, ReLU)
    convolutions, N(0, 0.01) linear layers, zero biases, batch norm at (1, 0)."""
    for m in model.modules():
        if isinstance(m, nn.Conv1d | nn.Conv2d | nn.Conv3d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0, 0.01)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
    return model


def zero_residual_init(model: nn.Module) -> nn.Module:
    """Zero the scale of the last batch norm in each residual branch of a torchvision ResNet, so every
    block starts as the identity (Goyal et al. 2017, sec. 5.1; torchvision's ``zero_init_residual``)."""
    blocks = [
        m
        for m in model.modules()
        if isinstance(m, torchvision.models.resnet.Bottleneck | torchvision.models.resnet.BasicBlock)
    ]
    if not blocks:
        raise ValueError(f"init 'zero-residual' needs a torchvision ResNet, got {type(model).__name__}")
    for block in blocks:
        last = block.bn3 if isinstance(block, torchvision.models.resnet.Bottleneck) else block.bn2
        nn.init.zeros_(last.weight)
    return model


def build_model(name: str, num_classes: int, input_size: int, init: str | None = None) -> nn.Module:
    """A freshly initialised model (never pretrained) for `num_classes` and square inputs of `input_size`.

    init=None keeps the model's own initialisation; "he" applies `he_init`; "zero-residual"
    `zero_residual_init` (torchvision ResNets).
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; choose from {', '.join(map(str, INITS))}")
    spec = MODELS[name]
    if input_size < spec.min_input:
        raise ValueError(f"{name} needs inputs of at least {spec.min_input} px, got {input_size}")
    model = _no_inplace_relu_after_linear(spec.build(num_classes, input_size))
    if init == "he":
        return he_init(model)
    return zero_residual_init(model) if init == "zero-residual" else model
