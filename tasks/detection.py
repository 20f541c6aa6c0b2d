"""Object detection through MMDetection 3, FP32 or INT8 by the same hook as every other task.

Any MMDetection config becomes an INT8 run with two keys (the configs in tasks/configs/detection/ do
exactly this on top of the configs MMDetection ships):

    custom_imports = dict(imports=["tasks.detection"], allow_failed_imports=False)
    custom_hooks = [dict(type="Int8TrainingHook", method="daiq")]

or, on the command line of MMDetection's own tools/train.py (mmengine's --cfg-options cannot spell a
list of dicts, but default_hooks is a dict and takes new entries):

    --cfg-options custom_imports.imports="[tasks.detection]" custom_imports.allow_failed_imports=False \
                  default_hooks.int8.type=Int8TrainingHook default_hooks.int8.method=daiq

Importing this module registers Int8TrainingHook in MMEngine's HOOKS (repro.hooks), which MMDetection's
scope reaches through its parent; the project's own classes are named ``tasks.<Name>`` (tasks.registry).
The hook swaps the detector's convolutions and linear layers (backbone, neck, heads; quantize_model's
rule leaves the first and the last float) in ``before_run``, after MMEngine has built the optimizer and
any wrapper, keeping parameters and state_dict keys, so ``resume=True`` and ``load_from=`` work.

``run(model, method, profile=..., paper_dataset=...)`` is one table cell (tables.generate calls it),
trained through the shared harness (tasks.runner):

- models: ``faster_rcnn_r50_fpn``, ``retinanet_r50_fpn``, ``rfcn_r101`` and ``rfcn_r50`` (MODELS; R-FCN is
  tasks.rfcn, registered here); paper datasets ``coco`` and ``voc`` (R-FCN: ``voc`` only at ``paper``).
- ``paper``: the shipped 1x configs (COCO 2017; VOC 07+12 tested on VOC2007) with the data from
  ``data_root`` and the ImageNet-pretrained backbone MMDetection's config names (torchvision://resnet50,
  which needs the network or a cached copy) or the user's ``load_from`` / ``init_cfg`` via cfg_options.
- ``embedded``: the generated shapes-det set (tasks.detection_data) stands in for both COCO and VOC:
  the same training run is scored as COCO scores (AP@[.5:.95]) for the COCO rows and as VOC scores
  (AP@0.5) for the VOC rows; within one process a finished run is reused for the other dataset's cell
  instead of training the same thing twice. From scratch, small input, short schedule (the config's
  docstring says what changes and why).
- ``smoke``: the embedded config cut to a few images, 2 iterations and a 6-image validation, for tests.

A run's scores: ``map``, the paper dataset's metric in % (COCO: bbox AP@[.5:.95]; VOC: AP@0.5), with
``map_50`` and ``map_5095`` beside it, ``metric`` naming it, and ``config`` the config file trained.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import uuid
from pathlib import Path
from typing import Any

import torch
from mmengine.config import Config

import repro.hooks  # noqa: F401  (registers Int8TrainingHook in MMEngine's HOOKS: every scope finds it there)
import tasks.detection_quiet  # noqa: F401  (pycocotools' progress to the log, an empty result not an ERROR)
from tasks import PROFILES
from tasks import detection_data as DD
from tasks.bad_data import BadDataError
from tasks.datasets import DatasetNotFoundError
from tasks.registry import scoped
from tasks.rfcn import RFCNRoIHead  # noqa: F401  (importing registers R-FCN's parts in MMDetection)
from tasks.run_spec import RunSpec
from tasks.runner import RunRecorder, RunResult, check_choice, checked_options, run_config

TASK = "detection"
# Bump when a recipe, config or the generated set changes what a run measures (the table cache key).
RECIPE_VERSION = "4"  # 4: int8 convolutions keep the input layout (RoIAlign read them wrong)
# R-FCN's own: 5: the embedded configs' position-sensitive maps learn at k*k times the rate (tasks/rfcn.py);
# 6: the embedded configs read the images at 128 px with anchors of 24-96 px
MODEL_RECIPE_VERSIONS = {"rfcn_r101": "6", "rfcn_r50": "6"}
PAPER_DATASETS = ("coco", "voc")
CONFIG_DIR = Path(__file__).resolve().parent / "configs" / "detection"
# model -> its config files' stem and the paper datasets it has a config for (UI8 ran R-FCN on VOC only)
MODELS = {
    "faster_rcnn_r50_fpn": ("faster-rcnn_r50_fpn", {"coco": "1x_coco", "voc": "1x_voc0712"}),
    "retinanet_r50_fpn": ("retinanet_r50_fpn", {"coco": "1x_coco", "voc": "1x_voc0712"}),
    "rfcn_r101": ("rfcn_r101", {"voc": "voc0712"}),
    "rfcn_r50": ("rfcn_r50", {}),
}
EMBEDDED_CONFIG = "shapes-det"
# smoke: a few images and iterations, enough to run every stage (data, INT8 layers, loss, metric)
SMOKE = dict(train_images=8, val_images=6, batch_size=2, iters=2, image_scale=(64, 64))


def map_scores(metrics: dict[str, float]) -> dict[str, float | None]:
    """map_50 and map_5095 in % from CocoMetric ("coco/bbox_mAP*") or VOCMetric ("pascal_voc/mAP")."""
    if "coco/bbox_mAP" in metrics:
        return dict(map_5095=100 * metrics["coco/bbox_mAP"], map_50=100 * metrics["coco/bbox_mAP_50"])
    if "pascal_voc/mAP" in metrics:
        return dict(map_5095=None, map_50=100 * metrics["pascal_voc/mAP"])
    return dict(map_5095=None, map_50=None)


# ----------------------------------------------------------------------------------------------- config
def config_path(model: str, profile: str, paper_dataset: str) -> Path:
    check_choice("model", model, list(MODELS))
    check_choice("profile", profile, PROFILES)
    check_choice("paper_dataset", paper_dataset, PAPER_DATASETS)
    stem, paper_configs = MODELS[model]
    if profile == "paper" and paper_dataset not in paper_configs:
        raise ValueError(
            f"model {model!r} has no {paper_dataset} config at the paper profile; it has: "
            f"{', '.join(paper_configs) or 'none (embedded and smoke only)'}"
        )
    which = paper_configs[paper_dataset] if profile == "paper" else EMBEDDED_CONFIG
    return CONFIG_DIR / f"{stem}_{which}_int8.py"


def _set_data_root(node: Any, root: str) -> None:
    """Point every `data_root` in a dataloader's dataset tree (RepeatDataset, ConcatDataset...) at root."""
    if isinstance(node, dict):
        if "data_root" in node:
            node["data_root"] = root
        for value in node.values():
            _set_data_root(value, root)
    elif isinstance(node, (list, tuple)):
        for value in node:
            _set_data_root(value, root)


