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

`StatsRecorderHook` (repro/stats_hook.py) is registered when this module is imported, so
``custom_imports=["repro.hooks"]`` brings both.
"""

from __future__ import annotations

from typing import Any

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.registry import HOOKS

from repro.layers import (
    load_method_state_dict,
    method_state_dict,
    quantize_model,
    quantized_layers,
)
from repro.lr_scaling import LayerLrScaling, layer_lr_factors
from repro.methods import build_method
from repro.stats_hook import StatsRecorderHook, spread  # noqa: F401 - registered here too, re-exported

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
        fuse_norm: bool = False,
        **options: Any,
    ):
        # Built here so that a bad method or option fails when the config is built, naming the choices.
        self.method = build_method(method, **options)
        self.skip = (skip,) if isinstance(skip, str) else tuple(skip)
        self.channels_last_out = channels_last_out  # see repro.layers.Int8Conv
        self.per_call_state = per_call_state  # see repro.layers.Int8Layer
        # off here (quantize_model's default is on): the kept table cells were trained with torch's BatchNorm,
        # and the fused one sums its floats in another order (repro.norm_act)
        self.fuse_norm = fuse_norm
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
                fuse_norm=self.fuse_norm,
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
