"""DAIQ Figure 1: gradient distributions of ResNet-50's conv6, 21, 34 and 46 seen per channel and per
sample. DAIQ sees two kinds of channels (bell-shaped, and sharp with a long tail: "Inverted-T") and
samples that all look alike.

From the DAIQ run of ResNet-50 (the gradient G at each layer's output, before quantization), at the middle
recorded iteration: for 8 channels and 8 samples each, chosen at evenly spaced ranks of P(|g| > sigma)
(DAIQ's discriminator, eq. 15: Gaussian when above lambda = 0.3), the histogram of g / max|g| of that
slice. The legends give each slice's P(|g| > sigma).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from repro.stats import LAMBDA
from tables.figures import common
from tables.figures.runs import RESNET50_FIGURE1, RecordedRun

RUNS = ("resnet50-daiq",)


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    run = runs["resnet50-daiq"]
    its = run.iterations
    mid = its[len(its) // 2]
    plt = common.pyplot()
    cmap = plt.get_cmap("coolwarm")
    fig, axes = plt.subplots(2, len(RESNET50_FIGURE1), figsize=(15, 7.5), sharey="row")
    rows: list[dict] = []
    for col, (number, layer) in enumerate(RESNET50_FIGURE1.items()):
        rec = run.find("G", layer, mid)[0]
        for row, (key, kind) in enumerate((("channels", "channel"), ("samples", "sample"))):
            ax, slices = axes[row, col], rec[key]
            picked = list(zip(slices["index"], slices["above_sigma"], slices["hist"], strict=True))
            for j, (index, above, hist) in enumerate(picked):
                x, d = common.centres(len(hist), 1.0), common.density(hist, 1.0)
                style = "-" if above > LAMBDA else "--"
                colour = cmap(j / max(1, len(picked) - 1))
                ax.plot(
                    x, np.where(d > 0, d, np.nan), style, color=colour, linewidth=1, label=f"P={above:.2f}"
                )
                where = {"layer": f"conv{number}", "module": rec["layer"], "iteration": mid, "view": kind}
                rows.extend(
                    {**where, "index": index, "above_sigma": above, "bin_centre": float(c), "count": int(n)}
                    for c, n in zip(x, hist, strict=True)
                )
            n_above = int(np.sum(np.array(slices["all_above_sigma"]) > LAMBDA))
            count = len(slices["all_above_sigma"])
            ax.set_title(  # a count: one channel in 2,048 would read "0%"
                f"conv{number} ({common.short(rec['layer'])}), per {kind}\n"
                f"{n_above} of its {count} {kind}s have P > {LAMBDA}"
            )
            ax.set_yscale("log")
            ax.set_xlim(-1.05, 1.05)  # every panel on g / max|g|'s whole range, with the same ticks
            ax.set_xticks([-1.0, -0.5, 0.0, 0.5, 1.0])
            ax.grid(alpha=0.3)
            ax.legend(
                fontsize=6,
                ncol=2,
                loc="upper right",
                title=f"P(|g| > sigma), {len(picked)} {kind}s",
                title_fontsize=6,
            )
            if row == 1:
                ax.set_xlabel("g / max|g| of the slice")
    axes[0, 0].set_ylabel("per channel: density (log)")
    axes[1, 0].set_ylabel("per sample: density (log)")
    detail = (
        f"iteration {mid}; solid: P(|g| > sigma) > {LAMBDA} (Gaussian by DAIQ eq. 15), dashed: Inverted-T; "
        "slices at evenly spaced ranks of P"
    )
    what = "DAIQ Figure 1: gradient distributions per channel and per sample (ResNet-50)"
    common.title(fig, what, [run], detail)
    fig.tight_layout()
    return common.save(fig, rows, out, "daiq-figure1")
