"""R-FCN (tasks.rfcn) in MMDetection 3: built from its configs, position-sensitive pooling and voting as
R-FCN's paper, gradients through torchvision's ps_roi_align, INT8 training steps, the paper config's errors.
"""

import pytest
import torch
from mmdet.registry import MODELS
from mmengine.config import Config
from mmengine.registry import DefaultScope
from test_detection import cache  # noqa: F401  (the small shapes-det set, a module fixture)

from repro import quantize_model, quantized_layers
from tasks import detection as D
from tasks.rfcn import PSRoIAlignExtractor

K = 7


def _build(model="rfcn_r50", profile="embedded"):
    cfg = Config.fromfile(str(D.config_path(model, profile, "voc")))
    with DefaultScope.overwrite_default_scope("mmdet"):
        return cfg, MODELS.build(cfg.model)


@pytest.mark.parametrize("model, profile, depth", [("rfcn_r101", "paper", 101), ("rfcn_r50", "embedded", 50)])
def test_rfcn_builds_from_its_configs_as_the_paper_describes_it(model, profile, depth):
    cfg, detector = _build(model, profile)
    assert type(detector).__name__ == "TwoStageDetector" and not detector.with_neck
    assert cfg.model.backbone.depth == depth and cfg.model.backbone.dilations[-1] == 2
    head = detector.roi_head.bbox_head
    classes = cfg.model.roi_head.bbox_head.num_classes
    assert head.ps_cls.out_channels == K * K * (classes + 1) and head.ps_reg.out_channels == K * K * 4
    assert head.reg_class_agnostic and cfg.model.test_cfg.rcnn.nms.iou_threshold == 0.3
    assert cfg.model.train_cfg.rcnn.sampler.type == "OHEMSampler"
    image = torch.zeros(1, 3, 96, 96)
    c4, c5 = detector.extract_feat(image)
    assert c4.shape[-1] == c5.shape[-1] == 6 and (c4.shape[1], c5.shape[1]) == (1024, 2048)  # both stride 16


def test_embedded_score_maps_step_k_squared_times_the_base_rate():
    """Voting by average scales each bin filter's gradient by 1/k^2; the embedded configs give the maps
    k^2 times the base rate (what took R-FCN past the background prior in 480 iterations), the paper's
    config does not, and the step of the reduction and the backbone stays at the base rate."""
    from mmengine.optim import build_optim_wrapper

    for profile, mult in (("embedded", K * K), ("paper", 1)):
        cfg, detector = _build("rfcn_r101" if profile == "paper" else "rfcn_r50", profile)
        with DefaultScope.overwrite_default_scope("mmdet"):
            wrapper = build_optim_wrapper(detector, cfg.optim_wrapper)
        base = cfg.optim_wrapper.optimizer.lr
        lr_of = {id(p): g["lr"] for g in wrapper.optimizer.param_groups for p in g["params"]}
        head = detector.roi_head.bbox_head
        for conv in (head.ps_cls, head.ps_reg):
            assert lr_of[id(conv.weight)] == pytest.approx(base * mult), profile
        assert lr_of[id(head.reduce.weight)] == pytest.approx(base)
        assert lr_of[id(next(detector.backbone.parameters()))] == pytest.approx(base)


def test_embedded_rfcn_reads_the_generated_128_px_images_through_the_recipes_pipelines():
    """R-FCN's one stride-16 map needs the objects over more than a cell or two: its embedded configs keep
    the shapes-det recipe's pipelines with the Resize at 128 px (the generated size), where the FPN
    detectors' stay at 96 px, and anchors of 24-96 px."""
    rfcn = Config.fromfile(str(D.config_path("rfcn_r50", "embedded", "voc")))
    fpn = Config.fromfile(str(D.config_path("faster_rcnn_r50_fpn", "embedded", "voc")))
    for loader in ("train_dataloader", "val_dataloader", "test_dataloader"):
        mine, theirs = rfcn[loader].dataset.pipeline, fpn[loader].dataset.pipeline
        assert [t.type for t in mine] == [t.type for t in theirs]
        for a, b in zip(mine, theirs, strict=True):
            if a.type == "Resize":
                assert tuple(a.scale) == (128, 128) and tuple(b.scale) == (96, 96)
            else:
                assert a == b
    scales = rfcn.model.rpn_head.anchor_generator.scales
    assert [16 * s for s in scales] == [24, 48, 96]


