"""The table renderer (tables/render.py) on a hand-made plan and outcomes, no training: the means, spreads,
deltas, intervals and statuses of each row, the Markdown line by line, the sidecar and the files. Fast on
purpose (tests/test_tables.py drives it end to end, at about a minute a table)."""

from __future__ import annotations

import json
import math
import re
import statistics

import pandas as pd
import pytest

from tables import render
from tables.delta_interval import binomial_se, delta_interval
from tables.generate import Outcome, make_plan
from tables.spec import Reported, Row, Source, Spec
from tasks.top1 import pack_flags


def _source(label):
    return Source("DAIQ", "Table 4", label)


ROWS = (
    Row("resnet18", "daiq", _source("DAIQ"), paper_fp32=70.0, paper_int8=69.5, paper_delta=-0.5),
    Row(
        "resnet18",
        "gq",
        _source("GQ"),
        paper_fp32=70.0,
        paper_int8=69.0,
        paper_delta=-2.0,
        notes=("a reading | with a pipe",),
        also_reported=(Reported(Source("UI8", "Table 6", "GQ"), fp32=70.1, int8=68.9, note="rounded"),),
    ),
    Row("resnet18", "ui8", _source("UI8"), paper_fp32=70.0, paper_int8=68.25),
    Row(
        "vgg16",
        "ui8",
        _source("VGG UI8"),
        paper_fp32=71.0,
        paper_diverged=True,
        bits="8/8/8",
        options={"period": 10},
    ),
    Row("vgg16", "daiq", _source("VGG DAIQ"), not_implemented="needs a 3-D kernel"),
)
SPEC = Spec("t-test", "DAIQ", "Table 4", "A test table", ROWS, notes=("The spec's own note.",))


def _flags(n_right, n=10):
    return pack_flags([1] * n_right + [0] * (n - n_right))


def _result(top1, ms, epochs=2, **extra):
    right = round(top1 / 10) if math.isfinite(top1) else 0
    return {"top1": top1, "ms_per_iter": ms, "epochs": epochs, "iters": 40 * epochs,
            "dataset": "fashion-mnist", "val_correct": _flags(right), **extra}  # fmt: skip


@pytest.fixture
def made():
    plan = make_plan(SPEC, "embedded", [0, 1], None, "2", model_versions={"vgg16": "5"})
    by_row = {rp.row.source.row: rp for rp in plan.rows}
    out = {}

    def put(row, seed, which, outcome):
        seed_cells = next(c for c in by_row[row].cells if c[0] == seed)
        out[seed_cells[1 if which == "fp32" else 2].key] = outcome

    put("DAIQ", 0, "fp32", Outcome(_result(80.0, 40.0), cached=True, elapsed_s=100.0))
    put("DAIQ", 1, "fp32", Outcome(_result(82.0, 50.0), elapsed_s=120.0))
    put("DAIQ", 0, "int8", Outcome(_result(81.0, 80.0), elapsed_s=200.0))
    put("DAIQ", 1, "int8", Outcome(_result(84.0, 100.0), elapsed_s=220.0))
    put("GQ", 0, "int8", Outcome(_result(70.0, 90.0, diverged=True)))
    put("GQ", 1, "int8", Outcome(error="boom: out of memory"))
    put("UI8", 0, "int8", Outcome(_result(float("nan"), 95.0, simulated=True)))  # seed 1 pending
    put("VGG UI8", 0, "fp32", Outcome(_result(60.0, 300.0, epochs=3, diverged=True)))
    put("VGG UI8", 1, "fp32", Outcome(_result(62.0, 310.0, epochs=3)))
    put("VGG UI8", 0, "int8", Outcome(_result(61.0, 600.0, epochs=3)))
    put("VGG UI8", 1, "int8", Outcome(_result(65.0, 620.0, epochs=3)))
    frame, meta = render.summarize(plan, out)
    meta.update(command="make t-test", wall_seconds=90.0)
    return plan, out, frame, meta


def _row(frame, label):
    return frame[frame["label"] == label].iloc[0].to_dict()


