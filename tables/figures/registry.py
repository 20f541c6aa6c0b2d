"""The figures drawn from recorded trainings, by make-target name, and how one is made.

Each module in FIGURES has RUNS (the names of the recorded runs it draws from, tables.figures.runs) and
draw(runs, out) -> the paths it wrote (a PNG and the CSV of its plotted data; UI8 Table 1 also its
Markdown table). `make` trains the runs the cache lacks, then draws into <results>/figures/.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

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
) -> list[Path]:
    """Train the runs figure `name` needs that are not cached, then draw it; returns the paths written."""
    from tables.figures.runs import ensure

    module = get_figure(name)
    runs = ensure(module.RUNS, profile, results_dir, data_root, progress, verbose)
    return module.draw(runs, Path(results_dir) / "figures")
