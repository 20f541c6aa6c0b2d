"""Checkpoints a run resumes from as if it had not stopped: written atomically, holding every rank's
random number generators and the run's identity, at every epoch's end and, inside long epochs, every
``iter_interval`` iterations; at the short profiles only once a minute of training would be lost
(MIN_INTERVAL_S: a smoke run saves none, an embedded one a checkpoint an epoch at most).

    configure_checkpoints(cfg, profile)      # the checkpoint hook of a run whose work dir is kept
    runner = ResumableRunner.from_cfg(cfg)   # what the harness trains with (tasks.runner)

MMEngine's checkpoint already holds the model, the optimizer, the schedulers, the message hub, epoch and
iteration, and Int8TrainingHook adds the method state; ResumableRunner adds the rest of what an exact
resume needs (the data order comes from the sampler's seed and epoch, tasks.train_loops):

- every rank's RNG states (tasks.rng_states: Python, NumPy, torch's CPU generator, which keys the
  stochastic rounding, and the GPUs'), under meta["repro_rng"], restored by the train loop at the
  point they were saved;
- in a data-parallel run, every rank's INT8 method state under meta["repro_int8_ranks"]: each rank's
  statistics come from its own share of the batch (DAIQ's s_c, UI8's clip values), while
  Int8TrainingHook's entry holds rank 0's only;
- the run's identity (tasks.resume) under meta["repro_run"], so that no other run ever loads it;
- a checkpoint is written under a temporary name and renamed into place, so a kill never leaves half of
  one under a checkpoint's name.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from mmengine.config import Config
from mmengine.dist import all_gather_object, get_rank, get_world_size, is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.model import is_model_wrapper
from mmengine.runner import Runner

from atomic_files import write_file
from repro.layers import load_method_state_dict, method_state_dict
from tasks.registry import HOOKS, scoped
from tasks.rng_states import rng_state

RNG_KEY = "repro_rng"
INT8_RANKS_KEY = "repro_int8_ranks"
RUN_KEY = "repro_run"
# Checkpoints inside an epoch, every this many iterations, at the profiles whose epochs are long (ImageNet
# at batch 256: 5,005 iterations an epoch; Kinetics-400 at batch 128: about 1,880).
ITER_INTERVAL = {"paper": 1000}
# The least training time between two checkpoints: none at the paper profile; elsewhere a cell is minutes
# and a checkpoint a second (ResNet-50), so they are written once a minute of training would be lost.
MIN_INTERVAL_S = {"paper": 0.0}
DEFAULT_MIN_INTERVAL_S = 60.0
MAX_KEEP = 2  # the last two checkpoints: one may be mid-write when the run is killed
MID_EPOCH_INFO = "repro_mid_epoch_checkpoint"  # message-hub key: the mid-epoch file the next save replaces


def _publish(tmp: Path, final: Path) -> None:
    """Rename a fully written file into place, flushed to the disk first."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ResumableRunner(Runner):
    """MMEngine's Runner, whose checkpoints hold every rank's RNG states and the run's identity and are
    written atomically; resuming one hands the RNG states to the train loop (tasks.train_loops)."""

    resumed_from: str | None = None
    _loaded_meta: dict[str, Any] | None = None

    def save_checkpoint(
        self,
        out_dir: str,
        filename: str,
        file_client_args: dict | None = None,
        save_optimizer: bool = True,
        save_param_scheduler: bool = True,
        meta: dict | None = None,
        by_epoch: bool = True,
        backend_args: dict | None = None,
    ) -> None:
        meta = dict(meta or {})
        # every rank draws its own stochastic-rounding keys: all of them go into rank 0's file
        meta[RNG_KEY] = all_gather_object(rng_state()) if get_world_size() > 1 else [rng_state()]
        if get_world_size() > 1:
            meta[INT8_RANKS_KEY] = all_gather_object(method_state_dict(self._bare_model()))
        identity = self.cfg.get(RUN_KEY)
        if identity is not None:
            meta[RUN_KEY] = identity.to_dict() if hasattr(identity, "to_dict") else dict(identity)
        if not is_main_process():
            return
        args = (save_optimizer, save_param_scheduler, meta, by_epoch)
        if file_client_args is not None or backend_args is not None or not os.path.isdir(out_dir):
            super().save_checkpoint(out_dir, filename, file_client_args, *args, backend_args)
            return
        tmp = f".{filename}.tmp"
        super().save_checkpoint(out_dir, tmp, None, *args, None)
        _publish(Path(out_dir) / tmp, Path(out_dir) / filename)

    def load_checkpoint(self, filename: str, map_location="cpu", strict: bool = False, revise_keys=None):
        checkpoint = super().load_checkpoint(
            filename, map_location, strict, [(r"^module.", "")] if revise_keys is None else revise_keys
        )
        self._loaded_meta = checkpoint.get("meta", {})
        return checkpoint

    def resume(
        self, filename: str, resume_optimizer=True, resume_param_scheduler=True, map_location="default"
    ):
        super().resume(filename, resume_optimizer, resume_param_scheduler, map_location)
        states = (self._loaded_meta or {}).get(RNG_KEY) or []
        if len(states) == get_world_size():
            self.train_loop.pending_rng = states[get_rank()]
        else:
            self.logger.warning(
                f"{filename} holds the random states of {len(states)} ranks, this run has "
                f"{get_world_size()}: they start from the seed"
            )
        int8 = (self._loaded_meta or {}).get(INT8_RANKS_KEY) or []
        if len(int8) == get_world_size() > 1:
            load_method_state_dict(self._bare_model(), int8[get_rank()])
        self.resumed_from = filename

    def _bare_model(self):
        return self.model.module if is_model_wrapper(self.model) else self.model


