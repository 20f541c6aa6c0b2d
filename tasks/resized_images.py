"""Resized package images kept in memory for the process: Fashion-MNIST / MNIST items decoded and resized
once, not on every read.

A table process trains its cells one after another, each reading its training prefix once per epoch and the
10,000 test images once; every read decoded the 28x28 image, converted it to three channels and resized it
with PIL (a ResNet-18 FP32 cell at 32 px: 68.0 s reading so, 65.1 s reading kept images; docs/data.md). The
uint8 images after those PIL steps are kept per (set, root, split, size), and ToTensor + Normalize run on them
as before: ToTensor of the uint8 HxWxC array does what it does for the PIL image (CHW, float, / 255), so the
items are the same bit for bit (tests/test_package_data.py). About 3 KB an image at 32 px, 17 KB at 75 px.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

_KEPT: dict[tuple, dict[int, np.ndarray]] = {}


def kept(key: tuple) -> dict[int, np.ndarray]:
    """The process's images of one (set, root, split, size): index -> uint8 HxWxC."""
    return _KEPT.setdefault(key, {})


def resized(images: dict[int, np.ndarray], index: int, pixels, pil_steps) -> np.ndarray:
    """Image `index` (its 28x28 uint8 pixels) after the PIL steps, made once."""
    image = images.get(index)
    if image is None:
        # 2-D uint8 is read as mode "L", the image torchvision's MNIST.__getitem__ makes (without the mode
        # argument Pillow deprecates)
        image = np.array(pil_steps(Image.fromarray(pixels.numpy())), dtype=np.uint8, copy=True)
        images[index] = image
    return image


def forget() -> None:
    """Drop every kept image (tests; a process that no longer trains)."""
    _KEPT.clear()
