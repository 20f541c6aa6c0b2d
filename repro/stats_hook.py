"""`StatsRecorderHook` records activation, weight and gradient statistics (repro.recorder) and the
training curves of a run without changing it:

    custom_hooks = [dict(type="Int8TrainingHook", method="ui8"),
                    dict(type="StatsRecorderHook", layers=["features.9.conv.2"], every=10, out="stats")]
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from repro.layers import layer_quantizers, quantized_layers
from repro.lr_scaling import layer_lr_factors
from repro.recorder import StatsRecorder

STATE_KEY = "repro_stats"  # under the checkpoint's meta


@HOOKS.register_module()
class StatsRecorderHook(Hook):
    """A StatsRecorder (repro.recorder; its arguments pass through) around the training iterations it
    wants, plus the run's curves: the training loss, the learning rate and the mean of the layers'
    learning-rate factors (UI8's phi) every `curve_every` iterations, and the metrics of every validation.

    `times` N records N iterations spread evenly over the run (instead of `iterations` / `every`; 0 records
    none: curves only); `eval_times` N evaluates on the validation set N times over the run besides the
    run's own validations. Those evaluations leave the run as it was: torch's random state and every
    layer's method state are restored and the model goes back to training mode, so the run trains as
    without the hook. With `out`, records.json (the records and the curves) and samples.npz are written
    there after the run, and also when it stops on an exception (a diverged run keeps what led to it).
    What it has recorded goes into the run's checkpoints, so a run resumed from one records the whole run.
    """

    priority = "NORMAL"

    def __init__(
        self,
        out: str | None = None,
        times: int | None = None,
        eval_times: int = 0,
        curve_every: int = 1,
        **recorder: Any,
    ):
        self.out, self.times, self.eval_times = out, times, int(eval_times)
        self.curve_every = max(1, int(curve_every))
        self.recorder_args = recorder
        self.recorder: StatsRecorder | None = None
        self.eval_every = 0
        self.curves: dict[str, list] = {"iteration": [], "loss": [], "lr": [], "lr_scale": [], "val": []}

    @staticmethod
    def _model(runner):
        return runner.model.module if is_model_wrapper(runner.model) else runner.model

    def before_run(self, runner) -> None:
        if self.recorder is not None:
            return
        args = dict(self.recorder_args)
        if self.times is not None:
            args["iterations"] = spread(self.times, runner.max_iters)
        self.recorder = StatsRecorder(self._model(runner), **args)
        if self.eval_times:
            self.eval_every = max(1, runner.max_iters // (self.eval_times + 1))
        loop = runner.train_loop
        run_iter = loop.run_iter

        def saving_run_iter(*args, **kwargs):
            try:
                return run_iter(*args, **kwargs)
            except BaseException:  # divergence (repro.NonFiniteError), Ctrl-C: keep what was recorded
                self.recorder.stop()
                if self.out is not None:
                    self.save(self.out)
                raise

        loop.run_iter = saving_run_iter

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self.recorder.start(runner.iter)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self.recorder.stop()
        it = runner.iter  # the iteration that just ran (the loop counts it after the hooks)
        if it % self.curve_every == 0 or it + 1 == runner.max_iters:
            loss = outputs.get("loss") if outputs else None
            factors = layer_lr_factors(self._model(runner))
            self.curves["iteration"].append(it)
            self.curves["loss"].append(None if loss is None else float(loss.detach()))
            self.curves["lr"].append(_first_lr(runner))
            self.curves["lr_scale"].append(sum(factors.values()) / len(factors) if factors else 1.0)
        if self.eval_every and (it + 1) % self.eval_every == 0 and it + 1 < runner.max_iters:
            metrics = self._evaluate(runner)
            if metrics is not None:
                self.curves["val"].append({"iteration": it + 1, "epoch": runner.epoch, **metrics})

    def after_val_epoch(self, runner, metrics=None) -> None:
        if metrics:
            scalars = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
            self.curves["val"].append({"iteration": runner.iter, "epoch": runner.epoch, **scalars})

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        # JSON text and tensors: what a weights_only load accepts
        checkpoint.setdefault("meta", {})[STATE_KEY] = {
            "records": json.dumps(self.recorder.records),
            "samples": {k: torch.tensor(v) for k, v in self.recorder.samples.items()},
            "curves": json.dumps(self.curves),
        }

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = (checkpoint.get("meta") or {}).get(STATE_KEY)
        if state is None or self.recorder is None:  # a checkpoint of a run without the hook, or a load_from
            return
        self.recorder.records = json.loads(state["records"])
        self.recorder.samples = {k: v.numpy() for k, v in state["samples"].items()}
        self.curves = json.loads(state["curves"])

    def after_run(self, runner) -> None:
        if self.out is not None:
            self.save(self.out)

    def save(self, folder: str | Path) -> None:
        self.recorder.save(folder, extra={"curves": self.curves})

    def _evaluate(self, runner) -> dict[str, float] | None:
        loop = getattr(runner, "val_loop", None)
        if loop is None or not hasattr(loop, "dataloader"):
            return None
        model = runner.model
        quantizers = [q for m in quantized_layers(self._model(runner)).values() for q in layer_quantizers(m)]
        saved = [{k: copy.deepcopy(v) for k, v in vars(q).items() if k not in ("method", "opts")}
                 for q in quantizers]  # fmt: skip
        cuda = next(model.parameters()).is_cuda
        was_training = model.training
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if cuda else []), torch.no_grad():
            model.eval()
            for data in loop.dataloader:
                loop.evaluator.process(data_samples=model.val_step(data), data_batch=data)
            metrics = loop.evaluator.evaluate(len(loop.dataloader.dataset))
        model.train(was_training)
        for q, state in zip(quantizers, saved, strict=True):
            vars(q).update(state)
        return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def spread(times: int, max_iters: int) -> list[int]:
    """`times` iterations spread evenly over 0 .. max_iters - 1, both ends included."""
    if times <= 0 or max_iters <= 0:
        return []
    if times == 1:
        return [0]
    return sorted({round(i * (max_iters - 1) / (times - 1)) for i in range(times)})


def _first_lr(runner) -> float | None:
    wrapper = getattr(runner, "optim_wrapper", None)
    optimizer = getattr(wrapper, "optimizer", None)
    return float(optimizer.param_groups[0]["lr"]) if optimizer is not None else None
