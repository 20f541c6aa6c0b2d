"""Every figure target (and UI8 Table 1) at the smoke profile: `repro figure all` trains the recorded runs
once and writes each PNG, the CSV of its plotted data and its metadata (device, data, commit); the Makefile
names every figure; a second call draws from the cached runs without training; bad names are usage
errors."""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from pathlib import Path

import pytest
from scipy.stats import t as stats_t

from repro import stats
from tables import provenance
from tables.command import main
from tables.figures import common
from tables.figures.registry import list_figures
from tables.figures.runs import ensure

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def drawn(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("REPRO_DATA_CACHE", str(tmp_path_factory.getbasetemp() / "repro-data-cache"))
    results = tmp_path_factory.mktemp("figures")
    try:
        rc = main(["figure", "all", "--profile", "smoke", "--results-dir", str(results), "--no-progress"])
    finally:
        mp.undo()
    return rc, results


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", list_figures())
def test_every_figure_writes_its_png_and_csv(drawn, name):
    rc, results = drawn
    assert rc == 0
    png, table = results / "figures" / f"{name}.png", results / "figures" / f"{name}.csv"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert len(_rows(table)) > 0


@pytest.mark.parametrize("name", list_figures())
def test_every_figure_says_what_made_it(drawn, name):
    _, results = drawn
    meta = json.loads((results / "figures" / f"{name}.meta.json").read_text())
    assert meta["figure"] == name and meta["profile"] == "smoke" and f"{name}.png" in meta["files"]
    assert meta["commit"] == provenance.commit() and meta["environment_lock"] == provenance.lock_hash()
    assert meta["data"] and meta["devices"] and meta["runs"]
    for run in meta["runs"].values():
        assert run["trained_at"]["commit"] == provenance.commit() and run["elapsed_s"] > 0


def test_the_title_and_table1_name_the_commit(drawn):
    _, results = drawn
    runs = ensure(["resnet18-fp32"], "smoke", results, progress=False)
    plt = common.pyplot()
    fig = plt.figure()
    common.title(fig, "A figure", list(runs.values()))
    text = fig._suptitle.get_text().replace("\n", " ")
    plt.close(fig)
    assert f"drawn at commit {provenance.commit()}" in text
    assert f"runs trained at commit {provenance.commit()}" in text
    md = (results / "figures" / "ui8-table1.md").read_text()
    assert f"commit {provenance.commit()}" in md.splitlines()[-1]


def test_ui8_table1_has_ks_statistics_and_the_papers_numbers(drawn):
    _, results = drawn
    rows = _rows(results / "figures" / "ui8-table1.csv")
    assert [(r["layer"], r["data"]) for r in rows] == [
        ("layer0 conv3", "g"),
        ("layer0 conv3", "w"),
        ("layer8 conv3", "g"),
        ("layer8 conv3", "w"),
    ]
    for r in rows:
        # the median over iterations of each sample's critical value; the samples' sizes differ a little
        assert float(r["critical"]) == pytest.approx(stats.ks_critical(int(r["n"])), rel=0.02)
        assert int(r["n"]) <= int(r["of"]) and 0 < float(r["student"]) < 1
    assert rows[2]["paper_gaussian"] == "0.2061"
    md = (results / "figures" / "ui8-table1.md").read_text()
    assert "Profile: smoke" in md and "not the paper's scale" in md


def test_curves_come_from_the_runs_logs(drawn):
    """UI8 Figure 2's loss points are the training iterations of its runs, one per iteration."""
    _, results = drawn
    rows = [r for r in _rows(results / "figures" / "ui8-figure2.csv") if r["loss"]]
    for run in ("FP32", "INT8 gradients, no clipping"):
        its = [int(r["iteration"]) for r in rows if r["run"] == run]
        assert its == list(range(len(its))) and len(its) > 1


def test_ui8_figure4_compares_the_rates_over_three_seeds(drawn):
    """Figure 4b's settings also train at seeds 1 and 2: each seed's final top-1, and eta1 minus each
    fixed rate paired seed by seed, with the interval the claims report reads."""
    _, results = drawn
    rows = _rows(results / "figures" / "ui8-figure4.csv")
    finals = [r for r in rows if r["panel"] == "b-final"]
    assert sorted((r["run"][:4], r["seed"]) for r in finals) == [
        (eta, seed) for eta in ("eta1", "eta2", "eta3", "eta4") for seed in ("0", "1", "2")
    ]
    paired = {r["run"][:4]: r for r in rows if r["panel"] == "b-paired"}
    assert set(paired) == {"eta2", "eta3", "eta4"}
    top = {(r["run"][:4], r["seed"]): float(r["val_top1"]) for r in finals}
    for eta, r in paired.items():
        diffs = [top["eta1", s] - top[eta, s] for s in ("0", "1", "2")]
        assert r["seeds"] == "3" and float(r["delta"]) == pytest.approx(sum(diffs) / 3)
        # the seeds' share (Student's t on the per-seed differences) is a floor the test set's error adds to
        floor = stats_t.ppf(0.975, 2) * statistics.stdev(diffs) / math.sqrt(3)
        assert float(r["half_width"]) >= floor - 1e-9 and float(r["test_se"]) >= 0


def test_a_second_call_draws_from_the_cached_runs(drawn, capsys):
    _, results = drawn
    runs = results / "figures" / "runs"
    before = {p: p.stat().st_mtime_ns for p in runs.glob("*/result.json")}
    assert main(["figure", "wageubn-figure10", "--profile", "smoke", "--results-dir", str(results)]) == 0
    assert {p: p.stat().st_mtime_ns for p in runs.glob("*/result.json")} == before
    assert "figure runs" not in capsys.readouterr().err  # no training, no progress bar


def test_the_makefile_has_a_target_per_figure():
    text = (ROOT / "Makefile").read_text()
    block = re.search(r"^FIGURES := ((?:.*\\\n)*.*)$", text, re.M).group(1)
    assert block.replace("\\", " ").split() == list_figures()


def test_unknown_names_are_usage_errors(capsys):
    assert main(["figure", "ui8-figure5", "--profile", "smoke"]) == 2
    assert "unknown figure 'ui8-figure5'" in capsys.readouterr().err
    assert main(["figure", "ui8-figure2", "--profile", "tiny"]) == 2
