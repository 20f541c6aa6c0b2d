"""WAGEUBN Figure 8: accuracy sensitivity to the batch size, FP32 against full 8-bit WAGEUBN, ResNet-18.

The paper trains at batch 128, 64, 32 and 16; here the recipe's batch and 1/2, 1/4, 1/8 of it (at least 2),
the same learning rate and epochs. Final validation top-1 of each run.
"""

from __future__ import annotations

from pathlib import Path

from tables.figures import common
from tables.figures.runs import BATCH_FACTORS, RecordedRun

METHODS = {"fp32": "FP32", "wageubn": "WAGEUBN full 8-bit"}


def _name(method: str, factor: float) -> str:
    return f"resnet18-{method}" if factor == 1.0 else f"resnet18-{method}-batch{factor:g}"


RUNS = tuple(_name(m, f) for m in METHODS for f in BATCH_FACTORS)


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.6))
    rows: list[dict] = []
    # each batch's best accuracy: its label goes above the point, the others' below (close values overlap)
    best: dict[int, float] = {}
    for method in METHODS:
        for f in BATCH_FACTORS:
            run = runs[_name(method, f)]
            v = run.result.get("top1")
            if v is not None:
                best[run.meta["batch_size"]] = max(v, best.get(run.meta["batch_size"], v))
    for method, label in METHODS.items():
        by_batch = {runs[_name(method, f)].meta["batch_size"]: runs[_name(method, f)] for f in BATCH_FACTORS}
        points = sorted(by_batch.items(), key=lambda p: p[0])  # a batch floored at 2 may repeat
        x = [b for b, _ in points]
        y = [r.result.get("top1") for _, r in points]
        (line,) = ax.plot(x, [float("nan") if v is None else v for v in y], marker="o", label=label)
        for b, v in zip(x, y, strict=True):
            if v is None:  # a diverged run: a cross at the foot of the axes, where no accuracy is
                foot = ax.get_xaxis_transform()  # x in data, y in axes fractions
                colour = line.get_color()
                ax.plot([b], [0.03], marker="x", color=colour, markersize=9, transform=foot, clip_on=False)
                ax.annotate("diverged", (b, 0.03), xycoords=foot, xytext=(0, 7), textcoords="offset points",
                            ha="center", fontsize=7, color=colour)  # fmt: skip
            else:
                above = v >= best[b]
                ax.annotate(
                    f"{v:.1f}",
                    (b, v),
                    xytext=(0, 6 if above else -6),
                    textcoords="offset points",
                    ha="center",
                    va="bottom" if above else "top",
                    fontsize=7,
                    color=line.get_color(),
                )
            rows.append({"method": method, "batch_size": b, "top1": v, "diverged": v is None})
    ax.margins(y=0.12)  # room for the labels above the top point and below the lowest
    ax.set_xscale("log", base=2)
    ax.set_xticks(
        sorted({r["batch_size"] for r in rows}), [str(b) for b in sorted({r["batch_size"] for r in rows})]
    )
    ax.set_xlabel("batch size")
    ax.set_ylabel("final validation top-1 (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    all_runs = [runs[n] for n in RUNS]
    common.title(
        fig,
        "WAGEUBN Figure 8: accuracy sensitivity to the batch size (ResNet-18)",
        all_runs,
        f"same learning rate and epochs at every batch size; lr {all_runs[0].meta['lr']:g}",
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "wageubn-figure8")
