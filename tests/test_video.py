"""Video classification (DAIQ Table 6): the 3-D geometries of ResNet3D-18/50 through the int8 layers and
backend, one INT8 training step of each model, the frame-folder loaders on generated data, the
moving-shape generator, and a smoke run of the task.

tests/test_layers.py and tests/test_backend.py already check cubic 3x3x3 (and 1x1x1) convolutions;
here are the ResNet3D shapes they do not have: the 3x7x7 stem with stride 1x2x2, the 1x1x1 stride-2
shortcut, 3x3x3 stride 2 in time and space, and 3x3x3 on a 1x1x1 map (the last stage at small inputs).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import repro
from kernels import cpu, reference
from repro.layers import Int8Layer, method_state_dict
from repro.quant import absmax, dequantize, quantize
from tasks import motion_sets as MS
from tasks import video_lists as VL
from tasks import video_loader as VD
from tasks.video_models import build_video_model

# (kernel, stride, padding, input T x H x W): the convolutions of torchvision's video ResNets
RESNET3D_CONVS = [
    ((3, 7, 7), (1, 2, 2), (1, 3, 3), (4, 12, 12)),  # the stem
    ((1, 1, 1), (2, 2, 2), (0, 0, 0), (4, 6, 6)),  # the stride-2 shortcut
    ((3, 3, 3), (2, 2, 2), (1, 1, 1), (5, 6, 6)),  # first conv of stages 2-4
    ((3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1)),  # the last stage on a 1x1x1 map
]


@pytest.fixture(autouse=True)
def data_cache(tmp_path_factory, monkeypatch):
    """The session's data cache (the path test_classification uses too), never ~/.cache."""
    monkeypatch.setenv("REPRO_DATA_CACHE", str(tmp_path_factory.getbasetemp() / "repro-data-cache"))


def _dq(t: torch.Tensor) -> torch.Tensor:
    return dequantize(quantize(t, absmax(t)), absmax(t)).double()


@pytest.mark.parametrize("k,s,p,size", RESNET3D_CONVS)
def test_backend_is_bit_exact_on_resnet3d_geometries(k, s, p, size):
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(-127, 128, (2, 5, *size), generator=gen, dtype=torch.int8)
    w = torch.randint(-127, 128, (6, 5, *k), generator=gen, dtype=torch.int8)
    y = reference.conv_forward(x, w, s, p)
    g = torch.randint(-127, 128, tuple(y.shape), generator=gen, dtype=torch.int8)
    assert torch.equal(cpu.conv_forward(x, w, s, p), y)
    assert torch.equal(
        cpu.conv_input_grad(g, w, x.shape, s, p), reference.conv_input_grad(g, w, x.shape, s, p)
    )
    assert torch.equal(
        cpu.conv_weight_grad(x, g, w.shape, s, p), reference.conv_weight_grad(x, g, w.shape, s, p)
    )