def test_rfcn_cells_have_their_own_recipe_version():
    """The R-FCN recipe changed alone: its cells get new keys, every other detector keeps its own."""
    from tables.generate import make_plan, model_recipe_versions
    from tables.specs import get_spec

    versions = model_recipe_versions("detection")
    plan = make_plan(get_spec("ui8-table8"), "embedded", [0], None, D.RECIPE_VERSION, None, versions)
    seen = {
        cell.model: cell.recipe_version
        for rp in plan.rows
        for _, fp32, int8 in rp.cells
        for cell in (fp32, int8)
    }
    assert seen["rfcn_r101"] == D.MODEL_RECIPE_VERSIONS["rfcn_r101"] != D.RECIPE_VERSION
    assert seen["faster_rcnn_r50_fpn"] == D.RECIPE_VERSION


def test_paper_profile_has_a_voc_config_only():
    assert D.config_path("rfcn_r101", "paper", "voc").name == "rfcn_r101_voc0712_int8.py"
    with pytest.raises(ValueError, match="'rfcn_r101' has no coco config at the paper profile; it has: voc"):
        D.config_path("rfcn_r101", "paper", "coco")


def test_position_sensitive_pooling_reads_bin_ij_of_class_c_from_channel_c_k_k_plus_i_k_plus_j():
    channels = 3 * K * K
    maps = torch.arange(channels, dtype=torch.float32).view(1, channels, 1, 1).expand(1, channels, 20, 20)
    pooled = PSRoIAlignExtractor(output_size=K, featmap_strides=[16])(
        (maps,), torch.tensor([[0, 0, 0, 150.0, 150]])
    )
    assert pooled.shape == (1, 3, K, K)
    expected = torch.arange(channels, dtype=torch.float32).view(3, K, K)
    assert torch.allclose(pooled[0], expected, atol=1e-4)  # bilinear weights of a constant sum to 1


def test_score_maps_vote_by_average_and_the_gradient_reaches_the_score_convolutions():
    _, detector = _build()
    roi_head = detector.roi_head
    c5 = torch.randn(2, 2048, 6, 6, requires_grad=True)
    rois = torch.tensor([[0, 4, 4, 60, 50], [1, 10, 20, 90, 90.0]])
    out = roi_head._bbox_forward((torch.zeros(2, 1024, 6, 6), c5), rois)
    classes = roi_head.bbox_head.num_classes
    assert out["cls_score"].shape == (2, classes + 1) and out["bbox_pred"].shape == (2, 4)
    pooled = roi_head.bbox_roi_extractor((roi_head.bbox_head.score_maps(c5),), rois)
    assert torch.allclose(out["cls_score"], pooled[:, : classes + 1].mean((2, 3)))
    (out["cls_score"].sum() + out["bbox_pred"].sum()).backward()
    head = roi_head.bbox_head
    for conv in (head.ps_cls, head.ps_reg, head.reduce):
        assert conv.weight.grad is not None and conv.weight.grad.abs().sum() > 0
    assert c5.grad.abs().sum() > 0


def test_int8_covers_the_position_sensitive_score_convolution():
    _, detector = _build()
    quantize_model(detector, "daiq")
    quantized = quantized_layers(detector)
    assert "roi_head.bbox_head.ps_cls" in quantized and "roi_head.bbox_head.reduce" in quantized
    assert "roi_head.bbox_head.ps_reg" not in quantized  # the model's last convolution stays float


@pytest.mark.parametrize("method", ["fp32", "daiq", "ui8"])
def test_rfcn_smoke_training_step(cache, method):  # noqa: F811  (the imported fixture)
    result = D.run("rfcn_r101", method, profile="smoke", paper_dataset="voc", data_root=cache)
    assert not result.diverged and result.scores["metric"] == "AP@0.5 (VOC)"
    assert result.iters == D.SMOKE["iters"] and result.scores["map"] is not None
    assert result.final_loss is not None and result.final_loss == result.final_loss  # finite: not NaN
