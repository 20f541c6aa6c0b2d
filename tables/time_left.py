"""A table's time left, from its cells already timed. tqdm's own estimate (cells left times the mean time a
cell so far) swings with the order the cells come in: in DAIQ Table 4 an AlexNet cell takes a minute and an
InceptionV3 cell several, so it said 2 hours or 4 over one run. Here a cell not yet run is expected to take
what the same row's cells took at other seeds, else what its network's cells took, else the table's mean;
the sum is shared by the processes that share the cells (`make NAME JOBS=n`). A figure's runs repeat no row,
so each is counted at its estimated work (tables.figures.run_order) times the seconds a unit of work took in
the runs timed so far.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping
from statistics import fmean

from tables.cells import Cell


def _row(cell: Cell) -> Cell:
    return dataclasses.replace(cell, seed=-1)


def seconds_left(pending: Iterable[Cell], timed: Mapping[Cell, float], jobs: int = 1) -> float | None:
    """Seconds until the `pending` cells are done, `timed` the cells' own times so far (None: none timed)."""
    if not timed:
        return None
    by_row: dict[Cell, list[float]] = defaultdict(list)
    by_model: dict[tuple[str, str], list[float]] = defaultdict(list)
    for cell, seconds in timed.items():
        by_row[_row(cell)].append(seconds)
        by_model[cell.task, cell.model].append(seconds)
    mean = fmean(timed.values())
    work = 0.0
    for cell in pending:
        alike = by_row.get(_row(cell)) or by_model.get((cell.task, cell.model))
        work += fmean(alike) if alike else mean
    return work / max(1, jobs)


def seconds_left_by_work(
    pending: Iterable[float], timed: Iterable[tuple[float, float]], jobs: int = 1
) -> float | None:
    """Seconds until runs of estimated work `pending` are done, `timed` the (work, seconds) of runs so far."""
    timed = list(timed)
    work = sum(w for w, _ in timed)
    if work <= 0:
        return None
    return sum(pending) * sum(s for _, s in timed) / work / max(1, jobs)
