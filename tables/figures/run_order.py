"""Which figure run to train first: the longest. Processes sharing the runs (`make figures JOBS=2`) each
take the next unclaimed run, so a long run taken last leaves one process training it alone while the
other waits; longest first bounds that tail by the shorter runs (docs/tables.md has the measured case).

A run's length is estimated before it runs, from what it computes: the network's forward FLOPs at the
recipe's input size (torch.utils.flop_counter on the meta device: nothing is allocated) times the images
it passes, a training image counted three times (forward and backward) and each validation once. A
method's or the recorder's own overhead is not counted; the order only has to be about right.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import torch
from torch.utils.flop_counter import FlopCounterMode

from tasks.models import MODELS
from tasks.package_data import SIZES

# a recipe without a limit takes a whole set, whose size is not known before it is loaded: the package
# sets' sizes (Fashion-MNIST, MNIST) are taken; every run of a profile shares its sets, so only the weight
# of validations against training can be off (at the paper profile: ImageNet's 1.28M / 50k)
TRAINING_IMAGES, VALIDATION_IMAGES = SIZES["train"], SIZES["t10k"]


@functools.cache
def forward_flops(model: str, input_size: int) -> int:
    """FLOPs of one image's forward pass (in eval mode: batch norm takes a batch of one)."""
    with torch.device("meta"):
        net = MODELS[model].build(10, input_size).eval()
        image = torch.empty(1, 3, input_size, input_size)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        net(image)
    return counter.get_total_flops()


def estimated_work(spec, profile: str) -> float:
    """A figure run's (tables.figures.runs.RunSpec) work in FLOPs: 3 x its training images x epochs plus
    its validations (`evals` spread over the run and the last one) x the validation set."""
    r = spec.recipe(profile)
    training = r["epochs"] * (r["train_limit"] or TRAINING_IMAGES)
    images = 3 * training + (spec.evals + 1) * (r["val_limit"] or VALIDATION_IMAGES)
    return forward_flops(spec.model, r["input_size"]) * images


def longest_first(names: Iterable[str], specs: Mapping[str, object], profile: str) -> list[str]:
    """`names` by estimated work, longest first; runs of equal work keep their order."""
    return sorted(names, key=lambda n: -estimated_work(specs[n], profile))
