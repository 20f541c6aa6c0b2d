"""From cell outcomes to the table: per-row means over seeds, the Markdown, the CSV and its sidecar.

One output row per paper row. fp32 and int8 are means over the seeds that finished with a number;
delta is int8 - fp32 of those means, and its spread (Markdown only) is the standard deviation of the
per-seed differences. Beside them, <name>.runs.csv.gz keeps every run behind the rows (its row, seed,
number and per-image flags), so a comparison of two rows can pair them seed by seed and image by image
(tables.claims) after the cache that held them is gone. A row is `ok`, `diverged (k of n seeds)`,
`error: ...`, `pending` (cells not run yet) or `not implemented: <reason>`; not-implemented rows carry
the paper's numbers only.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pandas as pd

from atomic_files import write_file
from kernels.bench import devices
from tables import provenance
from tables.delta_interval import binomial_se, delta_interval
from tables.spec import PAPER_DATASETS, Row
from tasks.top1 import unpack_flags

CSV_COLUMNS = [
    "model",
    "method",
    "label",
    "options",
    "bits",
    "paper_dataset",
    "paper_fp32",
    "paper_int8",
    "paper_delta",
    "paper_delta_source",
    "paper_diverged",
    "paper_extra",
    "fp32",
    "fp32_std",
    "int8",
    "int8_std",
    "delta",
    "delta_std",
    "delta_ci95",
    "delta_test_se",
    "int8_test_se",
    "fp32_ms_per_iter",
    "int8_ms_per_iter",
    "status",
    "simulated",
    "n_fp32",
    "n_int8",
    "profile",
    "dataset",
    "epochs",
    "seeds",
    "source",
    "notes",
]

# <name>.runs.csv.gz: one line per row, seed and precision (the FP32 run repeats on every row it serves);
# elapsed_s is the cell's own time where it ran, threads and jobs how it shared the machine (ran_with)
RUNS_COLUMNS = [
    "row", "model", "method", "label", "options", "seed", "precision", "value", "diverged", "ms_per_iter",
    "elapsed_s", "cpu_s", "threads", "jobs", "flags",
]  # fmt: skip

GENERIC_NOTES = (
    "FP32 and INT8 are means over seeds (± standard deviation when more than one seed finished); "
    "Δ = INT8 − FP32 of the means, ± the spread of the per-seed differences.",
    "Δ 95% CI: the seeds' spread (Student's t) and the test set's paired error image by image, combined "
    "(tables/delta_interval.py); none with one seed. delta_test_se in the CSV is the test set's share.",
    "Paper Δ marked † is computed from the paper's FP32 and INT8; the paper prints no Δ there.",
    "One FP32 baseline run per model, dataset and seed serves every row of that model.",
)


# How the headers describe the classification task's embedded stand-ins (tasks/datasets.py).
STAND_INS = {
    "digits": "scikit-learn's handwritten digits",
    "shapes10": "generated 32x32 shapes in CIFAR-10's format",
}


def describe_dataset(dataset: str, paper_dataset: str, profile: str) -> str:
    """E.g. "digits (scikit-learn's handwritten digits, smoke stand-in for ImageNet (ILSVRC2012))"."""
    paper = PAPER_DATASETS.get(paper_dataset, paper_dataset)
    if dataset.lower() in (paper_dataset.lower(), paper.lower()):
        return dataset
    what = STAND_INS.get(dataset)
    return f"{dataset} ({what + ', ' if what else ''}{profile} stand-in for {paper})"


def _mean_std(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    mean = statistics.fmean(values)
    return mean, (statistics.stdev(values) if len(values) > 1 else None)


def _metric(result: dict[str, Any] | None, metric: str) -> float | None:
    if not result or result.get("diverged"):
        return None
    value = result.get(metric)
    if value is None or not math.isfinite(float(value)):
        return None
    return float(value)


def _reported_text(row: Row) -> str | None:
    if not row.also_reported:
        return None
    parts = []
    for rep in row.also_reported:
        text = f"{rep.source}: {rep.numbers()}"
        parts.append(text + (f" ({rep.note})" if rep.note else ""))
    mine = "/".join(
        f"{k} {v:.2f}" for k, v in (("FP32", row.paper_fp32), ("INT8", row.paper_int8)) if v is not None
    )
    return f"{row.source} prints {mine or 'no number'}; also printed as: " + "; ".join(parts) + "."


def row_footnotes(row: Row) -> list[str]:
    """The footnotes one row carries: its notes, where it is printed differently, a wrong printed Δ."""
    notes = list(row.notes)
    reported = _reported_text(row)
    if reported:
        notes.append(reported)
    if row.printed_delta_disagrees:
        notes.append(
            f"{row.source} prints Δ {row.paper_delta:+.2f}, but INT8 − FP32 of its numbers is "
            f"{row.paper_delta_computed:+.2f} (kept as printed)."
        )
    return notes


def summarize(plan, outcomes: dict) -> tuple[pd.DataFrame, dict[str, Any]]:
    spec = plan.spec
    metric = spec.metric
    footnotes: OrderedDict[str, int] = OrderedDict()
    records, runs = [], []
    datasets_used: list[str] = []
    epochs_used: set = set()
    iters_used: set = set()
    for rp in plan.rows:
        row = rp.row
        texts = row_footnotes(row)
        marks = [footnotes.setdefault(text, len(footnotes) + 1) for text in texts]
        rec: dict[str, Any] = {
            "model": row.model,
            "method": row.method,
            "label": row.label,
            "options": row.options_text(),
            "bits": row.bits or "",
            "paper_dataset": row.paper_dataset,
            "paper_fp32": row.paper_fp32,
            "paper_int8": row.paper_int8,
            "paper_delta": row.paper_delta if row.paper_delta is not None else row.paper_delta_computed,
            "paper_delta_source": (
                "printed"
                if row.paper_delta is not None
                else ("computed" if row.paper_delta_computed is not None else "")
            ),
            "paper_diverged": row.paper_diverged,
            "paper_extra": json.dumps(dict(row.paper_extra)) if row.paper_extra else "",
            "profile": plan.profile,
            "seeds": len(plan.seeds),
            "source": str(row.source),
            "notes": " ".join(f"[{m}] {t}" for m, t in zip(marks, texts, strict=True)),
            "_marks": marks,
        }
        for col in (
            "fp32",
            "fp32_std",
            "int8",
            "int8_std",
            "delta",
            "delta_std",
            "delta_ci95",
            "delta_test_se",
            "int8_test_se",
        ):
            rec[col] = None
        rec.update(fp32_ms_per_iter=None, int8_ms_per_iter=None, simulated=False, n_fp32=0, n_int8=0)
        rec.update(dataset="", epochs="")
        if rp.blocker is not None:
            rec["status"] = f"not implemented: {rp.blocker}"
            records.append(rec)
            continue

        measured, seen = _measure(rp, outcomes, metric)
        rec.update(measured)
        ident = {k: rec[k] for k in ("model", "method", "label", "options")}
        runs += [{"row": len(records), **ident, **run} for run in seen["runs"]]
        datasets_used += [describe_dataset(d, row.paper_dataset, plan.profile) for d in seen["datasets"]]
        epochs_used |= seen["epochs"]
        iters_used |= seen["iters"]
        records.append(rec)

    frame = pd.DataFrame.from_records(records)
    marks = frame.pop("_marks").tolist()
    frame = frame[CSV_COLUMNS]
    meta = _meta(plan, outcomes, datasets_used, epochs_used, iters_used, list(footnotes))
    meta["row_marks"] = marks
    meta["row_runs"] = pd.DataFrame.from_records(runs, columns=RUNS_COLUMNS)
    if not (frame["paper_delta_source"] == "computed").any():
        meta["notes"] = [n for n in meta["notes"] if not n.startswith("Paper Δ marked †")]
    return frame, meta


def _measure(rp, outcomes: dict, metric: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """One runnable row's measured columns and status from its cells' outcomes; and what data it saw."""
    fp32_vals, int8_vals, diffs, fp32_ms, int8_ms, flag_pairs = [], [], [], [], [], []
    int8_images = []  # each INT8 run's number of validation images (from its flags)
    errors, pending = [], 0
    diverged = {"fp32": 0, "int8": 0}
    simulated = False
    seen = {"datasets": [], "epochs": set(), "iters": set(), "runs": []}
    for seed, fp32_cell, int8_cell in rp.cells:
        per_seed = {}
        for which, cell in (("fp32", fp32_cell), ("int8", int8_cell)):
            out = outcomes.get(cell.key)
            if out is None:
                pending += 1
                continue
            if out.error:
                errors.append(("FP32 baseline: " if which == "fp32" else "") + out.error)
                continue
            res = out.result
            diverged[which] += bool(res.get("diverged"))
            simulated |= bool(res.get("simulated")) and which == "int8"
            if res.get("dataset"):
                seen["datasets"].append(str(res["dataset"]))
            if res.get("epochs") is not None:
                seen["epochs"].add(res["epochs"])
            if res.get("iters") is not None:
                seen["iters"].add(res["iters"])
            if res.get("ms_per_iter") is not None:
                (fp32_ms if which == "fp32" else int8_ms).append(float(res["ms_per_iter"]))
            per_seed[which] = _metric(res, metric)
            per_seed[f"{which}_flags"] = unpack_flags(res.get("val_correct")) if metric == "top1" else None
            flags = res.get("val_correct") if metric == "top1" else None
            shared = out.ran_with or {}
            seen["runs"].append({"seed": seed, "precision": which, "value": per_seed[which],
                                 "diverged": bool(res.get("diverged")), "ms_per_iter": res.get("ms_per_iter"),
                                 "elapsed_s": out.elapsed_s, "cpu_s": out.cpu_s,
                                 "threads": shared.get("threads"), "jobs": shared.get("jobs"),
                                 "flags": flags or ""})  # fmt: skip
        if per_seed.get("fp32") is not None:
            fp32_vals.append(per_seed["fp32"])
        if per_seed.get("int8") is not None:
            int8_vals.append(per_seed["int8"])
            int8_images.append(len(per_seed["int8_flags"] or []))
        if per_seed.get("fp32") is not None and per_seed.get("int8") is not None:
            diffs.append(per_seed["int8"] - per_seed["fp32"])
            flag_pairs.append((per_seed["int8_flags"], per_seed["fp32_flags"]))

    m: dict[str, Any] = {}
    m["fp32"], m["fp32_std"] = _mean_std(fp32_vals)
    m["int8"], m["int8_std"] = _mean_std(int8_vals)
    m["int8_test_se"] = binomial_se(m["int8"], int8_images[0]) if len(set(int8_images)) == 1 else None
    if m["fp32"] is not None and m["int8"] is not None:
        m["delta"] = m["int8"] - m["fp32"]
        m["delta_std"] = statistics.stdev(diffs) if len(diffs) > 1 else None
        interval = delta_interval(diffs, flag_pairs)
        m["delta_ci95"], m["delta_test_se"] = interval.half_width, interval.test_se
    m["fp32_ms_per_iter"] = statistics.fmean(fp32_ms) if fp32_ms else None
    m["int8_ms_per_iter"] = statistics.fmean(int8_ms) if int8_ms else None
    m["simulated"] = simulated
    m["n_fp32"], m["n_int8"] = len(fp32_vals), len(int8_vals)
    m["dataset"] = "; ".join(dict.fromkeys(seen["datasets"]))
    m["epochs"] = ", ".join(str(e) for e in sorted(seen["epochs"]))

    n = len(rp.cells)
    status = []
    if errors:
        status.append(f"error: {errors[0]}")
    if diverged["int8"]:
        status.append(f"diverged ({diverged['int8']} of {n} seeds)")
    if diverged["fp32"]:
        status.append(f"FP32 baseline diverged ({diverged['fp32']} of {n} seeds)")
    if pending:
        status.append("pending")
    m["status"] = "; ".join(status or ["ok"]) + (" (simulated)" if simulated else "")
    return m, seen


def _failed_cells(plan, outcomes) -> list[dict[str, str]]:
    """The cells of the plan whose outcome is an error: key, what the cell is, and the error."""
    return [
        {"key": cell.key, "cell": cell.describe(), "error": outcomes[cell.key].error}
        for cell in plan.cells
        if cell.key in outcomes and outcomes[cell.key].error
    ]


def _meta(plan, outcomes, datasets_used, epochs_used, iters_used, footnotes) -> dict[str, Any]:
    spec = plan.spec
    paper_data = " and ".join(PAPER_DATASETS[d] for d in spec.paper_datasets)
    used = "; ".join(dict.fromkeys(datasets_used)) or "none (no cell has run)"
    epochs, iters = _span(epochs_used), _span(iters_used)
    seeds = f"{len(plan.seeds)} ({', '.join(str(s) for s in plan.seeds)})"
    measured_here = plan.profile in ("smoke", "embedded")
    if measured_here:
        disclaimer = (
            f"Numbers measured at the {plan.profile} profile are NOT reproductions of the paper's "
            f"{paper_data} numbers: they come from small stand-in data and a short schedule, and test "
            f"the harness. Only the 'Paper' columns are the paper's."
        )
    else:
        disclaimer = (
            f"Measured at the paper profile (the paper's protocol on data from "
            f"{plan.data_root or 'the default data root'}); the 'Paper' columns are the paper's numbers."
        )
    header = [
        f"# {spec.paper} {spec.table}: {spec.title}, regenerated",
        f"Paper: {spec.citation}, {spec.table}. Task: {spec.task}; metric: {spec.metric_label}.",
        f"Profile: {plan.profile}. Data used: {used}; the paper used {paper_data}. Epochs: {epochs} "
        f"(iterations: {iters}). Seeds: {seeds}.",
        disclaimer,
    ]
    if plan.numerics and "+compiled:" in plan.numerics:
        header.append(
            "Every cell trained under torch.compile (numerics "
            f"{plan.numerics}): the eager backends' products and gradient noise, BatchNorm and the "
            "quantizers' scales computed by inductor's code, so the results differ from eager ones by "
            "float rounding."
        )
    n_cells = len(plan.cells)
    return {
        "name": spec.name,
        "paper": spec.paper,
        "citation": spec.citation,
        "table": spec.table,
        "title": spec.title,
        "task": spec.task,
        "metric": spec.metric,
        "profile": plan.profile,
        "paper_datasets": spec.paper_datasets,
        "dataset_used": used,
        "epochs": epochs,
        "iterations": iters,
        "seeds": len(plan.seeds),
        "seed_list": plan.seeds,
        "data_root": plan.data_root,
        "recipe_version": plan.recipe_version,
        # models whose recipe changed alone (MODEL_RECIPE_VERSIONS) and the version their cells hold
        "model_recipe_versions": {
            cell.model: cell.recipe_version
            for rp in plan.rows
            for _, fp32, int8 in rp.cells
            for cell in (fp32, int8)
            if cell.recipe_version != plan.recipe_version
        },
        "numerics": plan.numerics,
        "not_a_reproduction": measured_here,
        "disclaimer": disclaimer,
        "header": header,
        "footnotes": footnotes,
        "notes": list(spec.notes) + list(GENERIC_NOTES),
        "cells": {
            "total": n_cells,
            "cached": sum(1 for o in outcomes.values() if o.cached),
            "ran": sum(1 for o in outcomes.values() if not o.cached),
            "errors": sum(1 for o in outcomes.values() if o.error),
            # only when some cells ran beside other cells (make JOBS=n): how many, by jobs and threads
            **({"shared": shared} if (shared := _shared(outcomes.values())) else {}),
            # cells scored from another cell's training (tables.shared_training)
            **({"rescored": n} if (n := sum(1 for o in outcomes.values() if o.shared_from)) else {}),
        },
        # each cell that failed and why (a Slurm job's id and the tail of its stderr): the claims report
        # names them beside the verdicts that read the table (tables.claims)
        **({"failed_cells": failed} if (failed := _failed_cells(plan, outcomes)) else {}),
        # what regenerating the table from an empty cache costs: its cells' own training times
        "training_seconds": round(sum(o.elapsed_s or 0.0 for o in outcomes.values()), 1),
        # the same cells' CPU time, which other processes and pauses do not inflate (recorded since
        # 2026-11-27: `cpu_cells` of them have it)
        "cpu_seconds": round(sum(o.cpu_s or 0.0 for o in outcomes.values()), 1),
        "cpu_cells": sum(1 for o in outcomes.values() if o.cpu_s is not None and not o.shared_from),
        "generated_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "device": devices.label(_cells_device(outcomes.values())),
        # where the cells trained, as each recorded it (tasks.device_choice): {device: cells}
        **({"trained_on": on} if (on := _trained_on(outcomes.values())) else {}),
        **provenance.as_dict(),
    }


def _cells_device(outcomes) -> dict:
    """This machine's device, with the thread count the cells trained with where they recorded it (a table
    kept from a cache by another process must not carry that process's count)."""
    info = devices.describe(devices.resolve(None))
    if info["kind"] != "cpu":
        return info
    threads = sorted({o.ran_with["threads"] for o in outcomes if (o.ran_with or {}).get("threads")})
    if threads:
        info["threads"] = threads[0] if len(threads) == 1 else f"{threads[0]}-{threads[-1]}"
    return info