@HOOKS.register_module()
class ResumableCheckpointHook(CheckpointHook):
    """CheckpointHook that also saves inside an epoch, every `iter_interval` iterations (an epoch-based
    run only), as iter_<N>.pth, each removed when the next checkpoint is written; and saves nothing
    until `min_interval_s` seconds have passed since the run started or last saved."""

    def __init__(self, *args, iter_interval: int | None = None, min_interval_s: float = 0.0, **kwargs):
        super().__init__(*args, **kwargs)
        self.iter_interval = iter_interval
        self.min_interval_s = float(min_interval_s)
        self._last_save = time.monotonic()

    def before_train(self, runner) -> None:
        super().before_train(runner)
        self._last_save = time.monotonic()

    def _due(self) -> bool:
        if time.monotonic() - self._last_save < self.min_interval_s:
            return False
        self._last_save = time.monotonic()
        return True

    def _save_checkpoint(self, runner) -> None:
        if self._due():
            super()._save_checkpoint(runner)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        super().after_train_iter(runner, batch_idx, data_batch, outputs)
        if not (self.by_epoch and self.iter_interval):
            return
        step = runner.iter + 1
        if step % self.iter_interval or batch_idx + 1 >= len(runner.train_dataloader) or not self._due():
            return  # not due, or the epoch's own checkpoint follows
        path = os.path.join(self.out_dir, f"iter_{step}.pth")
        previous = runner.message_hub.get_info(MID_EPOCH_INFO)
        runner.message_hub.update_info(MID_EPOCH_INFO, path)  # before the save: a resume from it knows it
        runner.save_checkpoint(
            self.out_dir, os.path.basename(path), self.file_client_args, save_optimizer=self.save_optimizer,
            save_param_scheduler=self.save_param_scheduler, meta=dict(epoch=runner.epoch, iter=step),
            by_epoch=False, backend_args=self.backend_args,
        )  # fmt: skip
        self._remove(previous)
        self.last_ckpt = path
        if is_main_process():
            write_file(os.path.join(runner.work_dir, "last_checkpoint"), path)

    def after_train_epoch(self, runner) -> None:
        before = self.last_ckpt
        super().after_train_epoch(runner)
        if self.last_ckpt != before:  # the epoch's checkpoint supersedes the mid-epoch one
            self._remove(runner.message_hub.get_info(MID_EPOCH_INFO))
            runner.message_hub.update_info(MID_EPOCH_INFO, None)

    def _remove(self, path: str | None) -> None:
        # the path a resumed checkpoint holds names the folder it was written in, which may since have
        # been copied or moved: only this run's own folder is cleaned
        path = path and os.path.join(self.out_dir, os.path.basename(path))
        if path and is_main_process() and os.path.isfile(path):
            os.remove(path)


def is_epoch_based(train_cfg: dict) -> bool:
    kind = train_cfg.get("type")
    if kind is None:
        return bool(train_cfg.get("by_epoch", True))
    return "IterBased" not in str(kind)


def configure_checkpoints(cfg: Config, profile: str) -> None:
    """Give the run ResumableCheckpointHook: at every epoch's end (the config's other checkpoint settings
    kept) and every ITER_INTERVAL[profile] iterations, at least MIN_INTERVAL_S[profile] seconds apart,
    keeping the last MAX_KEEP unless the config says."""
    hooks = dict(cfg.get("default_hooks") or {})
    old = dict(hooks.get("checkpoint") or {})
    old.pop("type", None)
    old.setdefault("max_keep_ckpts", MAX_KEEP)
    every = ITER_INTERVAL.get(profile)
    old.setdefault("min_interval_s", MIN_INTERVAL_S.get(profile, DEFAULT_MIN_INTERVAL_S))
    if is_epoch_based(cfg.train_cfg):
        hook = dict(old, by_epoch=True, interval=1, iter_interval=every)
    else:
        interval = old.get("interval") if old.get("by_epoch") is False else None
        interval = min(x for x in (interval, every, cfg.train_cfg.get("max_iters")) if x)
        hook = dict(old, by_epoch=False, interval=interval)
    hooks["checkpoint"] = dict(hook, type=scoped("ResumableCheckpointHook"))
    cfg.default_hooks = hooks
