"""What one cell's Slurm job runs: the cell trained into the shared results directory exactly as a local
process trains it (tables.generate.train_cell: the same key, cache entry, work dir, checkpoints and log).

CellJob is submitit's Checkpointable: on Slurm's signal (a time limit near, a preemption, `scancel
--signal=USR1`) submitit pickles it again unchanged and requeues the job, and the job, started again,
calls it afresh: the task then resumes from the newest checkpoint in the cell's work dir (tasks.checkpoints),
as a local cell killed and run again does. The job trains only under the cell's claim, and not at all
when the cell is cached by then, so a cell submitted twice (a parent killed between sbatch and its record)
or also run locally is still trained once.
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

    def __call__(self) -> dict[str, Any]:
        from tables.generate import load_task_runner, train_cell

        threads = os.environ.get("SLURM_CPUS_PER_TASK")
        if threads:  # the job's CPUs, as a local cell takes the machine's (the thread count is recorded)
            import torch

            torch.set_num_threads(int(threads))
        cache, work_root = Cache(self.cache_dir), Path(self.work_root)
        claim = CellClaim(work_root, self.cell)
        claim.acquire(wait=True)  # a local process or another job may be training it: wait, then look
        cached = False
        try:
            if cache.load(self.cell) is not None:
                cached = True
                return {"key": self.cell.key, "trained": False}
            runner = self.runner or load_task_runner(self.cell.task)[0]
            log_root = Path(self.log_root) if self.log_root else None
            outcome = train_cell(
                self.cell, self.metric, cache, runner, work_root, log_root, self.runner_options,
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

    def record(self) -> dict[str, Any]:
        """Where the cell ran, for its cache entry: the job, its node, what it asked for, its restarts."""
        try:
            job_id = submitit.JobEnvironment().job_id
        except RuntimeError:  # not inside a submitit job (called directly)
            job_id = None
        return {
            "name": "slurm",
            "job_id": job_id,
            "node": socket.gethostname(),
            "restarts": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "resources": dict(self.resources),
        }
