"""The project's MMEngine registries: children of MMEngine's, in the scope ``tasks``.

A config names a class registered here as ``"tasks.<ClassName>"`` (``dict(type="tasks.RunRecorder")``)
from any default scope, MMDetection's included. Meeting the scope, MMEngine imports this module, and a
registry imports the modules in its ``locations`` on its first lookup: a config needs no custom_imports,
and a name registered twice is an error instead of a silent overwrite (no ``force=True``). The
registered classes live in modules that never run as ``__main__``, so nothing registers twice.
repro.hooks' hooks (Int8TrainingHook, StatsRecorderHook) stay in MMEngine's own HOOKS: the repro floor
cannot import tasks, and every scope finds them there.
"""

from __future__ import annotations

from mmengine.registry import DATASETS as MMENGINE_DATASETS
from mmengine.registry import HOOKS as MMENGINE_HOOKS
from mmengine.registry import LOOPS as MMENGINE_LOOPS
from mmengine.registry import METRICS as MMENGINE_METRICS
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import PARAM_SCHEDULERS as MMENGINE_PARAM_SCHEDULERS
from mmengine.registry import Registry

SCOPE = "tasks"

MODELS = Registry("model", parent=MMENGINE_MODELS, scope=SCOPE, locations=["tasks.classifiers"])
DATASETS = Registry(
    "dataset",
    parent=MMENGINE_DATASETS,
    scope=SCOPE,
    locations=["tasks.classification_dataset", "tasks.video_loader"],
)
METRICS = Registry("metric", parent=MMENGINE_METRICS, scope=SCOPE, locations=["tasks.top1"])
PARAM_SCHEDULERS = Registry(
    "parameter scheduler", parent=MMENGINE_PARAM_SCHEDULERS, scope=SCOPE, locations=["tasks.top1"]
)
LOOPS = Registry("loop", parent=MMENGINE_LOOPS, scope=SCOPE, locations=["tasks.train_loops"])
HOOKS = Registry(
    "hook", parent=MMENGINE_HOOKS, scope=SCOPE, locations=["tasks.checkpoints", "tasks.run_recorder"]
)


def scoped(name: str) -> str:
    """The config type of a class registered here."""
    return f"{SCOPE}.{name}"
