"""The kernel-speed report: pytest-benchmark JSON (tests/bench, ``make bench``) -> Markdown + bar chart.

    python -m kernels.bench.report [results/kernel_bench.json] [--out results]

Writes ``kernel_speedup.md`` (per layer and op: milliseconds of int8 with quantization, the int8 op
alone, fp32 and half precision (bf16 on the CPU, fp16 on a GPU), the speedups t_fp32 / t_int8 and
t_half / t_int8, their medians over the layers, count-weighted network totals and the speed targets)
and ``kernel_speedup.png`` (per-layer speedup bars, after DAIQ Figure 4) when matplotlib is installed
(it is in the ``dev`` extra).

Times are each benchmark's minimum over its rounds on the CPU (all implementations of a layer ran back
to back in one process, and the minimum is the statistic least disturbed by other load on a shared
machine), and the median on a GPU (every call synchronised; warm-up outside the timer).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

OPS = {"fwd": "forward", "dx": "input grad", "dw": "weight grad"}
# the CPU's targets: medians over the ResNet-50 layers of the int8 speedup (quantization included)
TARGETS = {"fwd": {"bf16": 1.6, "fp32": 10.0}, "dx": {"bf16": 1.2}, "dw": {"bf16": 1.2}}
STRETCH = {"dx": 1.6, "dw": 1.6}
# on a GPU: the network totals of the int8 convolutions with their quantization at least cuDNN fp16's
# speed (DAIQ Figure 4 reports 1.76x to 1.94x per layer)
TOTAL_TARGETS = {"fwd": {"fp16": 1.0}, "dx": {"fp16": 1.0}, "dw": {"fp16": 1.0}}


def impls(meta) -> tuple[str, ...]:
    return ("int8", "int8-op", "fp32", meta["half"])


def load(path: Path):
    """{(layer, op): {impl: ms}}, layer order, {layer: count} and the run's metadata."""
    data = json.loads(path.read_text())
    times: dict = {}
    layers: list[str] = []
    counts: dict = {}
    loads = []
    threads = set()
    kinds = {b.get("extra_info", {}).get("device_kind", "cpu") for b in data["benchmarks"]}
    gpu = kinds == {"cuda"}
    for b in data["benchmarks"]:
        info = b.get("extra_info", {})
        if "layer" not in info:
            continue
        layer = info["layer"]
        if layer not in layers:
            layers.append(layer)
        counts[layer] = info.get("count", 1)
        stat = b["stats"]["median" if gpu else "min"]
        times.setdefault((layer, info["op"]), {})[info["impl"]] = stat * 1e3
        if "load" in info:
            loads.append(info["load"])
        threads.add(info.get("threads"))
    cpu = data.get("machine_info", {}).get("cpu", {}).get("brand_raw", "?")
    labels = {b["extra_info"]["device"] for b in data["benchmarks"] if "device" in b.get("extra_info", {})}
    meta = {
        "gpu": gpu,
        "half": "fp16" if gpu else "bf16",
        "statistic": "median" if gpu else "minimum",
        "device": "; ".join(sorted(labels)) or cpu,
        "cpu": cpu,
        "when": data.get("datetime", "?"),
        "commit": _commit(data.get("commit_info") or {}),
        "threads": ", ".join(str(t) for t in sorted(t for t in threads if t is not None)) or "?",
        "load": f"{min(loads):.1f} - {max(loads):.1f}" if loads else "?",
        "timer": next((b.get("options", {}).get("timer") for b in data["benchmarks"]), "?"),
        "batch": next((b["extra_info"].get("batch") for b in data["benchmarks"] if "extra_info" in b), "?"),
        # older runs did not record it (their freed memory went back to the system: repro.heap)
        "heap": {b.get("extra_info", {}).get("heap_reused") for b in data["benchmarks"]},
    }
    return times, layers, counts, meta


def _commit(info: dict) -> str:
    """The commit the timed code was (pytest-benchmark's commit_info): its short id, marked when the tree had
    changes beyond it; '?' where the run did not record one."""
    if not info.get("id"):
        return "?"
    return info["id"][:7] + (" with uncommitted changes" if info.get("dirty") else "")