def test_a_finished_row_has_means_spreads_delta_and_its_interval(made):
    _, _, frame, _ = made
    r = _row(frame, "DAIQ")
    assert list(frame.columns) == render.CSV_COLUMNS
    assert (r["fp32"], r["int8"], r["delta"]) == (81.0, 82.5, 1.5)
    assert r["fp32_std"] == pytest.approx(math.sqrt(2)) and r["int8_std"] == pytest.approx(
        statistics.stdev([81, 84])
    )
    assert r["delta_std"] == pytest.approx(statistics.stdev([1.0, 2.0]))
    flags = [render.unpack_flags(_flags(n)) for n in (8, 8, 8, 8)]
    want = delta_interval([1.0, 2.0], [(flags[0], flags[1]), (flags[2], flags[3])])
    assert r["delta_ci95"] == pytest.approx(want.half_width) and r["delta_test_se"] == want.test_se
    assert r["int8_test_se"] == pytest.approx(binomial_se(82.5, 10))
    assert (r["fp32_ms_per_iter"], r["int8_ms_per_iter"]) == (45.0, 90.0)
    assert (r["n_fp32"], r["n_int8"], r["status"], r["simulated"]) == (2, 2, "ok", False)
    assert (r["dataset"], r["epochs"], r["profile"], r["seeds"]) == ("fashion-mnist", "2", "embedded", 2)
    assert (r["paper_delta"], r["paper_delta_source"], r["notes"]) == (-0.5, "printed", "")


def test_statuses_name_errors_divergence_pending_and_simulation(made):
    _, _, frame, _ = made
    gq, ui8, vgg, blocked = (_row(frame, label) for label in ("GQ", "UI8", "VGG UI8", "VGG DAIQ"))
    assert gq["status"] == "error: boom: out of memory; diverged (1 of 2 seeds)"
    assert gq["n_int8"] == 0 and math.isnan(gq["int8"]) and math.isnan(gq["delta"])
    assert ui8["status"] == "pending (simulated)" and ui8["simulated"] and ui8["n_int8"] == 0
    assert vgg["status"] == "FP32 baseline diverged (1 of 2 seeds)"
    assert (vgg["fp32"], vgg["int8"], vgg["n_fp32"]) == (62.0, 63.0, 1)
    assert math.isnan(vgg["delta_ci95"]) and math.isnan(vgg["delta_std"])  # one seed pairs up: no interval
    assert blocked["status"] == "not implemented: needs a 3-D kernel" and blocked["n_fp32"] == 0
    assert (ui8["paper_delta"], ui8["paper_delta_source"]) == (-1.75, "computed")


def test_footnotes_number_each_text_once_and_name_a_wrong_printed_delta(made):
    _, _, frame, meta = made
    gq = _row(frame, "GQ")
    reported = "DAIQ Table 4, row 'GQ' prints FP32 70.00/INT8 69.00; also printed as: UI8 Table 6, row 'GQ': "
    reported += "FP32 70.10/INT8 68.90 (rounded)."
    wrong = (
        "DAIQ Table 4, row 'GQ' prints Δ -2.00, but INT8 − FP32 of its numbers is -1.00 (kept as printed)."
    )
    assert meta["footnotes"] == ["a reading | with a pipe", reported, wrong]
    assert gq["notes"] == f"[1] a reading | with a pipe [2] {reported} [3] {wrong}"
    assert meta["row_marks"] == [[], [1, 2, 3], [], [], []]


def test_meta_counts_cells_and_training_time_and_names_the_recipe_and_data(made):
    plan, _, _, meta = made
    assert meta["cells"] == {"total": len(plan.cells), "cached": 1, "ran": 10, "errors": 1}
    assert meta["training_seconds"] == 640.0
    assert meta["model_recipe_versions"] == {"vgg16": "5"}
    assert (
        meta["epochs"] == "2-3 (per model: see the CSV)"
        and meta["iterations"] == "80-120 (per model: see the CSV)"
    )
    assert meta["dataset_used"] == "fashion-mnist (embedded stand-in for ImageNet (ILSVRC2012))"
    assert meta["not_a_reproduction"] and meta["disclaimer"].startswith(
        "Numbers measured at the embedded profile"
    )
    assert meta["notes"][0] == "The spec's own note." and any(
        n.startswith("Paper Δ marked †") for n in meta["notes"]
    )
    assert meta["header"][2] == (
        "Profile: embedded. Data used: fashion-mnist (embedded stand-in for ImageNet (ILSVRC2012)); the "
        "paper used ImageNet (ILSVRC2012). Epochs: 2-3 (per model: see the CSV) (iterations: 80-120 (per "
        "model: see the CSV)). Seeds: 2 (0, 1)."
    )


