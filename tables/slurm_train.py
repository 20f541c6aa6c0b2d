"""`repro train --executor slurm`: the one training run as a Slurm job through submitit, with the tables'
guarantees (tables.slurm_executor), printing what a local `repro train` prints.

    repro train --model resnet18 --method daiq --profile smoke --executor slurm [--slurm-args "time=30"]

The run's folder, <results-dir>/train/<key>/ (key: a hash of the task's run arguments, --device, the
recipe's version and the numerics, as a table cell's key), holds submitit's files and the jobs.jsonl of its
jobs, the job's work dir (unless --work-dir names one: resumed from when Slurm requeues the job) and, once
done, result.json: the line and the JSON record a local run prints, with the job that trained it
(tables.slurm_job.TrainJob). The command waits for the job and prints them. Run again, it prints the kept
result (remove the folder to train again), waits for a job still live (its parent was killed) rather than
submit another, and submits only where there is neither. A job that ends without a result is one line (its
id and the tail of its stderr) and exit 1.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tables.slurm_job import TRAIN_RESULT, TrainJob
from tables.slurm_resources import add_executor_arguments, executor_resources


@dataclass(frozen=True)
class TrainRun:
    """The run as the executor sees it: its job is named after its key (tables.slurm_executor.job_name)."""

    key: str
    what: str

    def describe(self) -> str:
        return self.what


def add_train_executor(parser) -> None:
    """`repro train`'s --executor, --slurm-args, --slurm-config and --results-dir (the run's folder)."""
    add_executor_arguments(parser, "the run trains")
    parser.add_argument(
        "--results-dir",
        default="results",
        help="with --executor slurm: the run's folder is <results-dir>/train/<key> (default results)",
    )
    parser.set_defaults(func=cmd_train_anywhere)


def cmd_train_anywhere(args) -> int:
    """`repro train`: here (tasks.cli), or as a Slurm job with --executor slurm."""
    from tables.generate import cell_executor
    from tasks.cli import cmd_train

    resources = executor_resources(args)  # a ValueError (one line, exit 2) for a bad key
    if resources is None:
        return cmd_train(args)
    return train_on_slurm(args, cell_executor("slurm", resources, args.device))


def run_key(task: str, arguments: dict[str, Any], device: str | None, ranks: int = 1) -> str:
    """What the run is: its task and run arguments, the device asked for, the recipe's version, the
    numerics, the ranks of its data-parallel run (a job's tasks: each its share of the batch) and a
    --config file's contents: the same command on the same resources' shape, the same key."""
    import kernels
    from tasks import get_task, recipe_version

    config = arguments.get("config")
    identity = {
        "task": task, **arguments, "device": device, "numerics": kernels.NUMERICS, "ranks": ranks,
        "recipe_version": recipe_version(get_task(task), arguments["model"]),
        "config_sha256": hashlib.sha256(Path(config).read_bytes()).hexdigest() if config else None,
    }  # fmt: skip
    text = json.dumps(identity, sort_keys=True, default=str)
    return "train-" + hashlib.sha256(text.encode()).hexdigest()[:12]


def train_on_slurm(args, executor, runner: Any = None) -> int:
    """Train the run `args` ask for as a job of `executor` (tables.slurm_executor.SlurmCells), or take its
    kept result; print it as `repro train` prints it. `runner` stands in for the task's run (tests)."""
    from tqdm.auto import tqdm

    from tables.slurm_executor import results_scope
    from tasks import PROFILES, get_task
    from tasks.cli import run_arguments
    from tasks.runner import check_choice, checked_options

    get_task(args.task)  # a ValueError (one line, exit 2) for an unknown task
    if args.launcher != "none":
        print(
            "error: --launcher is for a run under torchrun; a Slurm job of several tasks "
            '(--slurm-args "ntasks_per_node=2") sets it up itself',
            file=sys.stderr,
        )
        return 2
    arguments = run_arguments(args)
    if isinstance(arguments, int):
        return arguments
    # a misspelt profile, method or method option: one line and exit 2 here, as locally, not a failed job
    check_choice("profile", args.profile, PROFILES)
    checked_options(arguments["method"], arguments["method_options"])
    key = run_key(args.task, arguments, args.device, executor.ranks_per_cell)
    folder = (Path(args.results_dir) / "train" / key).resolve()
    own_work_dir = arguments["work_dir"] is None
    arguments["work_dir"] = str(folder / "work" if own_work_dir else Path(arguments["work_dir"]).resolve())
    what = f"{args.task} {arguments['model']} {args.method} ({args.profile}, seed {args.seed})"
    job = TrainJob(args.task, arguments, str(folder), args.device, own_work_dir, runner,
                   resources=dict(executor.queue.resources))  # fmt: skip
    result, failures = folder / TRAIN_RESULT, {}
    kept = result.exists()
    bar = tqdm(total=1, desc="train", unit="run", file=sys.stderr, disable=not sys.stderr.isatty(),
               bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]")  # fmt: skip
    try:
        executor.run_jobs(
            [TrainRun(key, what)], job=lambda runs: job, done=lambda run, ran: result.exists(),
            held=lambda run, fresh: False, failed=lambda run, error: failures.setdefault(run.key, error),
            bar=bar, jobs_root=folder.parent, scope=results_scope(folder.parent),
        )  # fmt: skip
    except KeyboardInterrupt:
        print(f"\ninterrupted: the Slurm job goes on; run the same command again to wait for it ({folder})",
              file=sys.stderr)  # fmt: skip
        return 130
    finally:
        bar.close()
    if failures:
        print(f"error: {what}: {failures[key]} (see {folder})", file=sys.stderr)
        return 1
    body = json.loads(result.read_text())
    ran = body.get("executor", {})
    how = f"trained by Slurm job {ran.get('job_id')} on {ran.get('node')}, finished {body.get('finished_at')}"
    again = "; remove that folder to train again" if kept else ""
    print(f"repro: {'the result kept in' if kept else 'in'} {folder} ({how}){again}", file=sys.stderr)
    print(json.dumps(body["record"]) if args.json else body["summary"], flush=True)
    return 0
