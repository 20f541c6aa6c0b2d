"""Image classification: the networks of tasks.models on ImageNet / CIFAR-10 or their stand-ins, top-1.

    from tasks.classification import run
    result = run("resnet18", "daiq", profile="embedded", seed=0)
    result.top1, result.ms_per_iter, result.diverged

This module holds the task's recipe (its model is tasks.classifiers.ImageClassifier, its data
tasks.classification_dataset)
(tasks/configs/classification/<profile>.py); the training runs through the shared harness
(tasks.runner, tasks.top1). At profile ``paper`` the data are ImageNet / CIFAR-10 from ``data_root``; at
``embedded`` and ``smoke`` the stand-in each profile's config names (embedded: Fashion-MNIST from ``make
data``, tasks.package_data; smoke: the generated ``digits`` / ``shapes10`` of tasks.datasets). The
recipes and the sources of their numbers are in the config files; a run's scores: ``top1``, the
validation accuracy (%) after the last epoch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tasks import PROFILES
from tasks import datasets as D
from tasks.models import MODELS as MODEL_SPECS
from tasks.recipes import recipe_entries
from tasks.registry import scoped
from tasks.run_spec import RunSpec
from tasks.runner import RunResult, check_choice
from tasks.top1 import run_top1, runner_config, top1_recipe

TASK = "classification"
# Bump when a recipe, model or stand-in dataset changes what a run measures: the table generator keys its
# cache of finished cells on it.
RECIPE_VERSION = "2"
MODEL_RECIPE_VERSIONS = {"resnet50": "3"}  # 3: zero-initialised residual branches (embedded, smoke)
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
    spec = RunSpec(TASK, model, method, profile, paper_dataset, seed, method_options or {}, data_root)
    r, dataset = top1_recipe(spec, recipe, stand_in=lambda r: r["stand_in"])
    data = dict(
        type=scoped("ClassificationDataset"), dataset=dataset, root=data_root, input_size=r["input_size"]
    )
    net = dict(
        type=scoped("ImageClassifier"),
        arch=r["arch"] or model,
        init=r["init"],
        num_classes=num_classes(dataset, data_root),
        input_size=r["input_size"],
    )
    return runner_config(spec, r, net, data, work_dir, val_batch_size=max(r["batch_size"], 64))


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
    it is read from data_root; at "embedded" / "smoke" the stand-in the profile's config names is used
    (embedded: Fashion-MNIST; smoke: digits / shapes10), from the data cache (data_root, if given, is that
    cache).
    Unknown model / method / profile / paper_dataset names are a ValueError listing the choices. With a
    work_dir the run keeps checkpoints there and resumes from its own (tasks.runner); skip_bad_samples
    skips unreadable images instead of stopping (the result lists them).
    """
    spec = RunSpec(TASK, model, method, profile, paper_dataset, seed, method_options or {}, data_root)
    return run_top1(
        spec, build_config, models=list(MODEL_SPECS), paper_datasets=PAPER_DATASETS, work_dir=work_dir,
        cfg_options=cfg_options, skip_bad_samples=skip_bad_samples,
    )  # fmt: skip


def main(argv=None) -> int:
    """`python -m tasks.classification ...`: the `repro train` arguments plus --launcher (torchrun)."""
    from tasks.cli import task_main

    return task_main(TASK, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