def test_the_paper_profile_a_compiled_run_and_no_computed_delta_change_the_header_and_notes():
    spec = Spec("t-one", "DAIQ", "Table 4", "One row", (ROWS[0],))
    plan = make_plan(spec, "paper", [0], "/data/imagenet", "2", numerics="2+compiled:abc")
    _, meta = render.summarize(plan, {})
    assert not meta["not_a_reproduction"]
    assert meta["disclaimer"] == (
        "Measured at the paper profile (the paper's protocol on data from /data/imagenet); the 'Paper' "
        "columns are the paper's numbers."
    )
    assert (
        meta["header"][-1].startswith("Every cell trained under torch.compile")
        and "2+compiled:abc" in meta["header"][-1]
    )
    assert not any(n.startswith("Paper Δ marked †") for n in meta["notes"])
    assert meta["dataset_used"] == "none (no cell has run)" and meta["epochs"] == "-"
    assert (
        meta["cells"] == {"total": 2, "cached": 0, "ran": 0, "errors": 0} and meta["training_seconds"] == 0.0
    )


def test_markdown_lines(made):
    _, _, frame, meta = made
    md = render.markdown(frame, meta).splitlines()
    assert md[0] == "# DAIQ Table 4: A test table, regenerated" and md[1] == ""
    assert md[2] == meta["header"][1] + "  "
    assert md[5] == f"**{meta['header'][-1]}**"
    head = (
        "| Model | Method | Options | Bits | Paper FP32 | Paper INT8 | Paper Δ | FP32 | INT8 | Δ | Δ 95% CI "
    )
    head += "| FP32 ms/iter | INT8 ms/iter | Status |"
    assert md[7] == head and md[8] == "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    daiq = _row(frame, "DAIQ")
    lo, hi = 1.5 - daiq["delta_ci95"], 1.5 + daiq["delta_ci95"]
    assert md[9] == (
        f"| resnet18 | DAIQ |  |  | 70.00 | 69.50 | -0.50 | 81.00 ± 1.41 | 82.50 ± 2.12 | +1.50 ± 0.71 | "
        f"[{lo:+.2f}, {hi:+.2f}] | 45.0 | 90.0 | ok |"
    )
    assert md[10] == (
        "| resnet18 | GQ [1] [2] [3] |  |  | 70.00 | 69.00 | -2.00 | 81.00 ± 1.41 |  |  |  | 45.0 | 90.0 | "
        "error: boom: out of memory; diverged (1 of 2 seeds) |"
    )
    assert md[11].startswith("| resnet18 | UI8 |  |  | 70.00 | 68.25 | -1.75 † |")
    assert md[12] == (
        "| vgg16 | VGG UI8 | period=10 | 8/8/8 | 71.00 | NaN (crashed) |  | 62.00 | 63.00 ± 2.83 | +1.00 "
        "|  | 305.0 | 610.0 | FP32 baseline diverged (1 of 2 seeds) |"
    )
    assert md[13].endswith("| not implemented: needs a 3-D kernel |")
    (failed,) = meta["failed_cells"]  # every failed cell, and why
    assert failed["cell"].startswith("resnet18/") and failed["error"] == "boom: out of memory"
    assert md[14:18] == [
        "",
        "Failed cells (not in the numbers above; run the command again to retry them):",
        "",
        f"- {failed['cell']}: boom: out of memory",
    ]
    notes = meta["footnotes"]
    assert md[18:25] == [
        "",
        "Footnotes:",
        "",
        f"[1] {notes[0]}  ",
        f"[2] {notes[1]}  ",
        f"[3] {notes[2]}  ",
        "",
    ]
    assert md[25:27] == ["Notes:", ""] and md[27:-2] == [f"- {n}" for n in meta["notes"]]
    assert (
        md[-1].startswith("Generated ")
        and "by `make t-test`: 12 cells, 1 from the cache, 10 run now, 1 failed." in md[-1]
    )
    assert md[-1].endswith(
        "Its cells trained for 10.7 min in all (each where it ran); this run took 1.5 min."
    )


