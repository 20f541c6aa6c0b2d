"""The training harness every task shares: build a Runner config, train it, record the run.

    spec = RunSpec("classification", "resnet18", "daiq", "embedded", "imagenet", seed=0)
    result = run_config(build, spec, work_dir=None, cfg_options=None, dataset=..., scores=...)

A task module keeps only its model, data, metric and recipe and hands `run_config` a function that
builds its Runner config in a work folder. The harness makes that folder (a temporary one, removed
afterwards, unless the caller names one), merges ``cfg_options`` (mmengine's dotted keys, as
``--cfg-options``), starts the CPU process group under torchrun, trains, and returns one RunResult.

A run in a kept work folder resumes by default: it writes checkpoints (tasks.checkpoints: every epoch,
and every 1,000 iterations at the paper profile) and, started again, goes on from the newest checkpoint
of the same run (tasks.resume; another run's checkpoint is never loaded) exactly where it stopped
(tasks.train_loops: the epoch's next batch, the saved RNG states). The result names the checkpoint it
resumed from.

Divergence is a result, not an error: RunRecorder checks the loss before every backward pass (a NaN or
Inf stops the run with repro.NonFiniteError, on every rank at once), a quantizer meeting a non-finite
gradient raises the same error, and the run is recorded as diverged with no scores; in a distributed run
the rank that meets it first stops the others (tasks.distributed), which record the same. Running out
of memory, or a failed peer rank, is a RunFailed with one line (tasks.out_of_memory): a failure, not a
divergence. Bad data is a BadDataError naming the file (tasks.bad_data); with ``skip_bad_samples`` the
datasets skip unreadable samples instead, and the result lists them. Afterwards the per-run globals
mmengine keeps by experiment name (loggers with open files, message hubs, visualizers) are released, so
one process can train cell after cell.

What every run records: the iterations trained, the final training loss (the mean over the last
epoch's iterations, or the last iteration's loss for an iteration-based run), and ``ms_per_iter``, the
mean wall time of ``train_step`` (moving the batch to the device, forward, loss, backward with the
INT8 gradient quantizers, optimizer step), leaving out the first ``warmup`` iterations, data loading,
logging, the scheduler step and evaluation. The task turns the last validation's metrics into its
scores (top-1, mAP, ...).
"""

from __future__ import annotations

import copy
import difflib
import gc
import hashlib
import inspect
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from mmengine.config import Config
from mmengine.logging import MessageHub, MMLogger
from mmengine.model import is_model_wrapper
from mmengine.registry import DATASETS
from mmengine.runner import Runner
from mmengine.visualization import Visualizer

import kernels
import repro
import repro.hooks  # noqa: F401  (registers Int8TrainingHook)
from repro.methods import METHODS
from tasks.bad_data import one_line_error
from tasks.checkpoints import RUN_KEY, ResumableRunner, configure_checkpoints
from tasks.distributed import (
    RankStop,
    init_cpu_process_group,
    is_distributed,
    is_peer_failure,
    peer_failure_reason,
)
from tasks.out_of_memory import RunFailed, is_out_of_memory, out_of_memory_line
from tasks.resume import checkpoint_to_resume, run_identity
from tasks.run_recorder import RunRecorder, check_loss  # noqa: F401 - check_loss: part of this API
from tasks.run_spec import RunSpec
from tasks.train_loops import resumable_loop


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


