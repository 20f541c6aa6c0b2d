"""UI8 Table 1: KS statistics of the gradient g and the weight w of MobileNetV2's layer0 and layer8 conv3
against Gaussian, Laplace and Student-t fitted by maximum likelihood, with the critical value at 0.05.

From the FP32 MobileNetV2 run (UI8 section 3.2 analyses gradients "without gradient quantization"): the
recorder's KS statistics at each recorded iteration, on a uniform random subsample of each tensor (its
size n gives the critical value). The table shows the median over the recorded iterations, with their
range, beside the paper's numbers; ui8-table1.png draws the same.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tables.figures import common
from tables.figures.runs import RecordedRun, mobilenet_v2_conv

RUNS = ("ui8-mobilenet-fp32",)
DISTRIBUTIONS = ("gaussian", "laplace", "student")
# UI8 Table 1 as printed: (layer, data) -> Gaussian, Laplace, Student, critical value
PAPER = {
    (0, "g"): (0.1934, 0.0790, 0.2005, 0.0012),
    (0, "w"): (0.0391, 0.0721, 0.1011, 0.0765),
    (8, "g"): (0.2061, 0.1091, 0.2303, 0.0024),
    (8, "w"): (0.0294, 0.0569, 0.1084, 0.0110),
}
PATHS = {"g": "G", "w": "W"}


def measure(run: RecordedRun) -> list[dict]:
    rows = []
    for (block, data), paper in PAPER.items():
        layer = mobilenet_v2_conv(block, 3)
        records = [r for r in run.find(PATHS[data], layer) if "ks" in r]
        if not records:
            raise ValueError(f"the run recorded no KS statistics of {data} at {layer}")
        row = {
            "layer": f"layer{block} conv3",
            "module": layer,
            "data": data,
            "iterations": len(records),
            "n": records[0]["ks"]["n"],
            "of": records[0]["n"],
        }
        for i, name in enumerate(DISTRIBUTIONS):
            values = np.array([r["ks"][name] for r in records], dtype=float)
            row[name] = float(np.nanmedian(values))
            row[f"{name}_min"], row[f"{name}_max"] = float(np.nanmin(values)), float(np.nanmax(values))
            row[f"paper_{name}"] = paper[i]
        row["critical"] = float(np.median([r["ks"]["critical"] for r in records]))
        row["paper_critical"] = paper[3]
        row["rejected"] = ", ".join(n for n in DISTRIBUTIONS if row[n] > row["critical"]) or "none"
        rows.append(row)
    return rows


def markdown(rows: list[dict], run: RecordedRun) -> str:
    lines = [
        "# UI8 Table 1 (regenerated): KS statistics of gradient and weight, MobileNetV2 layer0/8 conv3",
        "",
        f"Profile: {run.profile} ({common.scale_note(run.profile)}). Data: {run.data}. Model: MobileNetV2 "
        f"(torchvision), {run.spec.method}. Device: {run.meta['device']}. Recorded iterations: "
        f"{common.iterations_text(run.iterations)}.",
        "",
        "Measured: median over the recorded iterations [min, max]; each KS statistic on a uniform random "
        "subsample of n values of the tensor (of its N), against the distribution fitted to that sample by "
        "maximum likelihood (scipy.stats); critical value: the largest D_n accepted at significance 0.05 "
        "for n values (the paper's is for its own tensor sizes).",
        "",
        "| Layer | Data | Gaussian | Laplace | Student | Critical | n / N | Rejected at 0.05 "
        "| Paper Gaussian | Paper Laplace | Paper Student | Paper critical |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        measured = [f"{r[d]:.4f} [{r[d + '_min']:.4f}, {r[d + '_max']:.4f}]" for d in DISTRIBUTIONS]
        paper = [f"{r['paper_' + d]:.4f}" for d in DISTRIBUTIONS]
        cells = [
            r["layer"],
            r["data"],
            *measured,
            f"{r['critical']:.4f}",
            f"{r['n']} / {r['of']}",
            r["rejected"],
        ]
        cells += [*paper, f"{r['paper_critical']:.4f}"]
        lines.append(f"| {' | '.join(cells)} |")
    modules = ", ".join(f"`{r['module']}`" for r in rows[::2])
    lines += ["", f"Layers: UI8's blocks counted from 0, conv3 the 1x1 projection (torchvision {modules})."]
    lines += ["", f"Provenance: {common.made_by([run])}."]
    return "\n".join(lines) + "\n"


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    run = runs["ui8-mobilenet-fp32"]
    rows = measure(run)
    plt = common.pyplot()
    fig, axes = plt.subplots(1, len(rows), figsize=(12, 3.8), sharey=True)
    x = np.arange(len(DISTRIBUTIONS))
    for ax, r in zip(axes, rows, strict=True):
        measured = [r[d] for d in DISTRIBUTIONS]
        err = [[r[d] - r[d + "_min"] for d in DISTRIBUTIONS], [r[d + "_max"] - r[d] for d in DISTRIBUTIONS]]
        ax.bar(
            x - 0.2, measured, 0.4, yerr=err, capsize=2, color="tab:blue", label="measured (median, range)"
        )
        ax.bar(
            x + 0.2,
            [r["paper_" + d] for d in DISTRIBUTIONS],
            0.4,
            color="lightgray",
            hatch="//",
            edgecolor="gray",
            label="UI8 Table 1",
        )
        ax.axhline(r["critical"], color="tab:red", linestyle="--", linewidth=1, label=f"critical, n={r['n']}")
        ax.axhline(r["paper_critical"], color="gray", linestyle=":", linewidth=1, label="paper's critical")
        ax.set_xticks(x, ["Gaussian", "Laplace", "Student-t"])
        ax.set_title(f"{r['layer']}, {r['data']}")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("KS statistic D_n")
    axes[0].legend(loc="upper left")
    detail = f"recorded iterations {common.iterations_text(run.iterations)}; fits by maximum likelihood"
    common.title(fig, "UI8 Table 1: KS statistics of g and w (MobileNetV2 conv3)", [run], detail)
    fig.tight_layout()
    paths = common.save(fig, rows, out, "ui8-table1")
    md = out / "ui8-table1.md"
    md.write_text(markdown(rows, run))
    return [*paths, md]
