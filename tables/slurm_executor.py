"""The Slurm executor (DESIGN seam 6): a plan's pending cells go to Slurm, one job a cell, through submitit;
this process submits, watches and reports, and the generator renders the table as after a local run.
Figure runs (tables.figures.runs) and `repro train` (tables.slurm_train) go the same way, one job a run,
through the same loop (SlurmCells.run_jobs) and with the same guarantees.

    outcomes = SlurmCells(queue=SlurmQueue(resources)).run(plan, cache, todo, outcomes, ...)

Nothing is run twice, nothing lost. A job is named after its results directory and its cell (repro-<a hash
of the cache's path>-<cell key>: the same cell of another results directory is another job) and recorded in
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

With cells_per_job=n (SLURM_ARGS, slurm.toml) the cells submitted together go n to a job (tables.slurm_job.
CellsJob): one fresh Python and one scheduling for n cells; `time` is not scaled: give n cells' worth.
The job's name lists its cells' keys (repro-<hash>-<key>+<key>...), so a parent started again finds each
cell's job as before; each cell's jobs.jsonl names the folder of submitit's files, the first cell's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import submitit

from atomic_files import write_file
from tables.cells import Cache, Cell, CellClaim, Claim
from tables.slurm_job import CellJob, CellsJob

JOB_PREFIX = "repro-"
# Slurm signals a job this way before its time limit (and `scancel --signal=USR1` does by hand); the job's
# submitit handler checkpoints and requeues on it. submitit's own default is USR2 (NCCL may catch USR1):
# SUBMITIT_PREEMPT_SIGNAL=USR2 in the environment keeps that. The job's handler reads the variable (inherited
# through sbatch's --export=ALL) when its submitit is imported; the parent's sbatch `--signal` comes from
# JobEnvironment.USR_SIG, which submitit read at its own import, before this line (tables.slurm_job): set
# both, or Slurm sends USR2 at the time limit to a job that waits for USR1, and the job dies unrequeued.
os.environ.setdefault("SUBMITIT_PREEMPT_SIGNAL", "USR1")
submitit.JobEnvironment.USR_SIG = os.environ["SUBMITIT_PREEMPT_SIGNAL"]
STDERR_LINES = 4  # of a failed job's stderr, in its cell's outcome
POLL_S = 1.0
SQUEUE_TRIES, SQUEUE_RETRY_S = 5, 10.0  # "Socket timed out" from a busy slurmctld passes


def results_scope(cache_root: str | os.PathLike) -> str:
    """What tells this results directory's jobs from another's in the job names."""
    return hashlib.sha256(str(Path(cache_root).resolve()).encode()).hexdigest()[:8]


def job_name(unit: Any, scope: str) -> str:
    """A job's name in Slurm, by which a parent started again finds it: repro-<scope>-<its cell's or run's
    key>."""
    return pack_name([unit], scope)


def pack_name(units: list, scope: str) -> str:
    return f"{JOB_PREFIX}{scope}-" + "+".join(unit.key for unit in units)


def jobs_by_cell(live: dict[str, tuple[str, str]], scope: str) -> dict[str, tuple[str, str]]:
    """Each cell's (or run's) key in the name of a live job of this scope -> (job id, state)."""
    prefix = f"{JOB_PREFIX}{scope}-"
    return {
        key: job
        for name, job in live.items()
        if name.startswith(prefix)
        for key in name[len(prefix) :].split("+")
    }


class SlurmQueue:
    """Slurm as the executor sees it: submit a cell's job (submitit's SlurmExecutor), list the live jobs."""

    name = "slurm"

    def __init__(self, resources: dict[str, Any], python: str | None = None):
        self.resources = dict(resources)
        self.python = python

    def submit(self, job: CellJob | CellsJob, name: str, folder: Path) -> str:
        import submitit

        executor = submitit.SlurmExecutor(folder=folder, python=self.python)
        executor.update_parameters(job_name=name, **self.resources)
        return str(executor.submit(job).job_id)

    def live(self) -> dict[str, tuple[str, str]]:
        """Each job of this user not yet ended (what squeue lists by default): name -> (job id, state). A
        busy controller's failed or slow answer is asked again (SQUEUE_TRIES, SQUEUE_RETRY_S apart) rather
        than end a wait of hours; the last failure raises."""
        for attempt in range(SQUEUE_TRIES):
            try:
                out = subprocess.run(
                    ["squeue", "--me", "--noheader", "--array", "--format=%i|%j|%T"],
                    capture_output=True, text=True, timeout=120, check=True,
                ).stdout  # fmt: skip
                break
            except (subprocess.CalledProcessError, subprocess.TimeoutExpired):
                if attempt == SQUEUE_TRIES - 1:
                    raise
                time.sleep(SQUEUE_RETRY_S)
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
    folder: Path | None = None  # of submitit's files for the job (a pack's: its first cell's)


@dataclass
class SlurmCells:
    """Runs work on `queue` (SlurmQueue; tests hand in stand-ins and submitit's local executor), one job a
    piece (or cells_per_job cells a job): a plan's pending cells (`run`), and through `run_jobs` any other
    (figure runs, `repro train`)."""

    queue: Any
    poll_s: float = POLL_S
    cells_per_job: int = 1
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

        def job(cells: list[Cell]) -> CellJob | CellsJob:
            jobs = [dataclasses.replace(template, cell=cell, cells_in_job=len(cells)) for cell in cells]
            return jobs[0] if len(jobs) == 1 else CellsJob(jobs)

        def done(cell: Cell, ran: bool) -> bool:
            known = known_outcome(cache, cell, shared)
            if known is not None:  # cached by its job, or meanwhile (or its twin was: tables.shared_training)
                outcomes[cell.key] = dataclasses.replace(known, cached=False) if ran else known
            return known is not None

        def held(cell: Cell, fresh: list[Cell]) -> bool:
            if shared and any(t.key in self.watched or t in fresh for t in shared.twins(cell)):
                return True  # one training serves both: its twin's job trains it
            return claimed_elsewhere(CellClaim(work_root, cell))  # a local process is training it

        def failed(cell: Cell, error: str) -> None:
            outcomes[cell.key] = Outcome(error=error)
            bar.write(f"{plan.spec.name}: {cell.describe()} failed: {error}")

        self.run_jobs(
            todo, job=job, done=done, held=held, failed=failed, bar=bar, jobs_root=jobs_root,
            scope=results_scope(cache.root), per_job=self.cells_per_job,
        )  # fmt: skip

    def run_jobs(
        self, todo: list, *, job, done, held, failed, bar, jobs_root: Path, scope: str, per_job: int = 1
    ) -> None:
        """Bring every piece of `todo` (each with .key and .describe()) to its end, `per_job` pieces a Slurm
        job: `done(piece, ran)` says whether its result is there (ran: its job was watched), `held(piece,
        fresh)` that something else is producing it (wait, submit nothing; `fresh`: the pieces about to be
        submitted), `job(pieces)` is the callable their job runs, and `failed(piece, why)` is told a job that
        ended without its result. A live job of the piece's name in `scope` (an earlier parent's) is waited
        for, not submitted again. Each piece moves `bar` on by one."""
        waiting = []
        for unit in todo:
            if unit.key in self.errors:  # failed earlier in this process (another figure needs it too)
                failed(unit, self.errors[unit.key])
                bar.update(1)
            else:
                waiting.append(unit)
        while waiting or self.watched:
            snapshot = time.time()
            live = jobs_by_cell(self.queue.live(), scope)
            for key, w in list(self.watched.items()):
                if done(w.unit, True):  # ended, or done while its job goes on (a pack's next cells)
                    del self.watched[key]
                    bar.update(1)
                    continue
                if key in live:
                    w.job_id, w.state = live[key]
                    continue
                del self.watched[key]
                folder = w.folder or _job_folder(jobs_root, key, w.job_id)
                if not _submitted(folder, w.job_id):
                    waiting.append(w.unit)  # its submission never reached the job: submit it again
                else:
                    self.errors[key] = job_error(folder, w.job_id)
                    self.failed.append(w.job_id)
                    failed(w.unit, self.errors[key])
                    bar.update(1)
            still, fresh = [], []
            for unit in waiting:
                if done(unit, False):  # finished meanwhile
                    bar.update(1)
                elif unit.key in live:  # a job an earlier parent submitted: wait for it
                    self.watched[unit.key] = Watched(unit, *live[unit.key])
                elif held(unit, fresh):
                    still.append(unit)
                else:
                    fresh.append(unit)
            for start in range(0, len(fresh), per_job):
                pack = fresh[start : start + per_job]
                for unit, (job_id, folder) in zip(
                    pack, self._submit(job, pack, jobs_root, snapshot, scope), strict=True
                ):
                    self.watched[unit.key] = Watched(unit, job_id, folder=folder)
            waiting = still
            bar.set_postfix_str(self.status(len(waiting)), refresh=True)
            if waiting or self.watched:
                time.sleep(self.poll_s)

    @property
    def ranks_per_cell(self) -> int:
        """The ranks of a cell's data-parallel run: a job's tasks (nodes x tasks a node)."""
        resources = getattr(self.queue, "resources", {})
        return int(resources.get("nodes", 1)) * int(resources.get("ntasks_per_node", 1))

    def _submit(self, job, cells: list, jobs_root: Path, snapshot: float, scope: str) -> list:
        """Submit the cells (or runs) as one job, `job(cells)`, but those another parent submitted since
        `snapshot` (then wait for that one): (job id, folder of submitit's files) for each, in order."""
        locks = [Claim(jobs_root / key / "submit.lock") for key in sorted(c.key for c in cells)]
        for lock in locks:  # in key order: two parents never hold each other's
            lock.acquire(wait=True)
        try:
            found, fresh = {}, []
            for cell in cells:
                last = _records(jobs_root / cell.key)[-1:]
                if last and last[0]["submitted_at"] > snapshot:
                    found[cell.key] = (str(last[0]["job_id"]), jobs_root / last[0].get("folder", cell.key))
                else:
                    fresh.append(cell)
            if fresh:
                folder = jobs_root / fresh[0].key
                job_id = self.queue.submit(job(fresh), pack_name(fresh, scope), folder)
                resources = dict(getattr(self.queue, "resources", {}))
                for cell in fresh:
                    record = {"job_id": job_id, "submitted_at": time.time(), "executor": self.queue.name,
                              "resources": resources, "cell": cell.describe(), "folder": folder.name,
                              "cells_in_job": len(fresh)}  # fmt: skip
                    records = [*_records(jobs_root / cell.key), record]
                    lines = [json.dumps(r, sort_keys=True) for r in records]
                    write_file(jobs_root / cell.key / "jobs.jsonl", "\n".join(lines) + "\n")
                    found[cell.key] = (job_id, folder)
            return [found[cell.key] for cell in cells]
        finally:
            for lock in locks:
                lock.release()

    def status(self, waiting: int) -> str:
        """The cluster's side of the progress bar: running and pending jobs, with their ids."""
        running = [w.job_id for w in self.watched.values() if w.state == "RUNNING"]
        queued = [w.job_id for w in self.watched.values() if w.state != "RUNNING"]
        parts = [f"{len(running)} running" + (f" [{_ids(running)}]" if running else "")]
        parts.append(f"{len(queued)} queued" + (f" [{_ids(queued)}]" if queued else ""))
        if waiting:
            parts.append(f"{waiting} waiting")
        if self.failed:
            jobs = sorted(set(self.failed), key=_numeric)  # a pack's failed cells share their job
            parts.append(f"{len(self.failed)} cells failed in {len(jobs)} jobs [{_ids(jobs)}]")
        return ", ".join(parts)


def _ids(ids: list[str], most: int = 6) -> str:
    """The job ids, each once (a pack's cells share theirs), in submission order."""
    ids = sorted(set(ids), key=_numeric)
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


def _job_folder(jobs_root: Path, key: str, job_id: str) -> Path:
    """Where submitit keeps the files of the cell's job `job_id`: its record's folder (a pack's first cell),
    else the folder that holds its pickle (a job found live whose records its parent never wrote: a pack's
    is its first cell's), else the cell's own."""
    for record in reversed(_records(jobs_root / key)):
        if str(record["job_id"]) == job_id:
            return jobs_root / record.get("folder", key)
    found = list(jobs_root.glob(f"*/{job_id}_submitted.pkl"))
    return found[0].parent if found else jobs_root / key


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
