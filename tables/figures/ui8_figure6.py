"""UI8 Figure 6: (a) the cosine distance d_c of each layer's quantized gradient over training (UI8 with
clipping, period 100, scaling on); the depthwise conv2 of each block is drawn apart from conv1 and conv3;
(b) the linear, quadratic and exponential learning-rate scaling functions (ui8 option `lr_form`, each
without clipping, d_c every iteration): the functions and the training each gives.

d_c here is 1 - cos(G, G_hat) of the codes the layer trained with (stochastic rounding), measured by the
recorder on whole tensors at the recorded iterations.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from repro.methods.ui8 import LR_FORMS, lr_factor
from tables.figures import common
from tables.figures.runs import RecordedRun

RUNS = ("ui8-mobilenet-ui8", "ui8-mobilenet-exponential", "ui8-mobilenet-linear", "ui8-mobilenet-quadratic")
COLOURS = {"conv1": "tab:blue", "conv2": "tab:red", "conv3": "tab:green", "other": "tab:gray"}


def structure(layer: str) -> str:
    """conv1 / conv2 / conv3 of a torchvision MobileNetV2 block (see runs.mobilenet_v2_conv)."""
    name = layer.removeprefix("net.")
    if not name.startswith("features.") or ".conv." not in name:
        return "other"
    block = int(name.split(".")[1])
    tail = name.split(".conv.", 1)[1]
    if block == 1:
        return {"0.0": "conv2", "1": "conv3"}.get(tail, "other")
    return {"0.0": "conv1", "1.0": "conv2", "2": "conv3"}.get(tail, "other")


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    ui8 = runs["ui8-mobilenet-ui8"]
    plt = common.pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (a, phi_ax), (loss_ax, acc_ax) = axes
    rows: list[dict] = []

    a.set_title("(a) d_c of each layer's INT8 gradient over training")
    by_layer: dict[str, list] = {}
    for r in ui8.find("G"):
        if "quant" in r:
            by_layer.setdefault(r["layer"], []).append((r["iteration"], r["quant"]["d_c"]))
    groups: dict[str, list] = {}
    for layer, points in by_layer.items():
        kind = structure(layer)
        x, y = zip(*sorted(points), strict=True)
        a.plot(x, y, color=COLOURS[kind], alpha=0.25, linewidth=0.7)
        groups.setdefault(kind, []).append(y)
        rows.extend(
            {"panel": "a", "layer": layer, "structure": kind, "iteration": i, "d_c": v}
            for i, v in zip(x, y, strict=True)
        )
    x = sorted({i for points in by_layer.values() for i, _ in points})
    for kind, ys in groups.items():
        if kind != "other":
            n = min(map(len, ys))
            a.plot(
                x[:n],
                np.mean([y[:n] for y in ys], axis=0),
                color=COLOURS[kind],
                linewidth=2.2,
                label=f"{kind}: mean of {len(ys)} layers",
            )
    a.set_xlabel("iteration")
    a.set_ylabel("cosine distance d_c (log)")
    a.set_yscale("log")

    phi_ax.set_title("(b) the scaling functions phi(d_c), alpha = 20, beta = 0.1")
    d = np.linspace(0, 0.3, 301)
    for form in LR_FORMS:
        v = [lr_factor(x, 20.0, 0.1, form) for x in d]
        phi_ax.plot(d, v, label=form, linewidth=1.4)
        rows.extend(
            {"panel": "b-phi", "form": form, "d_c": float(x), "phi": p}
            for x, p in zip(d[::10], v[::10], strict=True)
        )
    phi_ax.set_xlabel("d_c")
    phi_ax.set_ylabel("phi(d_c)")

    forms = {form: runs[f"ui8-mobilenet-{form}"] for form in LR_FORMS}
    common.curves((loss_ax, acc_ax), {f"{f} scaling (no clipping)": r for f, r in forms.items()}, rows)
    loss_ax.set_title("(b) training loss with each scaling form")
    acc_ax.set_title("(b) validation top-1 with each scaling form")
    for ax in (a, phi_ax):
        ax.grid(alpha=0.3)
        ax.legend()
    outcome = "; ".join(f"{f}: {common.top1_text(r)}" for f, r in forms.items())
    common.title(
        fig,
        "UI8 Figure 6: cosine distance per layer, and the learning-rate scaling functions",
        [ui8, *forms.values()],
        f"(a) ui8 defaults, recorded iterations "
        f"{common.iterations_text(ui8.iterations)}; (b) final top-1 {outcome}",
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "ui8-figure6")
