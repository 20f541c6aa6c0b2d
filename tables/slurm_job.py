"""What one cell's Slurm job runs: the cell trained into the shared results directory exactly as a local
process trains it (tables.generate.train_cell: the same key, cache entry, work dir, checkpoints and log).
FigureRunJob and TrainJob do the same for a figure's recorded run (tables.figures.runs.train: the same run
folder) and for `repro train --executor slurm` (the run's result kept in its folder for the parent).

CellJob is submitit's Checkpointable: on Slurm's signal (a time limit near, a preemption, `scancel
--signal=USR1`) submitit pickles it again unchanged and requeues the job, and the job, started again,
calls it afresh: the task then resumes from the newest checkpoint in the cell's work dir (tasks.checkpoints),
as a local cell killed and run again does. The job trains only under the cell's claim, and not at all
when the cell is cached by then, so a cell submitted twice (a parent killed between sbatch and its record)
or also run locally is still trained once.

A job of several tasks (ntasks_per_node, nodes) trains its cell as one
data-parallel run: torch.distributed's variables come from Slurm's through submitit's JobEnvironment, as
torchrun would set them, and the run goes through MMEngine's launcher="pytorch", as `repro train
--launcher pytorch` under torchrun does. Rank 0 claims and caches the cell; the others only train.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit

from atomic_files import write_file
from tables.cells import Cache, Cell, CellClaim, Claim


class CellFailed(RuntimeError):
    """The cell's training raised: the job fails, and its stderr says why (the parent reports its tail)."""


class SlurmJob(submitit.helpers.Checkpointable):
    """What every job shares: its threads from its CPUs, its device, its ranks from its tasks, and its record.
    Each job (a dataclass) has the fields `resources` (what it asked Slurm for) and `device` (--device)."""

    resources: dict[str, Any]
    device: str | None

    def setup(self) -> None:
        """The job's CPUs, as a local run takes the machine's (the thread count is recorded), and the device
        asked for (--device: tasks.device_choice), chosen here where the job runs."""
        from tasks.device_choice import use_device

        threads = os.environ.get("SLURM_CPUS_PER_TASK")
        if threads:
            import torch

            torch.set_num_threads(int(threads))
        use_device(self.device)

    @staticmethod
    def ranks(runner_options: dict[str, Any]) -> tuple[dict[str, Any], int]:
        """The runner's options and this task's rank: in a job of several tasks, torch.distributed's
        variables exported from Slurm's and the run under MMEngine's launcher="pytorch"."""
        env = _job_environment()
        if env is None or env.num_tasks == 1:
            return dict(runner_options), 0
        # not CUDA_VISIBLE_DEVICES: MMEngine's launcher picks the GPU by LOCAL_RANK
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        cfg_options = {**(runner_options.get("cfg_options") or {}), "launcher": "pytorch"}
        return {**runner_options, "cfg_options": cfg_options}, env.global_rank

    def record(self) -> dict[str, Any]:
        """Where it ran, for its cache entry or result: the job, its node, what it asked for, its restarts."""
        env = _job_environment()
        return {
            "name": "slurm",
            "job_id": None if env is None else env.job_id,
            "tasks": 1 if env is None else env.num_tasks,
            "node": socket.gethostname(),
            "restarts": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "resources": dict(self.resources),
        }


@dataclass
class CellJob(SlurmJob):
    cell: Cell
    table: str
    metric: str
    cache_dir: str
    work_root: str
    log_root: str | None
    runner: Any = None  # None: the task's own run, imported in the job; tests hand in a picklable fake
    runner_options: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    device: str | None = None
    cells_in_job: int = 1  # more in a pack (CellsJob)

    @property
    def cells(self) -> list[Cell]:
        return [self.cell]

    def record(self) -> dict[str, Any]:
        return {**super().record(), "cells_in_job": self.cells_in_job}

    def __call__(self) -> dict[str, Any]:
        from tables.generate import load_task_runner

        self.setup()
        cache, work_root = Cache(self.cache_dir), Path(self.work_root)
        if cache.load(self.cell) is not None:  # every rank alike: none waits on a group that never forms
            return {"key": self.cell.key, "trained": False}
        runner = self.runner or load_task_runner(self.cell.task)[0]
        options, rank = self.ranks(self.runner_options)
        try:
            if rank:  # the result is rank 0's to keep
                runner(**self.cell.spec.run_arguments(), work_dir=str(work_root / self.cell.key), **options)
                return {"key": self.cell.key, "trained": True}
            return self._train(runner, options, cache, work_root)
        finally:
            close_ranks(options)

    def _train(self, runner, options: dict[str, Any], cache: Cache, work_root: Path) -> dict[str, Any]:
        """Rank 0: the cell trained under its claim and cached, as a local process does."""
        from tables.generate import train_cell

        claim = CellClaim(work_root, self.cell)
        claim.acquire(wait=True)  # a local process or another job may be training it: wait, then look
        cached = False
        try:
            if cache.load(self.cell) is not None:
                cached = True
                return {"key": self.cell.key, "trained": False}
            log_root = Path(self.log_root) if self.log_root else None
            outcome = train_cell(
                self.cell, self.metric, cache, runner, work_root, log_root, options,
                lambda line: print(line, file=sys.stderr, flush=True), self.table, self.record(),
            )  # fmt: skip
            if outcome.error:
                error = work_root / self.cell.key / "error.txt"
                if error.is_file():
                    sys.stderr.write(error.read_text())
                raise CellFailed(outcome.error)
            cached = True
            return {"key": self.cell.key, "trained": True}
        finally:
            claim.release(remove=cached)


