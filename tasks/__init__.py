"""Tasks: each builds a model, data and metric for a (dataset, profile) and trains on MMEngine's Runner
through the shared harness (tasks.runner).

    get_task("classification").run("resnet18", "daiq", profile="embedded")

A task module exposes `run(model, method, profile=..., seed=..., ...) -> tasks.runner.RunResult`, its
RECIPE_VERSION (the tables' cache key holds it; MODEL_RECIPE_VERSIONS, if any, the models whose recipe
changed alone) and `build_config` (the Runner config of one run).
"""

from __future__ import annotations

import importlib
from types import ModuleType

TASKS: dict[str, str] = {
    "classification": "tasks.classification",
    "video": "tasks.video",
    "detection": "tasks.detection",
}

# The scales every task and table runs at: smoke (seconds, for tests and CI), embedded (data the project
# makes or ships, whole tables in minutes on a CPU) and paper (the papers' protocol, for GPUs).
PROFILES = ("smoke", "embedded", "paper")


def list_tasks() -> list[str]:
    return list(TASKS)


def recipe_version(task: ModuleType, model: str) -> str | None:
    """The recipe version a run of `model` is keyed on: the model's own where its recipe changed alone
    (the task's MODEL_RECIPE_VERSIONS), else the task's RECIPE_VERSION."""
    version = getattr(task, "MODEL_RECIPE_VERSIONS", {}).get(model, getattr(task, "RECIPE_VERSION", None))
    return None if version is None else str(version)


def get_task(name: str) -> ModuleType:
    """The task's module (imported on first use)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return importlib.import_module(TASKS[name])
