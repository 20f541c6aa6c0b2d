"""DAIQ Figure 4: the speedup of INT8 over FP16 per ResNet-50 convolution layer, from `make bench`.

    python -m tables.figures.daiq_figure4 [results/kernel_bench.json] [--out results]

Reads the kernel benchmark (tests/bench, pytest-benchmark JSON) and draws t_half / t_int8 per layer for
the forward pass, the input gradient and the weight gradient: int8 with its quantization and the int8
op alone, half = cuDNN fp16 on a GPU (the paper's comparison; batch 64) or bf16 on the CPU. Writes
daiq_figure4.png and daiq_figure4.csv (the plotted numbers).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from kernels.bench.report import OPS, load, speedups

# DAIQ's text: "Our INT8 kernel is 1.76x faster than FP16 implementation with kernel size=1, and 1.94x
# faster with kernel size=3" (Acceleration Results, Figure 4)
PAPER = {1: 1.76, 3: 1.94}


def draw(json_path: Path, out: Path) -> tuple[Path, Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    times, layers, counts, meta = load(json_path)
    convs = [lay for lay in layers if not lay.startswith("fc")]
    if not convs:
        raise ValueError(f"{json_path} holds no convolution benchmarks")
    half = meta["half"]
    rows = []
    fig, axes = plt.subplots(len(OPS), 1, figsize=(max(10, 0.5 * len(convs)), 10), sharex=True)
    x = range(len(convs))
    for ax, (op, title) in zip(axes, OPS.items(), strict=True):
        with_q = speedups(times, convs, op, half, "int8")
        alone = speedups(times, convs, op, half, "int8-op")
        ax.bar([i - 0.2 for i in x], [with_q.get(c, 0) for c in convs], 0.4, color="tab:blue",
               label="INT8 with quantization")  # fmt: skip
        ax.bar([i + 0.2 for i in x], [alone.get(c, 0) for c in convs], 0.4, color="lightsteelblue",
               label="INT8 op alone")  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=0.8)
        if op == "fwd":
            for k, v in PAPER.items():
                ax.axhline(v, color="tab:red" if k == 1 else "tab:green", linestyle="--", linewidth=0.8,
                           label=f"DAIQ: {v}x for {k}x{k} kernels (2080 Ti)")  # fmt: skip
        top = max([*with_q.values(), *alone.values(), max(PAPER.values())])
        ax.set_ylim(0, top * 1.3)  # room for the legend above the bars
        ax.set_ylabel(f"speedup over {half}")
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=7, ncol=4)
        for c in convs:
            t = times.get((c, op), {})
            rows.append({"layer": c, "count": counts[c], "op": op, "int8_ms": t.get("int8"),
                         "int8_op_ms": t.get("int8-op"), f"{half}_ms": t.get(half),
                         "speedup_int8": with_q.get(c), "speedup_int8_op": alone.get(c)})  # fmt: skip
    fig.suptitle(
        f"DAIQ Figure 4 (regenerated): INT8 over {half.upper()} per ResNet-50 convolution\n"
        f"{meta['device']}, batch {meta['batch']}, {meta['statistic']} time per op (make bench)",
        fontsize=10,
    )
    axes[-1].set_xticks(list(x), convs, rotation=60, ha="right", fontsize=8)
    axes[-1].set_xlabel("layer: channels-feature size-kernels-kernel size-stride")
    fig.tight_layout()
    out.mkdir(parents=True, exist_ok=True)
    png, csv_path = out / "daiq_figure4.png", out / "daiq_figure4.csv"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return png, csv_path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="?", default="results/kernel_bench.json", type=Path)
    ap.add_argument("--out", default="results", type=Path)
    args = ap.parse_args(argv)
    if not args.json.exists():
        print(f"error: {args.json} not found: run `make bench` first", file=sys.stderr)
        return 2
    try:
        paths = draw(args.json, args.out)
    except (ValueError, KeyError) as err:
        print(f"error: {args.json} is not a kernel benchmark of `make bench`: {err}", file=sys.stderr)
        return 2
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
