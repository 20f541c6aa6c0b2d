"""The training harness every task shares: build a Runner config, train it, record the run.

    result = run_config(build, task="classification", model="resnet18", method="daiq", ...)

A task module keeps only its model, data, metric and recipe and hands `run_config` a function that
builds its Runner config in a work folder. The harness makes that folder (a temporary one, removed
afterwards, unless the caller names one), merges ``cfg_options`` (mmengine's dotted keys, as
``--cfg-options``), starts the CPU process group under torchrun, trains, and returns one RunResult.

Divergence is a result, not an error: RunRecorder checks the loss before every backward pass (a NaN or
Inf stops the run with repro.NonFiniteError, on every rank at once), a quantizer meeting a non-finite
gradient raises the same error, and the run is recorded as diverged with no scores. Afterwards the
per-run globals mmengine keeps by experiment name (loggers with open files, message hubs, visualizers)
are released, so one process can train cell after cell.

What every run records: the iterations trained, the final training loss (the mean over the last
epoch's iterations, or the last iteration's loss for an iteration-based run), and ``ms_per_iter``, the
mean wall time of ``train_step`` (moving the batch to the device, forward, loss, backward with the
INT8 gradient quantizers, optimizer step), leaving out the first ``warmup`` iterations, data loading,
logging, the scheduler step and evaluation. The task turns the last validation's metrics into its
scores (top-1, mAP, ...).
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import time
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.logging import MessageHub, MMLogger
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import Runner
from mmengine.visualization import Visualizer

import repro
import repro.hooks  # noqa: F401  (registers Int8TrainingHook)
from repro.methods import METHODS


def check_choice(what: str, value: str, choices: Collection[str]) -> None:
    """A one-line ValueError listing the choices when `value` is not one of them."""
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}; choose from {', '.join(choices)}")


def checked_options(method: str, options: dict | None) -> dict[str, Any]:
    """The method's options typed as the method types them; a bad name, option or value is a ValueError
    here, before any data is read."""
    check_choice("method", method, repro.list_methods())
    built = repro.build_method(method, **(options or {}))
    return {name: built.opts[name] for name in options or {}}


def check_loss(loss: torch.Tensor) -> None:
    """Stop before the backward pass when the loss is NaN/Inf (on any rank, so no rank hangs)."""
    finite = torch.isfinite(loss.detach()).float()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    if finite.item() < 1:
        raise repro.NonFiniteError(f"non-finite training loss ({loss.item()})")


@HOOKS.register_module(name="ReproRunRecorder", force=True)
class RunRecorder(Hook):
    """Times train_step per iteration, keeps the losses and the last validation's metrics, and checks
    every loss before its backward pass (check_loss around the model's parse_losses, which sums the
    loss dict in every MMEngine model, so it covers classifiers and detectors alike).

    Priority HIGHEST: its before_train_iter runs first and its after_train_iter right after train_step,
    so the time is train_step (plus the other hooks' light before_train_iter work).
    """

    priority = "HIGHEST"

    def __init__(self, warmup: int = 3):
        self.warmup = warmup
        self.times: list[float] = []
        self.epoch_losses: list[float] = []
        self.epoch_mean: float | None = None
        self.metrics: dict[str, float] = {}
        self.validated = False
        self._t0 = 0.0

    def before_run(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        parse = model.parse_losses

        def checked(losses):
            loss, log_vars = parse(losses)
            check_loss(loss)
            return loss, log_vars

        model.parse_losses = checked

    def before_train_epoch(self, runner) -> None:
        self.epoch_losses = []

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._t0 = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.times.append(time.perf_counter() - self._t0)
        if outputs and "loss" in outputs:
            self.epoch_losses.append(float(outputs["loss"].detach()))

    def after_train_epoch(self, runner) -> None:
        if self.epoch_losses:
            self.epoch_mean = sum(self.epoch_losses) / len(self.epoch_losses)

    def after_val_epoch(self, runner, metrics=None) -> None:
        self.validated = True
        if metrics:
            self.metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}

    @property
    def final_loss(self) -> float | None:
        """The last epoch's mean loss; an iteration-based run (no epochs) has its last iteration's."""
        if self.epoch_mean is not None:
            return self.epoch_mean
        return self.epoch_losses[-1] if self.epoch_losses else None

    def ms_per_iter(self) -> float:
        timed = self.times[self.warmup :] if len(self.times) > self.warmup else self.times[-1:]
        return 1000.0 * sum(timed) / len(timed) if timed else float("nan")


@dataclass
class RunResult:
    """One training run of any task. `epochs` is the recipe's (None for an iteration-based run),
    `iters` the iterations actually trained; `scores` holds the task's metrics (classification and
    video: top1; detection: map, map_50, map_5095 and what they mean), None when the run diverged.

    Scores read as attributes (result.top1, result.map), and to_dict() puts them beside the other
    fields, as the tables' cache and `repro train --json` store them.
    """

    task: str
    model: str
    method: str
    profile: str
    paper_dataset: str
    dataset: str
    seed: int
    epochs: int | None
    iters: int
    final_loss: float | None
    diverged: bool
    ms_per_iter: float
    method_options: dict = field(default_factory=dict)
    simulated: bool = False
    scores: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        scores = self.__dict__.get("scores", {})
        if name in scores:
            return scores[name]
        raise AttributeError(f"{type(self).__name__} of task {self.__dict__.get('task')!r} has no {name!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("scores"))
        return out


def init_cpu_process_group(cfg: Config) -> None:
    """Under torchrun without CUDA, start the process group here: mmengine 0.10's pytorch launcher
    calls torch.cuda.set_device unconditionally; it skips its own init when a group exists."""
    if cfg.get("launcher", "none") == "none" or torch.cuda.is_available() or dist.is_initialized():
        return
    backend = cfg.get("env_cfg", {}).get("dist_cfg", {}).get("backend", "gloo")
    dist.init_process_group(backend="gloo" if backend == "nccl" else backend)


def release(name: str) -> None:
    """Drop the per-run globals mmengine keeps by experiment name (logger file handles, message hub)."""
    logger = MMLogger._instance_dict.pop(name, None)
    if logger is not None:
        for handler in list(logger.handlers):
            handler.close()
            logger.removeHandler(handler)
    MessageHub._instance_dict.pop(name, None)
    Visualizer._instance_dict.pop(name, None)


def train(cfg: Config) -> tuple[Runner, RunRecorder, bool]:
    """Build the Runner and train; returns (runner, recorder, diverged). The caller releases the run."""
    init_cpu_process_group(cfg)
    runner = Runner.from_cfg(cfg)
    diverged = False
    try:
        runner.train()
    except repro.NonFiniteError as err:
        diverged = True
        runner.logger.warning(f"diverged at iteration {runner.iter}: {err}")
    recorder = next(h for h in runner.hooks if isinstance(h, RunRecorder))
    return runner, recorder, diverged


def run_config(
    build: Callable[[str], Config | dict],
    *,
    task: str,
    model: str,
    method: str,
    method_options: dict,
    profile: str,
    paper_dataset: str,
    seed: int,
    work_dir: str | None,
    cfg_options: dict | None,
    dataset: Callable[[Config], str],
    scores: Callable[[RunRecorder, bool], dict[str, Any]],
) -> RunResult:
    """Train the config build(work_dir) makes (with a RunRecorder hook), cfg_options merged into it.

    `dataset(cfg)` names the data the run trained on; `scores(recorder, diverged)` gives the task's
    scores from the last validation. A temporary work_dir (work_dir None) is removed afterwards.
    """
    temp = work_dir is None
    work = tempfile.mkdtemp(prefix=f"repro-{task}-") if temp else work_dir
    runner = name = None
    try:
        built = build(str(work))
        cfg = built if isinstance(built, Config) else Config(built)
        if cfg_options:
            cfg.merge_from_dict(copy.deepcopy(cfg_options))
        name = cfg.experiment_name
        runner, recorder, diverged = train(cfg)
        epochs = cfg.train_cfg.get("max_epochs")
        return RunResult(
            task=task,
            model=model,
            method=method,
            profile=profile,
            paper_dataset=paper_dataset,
            dataset=dataset(cfg),
            seed=seed,
            epochs=None if epochs is None else int(epochs),
            iters=int(runner.iter),
            final_loss=None if diverged else recorder.final_loss,
            diverged=diverged,
            ms_per_iter=recorder.ms_per_iter(),
            method_options=method_options,
            simulated=METHODS[method].simulated,
            scores=scores(recorder, diverged),
        )
    finally:
        del runner
        if name is not None:
            release(name)
        if temp:
            shutil.rmtree(work, ignore_errors=True)


# How a score reads in a summary line, in this order.
SCORE_LABELS = {"top1": "top-1 {:.2f}%", "map_5095": "mAP@[.5:.95] {:.2f}", "map_50": "mAP@.5 {:.2f}"}


def summary(result: RunResult) -> str:
    """One human-readable line."""
    stand_in = "" if result.dataset == result.paper_dataset else f" standing in for {result.paper_dataset}"
    head = (
        f"{result.task} {result.model} {result.method} ({result.profile}, {result.dataset}{stand_in}, "
        f"seed {result.seed}):"
    )
    timing = f"{result.iters} iters, {result.ms_per_iter:.1f} ms/iter"
    if result.diverged:
        return f"{head} diverged after {timing}"
    scores = [
        label.format(result.scores[k])
        for k, label in SCORE_LABELS.items()
        if result.scores.get(k) is not None
    ]
    loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
    epochs = "" if result.epochs is None else f"{result.epochs} epochs, "
    return f"{head} {', '.join(scores) or 'no score'}, final loss {loss}, {epochs}{timing}"
