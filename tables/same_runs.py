"""Did a regeneration give the kept runs? Top-1 and per-image flags of two results folders, run by run.

    python -m tables.same_runs --new /work/run/results --kept results/reference/embedded [NAME ...]

For every table both folders hold with its runs (`<name>.runs.csv.gz`), each cell (network, method,
options, seed, and the row's dataset; one FP32 cell however many rows it serves) is looked up on both
sides and compared: the same top-1 and the same 10,000 per-image flags, the same top-1 only, or different
(how many images' flags differ). For figures (`figures/<name>.meta.json`) each recorded run's final top-1.
Cells trained with another thread count sum their floats in another order, so they may differ: the
thread counts are printed beside each table. Exit 0 when everything compared is the same, 1 when a run
differs, 2 when the folders hold nothing to compare. Nothing trains.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tasks.top1 import unpack_flags


@dataclass
class Outcome:
    """What one table's or figure's comparison found."""

    name: str
    same: int = 0  # top-1 and per-image flags (figures: top-1)
    same_top1_only: int = 0  # the flags missing on a side (detection's AP has none)
    unit: str = "cells"
    differ: list[str] = field(default_factory=list)
    kept_only: int = 0
    new_only: int = 0
    threads: str = ""


def _cells(folder: Path, name: str) -> tuple[dict[tuple, dict], set] | None:
    """Table `name`'s runs in `folder` by cell, and the thread counts they trained with; None without a
    runs file."""
    path = folder / f"{name}.runs.csv.gz"
    if not path.exists():
        return None
    runs = pd.read_csv(path, dtype={"flags": str, "options": str})
    rows = folder / f"{name}.csv"
    datasets = {}
    if rows.exists():
        frame = pd.read_csv(rows)
        if "dataset" in frame:
            datasets = frame["dataset"].astype(str).to_dict()
    cells: dict[tuple, dict] = {}
    for r in runs.to_dict("records"):
        fp32 = r["precision"] == "fp32"
        options = "" if fp32 or not isinstance(r["options"], str) else r["options"]
        key = (datasets.get(int(r["row"]), ""), r["model"], "fp32" if fp32 else r["method"], options,
               int(r["seed"]))  # fmt: skip
        cells.setdefault(key, r)
    return cells, set(runs["threads"].dropna().astype(int))


def _label(key: tuple) -> str:
    dataset, model, method, options, seed = key
    where = f" ({dataset})" if dataset else ""
    return f"{model} {method}{' ' + options if options else ''}{where} seed {seed}"


def _top1(r: dict) -> float | None:
    v = r.get("value")
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def compare_table(new: Path, kept: Path, name: str) -> Outcome | None:
    got, had = _cells(new, name), _cells(kept, name)
    if got is None or had is None:
        return compare_rows(new, kept, name)
    (new_cells, new_threads), (kept_cells, kept_threads) = got, had
    out = Outcome(name)
    out.threads = f"threads kept {sorted(kept_threads)}, new {sorted(new_threads)}"
    out.kept_only = len(kept_cells.keys() - new_cells.keys())
    out.new_only = len(new_cells.keys() - kept_cells.keys())
    for key in sorted(kept_cells.keys() & new_cells.keys(), key=str):
        a, b = kept_cells[key], new_cells[key]
        ta, tb = _top1(a), _top1(b)
        fa, fb = unpack_flags(a.get("flags")), unpack_flags(b.get("flags"))
        if ta is None and tb is None and a.get("diverged") == b.get("diverged"):
            out.same += 1  # both diverged (or both unfinished): nothing more to compare
        elif ta != tb:
            flags = "" if fa is None or fb is None else f", flags differ at {_differing(fa, fb)} images"
            out.differ.append(f"{_label(key)}: kept {_show(ta)}, new {_show(tb)}{flags}")
        elif fa is None or fb is None:
            out.same_top1_only += 1
        elif fa == fb:
            out.same += 1
        else:
            n = _differing(fa, fb)
            out.differ.append(f"{_label(key)}: the same top-1 {_show(ta)}, flags differ at {n} images")
    return out


ROW_KEYS = ("model", "method", "label", "options", "dataset")


def compare_rows(new: Path, kept: Path, name: str) -> Outcome | None:
    """Where a side kept no runs (tables kept before 2026-11-27): the rows' FP32 and INT8 means."""
    paths = [folder / f"{name}.csv" for folder in (new, kept)]
    if not all(p.exists() for p in paths):
        return None
    new_rows, kept_rows = (
        {tuple(str(r.get(k, "")) for k in ROW_KEYS): r for r in pd.read_csv(p).to_dict("records")}
        for p in paths
    )
    out = Outcome(name, unit="rows' FP32 and INT8 means (no runs kept on a side)")
    counts = [_meta_threads(folder / f"{name}.meta.json") for folder in (kept, new)]
    if all(counts):
        out.threads = f"threads kept {counts[0]}, new {counts[1]}"

    out.kept_only = len(kept_rows.keys() - new_rows.keys())
    out.new_only = len(new_rows.keys() - kept_rows.keys())
    for key in sorted(kept_rows.keys() & new_rows.keys()):
        a, b = kept_rows[key], new_rows[key]
        pairs = [(p, _top1({"value": a.get(p)}), _top1({"value": b.get(p)})) for p in ("fp32", "int8")]
        if all(x == y for _, x, y in pairs):
            out.same += 1
        else:
            said = ", ".join(f"{p} kept {_show(x)}, new {_show(y)}" for p, x, y in pairs)
            out.differ.append(f"{key[0]} {key[2]}{' (' + key[4] + ')' if key[4] != 'nan' else ''}: {said}")
    return out


