"""A figure run killed after a checkpoint resumes from its work dir and records what the whole run would
have: the same records, samples, curves and top-1 as the run never stopped (an interrupt stands in for
the kill; checkpoints at every epoch of the smoke run)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tables.figures import runs
from tasks import top1

NAME = "resnet18-wageubn"  # recorded iterations and evaluations between them


def _trained(results, name: str = NAME) -> tuple[dict, dict, dict]:
    folder = runs.run_folder(results / "figures" / "runs", runs.RUNS[name], "smoke", None)
    body = json.loads((folder / "records.json").read_text())
    with np.load(folder / "samples.npz") as f:
        samples = dict(f)
    return json.loads((folder / "result.json").read_text())["result"], body, samples


def test_a_killed_figure_run_resumes_and_records_the_whole_run(tmp_path, monkeypatch):
    monkeypatch.setattr("tasks.checkpoints.DEFAULT_MIN_INTERVAL_S", 0.0)
    runs.ensure([NAME], "smoke", tmp_path / "whole", progress=False)
    whole, whole_body, whole_samples = _trained(tmp_path / "whole")

    real, calls = top1.CrossEntropyClassifier.forward, {"n": 0}

    def forward(self, inputs, labels=None, mode="tensor"):
        calls["n"] += 1 if mode == "loss" else 0
        if mode == "loss" and calls["n"] == whole["iters"] - 1:  # in the last epoch, after a checkpoint
            raise KeyboardInterrupt
        return real(self, inputs, labels, mode)

    monkeypatch.setattr(top1.CrossEntropyClassifier, "forward", forward)
    results = tmp_path / "killed"
    with pytest.raises(KeyboardInterrupt):
        runs.ensure([NAME], "smoke", results, progress=False)
    (work,) = (results / "figures" / "work").iterdir()
    assert list((work / "run").glob("epoch_*.pth"))
    monkeypatch.setattr(top1.CrossEntropyClassifier, "forward", real)

    log = results / "figures" / "logs" / f"{NAME}-smoke.log"
    killed_log = log.read_text()
    runs.ensure([NAME], "smoke", results, progress=False)
    assert killed_log and log.read_text().startswith(killed_log) and len(log.read_text()) > len(killed_log)
    resumed, body, samples = _trained(results)
    assert resumed["resumed_from"] and not work.exists()
    assert whole_body["records"] and whole_body["curves"]["val"]
    assert body == whole_body  # every record, and the curves from the first iteration on
    assert samples.keys() == whole_samples.keys()
    assert all(np.array_equal(samples[k], whole_samples[k]) for k in samples)
    assert (resumed["top1"], resumed["final_loss"]) == (whole["top1"], whole["final_loss"])
