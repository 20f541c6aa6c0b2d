"""The Slurm executor (DESIGN seam 6): a plan's pending cells go to Slurm, one job a cell, through submitit;
this process submits, watches and reports, and the generator renders the table as after a local run.
Figure runs (tables.figures.runs) and `repro train` (tables.slurm_train) go the same way, one job a run,
through the same loop (SlurmCells.run_jobs) and with the same guarantees.

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


def job_name(unit: Any) -> str:
    """A job's name in Slurm, by which a parent started again finds it: repro-<its cell's or run's key>."""
    return f"{JOB_PREFIX}{unit.key}"


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
    unit: Any  # what the job runs: a Cell, a figure run, a training (anything with .key and .describe())
    job_id: str
    state: str = "PENDING"


@dataclass
class SlurmCells:
    """Runs work on `queue` (SlurmQueue; tests hand in stand-ins and submitit's local executor), one job a
    piece: a plan's pending cells (`run`), and through `run_jobs` any other (figure runs, `repro train`)."""

    queue: Any
    poll_s: float = POLL_S
    device: str | None = None  # where the jobs train (tasks.device_choice): chosen in the job, where it runs
    watched: dict[str, Watched] = field(default_factory=dict)
    failed: list[str] = field(default_factory=list)  # the failed jobs' ids
    errors: dict[str, str] = field(default_factory=dict)  # a failed piece's key -> why, never resubmitted

    def run(
        self, plan, cache: Cache, todo: list[Cell], outcomes: dict, *, work_root: Path, log_root: Path | None,
        runner, runner_options: dict, shared, bar, jobs_root: Path,
    ) -> None:  # fmt: skip
        """Bring every cell of `todo` to an outcome (cached, or failed with its job's stderr)."""
        from tables.generate import Outcome, known_outcome

        task_runner = _own_task_runner(runner, plan.spec.task)
        template = CellJob(
            cell=todo[0], table=plan.spec.name, metric=plan.spec.metric,
            cache_dir=str(cache.root.resolve()), work_root=str(work_root.resolve()),
            log_root=str(log_root.resolve()) if log_root else None, runner=None if task_runner else runner,
            runner_options=dict(runner_options), resources=dict(getattr(self.queue, "resources", {})),
            device=self.device,
        )  # fmt: skip

        def done(cell: Cell, ran: bool) -> bool:
            known = known_outcome(cache, cell, shared)
            if known is not None:  # cached by its job, or meanwhile (or its twin was: tables.shared_training)
                outcomes[cell.key] = dataclasses.replace(known, cached=False) if ran else known
            return known is not None

        def held(cell: Cell) -> bool:
            if shared and any(t.key in self.watched for t in shared.twins(cell)):
                return True  # one training serves both: its twin's job trains it
            return claimed_elsewhere(CellClaim(work_root, cell))  # a local process is training it

        def failed(cell: Cell, error: str) -> None:
            outcomes[cell.key] = Outcome(error=error)
            bar.write(f"{plan.spec.name}: {cell.describe()} failed: {error}")

        self.run_jobs(
            todo, job=lambda cell: dataclasses.replace(template, cell=cell), done=done, held=held,
            failed=failed, bar=bar, jobs_root=jobs_root,
        )  # fmt: skip

    def run_jobs(self, todo: list, *, job, done, held, failed, bar, jobs_root: Path) -> None:
        """Bring every piece of `todo` (each with .key and .describe()) to its end, one Slurm job a piece:
        `done(piece, ran)` says whether its result is there (ran: its job just ended), `held(piece)` that
        something else is producing it (wait, submit nothing), `job(piece)` is the callable its job runs,
        and `failed(piece, why)` is told a job that ended without its result. A live job of the piece's
        name (an earlier parent's) is waited for, not submitted again. Each piece moves `bar` on by one."""
        waiting = []
        for unit in todo:
            if unit.key in self.errors:  # failed earlier in this process (another figure needs it too)
                failed(unit, self.errors[unit.key])
                bar.update(1)
            else:
                waiting.append(unit)
        while waiting or self.watched:
            snapshot = time.time()
            live = self.queue.live()
            for key, w in list(self.watched.items()):
                if job_name(w.unit) in live:
                    w.job_id, w.state = live[job_name(w.unit)]
                    continue
                del self.watched[key]
                if done(w.unit, True):
                    bar.update(1)
                elif not _submitted(jobs_root / key, w.job_id):
                    waiting.append(w.unit)  # its submission never reached the job: submit it again
                else:
                    self.errors[key] = job_error(jobs_root / key, w.job_id)
                    self.failed.append(w.job_id)
                    failed(w.unit, self.errors[key])
                    bar.update(1)
            still = []
            for unit in waiting:
                if done(unit, False):  # finished meanwhile
                    bar.update(1)
                elif job_name(unit) in live:  # a job an earlier parent submitted: wait for it
                    self.watched[unit.key] = Watched(unit, *live[job_name(unit)])
                elif held(unit):
                    still.append(unit)
                else:
                    job_id = self._submit(job(unit), unit, jobs_root, snapshot)
                    self.watched[unit.key] = Watched(unit, job_id)
            waiting = still
            bar.set_postfix_str(self.status(len(waiting)), refresh=True)
            if waiting or self.watched:
                time.sleep(self.poll_s)

    def _submit(self, job: Any, unit: Any, jobs_root: Path, snapshot: float) -> str:
        """Submit the piece's job, unless another parent did since `snapshot` (then wait for that one)."""
        folder = jobs_root / unit.key
        lock = Claim(folder / "submit.lock")
        lock.acquire(wait=True)
        try:
            last = _records(folder)[-1:]
            if last and last[0]["submitted_at"] > snapshot:
                return str(last[0]["job_id"])
            job_id = self.queue.submit(job, job_name(unit), folder)
            resources = dict(getattr(self.queue, "resources", {}))
            record = {"job_id": job_id, "submitted_at": time.time(), "executor": self.queue.name,
                      "resources": resources, "what": unit.describe()}  # fmt: skip
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


def claimed_elsewhere(claim: Claim) -> bool:
    """Whether another process holds `claim` (checking leaves no lock file behind where none was)."""
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


def job_error(folder: Path, job_id: str) -> str:
    """Why a job that ended without its result failed: its id and the tail of its stderr."""
    return f"Slurm job {job_id} ended without a result: {stderr_tail(folder, job_id) or 'no stderr'}"


def stderr_tail(folder: Path, job_id: str, lines: int = STDERR_LINES) -> str:
    """The last lines of the job's stderr that say something (not submitit's or srun's own closing lines, nor
    a traceback's ^^^ markers)."""
    texts = []
    for path in sorted(folder.glob(f"{job_id}_*_log.err")):
        texts += path.read_text(errors="replace").splitlines()
    noise = ("submitit ", "srun: ", "Traceback (most recent call last)")
    kept = [t.strip() for t in texts if t.strip(" ^~") and not t.lstrip().startswith(noise)]
    return " | ".join(kept[-lines:])
