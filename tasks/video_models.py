"""The video models of DAIQ Table 6, by name: ResNet3D-18 and ResNet3D-50, never pretrained.

    build_video_model("r3d_18", num_classes=101)

- ``r3d_18``: torchvision's ``r3d_18`` (Tran et al. 2018's R3D-18, ``weights=None``): a 3x7x7 stem
  (stride 1x2x2, no max pool), four stages of two basic blocks with full 3x3x3 convolutions (64 / 128 /
  256 / 512 channels, stride 2 in time and space at the start of stages 2-4), global average pooling
  and a linear classifier; 33.2M parameters.
- ``r3d_50``: the same network with bottleneck blocks (1x1x1, 3x3x3, 1x1x1; 3 / 4 / 6 / 3 blocks,
  expansion 4: Hara et al. 2018's ResNet-50 with 3-D kernels), assembled from torchvision's
  ``VideoResNet`` building blocks (``Bottleneck``, ``Conv3DSimple``, ``BasicStem``); 46.4M parameters
  torchvision ships no 3-D ResNet-50; DAIQ does not say which ResNet3D-50 it trained. This one keeps
  r3d_18's stem (no max pool), like torchvision's video ResNets, so the two rows differ only in depth
  and block type.

Every Conv3d (and the final Linear) is a quantizable layer: quantize_model skips the stem convolution
and the classifier (the "first" and "last" layers) and swaps all the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn
from torchvision.models.video import r3d_18
from torchvision.models.video.resnet import BasicStem, Bottleneck, Conv3DSimple, VideoResNet


@dataclass(frozen=True)
class VideoModelSpec:
    name: str
    build: Callable[[int], nn.Module]  # num_classes -> model
    paper_name: str


def resnet3d_50(num_classes: int) -> VideoResNet:
    """A 3-D bottleneck ResNet-50 (3-4-6-3) from torchvision's VideoResNet blocks."""
    return VideoResNet(Bottleneck, [Conv3DSimple] * 4, [3, 4, 6, 3], BasicStem, num_classes=num_classes)


VIDEO_MODELS: dict[str, VideoModelSpec] = {
    "r3d_18": VideoModelSpec("r3d_18", lambda n: r3d_18(weights=None, num_classes=n), "ResNet3D-18"),
    "r3d_50": VideoModelSpec("r3d_50", resnet3d_50, "ResNet3D-50"),
}


def build_video_model(name: str, num_classes: int) -> nn.Module:
    """A freshly initialised video model taking clips (N, 3, T, H, W); T, H, W >= 1 of any size."""
    if name not in VIDEO_MODELS:
        raise ValueError(f"unknown video model {name!r}; choose from {', '.join(VIDEO_MODELS)}")
    return VIDEO_MODELS[name].build(num_classes)
