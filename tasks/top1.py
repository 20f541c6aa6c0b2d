"""What the top-1 tasks (classification, video) share: the classifier protocol, the top-1 metric, the
schedules, and the Runner config entries a recipe becomes.

A recipe (tasks.recipes) becomes the Runner config's schedule, optimizer, data loaders and hooks here;
the task adds its model and datasets. The INT8 switch is one hook,
``custom_hooks=[dict(type="Int8TrainingHook", method=..., **method_options)]``; ``fp32`` goes through
the same hook and the same layer classes. Top-1 is the accuracy (%) on the validation split after the
last epoch.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from mmengine.evaluator import BaseMetric
from mmengine.model import BaseModel
from mmengine.optim import MultiStepLR
from mmengine.optim.scheduler.param_scheduler import INF

import repro
from repro.methods import METHODS
from tasks import PROFILES
from tasks.datasets import DatasetNotFoundError
from tasks.registry import METRICS, PARAM_SCHEDULERS, scoped
from tasks.run_spec import RunSpec
from tasks.runner import RunRecorder, RunResult, check_choice, checked_options, run_config


class CrossEntropyClassifier(BaseModel):
    """A classifier network `self.net` (set by the subclass) with cross-entropy loss, in MMEngine's
    BaseModel protocol: mode "loss" -> {"loss"}, "predict" -> rows of (predicted class, label),
    "tensor" -> logits."""

    net: torch.nn.Module

    def forward(self, inputs, labels=None, mode: str = "tensor"):
        logits = self.net(inputs)
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels)}
        if mode == "predict":
            return torch.stack([logits.argmax(dim=1), labels], dim=1)
        return logits


@METRICS.register_module()
class Top1Accuracy(BaseMetric):
    """Top-1 accuracy in % over the whole validation split (gathered across ranks): key "cls/top1".

    It also keeps which images were right, in the split's order (`per_sample["val_correct"]`, on the
    rank that computes): the tables pair FP32 and INT8 runs image by image for the test set's error.
    Kept on the metric, not returned, so the log does not print 10,000 flags.
    """

    default_prefix = "cls"

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.per_sample: dict[str, list[int]] = {}

    def process(self, data_batch, data_samples) -> None:
        self.results.extend(int(row[0] == row[1]) for row in data_samples)

    def compute_metrics(self, results: list) -> dict:
        self.per_sample = {"val_correct": list(results)}
        return {"top1": 100.0 * sum(results) / max(1, len(results))}


def pack_flags(flags: list[int]) -> str:
    """0/1 flags as hex, 4 per digit (10,000 images: 2,500 characters in a cached cell)."""
    if not flags:
        return ""
    bits = "".join("1" if f else "0" for f in flags)
    return f"{len(bits)}:" + format(int(bits, 2), f"0{(len(bits) + 3) // 4}x")


def unpack_flags(text: str | None) -> list[int] | None:
    """pack_flags' inverse; None for a missing or empty value."""
    if not text or not isinstance(text, str) or ":" not in text:
        return None
    n, digits = text.split(":", 1)
    return [int(b) for b in format(int(digits, 16), f"0{int(n)}b")[-int(n) :]] if int(n) else []


@PARAM_SCHEDULERS.register_module()
class EpochMultiStepLR(MultiStepLR):
    """MultiStepLR whose milestones, in (fractional) epochs, become whole iterations when converted."""

    @classmethod
    def build_iter_from_epoch(cls, *args, milestones, epoch_length=None, begin=0, **kwargs):
        kwargs.pop("by_epoch", None)
        end = kwargs.pop("end", INF)
        iters = [max(1, round(m * epoch_length)) for m in milestones]
        return cls(
            *args,
            milestones=iters,
            begin=int(begin * epoch_length),
            end=end if end == INF else int(end * epoch_length),
            by_epoch=False,
            **kwargs,
        )


def param_scheduler(r: dict[str, Any]) -> list[dict]:
    if r["scheduler"] == "cosine":
        return [dict(type="CosineAnnealingLR", by_epoch=True, T_max=r["epochs"], convert_to_iter_based=True)]
    milestones = list(r["milestones"])
    if all(isinstance(m, float) and m < 1 for m in milestones):  # fractions of the run, in epochs
        milestones = [m * r["epochs"] for m in milestones]
    # by epoch, converted to iterations so that fractional milestones of short runs fall mid-epoch
    scheduler = dict(type=scoped("EpochMultiStepLR"), by_epoch=True, milestones=milestones, gamma=0.1)
    return [dict(scheduler, convert_to_iter_based=True)]


def dataloaders(r: dict[str, Any], dataset: dict[str, Any], val_batch_size: int) -> dict[str, dict]:
    """train_dataloader and val_dataloader: `dataset` (its type and arguments) read as the training split
    (shuffled, augmented as the recipe says, at most train_limit items) and as the validation split."""
    loader = dict(
        num_workers=r["num_workers"],
        persistent_workers=r["num_workers"] > 0,
        collate_fn=dict(type="default_collate"),
    )
    return dict(
        train_dataloader=dict(
            loader,
            batch_size=r["batch_size"],
            drop_last=True,
            sampler=dict(type="DefaultSampler", shuffle=True),
            dataset=dict(dataset, split="train", augment=r["augment"], limit=r["train_limit"]),
        ),
        val_dataloader=dict(
            loader,
            batch_size=val_batch_size,
            sampler=dict(type="DefaultSampler", shuffle=False),
            dataset=dict(dataset, split="val", limit=r["val_limit"]),
        ),
    )


