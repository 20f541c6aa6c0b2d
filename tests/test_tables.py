"""Table specs (the paper's numbers and their sources) and the generator (cells, cache, resume, output)."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import math
import os
import random
import time
import warnings

import pandas as pd
import pytest

from repro.methods import build_method, list_methods
from repro.quant import NonFiniteError
from tables.cells import Cache, Cell, normalize_options, row_blocker
from tables.command import main as repro_main
from tables.delta_interval import binomial_se, delta_interval
from tables.generate import generate
from tables.render import CSV_COLUMNS, markdown
from tables.spec import Row, Source
from tables.specs import SPECS
from tasks.top1 import pack_flags, unpack_flags

# Methods later issues add; until then their rows are `not implemented` (none left today).
FUTURE_METHODS: set[str] = set()

EXPECTED_TABLES = {
    "table1": ("DAIQ", "Table 1", 6),
    "table2": ("DAIQ", "Table 2", 4),
    "table3": ("DAIQ", "Table 3", 6),
    "table4": ("DAIQ", "Table 4", 24),
    "table5": ("DAIQ", "Table 5", 8),
    "table6": ("DAIQ", "Table 6", 4),
    "ui8-table3": ("UI8", "Table 3", 2),
    "ui8-table4": ("UI8", "Table 4", 4),
    "ui8-table5": ("UI8", "Table 5", 4),
    "ui8-table6": ("UI8", "Table 6", 4),
    "ui8-table7": ("UI8", "Table 7", 13),
    "ui8-table8": ("UI8", "Table 8", 2),
    "ui8-table9": ("UI8", "Table 9", 2),
    "wageubn-table1": ("WAGEUBN", "Table I", 6),
    "wageubn-table2": ("WAGEUBN", "Table II", 6),
}


def find(name: str, source_row: str) -> Row:
    rows = [r for r in SPECS[name].rows if r.source.row == source_row]
    assert len(rows) == 1, f"{name}: {len(rows)} rows labelled {source_row!r}"
    return rows[0]


# ---------------------------------------------------------------------------------------------------
# Specs


def test_one_spec_per_paper_table_with_every_row():
    assert {n: (s.paper, s.table, len(s.rows)) for n, s in SPECS.items()} == EXPECTED_TABLES
    for spec in SPECS.values():
        assert spec.doc and spec.table in spec.doc and "embedded" in spec.doc, spec.name
        labels = [r.source.row for r in spec.rows]
        assert len(labels) == len(set(labels)), f"{spec.name}: duplicate row labels"
        for row in spec.rows:
            assert (row.source.paper, row.source.table) == (spec.paper, spec.table)
            printed_none = any(
                "prints '-'" in note for note in row.notes
            )  # and says so (DAIQ T5 VOC RetinaNet UI8)
            assert row.paper_int8 is not None or row.paper_diverged or printed_none, f"{row.source}: no INT8"


@pytest.mark.parametrize(
    "name,label,fp32,int8,delta",
    [
        ("table1", "k=1.0, A=0.5", None, 69.94, None),
        ("table1", "k=1.0, A=0.8", None, 70.01, None),
        ("table1", "k=1.5, A=0.8", None, 69.91, None),
        ("table2", "GQ", None, 69.68, None),
        ("table2", "OursMCS", None, 70.01, None),
        ("table2", "Ours", None, 70.21, None),
        ("table3", "ResNet-20 UI8", 92.32, 91.95, -0.37),
        ("table3", "MobileNetV2 Ours", 94.73, 94.37, -0.36),
        ("table3", "InceptionV3 Ours", 95.00, 95.21, 0.21),
        ("table4", "ResNet-50 Ours", 76.50, 76.59, 0.09),
        ("table4", "ResNet-50 WAGEUBN", 74.66, 69.07, -5.59),
        ("table4", "Alexnet DoReFa-Net", 55.90, 53.00, -2.90),
        ("table4", "InceptionV3 UI8", 72.39, 71.20, -1.19),
        ("table4", "MobileNetV2 Ours", 72.44, 71.92, -0.52),
        ("table4", "VGG-16 AFP", 71.00, 70.60, -0.40),
        ("ui8-table3", "Direction Sensitive Gradient Clipping", None, 93.02, None),
        ("ui8-table4", "alpha=10, beta=0.2", None, 93.28, None),
        ("ui8-table5", "Period 1", None, 93.66, None),
        ("ui8-table5", "Period 1000", None, 92.75, None),
        ("ui8-table6", "ResNet-20 FP8 training [53] 8/8/8", None, 92.21, None),
        ("ui8-table6", "InceptionV3 FP 32/32/32 + Ours 8/8/8", 94.89, 95.00, None),
        ("ui8-table7", "InceptionV3 FP 32/32/32 + Ours 8/8/8", 77.28, 76.59, None),
        ("ui8-table7", "ResNet-18 WAGEUBN [60] 8/8/8", None, 66.92, None),
        ("ui8-table7", "AlexNet WAGE [56] 2/8/8", None, 48.40, None),
        ("ui8-table7", "AlexNet FP 32/32/32 + Ours 2/8/8", 59.84, 51.28, None),
        ("wageubn-table1", "ResNet18 32/32/32/32 + 8/8/16/24", 68.70, 67.40, None),
        ("wageubn-table1", "ResNet50 32/32/32/32 + 8/8/8/24", 74.66, 67.95, None),
        ("wageubn-table2", "kE2 = 8", None, 67.08, None),
        ("wageubn-table2", "kW = 8", None, 67.98, None),
    ],
)
def test_spot_checked_numbers(name, label, fp32, int8, delta):
    row = find(name, label)
    assert (row.paper_fp32, row.paper_int8, row.paper_delta) == (fp32, int8, delta)


def test_spot_checked_methods_options_and_flags():
    assert find("table1", "k=1.2, A=0.5").options == {"k": 1.2, "A": 0.5}
    assert [r.method for r in SPECS["table2"].rows] == ["gq", "daiq-gvq", "daiq-mcs", "daiq"]
    no_clip = find("ui8-table3", "No clipping")
    assert no_clip.paper_diverged and no_clip.paper_int8 is None and no_clip.options["clip"] is False
    assert find("ui8-table4", "alpha=20, beta=0.2").options["beta"] == 0.2
    assert find("ui8-table5", "Period 10").options == {"period": 10}
    assert {r.paper_dataset for r in SPECS["table3"].rows} == {"cifar10"}
    assert {r.paper_dataset for r in SPECS["table4"].rows} == {"imagenet"}
    assert find("table4", "ResNet-18 WAGEUBN").method == "wageubn-e2-16"
    assert find("wageubn-table1", "ResNet34 32/32/32/32 + 8/8/8/24").method == "wageubn"
    assert find("wageubn-table1", "ResNet34 32/32/32/32 + 8/8/8/24").paper_extra["int8_top5"] == 87.70
    two_bit = find("ui8-table7", "AlexNet FP 32/32/32 + Ours 2/8/8")
    assert two_bit.bits == "2/8/8" and two_bit.options == {"bits_w": 2} and row_blocker(two_bit) is None


# Rows whose printed delta is not int8 - fp32 (none found; a new one must be added here on purpose).
EXPECTED_DELTA_MISMATCHES: set[tuple[str, str]] = set()


def test_printed_deltas_equal_int8_minus_fp32_or_are_flagged():
    checked = 0
    for name, spec in SPECS.items():
        for row in spec.rows:
            if row.paper_delta is None or row.paper_delta_computed is None:
                continue
            checked += 1
            flagged = (name, row.source.row) in EXPECTED_DELTA_MISMATCHES
            assert row.printed_delta_disagrees == flagged, row.source
    assert checked >= 22  # DAIQ Tables 3 and 4 print every delta
    bad = Row("resnet18", "daiq", Source("DAIQ", "Table 4", "x"), 70.0, 70.5, 0.3)
    assert bad.printed_delta_disagrees and bad.paper_delta_computed == 0.5


def test_methods_are_registry_names_or_not_implemented():
    runnable = {}
    for name, spec in SPECS.items():
        for row in spec.rows:
            blocker = row_blocker(row)
            if blocker is None:
                assert row.method in list_methods(), row.source
                build_method(row.method, **row.options)  # the option values are valid too
            else:
                assert row.method in list_methods() or row.method in FUTURE_METHODS, row.source
                assert row.method in FUTURE_METHODS or row.not_implemented, row.source
        runnable[name] = sum(row_blocker(r) is None for r in spec.rows)
    assert runnable == {
        "table1": 6,
        "table2": 4,
        "table3": 6,
        "table4": 24,
        "table5": 8,
        "table6": 4,
        "ui8-table3": 2,
        "ui8-table4": 4,
        "ui8-table5": 4,
        "ui8-table6": 4,
        "ui8-table7": 13,
        "ui8-table8": 2,
        "ui8-table9": 2,
        "wageubn-table1": 6,
        "wageubn-table2": 6,
    }


def _result_key(row: Row) -> tuple:
    return (
        row.model,
        row.paper_dataset,
        row.method,
        json.dumps(normalize_options(row.method, row.options), sort_keys=True),
        row.variant,
    )


def test_every_cross_paper_disagreement_is_recorded_both_ways():
    """The same result (model, dataset, method, options) printed with different numbers in two tables
    must name the other table's number in `also_reported`, in both rows."""
    rows = [(name, row) for name, spec in SPECS.items() for row in spec.rows]
    disagreements = 0
    for i, (name_a, a) in enumerate(rows):
        for name_b, b in rows[i + 1 :]:
            if name_a == name_b or _result_key(a) != _result_key(b):
                continue
            for q in ("fp32", "int8"):
                va, vb = getattr(a, f"paper_{q}"), getattr(b, f"paper_{q}")
                if va is None or vb is None or abs(va - vb) < 0.005:
                    continue
                disagreements += 1
                for this, other in ((a, b), (b, a)):
                    assert any(
                        (r.source.paper, r.source.table) == (other.source.paper, other.source.table)
                        and getattr(r, q) == getattr(other, f"paper_{q}")
                        for r in this.also_reported
                    ), f"{this.source} does not record {other.source}'s {q} {getattr(other, f'paper_{q}')}"
    # DAIQ T4 vs UI8 T7 InceptionV3 (fp32, int8); WAGEUBN ResNet-18 (UI8 T7 vs DAIQ T4, vs WAGEUBN T1);
    # DAIQ T1 k=1, A=0.8 vs T2 Ours and T4 ResNet-18 Ours; DAIQ T5 vs UI8 T9 COCO UI8 rows (fp32, int8
    # of both detectors: DAIQ swapped the models).
    assert disagreements == 10