def apply_data_root(cfg: Config, root: str) -> None:
    """Use `root` for the train/val/test data and the evaluators' annotation files (if they have one)."""
    old = cfg.get("data_root")
    root = str(root).rstrip("/") + "/"
    for key in ("train_dataloader", "val_dataloader", "test_dataloader"):
        if cfg.get(key):
            _set_data_root(cfg[key], root)
    for key in ("val_evaluator", "test_evaluator"):
        evaluator = cfg.get(key)
        for ev in evaluator if isinstance(evaluator, list) else [evaluator]:
            if isinstance(ev, dict) and isinstance(ev.get("ann_file"), str) and old:
                ev["ann_file"] = ev["ann_file"].replace(old, root, 1)
    cfg.data_root = root


# Int8TrainingHook's own arguments, not the method's options (repro.hooks)
HOOK_ARGUMENTS = ("skip", "channels_last_out", "per_call_state")


def config_hook(cfg: Config) -> dict | None:
    """The config's own Int8TrainingHook entry (custom_hooks, or default_hooks as --cfg-options spells
    it), or None. More than one is a ValueError: which of them the user meant cannot be told."""
    hooks = [h for h in cfg.get("custom_hooks") or [] if _is_int8_hook(h)]
    hooks += [h for h in (cfg.get("default_hooks") or {}).values() if _is_int8_hook(h)]
    if len(hooks) > 1:
        raise ValueError(f"the config has {len(hooks)} Int8TrainingHook entries: keep one")
    return dict(hooks[0]) if hooks else None


def _is_int8_hook(hook: Any) -> bool:
    return isinstance(hook, dict) and str(hook.get("type", "")).endswith("Int8TrainingHook")


