"""RunSpec: what one training run is, the record a table cell, a run's identity and a result share.

A task's ``run(model, method, ...)`` makes one; the harness (tasks.runner) trains it, keys its checkpoints'
identity on it and reports it in the RunResult; a table cell (tables.cells.Cell) is a RunSpec plus the
recipe version and the backends' arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunSpec:
    task: str
    model: str
    method: str
    profile: str
    paper_dataset: str
    seed: int = 0
    method_options: dict[str, Any] = field(default_factory=dict)  # typed as the method types them
    data_root: str | None = None

    @property
    def resolved_data_root(self) -> str | None:
        """The data root as an absolute path (what a run's identity and a cell's key hold)."""
        return None if self.data_root is None else str(Path(self.data_root).expanduser().resolve())

    def fields(self) -> dict[str, Any]:
        return asdict(self)

    def run_arguments(self) -> dict[str, Any]:
        """The keyword arguments of the task's ``run`` that make this run."""
        out = self.fields()
        del out["task"]
        return out