@pytest.mark.parametrize("method", ["daiq", "gq"])
@pytest.mark.parametrize("k,s,p,size", RESNET3D_CONVS)
def test_int8_conv3d_follows_the_methods_formulas(method, k, s, p, size):
    """Y = q(X) * q(W), GX = q_gx(G) *^T q(W), GW = q(X)^T * q_gw(G) (docs/methods.md), in float64."""
    torch.manual_seed(0)
    conv = nn.Conv3d(4, 6, k, stride=s, padding=p, bias=False)
    w0 = conv.weight.detach().clone()
    repro.quantize_model(conv, method, skip=())
    seen = []
    grad = conv.int8.grad
    conv.int8.grad = lambda g, channel_axis: seen.append(grad(g, channel_axis)) or seen[-1]
    x = torch.randn(2, 4, *size, requires_grad=True)
    y = conv(x)
    gy = torch.randn_like(y) * torch.logspace(-3, 0, 6).view(1, 6, 1, 1, 1)  # channel magnitudes differ
    y.backward(gy)
    torch.testing.assert_close(y.double(), F.conv3d(_dq(x.detach()), _dq(w0), stride=s, padding=p))
    (codes,) = seen
    gx_hat = dequantize(codes.gx, codes.gx_scale).double()
    gw_hat = dequantize(codes.gw, codes.gw_scale, axis=1 if codes.gw_per_channel else None).double()
    want_gx = torch.nn.grad.conv3d_input(x.shape, _dq(w0), gx_hat, stride=s, padding=p)
    want_gw = torch.nn.grad.conv3d_weight(_dq(x.detach()), w0.shape, gw_hat, stride=s, padding=p)
    torch.testing.assert_close(x.grad.double(), want_gx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(conv.weight.grad.double(), want_gw, rtol=1e-5, atol=1e-6)
    if method == "daiq":  # GVQ: one scale per output channel of G (axis 1), as in 2-D
        assert codes.gw_per_channel and codes.gw_scale.shape == (6,)
        # first step: s_c = max |G[:, c]| (MCS has no history yet)
        torch.testing.assert_close(codes.gw_scale, gy.abs().amax(dim=(0, 2, 3, 4)))
    else:
        assert not codes.gw_per_channel


@pytest.mark.parametrize("name", ["r3d_18", "r3d_50"])
def test_one_int8_training_step_of_each_model(name, monkeypatch):
    torch.manual_seed(0)
    model = build_video_model(name, num_classes=5)
    repro.quantize_model(model, "daiq")
    convs = [m for m in model.modules() if isinstance(m, nn.Conv3d)]
    assert not isinstance(convs[0], Int8Layer) and all(isinstance(m, Int8Layer) for m in convs[1:])
    assert not isinstance(model.fc, Int8Layer)  # first and last layers stay float
    calls = {"conv_forward": 0, "conv_input_grad": 0, "conv_weight_grad": 0}
    for op in calls:
        real = getattr(cpu, op)

        def counted(*args, _op=op, _real=real, **kwargs):
            assert args[0].dim() == 5 and args[0].dtype == torch.int8
            calls[_op] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(cpu, op, counted)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    clips, labels = torch.randn(2, 3, 4, 16, 16), torch.tensor([1, 3])
    loss = F.cross_entropy(model(clips), labels)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    n_int8 = len(convs) - 1
    # every quantized conv: forward and weight gradient; input gradient for all
    assert calls == {"conv_forward": n_int8, "conv_input_grad": n_int8, "conv_weight_grad": n_int8}
    for n, p in model.named_parameters():
        assert torch.isfinite(p.grad).all(), n
    int8_weights = [f"{n}.weight" for n, m in model.named_modules() if isinstance(m, Int8Layer)]
    assert all(not torch.equal(before[n], dict(model.named_parameters())[n]) for n in int8_weights)
    state = method_state_dict(model)
    assert len(state) == n_int8


def _small(name: str, train: int, val: int) -> MS.MotionSet:
    return dataclasses.replace(MS.MOTION_SETS[name], train_per_class=train, val_per_class=val, per_group=5)


def test_frame_folder_loaders_read_the_generated_layouts(tmp_path):
    ucf, kin = tmp_path / "ucf", tmp_path / "kin"
    for out, spec in ((ucf, _small("motion10", 10, 5)), (kin, _small("motion20", 2, 1))):
        out.mkdir()
        manifest = MS._write_motion(spec, out)
        assert manifest["num_train"] == len(spec.classes) * spec.train_per_class
    # read back as UCF-101 split 1 and Kinetics-400 (the real-data code path)
    videos, classes = VL.ucf101_videos(ucf, "train")
    assert len(classes) == 10 and len(videos) == 100 and classes[8] == "circle_cw"
    test_videos, _ = VL.ucf101_videos(ucf, "val")
    assert {v.frames.name.split("_g")[1][:2] for v in test_videos} == {"01"}  # group 1 is split 1's test
    ds = VD.FrameClipDataset(VL.UCF101, "val", str(ucf), clip_len=8, input_size=32)
    item = ds[0]
    assert item["inputs"].shape == (3, 8, 32, 32) and item["inputs"].dtype == torch.float32
    assert item["labels"] == 0 and len(ds) == 50 and ds.num_frames(0) == 8
    assert not ds.per_clip_norm  # real data: the dataset's statistics; the stand-ins: per clip
    ds.per_clip_norm = True
    per_clip = ds[0]["inputs"]
    assert per_clip.mean(dim=(1, 2, 3)).abs().max() < 1e-4
    assert (per_clip.std(dim=(1, 2, 3)) - 1).abs().max() < 0.05  # std + PER_CLIP_EPS
    kds = VD.FrameClipDataset(VL.KINETICS400, "train", str(kin), clip_len=4, frame_interval=2, input_size=16)
    assert len(kds) == 40 and len(kds.classes) == 20 and kds.classes[19] == "circle_ccw_fast"
    assert kds[39]["inputs"].shape == (3, 4, 16, 16) and kds[39]["labels"] == 19
    assert kds.frame_indices(0) == [0, 2, 4, 6]
    # paper-style sampling: a random window, short side resized, random crop and flip
    paper = VD.FrameClipDataset(
        VL.KINETICS400, "train", str(kin), clip_len=3, input_size=20, resize=24, augment=True
    )
    assert paper[0]["inputs"].shape == (3, 3, 20, 20)
    assert paper.frame_indices(0, np.random.default_rng(0))[0] in range(6)
    limited = VD.FrameClipDataset(VL.UCF101, "train", str(ucf), limit=20)
    assert sorted(limited.targets) == sorted(list(range(10)) * 2)


def test_missing_data_is_one_line_naming_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"UCF-101 not found .*ucfTrainTestlist/classInd.txt") as err:
        VD.FrameClipDataset(VL.UCF101, "train", str(tmp_path))
    assert "\n" not in str(err.value)
    with pytest.raises(FileNotFoundError, match=r"Kinetics-400 not found .*kinetics400_train_list_rawframes"):
        VD.FrameClipDataset(VL.KINETICS400, "train", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="needs a data root"):
        VD.FrameClipDataset(VL.UCF101, "train", None)


