"""Detection through MMDetection: the override on shipped configs, INT8 detectors training, resume, errors.

Small on purpose: a 16-image generated set, 64-px inputs, one or two iterations per run.
"""

import argparse
import json
import math

import pytest
import torch
from mmdet.registry import HOOKS as MMDET_HOOKS
from mmdet.registry import MODELS as MMDET_MODELS
from mmengine.config import Config, DictAction
from mmengine.hooks import Hook
from mmengine.registry import HOOKS, DefaultScope
from mmengine.utils import import_modules_from_strings
from pycocotools.coco import COCO

from repro import method_state_dict, quantize_model, quantized_layers
from repro.hooks import Int8TrainingHook
from repro.layers import quantizable_layers
from tasks import detection as D
from tasks import detection_data as DD
from tasks.runner import RunRecorder, train


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A small shapes-det (16 train / 8 val images) in a cache of this module's own."""
    mp = pytest.MonkeyPatch()
    mp.setattr(DD, "TRAIN_IMAGES", 16)
    mp.setattr(DD, "VAL_IMAGES", 8)
    root = tmp_path_factory.mktemp("det-cache")
    DD.ensure_shapes_det(root)
    yield str(root)
    mp.undo()


def _scope():
    """As the Runner of an mmdet config builds: default scope "mmdet", from mmengine's root registry."""
    return DefaultScope.overwrite_default_scope("mmdet")


def test_generated_set_is_coco_that_pycocotools_reads(cache):
    folder = DD.ensure_shapes_det(cache)
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    assert DD.ensure_shapes_det(cache) == folder  # made once: the second call finds it
    assert json.loads((folder / "MANIFEST.json").read_text()) == manifest
    coco = COCO(str(folder / DD.ann_file("train")))
    assert [c["name"] for c in coco.loadCats(coco.getCatIds())] == list(DD.CLASSES)
    assert len(coco.getImgIds()) == 16 and manifest["boxes"]["train"] == len(coco.getAnnIds())
    for ann in coco.loadAnns(coco.getAnnIds()):
        x, y, w, h = ann["bbox"]
        assert 0 <= x and 0 <= y and x + w <= DD.IMAGE_SIZE + 1e-6 and y + h <= DD.IMAGE_SIZE + 1e-6
        assert w > 5 and h > 5
    per_image = [len(coco.getAnnIds(imgIds=i)) for i in coco.getImgIds()]
    assert min(per_image) >= 1 and max(per_image) > 1
    assert (folder / coco.loadImgs(0)[0]["file_name"]).is_file()


def test_one_line_override_on_an_unmodified_shipped_config(tmp_path):
    """The README's --cfg-options line turns MMDetection's own RetinaNet config into an INT8 run."""
    base = tmp_path / "shipped.py"
    base.write_text('_base_ = "mmdet::retinanet/retinanet_r50_fpn_1x_coco.py"\n')
    parser = argparse.ArgumentParser()
    parser.add_argument("--cfg-options", nargs="+", action=DictAction)
    args = parser.parse_args(
        [
            "--cfg-options",
            "custom_imports.imports=[tasks.detection]",
            "custom_imports.allow_failed_imports=False",
            "default_hooks.int8.type=Int8TrainingHook",
            "default_hooks.int8.method=daiq",
            "default_hooks.int8.k=1.2",
        ]
    )
    cfg = Config.fromfile(str(base))
    shipped = cfg.model.to_dict()
    cfg.merge_from_dict(args.cfg_options)
    assert cfg.model.to_dict() == shipped and cfg.default_scope == "mmdet"
    import_modules_from_strings(**cfg.custom_imports)
    with _scope():
        hook = HOOKS.build(cfg.default_hooks.int8)
    assert isinstance(hook, Int8TrainingHook) and hook.method.name == "daiq" and hook.method.opts["k"] == 1.2

    # the task's COCO / VOC configs: the shipped config plus custom_imports and custom_hooks
    for path in sorted(D.CONFIG_DIR.glob("*_1x_*_int8.py")):
        cfg = Config.fromfile(str(path))
        assert cfg.model.backbone.depth == 50 and cfg.model.neck.type == "FPN"
        with _scope():
            assert HOOKS.build(cfg.custom_hooks[0]).method.name == "daiq"
    # mmdet's registry reaches both through the registry tree (nothing registered twice): Int8TrainingHook
    # in MMEngine's HOOKS, its parent; the project's own hooks in the child registry of the scope "tasks"
    assert "Int8TrainingHook" not in MMDET_HOOKS.module_dict
    assert MMDET_HOOKS.get("Int8TrainingHook") is Int8TrainingHook
    assert MMDET_HOOKS.get("tasks.RunRecorder") is RunRecorder