def test_the_known_disagreements_carry_both_numbers():
    inception = find("table4", "InceptionV3 UI8")
    assert {(r.source.paper, r.fp32, r.int8) for r in inception.also_reported} >= {("UI8", 77.28, 76.59)}
    ui8_inception = find("ui8-table7", "InceptionV3 FP 32/32/32 + Ours 8/8/8")
    assert ("DAIQ", 72.39, 71.20) in {(r.source.paper, r.fp32, r.int8) for r in ui8_inception.also_reported}
    wageubn = find("table4", "ResNet-18 WAGEUBN")
    assert 66.92 in {r.int8 for r in wageubn.also_reported}
    ui8_wageubn = find("ui8-table7", "ResNet-18 WAGEUBN [60] 8/8/8")
    assert {("WAGEUBN", 67.40), ("DAIQ", 67.40)} <= {
        (r.source.paper, r.int8) for r in ui8_wageubn.also_reported
    }
    # DAIQ's UI8 rows agree with UI8's own tables everywhere else (CIFAR-10 and ImageNet).
    for daiq_label, ui8_table, ui8_label in [
        ("ResNet-20 UI8", "ui8-table6", "ResNet-20 FP 32/32/32 + Ours 8/8/8"),
        ("MobileNetV2 UI8", "ui8-table6", "MobileNetV2 FP 32/32/32 + Ours 8/8/8"),
        ("InceptionV3 UI8", "ui8-table6", "InceptionV3 FP 32/32/32 + Ours 8/8/8"),
    ]:
        d, u = find("table3", daiq_label), find(ui8_table, ui8_label)
        assert (d.paper_fp32, d.paper_int8) == (u.paper_fp32, u.paper_int8)


