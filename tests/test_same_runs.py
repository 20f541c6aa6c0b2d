"""tables.same_runs: a regeneration's runs against the kept ones, cell by cell."""

import gzip
import json

import pandas as pd

from tables import same_runs
from tables.render import RUNS_COLUMNS
from tasks.top1 import pack_flags


def _run(row, method, seed, precision, value, flags, threads=1):
    packed = None if flags is None else pack_flags(flags)
    return dict(row=row, model="resnet18", method=method, label=method.upper(), options=None, seed=seed,
                precision=precision, value=value, diverged=value is None, ms_per_iter=1.0, elapsed_s=1.0,
                cpu_s=1.0, threads=threads, jobs=1, flags=packed)  # fmt: skip


def _write(folder, runs, name="table4"):
    folder.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(runs, columns=RUNS_COLUMNS)
    (folder / f"{name}.runs.csv.gz").write_bytes(gzip.compress(frame.to_csv(index=False).encode()))
    rows = sorted({r["row"] for r in runs})
    pd.DataFrame({"model": "resnet18", "dataset": "fashion-mnist"}, index=rows).to_csv(folder / f"{name}.csv")
    (folder / f"{name}.meta.json").write_text("{}")


def test_each_cell_is_compared_once_and_differences_are_named(tmp_path, capsys):
    # one FP32 cell serves two rows
    fp32 = [_run(r, m, 0, "fp32", 80.0, [1, 0, 1]) for r, m in ((0, "ui8"), (1, "daiq"))]
    kept = fp32 + [_run(0, "ui8", 0, "int8", 79.0, [1, 1, 0]), _run(1, "daiq", 0, "int8", 78.0, [0, 0, 1])]
    new = fp32 + [_run(0, "ui8", 0, "int8", 79.0, [1, 1, 0]), _run(1, "daiq", 0, "int8", 78.0, [1, 0, 0])]
    _write(tmp_path / "kept", kept)
    _write(tmp_path / "new", new)
    (o,) = [same_runs.compare_table(tmp_path / "new", tmp_path / "kept", "table4")]
    assert o.same == 2  # FP32 (served two rows: one cell) and UI8
    said = "resnet18 daiq (fashion-mnist) seed 0: the same top-1 78.00, flags differ at 2 images"
    assert o.differ == [said]
    assert same_runs.main(["--new", str(tmp_path / "new"), "--kept", str(tmp_path / "kept"), "table4"]) == 1
    assert "1 differ" in capsys.readouterr().out


def test_identical_folders_pass_and_diverged_runs_match(tmp_path):
    runs = [_run(0, "afp", s, p, None if p == "int8" else 80.0 + s, None if p == "int8" else [1, 0])
            for s in (0, 1) for p in ("fp32", "int8")]  # fmt: skip
    _write(tmp_path / "kept", runs)
    _write(tmp_path / "new", runs)
    o = same_runs.compare_table(tmp_path / "new", tmp_path / "kept", "table4")
    assert (o.same, o.differ, o.kept_only, o.new_only) == (4, [], 0, 0)


def test_another_top1_a_missing_cell_and_a_figure_run(tmp_path):
    _write(tmp_path / "kept", [_run(0, "ui8", s, "fp32", 80.0, [1]) for s in (0, 1)])
    _write(tmp_path / "new", [_run(0, "ui8", 0, "fp32", 80.5, [0], threads=2)])
    o = same_runs.compare_table(tmp_path / "new", tmp_path / "kept", "table4")
    assert o.kept_only == 1 and o.same == 0
    said = "resnet18 fp32 (fashion-mnist) seed 0: kept 80.00, new 80.50, flags differ at 1 images"
    assert o.differ == [said]
    assert o.threads == "threads kept [1], new [2]"
    for side, top1 in (("kept", 70.1), ("new", 70.2)):
        (tmp_path / side / "figures").mkdir()
        meta = {"runs": {"resnet18-fp32": {"top1": top1}, "resnet18-daiq": {"top1": 69.0}}}
        (tmp_path / side / "figures" / "daiq-figure3.meta.json").write_text(json.dumps(meta))
    f = same_runs.compare_figure(tmp_path / "new", tmp_path / "kept", "daiq-figure3")
    assert f.same == 1 and f.differ == ["resnet18-fp32: kept 70.1, new 70.2"]


def test_nothing_in_common_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "a").mkdir()
    assert same_runs.main(["--new", str(tmp_path / "a"), "--kept", str(tmp_path / "a")]) == 2
    assert same_runs.main(["--new", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "not a folder" in err[1]


def test_a_table_kept_without_runs_is_compared_by_its_rows_means(tmp_path):
    for side, fp32, device in (
        ("kept", 80.11, "AMD EPYC, 2 threads, torch"),
        ("new", 79.70, "AMD EPYC, 1 thread"),
    ):
        folder = tmp_path / side
        folder.mkdir()
        rows = pd.DataFrame(
            {"model": ["resnet20", "mobilenet_v2"], "method": "daiq", "label": "Ours", "options": None,
             "dataset": "fashion-mnist", "fp32": [81.0, fp32], "int8": [80.5, 79.0]}
        )  # fmt: skip
        rows.to_csv(folder / "table3.csv", index=False)
        (folder / "table3.meta.json").write_text(json.dumps({"device": device}))
    o = same_runs.compare_table(tmp_path / "new", tmp_path / "kept", "table3")
    assert o.same == 1 and o.threads == "threads kept [2], new [1]"
    assert o.differ == [
        "mobilenet_v2 Ours (fashion-mnist): fp32 kept 80.11, new 79.70, int8 kept 79.00, new 79.00"
    ]
