"""The Slurm executor (DESIGN seam 6): a plan's pending cells go to Slurm, one job a cell, through submitit;
this process submits, watches and reports, and the generator renders the table as after a local run.

    outcomes = SlurmCells(queue=SlurmQueue(resources)).run(plan, cache, todo, outcomes, ...)

Nothing is run twice, nothing lost. A job is named after its cell (repro-<cell key>) and recorded in
<results>/slurm/<cell key>/jobs.jsonl (with its resources), beside submitit's files for it (its pickles,
stdout and stderr). A parent started again finds each cell's live job by name in `squeue` and waits for
it rather than submit it again, takes the finished cells from the cache, and submits only the cells that
have neither; two parents on one results directory submit a cell under its submit lock, so only one of
them does. A cell a local process is training (its claim is held) is waited for, not submitted. The job
itself trains only under the cell's claim and not if the cell is cached (tables.slurm_job), so a cell
submitted twice (the parent killed between sbatch and its record) still trains once.

A job that ends without the cell cached is a failed cell: its outcome names the job id and the tail of its
stderr (the table and the claims report show it), the other cells go on, and the command exits non-zero.
One whose submission never reached it (no pickle: the parent died mid-submit) is submitted again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atomic_files import write_file
from tables.cells import Cache, Cell, CellClaim, Claim
from tables.slurm_job import CellJob

JOB_PREFIX = "repro-"
# Slurm signals a job this way before its time limit (and `scancel --signal=USR1` does by hand); the job's
# submitit handler checkpoints and requeues on it. submitit's own default is USR2 (NCCL may catch USR1):
# SUBMITIT_PREEMPT_SIGNAL=USR2 in the environment keeps that.
os.environ.setdefault("SUBMITIT_PREEMPT_SIGNAL", "USR1")
STDERR_LINES = 4  # of a failed job's stderr, in its cell's outcome
POLL_S = 1.0


def job_name(cell: Cell) -> str:
    return f"{JOB_PREFIX}{cell.key}"


class SlurmQueue:
    """Slurm as the executor sees it: submit a cell's job (submitit's SlurmExecutor), list the live jobs."""

    name = "slurm"

    def __init__(self, resources: dict[str, Any], python: str | None = None):
        self.resources = dict(resources)
        self.python = python

    def submit(self, job: CellJob, name: str, folder: Path) -> str:
        import submitit

        executor = submitit.SlurmExecutor(folder=folder, python=self.python)
        executor.update_parameters(job_name=name, **self.resources)
        return str(executor.submit(job).job_id)

    def live(self) -> dict[str, tuple[str, str]]:
        """Each job of this user not yet ended (what squeue lists by default): name -> (job id, state)."""
        out = subprocess.run(
            ["squeue", "--me", "--noheader", "--array", "--format=%i|%j|%T"],
            capture_output=True, text=True, timeout=120, check=True,
        ).stdout  # fmt: skip
        jobs = {}
        for line in out.splitlines():
            job_id, name, state = (line.split("|") + ["", ""])[:3]
            if name.startswith(JOB_PREFIX):
                jobs[name] = (job_id.strip(), state.strip())
        return jobs


@dataclass
class Watched:
    cell: Cell
    job_id: str
    state: str = "PENDING"


@dataclass
class SlurmCells:
    """Runs a plan's pending cells on `queue` (SlurmQueue; tests hand in submitit's local executor)."""

    queue: Any
    poll_s: float = POLL_S
    watched: dict[str, Watched] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)  # the failed cells' job ids

    def run(
        self, plan, cache: Cache, todo: list[Cell], outcomes: dict, *, work_root: Path, log_root: Path | None,
        runner, runner_options: dict, shared, bar, jobs_root: Path,
    ) -> None:  # fmt: skip
        """Bring every cell of `todo` to an outcome (cached, or failed with its job's stderr)."""
        from tables.generate import known_outcome

        task_runner = _own_task_runner(runner, plan.spec.task)
        template = CellJob(
            cell=todo[0], table=plan.spec.name, metric=plan.spec.metric,
            cache_dir=str(cache.root.resolve()), work_root=str(work_root.resolve()),
            log_root=str(log_root.resolve()) if log_root else None, runner=None if task_runner else runner,
            runner_options=dict(runner_options), resources=dict(getattr(self.queue, "resources", {})),
        )  # fmt: skip
        waiting = list(todo)
        while waiting or self.watched:
            snapshot = time.time()
            live = self.queue.live()
            for key, w in list(self.watched.items()):
                if job_name(w.cell) in live:
                    w.job_id, w.state = live[job_name(w.cell)]
                    continue
                del self.watched[key]
                known = known_outcome(cache, w.cell, shared)
                if known is not None:
                    outcomes[key] = dataclasses.replace(known, cached=False)
                    bar.update(1)
                elif not _submitted(jobs_root / key, w.job_id):
                    waiting.append(w.cell)  # its submission never reached the job: submit it again
                else:
                    outcomes[key] = _failed(jobs_root / key, w.job_id)
                    self.failed.append(w.job_id)
                    bar.update(1)
                    bar.write(f"{plan.spec.name}: {w.cell.describe()} failed: {outcomes[key].error}")
            still = []
            for cell in waiting:
                known = known_outcome(cache, cell, shared)
                if known is not None:  # cached meanwhile, or its twin was (tables.shared_training)
                    outcomes[cell.key] = known
                    bar.update(1)
                elif job_name(cell) in live:  # a job an earlier parent submitted: wait for it
                    self.watched[cell.key] = Watched(cell, *live[job_name(cell)])
                elif shared and any(t.key in self.watched for t in shared.twins(cell)):
                    still.append(cell)  # one training serves both: its twin's job trains it
                elif _claimed_elsewhere(work_root, cell):
                    still.append(cell)  # a local process is training it: its cache entry will come
                else:
                    job_id = self._submit(dataclasses.replace(template, cell=cell), jobs_root, snapshot)
                    self.watched[cell.key] = Watched(cell, job_id)
            waiting = still
            bar.set_postfix_str(self.status(len(waiting)), refresh=True)
            if waiting or self.watched:
                time.sleep(self.poll_s)

    def _submit(self, job: CellJob, jobs_root: Path, snapshot: float) -> str:
        """Submit the cell's job, unless another parent did since `snapshot` (then wait for that one)."""
        folder = jobs_root / job.cell.key
        lock = Claim(folder / "submit.lock")
        lock.acquire(wait=True)
        try:
            last = _records(folder)[-1:]
            if last and last[0]["submitted_at"] > snapshot:
                return str(last[0]["job_id"])
            job_id = self.queue.submit(job, job_name(job.cell), folder)
            record = {"job_id": job_id, "submitted_at": time.time(), "executor": self.queue.name,
                      "resources": job.resources, "cell": job.cell.describe()}  # fmt: skip
            lines = [json.dumps(r, sort_keys=True) for r in [*_records(folder), record]]
            write_file(folder / "jobs.jsonl", "\n".join(lines) + "\n")
            return job_id
        finally:
            lock.release()

    def status(self, waiting: int) -> str:
        """The cluster's side of the progress bar: running and pending jobs, with their ids."""
        running = sorted((w.job_id for w in self.watched.values() if w.state == "RUNNING"), key=_numeric)
        queued = sorted((w.job_id for w in self.watched.values() if w.state != "RUNNING"), key=_numeric)
        parts = [f"{len(running)} running" + (f" [{_ids(running)}]" if running else "")]
        parts.append(f"{len(queued)} queued" + (f" [{_ids(queued)}]" if queued else ""))
        if waiting:
            parts.append(f"{waiting} waiting")
        if self.failed:
            parts.append(f"{len(self.failed)} failed [{_ids(self.failed)}]")
        return ", ".join(parts)


def _ids(ids: list[str], most: int = 6) -> str:
    return ",".join(ids[:most]) + (",..." if len(ids) > most else "")


def _numeric(job_id: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in job_id.replace("_", ".").split("."))


def _own_task_runner(runner, task: str) -> bool:
    """Whether `runner` is the task's own run (the job imports it itself rather than unpickle it)."""
    try:
        import tasks

        return runner is tasks.get_task(task).run
    except Exception:  # noqa: BLE001 - an injected runner for a task that does not exist
        return False


def _claimed_elsewhere(work_root: Path, cell: Cell) -> bool:
    claim = CellClaim(work_root, cell)
    if not claim.path.exists():
        return False
    if claim.acquire(wait=False):
        claim.release()
        return False
    return True


def _records(folder: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in (folder / "jobs.jsonl").read_text().splitlines() if line]
    except FileNotFoundError:
        return []


def _submitted(folder: Path, job_id: str) -> bool:
    """Whether submitit's pickle of the job's call exists (moved into place right after sbatch answers;
    without it the job waits a minute and fails having run nothing)."""
    return (folder / f"{job_id}_submitted.pkl").exists()


def _failed(folder: Path, job_id: str):
    from tables.generate import Outcome

    tail = stderr_tail(folder, job_id)
    return Outcome(error=f"Slurm job {job_id} ended without a result: {tail or 'no stderr'}")


def stderr_tail(folder: Path, job_id: str, lines: int = STDERR_LINES) -> str:
    """The last lines of the job's stderr that say something (not submitit's or srun's own closing lines)."""
    texts = []
    for path in sorted(folder.glob(f"{job_id}_*_log.err")):
        texts += path.read_text(errors="replace").splitlines()
    noise = ("submitit ", "srun: ", "Traceback (most recent call last)")
    kept = [t.strip() for t in texts if t.strip() and not t.lstrip().startswith(noise)]
    return " | ".join(kept[-lines:])