def _meta_threads(path: Path) -> str:
    """The thread count(s) a table's device line names ("1 thread", "1-2 threads"), "" if none."""
    try:
        device = str(json.loads(path.read_text()).get("device", ""))
    except (OSError, ValueError):
        return ""
    found = re.search(r"([0-9][0-9-]*) threads?\b", device)
    return f"[{found.group(1)}]" if found else ""


def _differing(a: list[int], b: list[int]) -> int:
    return sum(x != y for x, y in zip(a, b, strict=False)) + abs(len(a) - len(b))


def _show(v: float | None) -> str:
    return "none (diverged or unfinished)" if v is None else f"{v:.2f}"


def compare_figure(new: Path, kept: Path, name: str) -> Outcome | None:
    paths = [folder / "figures" / f"{name}.meta.json" for folder in (new, kept)]
    if not all(p.exists() for p in paths):
        return None
    new_runs, kept_runs = (json.loads(p.read_text()).get("runs", {}) for p in paths)
    out = Outcome(name, unit="recorded runs' final top-1")
    out.kept_only = len(kept_runs.keys() - new_runs.keys())
    out.new_only = len(new_runs.keys() - kept_runs.keys())
    for run in sorted(kept_runs.keys() & new_runs.keys()):
        a, b = kept_runs[run].get("top1"), new_runs[run].get("top1")
        if a == b:
            out.same += 1
        else:
            out.differ.append(f"{run}: kept {a}, new {b}")
    return out


def names_in(folder: Path) -> tuple[list[str], list[str]]:
    from tables.specs import SPECS  # the training tables: the speed tables hold no runs

    metas = (p.name.removesuffix(".meta.json") for p in folder.glob("*.meta.json"))
    tables = sorted(n for n in metas if n in SPECS)
    figures = sorted(p.name.removesuffix(".meta.json") for p in (folder / "figures").glob("*.meta.json"))
    return tables, figures


def report(outcomes: list[Outcome]) -> str:
    lines = []
    for o in outcomes:
        extra = [f"{o.same_top1_only} the same score, no per-image flags"] if o.same_top1_only else []
        extra += [f"{n} {side} only" for n, side in ((o.kept_only, "kept"), (o.new_only, "new")) if n]
        head = f"{o.name}, {o.unit}: {o.same} the same, {len(o.differ)} differ"
        lines.append(head + "".join(f", {e}" for e in extra) + (f" ({o.threads})" if o.threads else ""))
        lines += [f"  {d}" for d in o.differ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tables.same_runs", description=__doc__.split("\n")[0])
    parser.add_argument("--new", type=Path, required=True, help="the regenerated results folder")
    parser.add_argument("--kept", type=Path, default=Path("results/reference/embedded"))
    parser.add_argument("names", nargs="*", help="tables or figures (default: every one both folders hold)")
    args = parser.parse_args(argv)
    for folder in (args.new, args.kept):
        if not folder.is_dir():
            print(f"same_runs: {folder} is not a folder", file=sys.stderr)
            return 2
    if args.names:
        tables = figures = args.names
    else:
        (nt, nf), (kt, kf) = names_in(args.new), names_in(args.kept)
        tables, figures = sorted(set(nt) & set(kt)), sorted(set(nf) & set(kf))
    outcomes = [o for n in tables if (o := compare_table(args.new, args.kept, n)) is not None]
    outcomes += [o for n in figures if (o := compare_figure(args.new, args.kept, n)) is not None]
    if not outcomes:
        print(f"same_runs: {args.new} and {args.kept} hold no table with its runs, or figure, in common",
              file=sys.stderr)  # fmt: skip
        return 2
    print(report(outcomes))
    return 1 if any(o.differ for o in outcomes) else 0


if __name__ == "__main__":
    sys.exit(main())