@pytest.mark.parametrize(
    "seconds, text",
    [(None, "-"), (90, "1.5 min"), (3569, "59.5 min"), (3590, "1 h 00 min"), (7380, "2 h 03 min")],
)
def test_durations(seconds, text):
    assert render._duration(seconds) == text


def test_number_formats():
    assert render._num(None) == "" and render._num(float("nan"), 1.0) == ""
    assert render._num(1.005, 0.5, digits=1) == "1.0 ± 0.5" and render._num(2.0, float("nan")) == "2.00"
    assert (
        render._signed(0.0) == "+0.00"
        and render._signed(-1.234, 0.1) == "-1.23 ± 0.10"
        and render._signed(None) == ""
    )
    assert render._interval(1.0, 0.25) == "[+0.75, +1.25]" and render._interval(1.0, None) == ""
    assert render._interval(None, 1.0) == "" and render._interval(1.0, float("nan")) == ""
    assert render._cell("a|b\nc") == "a\\|b c"
    assert render._span({3}) == "3" and render._span(set()) == "-"


def test_dataset_descriptions():
    assert render.describe_dataset("ImageNet (ILSVRC2012)", "imagenet", "paper") == "ImageNet (ILSVRC2012)"
    assert render.describe_dataset("imagenet", "imagenet", "paper") == "imagenet"
    assert render.describe_dataset("digits", "imagenet", "smoke") == (
        "digits (scikit-learn's handwritten digits, smoke stand-in for ImageNet (ILSVRC2012))"
    )
    assert render.describe_dataset("mnist", "cifar10", "embedded") == "mnist (embedded stand-in for CIFAR-10)"


def test_write_puts_the_four_files_side_by_side(made, tmp_path):
    _, _, frame, meta = made
    md = render.markdown(frame, meta)
    paths = render.write(tmp_path / "out", "t-test", frame, md, meta)
    assert {k: p.name for k, p in paths.items()} == {
        "md": "t-test.md",
        "csv": "t-test.csv",
        "meta": "t-test.meta.json",
        "runs": "t-test.runs.csv.gz",
    }
    assert paths["md"].read_text() == md
    csv = pd.read_csv(paths["csv"])
    assert list(csv.columns) == render.CSV_COLUMNS and len(csv) == len(ROWS)
    sidecar = json.loads(paths["meta"].read_text())
    assert "row_marks" not in sidecar and sidecar["csv_columns"] == render.CSV_COLUMNS
    assert sidecar["cells"] == meta["cells"] and sidecar["name"] == "t-test" and "row_runs" not in sidecar
    first = paths["runs"].read_bytes()
    render.write(tmp_path / "out", "t-test", frame, md, meta)
    assert paths["runs"].read_bytes() == first  # no timestamp in the gzip header: same runs, same bytes


def test_the_runs_file_keeps_each_finished_run_with_its_row_seed_and_flags(made, tmp_path):
    _, _, frame, meta = made
    paths = render.write(tmp_path, "t-test", frame, render.markdown(frame, meta), meta)
    runs = pd.read_csv(paths["runs"], dtype={"flags": str})
    assert list(runs.columns) == render.RUNS_COLUMNS
    daiq = runs[runs["row"] == 0]
    assert list(zip(daiq["seed"], daiq["precision"], daiq["value"], strict=True)) == [
        (0, "fp32", 80.0), (0, "int8", 81.0), (1, "fp32", 82.0), (1, "int8", 84.0),
    ]  # fmt: skip
    assert list(daiq["flags"]) == [_flags(8)] * 4 and set(daiq["label"]) == {"DAIQ"}
    assert list(daiq["elapsed_s"]) == [100.0, 200.0, 120.0, 220.0]
    assert list(daiq["ms_per_iter"]) == [40, 80, 50, 100]
    gq = runs[runs["row"] == 1]  # seed 0: its FP32 run (the DAIQ row's) and a diverged INT8; seed 1 failed
    assert list(zip(gq["seed"], gq["precision"], gq["diverged"], strict=True)) == [
        (0, "fp32", False), (0, "int8", True), (1, "fp32", False),
    ]  # fmt: skip
    assert math.isnan(gq["value"].iloc[1])
    assert set(runs["row"]) == {0, 1, 2, 3}  # the pending UI8 seed and the blocked row add no line
    nothing_ran = dict(meta, row_runs=runs.iloc[:0])
    assert "runs" not in render.write(tmp_path, "t-test", frame, "md\n", nothing_ran)
    assert not paths["runs"].exists()  # not left to be read as this table's