def _trained_on(outcomes) -> dict[str, int]:
    counts: dict[str, int] = {}
    for o in outcomes:
        if o.shared_from:  # scored from its twin's training, which is counted there
            continue
        if device := (o.ran_with or {}).get("device"):
            counts[device] = counts.get(device, 0) + 1
    return counts


def _trained_on_note(meta: dict[str, Any]) -> str:
    on = meta.get("trained_on")
    if not on:
        return ""
    return " Cells trained on " + ", ".join(f"{d}: {n}" for d, n in sorted(on.items())) + "."


def _cpu_time(meta: dict[str, Any], total: int) -> str:
    n = meta.get("cpu_cells") or 0
    if not n:
        return ""
    which = "" if n == total else f" ({n} of the {total} cells recorded it)"
    return f", {_duration(meta.get('cpu_seconds'))} of CPU time{which}"


def _shared(outcomes) -> dict[str, int]:
    """{"<jobs> at a time, <threads> thread(s) each": cells} for the cells that ran beside other cells."""
    counts: dict[str, int] = {}
    for o in outcomes:
        how = o.ran_with or {}
        if how.get("jobs", 1) > 1:
            t = how.get("threads")
            key = f"{how['jobs']} at a time, {t} thread{'s' if t != 1 else ''} each"
            counts[key] = counts.get(key, 0) + 1
    return counts