def totals(times, layers, counts, op: str, names) -> dict[str, float]:
    """Count-weighted network totals (ms) per implementation."""
    return {
        i: sum(counts[lay] * times[(lay, op)][i] for lay in layers if i in times.get((lay, op), {}))
        for i in names
    }


def speedups(times, layers, op: str, base: str, impl: str = "int8") -> dict[str, float]:
    out = {}
    for layer in layers:
        t = times.get((layer, op), {})
        if base in t and impl in t and t[impl] > 0:
            out[layer] = t[base] / t[impl]
    return out


def markdown(times, layers, counts, meta) -> str:
    half = meta["half"]
    names = impls(meta)
    where = meta["device"] if meta["device"] != meta["cpu"] else f"{meta['cpu']}, {meta['threads']} thread(s)"
    lines = [
        f"# INT8 kernel speed on the {'GPU' if meta['gpu'] else 'CPU'}: ResNet-50 layers",
        "",
        f"Measured {meta['when']} at commit {meta['commit']} on {where}, batch {meta['batch']}, timer "
        f"{meta['timer']}; 1-minute load "
        f"average during the run {meta['load']}. Each time is the {meta['statistic']} over the benchmark's "
        "rounds (pytest-benchmark, results/kernel_bench.json), in milliseconds"
        + ("; every call ends with a device synchronisation." if meta["gpu"] else ".")
        + {
            frozenset({True}): " Freed memory was kept for the next tensor (repro.heap), as in a training "
            "step.",
            frozenset({False}): " Freed memory went back to the system (REPRO_MALLOC=system): big tensors "
            "fault their pages in on every call.",
        }.get(frozenset(meta["heap"]), ""),
        "",
        "int8 = quantize (per-tensor absmax, stochastic rounding for gradients, per-channel scales for the "
        "weight gradient) + exact int8 op (the device's backend) + dequantize; int8-op = the int8 op alone; "
        f"fp32 and {half} = torch's ops, channels-last, {half} under autocast"
        + (", fp32 without TF32" if meta["gpu"] else "")
        + f". Speedup = t_fp32 / t_int8 (resp. {half}). Layers are C-size-K-kernel-stride (DAIQ Figure 4); "
        "x n = occurrences in the network.",
        "",
    ]
    if meta["gpu"]:
        lines += [
            "## Targets (network totals, int8 with quantization, over cuDNN fp16)",
            "",
            "| op | int8 total ms | fp16 total ms | speedup | target | met | int8-op alone |",
            "|---|---:|---:|---:|---:|---|---:|",
        ]
        for op, goals in TOTAL_TARGETS.items():
            tot = totals(times, layers, counts, op, names)
            for base, goal in goals.items():
                if not tot.get("int8") or not tot.get(base):
                    continue
                sp, sp_op = tot[base] / tot["int8"], tot[base] / tot["int8-op"] if tot.get("int8-op") else 0.0
                met = "yes" if sp >= goal else "**no**"
                lines.append(
                    f"| {OPS[op]} | {tot['int8']:.2f} | {tot[base]:.2f} | {sp:.2f} | {goal} | {met} "
                    f"| {sp_op:.2f} |"
                )
    else:
        lines += [
            "## Targets (medians over the layers, int8 with quantization)",
            "",
            "A layer below target is marked *quantization* when the int8 op alone meets the target (the time "
            "goes to quantizing the operands and dequantizing the result: see the int8 and int8-op columns), "
            "else *int8 op*.",
            "",
            "| op | vs | median speedup | target | met | layers below target |",
            "|---|---|---:|---:|---|---|",
        ]
        for op, goals in TARGETS.items():
            for base, goal in goals.items():
                sp = speedups(times, layers, op, base)
                if not sp:
                    continue
                med = statistics.median(sp.values())
                op_sp = speedups(times, layers, op, base, "int8-op")
                # why a layer misses: the int8 op itself, or the quantize/dequantize around it
                below = [
                    f"{lay} ({v:.2f}; {'quantization' if op_sp.get(lay, 0) >= goal else 'int8 op'})"
                    for lay, v in sp.items()
                    if v < goal
                ]
                met = "yes" if med >= goal else "**no**"
                if op in STRETCH and base == "bf16":
                    met += f" (stretch {STRETCH[op]}: {'yes' if med >= STRETCH[op] else 'no'})"
                lines.append(
                    f"| {OPS[op]} | {base} | {med:.2f} | {goal} | {met} | {', '.join(below) or '-'} |"
                )
                if op_sp:
                    med_op = statistics.median(op_sp.values())
                    met_op = "yes" if med_op >= goal else "**no**"
                    lines.append(
                        f"| {OPS[op]}, int8 op alone | {base} | {med_op:.2f} | {goal} | {met_op} | |"
                    )
    order = [("fp32", "int8"), (half, "int8"), ("fp32", "int8-op"), (half, "int8-op")]
    for op, title in OPS.items():
        lines += [
            "",
            f"## {title}",
            "",
            f"| layer | x n | int8 | int8-op | fp32 | {half} "
            f"| fp32/int8 | {half}/int8 | fp32/int8-op | {half}/int8-op |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        cols = {c: speedups(times, layers, op, *c) for c in order}
        for layer in layers:
            t = times.get((layer, op), {})
            ms = " | ".join(f"{t[i]:.2f}" if i in t else "-" for i in names)
            sp = " | ".join(f"{cols[c][layer]:.2f}" if layer in cols[c] else "-" for c in order)
            lines.append(f"| {layer} | {counts[layer]} | {ms} | {sp} |")
        med = " | ".join(f"**{statistics.median(cols[c].values()):.2f}**" if cols[c] else "-" for c in order)
        lines.append(f"| median | | | | | | {med} |")
        total = totals(times, layers, counts, op, names)
        tot = " | ".join(f"{total[i]:.1f}" for i in names)
        ratio = " | ".join(f"{total[b] / total[i]:.2f}" if total[i] else "-" for b, i in order)
        lines.append(f"| network total (x n) | | {tot} | {ratio} |")
    return "\n".join(lines) + "\n"


def bar_chart(times, layers, meta, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[dev]'): no PNG written", file=sys.stderr)
        return False
    half = meta["half"]
    fig, axes = plt.subplots(len(OPS), 1, figsize=(max(10, 0.55 * len(layers)), 10), sharex=True)
    x = list(range(len(layers)))
    for ax, (op, title) in zip(axes, OPS.items(), strict=True):
        bars = [("fp32", "int8", "tab:blue"), (half, "int8", "tab:orange"),
                ("fp32", "int8-op", "lightsteelblue"), (half, "int8-op", "navajowhite")]  # fmt: skip
        for j, (base, impl, color) in enumerate(bars):
            sp = speedups(times, layers, op, base, impl)
            ax.bar([i + (j - 1.5) * 0.2 for i in x], [sp.get(lay, 0.0) for lay in layers], 0.2,
                   color=color, label=f"{impl} over {base}")  # fmt: skip
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_ylabel("speedup")
        ax.set_title(title)
        ax.legend(loc="upper left", fontsize=7, ncol=4)
    fig.suptitle(f"INT8 speedup per ResNet-50 layer on {meta['device']}", fontsize=10)
    axes[-1].set_xticks(x, layers, rotation=60, ha="right", fontsize=8)
    axes[-1].set_xlabel(
        f"layer (C-feature size-K-kernel-stride), batch {meta['batch']}; int8 = with quantization"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="?", default="results/kernel_bench.json", type=Path)
    ap.add_argument("--out", default="results", type=Path, help="directory for kernel_speedup.md/.png")
    args = ap.parse_args(argv)
    if not args.json.exists():
        ap.error(f"{args.json} not found: run `make bench` first")
    times, layers, counts, meta = load(args.json)
    if not layers:
        ap.error(f"{args.json} holds no kernel benchmarks (tests/bench)")
    args.out.mkdir(parents=True, exist_ok=True)
    md = args.out / "kernel_speedup.md"
    md.write_text(markdown(times, layers, counts, meta))
    print(f"wrote {md}")
    png = args.out / "kernel_speedup.png"
    if bar_chart(times, layers, meta, png):
        print(f"wrote {png}")


if __name__ == "__main__":
    main()