def test_a_baselines_error_extra_paper_numbers_and_two_datasets_show_in_the_row():
    row = Row(
        "resnet18", "gq", _source("GQ extra"), paper_fp32=70.0, paper_int8=69.0, paper_extra={"top5": 89.5}
    )
    spec = Spec("t-extra", "DAIQ", "Table 4", "Extra", (row, ROWS[-1]))
    plan = make_plan(spec, "embedded", [0, 1], None, "2")
    (_, fp32_0, int8_0), (_, fp32_1, int8_1) = plan.rows[0].cells
    outcomes = {
        fp32_0.key: Outcome(error="disk full"),
        int8_0.key: Outcome(_result(70.0, 10.0)),
        fp32_1.key: Outcome({**_result(71.0, 10.0), "dataset": "mnist"}),
        int8_1.key: Outcome(_result(72.0, 10.0)),
    }
    frame, _ = render.summarize(plan, outcomes)
    r, blocked = frame.iloc[0].to_dict(), frame.iloc[1].to_dict()
    assert r["status"] == "error: FP32 baseline: disk full"
    assert r["paper_extra"] == '{"top5": 89.5}' and blocked["paper_extra"] == ""
    assert r["dataset"] == "fashion-mnist; mnist" and (r["n_fp32"], r["n_int8"]) == (1, 2)
    assert (blocked["dataset"], blocked["epochs"], blocked["simulated"], blocked["n_int8"]) == (
        "",
        "",
        False,
        0,
    )


META_KEYS = {
    "name", "paper", "citation", "table", "title", "task", "metric", "profile", "paper_datasets",
    "dataset_used", "epochs", "iterations", "seeds", "seed_list", "data_root", "recipe_version",
    "model_recipe_versions", "numerics", "not_a_reproduction", "disclaimer", "header", "footnotes", "notes",
    "cells", "training_seconds", "cpu_seconds", "cpu_cells", "generated_at", "device", "commit",
    "environment_lock", "failed_cells",
}  # fmt: skip


def test_the_sidecar_names_what_made_the_table(made, tmp_path):
    plan, _, frame, meta = made
    assert set(meta) - {"row_marks", "row_runs", "command", "wall_seconds"} == META_KEYS
    assert (meta["name"], meta["paper"], meta["table"], meta["title"]) == (
        "t-test",
        "DAIQ",
        "Table 4",
        "A test table",
    )
    assert (meta["task"], meta["metric"], meta["profile"]) == ("classification", "top1", "embedded")
    assert meta["citation"] == SPEC.citation and meta["paper_datasets"] == ["imagenet"]
    assert (meta["seeds"], meta["seed_list"], meta["data_root"], meta["recipe_version"]) == (
        2,
        [0, 1],
        None,
        "2",
    )
    assert meta["numerics"] is None
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \S+", meta["generated_at"])
    paths = render.write(tmp_path / "a" / "b", "t-test", frame, render.markdown(frame, meta), meta)
    assert paths["meta"].read_text().startswith('{\n "name": "t-test",\n "paper": "DAIQ",')
    assert paths["csv"].read_text().splitlines()[0] == ",".join(render.CSV_COLUMNS)
    render.write(tmp_path / "a" / "b", "t-test", frame, "again\n", meta)  # an existing folder is fine
    assert paths["md"].read_text() == "again\n"


def test_smoke_profile_two_paper_datasets_and_no_options_or_bits_columns():
    rows = (ROWS[0], Row("resnet18", "gq", _source("GQ c10"), paper_fp32=90.0, paper_dataset="cifar10"))
    plan = make_plan(Spec("t-two", "DAIQ", "Table 4", "Two", rows), "smoke", [0], None, "2")
    ((_, fp32, int8),) = plan.rows[0].cells
    out = {
        fp32.key: Outcome(_result(80.0, 40.0), elapsed_s=10.04, cpu_s=7.5),
        int8.key: Outcome(_result(81.0, 80.0)),
    }
    frame, meta = render.summarize(plan, out)
    assert (meta["cpu_seconds"], meta["cpu_cells"]) == (7.5, 1)
    assert "of CPU time (1 of the 4 cells recorded it);" in render.markdown(frame, meta).splitlines()[-1]
    assert meta["not_a_reproduction"] and meta["disclaimer"].startswith(
        "Numbers measured at the smoke profile"
    )
    assert "the paper used CIFAR-10 and ImageNet (ILSVRC2012)" in meta["header"][2]
    assert meta["training_seconds"] == 10.0
    md = render.markdown(frame, {**meta, "command": "make t-two"}).splitlines()
    assert md[4:7] == ["", f"**{meta['header'][-1]}**", ""]
    assert md[7].startswith("| Model | Method | Paper FP32 |") and md[9].startswith(
        "| resnet18 | DAIQ | 70.00 |"
    )
    assert "by `make t-two`:" in md[-1]
    assert "by ``:" in render.markdown(frame, meta).splitlines()[-1]  # no command given


