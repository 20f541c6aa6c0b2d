"""MMEngine checkpoints round-trip under torch's default ``weights_only=True`` load.

mmengine 0.10.7 calls ``torch.load(filename, map_location=...)`` without ``weights_only``, which torch
>= 2.6 treats as ``weights_only=True``; resuming a Runner works only once
``repro.compat.register_mmengine_safe_globals`` has allowlisted what mmengine pickles. These tests
train a tiny Runner, resume a second one from its checkpoint and check that the resume really
restored the iteration counter, the weights, the optimizer and the LR scheduler.
"""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

pytest.importorskip("mmengine")

from mmengine.evaluator import BaseMetric  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402
from mmengine.model import BaseModel  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from repro.compat import mmengine_safe_globals, register_mmengine_safe_globals  # noqa: E402

MAX_ITERS = 4
RESUMED_MAX_ITERS = 6
LR = 0.1
MILESTONE = 3  # the LR drops to LR * GAMMA after iteration 3, so the saved iteration-4 state is decayed
GAMMA = 0.1


class TinyData(Dataset):
    """16 fixed samples, 4 features, 2 classes, in memory."""

    def __init__(self, n: int = 16):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict:
        return dict(inputs=self.x[i], labels=self.y[i])


class TinyModel(BaseModel):
    """The BaseModel API: forward(inputs, labels, mode) for mode in {'loss', 'predict', 'tensor'}."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, inputs, labels=None, mode: str = "tensor"):
        logits = self.fc(inputs)
        if mode == "loss":
            return dict(loss=F.cross_entropy(logits, labels))
        if mode == "predict":
            return [dict(pred=int(p), gt=int(t)) for p, t in zip(logits.argmax(1), labels, strict=True)]
        return logits


class TinyAccuracy(BaseMetric):
    """Returns a numpy scalar, as many metrics do: it lands in the message hub and the checkpoint."""

    def process(self, data_batch, data_samples) -> None:
        self.results.extend(float(s["pred"] == s["gt"]) for s in data_samples)

    def compute_metrics(self, results: list) -> dict:
        return dict(acc=np.float64(np.mean(results)))


class RecordAtStart(Hook):
    """Snapshots the runner's state in before_train, i.e. right after load_or_resume()."""

    def __init__(self):
        self.seen: dict = {}

    def before_train(self, runner) -> None:
        self.seen = dict(
            iter=runner.iter,
            state_dict=copy.deepcopy(runner.model.state_dict()),
            optimizer=copy.deepcopy(runner.optim_wrapper.state_dict()),
            lr=runner.optim_wrapper.get_lr()["lr"][0],
            scheduler=copy.deepcopy(runner.param_schedulers[0].state_dict()),
        )


def _runner(work_dir, name: str, max_iters: int, **kwargs) -> Runner:
    torch.manual_seed(0)
    loader = dict(
        dataset=TinyData(),
        sampler=dict(type="DefaultSampler", shuffle=True),
        batch_size=4,
        num_workers=0,
        collate_fn=dict(type="default_collate"),
    )
    return Runner(
        model=TinyModel(),
        work_dir=str(work_dir),
        experiment_name=f"{name}_{uuid.uuid4().hex[:8]}",  # mmengine keeps global instances by this name
        train_dataloader=loader,
        val_dataloader=dict(loader, sampler=dict(type="DefaultSampler", shuffle=False)),
        # val at iteration 2, so the iteration-4 checkpoint holds the metric's numpy scalar
        train_cfg=dict(by_epoch=False, max_iters=max_iters, val_interval=2),
        val_cfg=dict(),
        val_evaluator=[TinyAccuracy()],
        optim_wrapper=dict(optimizer=dict(type="SGD", lr=LR, momentum=0.9, weight_decay=1e-4)),
        param_scheduler=dict(type="MultiStepLR", by_epoch=False, milestones=[MILESTONE], gamma=GAMMA),
        default_hooks=dict(
            logger=dict(type="LoggerHook", interval=1),
            checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False),
        ),
        randomness=dict(seed=0),
        env_cfg=dict(cudnn_benchmark=False),
        log_level="WARNING",
        **kwargs,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 4-iteration run: (work_dir, last checkpoint path, the runner)."""
    register_mmengine_safe_globals()
    work_dir = tmp_path_factory.mktemp("mmengine_ckpt")
    runner = _runner(work_dir, "first", MAX_ITERS)
    runner.train()
    ckpt = work_dir / f"iter_{MAX_ITERS}.pth"
    assert ckpt.is_file(), sorted(p.name for p in work_dir.iterdir())
    return work_dir, ckpt, runner


def _assert_tree_equal(a, b, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m: f"{path}: {m}")
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_tree_equal(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_tree_equal(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def test_register_is_idempotent():
    register_mmengine_safe_globals()
    before = torch.serialization.get_safe_globals()
    register_mmengine_safe_globals()
    after = torch.serialization.get_safe_globals()
    assert len(after) == len(before) and set(after) == set(before)


class _Getattr:
    """Pickles as ``getattr(obj, name)``, as protocol 2 writes HistoryBuffer's statistics methods."""

    def __init__(self, obj, name: str):
        self.obj, self.name = obj, name

    def __reduce__(self):
        return getattr, (self.obj, self.name)


