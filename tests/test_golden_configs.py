"""Nothing moved numerically: every Runner config a task builds, and every table cell's cache key, are
those of commit 028db0b (before the training harness, the recipes and the methods were restructured).

tests/golden/configs_028db0b.json was written by `snapshot()` below, run on that commit's code
(`python tests/test_golden_configs.py OUT.json` in a checkout of it, with REPRO_DATA_CACHE set). It holds:

- `configs`: the Runner config of each (task, network, profile, paper dataset, method) as canonical
  JSON, with the per-run name, the work folder, the data root and the data cache replaced by
  placeholders; everything a run reads (recipe, data, optimizer, schedule, hooks, seed) is in it;
- `keys`: the cache key of every cell of every paper table at the smoke and embedded profiles (the
  key hashes the task's RECIPE_VERSION and the method's normalized options, so finished cells stay
  valid only if these are unchanged).

Two changes since are intended: the embedded classification profile trains on Fashion-MNIST (RECIPE_VERSION
2, docs/data.md). Its configs differ from 028db0b's in their data and schedule only (checked below), and its
cells have new keys; the keys are compared with the task's RECIPE_VERSION as it was ("1"). And ResNet-50
starts with zeroed residual branches at the smoke and embedded profiles (`init="zero-residual"`, its own
recipe version 3, docs/measurements.md): its configs there differ in `model.init` alone. And R3D-18 trains at
lr 0.005, not 0.0125, at the smoke and embedded profiles (its own recipe version 5, docs/measurements.md): its
configs there differ in the optimizer's lr alone. Added since, and
left out here: the R-FCN detectors (ADDED_MODELS) and the options methods gained (ADDED_OPTIONS).

The video configs at the embedded and smoke profiles of Kinetics-400 read the generated motion20 set,
which takes a minute to make; the test leaves them out (UCF-101's, on motion10, are checked).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden" / "configs_028db0b.json"
CLASSIFICATION_METHODS = {"fp32": {}, "daiq": {"k": 1.2}, "wageubn": {}}
OTHER_METHODS = {"fp32": {}, "daiq": {"k": 1.2}}
RUN_NAME = re.compile(r"-[0-9a-f]{8}\b")  # the random suffix of every run's experiment_name
FASHION_MNIST = re.compile(r"classification/[^/]+/embedded/")  # the intended change (the docstring's)
ZERO_RESIDUAL = re.compile(r"classification/resnet50/(smoke|embedded)/")  # the second
R3D18_LR = re.compile(r"video/r3d_18/(smoke|embedded)/")  # the third
# where those configs may differ: what data a run reads, and for how long
DATA_AND_SCHEDULE = (
    ("train_dataloader", "dataset", "dataset"),
    ("train_dataloader", "dataset", "limit"),
    ("val_dataloader", "dataset", "dataset"),
    ("train_cfg", "max_epochs"),
    ("train_cfg", "val_interval"),
    ("param_scheduler",),
)


def _fake_video_roots(root: Path) -> dict[str, Path]:
    """Minimal UCF-101 and Kinetics-400 frame-folder layouts (one class, one video) for the paper profile."""
    ucf = root / "ucf101"
    (ucf / "ucfTrainTestlist").mkdir(parents=True)
    (ucf / "ucfTrainTestlist" / "classInd.txt").write_text("1 Walk\n")
    (ucf / "ucfTrainTestlist" / "trainlist01.txt").write_text("Walk/v_Walk_g08_c01.avi 1\n")
    (ucf / "ucfTrainTestlist" / "testlist01.txt").write_text("Walk/v_Walk_g01_c01.avi\n")
    (ucf / "rawframes" / "Walk" / "v_Walk_g08_c01").mkdir(parents=True)
    kin = root / "kinetics400"
    (kin / "rawframes_train" / "walk" / "a").mkdir(parents=True)
    (kin / "kinetics400_train_list_rawframes.txt").write_text("walk/a 8 0\n")
    return {"ucf101": ucf, "kinetics400": kin}


def _canonical(cfg, placeholders: dict[str, str]) -> str:
    data = cfg.to_dict() if hasattr(cfg, "to_dict") else cfg
    text = json.dumps(data, sort_keys=True, default=repr)
    for path, name in sorted(placeholders.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(path, name)
    return RUN_NAME.sub("-<run>", text)


def snapshot(root: Path, video_embedded_datasets=("ucf101", "kinetics400")) -> dict:
    """Configs and cell keys of the code on sys.path; `root` is an empty scratch folder."""
    import torch

    from tables.generate import make_plan
    from tables.spec import Spec
    from tables.specs import SPECS
    from tasks import get_task

    torch.cuda.is_available = lambda: False  # the CPU configs (DDP without device_ids, gloo)
    os.cpu_count = lambda: 2  # the paper profile's loader workers
    cache = os.environ["REPRO_DATA_CACHE"]
    placeholders = {str(root): "<root>", cache: "<cache>"}
    configs: dict[str, str] = {}

    def add(name: str, cfg) -> None:
        configs[name] = _canonical(cfg, placeholders)

    classification = get_task("classification")
    imagenet = root / "imagenet"
    (imagenet / "train" / "n01").mkdir(parents=True)
    from tasks.models import MODELS

    for model in MODELS:
        for profile in ("smoke", "embedded", "paper"):
            for dataset in ("imagenet", "cifar10"):
                for method, options in CLASSIFICATION_METHODS.items():
                    data_root = str(imagenet) if profile == "paper" else None
                    cfg = classification.build_config(
                        model, method, profile, 0, options, dataset, data_root, str(root / "work")
                    )
                    add(f"classification/{model}/{profile}/{dataset}/{method}", cfg)

    video = get_task("video")
    roots = _fake_video_roots(root)
    for model in ("r3d_18", "r3d_50"):
        for profile in ("smoke", "embedded", "paper"):
            for dataset in ("ucf101", "kinetics400"):
                if profile != "paper" and dataset not in video_embedded_datasets:
                    continue
                for method, options in OTHER_METHODS.items():
                    data_root = str(roots[dataset]) if profile == "paper" else None
                    cfg = video.build_config(
                        model, method, profile, 0, options, dataset, data_root, str(root / "work")
                    )
                    add(f"video/{model}/{profile}/{dataset}/{method}", cfg)

    detection = get_task("detection")
    for model in [m for m in detection.MODELS if m not in ADDED_MODELS]:
        for profile in ("smoke", "embedded", "paper"):
            for dataset in ("coco", "voc"):
                for method, options in OTHER_METHODS.items():
                    path = detection.config_path(model, profile, dataset)
                    data_root = str(root / "det") if profile == "paper" else None
                    cfg = detection.build_config(
                        path, method, profile, 0, options, data_root, str(root / "work"), profile == "paper"
                    )
                    add(f"detection/{model}/{profile}/{dataset}/{method}", cfg)

    keys: dict[str, list[str]] = {}
    for name, spec in sorted(SPECS.items()):
        if not isinstance(spec, Spec):
            continue  # the speed tables time steps; their cells are keyed by device and code
        version = getattr(get_task(spec.task), "RECIPE_VERSION", None)
        for profile, seeds in (("smoke", [0]), ("embedded", [0, 1])):
            plan = make_plan(spec, profile, seeds, None, None if version is None else str(version))
            keys[f"{name}/{profile}"] = [cell.key for cell in plan.cells]
    return {"configs": configs, "keys": keys}


# Detectors added after 028db0b (R-FCN, UI8 Table 8): new configs and new rows, tested in tests/test_rfcn.py.
ADDED_MODELS = ("rfcn_r101", "rfcn_r50")
# Options methods gained after 028db0b, at their defaults. A cell's key holds every option of its method, so
# the cells of these methods got new keys (they are recomputed once); at these values they train as before.
# The test takes them out of the keys, and leaves out the rows that only these options made runnable.
ADDED_OPTIONS = {
    "ui8": {"lr_form": "exponential", "bits_w": 8},
    "wageubn": {"e2": "flag8"},
    "wageubn-e2-16": {"e2": "shift16"},
}


def _as_on_028db0b(mp: pytest.MonkeyPatch) -> None:
    import tables.cells
    import tables.generate

    normalize, blocker = tables.cells.normalize_options, tables.generate.row_blocker

    def normalize_without_added(method, options):
        added = ADDED_OPTIONS.get(method, {})
        return {k: v for k, v in normalize(method, options).items() if k not in added or v != added[k]}

    def blocker_of_new_rows(row):
        added = ADDED_OPTIONS.get(row.method, {})
        new = any(k in added and v != added[k] for k, v in row.options.items()) or row.model in ADDED_MODELS
        return "runnable since 028db0b" if new else blocker(row)

    mp.setattr(tables.cells, "normalize_options", normalize_without_added)
    mp.setattr(tables.generate, "row_blocker", blocker_of_new_rows)


@pytest.fixture(scope="module")
def current(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    # the session's data cache (as the other task tests use), never ~/.cache
    mp.setenv("REPRO_DATA_CACHE", str(tmp_path_factory.getbasetemp() / "repro-data-cache"))
    import torch

    mp.setattr(torch.cuda, "is_available", lambda: False)
    mp.setattr(os, "cpu_count", lambda: 2)
    mp.setattr("tasks.classification.RECIPE_VERSION", "1")
    _as_on_028db0b(mp)
    try:
        yield snapshot(tmp_path_factory.mktemp("golden"), video_embedded_datasets=("ucf101",))
    finally:
        mp.undo()


# Names that changed: detection's run recorder is now the recorder every task shares, and the project's
# classes are registered in the child registries of tasks.registry (scope "tasks") under their class names.
RENAMED = {
    '"ReproDetRunRecorder"': '"tasks.RunRecorder"',
    '"ReproRunRecorder"': '"tasks.RunRecorder"',
    '"ReproImageClassifier"': '"tasks.ImageClassifier"',
    '"ReproClassificationDataset"': '"tasks.ClassificationDataset"',
    '"ReproVideoClassifier"': '"tasks.VideoClassifier"',
    '"ReproFrameClipDataset"': '"tasks.FrameClipDataset"',
    '"ReproTop1Accuracy"': '"tasks.Top1Accuracy"',
    '"ReproMultiStepLR"': '"tasks.EpochMultiStepLR"',
}


@pytest.fixture(scope="module")
def golden():
    text = GOLDEN.read_text()
    for old, new in RENAMED.items():
        text = text.replace(old.replace('"', '\\"'), new.replace('"', '\\"'))
    return json.loads(text)


def _as_028db0b_built_it(name: str, text: str) -> str:
    """The config as 028db0b built it: ResNet-50's zeroed residual branches and R3D-18's lr (smoke,
    embedded) undone."""
    if ZERO_RESIDUAL.match(name):
        cfg = json.loads(text)
        assert cfg["model"]["init"] == "zero-residual", name
        cfg["model"]["init"] = None
        return json.dumps(cfg, sort_keys=True)
    if R3D18_LR.match(name):
        cfg = json.loads(text)
        assert cfg["optim_wrapper"]["optimizer"]["lr"] == 0.005, name
        cfg["optim_wrapper"]["optimizer"]["lr"] = 0.0125
        return json.dumps(cfg, sort_keys=True)
    return text


def test_every_runner_config_is_the_one_of_028db0b(current, golden):
    assert set(current["configs"]) <= set(golden["configs"])
    assert len(current["configs"]) >= 200
    changed = [
        name
        for name, text in current["configs"].items()
        if json.loads(golden["configs"][name]) != json.loads(_as_028db0b_built_it(name, text))
        and not FASHION_MNIST.match(name)
    ]
    assert not changed, f"{len(changed)} configs differ, e.g. {changed[0]}"


def _without_data_and_schedule(text: str) -> dict:
    cfg = json.loads(text)
    for path in DATA_AND_SCHEDULE:
        node = cfg
        for key in path[:-1]:
            node = node[key]
        node.pop(path[-1], None)
    return cfg


def test_fashion_mnist_configs_differ_only_in_data_and_schedule(current, golden):
    names = [name for name in current["configs"] if FASHION_MNIST.match(name)]
    assert len(names) == 54  # 9 networks x 2 paper datasets x 3 methods
    for name in names:
        now, then = json.loads(current["configs"][name]), json.loads(golden["configs"][name])
        assert now["train_dataloader"]["dataset"]["dataset"] == "fashion-mnist", name
        assert then["train_dataloader"]["dataset"]["dataset"] in ("digits", "shapes10"), name
        assert now["val_dataloader"]["dataset"]["limit"] is None, name  # the whole test set
        assert _without_data_and_schedule(
            _as_028db0b_built_it(name, current["configs"][name])
        ) == _without_data_and_schedule(golden["configs"][name]), name


def test_every_table_cell_keeps_its_cache_key(current, golden):
    assert current["keys"] == golden["keys"]


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, os.getcwd())
    with tempfile.TemporaryDirectory() as scratch:
        result = snapshot(Path(scratch))
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    print(f"{len(result['configs'])} configs, {sum(map(len, result['keys'].values()))} cell keys")
