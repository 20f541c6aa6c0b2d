"""mmengine hooks: `Int8TrainingHook` turns any Runner-based training into INT8 training.

    custom_hooks = [dict(type="Int8TrainingHook", method="daiq", k=1.0, A=0.8)]

The hook swaps the model's layers in `before_run`, which mmengine calls after it has built the
optimizer, the schedulers and any DDP wrapper and before it loads or resumes a checkpoint; the swap
keeps parameters and state_dict keys, so all of those stay valid. Method state (DAIQ's s_c, UI8's c and
d_c) is written into every checkpoint under "int8" and restored on resume. UI8's per-layer learning-rate
scaling is attached to the optimizer here and acts at every optimizer step. A method that brings its own
optimizer (Method.make_optimizer: WAGEUBN's quantized Momentum) gets it installed into the optim wrapper
here too, over the same param groups, so schedulers keep driving its learning rate and resume loads its
state; Method.set_progress is told the iteration before each one (WAGEUBN's d_r schedule).

`StatsRecorderHook`, beside it, records activation, weight and gradient statistics (repro.recorder) and
the training curves of a run without changing it:

    custom_hooks = [dict(type="Int8TrainingHook", method="ui8"),
                    dict(type="StatsRecorderHook", layers=["features.9.conv.2"], every=10, out="stats")]
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import HOOKS

from repro.layers import (
    layer_quantizers,
    load_method_state_dict,
    method_state_dict,
    quantize_model,
    quantized_layers,
)
from repro.lr_scaling import LayerLrScaling, layer_lr_factors
from repro.methods import build_method
from repro.recorder import StatsRecorder

CHECKPOINT_KEY = "int8"
LR_SCALE_LOG_INTERVAL = 10  # iterations between two logs of UI8's mean learning-rate factor


@HOOKS.register_module()
class Int8TrainingHook(Hook):
    priority = "VERY_HIGH"

    def __init__(
        self,
        method: str = "daiq",
        skip=("first", "last"),
        channels_last_out: bool = False,
        per_call_state: bool = False,
        **options: Any,
    ):
        # Built here so that a bad method or option fails when the config is built, naming the choices.
        self.method = build_method(method, **options)
        self.skip = (skip,) if isinstance(skip, str) else tuple(skip)
        self.channels_last_out = channels_last_out  # see repro.layers.Int8Conv
        self.per_call_state = per_call_state  # see repro.layers.Int8Layer
        self._pending_state: dict[str, Any] | None = None
        self._scalings: list[LayerLrScaling] = []

    @staticmethod
    def _model(runner):
        return runner.model.module if is_model_wrapper(runner.model) else runner.model

    def before_run(self, runner) -> None:
        model = self._model(runner)
        if not quantized_layers(model):
            quantize_model(
                model,
                self.method,
                skip=self.skip,
                channels_last_out=self.channels_last_out,
                per_call_state=self.per_call_state,
            )
            count = len(quantized_layers(model))
            runner.logger.info(f"Int8TrainingHook: {self.method.name} on {count} layers ({self.method})")
        if self._pending_state is not None:
            self._restore(runner, self._pending_state)
            self._pending_state = None
        if not self._scalings:
            wrapper = getattr(runner, "optim_wrapper", None)
            if isinstance(wrapper, OptimWrapperDict):
                wrappers = list(wrapper.optim_wrappers.values())
            else:
                wrappers = [wrapper] if isinstance(wrapper, OptimWrapper) else []
            for w in wrappers:  # a method's own optimizer (WAGEUBN's quantized Momentum), before resume
                replacement = self.method.make_optimizer(model, w.optimizer)
                if replacement is not None:
                    w.optimizer = replacement
            self._scalings = [LayerLrScaling(model, w.optimizer) for w in wrappers]

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self.method.set_progress(runner.iter, runner.max_iters)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if not (self.every_n_train_iters(runner, LR_SCALE_LOG_INTERVAL) or self.is_last_train_iter(runner)):
            return  # reading the factors waits for the GPU
        factors = layer_lr_factors(self._model(runner))
        if factors and self.method.scales_learning_rates:
            runner.message_hub.update_scalar("train/int8_lr_scale", sum(factors.values()) / len(factors))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        checkpoint[CHECKPOINT_KEY] = {
            "method": self.method.name,
            "options": dict(self.method.opts),
            "layers": method_state_dict(self._model(runner)),
        }

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        state = checkpoint.get(CHECKPOINT_KEY)
        if state is None:  # e.g. load_from an FP32 checkpoint: weights only, fresh method state
            return
        if quantized_layers(self._model(runner)):
            self._restore(runner, state)
        else:
            self._pending_state = state

    def _restore(self, runner, state: dict[str, Any]) -> None:
        if state["method"] != self.method.name:
            runner.logger.warning(
                f"checkpoint method state is for {state['method']!r}, this run uses {self.method.name!r}: "
                "starting the method state afresh"
            )
            return
        load_method_state_dict(self._model(runner), state["layers"])


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