def training_config(r: dict, method: str, method_options: dict | None, profile: str, seed: int) -> dict:
    """The Runner config entries every top-1 task shares: schedule, optimizer, hooks (the INT8 switch and
    the run recorder), seed, DDP wrapper and environment. The task adds its model, data and work_dir."""
    return dict(
        val_evaluator=dict(type=scoped("Top1Accuracy")),
        val_cfg=dict(),
        train_cfg=dict(by_epoch=True, max_epochs=r["epochs"], val_interval=r["val_interval"]),
        optim_wrapper=dict(
            optimizer=dict(type="SGD", lr=r["lr"], momentum=r["momentum"], weight_decay=r["weight_decay"])
        ),
        param_scheduler=param_scheduler(r),
        default_hooks=dict(
            logger=dict(type="LoggerHook", interval=r["log_interval"]),
            # a run whose work dir is kept gets the resumable checkpoint hook instead, whatever the
            # profile (tasks.checkpoints.configure_checkpoints); a temporary one saves none
            checkpoint=dict(type="CheckpointHook", interval=1, max_keep_ckpts=2)
            if profile == "paper"
            else None,
        ),
        custom_hooks=[
            # channels_last_out: only torch's own ops follow these networks' convolutions, and they take
            # any layout (repro.layers.Int8Conv)
            dict(type="Int8TrainingHook", method=method, channels_last_out=True, **(method_options or {})),
            dict(type=scoped("RunRecorder"), warmup=r["warmup"]),
        ],
        randomness=dict(seed=seed),
        launcher="none",
        # used only when distributed; on a CPU-only machine DDP must not get device_ids (mmengine sets
        # them to [LOCAL_RANK] unless the wrapper config says otherwise)
        model_wrapper_cfg=dict(
            type="MMDistributedDataParallel",
            broadcast_buffers=False,
            find_unused_parameters=False,
            **({} if torch.cuda.is_available() else {"device_ids": None}),
        ),
        env_cfg=dict(
            cudnn_benchmark=False,
            dist_cfg=dict(backend="nccl" if torch.cuda.is_available() else "gloo"),
        ),
        log_level="WARNING" if profile == "smoke" else "INFO",
        default_scope="mmengine",
    )


def top1_recipe(
    spec: RunSpec, recipe: Callable[[str, str, str], dict], stand_in: Callable[[dict], str]
) -> tuple[dict[str, Any], str]:
    """The run's recipe with its method's overrides, and the dataset it reads: the paper's from the data
    root at 'paper' (none given: a DatasetNotFoundError), stand_in(recipe) elsewhere."""
    check_choice("method", spec.method, repro.list_methods())
    r = recipe(spec.model, spec.profile, spec.paper_dataset)
    r.update(METHODS[spec.method].recipe_overrides(spec.profile))
    if spec.profile != "paper":
        return r, stand_in(r)
    if spec.data_root is None:
        raise DatasetNotFoundError(
            f"profile 'paper' reads {spec.paper_dataset} from a data root: pass data_root / --data-root"
        )
    return r, spec.paper_dataset


def runner_config(
    spec: RunSpec, r: dict, model: dict, data: dict, work_dir: str | None, val_batch_size: int
) -> dict[str, Any]:
    """The Runner config (a plain dict) of a top-1 run: its model, data and the recipe's training."""
    return dict(
        model=model,
        work_dir=work_dir,
        experiment_name=(
            f"{spec.task}-{spec.model}-{spec.method}-{spec.profile}-s{spec.seed}-{uuid.uuid4().hex[:8]}"
        ),
        **dataloaders(r, data, val_batch_size=val_batch_size),
        **training_config(r, spec.method, spec.method_options, spec.profile, spec.seed),
    )


def top1_scores(recorder: RunRecorder, diverged: bool) -> dict[str, Any]:
    if diverged:
        return {"top1": None}
    flags = recorder.per_sample.get("val_correct")
    return {"top1": recorder.metrics.get("cls/top1"), "val_correct": pack_flags(flags) if flags else None}


def run_top1(
    spec: RunSpec,
    build_config: Callable[..., dict],
    *,
    models: list[str],
    paper_datasets: tuple[str, ...],
    work_dir: str | None,
    cfg_options: dict | None,
    skip_bad_samples: bool = False,
) -> RunResult:
    """`run` of a top-1 task: check the names and options (one-line ValueErrors listing the choices),
    then train build_config(...)'s Runner config through the shared harness."""
    check_choice("profile", spec.profile, PROFILES)
    check_choice("model", spec.model, models)
    spec = dataclasses.replace(spec, method_options=checked_options(spec.method, spec.method_options))
    check_choice("paper_dataset", spec.paper_dataset, paper_datasets)
    return run_config(
        lambda work: build_config(**spec.run_arguments(), work_dir=work),
        spec, work_dir=work_dir, cfg_options=cfg_options,
        dataset=lambda cfg: cfg.train_dataloader.dataset.dataset, scores=top1_scores,
        skip_bad_samples=skip_bad_samples,
    )  # fmt: skip
