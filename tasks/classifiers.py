"""The classifier models the Runner builds for the top-1 tasks: a network with cross-entropy loss
(registered as ``tasks.ImageClassifier`` and ``tasks.VideoClassifier``)."""

from __future__ import annotations

from tasks.models import build_model
from tasks.registry import MODELS
from tasks.top1 import CrossEntropyClassifier
from tasks.video_models import build_video_model


@MODELS.register_module()
class ImageClassifier(CrossEntropyClassifier):
    """A classifier network of tasks.models (`arch`, its initialisation `init`) with cross-entropy loss."""

    def __init__(
        self, arch: str, num_classes: int, input_size: int, init: str | None = None, data_preprocessor=None
    ):
        super().__init__(data_preprocessor=data_preprocessor)
        self.arch = arch
        self.net = build_model(arch, num_classes, input_size, init=init)


@MODELS.register_module()
class VideoClassifier(CrossEntropyClassifier):
    """A video network of tasks.video_models (`arch`) with cross-entropy loss."""

    def __init__(self, arch: str, num_classes: int, data_preprocessor=None):
        super().__init__(data_preprocessor=data_preprocessor)
        self.arch = arch
        self.net = build_video_model(arch, num_classes)