@dataclass
class RunResult:
    """One training run of any task. `epochs` is the recipe's (None for an iteration-based run),
    `iters` the iterations actually trained; `scores` holds the task's metrics (classification and
    video: top1; detection: map, map_50, map_5095 and what they mean), None when the run diverged.

    Scores read as attributes (result.top1, result.map), and to_dict() puts them beside the other
    fields, as the tables' cache and `repro train --json` store them. `resumed_from` names the checkpoint
    the run went on from (None: it trained from the start); `skipped_samples` lists the samples skipped
    under the skip policy ("path: reason").
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
    resumed_from: str | None = None
    skipped_samples: list[str] = field(default_factory=list)
    # where each method option came from, where a run merges several places ("config", "command line")
    method_options_from: dict[str, str] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        scores = self.__dict__.get("scores", {})
        if name in scores:
            return scores[name]
        raise AttributeError(f"{type(self).__name__} of task {self.__dict__.get('task')!r} has no {name!r}")

    @property
    def spec(self) -> RunSpec:
        """The run this is the result of (its data root is not kept in the result)."""
        return RunSpec(
            self.task, self.model, self.method, self.profile, self.paper_dataset, self.seed,
            dict(self.method_options),
        )  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(out.pop("scores"))
        return out


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
    """Build the Runner and train; returns (runner, recorder, diverged). The caller releases the run.

    A NaN/Inf on any rank is a divergence on every rank. Out of memory, or another rank's failure, raises
    RunFailed (one line); any other error is raised as it is, after the other ranks have been told.
    """
    init_cpu_process_group(cfg)
    stop = RankStop.begin()
    runner = ResumableRunner.from_cfg(cfg)
    diverged, failure = False, None
    try:
        runner.train()
    except repro.NonFiniteError as err:
        diverged = True
        runner.logger.warning(f"diverged at iteration {runner.iter}: {err}")
        stop.announce("diverged", f"diverged at iteration {runner.iter}: {one_line_error(err)}")
    except Exception as err:
        peer = _peer_stop(stop)
        if peer is not None and peer["kind"] == "diverged":
            diverged = True
            runner.logger.warning(f"rank {peer['rank']} {peer['message']}: this rank stops too")
        elif peer is not None:
            failure = f"rank {peer['rank']} failed: {peer['message']}"
        elif is_out_of_memory(err):
            failure = _out_of_memory(err, runner)
            stop.announce("failed", failure)
        elif is_peer_failure(err):
            failure = f"another rank stopped responding (it died or hung): {peer_failure_reason(err)}"
        else:
            if is_distributed():
                stop.announce("failed", one_line_error(err))
            raise
    if failure is not None:  # raised here, with the exception and its frames (and tensors) released
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        raise RunFailed(failure)
    recorder = next(h for h in runner.hooks if isinstance(h, RunRecorder))
    return runner, recorder, diverged


def _peer_stop(stop: RankStop) -> dict | None:
    try:
        return stop.peer()
    except Exception:  # noqa: BLE001 - the store went with a rank that died: no word from it
        return None


def _out_of_memory(err: BaseException, runner: Runner) -> str:
    recorder = next((h for h in runner.hooks if isinstance(h, RunRecorder)), None)
    phase = recorder.phase if recorder is not None else "in training"
    loader = runner.cfg.get("val_dataloader" if phase == "in validation" else "train_dataloader") or {}
    model = runner.model.module if is_model_wrapper(runner.model) else runner.model
    device = next(model.parameters(), torch.empty(0)).device
    return out_of_memory_line(err, phase, loader.get("batch_size", "?"), device)


def enable_skipping(cfg: Config) -> None:
    """The opt-in skip policy (tasks.bad_data) on the training and validation datasets; a dataset type
    that has none is a ValueError naming it."""
    for key in ("train_dataloader", "val_dataloader"):
        dataset = (cfg.get(key) or {}).get("dataset")
        if not dataset:
            continue
        kind = dataset.get("type")
        cls = DATASETS.get(kind) if isinstance(kind, str) else kind
        if cls is None or "skip_bad" not in inspect.signature(cls).parameters:
            raise ValueError(f"--skip-bad-samples: the {kind} dataset of {key} cannot skip samples")
        dataset["skip_bad"] = True


NEW_KEYS_EXPECTED = ("custom_hooks", "custom_imports", "launcher", "randomness", "resume", "load_from")


def warn_new_keys(cfg: Config, cfg_options: dict) -> list[str]:
    """Warn (and return the warnings) for every --cfg-options key whose path the config does not hold:
    MMEngine adds it as a new key, which is right for a new hook and a silent no-op for a typo."""
    found = []
    tree = cfg.to_dict()
    for key in cfg_options:
        node, path = tree, []
        for part in key.split("."):
            if not isinstance(node, dict):
                break  # into a list or a value: MMEngine's own merge decides
            if part not in node:
                if path == ["default_hooks"] or (not path and part in NEW_KEYS_EXPECTED):
                    break  # a new hook, or a key MMEngine's Runner takes without a default here
                close = difflib.get_close_matches(part, [str(k) for k in node], n=3)
                where = ".".join(path) or "the run's config"
                hint = (
                    f" (did you mean {', '.join(repr('.'.join([*path, c])) for c in close)}?)"
                    if close
                    else ""
                )
                found.append(
                    f"--cfg-options {key}: {where} has no key {part!r}{hint}; MMEngine adds it as a new key"
                )
                break
            node, path = node[part], [*path, part]
    for text in found:
        warnings.warn(text, UserWarning, stacklevel=2)
    return found


def run_config(
    build: Callable[[str], Config | dict],
    spec: RunSpec,
    *,
    work_dir: str | None,
    cfg_options: dict | None,
    dataset: Callable[[Config], str],
    scores: Callable[[RunRecorder, bool], dict[str, Any]],
    config_file: str | os.PathLike | None = None,
    skip_bad_samples: bool = False,
) -> RunResult:
    """Train the run `spec` (its method options already checked): the config build(work_dir) makes (with
    a RunRecorder hook), cfg_options merged into it.

    `dataset(cfg)` names the data the run trained on; `scores(recorder, diverged)` gives the task's
    scores from the last validation. A temporary work_dir (work_dir None) is removed afterwards; a named
    one keeps checkpoints, and the run resumes from the newest of its own there. `config_file` (a user's
    config) joins the run's identity; `skip_bad_samples` turns the skip policy on.
    """
    temp = work_dir is None
    work = tempfile.mkdtemp(prefix=f"repro-{spec.task}-") if temp else work_dir
    runner = name = None
    try:
        built = build(str(work))
        cfg = built if isinstance(built, Config) else Config(built)
        if temp:  # nothing could resume from a folder removed afterwards
            cfg.default_hooks = dict(cfg.get("default_hooks") or {}, checkpoint=None)
        else:
            configure_checkpoints(cfg, spec.profile)
        if cfg_options:
            warn_new_keys(cfg, cfg_options)
            cfg.merge_from_dict(copy.deepcopy(cfg_options))
        cfg.train_cfg = resumable_loop(cfg.train_cfg)
        if skip_bad_samples:
            enable_skipping(cfg)
        cfg[RUN_KEY] = _identity(spec, cfg_options, config_file)
        if not temp:
            resume = checkpoint_to_resume(
                work, cfg[RUN_KEY], main_process=int(os.environ.get("RANK", 0)) == 0
            )
            if resume is not None:
                cfg.resume, cfg.load_from = True, resume
        name = cfg.experiment_name
        runner, recorder, diverged = train(cfg)
        epochs = cfg.train_cfg.get("max_epochs")
        return RunResult(
            task=spec.task,
            model=spec.model,
            method=spec.method,
            profile=spec.profile,
            paper_dataset=spec.paper_dataset,
            dataset=dataset(cfg),
            seed=spec.seed,
            epochs=None if epochs is None else int(epochs),
            iters=int(runner.iter),
            final_loss=None if diverged else recorder.final_loss,
            diverged=diverged,
            ms_per_iter=recorder.ms_per_iter(),
            method_options=spec.method_options,
            simulated=METHODS[spec.method].simulated,
            scores=scores(recorder, diverged),
            resumed_from=runner.resumed_from,
            skipped_samples=recorder.skipped_samples(),
        )
    finally:
        del runner
        if name is not None:
            release(name)
        if temp:
            shutil.rmtree(work, ignore_errors=True)


def _identity(spec: RunSpec, cfg_options: dict | None, config: str | os.PathLike | None) -> dict[str, Any]:
    """The run's identity (tasks.resume): what its result depends on."""
    from tasks import get_task, recipe_version

    return run_identity(
        **{**spec.fields(), "data_root": spec.resolved_data_root}, cfg_options=cfg_options or {},
        recipe_version=recipe_version(get_task(spec.task), spec.model), numerics=kernels.NUMERICS,
        config_sha256=None if config is None else hashlib.sha256(Path(config).read_bytes()).hexdigest(),
        ranks=int(os.environ.get("WORLD_SIZE", 1)),
    )  # fmt: skip


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
        return f"{head} diverged after {timing}{_extras(result)}"
    scores = [
        label.format(result.scores[k])
        for k, label in SCORE_LABELS.items()
        if result.scores.get(k) is not None
    ]
    loss = "n/a" if result.final_loss is None else f"{result.final_loss:.4f}"
    epochs = "" if result.epochs is None else f"{result.epochs} epochs, "
    return f"{head} {', '.join(scores) or 'no score'}, final loss {loss}, {epochs}{timing}{_extras(result)}"


def _extras(result: RunResult) -> str:
    out = ""
    if result.resumed_from:
        out += f", resumed from {result.resumed_from}"
    if result.skipped_samples:
        out += f", {len(result.skipped_samples)} bad samples skipped"
    return out
