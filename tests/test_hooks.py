"""Int8TrainingHook on a real mmengine Runner: swap, checkpoint, resume, LR scaling, config errors."""

import uuid

import pytest
import torch
import torch.nn.functional as F
from mmengine.hooks import Hook
from mmengine.model import BaseModel
from mmengine.runner import Runner
from torch import nn
from torch.utils.data import Dataset

import repro.hooks  # noqa: F401  (registers Int8TrainingHook)
from repro import method_state_dict, quantized_layers


class TinyConvNet(BaseModel):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2))
        self.head = nn.Linear(16, 4)

    def forward(self, inputs, labels, mode="tensor"):
        logits = self.head(self.body(F.relu(self.stem(inputs))).mean(dim=(2, 3)))
        if mode == "loss":
            return {"loss": F.cross_entropy(logits, labels)}
        return logits


class Shapes(Dataset):
    def __init__(self, n=32):
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 3, 8, 8, generator=gen)
        self.y = torch.arange(n) % 4

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"inputs": self.x[i], "labels": self.y[i]}


class Capture(Hook):
    """Records the method state the model has when training starts (after resume)."""

    priority = "LOWEST"

    def __init__(self):
        self.state = None

    def before_train(self, runner):
        self.state = method_state_dict(runner.model)


DAIQ_HOOK = dict(type="Int8TrainingHook", method="daiq")


def make_runner(work_dir, max_iters, int8=DAIQ_HOOK, **kwargs):
    return Runner(
        model=TinyConvNet(),
        work_dir=str(work_dir),
        train_dataloader=dict(
            dataset=Shapes(),
            sampler=dict(type="DefaultSampler", shuffle=True),
            batch_size=8,
            num_workers=0,
            collate_fn=dict(type="default_collate"),
        ),
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.05, momentum=0.9)),
        param_scheduler=dict(type="MultiStepLR", milestones=[3], by_epoch=False),
        train_cfg=dict(by_epoch=False, max_iters=max_iters),
        default_hooks=dict(checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False)),
        custom_hooks=[dict(int8)] if int8 else [],
        randomness=dict(seed=0),
        default_scope="mmengine",
        experiment_name=f"int8-hook-{uuid.uuid4().hex[:8]}",  # mmengine keeps globals per name
        **kwargs,
    )


def test_hook_quantizes_saves_and_resumes_method_state(tmp_path):
    runner = make_runner(tmp_path, 4)
    runner.train()
    layers = quantized_layers(runner.model)
    assert sorted(layers) == ["body.0", "body.2"]  # stem and head skipped as first and last
    ckpt = torch.load(tmp_path / "iter_2.pth", map_location="cpu", weights_only=True)
    saved = ckpt["int8"]
    assert saved["method"] == "daiq" and saved["layers"]["body.0"]["step"] == 2
    assert list(ckpt["state_dict"]) == list(TinyConvNet().state_dict())  # keys unchanged

    capture = Capture()
    resumed = make_runner(tmp_path / "resumed", 4, resume=True, load_from=str(tmp_path / "iter_2.pth"))
    resumed.register_hook(capture)
    resumed.train()
    assert resumed.iter == 4
    for name, state in saved["layers"].items():
        assert capture.state[name]["step"] == state["step"]
        assert torch.equal(capture.state[name]["scale"], state["scale"])
    assert method_state_dict(resumed.model)["body.0"]["step"] == 4


def test_load_from_a_float_checkpoint_starts_fresh_method_state(tmp_path):
    make_runner(tmp_path / "fp", 2, int8=None).train()
    runner = make_runner(tmp_path / "int8", 2, load_from=str(tmp_path / "fp" / "iter_2.pth"))
    capture = Capture()
    runner.register_hook(capture)
    runner.train()
    assert capture.state["body.0"]["step"] == 0 and capture.state["body.0"]["scale"] is None


def test_ui8_lr_scaling_runs_through_the_hook(tmp_path):
    runner = make_runner(tmp_path, 3, int8=dict(type="Int8TrainingHook", method="ui8", period=1))
    runner.train()
    phi = runner.message_hub.get_scalar("train/int8_lr_scale").current()
    assert 0.1 <= phi <= 1.0
    assert all(layer.int8.updates == 3 for layer in quantized_layers(runner.model).values())


def test_bad_method_fails_when_the_config_is_built(tmp_path):
    with pytest.raises(ValueError, match="known methods: .*daiq"):
        make_runner(tmp_path, 1, int8=dict(type="Int8TrainingHook", method="int4"))
    with pytest.raises(ValueError, match="has no option"):
        make_runner(tmp_path, 1, int8=dict(type="Int8TrainingHook", method="daiq", alpha=1))