def test_getattr_allowed_only_for_history_buffer_methods(tmp_path):
    from mmengine.logging import HistoryBuffer

    register_mmengine_safe_globals()
    path = tmp_path / "getattr.pth"
    torch.save({"m": _Getattr(HistoryBuffer, "mean")}, path)
    assert torch.load(path, weights_only=True)["m"] is HistoryBuffer.mean
    for obj, name in [
        (HistoryBuffer, "__init__"),
        (HistoryBuffer, "_set_default_statistics"),
        (np.ndarray, "tofile"),
    ]:
        torch.save({"m": _Getattr(obj, name)}, path)
        with pytest.raises(pickle.UnpicklingError, match="not allowed"):
            torch.load(path, weights_only=True)


def test_checkpoint_loads_weights_only_after_registration(trained):
    _, ckpt, _ = trained
    register_mmengine_safe_globals()
    ckpt_data = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert ckpt_data["meta"]["iter"] == MAX_ITERS
    hub = ckpt_data["message_hub"]
    assert "train/loss" in hub["log_scalars"]  # a HistoryBuffer with numpy arrays inside
    assert "val/acc" in hub["log_scalars"]  # the metric's numpy scalar, logged at iteration 2
    assert isinstance(hub["runtime_info"]["eta"], np.floating)  # a numpy scalar (IterTimerHook)
    # every global the checkpoint needs beyond torch's defaults is in our list
    registered = torch.serialization.get_safe_globals()
    torch.serialization.clear_safe_globals()  # else it reports only what is still missing
    try:
        needed = set(torch.serialization.get_unsafe_globals_in_checkpoint(str(ckpt)))
    finally:
        torch.serialization.add_safe_globals(registered)
    ours = {
        g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}" for g in mmengine_safe_globals()
    }
    assert needed, "the checkpoint needs nothing beyond torch's defaults: this test no longer tests anything"
    assert needed <= ours, f"not allowlisted: {needed - ours}"


def _load_in_fresh_interpreter(ckpt, prelude: str) -> subprocess.CompletedProcess:
    """torch.load(ckpt) with torch's default weights_only, as mmengine calls it, in a new process
    (this process has registered the globals already). Prints LOADED or REFUSED."""
    code = textwrap.dedent(
        f"""
        import pickle, torch
        {prelude}
        try:
            torch.load({str(ckpt)!r}, map_location="cpu")
        except pickle.UnpicklingError as e:
            print("REFUSED", e)
        else:
            print("LOADED")
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE")}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_checkpoint_refused_without_registration(trained):
    _, ckpt, _ = trained
    proc = _load_in_fresh_interpreter(ckpt, "import mmengine")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("REFUSED") and "weights_only" in proc.stdout, proc.stdout


def test_checkpoint_loads_after_import_repro(trained):
    _, ckpt, _ = trained
    proc = _load_in_fresh_interpreter(ckpt, "import repro")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("LOADED"), (
        "`import repro` should call repro.compat.register_mmengine_safe_globals()\n" + proc.stdout
    )


def test_resume_restores_iter_weights_optimizer_scheduler(trained):
    work_dir, ckpt, first = trained
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    record = RecordAtStart()
    resumed = _runner(
        work_dir,
        "resumed",
        RESUMED_MAX_ITERS,
        resume=True,
        load_from=str(ckpt),
        custom_hooks=[record],
    )
    resumed.train()
    seen = record.seen

    # the iteration counter continues from the checkpoint, and training went on to the new end
    assert seen["iter"] == MAX_ITERS
    assert resumed.iter == RESUMED_MAX_ITERS
    assert (work_dir / f"iter_{RESUMED_MAX_ITERS}.pth").is_file()

    # the weights are the saved ones, which are the first run's final weights
    _assert_tree_equal(seen["state_dict"], dict(saved["state_dict"]))
    _assert_tree_equal(seen["state_dict"], {k: v.cpu() for k, v in first.model.state_dict().items()})

    # the optimizer state (SGD momentum buffers, param groups) is the saved one
    _assert_tree_equal(seen["optimizer"], saved["optimizer"])
    momentum = seen["optimizer"]["state"]
    assert momentum and all(s["momentum_buffer"].abs().sum() > 0 for s in momentum.values())

    # the LR scheduler resumed past its milestone (a fresh one would restart at LR)
    _assert_tree_equal(seen["scheduler"], saved["param_schedulers"][0])
    assert seen["scheduler"]["_global_step"] == MAX_ITERS
    assert seen["lr"] == pytest.approx(LR * GAMMA)

    # and training after resume moved the weights on
    after = resumed.model.state_dict()
    assert any(not torch.equal(after[k].cpu(), v) for k, v in seen["state_dict"].items())