# ---------------------------------------------------------------------------------------------------
# Generator, with a fake runner


class FakeRunner:
    """Deterministic stand-in for tasks.classification.run; counts calls, can fail or be interrupted."""

    def __init__(self, interrupt_at=None, fail=None, diverge=None):
        self.calls = []
        self.interrupt_at = interrupt_at  # raise KeyboardInterrupt on this call (1-based)
        self.fail = fail or (lambda kw: False)
        self.diverge = diverge or (lambda kw: False)

    def __call__(self, **kw):
        self.calls.append(kw)
        if self.interrupt_at is not None and len(self.calls) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fail(kw):
            raise RuntimeError("boom: fake failure\nsecond line")
        seed_text = f"{kw['model']}|{kw['method']}|{sorted(kw['method_options'].items())}|{kw['seed']}"
        h = int(hashlib.sha256(seed_text.encode()).hexdigest()[:8], 16)
        diverged = self.diverge(kw)
        return {
            "task": "classification",
            "model": kw["model"],
            "method": kw["method"],
            "top1": None if diverged else 40.0 + (h % 5000) / 100,
            "final_loss": float("nan") if diverged else 0.5,
            "diverged": diverged,
            "dataset": "fake digits (stand-in)",
            "epochs": 2,
            "iters": 16,
            "ms_per_iter": 1.0 + (h % 7),
            "simulated": False,
            "seed": kw["seed"],
        }


def run_table(name, tmp_path, runner, seeds=1, **kw):
    return generate(
        name, profile="smoke", seeds=seeds, results_dir=tmp_path, runner=runner, progress=False, **kw
    )


def keys_of(runner):
    return [
        (c["model"], c["method"], json.dumps(c["method_options"], sort_keys=True), c["seed"])
        for c in runner.calls
    ]


def test_compiled_table_runs_its_own_cells_under_compile(tmp_path):
    eager = FakeRunner()
    run_table("ui8-table5", tmp_path, eager)
    compiled = FakeRunner()
    out = run_table("ui8-table5", tmp_path, compiled, compiled=True)
    assert len(compiled.calls) == len(eager.calls) == out.ran  # none shared with the eager cells
    assert all(c["cfg_options"] == {"compile": True} for c in compiled.calls)
    assert all("cfg_options" not in c for c in eager.calls)
    assert (
        "trained under torch.compile" in out.markdown and "--compile" not in out.markdown.split("| Model")[0]
    )
    assert all(
        "+compiled:" in cell.numerics for rp in out.plan.rows for _, *cells in rp.cells for cell in cells
    )


def test_second_run_runs_zero_cells_and_fp32_is_shared(tmp_path):
    first = FakeRunner()
    out = run_table("table4", tmp_path, first, seeds=2)
    # 7 models with runnable rows: one FP32 per model and seed; 24 runnable INT8 rows.
    assert len(first.calls) == 2 * (7 + 24) == out.ran
    assert sum(c["method"] == "fp32" for c in first.calls) == 14
    assert len(set(keys_of(first))) == len(first.calls)
    second = FakeRunner()
    again = run_table("table4", tmp_path, second, seeds=2)
    assert second.calls == [] and again.ran == 0 and again.cached == 62
    pd.testing.assert_frame_equal(out.frame, again.frame)
    # A table sharing cells with table4 (DAIQ Table 2's "Ours" is ResNet-18 daiq at the defaults).
    third = FakeRunner()
    run_table("table2", tmp_path, third, seeds=2)
    assert {c["method"] for c in third.calls} == {"gq", "daiq-gvq", "daiq-mcs"}


def test_killed_run_resumes_with_only_the_remaining_cells(tmp_path):
    k = 7
    killer = FakeRunner(interrupt_at=k)
    with pytest.raises(KeyboardInterrupt):
        run_table("table4", tmp_path, killer, seeds=1)
    finished = keys_of(killer)[: k - 1]
    assert len(list((tmp_path / "cache").glob("*.json"))) == k - 1
    assert not list((tmp_path / "cache").glob("*.tmp")) and not (tmp_path / "table4.md").exists()
    resume = FakeRunner()
    out = run_table("table4", tmp_path, resume, seeds=1)
    assert len(resume.calls) == 31 - (k - 1)
    assert not set(keys_of(resume)) & set(finished)
    assert out.cached == k - 1 and set(out.frame["status"]) == {"ok"} | {
        s for s in out.frame["status"] if s.startswith("not implemented")
    }


