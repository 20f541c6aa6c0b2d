"""One training, several cells (tables.shared_training): at the short profiles DAIQ Table 5's VOC cells are
its COCO cells' runs scored as VOC, also when the COCO cells were cached by another process or session."""

from __future__ import annotations

import pytest

from tables.cells import Cache, CellClaim
from tables.generate import _Session, generate
from tables.shared_training import SharedTraining
from tasks import detection as D


class FakeDetector:
    """Stand-in for tasks.detection.run: one made-up training per call, both metrics as CocoMetric gives."""

    def __init__(self):
        self.calls = []

    def __call__(self, **kw):
        self.calls.append(kw)
        n = len(self.calls)
        scores = dict(map_50=60.0 + n, map_5095=30.0 + n, shared_run=None, note=None)
        D._choose_map(scores, kw["paper_dataset"], False)
        return dict(
            task="detection", model=kw["model"], method=kw["method"], paper_dataset=kw["paper_dataset"],
            seed=kw["seed"], diverged=False, dataset="shapes-det", epochs=None, iters=2,
            ms_per_iter=100.0 + n, simulated=False, **scores,
        )  # fmt: skip


def run_table5(tmp_path, runner, results="results"):
    shared = SharedTraining.of_task("detection")
    return generate(
        "table5", profile="smoke", results_dir=tmp_path / results, cache_dir=tmp_path / "cache",
        runner=runner, progress=False, shared=shared,
    )  # fmt: skip


def test_voc_cells_are_the_coco_cells_runs_scored_at_iou_half(tmp_path):
    fake = FakeDetector()
    out = run_table5(tmp_path, fake)
    # 2 detectors x (FP32 + UI8 + DAIQ) trainings serve the 8 rows' 12 cells
    assert len(fake.calls) == 6 and {c["paper_dataset"] for c in fake.calls} == {"coco"}
    assert out.meta["cells"]["rescored"] == 6 and "6 of its cells are another cell's training" in out.markdown
    rows = out.frame.set_index("label")
    for model in ("Faster R-CNN", "RetinaNet"):
        coco, voc = rows.loc[f"COCO {model} Ours"], rows.loc[f"VOC {model} Ours"]
        trained = next(
            c for c in fake.calls if c["method"] == "daiq" and c["model"].startswith(model[:5].lower())
        )
        n = fake.calls.index(trained) + 1
        assert (coco["int8"], voc["int8"]) == (30.0 + n, 60.0 + n)  # AP@[.5:.95] and AP@0.5 of one run
    voc_outcomes = [o for o in out.outcomes.values() if o.shared_from]
    assert all(o.result["shared_run"].startswith("the coco cell's") for o in voc_outcomes)
    assert all(o.elapsed_s == 0.0 and o.cpu_s == 0.0 for o in voc_outcomes)  # time counted once
    # the 6 trainings recorded their CPU time; the footer does not count the 6 rescored cells as missing it
    assert out.meta["cpu_cells"] == 6 and "CPU time" in out.markdown
    assert "cells recorded it" not in out.markdown


def test_a_table_resumed_in_a_new_process_trains_no_voc_cell_again(tmp_path):
    """The COCO cells cached by an earlier run (another process: nothing in tasks.detection's memo)."""
    coco_only = FakeDetector()
    generate(
        "ui8-table9", profile="smoke", results_dir=tmp_path / "first", cache_dir=tmp_path / "cache",
        runner=coco_only, progress=False, shared=SharedTraining.of_task("detection"),
    )  # fmt: skip
    # a COCO-only table: looking for its cells' VOC twins left no lock file for cells it never runs
    assert len(coco_only.calls) == 4 and not list((tmp_path / "first" / "work").glob("*"))
    resumed = FakeDetector()
    out = run_table5(tmp_path, resumed)
    # UI8 Table 9 trained the COCO FP32 and UI8 cells; Table 5 trains only its DAIQ ones
    assert {c["method"] for c in resumed.calls} == {"daiq"} and len(resumed.calls) == 2
    assert out.ran == 2 and out.meta["cells"]["rescored"] == 6
    assert not list((tmp_path / "results" / "work").glob("*"))  # no claim left behind, twins' included


def test_a_cell_waits_while_another_process_trains_its_twin(tmp_path):
    shared = SharedTraining.of_task("detection")
    out = run_table5(tmp_path, FakeDetector())
    voc = next(c for rp in out.plan.rows for _, *cells in rp.cells for c in cells if c.paper_dataset == "voc")
    (twin,) = shared.twins(voc)
    cache, work = Cache(tmp_path / "cache"), tmp_path / "work"
    cache.path(twin).unlink()
    session = _Session(out.plan, cache, FakeDetector(), work, None, None, {}, shared)
    held = CellClaim(work, twin)
    assert held.acquire(wait=False)  # flock: a second open file conflicts even within one process
    assert session.twins_running(voc, wait=False)
    held.release()
    assert not session.twins_running(voc, wait=False)


def test_the_time_left_counts_one_training_for_a_cell_and_its_twin(tmp_path, monkeypatch):
    import tables.generate

    shared = SharedTraining.of_task("detection")
    out = run_table5(tmp_path, FakeDetector())
    cache = Cache(tmp_path / "cache")
    trained = [c for c in out.plan.cells if cache.path(c).exists()]
    assert len(trained) == 6  # the COCO cells; their VOC twins are scored from them
    for cell in trained[1:]:
        cache.path(cell).unlink()
    seen = {}

    def seconds_left(pending, timed, jobs):
        seen.update(pending=list(pending))
        return 60.0

    monkeypatch.setattr(tables.generate, "seconds_left", seconds_left)
    session = _Session(out.plan, cache, FakeDetector(), tmp_path / "work", None, None, {}, shared)
    assert session.time_left({}) == ", about 01:00 left"
    # 10 cells not yet known, 5 trainings: each COCO cell's VOC twin costs nothing more
    assert len(seen["pending"]) == 5


@pytest.mark.parametrize(
    ("model", "profile", "dataset", "twins"),
    [
        ("faster_rcnn_r50_fpn", "embedded", "coco", ("voc",)),
        ("retinanet_r50_fpn", "smoke", "voc", ("coco",)),
        ("faster_rcnn_r50_fpn", "paper", "coco", ()),  # COCO and VOC are two datasets there
    ],
)
def test_twins_only_where_one_config_serves_both_datasets(model, profile, dataset, twins):
    assert D.training_twins(model, profile, dataset) == twins


def test_rescored_takes_the_other_datasets_metric():
    coco = dict(paper_dataset="coco", diverged=False, map_50=70.0, map_5095=40.0, shared_run=None)
    coco.update(map=40.0, metric=D.METRIC_NAMES["coco"])
    voc = D.rescored(coco, "voc")
    assert (voc["map"], voc["metric"], voc["paper_dataset"]) == (70.0, D.METRIC_NAMES["voc"], "voc")
    assert "coco" in voc["shared_run"] and coco["map"] == 40.0  # the twin's own result untouched
    diverged = D.rescored({**coco, "diverged": True}, "voc")
    assert diverged["map"] is None
