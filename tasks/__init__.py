"""Tasks: each builds a model, data and metric for a (dataset, profile) and trains on MMEngine's Runner
through the shared harness (tasks.runner).

    get_task("classification").run("resnet18", "daiq", profile="embedded")

A task module exposes `run(model, method, profile=..., seed=..., ...) -> tasks.runner.RunResult`, its
RECIPE_VERSION (the tables' cache key holds it) and `build_config` (the Runner config of one run).
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


def get_task(name: str) -> ModuleType:
    """The task's module (imported on first use)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    return importlib.import_module(TASKS[name])