def merged_method_options(
    cfg: Config, method: str, options: dict | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The method options a run uses: the config's Int8TrainingHook options, the command line's
    (`options`) over them where both set one, typed and checked for `method`; and where each came from
    ({option: "config" | "command line"}). An option the method does not take is a ValueError naming
    where it came from, so nothing the user wrote is silently dropped."""
    hook = config_hook(cfg) or {}
    from_config = {k: v for k, v in hook.items() if k not in ("type", "method", *HOOK_ARGUMENTS)}
    options = dict(options or {})
    if from_config and hook.get("method", method) != method:
        raise ValueError(
            f"the config's Int8TrainingHook sets {', '.join(sorted(from_config))} for method "
            f"{hook['method']!r}, but this run's method is {method!r}: remove them from the config, or run "
            f"--method {hook['method']}"
        )
    merged = {**from_config, **options}
    sources = {k: "command line" if k in options else "config" for k in merged}
    try:
        checked = checked_options(method, merged)
    except ValueError as err:
        config_only = sorted(set(from_config) - set(options))
        if not config_only:
            raise
        raise ValueError(f"{err} (from the config's Int8TrainingHook: {', '.join(config_only)})") from None
    return checked, sources


def set_method(cfg: Config, method: str, method_options: dict | None = None) -> None:
    """Make the config's Int8TrainingHook run `method` with `method_options` (the merged ones, see
    merged_method_options), keeping the hook's own arguments (skip ...): one hook, in custom_hooks."""
    found = config_hook(cfg) or {}
    kept = {k: found[k] for k in HOOK_ARGUMENTS if k in found}
    hook = dict(type="Int8TrainingHook", method=method, **kept, **(method_options or {}))
    hooks = list(cfg.get("custom_hooks") or [])
    at = next((i for i, h in enumerate(hooks) if _is_int8_hook(h)), None)
    if at is None:
        hooks.insert(0, hook)
    else:
        hooks[at] = hook
    cfg.custom_hooks = hooks
    defaults = cfg.get("default_hooks") or {}
    for name, h in list(defaults.items()):
        if _is_int8_hook(h):
            defaults.pop(name)  # one hook only: the custom_hooks entry above
    imports = cfg.get("custom_imports") or dict(imports=[], allow_failed_imports=False)
    if "tasks.detection" not in imports["imports"]:
        imports["imports"] = [*imports["imports"], "tasks.detection"]
    cfg.custom_imports = imports


def _apply_smoke(cfg: Config) -> None:
    s = SMOKE
    for key, n in (("train_dataloader", s["train_images"]), ("val_dataloader", s["val_images"])):
        cfg[key].dataset.indices = n
        cfg[key].batch_size = s["batch_size"]
        for step in cfg[key].dataset.pipeline:
            if step["type"] == "Resize":
                step["scale"] = s["image_scale"]
    cfg.test_dataloader = cfg.val_dataloader
    cfg.train_cfg = dict(type="IterBasedTrainLoop", max_iters=s["iters"], val_interval=s["iters"])
    cfg.param_scheduler = []
    cfg.default_hooks.logger = dict(type="LoggerHook", interval=1)
    cfg.log_processor = dict(type="LogProcessor", window_size=1, by_epoch=False)
    cfg.log_level = "WARNING"


def build_config(
    config: str | Path,
    method: str,
    profile: str = "embedded",
    seed: int = 0,
    method_options: dict | None = None,
    data_root: str | None = None,
    work_dir: str | None = None,
    checkpoints: bool = True,
) -> Config:
    """The Runner config of one run from an MMDetection config file (the task's or the user's)."""
    cfg = Config.fromfile(str(config))
    if cfg.get("embedded_data") == DD.NAME:
        apply_data_root(cfg, str(DD.ensure_shapes_det(data_root)))
    elif data_root is not None:
        apply_data_root(cfg, data_root)
    set_method(cfg, method, method_options)
    cfg.custom_hooks = [
        *cfg.custom_hooks,
        dict(type=scoped("RunRecorder"), warmup=1 if profile == "smoke" else 3),
    ]
    cfg.work_dir = work_dir
    cfg.experiment_name = f"{TASK}-{Path(config).stem}-{method}-{profile}-s{seed}-{uuid.uuid4().hex[:8]}"
    cfg.randomness = dict(seed=seed)
    # mmdet names its visualizer "visualizer": a global instance that would outlive this run (and its
    # work_dir) and be handed to the next; per-run names are released with the run (runner.release)
    if cfg.get("visualizer"):
        cfg.visualizer.name = cfg.experiment_name
    cfg.launcher = cfg.get("launcher", "none")
    cfg.default_hooks.pop("visualization", None)  # draws nothing unless asked; not a default of mmengine
    if not checkpoints:  # the short profiles of the task's own configs keep no checkpoints
        cfg.default_hooks.checkpoint = None
    if not torch.cuda.is_available():
        cfg.env_cfg = dict(cfg.get("env_cfg", {}), dist_cfg=dict(backend="gloo"))
        cfg.model_wrapper_cfg = dict(
            type="MMDistributedDataParallel", broadcast_buffers=False, device_ids=None
        )
    if profile == "smoke":
        _apply_smoke(cfg)
    return cfg


