"""UI8 Figure 2: MobileNetV2 on CIFAR-10 with 8-bit gradients and no clipping, against FP32: the training
loss and the validation top-1 over training, from the two runs' own curves (the recorder's).

The INT8 run is UI8 Table 3's "No clipping" cell (c = max|G|, no learning-rate scaling); the paper's
crashes ("NaN"). Whether it crashes at this scale is what the figure shows.
"""

from __future__ import annotations

from pathlib import Path

from tables.figures import common
from tables.figures.runs import RecordedRun

RUNS = ("ui8-mobilenet-fp32", "ui8-mobilenet-noclip")


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    fp32, int8 = runs["ui8-mobilenet-fp32"], runs["ui8-mobilenet-noclip"]
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rows: list[dict] = []
    common.curves(axes, {"FP32": fp32, "INT8 gradients, no clipping": int8}, rows)
    outcome = f"diverged at iteration {int8.result['iters']}" if int8.diverged else "did not diverge"
    common.title(
        fig,
        "UI8 Figure 2: MobileNetV2 training with 8-bit gradients and no clipping",
        [fp32, int8],
        f"INT8: ui8 (clip=False, lr_scaling=False, period=1), {outcome}; "
        f"FP32 top-1 {common.top1_text(fp32)}, INT8 top-1 {common.top1_text(int8)}",
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "ui8-figure2")
