"""WAGEUBN Figure 9: e_l3 (the error between conv and BN) of ResNet-18's first quantized layer under
(a) 8-bit QE2 (shift quantization SQ(e, 8), wageubn option e2=shift8), (b) 8-bit Flag QE2 and (c) full
precision, and (d) the three compared; (e, f) the training of the two 8-bit versions.

Drawn as histograms of log2(|e| / R), R = 2^round(log2 max|e|) (WAGEUBN eq. 7), with the share of
exact zeros apart: 8-bit QE2 sets |e| < 2^-8 R to zero, Flag QE2 keeps values down to 2^-15 R
(WAGEUBN section IV-E). (a) is the e2=shift8 run's own quantized e_l3; (b) and (c) the full 8-bit run's
(Flag QE2) quantized and float e_l3; (d) applies both quantizers to (c)'s float values. From the
recorder's uniform random subsamples, at the middle recorded iteration.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from repro.recorder import COMPARISONS
from tables.figures import common
from tables.figures.runs import RecordedRun

RUNS = ("resnet18-wageubn", "resnet18-wageubn-shift8", "resnet18-fp32")
LAYER = "layer1.0.conv1"
EDGES = np.arange(-24.0, 1.01, 0.5)


def log_histogram(x: np.ndarray, r: float) -> tuple[np.ndarray, float]:
    """Fractions of the nonzero values per bin of log2(|x| / r), and the fraction of zeros."""
    x = np.asarray(x, dtype=np.float64)
    nonzero = x[x != 0]
    counts, _ = np.histogram(np.log2(np.abs(nonzero) / r).clip(EDGES[0], EDGES[-1] - 1e-9), bins=EDGES)
    return counts / max(1, x.size), float((x == 0).mean()) if x.size else 0.0


def _power_of_two(m: float) -> float:
    return 2.0 ** round(np.log2(m)) if m > 0 else 1.0


def draw(runs: dict[str, RecordedRun], out: Path) -> list[Path]:
    flag, shift = runs["resnet18-wageubn"], runs["resnet18-wageubn-shift8"]
    mid_f = flag.iterations[len(flag.iterations) // 2]
    mid_s = shift.iterations[len(shift.iterations) // 2]
    rec_f, rec_s = flag.find("G", LAYER, mid_f)[0], shift.find("G", LAYER, mid_s)[0]
    plt = common.pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    rows: list[dict] = []
    centre = (EDGES[:-1] + EDGES[1:]) / 2
    r_f = _power_of_two(rec_f["absmax"])
    float_values = flag.sample(rec_f, "float")
    series = {
        "(a) 8-bit QE2": (shift.sample(rec_s, "quant"), _power_of_two(rec_s["absmax"]), "tab:red"),
        "(b) 8-bit Flag QE2": (flag.sample(rec_f, "quant"), r_f, "tab:green"),
        "(c) full precision": (float_values, r_f, "tab:blue"),
    }
    for ax, (label, (values, r, colour)) in zip(axes[0], series.items(), strict=True):
        frac, zeros = log_histogram(values, r)
        ax.bar(centre, frac, width=0.45, color=colour)
        ax.set_title(f"{label}: zeros {zeros:.1%}")
        rows.extend(
            {"panel": label, "log2_over_R": float(c), "fraction": float(f)}
            for c, f in zip(centre, frac, strict=True)
        )
        rows.append({"panel": label, "zeros": zeros})
    d = axes[1, 0]
    d.set_title("(d) the same float e_l3 through each quantizer")
    for label, values, colour in (
        ("full precision", float_values, "tab:blue"),
        ("8-bit QE2 (SQ(e, 8))", _apply("shift8", float_values, rec_f["absmax"]), "tab:red"),
        ("8-bit Flag QE2", _apply("flag8", float_values, rec_f["absmax"]), "tab:green"),
    ):
        frac, zeros = log_histogram(values, r_f)
        d.step(centre, frac, where="mid", color=colour, label=f"{label} (zeros {zeros:.1%})")
        rows.extend(
            {"panel": f"(d) {label}", "log2_over_R": float(c), "fraction": float(f)}
            for c, f in zip(centre, frac, strict=True)
        )
    for ax in (*axes[0], d):
        ax.axvline(-8, color="gray", linestyle=":", linewidth=1)
        ax.axvline(-15, color="gray", linestyle="--", linewidth=1)
        ax.set_xlabel("log2(|e_l3| / R)   (dotted: 2^-8 R, dashed: 2^-15 R)")
        ax.set_ylabel("fraction of values")
        ax.grid(alpha=0.3)
    d.legend()
    curves = {"Flag QE2 (wageubn)": flag, "8-bit QE2 (e2=shift8)": shift, "FP32": runs["resnet18-fp32"]}
    common.curves((axes[1, 1], axes[1, 2]), curves, rows)
    axes[1, 1].set_title("(e) training loss")
    axes[1, 2].set_title("(f) validation top-1")
    common.title(
        fig,
        f"WAGEUBN Figure 9: e_l3 of ResNet-18's first quantized layer ({LAYER})",
        list(runs.values()),
        f"iterations {mid_f} (Flag QE2 run) and {mid_s} (8-bit QE2 run); subsamples of "
        f"{rec_f['sample']['n']} of {rec_f['n']} values",
    )
    fig.tight_layout()
    return common.save(fig, rows, out, "wageubn-figure9")


def _apply(name: str, values: np.ndarray, absmax: float) -> np.ndarray:
    """A quantizer on a subsample, with R from the whole tensor's max|e| (the subsample's max may be less):
    the recorded maximum is put in front so that R(x) sees it, then dropped."""
    import torch

    x = torch.from_numpy(np.concatenate([[absmax], values]).astype(np.float32))
    return COMPARISONS[name](x).numpy()[1:]
