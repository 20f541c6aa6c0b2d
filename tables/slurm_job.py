"""What one cell's Slurm job runs: the cell trained into the shared results directory exactly as a local
process trains it (tables.generate.train_cell: the same key, cache entry, work dir, checkpoints and log).

CellJob is submitit's Checkpointable: on Slurm's signal (a time limit near, a preemption, `scancel
--signal=USR1`) submitit pickles it again unchanged and requeues the job, and the job, started again,
calls it afresh: the task then resumes from the newest checkpoint in the cell's work dir (tasks.checkpoints),
as a local cell killed and run again does. The job trains only under the cell's claim, and not at all
when the cell is cached by then, so a cell submitted twice (a parent killed between sbatch and its record)
or also run locally is still trained once.

A job of several tasks (ntasks_per_node, nodes: GPUS_PER_CELL, NODES_PER_CELL) trains its cell as one
data-parallel run: torch.distributed's variables come from Slurm's through submitit's JobEnvironment, as
torchrun would set them, and the run goes through MMEngine's launcher="pytorch", as `repro train
--launcher pytorch` under torchrun does. Rank 0 claims and caches the cell; the others only train.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit

from tables.cells import Cache, Cell, CellClaim


class CellFailed(RuntimeError):
    """The cell's training raised: the job fails, and its stderr says why (the parent reports its tail)."""


@dataclass
class CellJob(submitit.helpers.Checkpointable):
    cell: Cell
    table: str
    metric: str
    cache_dir: str
    work_root: str
    log_root: str | None
    runner: Any = None  # None: the task's own run, imported in the job; tests hand in a picklable fake
    runner_options: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)
    cells_in_job: int = 1  # more in a pack (CellsJob)

    @property
    def cells(self) -> list[Cell]:
        return [self.cell]

    def __call__(self) -> dict[str, Any]:
        from tables.generate import load_task_runner

        threads = os.environ.get("SLURM_CPUS_PER_TASK")
        if threads:  # the job's CPUs, as a local cell takes the machine's (the thread count is recorded)
            import torch

            torch.set_num_threads(int(threads))
        cache, work_root = Cache(self.cache_dir), Path(self.work_root)
        if cache.load(self.cell) is not None:  # every rank alike: none waits on a group that never forms
            return {"key": self.cell.key, "trained": False}
        runner = self.runner or load_task_runner(self.cell.task)[0]
        options, rank = self._ranks()
        try:
            if rank:  # the result is rank 0's to keep
                runner(**self.cell.spec.run_arguments(), work_dir=str(work_root / self.cell.key), **options)
                return {"key": self.cell.key, "trained": True}
            return self._train(runner, options, cache, work_root)
        finally:
            if "launcher" in (options.get("cfg_options") or {}):
                from tasks.distributed import close_process_group

                close_process_group()  # its gloo threads would abort the interpreter's exit

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

    def _ranks(self) -> tuple[dict[str, Any], int]:
        """The runner's options and this task's rank: in a job of several tasks, torch.distributed's
        variables exported from Slurm's and the run under MMEngine's launcher="pytorch"."""
        env = _job_environment()
        if env is None or env.num_tasks == 1:
            return dict(self.runner_options), 0
        # not CUDA_VISIBLE_DEVICES: MMEngine's launcher picks the GPU by LOCAL_RANK
        submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        cfg_options = {**(self.runner_options.get("cfg_options") or {}), "launcher": "pytorch"}
        return {**self.runner_options, "cfg_options": cfg_options}, env.global_rank

    def record(self) -> dict[str, Any]:
        """Where the cell ran, for its cache entry: the job, its node, what it asked for, its restarts."""
        env = _job_environment()
        return {
            "name": "slurm",
            "job_id": None if env is None else env.job_id,
            "tasks": 1 if env is None else env.num_tasks,
            "node": socket.gethostname(),
            "restarts": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "resources": dict(self.resources),
            "cells_in_job": self.cells_in_job,
        }


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


def _job_environment():
    """submitit's view of the job this runs in, None outside one (a test calling the job directly)."""
    try:
        return submitit.JobEnvironment()
    except RuntimeError:
        return None
