"""Video classification (DAIQ Table 6): ResNet3D-18/50 on UCF-101 / Kinetics-400 or their stand-ins, top-1.

    from tasks.video import run
    result = run("r3d_18", "daiq", profile="embedded", paper_dataset="ucf101", seed=0)
    result.top1, result.ms_per_iter, result.diverged

This module holds the task's model (VideoClassifier over tasks.video_models: ``r3d_18``, ``r3d_50``),
its data (tasks.video_loader: UCF-101 split 1 and Kinetics-400 as frame folders from ``data_root`` at
profile ``paper``; the generated ``motion10`` and ``motion20`` standing in for them at ``embedded`` and
``smoke``) and the recipe (tasks/configs/video/<profile>.py); the training runs through the shared
harness (tasks.runner, tasks.top1). Every Conv3d but the stem runs its forward, input gradient and
weight gradient through the int8 backend; DAIQ's per-channel gradient scales lie along the
output-channel axis (axis 1 of G), exactly as in 2-D.

A run's scores: ``top1``, clip accuracy (%) on the validation split (UCF-101: split 1's test list)
after the last epoch, one centre clip per video (DAIQ does not say whether its top-1 is clip or video
level).
"""

from __future__ import annotations

import sys
from typing import Any

from tasks import PROFILES
from tasks.motion_sets import MOTION10, MOTION20
from tasks.recipes import recipe_entries
from tasks.registry import scoped
from tasks.run_spec import RunSpec
from tasks.runner import RunResult, check_choice
from tasks.top1 import run_top1, runner_config, top1_recipe
from tasks.video_lists import KINETICS400, UCF101
from tasks.video_loader import FrameClipDataset
from tasks.video_models import VIDEO_MODELS

TASK = "video"
# Bump when a recipe, model or stand-in dataset changes what a run measures (the tables' cache key).
RECIPE_VERSION = "4"
MODEL_RECIPE_VERSIONS = {"r3d_18": "5"}  # 5: lr 0.005 at the embedded profile (0.0125 was unstable)
PAPER_DATASETS = (UCF101, KINETICS400)
EMBEDDED_STAND_INS = {UCF101: MOTION10, KINETICS400: MOTION20}


def recipe(model: str, profile: str, paper_dataset: str) -> dict[str, Any]:
    """The training recipe: clip_len, input_size, epochs, batch_size, lr, weight_decay, milestones, ..."""
    check_choice("model", model, list(VIDEO_MODELS))
    check_choice("profile", profile, PROFILES)
    check_choice("paper_dataset", paper_dataset, PAPER_DATASETS)
    r = recipe_entries(TASK, profile, model, paper_dataset)
    r["val_interval"] = r["val_interval"] or r["epochs"]
    return r


def build_config(
    model: str,
    method: str,
    profile: str = "embedded",
    seed: int = 0,
    method_options: dict | None = None,
    paper_dataset: str = UCF101,
    data_root: str | None = None,
    work_dir: str | None = None,
) -> dict[str, Any]:
    """The Runner config (a plain dict) of one run; `run` merges cfg_options into it and trains."""
    spec = RunSpec(TASK, model, method, profile, paper_dataset, seed, method_options or {}, data_root)
    r, dataset = top1_recipe(spec, recipe, stand_in=lambda r: EMBEDDED_STAND_INS[paper_dataset])
    data = dict(
        type=scoped("FrameClipDataset"),
        dataset=dataset,
        root=data_root,
        clip_len=r["clip_len"],
        frame_interval=r["frame_interval"],
        input_size=r["input_size"],
        resize=r["resize"],
    )
    train_set = FrameClipDataset(dataset, "train", data_root)  # the class list (and a layout check)
    net = dict(type=scoped("VideoClassifier"), arch=model, num_classes=len(train_set.classes))
    return runner_config(spec, r, net, data, work_dir, val_batch_size=r["batch_size"])


def run(
    model: str,
    method: str,
    profile: str = "embedded",
    seed: int = 0,
    method_options: dict | None = None,
    paper_dataset: str = UCF101,
    data_root: str | None = None,
    work_dir: str | None = None,
    cfg_options: dict | None = None,
    skip_bad_samples: bool = False,
) -> RunResult:
    """Train one video model with one method at one profile; a diverged run is recorded, not raised.

    paper_dataset: "ucf101" or "kinetics400"; at profile "paper" read from data_root (frame folders,
    see tasks.video_lists), at "embedded" / "smoke" its generated stand-in (motion10 / motion20) is
    used, made once in the data cache (data_root, if given, is that cache). work_dir and skip_bad_samples
    as in tasks.classification.run.
    """
    spec = RunSpec(TASK, model, method, profile, paper_dataset, seed, method_options or {}, data_root)
    return run_top1(
        spec, build_config, models=list(VIDEO_MODELS), paper_datasets=PAPER_DATASETS, work_dir=work_dir,
        cfg_options=cfg_options, skip_bad_samples=skip_bad_samples,
    )  # fmt: skip


def main(argv=None) -> int:
    """`python -m tasks.video ...`: the `repro train` arguments plus --launcher (torchrun)."""
    from tasks.cli import task_main

    return task_main(TASK, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
