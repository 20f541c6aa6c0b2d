"""Tasks: each builds a model, data and metric for a (dataset, profile) and trains on MMEngine's Runner.

    TASKS = {"classification": "tasks.classification"}   # detection and video plug in here
    get_task("classification").run("resnet18", "daiq", profile="embedded")

A task module exposes `run(model, method, profile=..., seed=..., ...) -> RunResult`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

TASKS: dict[str, str] = {
    "classification": "tasks.classification",
    "video": "tasks.video",
    "detection": "tasks.detection",
}


def list_tasks() -> list[str]:
    return list(TASKS)


def get_task(name: str) -> ModuleType:
    """The task's module (imported on first use)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return importlib.import_module(TASKS[name])
