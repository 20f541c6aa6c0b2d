"""`repro figure NAME ...`: draw the papers' figures (and UI8 Table 1) from recorded trainings.

    repro figure ui8-figure3 [--profile embedded] [--results-dir results] [--data-root D]
    repro figure all [--executor slurm [--slurm-args "partition=gpu time=120"] [--slurm-config F]]

Trains the recorded runs a figure needs that are not cached (results/figures/runs/; a killed run
resumes from its last checkpoint in results/figures/work/, finished ones are kept) and writes
results/figures/<name>.png and .csv. `--executor slurm` trains each of those runs as a Slurm job, all of
the figures' at once (docs/cluster.md), and draws here. Exit status: 0 written, 1 a figure failed, 2 bad
arguments, 130 interrupted.
"""

from __future__ import annotations

import sys
import time

from tables.figures.registry import get_figure, list_figures, make
from tables.slurm_resources import add_executor_arguments, executor_resources
from tasks import PROFILES


def add_figure_parser(subparsers):
    p = subparsers.add_parser(
        "figure",
        help="draw a paper figure (or UI8 Table 1) from recorded training runs",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("names", nargs="+", metavar="NAME", help="'all' or any of: " + ", ".join(list_figures()))
    p.add_argument("--profile", default="embedded", help=f"one of: {', '.join(PROFILES)} (default embedded)")
    p.add_argument("--data-root", default=None, help="where the paper profile finds its datasets")
    p.add_argument("--results-dir", default="results", help="output and cache directory (default results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--verbose", action="store_true", help="training logs on the terminal")
    p.add_argument(
        "--device",
        default=None,
        help="cuda or cpu (default: cuda when present); cuda without a GPU is an error",
    )
    add_executor_arguments(p, "the runs train")
    p.set_defaults(func=cmd_figure)
    return p


def cmd_figure(args) -> int:
    names = list_figures() if args.names == ["all"] else list(dict.fromkeys(args.names))
    unknown = [n for n in names if n not in list_figures()]
    if unknown:
        print(
            f"error: unknown figure {unknown[0]!r}; choose from all, {', '.join(list_figures())}",
            file=sys.stderr,
        )
        return 2
    if args.profile not in PROFILES:
        print(f"error: unknown profile {args.profile!r}; choose from {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    from tables.figures.runs import ensure
    from tables.generate import cell_executor, table_jobs
    from tasks.device_choice import use_device

    resources = executor_resources(args)  # a ValueError (one line, exit 2) for a bad key
    executor = cell_executor(args.executor, resources, args.device)
    if executor is None:  # a job chooses its device where it runs
        use_device(args.device)  # a ValueError (one line, exit 2) where the device is not here

    if len(names) > 1 and (table_jobs() > 1 or executor is not None):
        # `make figures JOBS=n`: n processes share the runs out, so each trains every figure's runs first
        # rather than waiting, figure by figure, for the other's; on Slurm, every figure's runs go at once
        try:
            runs = [run for name in names for run in get_figure(name).RUNS]
            ensure(runs, args.profile, args.results_dir, args.data_root, not args.no_progress, args.verbose,
                   executor)  # fmt: skip
        except KeyboardInterrupt:
            return _interrupted(args)
        except Exception as err:  # noqa: BLE001 - the figures below say which of them it stops
            print(f"error: figure runs: {type(err).__name__}: {err}", file=sys.stderr)
    failed = 0
    for name in names:
        start = time.perf_counter()
        try:
            paths = make(
                name, args.profile, args.results_dir, args.data_root, not args.no_progress, args.verbose,
                executor,
            )  # fmt: skip
        except KeyboardInterrupt:
            return _interrupted(args)
        except Exception as err:  # noqa: BLE001 - one line per failed figure; the others are still drawn
            failed += 1
            print(f"error: {name}: {type(err).__name__}: {err}", file=sys.stderr)
            continue
        print(
            f"{name}: wrote {', '.join(map(str, paths))} ({time.perf_counter() - start:.0f} s)",
            file=sys.stderr,
        )
    return 1 if failed else 0


def _interrupted(args) -> int:
    jobs = " (the Slurm jobs go on: run it again to wait for them)" if args.executor == "slurm" else ""
    print(
        f"\ninterrupted: finished runs are cached under {args.results_dir}/figures/runs, unfinished ones "
        f"keep their checkpoints under {args.results_dir}/figures/work; run the same command again to go on"
        + jobs,
        file=sys.stderr,
    )
    return 130
