"""UI8 supplement, Figure 3: INT8 (UI8) against FP32 training of ResNet-50 on ImageNet (its stand-in at
the short profiles): the training loss and the validation top-1 over training."""

from __future__ import annotations

from pathlib import Path

from tables.figures.runs import RecordedRun
from tables.figures.ui8_supplement_figure2 import compare

RUNS = ("resnet50-fp32", "resnet50-ui8")


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    return compare(
        runs["resnet50-fp32"], runs["resnet50-ui8"], "UI8 supplement Figure 3", out, "ui8-supplement-figure3"
    )
