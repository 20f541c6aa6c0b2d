"""`repro table NAME`: regenerate one paper table (see tables.generate).

    repro table table4 [--profile embedded] [--seeds N] [--data-root D] [--results-dir results]
                       [--device cuda|cpu]
    repro table table7 [--device cuda|cpu] [--batch 64] [--size 224] [--rounds R]

NAME is the make-target name: table1..table7 (DAIQ's numbering), ui8-table2..ui8-table10,
wageubn-table1, wageubn-table2. table7, ui8-table10 and ui8-table2 are speed tables: they time
training steps on the device at hand instead of training. Exit status: 0 written, 1 written with
failed cells (or the task is not available), 2 bad arguments, 130 interrupted (finished cells stay
cached and an interrupted cell keeps its checkpoints: rerun to resume). Two runs on one results directory
share its cells out (each cell is claimed by one process) and both write the whole table.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from tables.generate import DEFAULT_SEEDS
from tables.slurm_resources import add_executor_arguments, executor_resources
from tables.specs import SPEED_SPECS, list_tables
from tasks import PROFILES
from tasks.device_choice import use_device


def add_table_parser(subparsers) -> argparse.ArgumentParser:
    defaults = ", ".join(f"{p} {n}" for p, n in DEFAULT_SEEDS.items())
    p = subparsers.add_parser(
        "table",
        help="regenerate one paper table: the paper's numbers beside the measured ones",
        description=__doc__.split("\n\n")[0],
    )
    p.add_argument("name", metavar="NAME", help="one of: " + ", ".join(list_tables()))
    p.add_argument("--profile", default="embedded", help=f"one of: {', '.join(PROFILES)} (default embedded)")
    p.add_argument(
        "--seeds",
        type=seeds_arg,
        default=None,
        help=f"number of seeds, or 'plan': the count tables/seed_plan.json fixes for this table "
        f"(`make seed-plan`) (default: the table's own where its spec sets one, else per profile: "
        f"{defaults})",
    )
    p.add_argument("--data-root", default=None, help="where the paper profile finds its datasets")
    p.add_argument("--results-dir", default="results", help="output and cache directory (default results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--skip-bad-samples",
        action="store_true",
        help="cells skip unreadable images and frames instead of failing (each cell's result lists them)",
    )
    p.add_argument(
        "--device",
        default=None,
        help="cuda or cpu: where the cells train or the steps are timed (default: cuda when present); "
        "cuda without a GPU is an error",
    )
    speed = p.add_argument_group("speed tables (table7, ui8-table10, ui8-table2)")
    speed.add_argument("--batch", type=int, default=None, help="batch size (default: 64; 16 on the CPU)")
    speed.add_argument("--size", type=int, default=None, help="input resolution (default: 224)")
    speed.add_argument("--rounds", type=int, default=None, help="timed rounds (default per profile)")
    p.add_argument(
        "--compile",
        action="store_true",
        help="train every cell under torch.compile (cells of their own: their key says compiled); "
        "a step-time speed table times every variant compiled as well",
    )
    p.add_argument(
        "--cached-only",
        action="store_true",
        help="write the table from the cached cells alone, the others shown pending; train nothing",
    )
    add_executor_arguments(p, "the cells train")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="training logs on the terminal (default: results/logs/<cell>.log)",
    )
    p.set_defaults(func=cmd_table)
    return p


def seeds_arg(text: str) -> int | str:
    if text == "plan":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a whole number or 'plan', got {text!r}") from None


def cmd_table(args) -> int:
    from tables.generate import cell_executor, generate
    from tasks.datasets import DatasetNotFoundError

    if args.name not in list_tables():
        print(f"error: unknown table {args.name!r}; choose from {', '.join(list_tables())}", file=sys.stderr)
        return 2
    speed_only = [f"--{a}" for a in ("batch", "size", "rounds") if getattr(args, a) is not None]
    if speed_only and args.name not in SPEED_SPECS:
        print(f"error: {', '.join(speed_only)} applies to the speed tables only", file=sys.stderr)
        return 2
    if args.profile not in PROFILES:
        print(f"error: unknown profile {args.profile!r}; choose from {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    if args.seeds == "plan":
        if args.name in SPEED_SPECS:
            args.seeds = None  # a speed table times one cell: no seeds (`make tables SEEDS=plan` reaches it)
        else:
            from tables.seed_plan import planned_seeds

            args.seeds = planned_seeds(args.name, args.profile)  # a ValueError (one line, exit 2) without one
    if args.seeds is not None and args.seeds < 1:
        print(f"error: --seeds must be at least 1, got {args.seeds}", file=sys.stderr)
        return 2
    if args.name in SPEED_SPECS:
        if args.cached_only:
            print(
                "error: --cached-only applies to the training tables (a speed table is one cell)",
                file=sys.stderr,
            )
            return 2
        return _speed_table(args)
    command = f"repro table {args.name} --profile {args.profile}"
    if args.device:
        command += f" --device {args.device}"
    if args.seeds is not None:
        command += f" --seeds {args.seeds}"
    if args.data_root:
        command += f" --data-root {args.data_root}"
    if args.cached_only:
        command += " --cached-only"
    if args.compile:
        command += " --compile"
    try:
        resources = executor_resources(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if resources is not None:
        command += " --executor slurm"  # and its resources: their ranks are in the cells' keys
        for flag, value in (("--slurm-args", args.slurm_args), ("--slurm-config", args.slurm_config)):
            command += f" {flag} {shlex.quote(str(value))}" if value else ""
    else:  # a Slurm job chooses its device where it runs
        use_device(args.device)  # a ValueError (one line, exit 2) where the device is not here
    try:
        out = generate(
            args.name,
            profile=args.profile,
            seeds=args.seeds,
            data_root=args.data_root,
            results_dir=args.results_dir,
            progress=not args.no_progress,
            command=command,
            verbose=args.verbose,
            skip_bad_samples=args.skip_bad_samples,
            cached_only=args.cached_only,
            compiled=args.compile,
            executor=cell_executor(args.executor, resources, args.device),
        )
    except KeyboardInterrupt:
        jobs = " (the Slurm jobs go on: run it again to wait for them)" if args.executor == "slurm" else ""
        print(
            f"\ninterrupted: every cell finished so far is cached under {args.results_dir}/cache; "
            f"run `{command}` again to resume{jobs}",
            file=sys.stderr,
        )
        return 130
    except DatasetNotFoundError as err:
        print(f"error: {err}", file=sys.stderr)  # every cell would fail alike: no table, no error rows
        return 2
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(out.markdown)
    print(
        f"wrote {out.paths['md']}, {out.paths['csv']} and {out.paths['meta']} "
        f"({out.ran} cells run, {out.cached} cached, {out.errors} failed)",
        file=sys.stderr,
    )
    return 1 if out.errors else 0


def _speed_table(args) -> int:
    from tables.speed import generate_speed

    command = f"repro table {args.name} --profile {args.profile}"
    for a in ("device", "batch", "size", "rounds"):
        if getattr(args, a) is not None:
            command += f" --{a} {getattr(args, a)}"
    if args.compile:
        command += " --compile"
    try:
        out = generate_speed(
            args.name,
            profile=args.profile,
            device=args.device,
            batch=args.batch,
            size=args.size,
            rounds=args.rounds,
            results_dir=args.results_dir,
            progress=not args.no_progress,
            command=command,
            compiled=args.compile,
        )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: the rounds timed so far are saved under {args.results_dir}/cache; "
            f"run `{command}` again to resume",
            file=sys.stderr,
        )
        return 130
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(out.markdown)
    print(
        f"wrote {out.paths['md']}, {out.paths['csv']} and {out.paths['meta']}"
        + (" (from the cache)" if out.cached else ""),
        file=sys.stderr,
    )
    return 0


def main(argv=None) -> int:
    """Stand-alone entry (`python -m tables.cli table4`), the same as `repro table`."""
    from repro.third_party_warnings import filter_known

    filter_known()
    parser = argparse.ArgumentParser(prog="repro")
    sub = parser.add_subparsers(dest="command", required=True)
    add_table_parser(sub)
    args = parser.parse_args(["table", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
