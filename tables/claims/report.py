"""The report: every claim checked in a context (a failing check is an inconclusive verdict, the others
still run), written as claims.md and claims.csv, and its command line (`python -m tables.claims`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from atomic_files import write_file
from tables.claims.context import Context, NotKept
from tables.claims.registry import CLAIMS
from tables.claims.render import markdown
from tables.claims.verdict import INCONCLUSIVE, Verdict, with_failed_cells

CSV_COLUMNS = ["key", "paper", "source", "claim", "verdict", "key_number", "measurement", "reason",
               "commands", "profile", "failed_cells"]  # fmt: skip


def evaluate(ctx: Context, claims=CLAIMS) -> pd.DataFrame:
    records = []
    for claim in claims:
        try:
            v = claim.check(ctx)
        except NotKept as err:
            v = Verdict(INCONCLUSIVE, "", f"not measured: {err}")
        except Exception as err:  # noqa: BLE001 - one claim's failure is reported, the rest still run
            v = Verdict(INCONCLUSIVE, "", f"could not be measured: {type(err).__name__}: {err}")
        commands = "; ".join(ctx.commands[n] for n in claim.needs if n in ctx.commands)
        failed = [f"{name}: {cell}" for name in claim.needs for cell in ctx.failed_cells(name)]
        if failed:  # judged on fewer cells than its tables have: never silently
            v = with_failed_cells(v, failed)
        records.append(
            {"key": claim.key, "paper": claim.paper, "source": claim.source, "claim": claim.text,
             "verdict": v.verdict, "key_number": v.key, "measurement": v.measurement, "reason": v.reason,
             "commands": commands, "profile": ctx.profile, "failed_cells": "\n".join(failed)}
        )  # fmt: skip
    return pd.DataFrame.from_records(records, columns=CSV_COLUMNS)


def write(ctx: Context, claims=CLAIMS) -> tuple[pd.DataFrame, dict[str, Path]]:
    frame = evaluate(ctx, claims)
    ctx.results_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": ctx.results_dir / "claims.md", "csv": ctx.results_dir / "claims.csv"}
    write_file(paths["md"], markdown(frame, ctx))
    write_file(paths["csv"], frame.to_csv(index=False))
    return frame, paths


def main(argv=None) -> int:
    from tables.claims import __doc__ as doc
    from tasks import PROFILES

    ap = argparse.ArgumentParser(prog="python -m tables.claims", description=doc.split("\n\n")[0])
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--results-dir", default="results", type=Path)
    ap.add_argument("--seeds", type=int, default=None)
    ap.add_argument("--device", default=None, help="the speed tables' device (default: cuda when present)")
    ap.add_argument("--no-progress", action="store_true")
    kept_help = "read the tables kept in this directory (e.g. results/reference/embedded), generate none"
    ap.add_argument("--kept", type=Path, default=None, help=kept_help)
    args = ap.parse_args(argv)
    if args.profile not in PROFILES:
        print(f"error: unknown profile {args.profile!r}; choose from {', '.join(PROFILES)}", file=sys.stderr)
        return 2
    if args.kept is not None and not args.kept.is_dir():
        print(f"error: --kept {args.kept}: no such directory", file=sys.stderr)
        return 2
    ctx = Context(args.profile, args.results_dir, args.seeds, args.device, not args.no_progress, args.kept)
    frame, paths = write(ctx)
    print(paths["md"].read_text())
    print(f"wrote {paths['md']} and {paths['csv']}", file=sys.stderr)
    failed = frame["failed_cells"].astype(bool).sum()
    if failed:  # as the table command that left them: exit 1
        print(f"{failed} claims read tables with failed cells: their details say which, and why",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0