# ---------------------------------------------------------------------------------------------- results
METRIC_NAMES = {"coco": "bbox AP@[.5:.95] (COCO)", "voc": "AP@0.5 (VOC)"}

# Finished embedded/smoke runs of this process by their training configuration (paper dataset left
# out: at those profiles COCO and VOC stand on the same data, so one training serves both cells).
_FINISHED: dict[str, tuple[str, RunResult]] = {}


def run(
    model: str,
    method: str,
    profile: str = "embedded",
    seed: int = 0,
    method_options: dict | None = None,
    paper_dataset: str = "coco",
    data_root: str | None = None,
    work_dir: str | None = None,
    cfg_options: dict | None = None,
    config: str | None = None,
    skip_bad_samples: bool = False,
) -> RunResult:
    """Train one detector with one method at one profile; a diverged run is recorded, not raised.

    `config` (a file path) replaces the task's config for (model, profile, paper_dataset); it may be any
    MMDetection config, shipped or the user's. Unknown names are a ValueError listing the choices. A
    missing annotation file, or one that is not JSON, is a BadDataError naming it. MMDetection's
    datasets have no skip policy: skip_bad_samples is a ValueError.
    """
    path = Path(config) if config else config_path(model, profile, paper_dataset)
    # the config's own hook options join the command line's; bad options fail here, before any data
    method_options, option_sources = merged_method_options(Config.fromfile(str(path)), method, method_options)
    check_choice("paper_dataset", paper_dataset, PAPER_DATASETS)
    if profile == "paper" and data_root is None and config is None:
        raise DatasetNotFoundError(
            f"profile 'paper' reads {paper_dataset} from a data root: pass --data-root"
        )
    memo_key = json.dumps(
        [str(path), model, method, method_options, profile, seed, data_root, cfg_options], sort_keys=True
    )
    if profile != "paper" and memo_key in _FINISHED:
        trained_for, done = _FINISHED[memo_key]
        return _rescore(done, paper_dataset, trained_for)
    keep = config is not None or profile == "paper"  # a user's config keeps its checkpoints

    def build(work: str) -> Config:
        cfg = build_config(path, method, profile, seed, method_options, data_root, work, checkpoints=keep)
        check_annotation_files(cfg)
        return cfg

    spec = RunSpec(TASK, model, method, profile, paper_dataset, seed, method_options, data_root)
    try:
        result = run_config(
            build, spec, work_dir=work_dir, cfg_options=cfg_options,
            dataset=lambda cfg: DD.NAME if cfg.get("embedded_data") == DD.NAME else paper_dataset,
            scores=lambda recorder, diverged: _run_scores(recorder, diverged, paper_dataset, path),
            config_file=config, skip_bad_samples=skip_bad_samples,
        )  # fmt: skip
    except json.JSONDecodeError as err:  # MMDetection's datasets read their annotations while the run starts
        raise _malformed_annotations(
            build_config(path, method, profile, seed, data_root=data_root), err
        ) from err
    result = dataclasses.replace(result, method_options_from=option_sources)
    if profile != "paper":
        _FINISHED[memo_key] = (paper_dataset, result)
    return result


def annotation_files(cfg: Config) -> list[Path]:
    """The annotation files of the train / val / test datasets (data_root joined as MMEngine does)."""
    found: list[Path] = []

    def walk(node: Any, root: str | None) -> None:
        if isinstance(node, dict):
            root = node.get("data_root", root)
            ann = node.get("ann_file")
            if isinstance(ann, str) and ann:
                found.append(Path(ann) if Path(ann).is_absolute() or not root else Path(root) / ann)
            for value in node.values():
                walk(value, root)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value, root)

    for key in ("train_dataloader", "val_dataloader", "test_dataloader"):
        walk(cfg.get(key), cfg.get("data_root"))
    return list(dict.fromkeys(found))


