"""UI8 Figure 3: distributions of activations, weights and gradients of MobileNetV2 during FP32 training
(UI8 section 3.2: "without gradient quantization"): (a) A, W and G of one layer; (b) G of that layer
over iterations; (c) G at different depths; (d) G of the three convolutions of one block (conv2 is
depthwise). Histograms the recorder took of the whole tensors, as densities on a log scale.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tables.figures import common
from tables.figures.runs import MOBILENET_BLOCK, MOBILENET_DEPTHS, RecordedRun, mobilenet_v2_conv

RUNS = ("ui8-mobilenet-fp32",)
STRUCTURE = {1: "conv1 (1x1 expansion)", 2: "conv2 (3x3 depthwise)", 3: "conv3 (1x1 projection)"}


def _plot(ax, record: dict, label: str, rows: list, normalise: bool = False, **style) -> None:
    limit = record["absmax"]
    x = common.centres(len(record["hist"]), limit)
    d = common.density(record["hist"], limit)
    if normalise:  # value / max|value|: A, W and G differ by orders of magnitude
        x, d = x / limit, d * limit
    ax.plot(x, np.where(d > 0, d, np.nan), label=label, linewidth=1.2, **style)
    rows.extend(common.hist_rows(label, record, record["hist"], panel=ax.get_title()[:3]))


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    run = runs["ui8-mobilenet-fp32"]
    its = run.iterations
    mid = its[len(its) // 2]
    layer = mobilenet_v2_conv(MOBILENET_BLOCK, 3)
    plt = common.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    rows: list[dict] = []
    (a, b), (c, d) = axes

    a.set_title(f"(a) A, W and G of layer{MOBILENET_BLOCK} conv3, iteration {mid}")
    for path, name in (("A", "activation A"), ("W", "weight W"), ("G", "gradient G")):
        rec = run.find(path, layer, mid)[0]
        _plot(
            a,
            rec,
            f"{name} (max|x| {rec['absmax']:.2g}, P(|x|>sigma) {rec['above_sigma']:.2f})",
            rows,
            normalise=True,
        )
    a.set_xlabel("value / max|value|")

    b.set_title(f"(b) G of layer{MOBILENET_BLOCK} conv3 over training")
    cmap = plt.get_cmap("viridis")
    chosen = its[:: max(1, len(its) // 5)]
    for i, it in enumerate(chosen):
        rec = run.find("G", layer, it)[0]
        _plot(b, rec, f"iteration {it}", rows, color=cmap(i / max(1, len(chosen) - 1)))
    b.set_xlabel("gradient value")

    c.set_title(f"(c) G at different depths (conv3), iteration {mid}")
    for i, block in enumerate(MOBILENET_DEPTHS):
        rec = run.find("G", mobilenet_v2_conv(block, 3), mid)[0]
        _plot(c, rec, f"layer{block} conv3", rows, color=cmap(i / (len(MOBILENET_DEPTHS) - 1)))
    c.set_xlabel("gradient value")

    d.set_title(f"(d) G of layer{MOBILENET_BLOCK}'s three convolutions, iteration {mid}")
    for conv, name in STRUCTURE.items():
        rec = run.find("G", mobilenet_v2_conv(MOBILENET_BLOCK, conv), mid)[0]
        _plot(d, rec, f"{name}, max|g| {rec['absmax']:.2g}", rows)
    d.set_xlabel("gradient value")

    for ax in axes.flat:
        ax.set_yscale("log")
        ax.set_ylabel("density (log)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper right")
    common.title(
        fig,
        "UI8 Figure 3: distributions of A, W and G in MobileNetV2 (FP32 training)",
        [run],
        f"recorded iterations {common.iterations_text(its)}; histograms of whole tensors, "
        f"{len(run.find('G', layer, mid)[0]['hist'])} bins over [-max|x|, max|x|]",
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "ui8-figure3")
