"""UI8 Figure 4: (a) the cosine distance d_c between a gradient and its 8-bit quantization against the
clip value c, with the optimum gamma marked; (b) INT8 training without clipping at lower learning rates
(eta2, eta3, eta4 = 0.1, 0.5 and 1 x the recipe's rate, no scaling) against the recipe's rate with
phi(d_c) scaling (eta1), as validation top-1, and the learning rates they trained with.

(a) is computed by the recorder on the FP32 run's gradients (nearest rounding, as UI8's clip search),
at the middle recorded iteration; (b) from the four INT8 runs' own curves. UI8's rates are 0.1 / 0.01 /
0.05 / 0.1; here the recipe's (scaled to its batch) and the same ratios. Each setting also trains at
seeds 1 and 2 (final top-1 only): the legend gives the mean over the three seeds, and the CSV each
seed's final top-1 (panel "b-final") and eta1 minus each fixed rate, paired seed by seed and image by
image, with its 95% interval (panel "b-paired", tables.delta_interval), which the claims report reads.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from tables.delta_interval import delta_interval
from tables.figures import common
from tables.figures.runs import EXTRA_SEEDS, MOBILENET_BLOCK, RecordedRun, mobilenet_v2_conv, seeded
from tasks.top1 import unpack_flags

ETAS = {
    "ui8-mobilenet-exponential": "eta1: lr x1 with phi(d_c) scaling",
    "ui8-mobilenet-noclip-lr0.1": "eta2: lr x0.1, no scaling",
    "ui8-mobilenet-noclip-lr0.5": "eta3: lr x0.5, no scaling",
    "ui8-mobilenet-noclip": "eta4: lr x1, no scaling",
}
PHI = "ui8-mobilenet-exponential"
RUNS = ("ui8-mobilenet-fp32", *ETAS, *(seeded(n, s) for n in ETAS for s in EXTRA_SEEDS))


def _by_seed(runs: dict[str, RecordedRun], name: str) -> dict[int, RecordedRun]:
    return {0: runs[name], **{s: runs[seeded(name, s)] for s in EXTRA_SEEDS}}


def _seed_rows(runs: dict[str, RecordedRun]) -> list[dict]:
    """Each setting's final top-1 per seed, and eta1 minus each fixed rate paired seed by seed and image
    by image (a diverged run has no top-1: its seed drops out of the pairs)."""
    rows = []
    for name, label in ETAS.items():
        rows.extend(
            {"panel": "b-final", "run": label, "seed": s, "val_top1": r.result.get("top1")}
            for s, r in _by_seed(runs, name).items()
        )
    phi = _by_seed(runs, PHI)
    for name, label in ETAS.items():
        if name == PHI:
            continue
        other = _by_seed(runs, name)
        seeds = [
            s
            for s in phi
            if phi[s].result.get("top1") is not None and other[s].result.get("top1") is not None
        ]
        diffs = [phi[s].result["top1"] - other[s].result["top1"] for s in seeds]
        flags = [
            (unpack_flags(phi[s].result.get("val_correct")), unpack_flags(other[s].result.get("val_correct")))
            for s in seeds
        ]
        interval = delta_interval(diffs, flags)
        rows.append({
            "panel": "b-paired", "run": label, "seeds": len(diffs),
            "delta": statistics.fmean(diffs) if diffs else None, "half_width": interval.half_width,
            "spread": statistics.stdev(diffs) if len(diffs) > 1 else None, "test_se": interval.test_se,
        })  # fmt: skip
    return rows


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
    finals: dict[str, list[float]] = {}
    seed_rows = _seed_rows(runs)
    for r in seed_rows:
        if r["panel"] == "b-final" and r["val_top1"] is not None:
            finals.setdefault(r["run"], []).append(r["val_top1"])
    for name, label in ETAS.items():
        run = runs[name]
        vx, vy = common.val_points(run)
        top = finals.get(label, [])
        mean = f", final {statistics.fmean(top):.1f} over {len(top)} seeds" if top else ""
        (line,) = b.plot(vx, vy, marker="o", markersize=3, label=label + mean, linewidth=1.2)
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
    rows.extend(seed_rows)
    b.set_xlabel("iteration (curves: seed 0)")
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