def check_annotation_files(cfg: Config) -> None:
    """A missing annotation file is a BadDataError naming it, before any training."""
    for path in annotation_files(cfg):
        if not path.is_file():
            raise BadDataError(
                f"annotation file {path} is missing: put it there (the config's data_root + ann_file), or "
                "point --data-root at the dataset",
                path,
            )


def _malformed_annotations(cfg: Config, err: json.JSONDecodeError) -> BadDataError:
    for path in annotation_files(cfg):
        if path.suffix == ".json":
            try:
                json.loads(path.read_text())
            except (ValueError, UnicodeDecodeError) as bad:
                return BadDataError(
                    f"annotation file {path} is not valid JSON ({bad}): replace it with the dataset's own",
                    path,
                )
    return BadDataError(f"an annotation file of the config is not valid JSON ({err})")


def _run_scores(recorder: RunRecorder, diverged: bool, paper_dataset: str, path: Path) -> dict[str, Any]:
    """map (chosen by _choose_map), map_50, map_5095, metric, the config file, a note, and shared_run
    (set when a cell reuses a run trained for another paper dataset)."""
    out: dict[str, Any] = dict(map_50=None, map_5095=None, config=str(path), shared_run=None, note=None)
    if not diverged:
        out.update(map_scores(recorder.metrics))
        if recorder.validated and out["map_50"] is None:
            # CocoMetric returns nothing when no box clears the test score threshold: that is mAP 0
            out["map_50"] = out["map_5095"] = 0.0
            out["note"] = "no detections on the validation set: mAP 0"
    _choose_map(out, paper_dataset, diverged)
    return out


def _choose_map(out: dict[str, Any], paper_dataset: str, diverged: bool) -> None:
    """`map` is the paper dataset's metric; a user's VOC config under the default "coco" gets AP@0.5."""
    out["metric"] = METRIC_NAMES[paper_dataset]
    if diverged:
        out["map"] = None
    elif paper_dataset == "coco" and out["map_5095"] is not None:
        out["map"] = out["map_5095"]
    else:
        out["map"] = out["map_50"]
        if paper_dataset == "coco" and out["map_50"] is not None:
            out["metric"] = "AP@0.5 (the config's evaluator gives no AP@[.5:.95])"


def _rescore(done: RunResult, paper_dataset: str, trained_for: str) -> RunResult:
    scores = _scored_as(done.scores, paper_dataset, trained_for, done.diverged)
    return dataclasses.replace(done, paper_dataset=paper_dataset, scores=scores)


def _scored_as(scores: dict[str, Any], paper_dataset: str, trained_for: str, diverged: bool) -> dict:
    out = dict(scores)
    _choose_map(out, paper_dataset, diverged)
    if paper_dataset != trained_for:
        out["shared_run"] = f"the {trained_for} cell's training run, scored as {paper_dataset}"
    return out


# ------------------------------------------------------------------------- one training, several cells
def training_twins(model: str, profile: str, paper_dataset: str) -> tuple[str, ...]:
    """The other paper datasets whose cells train this very run (tables.shared_training): at the embedded
    and smoke profiles one config and one generated set stand in for COCO and VOC alike; none at paper."""
    if profile == "paper" or model not in MODELS:
        return ()
    path = config_path(model, profile, paper_dataset)
    return tuple(d for d in PAPER_DATASETS if d != paper_dataset and config_path(model, profile, d) == path)


def rescored(result: dict[str, Any], paper_dataset: str) -> dict[str, Any]:
    """A twin cell's result (RunResult.to_dict(), as the tables' cache holds it) scored as the cell of
    `paper_dataset`: the same training, that dataset's metric."""
    trained_for, diverged = result.get("paper_dataset"), bool(result.get("diverged"))
    return {**_scored_as(result, paper_dataset, trained_for, diverged), "paper_dataset": paper_dataset}


def main(argv=None) -> int:
    """`python -m tasks.detection --config PATH --method daiq [...]`: the `repro train` arguments."""
    from tasks.cli import task_main

    return task_main(TASK, __doc__.split("\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
