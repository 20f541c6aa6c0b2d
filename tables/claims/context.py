"""What a claim reads: the tables and figures at a profile, generated on demand (cached) or read from a
kept results directory, each remembered with the command that makes it."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd


class NotKept(LookupError):
    """A table the report reads is not among the kept results it was pointed at."""


def make_command(name: str, profile: str, meta: dict | None = None, **options) -> str:
    """The command a reader pastes to make table or figure `name` again: `make NAME PROFILE=...`, with
    the options that were given (SEEDS=, DEVICE=, RESULTS=) and COMPILE=1 where the speed table timed
    compiled steps too."""
    command = f"make {name} PROFILE={profile}"
    for option, value in options.items():
        if value is not None:
            command += f" {option.upper()}={value}"
    if "--compile" in str((meta or {}).get("command", "")):
        command += " COMPILE=1"
    return command


@dataclass
class Context:
    """The measurements a report reads, generated on demand (cached) and remembered with their commands."""

    profile: str = "embedded"
    results_dir: Path = Path("results")
    seeds: int | None = None
    device: str | None = None
    progress: bool = True
    kept: Path | None = None  # read the tables from this directory's kept CSVs instead of generating them
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    metas: dict[str, dict] = field(default_factory=dict)
    commands: dict[str, str] = field(default_factory=dict)
    run_frames: dict[str, pd.DataFrame | None] = field(default_factory=dict)

    def _results(self) -> str | None:
        return None if self.results_dir == Path("results") else str(self.results_dir)

    def table(self, name: str) -> pd.DataFrame:
        """The rendered table `name` (training or speed table) at this profile, generating missing cells."""
        if name not in self.frames and self.kept is not None:
            csv, meta = self.kept / f"{name}.csv", self.kept / f"{name}.meta.json"
            if not csv.exists():
                raise NotKept(f"{name} is not among the kept results in {self.kept} (`make {name}` runs it)")
            self.frames[name] = pd.read_csv(csv)
            self.metas[name] = json.loads(meta.read_text()) if meta.exists() else {}
            self.commands[name] = make_command(
                name, self.metas[name].get("profile", self.profile), self.metas[name]
            )
        if name not in self.frames:
            from tables.specs import SPEED_SPECS

            if name in SPEED_SPECS:
                from tables.speed import generate_speed

                out = generate_speed(name, profile=self.profile, device=self.device,
                                     results_dir=self.results_dir, progress=self.progress)  # fmt: skip
                options = {"device": self.device}
            else:
                from tables.generate import generate

                out = generate(name, profile=self.profile, seeds=self.seeds, results_dir=self.results_dir,
                               progress=self.progress)  # fmt: skip
                options = {"seeds": self.seeds}
            self.frames[name], self.metas[name] = out.frame, out.meta
            self.commands[name] = make_command(name, self.profile, **options, results=self._results())
        return self.frames[name]

    def failed_cells(self, name: str) -> list[str]:
        """The cells of table `name` (read already) that failed, each "<cell>: <why>" (a Slurm job's id and
        the tail of its stderr); for a table kept before its sidecar listed them, its rows whose status is an
        error (the first error of each)."""
        if name not in self.frames:
            return []
        listed = self.metas.get(name, {}).get("failed_cells")
        if listed is not None:
            return [f"{c['cell']}: {c['error']}" for c in listed]
        frame = self.frames[name]
        if "status" not in frame:
            return []
        return [
            f"row {r.get('model', '')} {r.get('label', '')}: {str(r['status']).removeprefix('error: ')}"
            for r in frame.to_dict("records")
            if str(r["status"]).startswith("error:")
        ]

    def runs(self, name: str) -> pd.DataFrame | None:
        """The runs behind table `name`'s rows (tables.render.RUNS_COLUMNS), or None where none were kept
        (tables kept before 2026-11-27 have none)."""
        self.table(name)
        if name not in self.run_frames:
            found = self.metas.get(name, {}).get("row_runs")
            if found is None and self.kept is not None:
                path = self.kept / f"{name}.runs.csv.gz"
                found = pd.read_csv(path, dtype={"flags": str}) if path.exists() else None
            self.run_frames[name] = found
        return self.run_frames[name]

    def figure(self, name: str) -> pd.DataFrame:
        """The plotted data (CSV) of figure `name` at this profile, drawing it (and training its runs) if
        needed, or read from the kept results' figures/ directory."""
        if name not in self.frames:
            if self.kept is not None:
                csv = self.kept / "figures" / f"{name}.csv"
                if not csv.exists():
                    raise NotKept(f"{name} is not among the kept figures in {self.kept / 'figures'} "
                                  f"(`make {name}` draws it)")  # fmt: skip
                self.commands[name] = make_command(name, self.profile)
            else:
                from tables.figures.registry import make

                paths = make(name, self.profile, self.results_dir, progress=self.progress)
                csv = next(p for p in paths if p.suffix == ".csv")
                self.commands[name] = make_command(name, self.profile, results=self._results())
            self.frames[name] = pd.read_csv(csv)
        return self.frames[name]


def row(frame: pd.DataFrame, **match) -> pd.Series:
    """The one row of `frame` whose columns hold the values `match` names."""
    hit = frame
    for k, v in match.items():
        hit = hit[hit[k] == v]
    if len(hit) != 1:
        raise KeyError(f"{len(hit)} rows match {match}")
    return hit.iloc[0]


def final_top1(frame: pd.DataFrame, by: str = "run") -> dict[str, float]:
    """A figure's curves' last validation top-1, by curve."""
    done = frame.dropna(subset=["val_top1"])
    return {str(k): float(v) for k, v in done.groupby(by)["val_top1"].last().items()}


def crashed(top1: float) -> bool:
    """A run that ended near chance (10 classes) or not at all: the papers' "crash"."""
    return math.isnan(top1) or top1 < 20.0
