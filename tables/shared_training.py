"""Cells that train the very run another cell trains: scored from that cell's cache entry, not trained again.

At the embedded and smoke profiles one generated set stands in for COCO and for VOC, so DAIQ Table 5's COCO
and VOC rows of one model, method and seed are one training scored two ways (tasks.detection). The task
kept that in a memo of its process, lost whenever a table process ended: a table killed between the two
cells, resumed in a new session or shared out by `make JOBS=2` trained its VOC cells again (docs/tables.md).
A task says which cells are twins (`training_twins(model, profile, paper_dataset)`) and how a twin's result
is scored as another's (`rescored(result, paper_dataset)`); tasks without them share nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tables.cells import Cache, Cell


@dataclass(frozen=True)
class SharedTraining:
    twin_datasets: Callable[[str, str, str], tuple[str, ...]]  # (model, profile, paper_dataset) -> datasets
    rescore: Callable[[Mapping[str, Any], str], dict[str, Any]]  # (a twin's result, paper_dataset)

    @classmethod
    def of_task(cls, task_name: str) -> SharedTraining | None:
        import tasks

        module = tasks.get_task(task_name)
        twins, rescore = getattr(module, "training_twins", None), getattr(module, "rescored", None)
        return None if twins is None or rescore is None else cls(twins, rescore)

    def twins(self, cell: Cell) -> list[Cell]:
        """The cells that train `cell`'s run (the same cell for another paper dataset)."""
        datasets = self.twin_datasets(cell.model, cell.profile, cell.paper_dataset)
        return [dataclasses.replace(cell, paper_dataset=d) for d in datasets]

    def from_cache(self, cache: Cache, cell: Cell) -> tuple[Cell, dict[str, Any]] | None:
        """(the twin, its cache entry with the result scored as `cell`'s) from the first twin cached."""
        for twin in self.twins(cell):
            entry = cache.load(twin)
            if entry is not None:
                return twin, {**entry, "result": self.rescore(entry["result"], cell.paper_dataset)}
        return None