def _span(values: set) -> str:
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return str(lo) if lo == hi else f"{lo}-{hi} (per model: see the CSV)"


def _num(value, std=None, digits=2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{value:.{digits}f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        text += f" ± {std:.{digits}f}"
    return text


def _signed(value, std=None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    text = f"{value:+.2f}"
    if std is not None and not (isinstance(std, float) and math.isnan(std)):
        text += f" ± {std:.2f}"
    return text


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    minutes = round(float(seconds) / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{float(seconds) / 60:.1f} min"


def _interval(delta, half_width) -> str:
    if delta is None or half_width is None or math.isnan(float(half_width)):
        return ""
    return f"[{delta - half_width:+.2f}, {delta + half_width:+.2f}]"


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _nan_to_none(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def markdown(frame: pd.DataFrame, meta: dict[str, Any]) -> str:
    header = meta["header"]
    lines = [header[0], ""] + [f"{line}  " for line in header[1:-1]] + ["", f"**{header[-1]}**", ""]
    show_opts = any(frame["options"])
    show_bits = any(frame["bits"])
    cols = ["Model", "Method"] + (["Options"] if show_opts else []) + (["Bits"] if show_bits else [])
    cols += ["Paper FP32", "Paper INT8", "Paper Δ", "FP32", "INT8", "Δ", "Δ 95% CI", "FP32 ms/iter"]
    cols += ["INT8 ms/iter"]
    cols += ["Status"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append(
        "|"
        + "|".join("---" if c in ("Model", "Method", "Options", "Bits", "Status") else "---:" for c in cols)
        + "|"
    )
    for i, rec in enumerate(frame.to_dict("records")):
        rec = {k: _nan_to_none(v) for k, v in rec.items()}
        marks = "".join(f" [{m}]" for m in meta["row_marks"][i])
        paper_delta = _signed(rec["paper_delta"])
        if paper_delta and rec["paper_delta_source"] == "computed":
            paper_delta += " †"
        paper_int8 = "NaN (crashed)" if rec["paper_diverged"] else _num(rec["paper_int8"])
        cells = [rec["model"], rec["label"] + marks]
        cells += [rec["options"]] if show_opts else []
        cells += [rec["bits"]] if show_bits else []
        cells += [
            _num(rec["paper_fp32"]),
            paper_int8,
            paper_delta,
            _num(rec["fp32"], rec["fp32_std"]),
            _num(rec["int8"], rec["int8_std"]),
            _signed(rec["delta"], rec["delta_std"]),
            _interval(rec["delta"], rec["delta_ci95"]),
            _num(rec["fp32_ms_per_iter"], digits=1),
            _num(rec["int8_ms_per_iter"], digits=1),
            rec["status"],
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if meta.get("failed_cells"):  # the status column names a row's first; here every one, and why
        lines += ["", "Failed cells (not in the numbers above; run the command again to retry them):", ""]
        lines += [f"- {c['cell']}: {_cell(c['error'])}" for c in meta["failed_cells"]]
    if meta["footnotes"]:
        lines += ["", "Footnotes:", ""]
        lines += [f"[{i}] {text}  " for i, text in enumerate(meta["footnotes"], 1)]
    lines += ["", "Notes:", ""] + [f"- {text}" for text in meta["notes"]]
    cells = meta["cells"]
    lines += [
        "",
        f"Generated {meta['generated_at']} by `{meta.get('command', '')}`: {cells['total']} cells, "
        f"{cells['cached']} from the cache, {cells['ran']} run now, {cells['errors']} failed. "
        f"At commit {meta['commit']}, environment lock {meta['environment_lock']}, on {meta['device']}."
        + _trained_on_note(meta)
        + f" Its cells trained for {_duration(meta.get('training_seconds'))} in all (each where it ran)"
        + _cpu_time(meta, cells["total"] - cells.get("rescored", 0))
        + f"; this run took {_duration(meta.get('wall_seconds'))}."
        + "".join(
            f" {n} of its cells ran {how} (`make JOBS=`): their ms/iter are of a shared machine."
            for how, n in cells.get("shared", {}).items()
        )
        + (
            f" {cells['rescored']} of its cells are another cell's training run scored for their own paper"
            " dataset (the same data stands in for both): no training time of their own."
            if cells.get("rescored")
            else ""
        ),
    ]
    return "\n".join(lines) + "\n"


def write(
    results_dir: Path, name: str, frame: pd.DataFrame, md: str, meta: dict[str, Any]
) -> dict[str, Path]:
    results_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "md": results_dir / f"{name}.md",
        "csv": results_dir / f"{name}.csv",
        "meta": results_dir / f"{name}.meta.json",
    }
    write_file(paths["md"], md)
    write_file(paths["csv"], frame.to_csv(index=False))
    runs, runs_path = meta.get("row_runs"), results_dir / f"{name}.runs.csv.gz"
    if runs is not None and len(runs):
        paths["runs"] = runs_path
        # mtime=0: the same runs give the same bytes, so a kept file changes only when its runs do
        write_file(runs_path, gzip.compress(runs.to_csv(index=False).encode(), mtime=0))
    else:  # an older table's runs would be read as this one's
        runs_path.unlink(missing_ok=True)
    sidecar = {k: v for k, v in meta.items() if k not in ("row_marks", "row_runs")}
    sidecar["csv_columns"] = list(frame.columns)
    write_file(paths["meta"], json.dumps(sidecar, indent=1, default=str) + "\n")
    return paths
