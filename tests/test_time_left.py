"""A table's time left: each cell not yet run counted at what its row, else its network, took so far."""

from __future__ import annotations

import pytest

from tables.cells import Cell
from tables.time_left import seconds_left, seconds_left_by_work


def cell(model, method="fp32", seed=0):
    return Cell.make(
        task="classification", model=model, method=method, options={}, seed=seed, profile="embedded",
        paper_dataset="imagenet", data_root=None, recipe_version="1",
    )  # fmt: skip


def test_a_cell_takes_what_its_row_took_at_other_seeds():
    timed = {cell("alexnet"): 60.0, cell("resnet50"): 300.0, cell("resnet50", "daiq"): 400.0}
    pending = [cell("alexnet", seed=1), cell("resnet50", seed=1), cell("resnet50", "daiq", seed=1)]
    assert seconds_left(pending, timed) == pytest.approx(760.0)
    # the mean time a cell (253 s) would have said 3 x 253 for any three cells
    assert seconds_left([cell("alexnet", seed=s) for s in (1, 2, 3)], timed) == pytest.approx(180.0)


def test_else_its_network_else_the_mean_and_the_processes_share_it():
    timed = {cell("alexnet"): 60.0, cell("resnet50"): 300.0}
    assert seconds_left([cell("resnet50", "ui8")], timed) == pytest.approx(300.0)
    assert seconds_left([cell("vgg16")], timed) == pytest.approx(180.0)
    assert seconds_left([cell("resnet50", "ui8"), cell("vgg16")], timed, jobs=2) == pytest.approx(240.0)


def test_nothing_timed_says_nothing():
    assert seconds_left([cell("alexnet")], {}) is None
    assert seconds_left([], {cell("alexnet"): 60.0}) == 0.0


def test_a_figure_run_takes_its_work_at_the_seconds_a_unit_took():
    # two runs timed: 10 units in 100 s, 30 units in 200 s: 7.5 s a unit
    assert seconds_left_by_work([20.0, 4.0], [(10.0, 100.0), (30.0, 200.0)]) == pytest.approx(180.0)
    assert seconds_left_by_work([20.0], [(10.0, 100.0)], jobs=2) == pytest.approx(100.0)
    assert seconds_left_by_work([20.0], []) is None
