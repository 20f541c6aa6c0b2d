"""WAGEUBN Figure 10: the data ratio (the share of nonzero values after quantization) of e_l3 under 8-bit
QE2 (SQ(e, 8)) and 8-bit Flag QE2, for every quantized layer of ResNet-18 in network order.

From the full 8-bit run: the recorder applies both quantizers to each layer's whole float e_l3 at the
recorded iterations; bars are the mean over those iterations, whiskers their range.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tables.figures import common
from tables.figures.runs import RecordedRun

RUNS = ("resnet18-wageubn",)
SERIES = {"shift8": ("8-bit QE2", "tab:red"), "flag8": ("8-bit Flag QE2", "tab:green")}


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    run = runs["resnet18-wageubn"]
    records = [r for r in run.find("G") if "compare" in r]
    layers = list(dict.fromkeys(r["layer"] for r in records))
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(13, 5))
    rows: list[dict] = []
    x = np.arange(len(layers))
    for k, (name, (label, colour)) in enumerate(SERIES.items()):
        values = [[r["compare"][name]["nonzero"] for r in records if r["layer"] == layer] for layer in layers]
        mean = np.array([np.mean(v) for v in values])
        err = [mean - [min(v) for v in values], [max(v) for v in values] - mean]
        ax.bar(x + (k - 0.5) * 0.4, mean, 0.4, yerr=err, capsize=2, color=colour, label=label)
        rows.extend(
            {
                "layer": common.short(layer),
                "quantizer": label,
                "data_ratio_mean": float(m),
                "min": min(v),
                "max": max(v),
                "iterations": len(v),
            }
            for layer, m, v in zip(layers, mean, values, strict=True)
        )
    ax.set_xticks(x, [common.short(layer) for layer in layers], rotation=45, ha="right")
    ax.set_ylabel("data ratio: nonzero values after quantization")
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    ax.legend()
    common.title(
        fig,
        "WAGEUBN Figure 10: data ratios of 8-bit QE2 and 8-bit Flag QE2 per layer (ResNet-18)",
        [run],
        f"e_l3 of every quantized layer, whole tensors; iterations {common.iterations_text(run.iterations)}",
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "wageubn-figure10")
