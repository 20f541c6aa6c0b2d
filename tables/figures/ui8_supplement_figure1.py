"""UI8 supplement, Figure 1 ("Model crashes when d_c exceeds limits"): the cosine distance d_c of the
8-bit gradients over training, with the training loss, for MobileNetV2 on CIFAR-10 with 8-bit gradients
and no clipping (UI8 Table 3's "No clipping" cell), the run of UI8 Figure 2.

d_c: 1 - cos(G, G_hat) of the codes each layer trained with, measured by the recorder on whole tensors;
the mean and the maximum over the layers at each recorded iteration.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tables.figures import common
from tables.figures.runs import RecordedRun

RUNS = ("ui8-mobilenet-noclip",)


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    run = runs["ui8-mobilenet-noclip"]
    by_it: dict[int, list[float]] = {}
    for r in run.find("G"):
        if "quant" in r:
            by_it.setdefault(r["iteration"], []).append(r["quant"]["d_c"])
    its = sorted(by_it)
    mean = [float(np.mean(by_it[i])) for i in its]
    top = [float(np.max(by_it[i])) for i in its]
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.6))
    ax.plot(its, mean, marker="o", markersize=3, label="d_c, mean over layers", color="tab:blue")
    ax.plot(its, top, marker="^", markersize=3, label="d_c, largest layer", color="tab:purple")
    ax.set_yscale("log")
    ax.set_xlabel("iteration")
    ax.set_ylabel("cosine distance d_c (log)")
    loss_ax = ax.twinx()
    loss = common.smooth(run.curves["loss"], max(1, len(run.curves["loss"]) // 25))
    loss_ax.plot(
        run.curves["iteration"], loss, color="tab:orange", linewidth=1, label="training loss (moving avg.)"
    )
    loss_ax.set_ylabel("training loss")
    if run.diverged:
        ax.axvline(
            run.result["iters"], color="tab:red", linestyle=":", label=f"diverged at {run.result['iters']}"
        )
    lines = ax.get_legend_handles_labels()
    more = loss_ax.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], loc="upper left")
    ax.grid(alpha=0.3)
    rows = [
        {"iteration": i, "d_c_mean": m, "d_c_max": t, "layers": len(by_it[i])}
        for i, m, t in zip(its, mean, top, strict=True)
    ]
    rows += [
        {"iteration": i, "loss": v} for i, v in zip(run.curves["iteration"], run.curves["loss"], strict=True)
    ]
    outcome = f"diverged at iteration {run.result['iters']}" if run.diverged else "no crash in this run"
    what = "UI8 supplement Figure 1: d_c before a crash (MobileNetV2, INT8 without clipping)"
    common.title(fig, what, [run], f"ui8 clip=False, lr_scaling=False, period=1: {outcome}")
    fig.tight_layout()
    return common.save(fig, rows, out, "ui8-supplement-figure1")