def _step(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The whole-pixel shift (dx, dy) on the torus that best maps frame a's bright shapes onto frame b's."""
    grey = lambda f: f.astype(np.float64) @ np.array([0.299, 0.587, 0.114])  # noqa: E731
    ma, mb = (grey(f) > np.median(grey(f)) + 0.15 * 255 for f in (a, b))
    shifts = [(dx, dy) for dx in range(-4, 5) for dy in range(-4, 5)]
    return np.array(max(shifts, key=lambda s: (np.roll(ma, (s[1], s[0]), axis=(0, 1)) & mb).sum()))


@pytest.mark.parametrize("cls,direction", [(0, (1, 0)), (2, (0, -1)), (5, (-1, 1))])  # E, N, SW
def test_the_class_is_the_motion_not_the_first_frame(cls, direction):
    spec = MS.MOTION_SETS["motion10"]
    clip = MS.render_clip(spec, cls, np.random.default_rng(7))
    other = MS.render_clip(spec, (cls + 4) % 8, np.random.default_rng(7))  # the opposite direction
    assert np.array_equal(clip[0], other[0]) and not np.array_equal(clip[-1], other[-1])
    mean_step = np.mean([_step(a, b) for a, b in zip(clip[:-1], clip[1:], strict=True)], axis=0)
    speed = np.linalg.norm(mean_step)
    assert 0.05 * 32 * 0.7 < speed < 0.09 * 32 * 1.3
    unit = np.array(direction) / np.linalg.norm(direction)
    assert math.degrees(math.acos(np.clip(mean_step @ unit / speed, -1, 1))) < 25


def test_video_task_smoke_run_and_cli(capsys):
    from tables.command import main
    from tasks import get_task

    task = get_task("video")
    result = task.run("r3d_18", "daiq", profile="smoke", seed=0)
    assert result.task == "video" and result.dataset == "motion10" and result.paper_dataset == "ucf101"
    assert not result.diverged and 0 <= result.top1 <= 100 and math.isfinite(result.final_loss)
    assert result.iters == 4 and result.ms_per_iter > 0
    with pytest.raises(ValueError, match="choose from r3d_18, r3d_50"):
        task.run("resnet18", "daiq", profile="smoke")
    with pytest.raises(ValueError, match="choose from ucf101, kinetics400"):
        task.run("r3d_18", "daiq", profile="smoke", paper_dataset="imagenet")
    assert (
        main(["train", "--task", "video", "--model", "r3d_18", "--method", "fp32", "--profile", "paper"]) == 2
    )
    assert "data root" in capsys.readouterr().err
