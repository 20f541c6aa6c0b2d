"""UI8 supplement, Figure 2: INT8 (UI8) against FP32 training of MobileNetV2 on CIFAR-10: the training
loss and the validation top-1 over training, from the two runs' own curves."""

from __future__ import annotations

from pathlib import Path

from tables.figures import common
from tables.figures.runs import RecordedRun

RUNS = ("ui8-mobilenet-fp32", "ui8-mobilenet-ui8")


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    return compare(
        runs["ui8-mobilenet-fp32"],
        runs["ui8-mobilenet-ui8"],
        "UI8 supplement Figure 2",
        out,
        "ui8-supplement-figure2",
    )


def compare(fp32: RecordedRun, int8: RecordedRun, what: str, out: Path, name: str) -> list[Path]:
    """Loss and top-1 curves of an INT8 run against its FP32 baseline (UI8 supplement Figures 2, 3)."""
    plt = common.pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    rows: list[dict] = []
    common.curves(axes, {"FP32": fp32, f"INT8 ({int8.spec.method})": int8}, rows)
    final = f"FP32 {common.top1_text(fp32)}, INT8 {common.top1_text(int8)}"
    common.title(
        fig, f"{what}: INT8 against FP32 training of {fp32.spec.model}", [fp32, int8], f"final top-1: {final}"
    )
    fig.tight_layout()
    return common.save(fig, rows, out, name)
