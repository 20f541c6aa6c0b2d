"""RunRecorder, the hook every harness run carries: it times each train_step, keeps the losses and the
last validation's metrics, checks every loss before its backward pass, and saves what it recorded into
checkpoints so a resumed run's numbers cover the whole run (tasks.runner explains what a run records)."""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

import repro
from tasks.bad_data import SKIP_LOG, read_skip_log
from tasks.registry import HOOKS

RECORDER_KEY = "repro_recorder"  # checkpoint entry: what RunRecorder has recorded so far


def check_loss(loss: torch.Tensor) -> None:
    """Stop before the backward pass when the loss is NaN/Inf (on any rank, so no rank hangs)."""
    finite = torch.isfinite(loss.detach()).float()
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(finite, op=dist.ReduceOp.MIN)
    if finite.item() < 1:
        raise repro.NonFiniteError(f"non-finite training loss ({loss.item()})")


@HOOKS.register_module()
class RunRecorder(Hook):
    """Times train_step per iteration, keeps the losses and the last validation's metrics, and checks
    every loss before its backward pass (check_loss around the model's parse_losses, which sums the
    loss dict in every MMEngine model, so it covers classifiers and detectors alike).

    Priority HIGHEST: its before_train_iter runs first and its after_train_iter right after train_step,
    so the time is train_step (plus the other hooks' light before_train_iter work).

    What it has recorded goes into every checkpoint and comes back on resume, so a resumed run's final
    loss and time per iteration cover the iterations trained before the resume too. It also points the
    datasets' skip policies (tasks.bad_data) at the run's skip log, and knows where the run is (`phase`,
    for the out-of-memory line).
    """

    priority = "HIGHEST"

    def __init__(self, warmup: int = 3):
        self.warmup = warmup
        self.times: list[float] = []
        self.epoch_losses: list[float] = []
        self.epoch_mean: float | None = None
        self.metrics: dict[str, float] = {}
        self.per_sample: dict[str, list] = {}  # what a metric keeps image by image (its `per_sample`)
        self.validated = False
        self.phase = "before training"
        self.skip_policies: list = []
        self.skip_log: str | None = None
        self._t0 = 0.0
        self._epoch_done = False
        self._resumed_losses: list[float] | None = None

    def before_run(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        parse = model.parse_losses

        def checked(losses):
            loss, log_vars = parse(losses)
            check_loss(loss)
            return loss, log_vars

        model.parse_losses = checked
        # before the loaders start their workers, which inherit the log path
        self.skip_log = os.path.join(runner.work_dir, SKIP_LOG)
        loops = [runner.train_loop, getattr(runner, "_val_loop", None)]
        for loop in loops:
            policy = getattr(getattr(getattr(loop, "dataloader", None), "dataset", None), "skip_policy", None)
            if policy is not None:
                policy.log_path = self.skip_log
                self.skip_policies.append(policy)

    def before_train_epoch(self, runner) -> None:
        self._epoch_done = False
        self.epoch_losses, self._resumed_losses = self._resumed_losses or [], None

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.phase = f"in training iteration {runner.iter + 1}"
        self._t0 = time.perf_counter()

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        self.times.append(time.perf_counter() - self._t0)
        if outputs and "loss" in outputs:
            self.epoch_losses.append(float(outputs["loss"].detach()))

    def after_train_epoch(self, runner) -> None:
        self._epoch_done = True
        if self.epoch_losses:
            self.epoch_mean = sum(self.epoch_losses) / len(self.epoch_losses)

    def before_val(self, runner) -> None:
        self.phase = "in validation"

    def after_val_epoch(self, runner, metrics=None) -> None:
        self.validated = True
        if metrics:
            self.metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        for metric in getattr(getattr(runner, "val_evaluator", None), "metrics", []):
            self.per_sample.update(getattr(metric, "per_sample", {}))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint[RECORDER_KEY] = {
            "times": list(self.times),
            "epoch_losses": list(self.epoch_losses),
            "epoch_mean": self.epoch_mean,
            "mid_epoch": not self._epoch_done,  # saved inside an epoch: its losses so far go on
        }

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = checkpoint.get(RECORDER_KEY)
        if state is None or not getattr(runner, "_resume", False):  # load_from: weights only
            return
        self.times = list(state["times"])
        self.epoch_mean = state["epoch_mean"]
        if state["mid_epoch"]:
            self._resumed_losses = list(state["epoch_losses"])

    def skipped_samples(self) -> list[str]:
        """ "path: reason" of every sample the datasets skipped (tasks.bad_data), each once, sorted."""
        found: dict[str, str] = read_skip_log(self.skip_log) if self.skip_log else {}
        for policy in self.skip_policies:
            for path, reason in policy.skipped.items():
                found.setdefault(path, reason)
        return [f"{path}: {reason}" for path, reason in sorted(found.items())]

    @property
    def final_loss(self) -> float | None:
        """The last epoch's mean loss; an iteration-based run (no epochs) has its last iteration's."""
        if self.epoch_mean is not None:
            return self.epoch_mean
        return self.epoch_losses[-1] if self.epoch_losses else None

    def ms_per_iter(self) -> float:
        timed = self.times[self.warmup :] if len(self.times) > self.warmup else self.times[-1:]
        return 1000.0 * sum(timed) / len(timed) if timed else float("nan")
