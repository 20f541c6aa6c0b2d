"""A run in a kept work dir resumes from its own checkpoints, exactly; another run's are never loaded.

The kill test runs `repro train` in subprocesses (tests/faults.py kills one with SIGKILL as a chosen
iteration starts). At the smoke profile, with one thread, a run killed twice (once after an epoch's
checkpoint, once after a mid-epoch one) and resumed ends bit-identical to the uninterrupted run: the
same final loss and top-1, and the same weights, optimizer state, method state and RNG states in its
last checkpoint. Only the timing differs (ms_per_iter). With loader workers (the paper profile) the
workers' augmentation streams restart from their seeds (tasks/train_loops.py); that is not tested here.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import repro  # noqa: F401  (weights_only loading of mmengine checkpoints)
from tasks import classification
from tasks import datasets as D
from tasks import runner as harness
from tasks.checkpoints import RUN_KEY
from tasks.resume import differences, run_identity

REPO = Path(__file__).resolve().parents[1]
# checkpoints at every epoch and every 2 iterations, at once (the smoke profile saves none otherwise)
EVERY = ["default_hooks.checkpoint.iter_interval=2", "default_hooks.checkpoint.min_interval_s=0"]
TRAIN = ["train", "--model", "resnet18", "--method", "daiq", "--profile", "smoke", "--json"]


def _repro(work: Path, kill_at: int | None = None, compiled: bool = False) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("REPRO_FAULT_KILL_AT", None)
    if kill_at is not None:
        env["REPRO_FAULT_KILL_AT"] = str(kill_at)
    cmd = [sys.executable, str(REPO / "tests" / "faults.py"), *TRAIN, "--work-dir", str(work)]
    cmd += ["--compile"] if compiled else []
    return subprocess.run(
        [*cmd, "--cfg-options", *EVERY], env=env, capture_output=True, text=True, timeout=300
    )


def _result(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("{")))


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.slow
def test_a_sigkilled_run_resumes_and_ends_as_the_uninterrupted_one(tmp_path):
    D.ensure_digits()  # made here, not by the subprocesses
    whole = _result(_repro(tmp_path / "whole"))
    assert sorted(p.name for p in (tmp_path / "whole").glob("*.pth")) == ["epoch_1.pth", "epoch_2.pth"]

    work = tmp_path / "killed"  # 2 epochs of 3 iterations
    first = _repro(work, kill_at=3)  # killed as epoch 2 starts: epoch_1.pth is the last checkpoint
    assert first.returncode == -signal.SIGKILL
    assert sorted(p.name for p in work.glob("*.pth")) == ["epoch_1.pth"]  # iter_2.pth gave way to it
    second = _repro(work, kill_at=5)  # resumed, then killed inside epoch 2, after iter_4.pth
    assert second.returncode == -signal.SIGKILL
    assert f"resuming from {work / 'epoch_1.pth'} (after 3 iterations, 1 epochs done)" in second.stderr
    assert sorted(p.name for p in work.glob("*.pth")) == ["epoch_1.pth", "iter_4.pth"]
    copy = tmp_path / "copied"  # the work dir copied elsewhere and resumed there first
    shutil.copytree(work, copy)
    assert _result(_repro(copy))["resumed_from"] == str(copy / "iter_4.pth")
    assert not list(copy.glob("iter_*.pth")) and (work / "iter_4.pth").exists()  # each cleans its own
    resumed = _result(_repro(work))

    assert resumed["resumed_from"] == str(work / "iter_4.pth") and whole["resumed_from"] is None
    for key in ("iters", "epochs", "final_loss", "top1", "diverged"):
        assert resumed[key] == whole[key], key
    a, b = (torch.load(d / "epoch_2.pth", map_location="cpu") for d in (tmp_path / "whole", work))
    for key in ("state_dict", "optimizer", "param_schedulers", "int8", "repro_recorder"):
        if key == "repro_recorder":
            a[key].pop("times"), b[key].pop("times")  # wall-clock times differ
        assert _same(a[key], b[key]), key
    assert _same(a["meta"]["repro_rng"], b["meta"]["repro_rng"])
    assert not list(work.glob("iter_*.pth")) and not list(work.glob(".*.tmp"))  # superseded, removed


@pytest.mark.slow
def test_a_compiled_run_killed_after_an_epoch_resumes_under_compile_and_ends_as_the_whole_one(tmp_path):
    """MMEngine's compile=True wraps the model; its checkpoints hold the plain model's keys, and a
    compiled run resumes from them into a freshly compiled model."""
    D.ensure_digits()
    whole = _result(_repro(tmp_path / "whole", compiled=True))
    work = tmp_path / "killed"
    first = _repro(work, kill_at=3, compiled=True)  # killed as epoch 2 starts, after epoch_1.pth
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    resumed = _result(_repro(work, compiled=True))
    assert resumed["resumed_from"] == str(work / "epoch_1.pth")
    for key in ("iters", "epochs", "final_loss", "top1", "diverged"):
        assert resumed[key] == whole[key], key
    a, b = (torch.load(d / "epoch_2.pth", map_location="cpu") for d in (tmp_path / "whole", work))
    assert not any("_orig_mod" in k for k in a["state_dict"])
    for key in ("state_dict", "optimizer", "int8"):
        assert _same(a[key], b[key]), key


def _smoke(method: str, work: Path, **kw):
    return classification.run("resnet18", method, profile="smoke", work_dir=str(work), **kw)


def test_a_checkpoint_of_another_run_is_never_loaded(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("tasks.checkpoints.DEFAULT_MIN_INTERVAL_S", 0.0)
    work = tmp_path / "w"
    fp32 = _smoke("fp32", work)
    saved = torch.load(work / "epoch_2.pth", map_location="cpu")["meta"][RUN_KEY]
    assert (
        saved["method"] == "fp32"
        and saved["numerics"]
        and saved["recipe_version"] == classification.RECIPE_VERSION
    )
    (work / "epoch_9.pth").write_bytes(b"half a checkpoint")  # e.g. written by something else, killed
    (work / ".epoch_3.pth.tmp").write_bytes(b"partial")  # a write killed before its rename
    capsys.readouterr()

    daiq = _smoke("daiq", work)
    err = capsys.readouterr().err
    assert daiq.resumed_from is None and fp32.resumed_from is None and not daiq.diverged
    lines = [line for line in err.splitlines() if line.startswith("repro: ")]
    assert len(lines) == 3 and "resuming" not in err, err
    assert any(f"{work / 'epoch_2.pth'} is a checkpoint of another run: method " in line for line in lines)
    assert any('method "fp32" (this run: "daiq")' in line for line in lines)
    assert any(f"{work / 'epoch_9.pth'} is unreadable" in line for line in lines)
    aside = list((work / "other-runs").glob("*/epoch_*.pth"))
    assert sorted(p.name for p in aside) == ["epoch_1.pth", "epoch_2.pth", "epoch_9.pth"]
    assert not (work / ".epoch_3.pth.tmp").exists()
    # the daiq run's own checkpoints replaced nothing of fp32's: a rerun of fp32 starts afresh too
    assert torch.load(work / "epoch_2.pth", map_location="cpu")["meta"][RUN_KEY]["method"] == "daiq"


def test_the_identity_names_every_difference():
    ours = run_identity(method="daiq", seed=0, method_options={"k": 1.0}, numerics="2")
    theirs = run_identity(method="daiq", seed=1, method_options={"k": 1.5}, numerics="1")
    assert differences(theirs, ours) == [
        'method_options {"k": 1.5} (this run: {"k": 1.0})',
        'numerics "1" (this run: "2")',
        "seed 1 (this run: 0)",
    ]
    assert differences(ours, ours) == []
    assert differences(None, ours) == [
        "it holds no run identity (another program or an older version wrote it)"
    ]


def test_checkpoints_appear_whole_or_not_at_all(tmp_path, monkeypatch):
    """A kill while a checkpoint is written leaves no file under a checkpoint's name."""
    import mmengine.runner.runner as mmengine_runner

    monkeypatch.setattr("tasks.checkpoints.DEFAULT_MIN_INTERVAL_S", 0.0)
    real = mmengine_runner.save_checkpoint

    def killed_midway(checkpoint, filename, **kw):
        Path(filename).write_bytes(b"the first half of a checkpoint")
        raise KeyboardInterrupt  # the process dies here

    monkeypatch.setattr(mmengine_runner, "save_checkpoint", killed_midway)
    with pytest.raises(KeyboardInterrupt):
        _smoke("daiq", tmp_path)
    assert not list(tmp_path.glob("*.pth")) and list(tmp_path.glob(".epoch_1.pth.tmp"))
    monkeypatch.setattr(mmengine_runner, "save_checkpoint", real)
    rerun = _smoke("daiq", tmp_path)  # the partial file is cleared, the run starts afresh
    assert rerun.resumed_from is None and not list(tmp_path.glob(".*.tmp"))
    assert sorted(p.name for p in tmp_path.glob("*.pth")) == ["epoch_1.pth", "epoch_2.pth"]