@dataclass
class CellsJob(submitit.helpers.Checkpointable):
    """Several cells trained one after another in one job (SLURM_ARGS="cells_per_job=n"): a job's fresh
    Python (torch, torchvision, MMEngine: 8-10 s on a 2-core machine) and Slurm's scheduling are paid once
    for the n cells. Each cell is its own CellJob, under its own claim and cache entry. A cell that fails
    does not stop the others; the job fails at the end, naming them. Requeued, the job calls this again:
    the cells cached by then are skipped, the one it was training resumes from its checkpoint."""

    jobs: list[CellJob]

    @property
    def cells(self) -> list[Cell]:
        return [job.cell for job in self.jobs]

    def __call__(self) -> list[dict[str, Any]]:
        done, failed = [], []
        for job in self.jobs:
            try:
                done.append(job())
            except CellFailed as err:
                failed.append(f"{job.cell.describe()}: {err}")
        if failed:
            raise CellFailed(f"{len(failed)} of {len(self.jobs)} cells failed: " + "; ".join(failed))
        return done


@dataclass
class FigureRunJob(SlurmJob):
    """A figure's recorded run (tables.figures.runs.RUNS[name]) trained into its folder under its claim, as
    `repro figure` trains it here (tables.figures.runs.train_claimed); one task: the recorder hooks one
    process. Requeued, it resumes from the checkpoints in the run's work dir, as a killed local run does."""

    name: str
    profile: str
    folder: str
    data_root: str | None
    log: str | None
    trainer: Any = None  # None: tables.figures.runs.train; tests hand in a picklable fake
    resources: dict[str, Any] = field(default_factory=dict)
    device: str | None = None

    def __call__(self) -> dict[str, Any]:
        from tables.figures.runs import train_claimed

        env = _job_environment()
        if env is not None and env.num_tasks > 1:
            raise ValueError(f"a figure run trains as one task; this job has {env.num_tasks} (ntasks, nodes)")
        self.setup()
        log = Path(self.log) if self.log else None
        folder, where = Path(self.folder), self.record()
        trained = train_claimed(self.name, folder, self.profile, self.data_root, log, where, self.trainer)
        return {"run": self.name, "trained": trained}


TRAIN_RESULT = "result.json"


@dataclass
class TrainJob(SlurmJob):
    """One `repro train` run (tables.slurm_train): the task's run with the command's own arguments; rank 0
    keeps, in the run's folder and written whole, the line and the JSON record the command prints. With
    `own_work_dir` the work dir is the folder's (resumed from on a requeue, removed once the result is kept);
    else it is the user's --work-dir, kept as a local run keeps it."""

    task: str
    arguments: dict[str, Any]  # the task's run(**arguments), as `repro train` builds them (tasks.cli)
    folder: str
    device: str | None = None
    own_work_dir: bool = False
    runner: Any = None  # None: the task's run; tests hand in a picklable fake
    resources: dict[str, Any] = field(default_factory=dict)

    def __call__(self) -> dict[str, Any]:
        from tasks import get_task

        folder = Path(self.folder)
        if (folder / TRAIN_RESULT).exists():
            return {"trained": False}
        self.setup()
        runner = self.runner or get_task(self.task).run
        options, rank = self.ranks(self.arguments)
        try:
            if rank:  # the result is rank 0's to keep
                runner(**options)
                return {"trained": True}
            claim = Claim(folder / "train.lock")
            claim.acquire(wait=True)  # another job of the same run (two parents): wait, then look
            try:
                if (folder / TRAIN_RESULT).exists():
                    return {"trained": False}
                self._keep(runner(**options), folder)
            finally:
                claim.release()
        finally:
            close_ranks(options)
        if self.own_work_dir:
            shutil.rmtree(self.arguments["work_dir"], ignore_errors=True)
        return {"trained": True}

    def _keep(self, result: Any, folder: Path) -> None:
        from tasks.device_choice import trained_on
        from tasks.runner import summary

        body = {
            "record": {**result.to_dict(), "device": trained_on()},  # what `repro train --json` prints
            "summary": summary(result),  # and its line without --json
            "executor": self.record(),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        write_file(folder / TRAIN_RESULT, json.dumps(body) + "\n")


def close_ranks(options: dict[str, Any]) -> None:
    """Close the process group of a run under launcher="pytorch": its gloo threads would abort the
    interpreter's exit."""
    if "launcher" in (options.get("cfg_options") or {}):
        from tasks.distributed import close_process_group

        close_process_group()


def _job_environment():
    """submitit's view of the job this runs in, None outside one (a test calling the job directly)."""
    try:
        return submitit.JobEnvironment()
    except RuntimeError:
        return None
