"""Figure runs are trained longest first (tables.figures.run_order), so that with `make figures JOBS=2` no
long run is left for last while the other process has nothing to do."""

from __future__ import annotations

from dataclasses import replace

from tables.figures import runs
from tables.figures.run_order import estimated_work


def test_work_grows_with_the_network_and_the_validations():
    work = {n: estimated_work(runs.RUNS[n], "embedded") for n in ("resnet50-fp32", "resnet18-fp32")}
    assert work["resnet50-fp32"] > work["resnet18-fp32"]
    one = runs.RUNS["resnet18-gq"]
    assert estimated_work(replace(one, evals=12), "embedded") > estimated_work(one, "embedded")


def test_ensure_trains_the_longest_run_first(tmp_path, monkeypatch):
    trained = []

    def fake_train(spec, profile, run_folder, data_root, log):
        trained.append(spec.name)
        run_folder.mkdir(parents=True)
        (run_folder / "result.json").write_text("{}")

    monkeypatch.setattr(runs, "train", fake_train)
    monkeypatch.setattr(runs, "read", lambda root, spec, profile, data_root: spec.name)
    in_figure_order = ["ui8-mobilenet-fp32", "resnet18-fp32", "resnet50-fp32"]
    runs.ensure(in_figure_order, "smoke", tmp_path, progress=False)
    assert trained == ["resnet50-fp32", "resnet18-fp32", "ui8-mobilenet-fp32"]


def test_the_progress_bar_says_the_time_left_once_a_run_is_timed(tmp_path, monkeypatch, capsys):
    def fake_train(spec, profile, run_folder, data_root, log):
        run_folder.mkdir(parents=True)
        (run_folder / "result.json").write_text('{"meta": {"elapsed_s": 60.0}}')

    monkeypatch.setattr(runs, "train", fake_train)
    monkeypatch.setattr(runs, "read", lambda root, spec, profile, data_root: spec.name)
    runs.ensure(["resnet50-fp32", "resnet18-fp32"], "smoke", tmp_path, progress=True)
    err = capsys.readouterr().err
    first, second = err.split("resnet50-fp32")[1], err.split("resnet18-fp32")[1]
    assert "left" not in first.split("]")[0] and "left]" in second  # ResNet-18 at ResNet-50's seconds a FLOP