def test_a_temporary_work_dir_keeps_no_checkpoints_and_the_loop_is_resumable(monkeypatch):
    seen = {}
    real = harness.train

    def spy(cfg):
        seen["cfg"] = cfg
        return real(cfg)

    monkeypatch.setattr(harness, "train", spy)
    classification.run("resnet18", "fp32", profile="smoke")
    cfg = seen["cfg"]
    assert cfg.default_hooks.checkpoint is None and cfg.train_cfg.type == "tasks.ResumableEpochBasedTrainLoop"
    assert cfg[RUN_KEY]["model"] == "resnet18" and not cfg.get("resume")


def test_a_table_cell_killed_mid_run_resumes_from_its_work_dir(tmp_path, monkeypatch):
    """The table generator keeps an unfinished cell's work dir; the next `repro table` resumes the cell
    from its checkpoint there (an interrupt stands in for the kill; checkpoints at every epoch)."""
    import dataclasses

    from tables.generate import generate
    from tables.specs import SPECS
    from tasks import top1

    monkeypatch.setattr("tasks.checkpoints.DEFAULT_MIN_INTERVAL_S", 0.0)
    spec = SPECS["table4"]
    spec = dataclasses.replace(
        spec, rows=tuple(r for r in spec.rows if (r.model, r.method) == ("resnet18", "daiq"))
    )
    real, calls = top1.CrossEntropyClassifier.forward, {"n": 0}

    def forward(self, inputs, labels=None, mode="tensor"):
        calls["n"] += 1 if mode == "loss" else 0
        if mode == "loss" and calls["n"] == 6 + 5:  # the FP32 baseline's 6 steps, then the 5th of DAIQ's
            raise KeyboardInterrupt
        return real(self, inputs, labels, mode)

    monkeypatch.setattr(top1.CrossEntropyClassifier, "forward", forward)
    with pytest.raises(KeyboardInterrupt):
        generate(spec, profile="smoke", results_dir=tmp_path, progress=False)
    (work,) = [p for p in (tmp_path / "work").iterdir() if p.is_dir()]
    assert sorted(p.name for p in work.glob("*.pth")) == ["epoch_1.pth"]

    out = generate(spec, profile="smoke", results_dir=tmp_path, progress=False)
    assert out.ran == 1 and out.cached == 1 and out.errors == 0
    (resumed,) = [o.result for o in out.outcomes.values() if not o.cached]
    assert resumed["method"] == "daiq" and resumed["resumed_from"] == str(work / "epoch_1.pth")
    assert resumed["iters"] == 6 and resumed["top1"] is not None
    assert not work.exists()  # removed once the cell is cached


def test_a_paper_run_without_a_work_dir_says_it_cannot_resume(tmp_path, capsys):
    from tables.command import main

    args = ["train", "--model", "resnet18", "--method", "fp32", "--profile", "paper", "--data-root"]
    assert main([*args, str(tmp_path)]) == 2  # no ImageNet there
    assert "no --work-dir: this run keeps no checkpoints" in capsys.readouterr().err
    assert main([*args, str(tmp_path), "--work-dir", str(tmp_path / "w")]) == 2
    assert "no --work-dir" not in capsys.readouterr().err