def _leaves(node, prefix=""):
    """{dotted path: value} of every leaf of a nested config dict."""
    if not isinstance(node, dict):
        return {prefix: node}
    return {k: v for key, value in node.items() for k, v in _leaves(value, f"{prefix}{key}.").items()}


@pytest.mark.parametrize(
    "model, shipped, changed",
    [
        (
            "faster_rcnn_r50_fpn",
            "faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py",
            {
                "roi_head.bbox_head.num_classes.",
                "train_cfg.rpn_proposal.nms_pre.",
                "train_cfg.rpn_proposal.max_per_img.",
                "train_cfg.rcnn.sampler.num.",
                "test_cfg.rpn.nms_pre.",
                "test_cfg.rpn.max_per_img.",
            },
        ),
        ("retinanet_r50_fpn", "retinanet/retinanet_r50_fpn_1x_coco.py", {"bbox_head.num_classes."}),
    ],
)
def test_embedded_configs_change_only_sizes_and_initialisation_of_the_shipped_networks(
    model, shipped, changed, tmp_path
):
    """The shapes-det configs (shared recipe file) keep the shipped detector but for the documented keys."""
    ours = Config.fromfile(str(D.config_path(model, "embedded", "coco")))
    (tmp_path / "shipped.py").write_text(f'_base_ = "mmdet::{shipped}"\n')
    theirs = Config.fromfile(str(tmp_path / "shipped.py"))
    a, b = _leaves(ours.model.to_dict()), _leaves(theirs.model.to_dict())
    from_scratch = {
        "backbone.init_cfg.",
        "backbone.init_cfg.type.",
        "backbone.init_cfg.checkpoint.",
        "backbone.frozen_stages.",
        "backbone.norm_eval.",
    }
    assert {
        k for k in a.keys() | b.keys() if k not in a or k not in b or a[k] != b[k]
    } == changed | from_scratch
    assert ours.model.backbone.init_cfg is None and ours.model.backbone.frozen_stages == -1
    assert ours.embedded_data == DD.NAME and ours.train_dataloader.batch_size == 4
    assert ours.custom_hooks[0].type == "Int8TrainingHook"


def test_bad_method_fails_when_the_config_is_built(cache):
    with _scope(), pytest.raises(ValueError, match="known methods: .*daiq"):
        HOOKS.build(dict(type="Int8TrainingHook", method="int4"))
    with pytest.raises(ValueError, match="has no option"):
        D.run("faster_rcnn_r50_fpn", "daiq", profile="smoke", method_options=dict(alpha=1), data_root=cache)
    with pytest.raises(ValueError, match="unknown model 'ssd300'; choose from faster_rcnn_r50_fpn"):
        D.config_path("ssd300", "embedded", "coco")


class Capture(Hook):
    """Records every iteration's losses and the method state at the start of training (after resume)."""

    priority = "LOWEST"

    def __init__(self):
        self.losses: list[dict] = []
        self.state = None

    def before_train(self, runner):
        self.state = method_state_dict(runner.model)

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        self.losses.append({k: float(v.detach()) for k, v in outputs.items()})


MMDET_HOOKS.register_module(name="ReproTestCapture", module=Capture, force=True)


def _train(cache, work_dir, iters, **cfg_options):
    cfg = D.build_config(
        D.config_path("faster_rcnn_r50_fpn", "embedded", "coco"),
        "daiq",
        profile="smoke",
        data_root=cache,
        work_dir=str(work_dir),
    )
    cfg.train_cfg = dict(type="IterBasedTrainLoop", max_iters=iters, val_interval=1000)
    cfg.default_hooks.checkpoint = dict(type="CheckpointHook", interval=1, by_epoch=False)
    cfg.custom_hooks = [*cfg.custom_hooks, dict(type="ReproTestCapture")]
    cfg.val_dataloader = cfg.val_cfg = cfg.val_evaluator = None  # training and checkpoints only
    cfg.merge_from_dict(cfg_options)
    runner, _, diverged = train(cfg)
    return runner, next(h for h in runner.hooks if isinstance(h, Capture)), diverged


