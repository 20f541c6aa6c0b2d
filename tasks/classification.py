"""Image classification: the networks of tasks.models on ImageNet / CIFAR-10 or their stand-ins, top-1.

    from tasks.classification import run
    result = run("resnet18", "daiq", profile="embedded", seed=0)
    result.top1, result.ms_per_iter, result.diverged

This module holds the task's model (ImageClassifier), data (ClassificationDataset) and the recipe
(tasks/configs/classification/<profile>.py); the training runs through the shared harness
(tasks.runner, tasks.top1). At profile ``paper`` the data are ImageNet / CIFAR-10 from ``data_root``;
at ``embedded`` and ``smoke`` their stand-ins (tasks.datasets: ``digits`` for ImageNet, ``shapes10``
for CIFAR-10), made once in the data cache. The recipes and the sources of their numbers are in the
config files; a run's scores: ``top1``, the validation accuracy (%) after the last epoch.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

from mmengine.registry import DATASETS, MODELS
from torch.utils.data import Dataset
from torchvision import transforms as T
from torchvision.datasets import MNIST, FashionMNIST

import repro
from repro.methods import METHODS
from tasks import PROFILES
from tasks import datasets as D
from tasks import package_data as P
from tasks.bad_data import SkipPolicy
from tasks.models import MODELS as MODEL_SPECS
from tasks.models import build_model
from tasks.recipes import recipe_entries
from tasks.runner import RunResult, check_choice
from tasks.subsets import balanced_prefix
from tasks.top1 import CrossEntropyClassifier, dataloaders, run_top1, training_config

TASK = "classification"
# Bump when a recipe, model or stand-in dataset changes what a run measures: the table generator keys its
# cache of finished cells on it.
RECIPE_VERSION = "2"
PAPER_DATASETS = ("imagenet", "cifar10")


def recipe(model: str, profile: str, paper_dataset: str) -> dict[str, Any]:
    """The training recipe: input_size, epochs, batch_size, lr, weight_decay, scheduler, milestones, ..."""
    check_choice("model", model, list(MODEL_SPECS))
    check_choice("profile", profile, PROFILES)
    check_choice("paper_dataset", paper_dataset, PAPER_DATASETS)
    r = recipe_entries(TASK, profile, model, paper_dataset)
    r["input_size"] = max(r["input_size"], MODEL_SPECS[model].min_input)
    r["val_interval"] = r["val_interval"] or r["epochs"]
    return r


def input_size(model: str, profile: str, paper_dataset: str) -> int:
    """The square input size a model is trained at."""
    return recipe(model, profile, paper_dataset)["input_size"]


@MODELS.register_module(name="ReproImageClassifier", force=True)
class ImageClassifier(CrossEntropyClassifier):
    """A classifier network of tasks.models (`arch`, its initialisation `init`) with cross-entropy loss."""

    def __init__(
        self, arch: str, num_classes: int, input_size: int, init: str | None = None, data_preprocessor=None
    ):
        super().__init__(data_preprocessor=data_preprocessor)
        self.arch = arch
        self.net = build_model(arch, num_classes, input_size, init=init)


@DATASETS.register_module(name="ReproClassificationDataset", force=True)
class ClassificationDataset(Dataset):
    """One split of imagenet / cifar10 (from `root`) or digits / shapes10 (made in the cache `root`).

    Items are dict(inputs=float tensor CxHxW, normalised, labels=int). `limit` keeps a class-balanced
    prefix of that many images (the first ones of each class, in file order). An unreadable image is a
    BadDataError naming it; with `skip_bad` the next readable one is taken instead, and the skip is
    logged and listed (tasks.bad_data.SkipPolicy).
    """

    def __init__(
        self,
        dataset: str,
        split: str,
        root: str | None = None,
        input_size: int = 32,
        augment: bool = False,
        limit: int | None = None,
        skip_bad: bool = False,
    ):
        train = split == "train"
        mean, std = D.normalization(dataset, cache=root)
        steps: list = []
        if dataset == "imagenet":
            if train and augment:
                steps += [T.RandomResizedCrop(input_size), T.RandomHorizontalFlip()]
            else:
                steps += [T.Resize(round(input_size / 0.875)), T.CenterCrop(input_size)]
        elif (
            dataset in P.PACKAGES
        ):  # 28x28 grey: as three channels at the model's input size, no augmentation
            steps += [T.Grayscale(num_output_channels=3), T.Resize((input_size, input_size), antialias=True)]
        else:
            if train and augment:  # CIFAR-10: 4-px padded random crops and flips (He et al. 2016)
                steps += [T.RandomCrop(32, padding=4), T.RandomHorizontalFlip()]
            if dataset == D.DIGITS or input_size != 32:
                steps.append(T.Resize((input_size, input_size), antialias=True))
        transform = T.Compose([*steps, T.ToTensor(), T.Normalize(mean, std)])
        if dataset == "imagenet":
            if root is None:
                raise D.DatasetNotFoundError("ImageNet needs a data root (--data-root); none was given")
            self.base = D.image_folder(root, "train" if train else "val", transform)
        elif dataset == "cifar10":
            if root is None:
                raise D.DatasetNotFoundError("CIFAR-10 needs a data root (--data-root); none was given")
            self.base = D.cifar10(root, train, transform)
        elif dataset == D.DIGITS:
            self.base = D.image_folder(D.ensure_digits(root), "train" if train else "val", transform)
        elif dataset == D.SHAPES10:
            self.base = D.cifar10(D.ensure_shapes10(root), train, transform)
        elif dataset in P.PACKAGES:
            reader = FashionMNIST if dataset == P.FASHION_MNIST else MNIST
            self.base = reader(str(P.ensure(dataset, root)), train=train, transform=transform, download=False)
        else:
            known = ", ".join(["imagenet", "cifar10", D.DIGITS, D.SHAPES10, *P.PACKAGES])
            raise ValueError(f"unknown dataset {dataset!r}; choose from {known}")
        self.classes = list(self.base.classes)
        self.root = str(getattr(self.base, "root", root))  # where the split is read from, for error lines
        self.metainfo = {"dataset": dataset, "split": split, "classes": tuple(self.classes)}
        self.indices = list(range(len(self.base)))
        if limit is not None:
            self.indices = balanced_prefix(self.base.targets, len(self.classes), limit)
        self.skip_policy = SkipPolicy(skip_bad)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict:
        return self.skip_policy.fetch(self._item, i, len(self))

    def _item(self, i: int) -> dict:
        image, label = self.base[self.indices[i]]
        return {"inputs": image, "labels": label}


def build_config(
    model: str,
    method: str,
    profile: str = "embedded",
    seed: int = 0,
    method_options: dict | None = None,
    paper_dataset: str = "imagenet",
    data_root: str | None = None,
    work_dir: str | None = None,
) -> dict[str, Any]:
    """The Runner config (a plain dict) of one run; `run` merges cfg_options into it and trains."""
    check_choice("method", method, repro.list_methods())
    r = recipe(model, profile, paper_dataset)
    r.update(METHODS[method].recipe_overrides(profile))
    dataset = paper_dataset if profile == "paper" else r["stand_in"]
    if profile == "paper" and data_root is None:
        raise D.DatasetNotFoundError(
            f"profile 'paper' reads {paper_dataset} from a data root: pass data_root / --data-root"
        )
    data = dict(
        type="ReproClassificationDataset", dataset=dataset, root=data_root, input_size=r["input_size"]
    )
    return dict(
        model=dict(
            type="ReproImageClassifier",
            arch=r["arch"] or model,
            init=r["init"],
            num_classes=num_classes(dataset, data_root),
            input_size=r["input_size"],
        ),
        work_dir=work_dir,
        experiment_name=f"{TASK}-{model}-{method}-{profile}-s{seed}-{uuid.uuid4().hex[:8]}",
        **dataloaders(r, data, val_batch_size=max(r["batch_size"], 64)),
        **training_config(r, method, method_options, profile, seed),
    )


def num_classes(dataset: str, root: str | None) -> int:
    if dataset == "imagenet":
        folder = Path(root).expanduser() / "train"
        if not folder.is_dir():
            D.image_folder(root, "train")  # raises the one-line layout error
        return sum(1 for p in folder.iterdir() if p.is_dir())
    return 10


def run(
    model: str,
    method: str,
    profile: str = "embedded",
    seed: int = 0,
    method_options: dict | None = None,
    paper_dataset: str = "imagenet",
    data_root: str | None = None,
    work_dir: str | None = None,
    cfg_options: dict | None = None,
    skip_bad_samples: bool = False,
) -> RunResult:
    """Train one model with one method at one profile; a diverged run is recorded, not raised.

    paper_dataset names the dataset of the paper's table ("imagenet" or "cifar10"): at profile "paper"
    it is read from data_root; at "embedded" / "smoke" its stand-in is used (digits for ImageNet,
    shapes10 for CIFAR-10), made once in the data cache (data_root, if given, is that cache).
    Unknown model / method / profile / paper_dataset names are a ValueError listing the choices. With a
    work_dir the run keeps checkpoints there and resumes from its own (tasks.runner); skip_bad_samples
    skips unreadable images instead of stopping (the result lists them).
    """
    return run_top1(
        TASK, build_config, models=list(MODEL_SPECS), paper_datasets=PAPER_DATASETS, model=model,
        method=method, profile=profile, seed=seed, method_options=method_options,
        paper_dataset=paper_dataset, data_root=data_root, work_dir=work_dir, cfg_options=cfg_options,
        skip_bad_samples=skip_bad_samples,
    )  # fmt: skip


def main(argv=None) -> int:
    """`python -m tasks.classification ...`: the `repro train` arguments plus --launcher (torchrun)."""
    from tasks.cli import task_main

    return task_main(TASK, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
