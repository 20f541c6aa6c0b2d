"""UI8 Figure 4: (a) the cosine distance d_c between a gradient and its 8-bit quantization against the
clip value c, with the optimum gamma marked; (b) INT8 training without clipping at lower learning rates
(eta2, eta3, eta4 = 0.1, 0.5 and 1 x the recipe's rate, no scaling) against the recipe's rate with
phi(d_c) scaling (eta1), as validation top-1, and the learning rates they trained with.

(a) is computed by the recorder on the FP32 run's gradients (nearest rounding, as UI8's clip search),
at the middle recorded iteration; (b) from the four INT8 runs' own curves. UI8's rates are 0.1 / 0.01 /
0.05 / 0.1; here the recipe's (scaled to its batch) and the same ratios.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tables.figures import common
from tables.figures.runs import MOBILENET_BLOCK, RecordedRun, mobilenet_v2_conv

RUNS = (
    "ui8-mobilenet-fp32",
    "ui8-mobilenet-exponential",
    "ui8-mobilenet-noclip-lr0.1",
    "ui8-mobilenet-noclip-lr0.5",
    "ui8-mobilenet-noclip",
)
ETAS = {
    "ui8-mobilenet-exponential": "eta1: lr x1 with phi(d_c) scaling",
    "ui8-mobilenet-noclip-lr0.1": "eta2: lr x0.1, no scaling",
    "ui8-mobilenet-noclip-lr0.5": "eta3: lr x0.5, no scaling",
    "ui8-mobilenet-noclip": "eta4: lr x1, no scaling",
}


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    fp32 = runs["ui8-mobilenet-fp32"]
    its = fp32.iterations
    mid = its[len(its) // 2]
    plt = common.pyplot()
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.4))
    rows: list[dict] = []

    a.set_title(f"(a) d_c against the clip value, iteration {mid}")
    for conv in (1, 2, 3):
        rec = fp32.find("G", mobilenet_v2_conv(MOBILENET_BLOCK, conv), mid)[0]
        ratio, dc = np.array(rec["clip_curve"]["ratio"]), np.array(rec["clip_curve"]["d_c"])
        best = int(np.argmin(dc))
        # the optimum in the legend: beside the stars, the three labels overlapped where the optima are close
        label = f"layer{MOBILENET_BLOCK} conv{conv}, optimum (*) gamma = {ratio[best]:.3g} max|g|"
        (line,) = a.plot(ratio, dc, label=label, linewidth=1.2)
        a.plot(ratio[best], dc[best], "*", markersize=10, color=line.get_color())
        where = {"panel": "a", "layer": rec["layer"], "iteration": mid}
        points = enumerate(zip(ratio, dc, strict=True))
        rows.extend(
            {**where, "clip_over_max": float(r), "d_c": float(v), "optimum": i == best}
            for i, (r, v) in points
        )
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("clip value c / max|g|")
    a.set_ylabel("cosine distance d_c (log)")

    b.set_title("(b) validation top-1 of INT8 training without clipping")
    c.set_title("(b) the learning rate each run trained with")
    for name, label in ETAS.items():
        run = runs[name]
        vx, vy = common.val_points(run)
        (line,) = b.plot(vx, vy, marker="o", markersize=3, label=label, linewidth=1.2)
        lr = np.array(run.curves["lr"], dtype=float) * np.array(run.curves["lr_scale"], dtype=float)
        c.plot(run.curves["iteration"], lr, label=label, color=line.get_color(), linewidth=1.2)
        if run.diverged:
            b.axvline(run.result["iters"], color=line.get_color(), linestyle=":")
        rows.extend(
            {"panel": "b", "run": label, "iteration": i, "val_top1": v} for i, v in zip(vx, vy, strict=True)
        )
        rows.extend(
            {"panel": "b-lr", "run": label, "iteration": i, "lr_times_mean_phi": float(v)}
            for i, v in zip(run.curves["iteration"], lr, strict=True)
        )
    b.set_xlabel("iteration")
    b.set_ylabel("validation top-1 (%)")
    c.set_xlabel("iteration")
    c.set_ylabel("learning rate x mean phi(d_c) over layers")
    c.set_yscale("log")
    for ax in (a, b, c):
        ax.grid(alpha=0.3)
        ax.legend()
    common.title(
        fig,
        "UI8 Figure 4: the effect of clipping and of the learning rate on INT8 training",
        [fp32, *(runs[n] for n in ETAS)],
        "(a) FP32 run's gradients, nearest rounding; (b) ui8 clip=False period=1",
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "ui8-figure4")
