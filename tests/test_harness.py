"""The shared training harness and the recipes as data: what every task runs through."""

import pytest

from tasks import recipes
from tasks.runner import RunResult, summary
from tasks.subsets import balanced_prefix


def _result(**changes) -> RunResult:
    fields = dict(
        task="classification", model="resnet18", method="daiq", profile="smoke", paper_dataset="imagenet",
        dataset="digits", seed=0, epochs=2, iters=6, final_loss=2.25, diverged=False, ms_per_iter=12.5,
        scores={"top1": 50.0},
    )  # fmt: skip
    return RunResult(**{**fields, **changes})


def test_run_result_reads_scores_as_attributes_and_flattens_them():
    result = _result()
    assert result.top1 == 50.0 and result.to_dict()["top1"] == 50.0 and "scores" not in result.to_dict()
    with pytest.raises(AttributeError, match="no 'map'"):
        result.map  # noqa: B018


def test_a_result_and_a_table_cell_name_the_run_they_belong_to():
    """The RunSpec a result reports is the run a cell of the same fields trains (the data root aside, which
    a result does not keep), and its run arguments are what the task's `run` takes."""
    from tables.cells import Cell

    result = _result(method_options={"k": 1.2})
    cell = Cell.make(
        task="classification", model="resnet18", method="daiq", options={"k": 1.2}, seed=0, profile="smoke",
        paper_dataset="imagenet", data_root=None, recipe_version="2",
    )  # fmt: skip
    assert result.spec.fields() == {**cell.spec.fields(), "method_options": {"k": 1.2}}
    assert cell.spec.method_options["k"] == 1.2  # the cell's options are normalized (defaults filled in)
    assert set(cell.spec.run_arguments()) == {
        "model", "method", "profile", "paper_dataset", "seed", "method_options", "data_root"
    }  # fmt: skip


def test_summary_is_one_line_per_task():
    assert summary(_result()) == (
        "classification resnet18 daiq (smoke, digits standing in for imagenet, seed 0): top-1 50.00%, "
        "final loss 2.2500, 2 epochs, 6 iters, 12.5 ms/iter"
    )
    detection = _result(
        task="detection", paper_dataset="voc", dataset="shapes-det", epochs=None,
        scores={"map": 30.0, "map_50": 30.0, "map_5095": None},
    )  # fmt: skip
    assert summary(detection).endswith("): mAP@.5 30.00, final loss 2.2500, 6 iters, 12.5 ms/iter")
    diverged = _result(diverged=True, final_loss=None, scores={"top1": None})
    assert summary(diverged).endswith("seed 0): diverged after 6 iters, 12.5 ms/iter")


def test_recipe_layers_the_more_specific_entry_wins(tmp_path, monkeypatch):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "base.py").write_text(
        "lr = 1.0\nepochs = 3\nbatch = 8\n"
        "networks = dict(net=dict(lr=2.0, epochs=4))\n"
        "datasets = dict(d=dict(lr=3.0, batch=16, networks=dict(net=dict(epochs=5))))\n"
    )
    (tmp_path / "t" / "short.py").write_text('_base_ = ["./base.py"]\noverrides = dict(epochs=1)\n')
    monkeypatch.setattr(recipes, "CONFIG_ROOT", tmp_path)
    assert recipes.recipe_entries("t", "base", "other", "e") == {"lr": 1.0, "epochs": 3, "batch": 8}
    assert recipes.recipe_entries("t", "base", "other", "d") == {"lr": 3.0, "epochs": 3, "batch": 16}
    assert recipes.recipe_entries("t", "base", "net", "e") == {"lr": 2.0, "epochs": 4, "batch": 8}
    assert recipes.recipe_entries("t", "base", "net", "d") == {"lr": 2.0, "epochs": 5, "batch": 16}
    assert recipes.recipe_entries("t", "short", "net", "d")["epochs"] == 1


def test_balanced_prefix_keeps_the_first_of_each_class():
    labels = [0, 0, 1, 0, 2, 1, 1, 2, 2]
    assert balanced_prefix(labels, num_classes=3, limit=6) == [0, 1, 2, 4, 5, 7]
    assert balanced_prefix(labels, num_classes=3, limit=1) == [0, 2, 4]  # at least one per class
