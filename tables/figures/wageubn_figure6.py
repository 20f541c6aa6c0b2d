"""WAGEUBN Figure 6: training curves of ResNet-18, -34 and -50 under FP32, WAGEUBN full 8-bit and WAGEUBN
with 16-bit E2: validation top-1 and training loss over training, from the runs' own curves."""

from __future__ import annotations

from pathlib import Path

from tables.figures import common
from tables.figures.runs import RecordedRun

MODELS = ("resnet18", "resnet34", "resnet50")
METHODS = {"fp32": "FP32", "wageubn": "WAGEUBN full 8-bit", "wageubn-e2-16": "WAGEUBN 16-bit E2"}
RUNS = tuple(f"{m}-{method}" for m in MODELS for method in METHODS)


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    plt = common.pyplot()
    fig, axes = plt.subplots(2, len(MODELS), figsize=(15, 7.5))
    rows: list[dict] = []
    finals = []
    for col, model in enumerate(MODELS):
        labelled = {label: runs[f"{model}-{method}"] for method, label in METHODS.items()}
        model_rows: list[dict] = []
        common.curves((axes[1, col], axes[0, col]), labelled, model_rows)
        rows.extend({"model": model, **r} for r in model_rows)
        axes[0, col].set_title(f"({'abc'[col]}) {model}: validation top-1")
        axes[1, col].set_title(f"({'abc'[col]}) {model}: training loss")
        finals.append(f"{model} " + " / ".join(common.top1_text(r) for r in labelled.values()))
    common.title(
        fig,
        "WAGEUBN Figure 6: training curves under the WAGEUBN framework",
        list(runs.values()),
        "final top-1 FP32 / full 8-bit / 16-bit E2: " + "; ".join(finals),
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "wageubn-figure6")
