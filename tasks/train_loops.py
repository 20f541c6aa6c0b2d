"""MMEngine's train loops, made to resume where a checkpoint was taken and to refuse data that cannot
fill one batch.

    cfg.train_cfg = resumable_loop(cfg.train_cfg)   # the harness does this for every run

What they add to EpochBasedTrainLoop / IterBasedTrainLoop:

- a resume inside an epoch goes on with that epoch's next batch: the batch sampler skips the batches
  already trained (indices only, nothing is loaded); MMEngine's own loop would start the epoch over;
- the RNG states saved in the checkpoint (tasks.checkpoints) are restored where they were taken: at an
  epoch's end before the next epoch's data loader starts, inside an epoch after its skipped batches;
- validation draws from copies of the generators (tasks.rng_states.rng_preserved), so a run validated
  between epochs and one resumed after that validation continue with the same random streams; a
  validation that was due at the checkpoint (the run may have been killed during it) runs on resume;
- a training loader without one full batch is one line (BadDataError) instead of MMEngine's scheduler
  error ("end should be larger than begin").

With loader workers (the paper profile's are persistent) each worker's own generator starts again from its
seed after a resume, at an epoch's end too, so the random augmentations after it differ from an
uninterrupted run's; everything else (data order, weights, optimizer, schedules, method state, stochastic
rounding) is the same. The workers' generators live in their processes and are not checkpointed.
"""

from __future__ import annotations

import logging
from typing import Any

from mmengine.logging import print_log
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

from tasks.bad_data import check_one_batch
from tasks.registry import LOOPS, scoped
from tasks.rng_states import rng_preserved, set_rng_state

EPOCH_LOOP = scoped("ResumableEpochBasedTrainLoop")
ITER_LOOP = scoped("ResumableIterBasedTrainLoop")


class SkippableBatches:
    """A batch sampler whose next pass leaves out its first `skip` batches (then skips nothing again)."""

    def __init__(self, batches):
        self.batches = batches
        self.skip = 0

    def __iter__(self):
        it = iter(self.batches)
        skip, self.skip = self.skip, 0
        for _ in range(skip):
            next(it, None)
        yield from it

    def __len__(self) -> int:
        return len(self.batches)

    def __getattr__(
        self, name: str
    ) -> Any:  # sampler, batch_size, drop_last (DistSamplerSeedHook reads them)
        return getattr(self.__dict__["batches"], name)


class _Resumable:
    """What both loops share: the pending RNG states of a resume and RNG-neutral validation."""

    pending_rng: dict | None = None
    runner: Any

    def _restore_rng(self) -> None:
        if self.pending_rng is not None:
            set_rng_state(self.pending_rng)
            self.pending_rng = None

    def _due_after(self, done: int, last: int) -> bool:
        """Whether validation is due after `done` epochs (or iterations) of `last`, as in MMEngine."""
        return (
            self.runner.val_loop is not None
            and done >= self.val_begin
            and (done % self.val_interval == 0 or done == last)
        )

    def _validate(self) -> None:
        with rng_preserved():
            self.runner.val_loop.run()


@LOOPS.register_module()
class ResumableEpochBasedTrainLoop(_Resumable, EpochBasedTrainLoop):
    def __init__(self, runner, dataloader, max_epochs: int, **kwargs):
        super().__init__(runner, dataloader, max_epochs, **kwargs)
        check_one_batch(self.dataloader)
        self._batches = None
        if self.dataloader.batch_sampler is not None:
            self._batches = SkippableBatches(self.dataloader.batch_sampler)
            # DataLoader forbids re-assigning its batch sampler; its iterators read this attribute
            object.__setattr__(self.dataloader, "batch_sampler", self._batches)

    def _val_due(self) -> bool:
        return self._due_after(self._epoch, self._max_epochs)

    def run(self):
        self.runner.call_hook("before_train")
        if 0 < self._iter == self._epoch * len(self.dataloader):  # resumed at an epoch's end
            self._decide_current_val_interval()
            if self._val_due():
                self._validate()
        while self._epoch < self._max_epochs and not self.stop_training:
            self.run_epoch()
            self._decide_current_val_interval()
            if self._val_due():
                self._validate()
        self.runner.call_hook("after_train")
        return self.runner.model

    def run_epoch(self) -> None:
        self.runner.call_hook("before_train_epoch")
        self.runner.model.train()
        done = max(0, self._iter - self._epoch * len(self.dataloader))  # trained before a resume
        if done and self._batches is None:
            raise RuntimeError("a resume inside an epoch needs a data loader with a batch sampler")
        if not done:
            self._restore_rng()
        if self._batches is not None:
            self._batches.skip = done
        batches = iter(self.dataloader)
        self._restore_rng()
        for idx, data_batch in enumerate(batches, start=done):
            self.run_iter(idx, data_batch)
        self.runner.call_hook("after_train_epoch")
        self._epoch += 1


@LOOPS.register_module()
class ResumableIterBasedTrainLoop(_Resumable, IterBasedTrainLoop):
    def __init__(self, runner, dataloader, max_iters: int, **kwargs):
        super().__init__(runner, dataloader, max_iters, **kwargs)
        check_one_batch(self.dataloader)

    def _val_due(self) -> bool:
        return self._due_after(self._iter, self._max_iters)

    def run(self):
        self.runner.call_hook("before_train")
        self.runner.call_hook("before_train_epoch")
        if self._iter > 0:
            print_log(f"skipping the {self._iter} batches trained before the resume", "current", logging.INFO)
            for _ in range(self._iter):  # loads them, as MMEngine does: any sampler, any pass
                next(self.dataloader_iterator)
            self._restore_rng()
            self._decide_current_val_interval()
            if self._val_due():
                self._validate()
        while self._iter < self._max_iters and not self.stop_training:
            self.runner.model.train()
            self.run_iter(next(self.dataloader_iterator))
            self._decide_current_val_interval()
            if self._val_due():
                self._validate()
        self.runner.call_hook("after_train_epoch")
        self.runner.call_hook("after_train")
        return self.runner.model


def resumable_loop(train_cfg: dict) -> dict:
    """The train_cfg with MMEngine's epoch- or iteration-based loop replaced by the resumable one (a loop
    of another type is kept as it is)."""
    cfg = dict(train_cfg)
    kind = cfg.get("type")
    if kind is None:
        kind = "EpochBasedTrainLoop" if cfg.pop("by_epoch", True) else "IterBasedTrainLoop"
    kind = {"EpochBasedTrainLoop": EPOCH_LOOP, "IterBasedTrainLoop": ITER_LOOP}.get(kind, kind)
    return dict(cfg, type=kind)
