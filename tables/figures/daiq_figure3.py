"""DAIQ Figure 3: for a convolution layer of ResNet-18, over training, (a) the quantization error E (eq. 8,
alpha = 0.2) of global quantization (GQ) and of gradient vectorized quantization (OursGVQ), (b) the KS
distance D_n (eq. 16) of the gradient to a fitted Inverted-T and to a fitted Gaussian.

(a) From the `gq` and `daiq-gvq` runs: E = mean |g - g_hat| e^(0.2 |g|) between the layer's output
gradient and the weight-gradient path's codes it trained with (per tensor for GQ, per channel for GVQ),
on the whole tensor. (b) From the `daiq-mcs` run (MCS on the layer-wise gradient, as DAIQ's ablation):
D_n on a uniform random subsample of the gradient (repro.stats.dn_fits: the Inverted-T's eps, a and b by
maximum likelihood; the Gaussian's mean and std by maximum likelihood).
"""

from __future__ import annotations

from pathlib import Path

from tables.figures import common
from tables.figures.runs import RESNET18_LAYER, RecordedRun

RUNS = ("resnet18-gq", "resnet18-daiq-gvq", "resnet18-daiq-mcs")


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    plt = common.pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.4))
    rows: list[dict] = []
    epoch = _iterations_per_epoch(runs["resnet18-gq"])
    for name, label, side in (("resnet18-gq", "GQ", "quant"), ("resnet18-daiq-gvq", "OursGVQ", "quant_gw")):
        recs = runs[name].find("G", RESNET18_LAYER)
        x = [r["iteration"] for r in recs]
        y = [r[side]["E"] for r in recs]
        a.plot(x, y, marker="o", markersize=3, label=label, linewidth=1.2)
        rows.extend({"panel": "a", "run": label, "iteration": i, "E": e} for i, e in zip(x, y, strict=True))
    a.set_ylabel("quantization error E (alpha = 0.2)")
    a.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
    mcs = runs["resnet18-daiq-mcs"]
    recs = mcs.find("G", RESNET18_LAYER)
    x = [r["iteration"] for r in recs]
    for key, label in (("inverted_t", "Inverted-T"), ("gaussian", "Gaussian")):
        y = [r["dn"][key] for r in recs]
        b.plot(x, y, marker="o", markersize=3, label=label, linewidth=1.2)
        rows.extend({"panel": "b", "fit": label, "iteration": i, "D_n": d} for i, d in zip(x, y, strict=True))
    b.set_ylabel("KS statistic D_n")
    for ax, what in ((a, "(a) the quantization error E"), (b, "(b) the KS statistic D_n (OursMCS run)")):
        ax.set_title(what)
        ax.set_xlabel(f"iteration ({epoch} per epoch)" if epoch else "iteration")
        ax.grid(alpha=0.3)
        ax.legend()
    n = recs[0]["dn"]["n"] if recs else 0
    what = f"DAIQ Figure 3: quantization error and KS statistic of ResNet-18's {RESNET18_LAYER}"
    common.title(fig, what, list(runs.values()), f"D_n on subsamples of {n} values; E on whole tensors")
    fig.tight_layout()
    return common.save(fig, rows, out, "daiq-figure3")


def _iterations_per_epoch(run: RecordedRun) -> int | None:
    epochs = run.result.get("epochs")
    return run.result["iters"] // epochs if epochs else None