def test_int8_faster_rcnn_trains_saves_and_resumes(cache, tmp_path):
    runner, seen, diverged = _train(cache, tmp_path / "a", 1)
    assert not diverged
    layers = quantized_layers(runner.model)
    for part in (
        "backbone.layer1.",
        "backbone.layer4.",
        "neck.",
        "rpn_head.",
        "roi_head.bbox_head.shared_fcs",
    ):
        assert any(n.startswith(part) for n in layers), part
    # quantize_model's rule: the first and the last Conv/Linear in module order stay float (for this
    # detector the last registered is the RoI head's second shared FC, its predictors come before it)
    names = [n for n, _ in quantizable_layers(runner.model)]
    assert names[0] == "backbone.conv1" and names[-1] == "roi_head.bbox_head.shared_fcs.1"
    assert set(layers) == set(names[1:-1])
    assert seen.losses and all(math.isfinite(v) for v in seen.losses[0].values())
    assert {"loss_rpn_cls", "loss_cls", "loss_bbox"} <= set(seen.losses[0])
    ckpt = torch.load(tmp_path / "a" / "iter_1.pth", map_location="cpu", weights_only=True)
    assert ckpt["int8"]["method"] == "daiq" and set(ckpt["int8"]["layers"]) == set(layers)
    # one gradient per call: the RPN head runs once per FPN level (5), everything else once
    calls = {n: 5 if n.startswith("rpn_head.") else 1 for n in layers}
    assert {n: s["step"] for n, s in ckpt["int8"]["layers"].items()} == calls
    with _scope():
        float_model = MMDET_MODELS.build(runner.cfg.model)
    assert list(ckpt["state_dict"]) == list(float_model.state_dict())  # keys unchanged by the swap

    resumed, seen2, diverged = _train(
        cache, tmp_path / "b", 2, resume=True, load_from=str(tmp_path / "a" / "iter_1.pth")
    )
    assert not diverged and resumed.iter == 2
    for name, state in ckpt["int8"]["layers"].items():
        assert seen2.state[name]["step"] == state["step"] == calls[name]
        assert torch.equal(seen2.state[name]["scale"], state["scale"])
    assert {n: s["step"] for n, s in method_state_dict(resumed.model).items()} == {
        n: 2 * c for n, c in calls.items()
    }


def test_task_run_int8_retinanet_scores_coco_and_voc_from_one_training(cache):
    coco = D.run("retinanet_r50_fpn", "ui8", profile="smoke", paper_dataset="coco", data_root=cache)
    assert not coco.diverged and coco.iters == D.SMOKE["iters"] and math.isfinite(coco.final_loss)
    assert coco.dataset == "shapes-det" and 0 <= coco.map_5095 <= coco.map_50 <= 100  # 0 if no boxes
    assert coco.map == coco.map_5095 and coco.shared_run is None
    voc = D.run("retinanet_r50_fpn", "ui8", profile="smoke", paper_dataset="voc", data_root=cache)
    assert voc.map == coco.map_50 and voc.paper_dataset == "voc" and "coco" in voc.shared_run
    assert voc.ms_per_iter == coco.ms_per_iter  # the same run, not trained again
    # a second training in the same process (as the table generator runs cells), the first's work_dir gone
    fp32 = D.run("retinanet_r50_fpn", "fp32", profile="smoke", paper_dataset="voc", data_root=cache)
    assert not fp32.diverged and fp32.shared_run is None and fp32.map == fp32.map_50


def test_roi_align_reads_int8_conv_outputs_as_it_reads_float_ones():
    """mmcv's CPU RoIAlign reads its input's memory as NCHW whatever the strides: int8 convolution outputs
    handed on channels-last made it pool the wrong pixels (a trained Faster R-CNN fell to mAP 0.2)."""
    from mmcv.ops import roi_align

    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, 3, padding=1)
    x = torch.randn(2, 8, 16, 16)
    rois = torch.tensor([[0, 1.0, 1.0, 9.0, 9.0], [1, 2.0, 3.0, 12.0, 14.0], [0, 4.0, 0.0, 15.0, 6.0]])

    def pooled(layer):
        return roi_align(layer(x), rois, (7, 7), 1.0, 2, "avg", True)

    reference = pooled(conv).detach()
    int8 = pooled(quantize_model(conv, "daiq", skip=())).detach()
    assert (int8 - reference).norm() / reference.norm() < 0.03  # int8 rounding, not other pixels
