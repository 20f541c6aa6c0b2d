"""WAGEUBN Figure 7: the distributions of W, BN (x_hat), A, G (the weight gradient) and E (e_l0 entering
an activation, e_l3 between conv and BN) before and after quantization, in one block of ResNet-18
(layer2.0: its conv1, bn1 and ReLU) under full 8-bit WAGEUBN, at the middle recorded iteration.

Histograms of whole tensors over the float values' [-max, max] (the quantized ones on the same bins),
except G: constant quantization CQ rescales it (to about [-2^-7, 2^-7]), so G's before and after are
drawn each over its own range, from the recorder's subsample of the tensor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tables.figures import common
from tables.figures.runs import WAGEUBN_BLOCK, RecordedRun

RUNS = ("resnet18-wageubn",)
CONV, BN, RELU = WAGEUBN_BLOCK
PANELS = (
    ("W", CONV, "W (QW, 8-bit)"),
    ("BN", BN, "BN x_hat (Q, 16-bit)"),
    ("A", RELU, "A (QA, 8-bit)"),
    ("GW", CONV, "G, weight gradient (CQ)"),
    ("E1", RELU, "E: e_l0 entering the activation (SQ, 8-bit)"),
    ("G", CONV, "E: e_l3 between conv and BN (Flag QE2)"),
)


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    run = runs["resnet18-wageubn"]
    its = run.iterations
    mid = its[len(its) // 2]
    plt = common.pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    rows: list[dict] = []
    for ax, (path, layer, label) in zip(axes.flat, PANELS, strict=True):
        rec = run.find(path, layer, mid)[0]
        if path == "GW":
            for side, name, colour in (("float", "before", "tab:blue"), ("quant", "after", "tab:orange")):
                x = run.sample(rec, side)
                top = float(np.abs(x).max()) or 1.0
                counts, edges = np.histogram(x / top, bins=81, range=(-1, 1))
                centre = (edges[:-1] + edges[1:]) / 2
                ax.step(
                    centre,
                    np.where(counts > 0, counts / counts.sum(), np.nan),
                    where="mid",
                    color=colour,
                    label=f"{name}: max|x| {top:.3g}",
                )
                rows.extend(
                    {
                        "panel": label,
                        "side": name,
                        "layer": rec["layer"],
                        "iteration": mid,
                        "x_over_max": float(c),
                        "count": int(n),
                    }
                    for c, n in zip(centre, counts, strict=True)
                )
            ax.set_xlabel("value / its own max|value| (subsample)")
        else:
            limit = rec["absmax"]
            x = common.centres(len(rec["hist"]), limit)
            for hist, name, colour in (
                (rec["hist"], "before", "tab:blue"),
                (rec["quant"]["hist"], "after", "tab:orange"),
            ):
                frac = np.asarray(hist, dtype=float) / max(1, sum(hist))
                ax.step(x, np.where(frac > 0, frac, np.nan), where="mid", color=colour, label=name)
                rows.extend(common.hist_rows(name, rec, hist, panel=label))
            ax.set_xlabel("value")
            # E's values are thousandths: plain tick labels run into each other; a power of ten by the axis
            ax.ticklabel_format(axis="x", style="sci", scilimits=(-2, 3), useMathText=True)
        ax.set_title(f"{label}\n{common.short(rec['layer'])}, nonzero after: {rec['quant']['nonzero']:.1%}")
        ax.set_yscale("log")
        ax.set_ylabel("fraction of values (log)")
        ax.grid(alpha=0.3)
        ax.legend()
    common.title(
        fig,
        "WAGEUBN Figure 7: W, BN, A, G and E before and after quantization (ResNet-18, layer2.0)",
        [run],
        f"wageubn (full 8-bit), iteration {mid}",
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "wageubn-figure7")