def test_cache_files_are_complete_json_written_atomically(tmp_path, monkeypatch):
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((str(src), str(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    runner = FakeRunner(diverge=lambda kw: kw["method"] == "ui8" and kw["seed"] == 0)
    run_table("table3", tmp_path, runner, seeds=2)
    files = sorted((tmp_path / "cache").glob("*.json"))
    assert len(files) == len(runner.calls) == 2 * (3 + 6)
    for path in files:
        entry = json.loads(path.read_text(), parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
        assert path.stem == entry["key"] and set(entry) >= {"cell", "result", "elapsed_s", "finished_at"}
        assert set(entry["cell"]) >= {"task", "model", "method", "method_options", "seed", "profile"}
        assert {"paper_dataset", "data_root", "recipe_version"} <= set(entry["cell"])
    assert {dst for _, dst in replaced} >= {str(p) for p in files}
    cache_dir = str(tmp_path / "cache")
    assert all(
        os.path.dirname(src) == cache_dir for src, dst in replaced if os.path.dirname(dst) == cache_dir
    )

    # A write that dies before the rename leaves neither a partial cell nor a temporary file.
    def broken(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken)
    cell = Cell.make(
        task="classification",
        model="resnet20",
        method="daiq",
        options={},
        seed=9,
        profile="smoke",
        paper_dataset="cifar10",
        data_root=None,
        recipe_version=None,
    )
    with pytest.raises(OSError):
        Cache(tmp_path / "cache").store(cell, {"top1": 1.0}, 0.1)
    assert not Cache(tmp_path / "cache").path(cell).exists()
    assert not list((tmp_path / "cache").glob("*.tmp"))


def test_cell_key_covers_the_full_configuration(tmp_path):
    base = dict(
        task="classification",
        model="resnet18",
        method="daiq",
        options={"k": 1, "A": 0.8},
        seed=0,
        profile="smoke",
        paper_dataset="imagenet",
        data_root=None,
        recipe_version="r1",
    )
    key = Cell.make(**base).key
    assert Cell.make(**{**base, "options": {}}).key == key  # defaults are defaults; k=1 is k=1.0
    for change in [
        {"model": "resnet34"},
        {"method": "daiq-mcs"},
        {"options": {"k": 1.2}},
        {"seed": 1},
        {"profile": "embedded"},
        {"paper_dataset": "cifar10"},
        {"data_root": str(tmp_path)},
        {"recipe_version": "r2"},
        {"task": "detection"},
    ]:
        assert Cell.make(**{**base, **change}).key != key, change
    # A changed recipe version reruns the cells instead of reusing stale ones.
    old, new = FakeRunner(), FakeRunner()
    run_table("table2", tmp_path, old, recipe_version="r1")
    run_table("table2", tmp_path, new, recipe_version="r2")
    assert len(new.calls) == len(old.calls) == 5


def test_csv_columns_and_not_implemented_rows(tmp_path, monkeypatch):
    import tables.cells

    for name in ("afp", "dorefa", "fp8", "wageubn-e2-16"):  # as if these were not implemented yet
        monkeypatch.delitem(tables.cells.METHODS, name)
    out = run_table("table4", tmp_path, FakeRunner(), seeds=2)
    frame = pd.read_csv(tmp_path / "table4.csv")
    required = [
        "model",
        "method",
        "paper_fp32",
        "paper_int8",
        "paper_delta",
        "fp32",
        "int8",
        "delta",
        "fp32_ms_per_iter",
        "int8_ms_per_iter",
        "status",
        "profile",
        "dataset",
        "seeds",
    ]
    assert set(required) <= set(frame.columns) and list(frame.columns) == CSV_COLUMNS
    assert len(frame) == 24 and set(frame["profile"]) == {"smoke"} and set(frame["seeds"]) == {2}
    blocked = frame[frame["status"].str.startswith("not implemented")]
    assert len(blocked) == 11 and set(blocked["method"]) == {"afp", "dorefa", "fp8", "wageubn-e2-16"}
    assert blocked["paper_int8"].notna().all() and blocked["paper_fp32"].notna().all()
    measured = ["fp32", "int8", "delta", "fp32_ms_per_iter", "int8_ms_per_iter"]
    assert blocked[measured].isna().all().all()
    ok = frame[frame["status"] == "ok"]
    assert len(ok) == 13 and ok[measured].notna().all().all()
    assert (ok["delta"] - (ok["int8"] - ok["fp32"])).abs().max() < 1e-9
    assert set(ok["dataset"]) == {"fake digits (stand-in)"}
    r50 = frame[(frame["model"] == "resnet50") & (frame["method"] == "daiq")].iloc[0]
    assert (r50["paper_fp32"], r50["paper_int8"], r50["paper_delta"]) == (76.50, 76.59, 0.09)
    # The mean is over seeds.
    fp32_r50 = [
        json.loads(p.read_text())["result"]["top1"]
        for p in (tmp_path / "cache").glob("*.json")
        if json.loads(p.read_text())["cell"]["model"] == "resnet50"
        and json.loads(p.read_text())["cell"]["method"] == "fp32"
    ]
    assert len(fp32_r50) == 2 and math.isclose(r50["fp32"], sum(fp32_r50) / 2)
    assert out.paths["csv"] == tmp_path / "table4.csv"


def test_markdown_header_names_profile_dataset_seeds_and_footnotes(tmp_path):
    out = run_table("table4", tmp_path, FakeRunner(), seeds=2)
    md = (tmp_path / "table4.md").read_text()
    assert md == out.markdown
    head = md.split("| Model")[0]
    assert "DAIQ Table 4" in head and "Zhao et al." in head
    assert "Profile: smoke" in head and "fake digits (stand-in)" in head and "ImageNet" in head
    assert "Seeds: 2 (0, 1)" in head and "Epochs: 2" in head
    assert "NOT reproductions" in head
    assert "77.28" in md and "66.92" in md  # the UI8 InceptionV3 and WAGEUBN ResNet-18 footnotes
    assert " ± " in md
    meta = json.loads((tmp_path / "table4.meta.json").read_text())
    assert meta["profile"] == "smoke" and meta["seeds"] == 2 and meta["not_a_reproduction"]
    assert meta["dataset_used"] == "fake digits (stand-in) (smoke stand-in for ImageNet (ILSVRC2012))"
    assert meta["header"][0].startswith("# DAIQ Table 4") and meta["dataset_used"] in head


def test_errors_are_reported_not_cached_and_the_table_goes_on(tmp_path):
    failing = FakeRunner(fail=lambda kw: kw["model"] == "mobilenet_v2" and kw["method"] == "daiq")
    out = run_table("table3", tmp_path, failing, seeds=1)
    status = dict(zip(out.frame["label"] + "@" + out.frame["model"], out.frame["status"], strict=True))
    assert status["Ours@mobilenet_v2"] == "error: RuntimeError: boom: fake failure"
    assert sum(s == "ok" for s in status.values()) == 5 and out.errors == 1
    assert len(list((tmp_path / "cache").glob("*.json"))) == len(failing.calls) - 1
    retry = FakeRunner()
    run_table("table3", tmp_path, retry, seeds=1)
    assert [(c["model"], c["method"]) for c in retry.calls] == [("mobilenet_v2", "daiq")]


def test_divergence_is_a_result_with_a_status(tmp_path):
    runner = FakeRunner(diverge=lambda kw: kw["method"] == "ui8" and kw["seed"] == 1)
    out = run_table("ui8-table3", tmp_path, runner, seeds=2)
    assert list(out.frame["status"]) == ["diverged (1 of 2 seeds)"] * 2
    assert out.frame["n_int8"].tolist() == [1, 1] and out.frame["int8"].notna().all()
    md = out.markdown
    assert "NaN (crashed)" in md  # the paper's own "No clipping" result
    again = FakeRunner()
    run_table("ui8-table3", tmp_path, again, seeds=2)
    assert again.calls == []  # diverged runs are cached results

    def escaping(**kw):  # a quantizer's NonFiniteError that the task did not catch is a divergence too
        raise NonFiniteError("gradient is NaN")

    out = run_table("ui8-table5", tmp_path / "other", escaping)
    assert set(out.frame["status"]) == {"diverged (1 of 1 seeds); FP32 baseline diverged (1 of 1 seeds)"}
    assert len(list((tmp_path / "other" / "cache").glob("*.json"))) == 5


def test_tables_without_runnable_rows_render_without_a_task(tmp_path):
    spec = SPECS["wageubn-table2"]
    unregistered = tuple(dataclasses.replace(r, method="not-registered") for r in spec.rows)
    spec = dataclasses.replace(spec, rows=unregistered)
    out = generate(spec, profile="embedded", results_dir=tmp_path, progress=False)
    assert out.ran == 0 and out.frame["status"].str.startswith("not implemented").all()
    assert out.frame["paper_int8"].notna().all() and out.frame["int8"].isna().all()


def test_cli_rejects_unknown_table_and_profile(capsys):
    assert repro_main(["table", "table9"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "table9" in err and "table4" in err and "wageubn-table2" in err
    assert repro_main(["table", "table4", "--profile", "huge"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "smoke, embedded, paper" in err


def test_cli_writes_the_table_and_sends_training_logs_to_files(tmp_path, monkeypatch, capsys):
    import tables.generate

    class ChattyRunner(FakeRunner):
        def __call__(self, **kw):
            print("epoch 1 of a very chatty training log")
            warnings.warn("a library's deprecation notice", UserWarning, stacklevel=1)
            return super().__call__(**kw)

    monkeypatch.setattr(tables.generate, "load_task_runner", lambda task: (ChattyRunner(), "fake"))
    args = ["table", "table2", "--profile", "smoke", "--results-dir", str(tmp_path), "--no-progress"]
    assert repro_main(args) == 0
    out, err = capsys.readouterr()
    assert out.startswith("# DAIQ Table 2") and "chatty" not in out and "deprecation notice" not in err
    logs = list((tmp_path / "logs").glob("*.log"))
    assert len(logs) == 5 and all("chatty" in p.read_text() for p in logs)
    assert all("UserWarning: a library's deprecation notice" in p.read_text() for p in logs)
    verbose = ["table", "table2", "--profile", "smoke", "--results-dir", str(tmp_path / "v"), "--verbose"]
    assert repro_main([*verbose, "--no-progress"]) == 0
    assert "chatty" in capsys.readouterr().out and not (tmp_path / "v" / "logs").exists()
    assert (tmp_path / "table2.csv").exists() and (tmp_path / "table2.md").exists()


def test_progress_bar_shows_cells_and_the_current_one(tmp_path, capsys):
    generate("table2", profile="smoke", seeds=1, results_dir=tmp_path, runner=FakeRunner(), progress=True)
    err = capsys.readouterr().err
    assert "table2" in err and "5/5" in err and "resnet18/daiq-mcs seed 0" in err
    # from the second cell on, the time left from the cells timed so far (tables.time_left)
    assert "left" not in err.split("seed 0")[0] and "left]" in err


def test_cli_ctrl_c_keeps_the_cache_and_says_how_to_resume(tmp_path, monkeypatch, capsys):
    import tables.generate

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tables.generate, "generate", interrupted)
    assert repro_main(["table", "table4", "--results-dir", str(tmp_path)]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "repro table table4 --profile embedded" in err


# ---------------------------------------------------------------------------------------------------
# End to end with the real classification task (what CI runs)


def _classification_or_skip():
    try:
        return importlib.import_module("tasks.classification")
    except ImportError as err:
        pytest.skip(f"tasks.classification cannot be imported yet ({err}); the task issue adds it")


@pytest.mark.slow
def test_table4_end_to_end_at_smoke_profile(tmp_path):
    task = _classification_or_skip()
    start = time.perf_counter()
    out = generate("table4", profile="smoke", results_dir=tmp_path, progress=False)
    elapsed = time.perf_counter() - start
    frame = pd.read_csv(tmp_path / "table4.csv")
    assert len(frame) == 24 and set(frame["profile"]) == {"smoke"} and set(frame["seeds"]) == {1}
    runnable = frame[~frame["status"].str.startswith("not implemented")]
    assert len(runnable) == 24
    simulated = frame[frame["method"].isin(["afp", "dorefa", "fp8", "wageubn-e2-16"])]
    assert simulated["status"].str.endswith("(simulated)").all() and len(simulated) == 11
    assert runnable["status"].str.match(r"^(ok|diverged)").all(), runnable["status"].tolist()
    assert runnable["fp32"].notna().all() and runnable["fp32_ms_per_iter"].notna().all()
    assert out.meta["recipe_version"] == getattr(task, "RECIPE_VERSION", None)
    head = out.markdown.split("| Model")[0]
    assert "Profile: smoke" in head and "NOT reproductions" in head and out.meta["dataset_used"] in head
    again = generate("table4", profile="smoke", results_dir=tmp_path, progress=False)
    assert again.ran == 0
    # The 3-minute smoke budget is a measurement to report, not a timed assertion (shared, noisy machines).
    print(f"\ntable4 at smoke: {elapsed:.0f} s for {out.ran} cells")


def test_cli_a_row_option_of_the_wrong_type_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import tables.specs

    spec = SPECS["table4"]
    row = next(r for r in spec.rows if r.method == "daiq")
    bad = dataclasses.replace(spec, rows=[dataclasses.replace(row, options={"k": "abc"})])
    monkeypatch.setitem(tables.specs.SPECS, "table4", bad)
    assert repro_main(["table", "table4", "--profile", "smoke", "--results-dir", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == "error: option k of method daiq takes a number, got 'abc'"
    assert not (tmp_path / "cache").exists()  # refused before any cell ran


def test_cells_of_another_numerics_version_are_other_cells():
    """A new stochastic-rounding stream (kernels.NUMERICS) makes new cells: old results are not mixed in."""
    import kernels
    from tables.generate import make_plan

    common = dict(task="classification", model="resnet18", method="daiq", options={}, seed=0,
                  profile="smoke", paper_dataset="imagenet", data_root=None, recipe_version="1")  # fmt: skip
    old, new = Cell.make(**common), Cell.make(**common, numerics=kernels.NUMERICS)
    assert (
        old.key != new.key and "numerics" not in old.config() and new.config()["numerics"] == kernels.NUMERICS
    )
    spec = SPECS["table4"]
    plan = make_plan(spec, "smoke", [0], None, "1", kernels.NUMERICS)
    assert {c.numerics for c in plan.cells} == {kernels.NUMERICS}


def test_missing_data_stops_the_table_before_writing_anything(tmp_path):
    """A data root that is not there fails every cell alike: the first cell's error stops the table, with
    no table, no error rows, no lock and no work dir left (it wrote 31 error rows and 31 locks)."""
    from tasks.datasets import DatasetNotFoundError

    calls = []

    def runner(**cell):
        calls.append(cell)
        raise DatasetNotFoundError(f"ImageNet not found under {cell['data_root']}")

    with pytest.raises(DatasetNotFoundError, match="not found under /nonexistent"):
        generate("table4", profile="paper", data_root="/nonexistent", results_dir=tmp_path, runner=runner,
                 progress=False)  # fmt: skip
    assert len(calls) == 1
    assert not list(tmp_path.glob("table4.*"))
    assert not list((tmp_path / "work").rglob("*")), "a lock or work dir was left behind"
    assert not list((tmp_path / "cache").rglob("*.json"))


def test_rows_carry_the_interval_from_the_seeds_and_the_paired_test_flags(tmp_path):
    def runner(**kw):  # 200 validation images; which are right depends on method and seed
        rng = random.Random(f"{kw['model']}{kw['method']}{kw['seed']}")
        flags = [int(rng.random() < 0.8) for _ in range(200)]
        return dict(FakeRunner()(**kw), top1=100 * sum(flags) / 200, val_correct=pack_flags(flags))

    frame = run_table("table2", tmp_path, runner, seeds=3).frame
    r = frame[frame["method"] == "daiq"].iloc[0]
    fp32 = [runner(model="resnet18", method="fp32", method_options={}, seed=s) for s in range(3)]
    daiq = [runner(model="resnet18", method="daiq", method_options={}, seed=s) for s in range(3)]
    diffs = [d["top1"] - f["top1"] for d, f in zip(daiq, fp32, strict=True)]
    pairs = [
        (unpack_flags(d["val_correct"]), unpack_flags(f["val_correct"]))
        for d, f in zip(daiq, fp32, strict=True)
    ]
    want = delta_interval(diffs, pairs)
    assert r["delta_ci95"] == pytest.approx(want.half_width) and r["delta_test_se"] == pytest.approx(
        want.test_se
    )
    assert r["int8_test_se"] == pytest.approx(binomial_se(r["int8"], 200))
    again = run_table("table2", tmp_path, runner, seeds=3)  # every cell from the cache now
    assert "Δ 95% CI" in markdown(frame, again.meta) and "Its cells trained for" in again.markdown
    first_time = sum(json.loads(p.read_text())["elapsed_s"] for p in (tmp_path / "cache").glob("*.json"))
    assert (
        again.meta["training_seconds"] == pytest.approx(first_time, abs=0.1)
        and again.meta["wall_seconds"] >= 0
    )
    entries = [json.loads(p.read_text()) for p in (tmp_path / "cache").glob("*.json")]
    assert all(e["cpu_s"] >= 0 for e in entries) and again.meta["cpu_cells"] == len(entries)
    assert again.meta["cpu_seconds"] == pytest.approx(sum(e["cpu_s"] for e in entries), abs=0.1)
    assert "of CPU time;" in again.markdown.splitlines()[-1]


def test_cached_only_writes_what_the_cache_holds_and_trains_nothing(tmp_path):
    run_table("table2", tmp_path, FakeRunner(), seeds=1)
    idle = FakeRunner()
    out = run_table("table2", tmp_path, idle, seeds=2, cached_only=True)
    assert idle.calls == [] and out.ran == 0 and out.cached == 5  # 4 INT8 rows and one FP32, seed 0
    assert all("pending" in s for s in out.frame["status"]) and (tmp_path / "table2.md").exists()
    assert out.frame["n_int8"].tolist() == [1, 1, 1, 1]
    assert repro_main(["table", "table7", "--cached-only"]) == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: text[: len(text) // 2],
        lambda text: "[]",
        lambda text: text.replace('"schema": 1', '"schema": 0'),
    ],
    ids=["truncated", "not-an-entry", "old-schema"],
)
def test_a_bad_cache_entry_is_named_moved_aside_and_its_cell_trained_again(tmp_path, capsys, damage):
    """Issue 61: a truncated file under results/cache was retrained (or shown pending) without a word."""
    run_table("table2", tmp_path, FakeRunner(), seeds=1)
    bad = sorted((tmp_path / "cache").glob("*.json"))[0]
    text = bad.read_text()
    bad.write_text(damage(text))
    capsys.readouterr()
    idle = FakeRunner()
    out = run_table("table2", tmp_path, idle, seeds=1, cached_only=True)
    warned = [line for line in capsys.readouterr().err.splitlines() if str(bad) in line]
    assert len(warned) == 1 and warned[0].startswith("warning: cache entry") and out.cached == 4
    aside = [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(bad.name + ".bad-")]
    assert len(aside) == 1 and aside[0].read_text() == damage(text)  # kept for a person, not deleted
    assert not bad.exists() and idle.calls == []
    again = FakeRunner()
    out = run_table("table2", tmp_path, again, seeds=1)
    assert len(again.calls) == 1 and out.ran == 1 and json.loads(bad.read_text())["key"] == bad.stem


def test_keep_copies_a_figure_with_its_data_and_metadata(tmp_path):
    from tables import keep

    figures = tmp_path / "run" / "figures"
    figures.mkdir(parents=True)
    for ext in (".png", ".csv", ".meta.json"):
        (figures / f"ui8-figure3{ext}").write_text(ext)
    (figures / "runs").mkdir()  # the recorded runs stay behind
    assert keep.copy_made(tmp_path / "run", tmp_path / "kept") == ["figures/ui8-figure3"]
    kept = sorted(p.name for p in (tmp_path / "kept" / "figures").iterdir())
    assert kept == ["ui8-figure3.csv", "ui8-figure3.meta.json", "ui8-figure3.png"]


def test_keep_copies_only_finished_tables_rendered_from_the_cache(tmp_path, monkeypatch, capsys):
    from tables import keep

    fake = FakeRunner()
    monkeypatch.setattr("tables.generate.load_task_runner", lambda task: (fake, "v"))
    src, dest = tmp_path / "run", tmp_path / "kept"
    table1 = generate("table1", profile="smoke", results_dir=src, progress=False)
    table2 = generate("table2", profile="smoke", results_dir=src, progress=False)
    own = next(c for c in table1.plan.cells if c not in set(table2.plan.cells))
    (src / "cache" / f"{own.key}.json").unlink()  # table1 is not finished now
    calls = len(fake.calls)
    assert keep.main(["--from", str(src), "--to", str(dest), "--profile", "smoke"]) == 0
    assert len(fake.calls) == calls  # nothing trained
    assert (dest / "table2.md").exists() and (dest / "table2.meta.json").exists()
    assert (dest / "table2.runs.csv.gz").exists()  # the runs behind the rows go with them
    assert not (dest / "table1.md").exists() and "table1 (" in capsys.readouterr().out
    assert "pending" not in (dest / "table2.md").read_text()
    assert keep.main(["--from", str(tmp_path / "nowhere")]) == 2


def test_keep_leaves_a_table_kept_with_more_seeds_at_that_many_while_its_cells_are_cached(
    tmp_path, monkeypatch
):
    import json

    from tables import keep
    from tables.generate import resolve_seeds

    monkeypatch.setattr("tables.generate.load_task_runner", lambda task: (FakeRunner(), "v"))
    src, dest = tmp_path / "run", tmp_path / "kept"
    default = len(resolve_seeds("smoke", None))
    more = generate("table2", profile="smoke", seeds=default + 1, results_dir=src, progress=False)

    def seeds_kept():
        return json.loads((dest / "table2.meta.json").read_text())["seeds"]

    assert (
        keep.main(["--from", str(src), "--to", str(dest), "--profile", "smoke", "--seeds", str(default + 1)])
        == 0
    )
    assert seeds_kept() == default + 1
    assert keep.main(["--from", str(src), "--to", str(dest), "--profile", "smoke"]) == 0
    assert seeds_kept() == default + 1  # not replaced by the default's fewer seeds
    last_seed = next(c for c in more.plan.cells if c.seed == default)
    (src / "cache" / f"{last_seed.key}.json").unlink()
    assert keep.main(["--from", str(src), "--to", str(dest), "--profile", "smoke"]) == 0
    assert seeds_kept() == default  # the cache no longer holds the extra seed: the default's, as asked


def test_a_table_takes_its_own_seed_count_where_its_spec_sets_one_and_seeds_overrides_it(tmp_path):
    import dataclasses

    from tables.generate import DEFAULT_SEEDS, resolve_seeds

    # the kept embedded set's counts, so that `make tables` regenerates it as kept
    assert len(resolve_seeds("embedded", None, SPECS["ui8-table5"])) == 12
    assert len(resolve_seeds("embedded", None, SPECS["table5"])) == 1
    assert len(resolve_seeds("embedded", None, SPECS["table4"])) == DEFAULT_SEEDS["embedded"]
    assert len(resolve_seeds("embedded", 2, SPECS["ui8-table5"])) == 2
    assert len(resolve_seeds("smoke", None, SPECS["ui8-table5"])) == DEFAULT_SEEDS["smoke"]
    spec = dataclasses.replace(SPECS["table2"], seeds={"smoke": 2})
    runner = FakeRunner()
    out = generate(spec, profile="smoke", results_dir=tmp_path, runner=runner, progress=False)
    assert out.plan.seeds == [0, 1] and {c["seed"] for c in runner.calls} == {0, 1}
    assert "--seeds 2" in out.meta["command"]


def test_a_cell_says_how_the_machine_was_shared_and_the_table_counts_them(tmp_path, monkeypatch):
    import torch

    from tasks.device_choice import trained_on

    fake = FakeRunner()
    monkeypatch.setattr("tables.generate.load_task_runner", lambda task: (fake, "v"))
    alone = generate("table2", profile="smoke", results_dir=tmp_path / "alone", progress=False)
    want = {"threads": torch.get_num_threads(), "jobs": 1, "device": trained_on()}
    assert all(o.ran_with == want for o in alone.outcomes.values())
    assert "at a time" not in (tmp_path / "alone" / "table2.md").read_text()
    monkeypatch.setenv("REPRO_TABLE_JOBS", "2")
    shared = generate("table2", profile="smoke", results_dir=tmp_path / "shared", progress=False)
    n = len(shared.outcomes)
    footer = (tmp_path / "shared" / "table2.md").read_text().splitlines()[-1]
    assert f"{n} of its cells ran 2 at a time, {torch.get_num_threads()} thread" in footer
    entry = json.loads(next((tmp_path / "shared" / "cache").glob("*.json")).read_text())
    assert entry["ran_with"]["jobs"] == 2
    monkeypatch.delenv("REPRO_TABLE_JOBS")  # read back from the cache by a process running alone
    again = generate("table2", profile="smoke", results_dir=tmp_path / "shared", progress=False)
    want = {"threads": torch.get_num_threads(), "jobs": 2, "device": trained_on()}
    assert all(o.cached and o.ran_with == want for o in again.outcomes.values())


def test_the_device_line_names_the_cells_threads_not_the_renderers(tmp_path, monkeypatch):
    # `make keep` renders cached cells in a process of its own: its thread count is not the cells'
    import torch

    fake = FakeRunner()
    monkeypatch.setattr("tables.generate.load_task_runner", lambda task: (fake, "v"))
    threads = torch.get_num_threads()
    other = threads + 2
    generate("table2", profile="smoke", results_dir=tmp_path, progress=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: other)
    again = generate("table2", profile="smoke", results_dir=tmp_path, progress=False)
    assert all(o.cached for o in again.outcomes.values())
    device = json.loads((tmp_path / "table2.meta.json").read_text())["device"]
    assert f", {threads} thread" in device and f"{other} thread" not in device
    entry = next((tmp_path / "cache").glob("*.json"))
    cell = json.loads(entry.read_text())
    cell["ran_with"]["threads"] = other  # cells of two thread counts: the range
    entry.write_text(json.dumps(cell))
    generate("table2", profile="smoke", results_dir=tmp_path, progress=False)
    device = json.loads((tmp_path / "table2.meta.json").read_text())["device"]
    assert f", {min(threads, other)}-{max(threads, other)} threads" in device


@pytest.mark.parametrize(
    "target, command",
    [("table4", "table table4"), ("figures", "figure ui8-table1 "), ("ui8-figure4", "figure ui8-figure4 ")],
)
def test_make_jobs_starts_that_many_table_processes_sharing_the_cores(tmp_path, target, command):
    """`make table4 JOBS=2` (and the figures): two processes, nproc/2 threads each, REPRO_TABLE_JOBS set,
    one progress bar."""
    import subprocess
    from pathlib import Path

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    log = tmp_path / "calls.txt"
    stub = bin_dir / "python"  # stands in for the project's python: records how it was started
    stub.write_text(f'#!/bin/sh\necho "$OMP_NUM_THREADS $REPRO_TABLE_JOBS $*" >> {log}\n')
    stub.chmod(0o755)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        ["make", "-s", target, "JOBS=2", f"VENV={tmp_path / 'venv'}", f"RESULTS={tmp_path}"],
        cwd=root, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    calls = sorted(log.read_text().splitlines())
    threads = max(1, len(os.sched_getaffinity(0)) // 2)  # what nproc says
    assert len(calls) == 2 and all(c.startswith(f"{threads} 2 -m tables.command {command}") for c in calls)
    assert sum("--no-progress" in c for c in calls) == 1


def test_ctrl_c_on_make_jobs_stops_every_table_process(tmp_path):
    """Background jobs of `sh -c` ignore SIGINT: the recipe's trap must stop them itself."""
    import signal
    import subprocess
    from pathlib import Path

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    pids = tmp_path / "pids.txt"
    stub = bin_dir / "python"  # a table process that would run for a minute
    stub.write_text(f"#!/bin/sh\necho $$ >> {pids}\nexec sleep 60\n")
    stub.chmod(0o755)
    root = Path(__file__).resolve().parents[1]
    # as from a terminal: SIGINT at its default even when pytest itself was started in the background with
    # `&`, which ignores it, and an ignored signal stays ignored (and untrappable) in every child
    make = subprocess.Popen(
        ["make", "-s", "table4", "JOBS=2", f"VENV={tmp_path / 'venv'}", f"RESULTS={tmp_path}"],
        cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(pids.read_text().split() if pids.exists() else []) < 2:
            time.sleep(0.1)
        started = [int(p) for p in pids.read_text().split()]
        assert len(started) == 2
        os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C on the terminal does
        assert make.wait(timeout=30) != 0
    finally:  # a failed run leaves no make or stub behind
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()

    def alive(pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(p) for p in started):
        time.sleep(0.1)
    assert not any(alive(p) for p in started)
