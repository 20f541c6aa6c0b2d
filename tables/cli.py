"""`repro table NAME`: regenerate one paper table (see tables.generate).

    repro table table4 [--profile embedded] [--seeds N] [--data-root D] [--results-dir results]

NAME is the make-target name: table1..table4 (DAIQ's numbering), ui8-table3..ui8-table7,
wageubn-table1, wageubn-table2. Exit status: 0 written, 1 written with failed cells (or the task is
not available), 2 bad arguments, 130 interrupted (finished cells stay cached; rerun to resume).
"""

from __future__ import annotations

import argparse
import sys

from tables.generate import DEFAULT_SEEDS, PROFILES
from tables.specs import SPECS, list_tables


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
        "--seeds", type=int, default=None, help=f"number of seeds (default per profile: {defaults})"
    )
    p.add_argument("--data-root", default=None, help="where the paper profile finds its datasets")
    p.add_argument("--results-dir", default="results", help="output and cache directory (default results)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="training logs on the terminal (default: results/logs/<cell>.log)",
    )
    p.set_defaults(func=cmd_table)
    return p


def cmd_table(args) -> int:
    from tables.generate import generate

    if args.name not in SPECS:
        print(f"error: unknown table {args.name!r}; choose from {', '.join(list_tables())}", file=sys.stderr)
        return 2
    if args.profile not in PROFILES:
        print(f"error: unknown profile {args.profile!r}; choose from {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    if args.seeds is not None and args.seeds < 1:
        print(f"error: --seeds must be at least 1, got {args.seeds}", file=sys.stderr)
        return 2
    command = f"repro table {args.name} --profile {args.profile}"
    if args.seeds is not None:
        command += f" --seeds {args.seeds}"
    if args.data_root:
        command += f" --data-root {args.data_root}"
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
        )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: every cell finished so far is cached under {args.results_dir}/cache; "
            f"run `{command}` again to resume",
            file=sys.stderr,
        )
        return 130
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


def main(argv=None) -> int:
    """Stand-alone entry (`python -m tables.cli table4`), the same as `repro table`."""
    parser = argparse.ArgumentParser(prog="repro")
    sub = parser.add_subparsers(dest="command", required=True)
    add_table_parser(sub)
    args = parser.parse_args(["table", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