def test_rows_without_paper_numbers_pending_baselines_and_mixed_schedules():
    bare = Row(
        "resnet18",
        "gq",
        _source("GQ bare"),
        also_reported=(Reported(Source("UI8", "Table 6", "GQ"), int8=68.9),),
    )
    spec = Spec("t-bare", "DAIQ", "Table 4", "Bare", (bare,))
    plan = make_plan(spec, "paper", [0, 1], None, "2")
    (_, fp32_0, int8_0), (_, fp32_1, int8_1) = plan.rows[0].cells
    outcomes = {  # seed 0's baseline not run yet; seed 1 on another schedule and data
        int8_0.key: Outcome(_result(70.0, 10.0), elapsed_s=10.26),
        fp32_1.key: Outcome({**_result(71.0, 10.0, epochs=3), "dataset": "mnist"}),
        int8_1.key: Outcome(_result(72.0, 10.0, epochs=3)),
    }
    frame, meta = render.summarize(plan, outcomes)
    r = frame.iloc[0].to_dict()
    assert r["status"] == "pending" and (r["n_fp32"], r["n_int8"], r["int8"]) == (1, 2, 71.0)
    assert (r["paper_delta_source"], r["epochs"], r["source"]) == ("", "2, 3", "DAIQ Table 4, row 'GQ bare'")
    assert r["notes"] == (
        "[1] DAIQ Table 4, row 'GQ bare' prints no number; also printed as: UI8 Table 6, row 'GQ': "
        "INT8 68.90."
    )
    stand_in = "(paper stand-in for ImageNet (ILSVRC2012))"
    assert meta["dataset_used"] == f"fashion-mnist {stand_in}; mnist {stand_in}"
    assert meta["training_seconds"] == 10.3
    assert "on data from the default data root)" in meta["disclaimer"]


def test_rows_after_a_blocked_row_are_measured_and_every_rows_data_is_named():
    twice = (
        Reported(Source("UI8", "Table 6", "GQ"), int8=68.9),
        Reported(Source("UI8", "Table 7", "GQ"), int8=69.1),
    )
    rows = (
        ROWS[-1],  # blocked, first
        Row("resnet18", "gq", _source("GQ twice"), paper_int8=69.0, also_reported=twice),
        Row("resnet18", "daiq", _source("DAIQ mnist"), paper_int8=69.5),
    )
    plan = make_plan(Spec("t-order", "DAIQ", "Table 4", "Order", rows), "embedded", [0], None, "2")
    outcomes = {}
    for rp, dataset in zip(plan.rows[1:], ("fashion-mnist", "mnist"), strict=True):
        ((_, fp32, int8),) = rp.cells
        outcomes[fp32.key] = Outcome({**_result(70.0, 10.0), "dataset": dataset})
        outcomes[int8.key] = Outcome({**_result(71.0, 10.0), "dataset": dataset})
    frame, meta = render.summarize(plan, outcomes)
    assert frame["status"].tolist() == ["not implemented: needs a 3-D kernel", "ok", "ok"]
    assert "fashion-mnist" in meta["dataset_used"] and "mnist (" in meta["dataset_used"]
    assert meta["footnotes"] == [
        "DAIQ Table 4, row 'GQ twice' prints INT8 69.00; also printed as: UI8 Table 6, row 'GQ': INT8 68.90; "
        "UI8 Table 7, row 'GQ': INT8 69.10."
    ]
    md = render.markdown(frame, {**meta, "command": "make t-order", "wall_seconds": 1.0}).splitlines()
    assert md[-2] == "" and md[-1].startswith("Generated ")
