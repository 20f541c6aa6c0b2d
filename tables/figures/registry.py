"""The figures drawn from recorded trainings, by make-target name, and how one is made.

Each module in FIGURES has RUNS (the names of the recorded runs it draws from, tables.figures.runs) and
draw(runs, out) -> the paths it wrote (a PNG and the CSV of its plotted data; UI8 Table 1 also its
Markdown table). `make` trains the runs the cache lacks, then draws into <results>/figures/, with
<name>.meta.json: what was drawn from which runs, on which device, at which commit.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from atomic_files import write_file
from tables import provenance

FIGURES: dict[str, str] = {
    "ui8-table1": "ui8_table1",
    "ui8-figure2": "ui8_figure2",
    "ui8-figure3": "ui8_figure3",
    "ui8-figure4": "ui8_figure4",
    "ui8-figure6": "ui8_figure6",
    "ui8-supplement-figure1": "ui8_supplement_figure1",
    "ui8-supplement-figure2": "ui8_supplement_figure2",
    "ui8-supplement-figure3": "ui8_supplement_figure3",
    "daiq-figure1": "daiq_figure1",
    "daiq-figure3": "daiq_figure3",
    "wageubn-figure6": "wageubn_figure6",
    "wageubn-figure7": "wageubn_figure7",
    "wageubn-figure8": "wageubn_figure8",
    "wageubn-figure9": "wageubn_figure9",
    "wageubn-figure10": "wageubn_figure10",
}


def list_figures() -> list[str]:
    return list(FIGURES)


def get_figure(name: str) -> ModuleType:
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; choose from {', '.join(FIGURES)}")
    return importlib.import_module(f"tables.figures.{FIGURES[name]}")


def make(
    name: str,
    profile: str = "embedded",
    results_dir: str | Path = "results",
    data_root: str | None = None,
    progress: bool = True,
    verbose: bool = False,
    executor: Any = None,
) -> list[Path]:
    """Train the runs figure `name` needs that are not cached (here, or each as a Slurm job with `executor`:
    tables.slurm_executor), then draw it; returns the paths written."""
    from tables.figures.runs import ensure

    module = get_figure(name)
    runs = ensure(module.RUNS, profile, results_dir, data_root, progress, verbose, executor)
    out = Path(results_dir) / "figures"
    paths = module.draw(runs, out)
    meta = out / f"{name}.meta.json"
    write_file(meta, json.dumps(describe(name, profile, runs, paths), indent=1, default=str) + "\n")
    return [*paths, meta]


def describe(name: str, profile: str, runs: Mapping[str, Any], paths: list[Path]) -> dict[str, Any]:
    """A figure's metadata: its files, profile, data, devices and commit, and each run it draws from (how
    it was trained, its result, where and at which commit)."""
    return {
        "figure": name,
        "files": [p.name for p in paths],
        "profile": profile,
        "data": sorted({r.data for r in runs.values()}),
        "devices": sorted({r.meta["device"] for r in runs.values()}),
        **provenance.as_dict(),
        "generated_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "command": f"make {name} PROFILE={profile}",
        "runs": {
            run_name: {
                "spec": r.meta["spec"],
                "top1": r.result.get("top1"),
                "diverged": r.diverged,
                "iters": r.result.get("iters"),
                "batch_size": r.meta["batch_size"],
                "lr": r.meta["lr"],
                "elapsed_s": r.meta["elapsed_s"],
                "finished_at": r.meta["finished_at"],
                "trained_at": r.meta.get("trained_at", "not recorded"),
            }
            for run_name, r in runs.items()
        },
    }
