"""tables.seed_spread: the size study's parsing, its pairing of FP32 and INT8 seed by seed, and its recipe."""

import argparse
import json
import statistics

import pytest

import tasks.classification as classification
from tables import seed_spread
from tables.delta_interval import delta_interval


def _record(method, seed, top1, images=6400, epochs=2, diverged=False, flags=None):
    return dict(
        model="resnet18", method=method, seed=seed, top1=top1, diverged=diverged, iters=images // 32 * epochs,
        ms_per_iter=10.0, val_correct=flags, train_images=images, train_epochs=epochs,
    )  # fmt: skip


def test_sizes_and_seeds_parse_and_bad_ones_say_how_to_write_them():
    assert seed_spread.parse_size("6400x2") == (6400, 2)
    assert seed_spread.parse_seeds("2-5") == [2, 3, 4, 5]
    assert seed_spread.parse_seeds("0,7") == [0, 7]
    for bad in ("6400", "6400x0", "ax2"):
        with pytest.raises(argparse.ArgumentTypeError, match="images x epochs|at least"):
            seed_spread.parse_size(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="0-5"):
        seed_spread.parse_seeds("zero")


def test_summary_pairs_int8_with_fp32_seed_by_seed_per_size():
    fp32 = {0: 80.0, 1: 81.0, 2: 82.0, 3: 79.0}
    daiq = {0: 79.0, 1: 81.5, 2: 81.0}  # seed 3 unfinished: left out of the pairing
    records = [_record("fp32", s, v) for s, v in fp32.items()] + [
        _record("daiq", s, v) for s, v in daiq.items()
    ]
    records += [_record("fp32", s, 85.0 + s, epochs=8) for s in (0, 1)]
    records += [_record("daiq", 0, 84.0, epochs=8), _record("daiq", 1, 80.0, epochs=8, diverged=True)]
    (row,) = seed_spread.summarize(records)  # the 8-epoch size has one finished pair: no row
    diffs = [-1.0, 0.5, -1.0]
    assert (row["images"], row["epochs"], row["seeds"]) == (6400, 2, 3)
    assert row["delta"] == pytest.approx(statistics.mean(diffs))
    assert row["delta_sd"] == pytest.approx(statistics.stdev(diffs))
    assert row["fp32"] == pytest.approx(81.0) and row["int8"] == pytest.approx(statistics.mean(daiq.values()))
    assert row["half_width"] == pytest.approx(delta_interval(diffs, []).half_width)
    text = seed_spread.markdown([row], "# header")
    assert "| resnet18 | daiq | 6400 x 2 | 400 | 3 |" in text and f"{row['half_width']:.2f}" in text


def test_a_run_trains_the_embedded_recipe_at_the_asked_size_and_leaves_the_recipe_as_it_was(
    tmp_path, monkeypatch
):
    seen = {}

    class Result:
        def to_dict(self):
            return dict(model="resnet18", method="daiq", seed=3)

    def run_top1(spec, build_config, **_):
        # the task's own run and build_config, stopped where the harness would train the config
        cfg = build_config(**spec.run_arguments(), work_dir=None)
        seen.update(
            train_limit=cfg["train_dataloader"]["dataset"]["limit"],
            epochs=cfg["train_cfg"]["max_epochs"],
            val_interval=cfg["train_cfg"]["val_interval"],
            lr=cfg["optim_wrapper"]["optimizer"]["lr"],
            profile=spec.profile,
            seed=spec.seed,
        )
        return Result()

    before = classification.recipe
    monkeypatch.setattr(classification, "run_top1", run_top1)
    path = tmp_path / "run.json"
    seed_spread.train_one("resnet18", "daiq", 3, 12800, 4, path)
    assert (seen["train_limit"], seen["epochs"], seen["val_interval"]) == (12800, 4, 4)
    assert (seen["profile"], seen["seed"], seen["lr"]) == (
        "embedded",
        3,
        before("resnet18", "embedded", "imagenet")["lr"],
    )
    assert classification.recipe is before
    assert json.loads(path.read_text())["train_images"] == 12800
